"""`PatternMap`: Reverb structured-writer patterns applied to each episode, as a Beam transform.

Each episode runs through the structured writer's own executor (`rlds_tf.patterns.PatternEvaluator`), step by
step, from a fresh state: the items are those `rlds_tf.transformations.pattern_map` gives for that episode
alone (`episodes.flat_map(lambda e: pattern_map(tf.data.Dataset.from_tensors(e), configs))`).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

import apache_beam as beam
import numpy as np
import tree

from rlds_tf import patterns
from rlds_tf import rlds_types

ConfigsOrTransform = Union[Sequence[Any], Callable[[patterns.ReferenceStep], Any]]


def _as_configs(result: Any) -> list:
    if isinstance(result, (list, tuple)) and not hasattr(result, "_fields"):
        return list(result)
    return [result]


class _ApplyPatterns(beam.DoFn):
    def __init__(self, configs_or_transform: ConfigsOrTransform, with_items: bool):
        self._source = configs_or_transform
        self._with_items = with_items
        self._configs: Optional[list] = None

    def _configs_for(self, steps: Mapping[str, Any]) -> list:
        if self._configs is None:
            if callable(self._source):
                structure = tree.map_structure(lambda _: None, dict(steps))
                self._configs = _as_configs(self._source(patterns.create_reference_step(structure)))
            else:
                self._configs = list(self._source)
        return self._configs

    def process(self, episode: Mapping[str, Any]) -> Iterator[Any]:
        steps = episode[rlds_types.STEPS]
        evaluator = patterns.PatternEvaluator(self._configs_for(steps))
        columns = tree.flatten(dict(steps))
        num_steps = len(columns[0]) if columns else 0
        for t in range(num_steps):
            for item in evaluator.append([np.asarray(column[t]) for column in columns]):
                yield item if self._with_items else item.data
        for item in evaluator.end_episode():
            yield item if self._with_items else item.data


class PatternMap(beam.PTransform):
    """Applies pattern configs to the steps of each episode; emits the items' data (pattern nests of numpy).

    Args:
      configs_or_transform: pattern configs (`rlds_tf.patterns.create_config`, or StructuredWriterConfig
        protos), or a function `reference_step -> config or list of configs`, called once per worker with a
        reference step shaped like the episodes' steps.
      with_items: emit whole `rlds_tf.patterns.Item`s (config index, table, priority, data) instead of data.

    >>> import apache_beam as beam, numpy as np
    >>> from rlds_tf.patterns import create_config
    >>> episode = {'steps': {'x': np.arange(4), 'is_last': np.array([0, 0, 0, 1], bool)}}
    >>> with beam.Pipeline() as p:
    ...     _ = (p | beam.Create([episode])
    ...          | PatternMap(lambda s: create_config({'pair': s['x'][-2:]}, table='t'))
    ...          | beam.Map(lambda item: print(item['pair'].tolist())))
    [0, 1]
    [1, 2]
    [2, 3]
    """

    def __init__(self, configs_or_transform: ConfigsOrTransform, *, with_items: bool = False):
        super().__init__()
        if not callable(configs_or_transform):
            configs_or_transform = _as_configs(configs_or_transform)
            if not configs_or_transform:
                raise ValueError("PatternMap needs at least one config (or a function returning configs)")
            configs_or_transform = [patterns.as_config(c) for c in configs_or_transform]
        self._source = configs_or_transform
        self._with_items = with_items

    def expand(self, episodes):
        return episodes | "ApplyPatterns" >> beam.ParDo(_ApplyPatterns(self._source, self._with_items))
