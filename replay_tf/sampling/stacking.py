"""Items gathered per column: the one gather that `TrajectoryDataset`'s batches (client side) and the server's
stacked sample streams (`grpc/server/sample_stream.py`, in the format of `wire.stacked_samples`) both run,
and the decoded-chunk cache of the latter.

A stacked stream moves the per-sample work to the server, where it runs beside the client instead of in
the client's single Python thread: the server gathers a response's samples into one array per column (the
same `gather_column` as the client's batches), the client takes each response as a few arrays.
"""
from __future__ import annotations

import collections
import operator
import threading
from typing import Callable, Optional

import numpy as np

from replay_tf.core import chunk_store
from replay_tf.wire import chunk_codec
from replay_tf.wire import stacked_samples

_get_squeeze = operator.itemgetter(0)
_get_start = operator.itemgetter(3)
_get_stop = operator.itemgetter(4)
_tensors = operator.attrgetter("tensors")

TensorsOf = Callable[[chunk_store.Chunk], list]  # a chunk's decoded tensors
PendingOf = Callable[[chunk_store.Chunk], Optional[list]]  # its `tensor_codec.PendingTensor`s, if it is read so


def gather_column(items: list, i: int, out: np.ndarray, tensors_of: TensorsOf = _tensors,
                  pending_of: PendingOf = chunk_codec.pending_tensors) -> bool:
    """Fills `out[k]` with column `i` of `items[k]`: one view per chunk slice, copied by one concatenate.

    Chunks for which `pending_of` gives `PendingTensor`s (by default one-row chunks of a remote sample
    stream, kept encoded) are decoded straight into their rows; every other chunk is read through
    `tensors_of` (by default `Chunk.tensors`).

    Returns False (leaving `out` partly written) when some item's column does not have exactly `out`'s
    dtype and shape; the caller then stacks item by item, with precise errors.
    """
    n = len(items)
    columns = [item.resolved_columns[i] for item in items]  # (squeeze, chunk, index, start, stop[, chunk, ...])
    squeeze = columns[0][0]
    if any(map(squeeze.__ne__, map(_get_squeeze, columns))):
        return False
    if squeeze:  # one row of one chunk each (Item guarantees it): out's rows are the rows of the chunks
        rows, target = 1, out
    else:
        if out.ndim < 2:
            return False
        rows, target = out.shape[1], out.reshape(n * out.shape[1], *out.shape[2:])
    if all(map((5).__eq__, map(len, columns))):  # every column is one slice
        if any(pending_of(col[1]) is not None for col in columns):
            return _decode_column(columns, rows, target, tensors_of, pending_of)
        if not squeeze:
            lengths = np.fromiter(map(_get_stop, columns), np.int64, n) - np.fromiter(map(_get_start, columns),
                                                                                      np.int64, n)
            if (lengths != rows).any():
                return False
        views = [tensors_of(col[1])[col[2]][col[3]:col[4]] for col in columns]
    else:
        views = []
        append = views.append
        for col in columns:
            total = 0
            for j in range(1, len(col), 4):
                chunk = col[j]
                if pending_of(chunk) is not None:  # (nothing written yet: decode the column instead)
                    return _decode_column(columns, rows, target, tensors_of, pending_of)
                part = tensors_of(chunk)[col[j + 1]][col[j + 2]:col[j + 3]]
                total += len(part)
                append(part)
            if total != rows:
                return False
    try:
        # casting="no": a column of another dtype is an error, not a conversion
        np.concatenate(views, axis=0, out=target, casting="no")
    except (ValueError, TypeError):
        return False
    return True


def _decode_column(columns: list, rows: int, target: np.ndarray, tensors_of: TensorsOf,
                   pending_of: PendingOf) -> bool:
    """`gather_column` for columns with chunks still encoded (one-row chunks of a remote sample stream):
    each such chunk is decoded straight into its row of `target`, the rest copied from their tensors."""
    pos = 0
    for col in columns:
        stop_row = pos + rows
        for j in range(1, len(col), 4):
            chunk, index, start, stop = col[j], col[j + 1], col[j + 2], col[j + 3]
            end = pos + stop - start
            if end > stop_row:
                return False
            encoded = pending_of(chunk)
            if encoded is not None:
                tensor = encoded[index]
                part = target[pos:end]
                if start != 0 or tensor.shape != part.shape or tensor.dtype != part.dtype:
                    return False
                tensor.decode_into(part)
            else:
                view = tensors_of(chunk)[index][start:stop]
                if view.shape[1:] != target.shape[1:] or view.dtype != target.dtype:
                    return False
                target[pos:end] = view
            pos = end
        if pos != stop_row:
            return False
    return True


class DecodedChunks:
    """The decoded tensors of a server's chunks of more than one row (held as received, their slices
    overlap: items share them), least recently used first, bounded in bytes; shared by a server's streams.

    One-row chunks (big steps, e.g. Atari frames) are not kept: each is read by one slice per item, and
    keeping them would evict the chunks that are read again."""

    def __init__(self, max_bytes: int):
        self._max_bytes = max_bytes
        self._entries: collections.OrderedDict = collections.OrderedDict()  # chunk -> (tensors, nbytes)
        self._nbytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def readers(self) -> tuple:
        """`(tensors_of, pending_of)` for one gather: decodes each chunk it meets at most once, keeps the
        multi-row ones here and nothing on the chunks (a server holding every chunk decoded beside its
        encoded form would double its memory, or worse for compressible data); one-row chunks held as
        serialized `ChunkData` are read as views of those bytes, decoded straight into their rows."""
        seen: dict = {}
        entries, lock = self._entries, self._lock

        def pending_of(chunk: chunk_store.Chunk) -> Optional[list]:
            if chunk.sequence_range.end != chunk.sequence_range.start:
                return None
            return chunk_codec.stored_tensors(chunk)

        def tensors_of(chunk: chunk_store.Chunk) -> list:
            tensors = seen.get(chunk)
            if tensors is not None:
                return tensors
            if chunk.is_decoded:
                tensors = chunk.tensors
            elif chunk.sequence_range.end == chunk.sequence_range.start:  # one row: read, not kept
                return chunk.read_tensors()  # (nor held for the gather: only one slice reads it)
            else:
                with lock:
                    entry = entries.get(chunk)
                    if entry is not None:
                        entries.move_to_end(chunk)
                if entry is None:
                    tensors = chunk.read_tensors()
                    self._keep(chunk, tensors)
                else:
                    tensors = entry[0]
            seen[chunk] = tensors
            return tensors

        return tensors_of, pending_of

    def _keep(self, chunk: chunk_store.Chunk, tensors: list) -> None:
        # (the chunk's stored bytes count too: an entry keeps the chunk alive after its items are gone)
        encoded = chunk.encoded
        nbytes = _ENTRY_BYTES + sum(t.nbytes for t in tensors) + (len(encoded) if type(encoded) is bytes else 0)
        with self._lock:
            old = self._entries.pop(chunk, None)
            if old is not None:
                self._nbytes -= old[1]
            self._entries[chunk] = (tensors, nbytes)
            self._nbytes += nbytes
            while self._nbytes > self._max_bytes and self._entries:
                self._nbytes -= self._entries.popitem(last=False)[1][1]


_ENTRY_BYTES = 512  # a kept chunk's Python objects, counted with its arrays' bytes


def column_layouts(item: chunk_store.Item, tensors_of: TensorsOf, pending_of: PendingOf) -> Optional[list]:
    """`[(dtype, shape), ...]` of an item's columns, or None if some column is not numeric (then its
    samples are not stacked)."""
    layouts = []
    for col in item.resolved_columns:
        pending = pending_of(col[1])
        tensor = pending[col[2]] if pending is not None else tensors_of(col[1])[col[2]]
        if tensor.dtype.kind not in "biuf" or tensor.dtype.byteorder == ">":
            return None
        if col[0]:
            shape = tuple(tensor.shape[1:])
        else:
            shape = (sum(col[j + 3] - col[j + 2] for j in range(1, len(col), 4)), *tensor.shape[1:])
        layouts.append((tensor.dtype, shape))
    return layouts


def stack_items(items: list, layouts: list, tensors_of: TensorsOf, pending_of: PendingOf) -> Optional[list]:
    """The columns of `items` stacked as `layouts` (`column_layouts` of one of them): one C-contiguous array
    per column, shaped `[len(items), *column shape]`; None when some item does not fit (columns of other
    counts, dtypes or shapes), and the items are sent one by one."""
    if any(len(item.resolved_columns) != len(layouts) for item in items):
        return None
    stacked = []
    for i, (dtype, shape) in enumerate(layouts):
        out = np.empty((len(items), *shape), dtype)
        if not gather_column(items, i, out, tensors_of, pending_of):
            return None
        stacked.append(out)
    return stacked


def gather_into(layout: stacked_samples.StackedLayout, buffer: memoryview, items: list, tensors_of: TensorsOf,
                pending_of: PendingOf) -> bool:
    """Writes `layout`'s response into `buffer` (see `StackedLayout.write_into`), gathering column `i` of
    `items[k]` into its row `k` (`gather_column`); False when some item does not fit the layout (the
    buffer is then partly written)."""
    if any(len(item.resolved_columns) != layout.num_columns for item in items):  # (as `stack_items` checks)
        return False
    return layout.write_into(buffer, lambda i, out: gather_column(items, i, out, tensors_of, pending_of))
