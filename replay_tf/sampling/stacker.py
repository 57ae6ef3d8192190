"""`Stacker`: a sample stream's batches as the flat columns of a sample dataset's elements.

A flat batch is the 5 `SampleInfo` columns (key, probability, table_size, priority, times_sampled), then
the data columns in `tree.flatten` order, each stacked along a new leading axis. The stacker checks every
sampled column against the dataset's dtypes and shapes (`signature_checks.check_received`), so the
per-iterator and the shared sources raise the same errors.
"""
from __future__ import annotations

import operator
from typing import Optional

import numpy as np
import tensorflow as tf

from replay_tf.replay_sample import SampleInfo
from replay_tf.sampling import batch_source
from replay_tf.sampling import buffer_pool
from replay_tf.sampling import packed_rows
from replay_tf.sampling import signature_checks
from replay_tf.sampling import stacking
from replay_tf.wire.stacked_samples import StackedSamples
from replay_tf.wire.stacked_samples import count_samples

_get_key = operator.attrgetter("key")
_INFO_DTYPES = [signature_checks.numpy_dtype(d) for d in SampleInfo.tf_dtypes()]


def info_arrays(batch: list) -> SampleInfo:
    """The `SampleInfo` columns of `SampledItem`s (item, priority, times_sampled, probability, table_size)."""
    n = len(batch)
    return SampleInfo(
        key=np.fromiter(map(_get_key, map(operator.itemgetter(0), batch)), np.uint64, n),
        probability=np.fromiter(map(operator.itemgetter(3), batch), np.float64, n),
        table_size=np.fromiter(map(operator.itemgetter(4), batch), np.int64, n),
        priority=np.fromiter(map(operator.itemgetter(1), batch), np.float64, n),
        times_sampled=np.fromiter(map(operator.itemgetter(2), batch), np.int32, n))


class Stacker:
    """Stacks batches of samples whose data columns are `paths`, `dtypes` and `shapes` (flat, as `tree`
    flattens the dataset's structure; `tf.DType`s and `tf.TensorShape`s).

    `timestep_shapes` (one timestep's shape per column) makes it a stacker of items split into timesteps
    (`TimestepDataset`'s): squeezed columns are refused and mismatches are reported per timestep.
    """

    def __init__(self, paths: list, dtypes: list, shapes: list, *, timestep_shapes: Optional[list] = None):
        self.paths = paths
        self.dtypes = dtypes
        self.shapes = shapes
        self._timestep_shapes = timestep_shapes
        self.fully_defined = all(s.is_fully_defined() for s in shapes)
        # (numpy dtype, shape tuple) per column, and bytes per row (None where a shape is not fully defined)
        self._layout = [(signature_checks.numpy_dtype(d), tuple(s.as_list()) if s.is_fully_defined() else None)
                        for d, s in zip(dtypes, shapes)]
        self._row_bytes = [None if shape is None else int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                           for dtype, shape in self._layout]

    def flat_specs(self) -> list:
        """The `tf.TensorSpec`s of a flat batch (unknown leading dimension)."""
        return ([tf.TensorSpec([None], d) for d in SampleInfo.tf_dtypes()]
                + [tf.TensorSpec([None, *s.as_list()] if s.rank is not None else None, d)
                   for d, s in zip(self.dtypes, self.shapes)])

    def packer(self) -> Optional[packed_rows.PackedRows]:
        """Packs batches from the rows items keep (see `packed_rows`), when batches are handed to TensorFlow
        packed (small numeric rows, see `batch_source.packed_row_bytes`); None otherwise."""
        if batch_source.packed_row_bytes(self.flat_specs()) is None:
            return None
        return packed_rows.PackedRows(_INFO_DTYPES, self._layout)

    def check_columns(self, columns: list, table: str) -> None:
        """InvalidArgument (a ValueError in the generator) for columns of `table` that the dataset cannot
        yield (see `signature_checks.check_received`)."""
        signature_checks.check_received(columns, table, self.paths, self.dtypes, self.shapes, self._reported_shapes)

    def _reported_shapes(self, index: int, column_shape: tuple) -> tuple:
        """(the requested shape, the item's shape) of column `index` as a mismatch reports them (as Reverb
        reports them: per timestep for timestep items)."""
        if self._timestep_shapes is None:
            return self.shapes[index], tf.TensorShape(column_shape)
        return self._timestep_shapes[index], tf.TensorShape(column_shape[1:])

    def check_item(self, item, table: str) -> None:
        """Raises ValueError for an item of `table` this dataset cannot yield, before its columns are read
        (for samples of variable shapes, yielded one by one)."""
        if self._timestep_shapes is None:
            return
        squeezed = [column.squeeze for column in item.trajectory]
        if any(squeezed):
            raise ValueError(f"Sampled trajectory cannot be decomposed into timesteps: item {item.key} of table "
                             f"'{table}' has squeezed columns {[i for i, s in enumerate(squeezed) if s]}")

    def stack_flat(self, samples: list, pool: Optional[buffer_pool.BufferPool], table: str) -> list:
        """A flat batch (see the module docstring) of a sample stream's `SampledItem`s and `StackedSamples`
        of `table` (fully defined shapes only), its data in arrays of `pool` if given."""
        count = count_samples(samples)
        if pool is None:
            data = [buffer_pool.aligned_empty((count, *shape), dtype) for dtype, shape in self._layout]
        else:
            data = [pool.empty((count, *shape), dtype, row_bytes)
                    for (dtype, shape), row_bytes in zip(self._layout, self._row_bytes)]
        infos = []
        pos = 0
        for run in _runs(samples):
            if type(run) is StackedSamples:
                # (row 0: every row has its dtype and shape)
                self.check_columns([c[0] for c in run.columns], table)
                for out, column in zip(data, run.columns):
                    out[pos:pos + len(run)] = column
                infos.append(SampleInfo(run.keys, run.probabilities, run.table_sizes, run.priorities,
                                        run.times_sampled))
            else:
                self._gather(run, data if pos == 0 and len(run) == count else
                             [out[pos:pos + len(run)] for out in data], table)
                infos.append(info_arrays(run))
            pos += len(run)
        info = infos[0] if len(infos) == 1 else SampleInfo(*map(np.concatenate, zip(*infos)))
        return [*info, *data]

    def _gather(self, samples: list, data: list, table: str) -> None:
        """Fills `data` (one array per column) with the columns of `SampledItem`s of `table`."""
        items = [s.item for s in samples]
        per_item = None
        if any(len(item.resolved_columns) != len(data) for item in items):
            per_item = [item.column_arrays() for item in items]
            for cols in per_item:
                self.check_columns(cols, table)  # (raises for the first item of another column count)
        for i, out in enumerate(data):
            if not stacking.gather_column(items, i, out):
                if per_item is None:
                    per_item = [item.column_arrays() for item in items]
                    self.check_columns(per_item[0], table)
                try:
                    np.stack([cols[i] for cols in per_item], out=out, casting="no")
                except (ValueError, TypeError):  # some item has another dtype or shape: name it
                    for cols in per_item:
                        self.check_columns(cols, table)
                    raise

    def packed_or_stacked(self, samples: list, packer: Optional[packed_rows.PackedRows],
                          pool: Optional[buffer_pool.BufferPool], table: str):
        """A batch as `packer` packs it, else flat (`stack_flat`)."""
        packed = None if packer is None else packer.pack(samples)
        return self.stack_flat(samples, pool, table) if packed is None else packed

    def single_flat(self, sampled, table: str) -> list:
        """A flat batch of one `SampledItem` of `table`, of any shapes the dataset admits (variable ones too)."""
        self.check_item(sampled.item, table)
        cols = sampled.item.column_arrays()
        self.check_columns(cols, table)
        return [*info_arrays([sampled]), *(c[np.newaxis] for c in cols)]

    def empty_flat(self) -> list:
        """A flat batch of zero samples (unknown dimensions set to 0)."""
        data = [np.empty((0, *(0 if d is None else d for d in s.as_list())) if s.rank is not None else (0,),
                         signature_checks.numpy_dtype(dtype)) for dtype, s in zip(self.dtypes, self.shapes)]
        return [*info_arrays([]), *data]


def _runs(samples: list) -> list:
    """`samples` as runs to stack: each `StackedSamples` alone, consecutive `SampledItem`s as one list."""
    runs: list = []
    start = 0
    for i, sample in enumerate(samples):
        if type(sample) is StackedSamples:
            if i > start:
                runs.append(samples[start:i])
            runs.append(sample)
            start = i + 1
    if start < len(samples):
        runs.append(samples if start == 0 else samples[start:])
    return runs
