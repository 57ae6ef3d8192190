"""Items stacked per column: the one gather that `TrajectoryDataset` (client side) and the server's stacked
sample streams (the rl-data-tf extension of `SampleStream`, see `StackedSamples`) both run, and the
`StackedSamples` a stacked response carries.

A stacked stream moves the per-sample work to the server, where it runs beside the client instead of in
the client's single Python thread: the server gathers a response's samples into one array per column (the
same `gather_column` as the client's batches), the client takes each response as a few arrays.
"""
from __future__ import annotations

import collections
import math
import operator
import threading
from typing import Callable, NamedTuple, Optional

import numpy as np

from replay_tf import errors
from replay_tf.core import chunk_store
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import tensor_codec

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
    columns = [item._columns[i] for item in items]  # (squeeze, chunk, index, start, stop[, chunk, ...])
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
    for col in item._columns:
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
    if any(len(item._columns) != len(layouts) for item in items):
        return None
    stacked = []
    for i, (dtype, shape) in enumerate(layouts):
        out = np.empty((len(items), *shape), dtype)
        if not gather_column(items, i, out, tensors_of, pending_of):
            return None
        stacked.append(out)
    return stacked


class StackedSamples(NamedTuple):
    """Samples stacked per column (what a `StackedSamples` response carries): sample `k` is row `k` of every
    field. `columns` holds one array per column of the flat trajectory."""
    keys: np.ndarray           # uint64
    priorities: np.ndarray     # float64
    times_sampled: np.ndarray  # int32
    probabilities: np.ndarray  # float64
    table_sizes: np.ndarray    # int64
    rate_limited: np.ndarray   # bool
    columns: list

    def __len__(self) -> int:
        return len(self.keys)

    def rows(self, start: int, stop: int) -> "StackedSamples":
        """Samples `start` to `stop` (views)."""
        return StackedSamples(*(field[start:stop] for field in self[:6]), [c[start:stop] for c in self.columns])


# The per-sample fields of `StackedSamples`: name, field number, wire dtype (packed, little-endian; the
# bools one byte each) and the `SampledItem` attribute they come from.
_INFO_FIELDS = (("keys", 1, "<u8", "key"), ("priorities", 2, "<f8", "priority"),
                ("times_sampled", 3, "<i4", "times_sampled"), ("probabilities", 4, "<f8", "probability"),
                ("table_sizes", 5, "<i8", "table_size"), ("rate_limited", 6, "u1", "rate_limited"))
_MAX_RANK = 64  # TensorFlow's limit is 254; a column of more dimensions is not a sample batch


def _info_array(values, wire_dtype: str) -> np.ndarray:
    """An info field's values as the array `StackedSamples` holds (bools as bools)."""
    array = np.asarray(values, wire_dtype)
    return array.view(np.bool_) if wire_dtype == "u1" else array


class StackedLayout:
    """The serialized `SampleStreamResponse` whose `replay_tf_stacked` holds `sampled` (`SampledItem`s) with
    columns of `layouts` (`column_layouts`), before the column contents are known: `size` bytes in all.

    `join` makes the response of already stacked columns (`stack_items`), copying them once; `gather_into`
    stacks the items' columns straight into a buffer (a shared-memory slot), copying them once too."""

    def __init__(self, sampled: list, layouts: list):
        n = len(sampled)
        parts: list = []  # bytes, and in place of each column's content its (dtype, shape, nbytes)
        for _, number, dtype, attribute in _INFO_FIELDS:
            content = np.fromiter(map(operator.attrgetter(attribute), sampled), dtype, n).tobytes()
            parts += [raw_fields.varint(number << 3 | 2), raw_fields.varint(len(content)), content]
        for dtype, shape in layouts:
            shape = (n, *shape)
            nbytes = math.prod(shape) * dtype.itemsize
            head = raw_fields.tensor_head(tensor_codec.dtype_enum(dtype), shape, nbytes)
            parts += [raw_fields.TAG_STACKED_COLUMN, raw_fields.varint(len(head) + nbytes), head, (dtype, shape, nbytes)]
        body = sum(len(p) if type(p) is bytes else p[2] for p in parts)
        self._num_columns = len(layouts)
        self._parts = [raw_fields.TAG_RESPONSE_STACKED, raw_fields.varint(body), *parts]
        self.size = 2 + len(self._parts[1]) + body

    def join(self, columns: list) -> bytes:
        """The response, `columns` (shaped as the layouts say) copied in."""
        contents = iter(columns)
        return b"".join([p if type(p) is bytes else memoryview(next(contents).reshape(-1).view(np.uint8))
                         for p in self._parts])

    def gather_into(self, buffer: memoryview, items: list, tensors_of: TensorsOf, pending_of: PendingOf) -> bool:
        """Writes the response into `buffer[:size]` (writable, at least `size` bytes), gathering column `i` of
        `items[k]` into its row `k` (`gather_column`); False when some item does not fit the layouts (the
        buffer is then partly written)."""
        if any(len(item._columns) != self._num_columns for item in items):  # (as `stack_items` checks)
            return False
        pos = i = 0
        for part in self._parts:
            if type(part) is bytes:
                buffer[pos:pos + len(part)] = part
                pos += len(part)
                continue
            dtype, shape, nbytes = part
            out = np.frombuffer(buffer, dtype, math.prod(shape), pos).reshape(shape)
            if not gather_column(items, i, out, tensors_of, pending_of):
                return False
            pos += nbytes
            i += 1
        return True


def stacked_response(sampled: list, columns: list) -> bytes:
    """A serialized `SampleStreamResponse` whose `replay_tf_stacked` holds `sampled` (`SampledItem`s) with
    their stacked `columns` (`stack_items`); the column contents are copied once, by the final join."""
    return StackedLayout(sampled, [(c.dtype, c.shape[1:]) for c in columns]).join(columns)


def stacked_from_proto(proto) -> StackedSamples:
    """The `StackedSamples` of a `replay_tf_stacked` response field (see `_checked` for the errors)."""
    info = [_info_array(getattr(proto, name), dtype) for name, _, dtype, _ in _INFO_FIELDS]
    columns = [(t.dtype, tuple(d.size for d in t.tensor_shape.dim), t.tensor_content) for t in proto.columns]
    return _checked(info, columns)


def read_stacked_response(raw: bytes) -> Optional[StackedSamples]:
    """The `StackedSamples` of a serialized `SampleStreamResponse` as our servers write it (the stacked field
    alone, packed info fields, columns of dtype, shape and content), read without protobuf: the columns are
    views of `raw` (protobuf would copy each twice). None for any other encoding (entries, fields repeated
    or unpacked, ...): parse those with protobuf. Errors as `stacked_from_proto`'s."""
    if raw[:2] != raw_fields.TAG_RESPONSE_STACKED:
        return None
    try:
        size, pos = raw_fields.read_varint(raw, 2)
        if pos + size != len(raw):
            return None
        view = memoryview(raw)
        info: list = [None] * 6
        columns = []
        while pos < len(raw):
            tag = raw[pos]
            size, pos = raw_fields.read_varint(raw, pos + 1)
            field, end = tag >> 3, pos + size
            if tag & 7 != 2 or end > len(raw) or not 1 <= field <= 7:
                return None
            if field == 7:
                column = _read_tensor(raw, view, pos, end)
                if column is None:
                    return None
                columns.append(column)
            else:
                dtype = _INFO_FIELDS[field - 1][2]
                if info[field - 1] is not None or size % np.dtype(dtype).itemsize:
                    return None
                values = np.frombuffer(view[pos:end], dtype).copy()  # (a view would keep `raw` alive)
                if dtype == "u1" and (values > 1).any():  # (a bool varint other than 0 and 1)
                    return None
                info[field - 1] = _info_array(values, dtype)
            pos = end
    except IndexError:  # a varint running past the end
        return None
    return _checked([_info_array((), field[2]) if values is None else values
                     for field, values in zip(_INFO_FIELDS, info)], columns)


def _read_tensor(raw: bytes, view: memoryview, pos: int, end: int) -> Optional[tuple]:
    """`(dtype enum, shape, content)` of a serialized `TensorProto` of dtype, tensor_shape and tensor_content."""
    dtype, shape, content = 0, None, b""
    while pos < end:
        tag = raw[pos]
        value, pos = raw_fields.read_varint(raw, pos + 1)
        if tag == 0x08:
            if value >= 1 << 31:  # (protobuf truncates it to an int32)
                return None
            dtype = value
        elif tag == 0x12:  # TensorShapeProto: dims (2) of a size (1) each
            if shape is not None:  # (protobuf merges a repeated shape)
                return None
            dims, stop = [], pos + value
            while pos < stop:
                if raw[pos] != 0x12:
                    return None
                dim_size, pos = raw_fields.read_varint(raw, pos + 1)
                dim_end, size = pos + dim_size, 0
                while pos < dim_end:
                    if raw[pos] != 0x08:
                        return None
                    size, pos = raw_fields.read_varint(raw, pos + 1)
                if pos != dim_end:
                    return None
                dims.append(size - (1 << 64) if size >= 1 << 63 else size)  # (int64, as protobuf reads it)
            if pos != stop:
                return None
            shape = tuple(dims)
        elif tag == 0x22:
            content = view[pos:pos + value]
            pos += value
        else:
            return None
    return (dtype, () if shape is None else shape, content) if pos == end else None


def _checked(info: list, columns: list) -> StackedSamples:
    """`StackedSamples` of its info arrays and `(dtype enum, shape, content)` columns, checked.

    Raises:
      errors.ReverbError: an info field whose length is not one entry per key, a column of an unsupported
        dtype or not one row per sample, or a content whose size contradicts its shape.
    """
    n = len(info[0])
    if n == 0:
        raise errors.ReverbError("stacked samples: no keys (a stacked response carries at least one sample)")
    for (name, *_), values in zip(_INFO_FIELDS[1:], info[1:]):
        if len(values) != n:
            raise errors.ReverbError(f"stacked samples: {name} has {len(values)} values, expected {n} (one per key)")
    arrays = []
    for i, (enum, shape, content) in enumerate(columns):
        try:
            dtype = tensor_codec.numpy_dtype(enum)
        except (KeyError, ValueError) as e:
            raise errors.ReverbError(f"stacked samples: column {i} has an unsupported dtype ({e})") from None
        if (dtype.kind not in "biuf" or not shape or shape[0] != n or len(shape) > _MAX_RANK
                or any(size < 0 for size in shape)):
            raise errors.ReverbError(f"stacked samples: column {i} has dtype {dtype.name} and shape {list(shape)}, "
                                     f"expected a numeric tensor of {n} rows (one per sample)")
        expected = math.prod(shape) * dtype.itemsize
        if len(content) != expected:
            raise errors.ReverbError(f"stacked samples: column {i} has {len(content)} bytes of content, expected "
                                     f"{expected} for shape {list(shape)} of {dtype.name}")
        arrays.append(np.frombuffer(content, dtype.newbyteorder("<")).reshape(shape))
    if not arrays:
        raise errors.ReverbError("stacked samples: no columns")
    return StackedSamples(*info, arrays)


def count_samples(batch: list) -> int:
    """The number of samples in a sample stream's batch: `SampledItem`s count one, `StackedSamples` their rows."""
    return sum(len(x) if type(x) is StackedSamples else 1 for x in batch)
