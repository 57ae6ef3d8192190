"""`PackedRows`: batches of small sampled items packed from one cached byte row per item.

`batch_source` hands a batch of small numeric rows to TensorFlow as one uint8 array, each component's row
bytes side by side. Gathering that batch column by column costs a few microseconds of Python per item and
column, which for the few-sample batches of many interleaved datasets (TF-Agents interleaves up to 32, 6
samples per call) costs as much as the call itself. The items of a table in this process are shared and
never change their data, so each one keeps its columns' bytes as one row from its first sample on (the
`row_cache` slot of `chunk_store.Item`): a batch is then one array built from its rows and info values.

Memory: an item's row is kept only while its table holds at most `MAX_CACHED_BYTES` worth of rows (as
the sample's `table_size` says). Every kept row belongs to an item that was in the table when the table
was that small, so the rows of the items still in a table stay near that bound.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from replay_tf.core.table import SampledItem

#: Rows are kept while a table's items would need at most this many bytes for theirs.
MAX_CACHED_BYTES = 64 << 20
_ROW_OVERHEAD = 96  # (bytes per kept row besides its data: the bytes object and the pair it is kept in)

# One object per distinct layout (a few per process), so that an item's row is checked against a layout
# by identity: the 32 datasets TF-Agents interleaves share their items' rows.
_LAYOUTS: dict = {}


class PackedRows:
    """Packs batches of `SampledItem`s whose data columns have exactly `layouts` (numpy dtype, shape), as
    the uint8 array `batch_source` hands over for elements of the 5 `SampleInfo` columns (`info_dtypes`,
    numpy dtypes) followed by the data columns."""

    def __init__(self, info_dtypes: list, layouts: list):
        layouts = tuple((np.dtype(dtype), tuple(shape)) for dtype, shape in layouts)
        self._layouts = _LAYOUTS.setdefault(layouts, layouts)
        data_bytes = sum(dtype.itemsize * int(np.prod(shape, dtype=np.int64)) for dtype, shape in layouts)
        self._dtype = np.dtype([(f"info{i}", np.dtype(d).newbyteorder("=")) for i, d in enumerate(info_dtypes)]
                               + [("data", f"V{data_bytes}")])
        self._max_cached_items = MAX_CACHED_BYTES // (data_bytes + _ROW_OVERHEAD)

    @property
    def row_bytes(self) -> int:
        """Bytes per packed row: the info columns' and the data columns'."""
        return self._dtype.itemsize

    def pack(self, batch: list) -> Optional[np.ndarray]:
        """`batch` as a `[len(batch), row_bytes]` uint8 array, or None when some element is not a
        `SampledItem`, some item's columns do not have exactly this layout, or an item without a kept row
        comes from a table too large to keep it (the caller then stacks the batch column by column, which
        names a column that does not match)."""
        layouts = self._layouts
        records = []
        for sampled in batch:
            if type(sampled) is not SampledItem:
                return None
            item = sampled[0]
            cached = item.row_cache
            if cached is not None and cached[0] is layouts:
                row = cached[1]
            elif sampled[4] > self._max_cached_items:
                return None  # (a row built only for this batch costs more than gathering the columns)
            else:
                row = self._row(item)
                if row is None:
                    return None
                item.row_cache = (layouts, row)
            # SampleInfo's order: key, probability, table_size, priority, times_sampled
            records.append((item.key, sampled[3], sampled[4], sampled[1], sampled[2], row))
        return np.array(records, self._dtype).view(np.uint8).reshape(len(records), self._dtype.itemsize)

    def _row(self, item) -> Optional[bytes]:
        """The item's columns' bytes side by side, or None when they do not have this layout."""
        columns = item.column_arrays()
        if len(columns) != len(self._layouts):
            return None
        for column, (dtype, shape) in zip(columns, self._layouts):
            if column.dtype != dtype or column.shape != shape:
                return None
        return b"".join([column.tobytes() for column in columns])
