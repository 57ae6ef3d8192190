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


def _summable(field: str, value: Any) -> tf.Tensor:
    """`value` in a dtype its sums fit in: floats as they are, integers and bools as float64.

    Summed in their own dtype, uint8 camera frames would wrap around at 255 (and int32 fields at 2**31) over
    a dataset; float64 holds integer sums exactly up to 2**53.
    """
    value = tf.convert_to_tensor(value)
    if value.dtype == tf.string:
        raise TypeError(f"mean_and_std: field {field!r} holds strings (tf.string), which have no mean; leave it "
                        f"out of the data dict get_step_fields returns")
    if value.dtype.is_floating:
        return value
    return tf.cast(value, tf.float64)


def mean_and_std(episodes_dataset: tf.data.Dataset,
                 get_step_fields: Callable[[rlds_types.Step], Tuple[Dict[str, Any], Dict[str, Any]]],
                 optimization_batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> Tuple[Any, Any]:
    """Mean and (sample) standard deviation, as float64, of the fields `get_step_fields` selects.

    Args:
      episodes_dataset: dataset of episodes.
      get_step_fields: step -> (data dict, mask dict). A field's mask is a bool (as in rlds: the whole field
        counts in this step or not) or bools shaped like the field's leaves (each element counts on its own).
      optimization_batch_size: steps per vectorized batch (BATCH_AUTO_TUNE: automatic).

    Returns:
      (mean, std), each shaped like the data dict; each element's std divides by its count - 1. As in rlds,
      called eagerly the means are tensors and the standard deviations numpy values.

    Raises:
      TypeError: `get_step_fields` does not return a (data dict, mask dict) pair.
      ValueError: a mask has a shape that is neither scalar nor broadcastable to its field's leaves.

    >>> steps = {'x': tf.constant([[1., 5.], [3., 7.], [5., 0.]]), 'is_last': [False, False, True]}
    >>> episodes = tf.data.Dataset.from_tensors({'steps': tf.data.Dataset.from_tensor_slices(steps)})
    >>> mean, std = mean_and_std(episodes, lambda s: ({'x': s['x']}, {'x': s['x'] > 0}))
    >>> mean['x'].numpy().tolist(), std['x'].tolist()
    ([3.0, 6.0], [2.0, 1.4142135623730951])
    """
    size = flexible_batch.get_batch_size(episodes_dataset, optimization_batch_size)
    batches = episodes_dataset.flat_map(lambda e: e[rlds_types.STEPS]).batch(size)

    def fields_and_masks(step):
        """The step's data, and for each leaf a bool mask of the leaf's shape."""
        selected = get_step_fields(step)
        if not (isinstance(selected, (tuple, list)) and len(selected) == 2
                and all(isinstance(part, dict) for part in selected)):
            raise TypeError(f"mean_and_std: get_step_fields must return a (data dict, mask dict) pair, got "
                            f"{type(selected).__name__}: {selected!r:.200}")
        data, mask = selected
        data = {k: tf.nest.map_structure(lambda x, k=k: _summable(k, x), v) for k, v in data.items()}
        missing = sorted(set(data) - set(mask))
        if missing:
            raise ValueError(f"mean_and_std: get_step_fields gave no mask for field(s) {missing}; the mask dict "
                             f"has {sorted(mask)}")

        def leaf_mask(key, x):
            m = tf.cast(mask[key], tf.bool)
            try:
                tf.broadcast_static_shape(m.shape, x.shape)
            except ValueError:
                raise ValueError(f"mean_and_std: the mask of field {key!r} has shape {m.shape}, which is neither a "
                                 f"scalar nor broadcastable to the field's shape {x.shape}") from None
            return tf.broadcast_to(m, tf.shape(x))
        masks = {k: tf.nest.map_structure(lambda x, k=k: leaf_mask(k, tf.convert_to_tensor(x)), data[k])
                 for k in data}
        return data, masks

    def masked(steps):
        """Per-step data with invalid elements zeroed, and the masks, for a batch of steps."""
        def one(step):
            data, masks = fields_and_masks(step)
            data = tf.nest.map_structure(lambda x, m: tf.where(m, x, tf.zeros_like(x)), data, masks)
            return data, masks
        return tf.vectorized_map(one, steps)

    def batch_sums(steps):
        data, masks = masked(steps)
        return {"count": tf.nest.map_structure(lambda m: tf.reduce_sum(tf.cast(m, tf.int64), 0), masks),
                "data": tf.nest.map_structure(lambda x: tf.reduce_sum(x, 0), data)}

    sums = batches.map(batch_sums, num_parallel_calls=tf.data.AUTOTUNE)
    totals = sums.reduce(shape_ops.zeros_from_spec(sums.element_spec),
                         lambda acc, x: tf.nest.map_structure(tf.add, acc, x))
    totals = tf.nest.map_structure(lambda x: tf.cast(x, tf.float64), totals)
    count = totals["count"]
    mean = tf.nest.map_structure(tf.divide, totals["data"], count)

    def batch_square_errors(steps):
        data, masks = masked(steps)
        # Invalid entries count as the mean, so they add nothing.
        centred = tf.nest.map_structure(
            lambda x, m, mu: tf.where(m, tf.cast(x, tf.float64) - mu, tf.zeros_like(tf.cast(x, tf.float64))),
            data, masks, mean)
        return tf.nest.map_structure(lambda x: tf.reduce_sum(x ** 2, 0), centred)

    squares = batches.map(batch_square_errors, num_parallel_calls=tf.data.AUTOTUNE)
    total_squares = squares.reduce(shape_ops.zeros_from_spec(squares.element_spec),
                                   lambda acc, x: tf.nest.map_structure(tf.add, acc, x))
    # Called eagerly, std is numpy (np.float64 or arrays) and mean tensors, as in rlds; traced, both are tensors.
    sqrt = np.sqrt if tf.executing_eagerly() else tf.sqrt
    std = tf.nest.map_structure(lambda x, n: sqrt(x / (n - 1)), total_squares, count)
    return mean, std
