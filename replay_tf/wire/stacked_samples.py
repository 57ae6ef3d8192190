"""The stacked-samples format: rl-data-tf's extension of `SampleStreamResponse` (`replay_tf_stacked`), which
carries a response's samples stacked per column, and its encoder and decoders.

The server writes the per-sample info fields packed and each column as one tensor of one row per sample
(`StackedLayout`); the client reads such a response without protobuf (`read_stacked_response`), the
columns as views of the received bytes, or, for any other encoding, from the parsed message
(`stacked_from_proto`). Both give `StackedSamples`.
"""
from __future__ import annotations

import math
import operator
from typing import Callable, NamedTuple, Optional

import numpy as np

from replay_tf import errors
from replay_tf.wire import raw_fields
from replay_tf.wire import tensor_codec


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
_COLUMNS_FIELD = raw_fields.TAG_STACKED_COLUMN[0] >> 3  # (after the info fields' numbers)
_MAX_RANK = 64  # TensorFlow's limit is 254; a column of more dimensions is not a sample batch


def _info_array(values, wire_dtype: str) -> np.ndarray:
    """An info field's values as the array `StackedSamples` holds (bools as bools)."""
    array = np.asarray(values, wire_dtype)
    return array.view(np.bool_) if wire_dtype == "u1" else array


class StackedLayout:
    """The serialized `SampleStreamResponse` whose `replay_tf_stacked` holds `sampled` (`SampledItem`s) with
    columns of `layouts` (`(numpy dtype, shape)` per column, one sample's), before the column contents are
    known: `size` bytes in all.

    `join` makes the response of already stacked columns, copying them once; `write_into` writes it into a
    buffer (a shared-memory slot), the columns filled in place by the caller's gather."""

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
            parts += [raw_fields.TAG_STACKED_COLUMN, raw_fields.varint(len(head) + nbytes), head,
                      (dtype, shape, nbytes)]
        body = sum(len(p) if type(p) is bytes else p[2] for p in parts)
        self.num_columns = len(layouts)
        self._parts = [raw_fields.TAG_RESPONSE_STACKED, raw_fields.varint(body), *parts]
        self.size = 2 + len(self._parts[1]) + body

    def join(self, columns: list) -> bytes:
        """The response, `columns` (shaped as the layouts say) copied in."""
        contents = iter(columns)
        return b"".join([p if type(p) is bytes else memoryview(next(contents).reshape(-1).view(np.uint8))
                         for p in self._parts])

    def write_into(self, buffer: memoryview, fill_column: Callable[[int, np.ndarray], bool]) -> bool:
        """Writes the response into `buffer[:size]` (writable, at least `size` bytes); `fill_column(i, out)`
        writes column `i` into `out` (an array over its bytes in `buffer`) and says whether it could. False
        when some column could not be filled (the buffer is then partly written)."""
        pos = i = 0
        for part in self._parts:
            if type(part) is bytes:
                buffer[pos:pos + len(part)] = part
                pos += len(part)
                continue
            dtype, shape, nbytes = part
            if not fill_column(i, np.frombuffer(buffer, dtype, math.prod(shape), pos).reshape(shape)):
                return False
            pos += nbytes
            i += 1
        return True


def stacked_response(sampled: list, columns: list) -> bytes:
    """A serialized `SampleStreamResponse` whose `replay_tf_stacked` holds `sampled` (`SampledItem`s) with
    their stacked `columns` (one array of one row per sample each); the column contents are copied once, by
    the final join."""
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
            if tag & 7 != 2 or end > len(raw) or not 1 <= field <= _COLUMNS_FIELD:
                return None
            if field == _COLUMNS_FIELD:
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
        if tag == raw_fields.TENSOR_DTYPE_TAG:
            if value >= 1 << 31:  # (protobuf truncates it to an int32)
                return None
            dtype = value
        elif tag == raw_fields.TENSOR_SHAPE_TAG:  # TensorShapeProto: dims of a size each
            if shape is not None:  # (protobuf merges a repeated shape)
                return None
            dims, stop = [], pos + value
            while pos < stop:
                if raw[pos] != raw_fields.SHAPE_DIM_TAG:
                    return None
                dim_size, pos = raw_fields.read_varint(raw, pos + 1)
                dim_end, size = pos + dim_size, 0
                while pos < dim_end:
                    if raw[pos] != raw_fields.DIM_SIZE_TAG:
                        return None
                    size, pos = raw_fields.read_varint(raw, pos + 1)
                if pos != dim_end:
                    return None
                dims.append(size - (1 << 64) if size >= 1 << 63 else size)  # (int64, as protobuf reads it)
            if pos != stop:
                return None
            shape = tuple(dims)
        elif tag == raw_fields.TENSOR_CONTENT_TAG:
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
