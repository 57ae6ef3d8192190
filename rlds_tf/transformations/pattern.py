"""`pattern_map`: Reverb structured-writer patterns applied to RLDS episodes, compiled to plain tf.data.

The configs (`rlds_tf.patterns.create_config`, or `deepmind.reverb.StructuredWriterConfig` protos) run over
the stream of steps of all episodes, exactly as dm-reverb's `PatternDataset` runs them for rlds: an
episode ends at the step whose `is_last` is True, and with `respect_episode_boundaries` the history is
cleared there. Episodes may hold their steps as a nested dataset or, on the vectorized path, as stacked
tensors with a leading time dimension.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf

from rlds_tf import patterns
from rlds_tf import rlds_types
from rlds_tf.patterns import compile as compile_lib
from rlds_tf.patterns import configs as configs_lib
from rlds_tf.patterns import items_dataset
from rlds_tf.transformations import _cardinality


def step_spec(episodes_dataset: tf.data.Dataset) -> Dict[str, Any]:
    """The element spec of one step of an episodes dataset (nested or stacked steps)."""
    steps = episodes_dataset.element_spec[rlds_types.STEPS]
    if isinstance(steps, tf.data.DatasetSpec):
        return steps.element_spec
    return tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), steps)


def _is_last(block: Any) -> tf.Tensor:
    if not isinstance(block, dict) or rlds_types.IS_LAST not in block:
        fields = sorted(block) if isinstance(block, dict) else type(block).__name__
        raise KeyError(f"pattern_map ends episodes at the step field {rlds_types.IS_LAST!r}, which the steps do "
                       f"not have; fields: {fields}")
    return block[rlds_types.IS_LAST]


def pattern_map(episodes_dataset: tf.data.Dataset, configs: Sequence[Any],
                respect_episode_boundaries: bool = True) -> tf.data.Dataset:
    """Applies pattern configs to the steps of all episodes.

    Args:
      episodes_dataset: dataset of episodes.
      configs: configs to apply, in order; at each step their items come out in this order.
      respect_episode_boundaries: if True, no output mixes steps of two episodes.

    Returns:
      A dataset of the items (element spec `patterns.infer_signature(configs, step_spec)`).

    It may be called inside traced code too, e.g. once per episode in
    `episodes.flat_map(lambda e: pattern_map(tf.data.Dataset.from_tensors(e), configs))`, which gives every
    episode's items (rlds 0.1.8's, through dm-reverb's PatternDataset, gives the first episode's only).

    >>> steps = {'x': tf.range(4), 'is_last': [False, False, False, True]}
    >>> episodes = tf.data.Dataset.from_tensors({'steps': tf.data.Dataset.from_tensor_slices(steps)})
    >>> ref = patterns.create_reference_step(step_spec(episodes))
    >>> config = patterns.create_config({'pair': ref['x'][-2:]}, table='t')
    >>> [item['pair'].numpy().tolist() for item in pattern_map(episodes, [config])]
    [[0, 1], [1, 2], [2, 3]]
    """
    blocks, spec, large = compile_lib.episodes_to_blocks(episodes_dataset, rlds_types.STEPS)
    items = compile_lib.compile_blocks(blocks, configs, spec, respect_episode_boundaries=respect_episode_boundaries,
                                       is_last_fn=_is_last, in_parallel=not large)
    # The cardinality is asserted only when it is known while building (eagerly); inside traced code
    # (flat_map, interleave, map, tf.function) the episodes' cardinality is symbolic and stays unknown.
    num_episodes = _cardinality.static_cardinality(episodes_dataset)
    if num_episodes == tf.data.INFINITE_CARDINALITY:
        # Endless episodes give endless items only if configs fire; Reverb declares it infinite too.
        items = _with_cardinality(items, tf.data.INFINITE_CARDINALITY)
    elif num_episodes is not None:
        count = _static_item_count(episodes_dataset, num_episodes, configs, respect_episode_boundaries)
        if count is not None:
            items = _with_cardinality(items, count)
    return items


def _with_cardinality(items: tf.data.Dataset, count: int) -> tf.data.Dataset:
    """`items` of `count` elements (asserted), still batched from whole blocks where they were."""
    if isinstance(items, items_dataset.ItemsDataset):
        return items.with_cardinality(count)
    return items.apply(tf.data.experimental.assert_cardinality(count))


def _static_item_count(episodes_dataset: tf.data.Dataset, num_episodes: int, configs: Sequence[Any],
                       respect_episode_boundaries: bool) -> Optional[int]:
    """The number of items when it follows from static facts alone, else None.

    That is the case for episodes of stacked steps with a static length T, a known number of episodes N,
    configs without conditions (only the implicit history one) and histories that run across episodes:
    config k, which waits for H_k steps, then fires at every step from the H_k-th of the N*T on.
    `num_episodes` is N, the episodes' static cardinality (a count, or UNKNOWN_CARDINALITY).
    """
    steps = episodes_dataset.element_spec[rlds_types.STEPS]
    if respect_episode_boundaries or isinstance(steps, tf.data.DatasetSpec):
        return None
    lengths = {s.shape[0] if s.shape.rank else None for s in tf.nest.flatten(steps)}
    if len(lengths) != 1 or None in lengths or num_episodes < 0:
        return None
    configs = [patterns.as_config(c) for c in configs]
    if any(c.conditions for c in configs):
        return None
    total = num_episodes * lengths.pop()
    histories = configs_lib.with_buffer_length_conditions(configs, cumulative=True)
    return sum(max(total - c.conditions[-1].value + 1, 0) for c in histories)


def pattern_map_from_transform(episodes_dataset: tf.data.Dataset,
                               transform_fn: Callable[[patterns.ReferenceStep], patterns.Pattern],
                               conditions: Optional[Sequence[Any]] = None,
                               respect_episode_boundaries: bool = True) -> tf.data.Dataset:
    """`pattern_map` with one config built from `transform_fn(reference_step)` and `conditions`.

    >>> steps = {'x': tf.range(3), 'is_last': [False, False, True]}
    >>> episodes = tf.data.Dataset.from_tensors({'steps': tf.data.Dataset.from_tensor_slices(steps)})
    >>> out = pattern_map_from_transform(episodes, lambda s: {'x': s['x'][-2], 'next_x': s['x'][-1]})
    >>> [(int(t['x']), int(t['next_x'])) for t in out]
    [(0, 1), (1, 2)]
    """
    pattern = patterns.pattern_from_transform(step_spec(episodes_dataset), transform_fn)
    config = patterns.create_config(pattern, table="transition", conditions=conditions or ())
    return pattern_map(episodes_dataset, [config], respect_episode_boundaries=respect_episode_boundaries)
