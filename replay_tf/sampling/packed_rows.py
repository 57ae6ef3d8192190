"""`PackedRows`: batches of small sampled items packed from one cached byte row per item.

`batch_source` hands a batch of small numeric rows to TensorFlow as one uint8 array, each component's row
bytes side by side. Gathering that batch column by column costs a few microseconds of Python per item and
column, which for the few-sample batches of many interleaved datasets (TF-Agents interleaves up to 32, 6
samples per call) costs as much as the call itself. The items of a table in this process are shared and
never change their data, so each one's columns' bytes are kept as one row from its first sample on, in a
map per layout that forgets an item's row when the item is freed (`_KeptRows`): a batch is then one array
built from its rows and info values.

Memory: an item's row is kept only while its table holds at most `MAX_CACHED_BYTES` worth of rows (as
the sample's `table_size` says). Every kept row belongs to an item that was in the table when the table
was that small, so the rows of the items still in a table stay near that bound.
"""
from __future__ import annotations

import weakref
from typing import Optional

import numpy as np

from replay_tf.core.table import SampledItem

#: Rows are kept while a table's items would need at most this many bytes for theirs.
MAX_CACHED_BYTES = 64 << 20
# (bytes per kept row besides its data: the bytes object, the weak reference to its item, two map entries)
_ROW_OVERHEAD = 256


class _ItemRef(weakref.ref):
    """A weak reference to an item whose row is kept, under `key` (the item's id)."""
    __slots__ = ("key",)


class _KeptRows:
    """The rows kept for the items of one layout: `rows` maps an item's id to its row while the item lives.

    By id: an item's id is its own while it lives, and its entry goes when it is freed (a weak reference's
    callback runs before the memory is), so a look-up is one dict read, with no reference to the item."""

    def __init__(self):
        self.rows: dict = {}
        self._refs: dict = {}  # id -> `_ItemRef` (whose callback forgets the row)
        self._forget_callback = self._forget  # (one bound method for every reference)

    def keep(self, item, row: bytes) -> None:
        key = id(item)
        ref = _ItemRef(item, self._forget_callback)
        ref.key = key
        self._refs[key] = ref
        self.rows[key] = row

    def _forget(self, ref: _ItemRef) -> None:
        # (attributes only: an item freed while the interpreter finalizes may find the module's globals gone)
        if self._refs.get(ref.key) is ref:
            del self._refs[ref.key]
            self.rows.pop(ref.key, None)


# The kept rows of each distinct layout (a few per process): the 32 datasets TF-Agents interleaves share
# their items' rows.
_KEPT: dict = {}


class PackedRows:
    """Packs batches of `SampledItem`s whose data columns have exactly `layouts` (numpy dtype, shape), as
    the uint8 array `batch_source` hands over for elements of the 5 `SampleInfo` columns (`info_dtypes`,
    numpy dtypes) followed by the data columns."""

    def __init__(self, info_dtypes: list, layouts: list):
        layouts = tuple((np.dtype(dtype), tuple(shape)) for dtype, shape in layouts)
        self._layouts = layouts
        self._kept = _KEPT.setdefault(layouts, _KeptRows())
        data_bytes = sum(dtype.itemsize * int(np.prod(shape, dtype=np.int64)) for dtype, shape in layouts)
        self._dtype = np.dtype([(f"info{i}", np.dtype(d).newbyteorder("=")) for i, d in enumerate(info_dtypes)]
                               + [("data", f"V{data_bytes}")])
        self._max_cached_items = MAX_CACHED_BYTES // (data_bytes + _ROW_OVERHEAD)

    @property
    def row_bytes(self) -> int:
        """Bytes per packed row: the info columns' and the data columns'."""
        return self._dtype.itemsize

    def kept_row(self, item) -> Optional[bytes]:
        """The row kept for `item` in this layout, or None."""
        return self._kept.rows.get(id(item))

    def keep_row(self, item, row: bytes) -> None:
        """Keeps `row`, the item's columns packed in this layout, for its later samples."""
        self._kept.keep(item, row)

    def pack(self, batch: list) -> Optional[np.ndarray]:
        """`batch` as a `[len(batch), row_bytes]` uint8 array, or None when some element is not a
        `SampledItem`, some item's columns do not have exactly this layout, or an item without a kept row
        comes from a table too large to keep it (the caller then stacks the batch column by column, which
        names a column that does not match)."""
        kept_row = self._kept.rows.get
        records = []
        for sampled in batch:
            if type(sampled) is not SampledItem:
                return None
            item = sampled[0]
            row = kept_row(id(item))
            if row is None:
                if sampled[4] > self._max_cached_items:
                    return None  # (a row built only for this batch costs more than gathering the columns)
                row = self._row(item)
                if row is None:
                    return None
                self._kept.keep(item, row)
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
