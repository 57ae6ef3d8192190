"""Mean and standard deviation of step fields over a dataset of episodes, with validity masks."""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import numpy as np
import tensorflow as tf

from rlds_tf import rlds_types
from rlds_tf.transformations import flexible_batch
from rlds_tf.transformations import shape_ops


def sar_fields_mask(step: rlds_types.Step) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(observation/action/reward, validity) under SAR alignment: action and reward are invalid when is_last."""
    data = {k: step[k] for k in (rlds_types.OBSERVATION, rlds_types.ACTION, rlds_types.REWARD)}
    is_last = step[rlds_types.IS_LAST]
    try:
        valid = not bool(is_last)  # an eager value: a Python bool, as rlds gives
    except (TypeError, ValueError):  # traced, or a batch of steps
        valid = tf.logical_not(tf.cast(is_last, tf.bool))
    mask = {rlds_types.OBSERVATION: True, rlds_types.ACTION: valid, rlds_types.REWARD: valid}
    return data, mask


def mean_and_std(episodes_dataset: tf.data.Dataset,
                 get_step_fields: Callable[[rlds_types.Step], Tuple[Dict[str, Any], Dict[str, Any]]],
                 optimization_batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> Tuple[Any, Any]:
    """Mean and (sample) standard deviation, as float64, of the fields `get_step_fields` selects.

    Args:
      episodes_dataset: dataset of episodes.
      get_step_fields: step -> (data dict, mask dict of bools); a field counts only where its mask is True.
      optimization_batch_size: steps per vectorized batch (BATCH_AUTO_TUNE: automatic).

    Returns:
      (mean, std), each shaped like the data dict; std divides by count - 1. As in rlds, called eagerly the
      means are tensors and the standard deviations numpy values.
    """
    size = flexible_batch.get_batch_size(episodes_dataset, optimization_batch_size)
    batches = episodes_dataset.flat_map(lambda e: e[rlds_types.STEPS]).batch(size)

    def masked(steps):
        """Per-step data with invalid fields zeroed, and the masks, for a batch of steps."""
        def one(step):
            data, mask = get_step_fields(step)
            mask = {k: tf.cast(mask[k], tf.bool) for k in data}
            data = {k: tf.nest.map_structure(lambda x: tf.where(mask[k], x, tf.zeros_like(x)), data[k])
                    for k in data}
            return data, mask
        return tf.vectorized_map(one, steps)

    def batch_sums(steps):
        data, mask = masked(steps)
        return {"count": {k: tf.math.count_nonzero(m) for k, m in mask.items()},
                "data": tf.nest.map_structure(lambda x: tf.reduce_sum(x, 0), data)}

    sums = batches.map(batch_sums, num_parallel_calls=tf.data.AUTOTUNE)
    totals = sums.reduce(shape_ops.zeros_from_spec(sums.element_spec),
                         lambda acc, x: tf.nest.map_structure(tf.add, acc, x))
    totals = tf.nest.map_structure(lambda x: tf.cast(x, tf.float64), totals)
    count = totals["count"]
    mean = {k: tf.nest.map_structure(lambda x, k=k: x / count[k], totals["data"][k]) for k in count}

    def batch_square_errors(steps):
        data, mask = masked(steps)
        # Invalid entries count as the mean, so they add nothing.
        centred = {k: tf.nest.map_structure(
            lambda x, m, k=k: tf.where(tf.reshape(mask[k], [-1] + [1] * (x.shape.rank - 1)),
                                       tf.cast(x, tf.float64) - m, tf.zeros_like(tf.cast(x, tf.float64))),
            data[k], mean[k]) for k in data}
        return tf.nest.map_structure(lambda x: tf.reduce_sum(x ** 2, 0), centred)

    squares = batches.map(batch_square_errors, num_parallel_calls=tf.data.AUTOTUNE)
    total_squares = squares.reduce(shape_ops.zeros_from_spec(squares.element_spec),
                                   lambda acc, x: tf.nest.map_structure(tf.add, acc, x))
    # Called eagerly, std is numpy (np.float64 or arrays) and mean tensors, as in rlds; traced, both are tensors.
    sqrt = np.sqrt if tf.executing_eagerly() else tf.sqrt
    std = {k: tf.nest.map_structure(lambda x, k=k: sqrt(x / (count[k] - 1)), total_squares[k]) for k in count}
    return mean, std
