"""Operations on the steps of episodes: per-step maps, per-episode dataset transforms, sums, last step, length.

Per-step functions run vectorized over batches of steps (`tf.vectorized_map`) when the optimization batch
size is above 1, so they must be vectorizable; episode metadata is kept as is.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from rlds_tf import rlds_types
from rlds_tf.transformations import _cardinality
from rlds_tf.transformations import flexible_batch
from rlds_tf.transformations import shape_ops


def _with_steps(episode: rlds_types.Episode, steps: Any) -> rlds_types.Episode:
    """A new episode dict: the same metadata, new steps (the input dict is not modified)."""
    if rlds_types.STEPS not in episode:
        return {**episode, rlds_types.STEPS: steps}
    return {k: (steps if k == rlds_types.STEPS else v) for k, v in episode.items()}  # (keys keep their order)


def map_steps(steps_dataset: tf.data.Dataset, transform_step: Callable[[rlds_types.Step], Any],
              optimization_batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> tf.data.Dataset:
    """Applies `transform_step` to every step of a steps dataset (vectorized over batches of steps)."""
    size = flexible_batch.get_batch_size(steps_dataset, optimization_batch_size)
    if size > 1:
        return steps_dataset.batch(size).map(lambda b: tf.vectorized_map(transform_step, b)).unbatch()
    return steps_dataset.map(transform_step)


def _map_episode(episode: rlds_types.Episode, transform_step: Callable[[rlds_types.Step], Any], in_place: bool,
                 optimization_batch_size: int = 1) -> rlds_types.Episode:
    """rlds' helper behind `map_nested_steps`, kept for code that calls it: `episode` with
    `transform_step` applied to its steps; `in_place` stores the new steps in `episode` itself and returns
    it, otherwise a new dict with the same metadata is returned.

    >>> episode = {'steps': tf.data.Dataset.range(3), 'id': 7}
    >>> copy = _map_episode(episode, lambda s: s + 1, in_place=False)
    >>> [int(s) for s in copy['steps']], [int(s) for s in episode['steps']], copy['id']
    ([1, 2, 3], [0, 1, 2], 7)
    >>> _map_episode(episode, lambda s: s * 10, in_place=True) is episode, [int(s) for s in episode['steps']]
    (True, [0, 10, 20])
    """
    steps = map_steps(episode[rlds_types.STEPS], transform_step, optimization_batch_size)
    if not in_place:
        return _with_steps(episode, steps)
    episode[rlds_types.STEPS] = steps
    return episode


def map_nested_steps(episodes_dataset: tf.data.Dataset, transform_step: Callable[[rlds_types.Step], Any],
                     optimization_batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> tf.data.Dataset:
    """Applies `transform_step` to every step of every episode; episode metadata is kept.

    >>> episodes = tf.data.Dataset.from_tensors({'steps': tf.data.Dataset.range(3), 'id': 7})
    >>> out = map_nested_steps(episodes, lambda s: s * 10)
    >>> [[int(s) for s in e['steps']] for e in out]
    [[0, 10, 20]]
    """
    size = flexible_batch.get_batch_size(episodes_dataset, optimization_batch_size)
    return episodes_dataset.map(lambda e: _map_episode(e, transform_step, in_place=False,
                                                       optimization_batch_size=max(size, 1)))


def apply_nested_steps(episodes_dataset: tf.data.Dataset,
                       transform_step_dataset: Callable[[tf.data.Dataset], Any]) -> tf.data.Dataset:
    """Replaces each episode's steps dataset by `transform_step_dataset(steps)`; metadata is kept."""
    return episodes_dataset.map(lambda e: _with_steps(e, e[rlds_types.STEPS].apply(transform_step_dataset)))


def sum_dataset(steps_dataset: tf.data.Dataset, data_to_sum: Callable[[rlds_types.Step], Any],
                optimization_batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> Any:
    """Sums `data_to_sum(step)` over all steps (every returned leaf must support `tf.add`)."""
    size = flexible_batch.get_batch_size(steps_dataset, optimization_batch_size)
    if size > 1:
        def batch_sum(steps):
            values = tf.vectorized_map(data_to_sum, steps)
            return tf.nest.map_structure(lambda v: tf.reduce_sum(v, 0), values)
        partial = steps_dataset.batch(size).map(batch_sum, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        partial = steps_dataset.map(data_to_sum, num_parallel_calls=tf.data.AUTOTUNE)
    return partial.reduce(shape_ops.zeros_from_spec(partial.element_spec),
                          lambda total, value: tf.nest.map_structure(tf.add, total, value))


def sum_nested_steps(episodes_dataset: tf.data.Dataset, data_to_sum: Callable[[rlds_types.Step], Any],
                     optimization_batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> Any:
    """Sums `data_to_sum(step)` over the steps of all episodes."""
    steps = episodes_dataset.flat_map(lambda e: e[rlds_types.STEPS])
    return sum_dataset(steps, data_to_sum, optimization_batch_size)


def final_step(steps_dataset: tf.data.Dataset) -> Any:
    """The last step of a steps dataset (zeros shaped like a step when it is empty)."""
    zeros = shape_ops.zeros_from_spec(steps_dataset.element_spec)
    cardinality = steps_dataset.cardinality()
    # With a known cardinality only the last step is read; otherwise (-2, unknown) every step is visited.
    skip = tf.where(cardinality > 0, cardinality - 1, tf.zeros_like(cardinality))
    return steps_dataset.skip(skip).reduce(zeros, lambda last, step: step)


def episode_length(steps_dataset: tf.data.Dataset,
                   optimization_batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> Any:
    """Number of steps (int32), from the cardinality when known, else by counting in batches.

    Inside traced code (e.g. `episodes.map(lambda e: episode_length(e['steps']))`) the cardinality is only
    known when the graph runs, so a `tf.cond` picks between it and the count there.
    """
    cardinality = steps_dataset.cardinality()
    static = _cardinality.static_cardinality(steps_dataset)
    if static is None:
        return tf.cond(tf.not_equal(cardinality, tf.data.UNKNOWN_CARDINALITY),
                       lambda: tf.cast(cardinality, tf.int32),
                       lambda: _count_steps(steps_dataset, optimization_batch_size))
    if static != tf.data.UNKNOWN_CARDINALITY:
        return tf.cast(cardinality, tf.int32)
    return _count_steps(steps_dataset, optimization_batch_size)


def _count_steps(steps_dataset: tf.data.Dataset, optimization_batch_size: int) -> tf.Tensor:
    """The number of steps (int32), counted by reading them (in batches above an optimization size of 1)."""
    size = optimization_batch_size
    if size == flexible_batch.BATCH_AUTO_TUNE:
        size = flexible_batch.DEFAULT_BATCH_SIZE_IN_BYTES // max(1, shape_ops.size_from_spec(
            steps_dataset.element_spec))
    if size <= 1:
        return steps_dataset.reduce(0, lambda count, _: count + 1)
    # Any leaf counts the steps of a batch; nested step fields are fine (rlds 0.1.8 assumed a flat dict).
    return steps_dataset.batch(size).reduce(
        0, lambda count, steps: count + tf.shape(tf.nest.flatten(steps)[0])[0])
