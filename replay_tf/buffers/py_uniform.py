"""`PyUniformReplayBuffer`: TF-Agents' Python (numpy) replay buffer with uniform sampling.

Items (one at a time: `add_batch` takes an outer batch of 1, as TF-Agents') go into a ring of numpy arrays,
one per leaf of `data_spec`; reads draw with numpy's global random generator exactly as TF-Agents 0.19
does, so a seeded program samples the same items. Writes and reads are thread-safe.

The buffer is a `tf.Module` whose numpy state goes into `tf.train.Checkpoint(rb=buffer)` under TF-Agents'
names (`_storage/_np_state/buffer<i>`, `_np_state/size`, `cur_id`, `item_count`, each `np.save` bytes
without pickle), so checkpoints move both ways between this buffer and TF-Agents' one. Subclasses change
the stored encoding through TF-Agents' hooks `_encoded_data_spec`, `_encode`, `_decode`, `_on_delete`
(see `PyHashedReplayBuffer`).

Differences from TF-Agents (deliberate): sampling an empty buffer, or `num_steps` more than it holds, raises
ValueError (TF-Agents returns uninitialized arrays, or numpy's error about `randint`); `gather_all` returns
the items held, oldest first, shaped `[1, size, ...]` as `TFUniformReplayBuffer`'s (TF-Agents returns all
`capacity` slots in storage order, zeros where nothing was written); `add_batch` names the leaf whose shape
does not fit, or whose values the storage dtype would change (floats into integer storage, integers out of
its range: TF-Agents lets numpy truncate or wrap them); `num_frames` is the number of items held (TF-Agents
raises NotImplementedError).
"""
from __future__ import annotations

import io
import threading
import types
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


class _ArrayState(tf.train.experimental.PythonState):
    """One numpy array in a checkpoint, as `np.save` bytes (pickle refused), as TF-Agents' NumpyState leaves.

    `shape`/`dtype` (storage arrays): what a restored array must be. TF-Agents saves a scalar 0 for
    storage it never touched; that restores as zeros of the right shape.
    """

    def __init__(self, array: np.ndarray, where: str, shape: Optional[tuple] = None, dtype: Any = None):
        self.array = array
        self._where, self._shape, self._dtype = where, shape, dtype

    def serialize(self) -> bytes:
        out = io.BytesIO()
        np.save(out, self.array, allow_pickle=False)
        return out.getvalue()

    def deserialize(self, string_value: bytes) -> None:
        array = np.load(io.BytesIO(string_value), allow_pickle=False)
        if self._shape is None:
            self.array = array[()]
            return
        if array.ndim == 0:
            array = np.zeros(self._shape, self._dtype)
        if array.shape != self._shape or array.dtype != self._dtype:
            raise ValueError(f"checkpoint value for {self._where} has shape {list(array.shape)} and dtype "
                             f"{array.dtype.name}; this buffer stores {list(self._shape)} {np.dtype(self._dtype).name} "
                             f"(restore into a buffer built with the same data_spec and capacity)")
        self.array = array


class PyUniformReplayBuffer(tf.Module):
    """A replay buffer of numpy arrays: `add_batch`, `get_next`, `as_dataset`, `gather_all`, `clear`.

    Args:
      data_spec: a nest of specs (`tf.TensorSpec`, TF-Agents `ArraySpec`s or anything with `shape` and
        `dtype`) describing one item; shapes fully defined.
      capacity: the most items held; the oldest is overwritten first.

    >>> import os, tempfile
    >>> rb = PyUniformReplayBuffer(tf.TensorSpec([], tf.int64), capacity=3)
    >>> for i in range(4):
    ...     rb.add_batch(np.array([i]))
    >>> path = tf.train.Checkpoint(rb=rb).save(os.path.join(tempfile.mkdtemp(), "ckpt"))
    >>> restored = PyUniformReplayBuffer(tf.TensorSpec([], tf.int64), capacity=3)
    >>> _ = tf.train.Checkpoint(rb=restored).restore(path)
    >>> restored.gather_all().tolist()
    [[1, 2, 3]]
    """

    def __init__(self, data_spec: Any, capacity: int):
        super().__init__()
        if int(capacity) < 1:
            raise ValueError(f"capacity ({capacity}) must be a positive integer")
        capacity = int(capacity)
        # Plain (untracked) holders: tf.Module would wrap nests of specs in its trackable containers.
        self._layout = types.SimpleNamespace(data_spec=data_spec, capacity=capacity,
                                             **dict(zip(("paths", "shapes", "dtypes"), _leaves(data_spec, "data_spec"))))
        encoded_spec = self._encoded_data_spec()
        self._layout.encoded_spec = encoded_spec
        _, encoded_shapes, encoded_dtypes = _leaves(encoded_spec, "encoded data_spec")
        # Checkpointed state, under TF-Agents' names.
        self._storage = tf.Module()
        self._storage._np_state = tf.Module()
        self._buffers = types.SimpleNamespace(states=[])
        for index, (shape, dtype) in enumerate(zip(encoded_shapes, encoded_dtypes)):
            state = _ArrayState(np.zeros((capacity, *shape), dtype), f"_storage/_np_state/buffer{index}",
                                (capacity, *shape), dtype)
            setattr(self._storage._np_state, f"buffer{index}", state)
            self._buffers.states.append(state)
        self._np_state = tf.Module()
        for name in ("size", "cur_id", "item_count"):
            setattr(self._np_state, name, _ArrayState(np.int64(0), f"_np_state/{name}"))
        self._lock = threading.Lock()

    # ----- subclass hooks (TF-Agents' names) -----
    def _encoded_data_spec(self) -> Any:
        """Spec of an item as stored (after `_encode`)."""
        return self._layout.data_spec

    def _encode(self, item: Any) -> Any:
        """An item (a nest of numpy arrays, no batch dimension) as stored."""
        return item

    def _decode(self, item: Any) -> Any:
        """A stored item back as the caller's item."""
        return item

    def _on_delete(self, encoded_item: Any) -> None:
        """Called with a stored item just before it is overwritten."""

    def _clear(self) -> None:
        """Called (under the buffer's lock) when the buffer is cleared."""

    # ----- state -----
    @property
    def _size(self) -> np.int64:
        return np.int64(self._np_state.size.array)

    @_size.setter
    def _size(self, value) -> None:
        self._np_state.size.array = np.int64(value)

    @property
    def _cur_id(self) -> np.int64:
        return np.int64(self._np_state.cur_id.array)

    @_cur_id.setter
    def _cur_id(self, value) -> None:
        self._np_state.cur_id.array = np.int64(value)

    @property
    def _item_count(self) -> np.int64:
        return np.int64(self._np_state.item_count.array)

    @_item_count.setter
    def _item_count(self, value) -> None:
        self._np_state.item_count.array = np.int64(value)

    @property
    def _capacity(self) -> int:
        return self._layout.capacity

    @property
    def data_spec(self) -> Any:
        return self._layout.data_spec

    @property
    def capacity(self) -> int:
        return self._layout.capacity

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
        layout = self._layout
        specs.assert_same_structure(items, layout.data_spec)
        leaves = [np.asarray(leaf) for leaf in specs.flatten(items)]
        batch = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
        if batch != {1}:
            raise NotImplementedError(f"PyUniformReplayBuffer only supports a batch size of 1, but received `items` "
                                      f"with batch size {sorted(batch, key=str)}")
        for path, leaf, shape, dtype in zip(layout.paths, leaves, layout.shapes, layout.dtypes):
            if leaf.shape[1:] != shape:
                raise ValueError(f"items{path[len('data_spec'):]} has shape {list(leaf.shape)}, expected "
                                 f"{[1, *shape]} (a batch of 1 of the spec's shape)")
            _check_cast(f"items{path[len('data_spec'):]}", leaf, dtype)
        item = specs.pack_sequence_as(layout.data_spec, [leaf[0].astype(dtype, copy=False)
                                                         for leaf, dtype in zip(leaves, layout.dtypes)])
        with self._lock:
            index, size = self._cur_id, self._size
            if size == self._capacity:
                self._on_delete(self._stored(index))
            encoded = specs.flatten(self._encode(item))
            for state, leaf in zip(self._buffers.states, encoded):
                state.array[index] = leaf
            self._size = min(size + 1, self._capacity)
            self._cur_id = (index + 1) % self._capacity
            self._item_count = self._item_count + 1

    def _stored(self, index: int) -> Any:
        """The encoded item at storage row `index` (copies)."""
        return specs.pack_sequence_as(self._layout.encoded_spec,
                                      [state.array[index].copy() for state in self._buffers.states])

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
        return self._decode(self._stored(index))

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
        layout = self._layout
        outer = [] if sample_batch_size is None else [sample_batch_size]
        if num_steps is not None:
            outer.append(num_steps)
        signature = specs.pack_sequence_as(layout.data_spec, [
            tf.TensorSpec([*outer, *shape], tf.as_dtype(dtype)) for shape, dtype in zip(layout.shapes, layout.dtypes)])

        def generate():
            while True:
                yield self.get_next(sample_batch_size, num_steps)

        return tf.data.Dataset.from_generator(generate, output_signature=signature)

    def gather_all(self) -> Any:
        """Every item held, oldest first, stacked as `[1, size, ...]`."""
        layout = self._layout
        with self._lock:
            size, start = int(self._size), int(self._cur_id) if self._size == self._capacity else 0
            order = (start + np.arange(size)) % self._capacity
            if type(self)._decode is PyUniformReplayBuffer._decode:
                flat = [state.array[order][np.newaxis] for state in self._buffers.states]
                return specs.pack_sequence_as(layout.data_spec, flat)
            items = [specs.flatten(self._item(index)) for index in order]
        flat = [np.stack(leaves)[np.newaxis] if items else np.zeros((1, 0, *shape), dtype)
                for leaves, shape, dtype in zip(zip(*items) if items else [()] * len(layout.shapes),
                                                layout.shapes, layout.dtypes)]
        return specs.pack_sequence_as(layout.data_spec, flat)

    def clear(self) -> None:
        """Empties the buffer."""
        with self._lock:
            self._size = 0
            self._cur_id = 0
            self._clear()


def _leaves(data_spec: Any, root: str) -> tuple[list, list, list]:
    """(paths, shapes, numpy dtypes) of the leaves of a spec nest, shapes fully defined."""
    paths, shapes, dtypes = [], [], []
    for path, spec in specs.flatten_with_paths(data_spec, root=root):
        shape = tf.TensorShape(spec.shape)
        if not shape.is_fully_defined():
            raise ValueError(f"{path} has shape {shape}: PyUniformReplayBuffer needs fully defined shapes")
        paths.append(path)
        shapes.append(tuple(shape.as_list()))
        dtypes.append(np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype))
    if not paths:
        raise ValueError(f"{root} has no leaves: {data_spec!r}")
    return paths, shapes, dtypes
