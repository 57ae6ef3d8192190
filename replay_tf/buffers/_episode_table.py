"""Variable-length episodes on `tf.Variable` storage, for `EpisodicReplayBuffer`.

Each leaf of the data spec is one variable shaped `[capacity, width, *leaf_shape]`: row `location` holds
the steps of the episode at that location, step `t` at column `t`. How many columns of a row are in use is
the buffer's business (its `episode_lengths`); columns past that length are stale and never read. The
width starts at 0 and doubles (at least) whenever a write needs a column past it, so storage is
`capacity * longest episode so far` steps, rounded up to a power of two; the variables are declared with an
unknown width so the growth is an ordinary `assign` (eager, `tf.function`, tf.data functions, TF1 graphs).

Reads gather only the rows or elements they need (`sparse_read`, `gather_nd` on the variable), never the
whole storage.
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from replay_tf import specs


def valid_range_ids(last_id, capacity: int):
    """`[min_id, max_id)`: the ids of the episodes held (the newest `capacity` up to `last_id`)."""
    full = last_id >= capacity
    return (tf.where(full, last_id + 1 - capacity, tf.constant(0, tf.int64)),
            tf.where(full, last_id + 1, tf.maximum(last_id + 1, 0)))


class EpisodeTable(tf.Module):
    """Per-leaf `[capacity, width, ...]` variables, written at (location, step) pairs."""

    def __init__(self, data_spec: Any, capacity: int, name_prefix: str):
        super().__init__()
        self._capacity = capacity
        flat = [spec for _, spec in specs.flatten_with_paths(data_spec, "data_spec")]
        self._leaf_specs = tuple((tuple(spec.shape.as_list()), spec.dtype) for spec in flat)
        self.slots = [
            tf.Variable(tf.zeros([capacity, 0, *shape], dtype), shape=tf.TensorShape([capacity, None, *shape]),
                        trainable=False, name=f"{name_prefix}_slot{index}")
            for index, (shape, dtype) in enumerate(self._leaf_specs)]

    def width(self) -> tf.Tensor:
        return tf.shape(self.slots[0], out_type=tf.int64)[1]

    def ensure_width(self, needed) -> tf.Tensor:
        """Grows every slot to at least `needed` columns (int64 scalar), doubling the width at least."""
        needed = tf.convert_to_tensor(needed, tf.int64)

        def grow():
            width = self.width()
            new_width = tf.maximum(needed, 2 * width)
            assigns = []
            for slot, (shape, dtype) in zip(self.slots, self._leaf_specs):
                pad = tf.zeros(tf.concat([[self._capacity, new_width - width], tf.constant(shape, tf.int64)], 0),
                               dtype)
                assigns.append(slot.assign(tf.concat([slot.read_value(), pad], axis=1), read_value=False))
            with tf.control_dependencies(assigns):
                return tf.constant(True)

        return tf.cond(needed > self.width(), grow, lambda: tf.constant(False))

    def write(self, locations, steps, flat_values: Sequence[tf.Tensor]) -> tf.Operation:
        """Writes `flat_values[i][k]` at (`locations[k]`, `steps[k]`) for every leaf `i` (int64 vectors)."""
        grow = self.ensure_width(tf.reduce_max(tf.concat([steps + 1, tf.zeros([1], tf.int64)], 0)))
        with tf.control_dependencies([grow]):
            indices = tf.stack([locations, steps], axis=1)
            writes = [slot.scatter_nd_update(indices, value) for slot, value in zip(self.slots, flat_values)]
        return tf.group(writes)

    def read_episode(self, location, length) -> list[tf.Tensor]:
        """The first `length` steps of the row at `location` (scalars), one tensor per leaf."""
        return [tf.gather(slot, location)[:length] for slot in self.slots]

    def read_steps(self, locations, steps) -> list[tf.Tensor]:
        """Elements at (`locations[k]`, `steps[k]`), one `[n, ...]` tensor per leaf."""
        indices = tf.stack([locations, steps], axis=1)
        return [slot.gather_nd(indices) for slot in self.slots]

    def clear(self) -> tf.Operation:
        """Drops all storage (width back to 0)."""
        return tf.group([slot.assign(tf.zeros([self._capacity, 0, *shape], dtype), read_value=False)
                         for slot, (shape, dtype) in zip(self.slots, self._leaf_specs)])

    # ----- TensorList exchange (TF-Agents' `Episodes.tensor_lists`) -----
    def to_tensor_lists(self, locations, lengths) -> list[tf.Tensor]:
        """Per leaf, a variant vector: for each location, a TensorList of its first `length` steps."""
        def one(args):
            location, length = args
            return [tf.raw_ops.TensorListFromTensor(tensor=tf.gather(slot, location)[:length],
                                                    element_shape=tf.constant(shape, tf.int64))
                    for slot, (shape, _) in zip(self.slots, self._leaf_specs)]
        return tf.map_fn(one, (locations, lengths),
                         fn_output_signature=[tf.TensorSpec([], tf.variant)] * len(self.slots))

    def append_tensor_lists(self, locations, starts, lists: Sequence[tf.Tensor]):
        """Writes the steps of TensorList `lists[leaf][k]` at `locations[k]` from step `starts[k]` on."""
        def body(k):
            values = [tf.raw_ops.TensorListStack(input_handle=tf.gather(leaf_lists, k),
                                                 element_shape=tf.constant(shape, tf.int32), element_dtype=dtype)
                      for leaf_lists, (shape, dtype) in zip(lists, self._leaf_specs)]
            count = tf.shape(values[0], out_type=tf.int64)[0]
            location = tf.gather(locations, k)
            write = self.write(tf.fill([count], location), tf.gather(starts, k) + tf.range(count), values)
            with tf.control_dependencies([write]):
                return (k + 1,)
        return tf.while_loop(lambda k: k < tf.size(locations, out_type=tf.int64), body,
                             (tf.constant(0, tf.int64),))[0]
