"""`batch`: overlapping, strided batches of a dataset as flat tensors, vectorized in plain tf.data.

`batch(ds, size=2, shift=1)` over (1, 2, 3, 4) gives [1, 2], [2, 3], [3, 4], [4]: windows start every
`shift` elements, take `size` elements `stride` apart, and (unless `drop_remainder`) the windows at the end
keep what is left, as in rlds.

Everything is public tf.data, and iterators save and restore with `tf.train.Checkpoint`. When every shape
is known, the input is cut into blocks of about `_BLOCK_BYTES` (`Dataset.batch`), a `Dataset.scan` carries
the rows that windows still need into the next block, every full window of a block comes from one
`tf.gather`, and `unbatch()` hands the windows out one by one; this costs about as much CPU per window as
TensorFlow's private `SlidingWindowDataset` kernel, which rlds uses (benchmarks/bench_patterns.py), but
runs as two pipelined stages (a `prefetch` of blocks between the scan and `unbatch`), so with two cores
free it is faster in wall time. Per element, reading the input itself (say a `from_tensor_slices`) and
handing a window out each cost as much as everything else, which bounds any public-API formulation.
Anything else (unknown shapes, nested datasets, ragged or sparse values) goes through `Dataset.window`.

>>> [x.numpy().tolist() for x in batch(tf.data.Dataset.range(1, 5), size=2, shift=1)]
[[1, 2], [2, 3], [3, 4], [4]]
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from rlds_tf import rlds_types
from rlds_tf.transformations import _cardinality
from rlds_tf.transformations import shape_ops

BATCH_AUTO_TUNE = -1
DEFAULT_BATCH_SIZE_IN_BYTES = 200_000
# Input rows per block on the blocked path: about this many bytes (blocks that stay in cache beat larger
# ones, and the scan's fixed cost per block makes much smaller ones lose too) ...
_BLOCK_BYTES = 512 * 1024
# ... and at most this many rows, however small the rows are.
_MAX_BLOCK_ELEMENTS = 4096


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


def _vectorizable(spec: Any) -> bool:
    return all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in tf.nest.flatten(spec))


def _num_rows(nest: Any) -> tf.Tensor:
    return tf.shape(tf.nest.flatten(nest)[0], out_type=tf.int64)[0]


def _windows_by_blocks(dataset, size, shift, stride, drop_remainder):
    """Windows of a dataset of fully-shaped tensors: blocks, a scan carrying rows across them, a gather.

    The scan's state is `(pending, to_skip)`: `pending` holds the rows from the start of the next window
    on (fewer than a full window's span of them between blocks), `to_skip` the rows still to drop before
    the next window starts (only when `shift` exceeds the span, so consecutive windows leave gaps).
    """
    spec = dataset.element_spec
    span = (size - 1) * stride + 1  # rows from the first to the last element of a full window
    row_bytes = max(1, shape_ops.size_from_spec(spec))
    rows = min(max(_BLOCK_BYTES // row_bytes, 1), _MAX_BLOCK_ELEMENTS)
    block = max(rows // shift, 1) * shift  # whole multiples of `shift`: fewer rows left over per block
    empty = tf.nest.map_structure(lambda s: tf.zeros([0] + s.shape.as_list(), s.dtype), spec)
    offsets = tf.range(size, dtype=tf.int64) * stride  # row of each window element, from its start
    # At the end (unless drop_remainder), each window starting in `pending` keeps the rows it has: one
    # such partial window per extra scan step, driven by `num_tails` empty blocks appended to the input
    # (`Dataset.batch` never emits an empty block otherwise). `pending` then has fewer than `span` rows,
    # so at most ceil((span - 1) / shift) windows start in it.
    num_tails = 0 if drop_remainder else -(-(span - 1) // shift)

    def step(state, new):
        pending, to_skip = state
        dropped = tf.minimum(to_skip, _num_rows(new))  # gap rows in this block
        data = tf.nest.map_structure(lambda p, x: tf.concat([p, x[dropped:]], 0), pending, new)
        length = _num_rows(data)
        # Full windows start at 0, shift, 2 * shift, ... while start + span <= length.
        num_windows = tf.where(length >= span, (length - span) // shift + 1, 0)
        width = size
        if num_tails:
            # An empty block marks the end: one window from row 0 (if any) with the rows it has.
            is_end = tf.equal(_num_rows(new), 0)
            num_windows = tf.where(is_end, tf.minimum(length, 1), num_windows)
            width = tf.where(is_end, tf.reduce_sum(tf.cast(offsets < length, tf.int64)), size)
        index = tf.range(num_windows)[:, None] * shift + offsets[None, :width]  # [num_windows, width]
        windows = tf.nest.map_structure(lambda x: tf.gather(x, index), data)
        # The next window starts at num_windows * shift: keep the rows from there on, or, if it starts
        # past the end of `data` (a gap), remember how many rows of the next block to drop first.
        next_start = num_windows * shift
        keep_from = tf.minimum(next_start, length)
        pending = tf.nest.map_structure(lambda x: x[keep_from:], data)
        return (pending, to_skip - dropped + next_start - keep_from), windows

    blocks = dataset.batch(block)
    if num_tails:
        blocks = blocks.concatenate(tf.data.Dataset.from_tensors(empty).repeat(num_tails))
    scanned = blocks.scan((empty, tf.constant(0, tf.int64)), tf.autograph.experimental.do_not_convert(step))
    # Two stages on two threads: reading the input and cutting windows (most of the CPU), then handing the
    # windows out one by one. A prefetched block costs one hand-off per ~`_BLOCK_BYTES` of input.
    return scanned.prefetch(1).unbatch()


def batch(dataset: tf.data.Dataset, size: int = BATCH_AUTO_TUNE, shift: Optional[int] = None,
          stride: int = 1, drop_remainder: bool = False) -> tf.data.Dataset:
    """Batches elements into (possibly overlapping, strided) windows, returned as flat batched tensors.

    Args:
      dataset: the dataset to batch.
      size: elements per batch; BATCH_AUTO_TUNE picks about 200 KB of elements.
      shift: distance between the first elements of consecutive batches (defaults to `size`).
      stride: distance between consecutive elements within a batch.
      drop_remainder: drop the batches at the end that have fewer than `size` elements.

    `size`, `shift` and `stride` may be Python or numpy integers, or integer scalar tensors whose value is
    known when the dataset is built (rlds takes int64 tensors). Iterators of the result can be saved with
    `tf.train.Checkpoint`.

    It works inside traced code too (`episodes.flat_map(lambda e: batch(e['steps'], 2, 1))`, `interleave`,
    `map`, `tf.function`, TF1 graph mode). The result has a known cardinality whenever the input's is known
    while the dataset is built, which is eagerly (rlds' sliding window loses it, or reports too many
    batches with `drop_remainder`); in traced code the input's cardinality is a symbolic tensor, so the
    result's cardinality is unknown there, as rlds'.

    Returns:
      The dataset of batches (leading dimension None, or `size` when `drop_remainder`).

    Raises:
      ValueError: `size`, `shift` or `stride` is not a positive integer.

    >>> ds = tf.data.Dataset.range(1, 5)
    >>> [x.numpy().tolist() for x in batch(ds, size=2, shift=1, stride=2)]
    [[1, 3], [2, 4], [3], [4]]
    >>> [x.numpy().tolist() for x in batch(ds, size=3, shift=2)]
    [[1, 2, 3], [3, 4]]
    """
    size = get_batch_size(dataset, _positive_int("size", size, BATCH_AUTO_TUNE))
    shift = size if shift is None else _positive_int("shift", shift, 0)
    if not shift:  # (rlds takes 0 for the default too)
        shift = size
    stride = _positive_int("stride", stride)
    if shift == size and stride == 1:
        return dataset.batch(size, drop_remainder=drop_remainder)
    if _vectorizable(dataset.element_spec):
        windows = _windows_by_blocks(dataset, size, shift, stride, drop_remainder)
    else:
        windows = _windows_by_dataset(dataset, size, shift, stride, drop_remainder)
    count = _num_batches(_cardinality.static_cardinality(dataset), size, shift, stride, drop_remainder)
    return windows if count is None else windows.apply(tf.data.experimental.assert_cardinality(count))


def _positive_int(name: str, value: Any, *allowed: int) -> int:
    """`value` (a Python or numpy integer, or an integer scalar tensor with a static value) as an int;
    ValueError unless it is positive or one of `allowed`."""
    static = tf.get_static_value(value) if tf.is_tensor(value) else value
    if (isinstance(static, (int, np.integer)) and not isinstance(static, (bool, np.bool_))) or (
            isinstance(static, np.ndarray) and static.ndim == 0 and static.dtype.kind in "iu"):
        static = int(static)
        if static > 0 or static in allowed:
            return static
    raise ValueError(f"{name} must be a positive integer (a Python or numpy int, or an integer scalar tensor "
                     f"known when the dataset is built), got {value!r}")


def _num_batches(num_elements: Optional[int], size: int, shift: int, stride: int,
                 drop_remainder: bool) -> Optional[int]:
    """How many batches `batch` makes of `num_elements` elements: windows start every `shift` elements, and
    all of them count (each keeps what is left) or, with `drop_remainder`, only those that are full; None for
    a cardinality that is not a count (unknown, or not known while building), INFINITE_CARDINALITY for an
    infinite input."""
    if num_elements is None:
        return None
    if num_elements == tf.data.INFINITE_CARDINALITY:
        return num_elements
    if num_elements < 0:
        return None
    if not drop_remainder:
        return -(-num_elements // shift)
    span = (size - 1) * stride + 1
    return (num_elements - span) // shift + 1 if num_elements >= span else 0
