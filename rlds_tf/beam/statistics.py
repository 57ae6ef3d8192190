"""`DatasetStatistics`: count, mean, std, min and max of every numeric step field, in one distributed pass."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping

import apache_beam as beam

from rlds_tf import step_statistics


class DatasetStatistics(beam.CombineFn):
    """Combines episodes into `{field path: {'count', 'mean', 'std', 'min', 'max'}}` per numeric step field.

    Accumulators are `rlds_tf.step_statistics.StepStatistics`, merged exactly (Chan et al.), so the result does
    not depend on how the runner splits the data. std is the sample standard deviation (count - 1), as in
    `rlds_tf.transformations.mean_and_std`; values are float64 numpy arrays shaped like the field (min and max
    keep the field's dtype). `rlds-tf stats` prints the same figures from one process.

    >>> import apache_beam as beam, numpy as np
    >>> episodes = [{'steps': {'x': np.array([1., 3.])}}, {'steps': {'x': np.array([5.])}}]
    >>> with beam.Pipeline() as p:
    ...     _ = (p | beam.Create(episodes) | beam.CombineGlobally(DatasetStatistics())
    ...          | beam.Map(lambda s: print(s['x']['mean'], s['x']['std'])))
    3.0 2.0
    """

    def __init__(self, *, with_num_episodes: bool = False):
        super().__init__()
        self._with_num_episodes = with_num_episodes

    def create_accumulator(self) -> step_statistics.StepStatistics:
        return step_statistics.StepStatistics()

    def add_input(self, accumulator: step_statistics.StepStatistics,
                  episode: Mapping[str, Any]) -> step_statistics.StepStatistics:
        return accumulator.add_episode(episode)

    def merge_accumulators(self, accumulators: Iterable[step_statistics.StepStatistics]
                           ) -> step_statistics.StepStatistics:
        merged = step_statistics.StepStatistics()
        for accumulator in accumulators:
            merged.merge(accumulator)
        return merged

    def extract_output(self, accumulator: step_statistics.StepStatistics) -> Dict[str, Any]:
        if self._with_num_episodes:
            return {"episodes": accumulator.num_episodes, "fields": accumulator.result()}
        return accumulator.result()
