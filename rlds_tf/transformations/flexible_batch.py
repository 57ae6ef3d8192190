"""`batch`: overlapping, strided batches of a dataset as flat tensors, vectorized in plain tf.data.

`batch(ds, size=2, shift=1)` over (1, 2, 3, 4) gives [1, 2], [2, 3], [3, 4], [4]: windows start every
`shift` elements, take `size` elements `stride` apart, and (unless `drop_remainder`) the windows at the end
keep what is left. Datasets of plain tensors use TensorFlow's stock `SlidingWindowDataset` kernel (as rlds
does: each element is copied straight into its windows). Otherwise, when every shape is known, the input
is cut into large blocks and a `Dataset.scan` carries the elements that windows still need into the next
block, every full window of a block coming from one `tf.gather`; anything else goes through
`Dataset.window`.

>>> [x.numpy().tolist() for x in batch(tf.data.Dataset.range(1, 5), size=2, shift=1)]
[[1, 2], [2, 3], [3, 4], [4]]
"""
from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from rlds_tf import rlds_types

try:  # Stock TensorFlow kernels, reached through TF's generated op wrappers (not public API).
    from tensorflow.python.data.ops import dataset_ops  # pylint: disable=g-direct-tensorflow-import
    from tensorflow.python.ops import gen_experimental_dataset_ops  # pylint: disable=g-direct-tensorflow-import
except ImportError:  # pragma: no cover - a TF without them falls back to the blocked gather
    dataset_ops = gen_experimental_dataset_ops = None
from rlds_tf.transformations import shape_ops

BATCH_AUTO_TUNE = -1
DEFAULT_BATCH_SIZE_IN_BYTES = 200_000
_BLOCK_ELEMENTS = 4096  # elements per block on the blocked-gather path


def get_batch_size(dataset: tf.data.Dataset, optimization_batch_size: int = BATCH_AUTO_TUNE) -> int:
    """`optimization_batch_size`, or with BATCH_AUTO_TUNE: about 200 KB worth of steps (at least 1)."""
    if optimization_batch_size != BATCH_AUTO_TUNE:
        return optimization_batch_size
    spec = dataset.element_spec
    if isinstance(spec, dict) and rlds_types.STEPS in spec:
        spec = spec[rlds_types.STEPS]
        spec = spec.element_spec if isinstance(spec, tf.data.DatasetSpec) else tf.nest.map_structure(
            lambda s: tf.TensorSpec(s.shape[1:], s.dtype), spec)
    return max(1, DEFAULT_BATCH_SIZE_IN_BYTES // max(1, shape_ops.size_from_spec(spec)))


def _windows_by_dataset(dataset, size, shift, stride, drop_remainder):
    """The generic path (any element type): one window dataset per output."""
    windowed = dataset.window(size=size, shift=shift, stride=stride, drop_remainder=drop_remainder)
    return windowed.flat_map(lambda window: tf.data.Dataset.zip(
        tf.nest.map_structure(lambda ds: ds.batch(size), window)))


class _SlidingWindowDataset(dataset_ops.UnaryDataset if gen_experimental_dataset_ops else object):
    """TensorFlow's stock `SlidingWindowDataset` kernel (the one rlds uses): windows copied in C++."""

    def __init__(self, input_dataset, size, shift, stride, drop_remainder):
        self._element_spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype), input_dataset.element_spec)
        variant = gen_experimental_dataset_ops.sliding_window_dataset(
            input_dataset._variant_tensor,  # pylint: disable=protected-access
            window_size=tf.constant(size, tf.int64), window_shift=tf.constant(shift, tf.int64),
            window_stride=tf.constant(stride, tf.int64), drop_remainder=drop_remainder,
            output_types=[s.dtype for s in tf.nest.flatten(self._element_spec)],
            output_shapes=[s.shape for s in tf.nest.flatten(self._element_spec)])
        super().__init__(input_dataset, variant)

    @property
    def element_spec(self):
        return self._element_spec


def _sliding_window_kernel_available() -> bool:
    return gen_experimental_dataset_ops is not None and hasattr(gen_experimental_dataset_ops,
                                                                "sliding_window_dataset")


def _vectorizable(spec: Any) -> bool:
    return all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in tf.nest.flatten(spec))


def _windows_by_blocks(dataset, size, shift, stride, drop_remainder):
    spec = dataset.element_spec
    span = (size - 1) * stride + 1  # elements covered by one full window
    # Blocks hold whole multiples of `shift` so every block starts windows at the same phase.
    block = max(_BLOCK_ELEMENTS // shift, 1) * shift
    empty = tf.nest.map_structure(lambda s: tf.zeros([0] + s.shape.as_list(), s.dtype), spec)
    blocks = dataset.batch(block).map(lambda b: (b, False)).concatenate(
        tf.data.Dataset.from_tensors((empty, True)))
    offsets = tf.range(size, dtype=tf.int64) * stride

    def step(state, inputs):
        pending, to_skip = state  # elements from the next window start on; elements to drop before it
        new, is_end = inputs
        n_new = tf.shape(tf.nest.flatten(new)[0], out_type=tf.int64)[0]
        dropped = tf.minimum(to_skip, n_new)
        data = tf.nest.map_structure(lambda p, x: tf.concat([p, x[dropped:]], 0), pending, new)
        length = tf.shape(tf.nest.flatten(data)[0], out_type=tf.int64)[0]
        # Full windows start at 0, shift, ... while start + span <= length.
        num_full = tf.where(length >= span, (length - span) // shift + 1, 0)
        starts = tf.range(num_full, dtype=tf.int64) * shift
        full = tf.nest.map_structure(lambda x: tf.gather(x, starts[:, None] + offsets[None, :]), data)
        next_start = num_full * shift
        keep_from = tf.minimum(next_start, length)
        pending = tf.nest.map_structure(lambda x: x[keep_from:], data)
        to_skip = to_skip - dropped + (next_start - keep_from)
        # At the end of the input: the remaining (partial) windows, padded to `size`, with their lengths.
        if drop_remainder:
            num_tail = tf.constant(0, tf.int64)
        else:
            num_tail = tf.where(is_end, (length - next_start + shift - 1) // shift, 0)
            num_tail = tf.maximum(num_tail, 0)
        tail_starts = next_start + tf.range(num_tail, dtype=tf.int64) * shift
        tail_index = tail_starts[:, None] + offsets[None, :]
        tail_lengths = tf.reduce_sum(tf.cast(tail_index < length, tf.int64), 1)
        tail = tf.nest.map_structure(lambda x: tf.gather(x, tf.minimum(tail_index, tf.maximum(length - 1, 0))),
                                     data)
        return (pending, to_skip), (full, tail, tail_lengths)

    scanned = blocks.scan((empty, tf.constant(0, tf.int64)), tf.autograph.experimental.do_not_convert(step))
    if drop_remainder:
        return scanned.flat_map(lambda full, tail, lengths: tf.data.Dataset.from_tensor_slices(full))

    def cut(window, length):
        return tf.nest.map_structure(lambda x: x[:length], window)

    return scanned.flat_map(lambda full, tail, lengths: tf.data.Dataset.from_tensor_slices(full).concatenate(
        tf.data.Dataset.from_tensor_slices((tail, lengths)).map(cut)))


def batch(dataset: tf.data.Dataset, size: int = BATCH_AUTO_TUNE, shift: Optional[int] = None,
          stride: int = 1, drop_remainder: bool = False, *, checkpointable: bool = False) -> tf.data.Dataset:
    """Batches elements into (possibly overlapping, strided) windows, returned as flat batched tensors.

    Args:
      dataset: the dataset to batch.
      size: elements per batch; BATCH_AUTO_TUNE picks about 200 KB of elements.
      shift: distance between the first elements of consecutive batches (defaults to `size`).
      stride: distance between consecutive elements within a batch.
      drop_remainder: drop the batches at the end that have fewer than `size` elements.
      checkpointable: build overlapping windows with the blocked gather, whose iterators can be saved
        with `tf.train.Checkpoint` (TF's sliding-window kernel, used otherwise as in rlds, cannot save its
        state); about half as fast on element-by-element inputs.

    Returns:
      The dataset of batches (leading dimension None, or `size` when `drop_remainder`).

    Raises:
      ValueError: `size`, `shift` or `stride` is not positive.

    >>> ds = tf.data.Dataset.range(1, 5)
    >>> [x.numpy().tolist() for x in batch(ds, size=2, shift=1, stride=2)]
    [[1, 3], [2, 4], [3], [4]]
    >>> [x.numpy().tolist() for x in batch(ds, size=3, shift=2)]
    [[1, 2, 3], [3, 4]]
    """
    size = get_batch_size(dataset, size)
    if not shift:
        shift = size
    for name, value in (("size", size), ("shift", shift), ("stride", stride)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if shift == size and stride == 1:
        return dataset.batch(size, drop_remainder=drop_remainder)
    plain_tensors = all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(dataset.element_spec))
    if plain_tensors and _sliding_window_kernel_available() and not checkpointable:
        # About twice as fast as the blocked gather below for element-by-element inputs (measured with
        # benchmarks/bench_patterns.py): the kernel copies each element into its windows without
        # re-slicing a block.
        return _SlidingWindowDataset(dataset, size, shift, stride, drop_remainder)
    if _vectorizable(dataset.element_spec):
        return _windows_by_blocks(dataset, size, shift, stride, drop_remainder)
    return _windows_by_dataset(dataset, size, shift, stride, drop_remainder)
