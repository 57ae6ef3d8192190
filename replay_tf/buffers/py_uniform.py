"""`PyUniformReplayBuffer`: TF-Agents' Python (numpy) replay buffer with uniform sampling.

Items (one at a time: `add_batch` takes an outer batch of 1, as TF-Agents') go into a ring of numpy arrays,
one per leaf of `data_spec`; reads draw with numpy's global random generator exactly as TF-Agents 0.19
does, so a seeded program samples the same items. Writes and reads are thread-safe.

Differences from TF-Agents (deliberate): sampling an empty buffer, or `num_steps` more than it holds, raises
ValueError (TF-Agents returns uninitialized arrays, or numpy's error about `randint`); `gather_all` returns
the items held, oldest first, shaped `[1, size, ...]` as `TFUniformReplayBuffer`'s (TF-Agents returns all
`capacity` slots in storage order, zeros where nothing was written); `add_batch` names the leaf whose shape
does not fit, or whose values the storage dtype would change (floats into integer storage, integers out of
its range: TF-Agents lets numpy truncate or wrap them); `num_frames` is the number of items held (TF-Agents
raises NotImplementedError).
"""
from __future__ import annotations

import threading
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from replay_tf import specs


def _check_cast(where: str, leaf: np.ndarray, dtype: np.dtype) -> None:
    """ValueError unless storing `leaf` as `dtype` keeps its values: no float (or complex) into integer or
    bool storage, no complex into float, and integers only within the storage type's range (TF-Agents
    stores whatever numpy's assignment makes of them: 300 as uint8 44, 1.5 as int 1)."""
    src = leaf.dtype
    if src == dtype or dtype.kind not in "biufc" or src.kind not in "biufc":
        return
    if (src.kind in "fc" and dtype.kind in "biu") or (src.kind == "c" and dtype.kind == "f"):
        raise ValueError(f"{where} has dtype {src.name}, which does not fit the spec's {dtype.name} (values would "
                         f"be truncated)")
    if dtype.kind in "iu" and src.kind in "iu" and leaf.size:
        info = np.iinfo(dtype)
        low, high = leaf.min(), leaf.max()
        if low < info.min or high > info.max:
            raise ValueError(f"{where} has values in [{low}, {high}], outside the spec's {dtype.name} range "
                             f"[{info.min}, {info.max}]")


class PyUniformReplayBuffer:
    """A replay buffer of numpy arrays: `add_batch`, `get_next`, `as_dataset`, `gather_all`, `clear`.

    Args:
      data_spec: a nest of specs (`tf.TensorSpec`, TF-Agents `ArraySpec`s or anything with `shape` and
        `dtype`) describing one item; shapes fully defined.
      capacity: the most items held; the oldest is overwritten first.
    """

    def __init__(self, data_spec: Any, capacity: int):
        if int(capacity) < 1:
            raise ValueError(f"capacity ({capacity}) must be a positive integer")
        self._data_spec = data_spec
        self._capacity = int(capacity)
        self._paths, self._shapes, self._dtypes = [], [], []
        for path, spec in specs.flatten_with_paths(data_spec, root="data_spec"):
            shape = tf.TensorShape(spec.shape)
            if not shape.is_fully_defined():
                raise ValueError(f"{path} has shape {shape}: PyUniformReplayBuffer needs fully defined shapes")
            self._paths.append(path)
            self._shapes.append(tuple(shape.as_list()))
            self._dtypes.append(np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype))
        if not self._paths:
            raise ValueError(f"data_spec has no leaves: {data_spec!r}")
        self._storage = [np.zeros((self._capacity, *shape), dtype) for shape, dtype in zip(self._shapes, self._dtypes)]
        self._lock = threading.Lock()
        self._size = np.int64(0)
        self._cur_id = np.int64(0)
        self._item_count = np.int64(0)

    @property
    def data_spec(self) -> Any:
        return self._data_spec

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def size(self) -> np.int64:
        """How many items the buffer holds."""
        return self._size

    def num_frames(self) -> np.int64:
        """How many items the buffer holds (TF-Agents' Python buffer does not implement it)."""
        return self._size

    def add_batch(self, items: Any) -> None:
        """Adds one item, given with an outer batch dimension of 1 (a nest like `data_spec`).

        Raises:
          NotImplementedError: an outer batch dimension other than 1 (as TF-Agents).
          TypeError: `items` not structured like `data_spec` (naming the first difference).
          ValueError: a leaf of another shape, or whose values the spec's dtype would change (see `_check_cast`).
        """
        specs.assert_same_structure(items, self._data_spec)
        leaves = [np.asarray(leaf) for leaf in specs.flatten(items)]
        batch = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
        if batch != {1}:
            raise NotImplementedError(f"PyUniformReplayBuffer only supports a batch size of 1, but received `items` "
                                      f"with batch size {sorted(batch, key=str)}")
        for path, leaf, shape, dtype in zip(self._paths, leaves, self._shapes, self._dtypes):
            if leaf.shape[1:] != shape:
                raise ValueError(f"items{path[len('data_spec'):]} has shape {list(leaf.shape)}, expected "
                                 f"{[1, *shape]} (a batch of 1 of the spec's shape)")
            _check_cast(f"items{path[len('data_spec'):]}", leaf, dtype)
        with self._lock:
            index = self._cur_id
            for array, leaf in zip(self._storage, leaves):
                array[index] = leaf[0]
            self._size = np.minimum(self._size + 1, self._capacity)
            self._cur_id = (self._cur_id + 1) % self._capacity
            self._item_count += 1

    def get_next(self, sample_batch_size: Optional[int] = None, num_steps: Optional[int] = None,
                 time_stacked: bool = True) -> Any:
        """A uniformly sampled item (or `sample_batch_size` of them stacked), or `num_steps` consecutive
        items (stacked on a time axis after the batch one, or a list of them without `time_stacked`).

        Raises:
          ValueError: The buffer holds fewer than `num_steps` items (or none).
        """
        if sample_batch_size is None:
            return self._single(num_steps, time_stacked)
        return self._stack([self._single(num_steps, time_stacked) for _ in range(sample_batch_size)])

    def _single(self, num_steps: Optional[int], time_stacked: bool) -> Any:
        steps = 1 if num_steps is None else num_steps
        with self._lock:
            size = int(self._size)
            if size < steps or size == 0:
                raise ValueError(f"PyUniformReplayBuffer holds {size} items: sampling needs at least "
                                 f"{max(steps, 1)} (num_steps={num_steps})")
            index = np.random.randint(size - steps + 1)  # (numpy's global generator, as TF-Agents)
            if size == self._capacity:
                index += self._cur_id
            if num_steps is None:
                return self._item(index % self._capacity)
            items = [self._item((index + n) % self._capacity) for n in range(num_steps)]
        return self._stack(items) if time_stacked else items

    def _item(self, index: int) -> Any:
        return specs.pack_sequence_as(self._data_spec, [array[index].copy() for array in self._storage])

    def _stack(self, items: list) -> Any:
        flat = [specs.flatten(item) for item in items]
        return specs.pack_sequence_as(items[0], [np.stack(leaves) for leaves in zip(*flat)])

    def as_dataset(self, sample_batch_size: Optional[int] = None, num_steps: Optional[int] = None,
                   num_parallel_calls: Optional[int] = None, sequence_preprocess_fn=None,
                   single_deterministic_pass: bool = False) -> tf.data.Dataset:
        """An endless `tf.data.Dataset` of `get_next(sample_batch_size, num_steps)` results (items only,
        as TF-Agents' Python buffer; `num_parallel_calls`, `sequence_preprocess_fn` and
        `single_deterministic_pass` are not supported, as there)."""
        if sequence_preprocess_fn is not None:
            raise NotImplementedError("sequence_preprocess_fn is not supported.")
        if num_parallel_calls is not None:
            raise NotImplementedError("PyUniformReplayBuffer does not support num_parallel_calls (must be None).")
        if single_deterministic_pass:
            raise NotImplementedError("PyUniformReplayBuffer does not support single_deterministic_pass.")
        outer = [] if sample_batch_size is None else [sample_batch_size]
        if num_steps is not None:
            outer.append(num_steps)
        signature = specs.pack_sequence_as(self._data_spec, [
            tf.TensorSpec([*outer, *shape], tf.as_dtype(dtype)) for shape, dtype in zip(self._shapes, self._dtypes)])

        def generate():
            while True:
                yield self.get_next(sample_batch_size, num_steps)

        return tf.data.Dataset.from_generator(generate, output_signature=signature)

    def gather_all(self) -> Any:
        """Every item held, oldest first, stacked as `[1, size, ...]`."""
        with self._lock:
            size, start = int(self._size), int(self._cur_id) if self._size == self._capacity else 0
            order = (start + np.arange(size)) % self._capacity
            flat = [array[order][np.newaxis] for array in self._storage]
        return specs.pack_sequence_as(self._data_spec, flat)

    def clear(self) -> None:
        """Empties the buffer."""
        with self._lock:
            self._size = np.int64(0)
            self._cur_id = np.int64(0)
