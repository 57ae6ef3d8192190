"""Reverb's chunk tensor encoding: one tensor (steps on dim 0) <-> `tensorflow.TensorProto`.

Chunk tensors are encoded exactly as Reverb's `CompressTensorAsProto` does:
  - non-string tensors: `TensorProto{dtype, tensor_shape, tensor_content}` where `tensor_content` is the
    Snappy *raw block* compression of the little-endian row-major bytes (so it is not a plain TensorProto
    payload: `tf.make_ndarray` cannot read it);
  - `delta_encoded` chunks: integer tensors of rank >= 2 hold `out[0] = in[0]`, `out[i] = in[i] - in[i-1]`
    along dim 0, computed on the unsigned reinterpretation (wrapping); other tensors are unchanged;
  - strings: uncompressed, as TF's `AsProtoTensorContent` writes them: `tensor_content` holds the varint
    length of every string, then their bytes (older writers' `string_val` is read too).

Headers of numeric tensors (dtype, shape) are cached once checked, so that later tensors of the same
header are sized and decoded without re-reading it (`PendingTensor`: decoded when and where needed).

>>> import numpy as np
>>> rows = np.arange(12, dtype=np.int32).reshape(3, 4)
>>> proto = encode_tensor(rows, delta_encoded=True)
>>> bool((decode_tensor(proto, delta_encoded=True) == rows).all())
True
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple, Optional

import cramjam
import numpy as np

from replay_tf.wire import limits
from replay_tf.wire import raw_fields

__all__ = [
    "ChunkDecodeError",
    "ChunkTooLargeError",
    "PendingTensor",
    "check_string_tensor_bytes",
    "check_tensor_bytes",
    "decode_string_list",
    "decode_tensor",
    "delta_applies",
    "dtype_enum",
    "encode_tensor",
    "known_header",
    "numpy_dtype",
    "pending_fields",
    "pending_tensor",
    "string_lengths",
    "tensor_header",
    "uncompressed_size",
]

_DT_STRING = 7
_DT_VARIANT = 21
_DT_RESOURCE = 20
_DT_REF_OFFSET = 100

# Integer dtypes Reverb delta-encodes (TF_CALL_INTEGRAL_TYPES), by numpy kind and itemsize.
_UNSIGNED_VIEW = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class ChunkDecodeError(ValueError):
    """A chunk tensor cannot be decoded (bad compression, size or dtype)."""


class ChunkTooLargeError(ChunkDecodeError):
    """A chunk tensor would decompress to more than `limits.MAX_CHUNK_TENSOR_BYTES` (nothing was allocated)."""


def check_tensor_bytes(nbytes: int, dtype: np.dtype, shape: tuple, what: str) -> None:
    """ChunkTooLargeError if a tensor of `nbytes` (its `dtype` and `shape`) is over the limit; `what` names it."""
    limit = limits.MAX_CHUNK_TENSOR_BYTES
    if nbytes > limit:
        raise ChunkTooLargeError(
            f"{what} of dtype {dtype.name} and shape {list(shape)} decompresses to {nbytes} bytes, over "
            f"replay_tf.wire.limits.MAX_CHUNK_TENSOR_BYTES ({limit}): write its steps in more, shorter chunks "
            f"(a smaller max_chunk_length), or raise the limit in the server's and the clients' processes")


# --- dtypes ---

@functools.lru_cache(maxsize=None)
def _enum_for_dtype(dtype: np.dtype) -> int:
    import tensorflow as tf  # noqa: PLC0415  (tensor_pb2, which the protos import, already loads TF)
    if dtype.kind in ("O", "S", "U"):
        return _DT_STRING
    return tf.dtypes.as_dtype(dtype).as_datatype_enum


@functools.lru_cache(maxsize=None)
def _dtype_for_enum(enum: int) -> np.dtype:
    import tensorflow as tf  # noqa: PLC0415
    if enum == _DT_STRING:
        return np.dtype(object)
    if enum in (_DT_VARIANT, _DT_RESOURCE):
        raise ChunkDecodeError(f"chunk tensors of dtype {tf.dtypes.as_dtype(enum).name} are not supported")
    if enum > _DT_REF_OFFSET:  # reference dtypes (float_ref, ...) never hold data on the wire
        raise ChunkDecodeError(f"unknown tensor dtype enum {enum}: reference dtypes are not tensor data")
    try:
        return np.dtype(tf.dtypes.as_dtype(enum).as_numpy_dtype)
    except (TypeError, KeyError) as e:  # KeyError: enums TF knows but has no numpy type for
        raise ChunkDecodeError(f"unknown tensor dtype enum {enum}") from e


def dtype_enum(dtype) -> int:
    """The `tensorflow.DataType` enum of a numpy dtype (object/bytes/str arrays are `DT_STRING`)."""
    return _enum_for_dtype(np.dtype(dtype))


def numpy_dtype(enum: int) -> np.dtype:
    """The numpy dtype of a `tensorflow.DataType` enum (`object` for strings); ChunkDecodeError if none."""
    return _dtype_for_enum(int(enum))


# --- tensors ---

def delta_applies(array: np.ndarray) -> bool:
    return array.ndim >= 2 and array.dtype.kind in ("i", "u")


def encode_tensor(array: np.ndarray, *, delta_encoded: bool = False) -> "_TensorProto":
    """A chunk tensor (steps on dim 0) as Reverb encodes it.

    Args:
      array: numpy array; object/bytes/str arrays are encoded as strings.
      delta_encoded: Delta-encode integer tensors of rank >= 2 (other tensors are unaffected).

    Returns:
      A `tensorflow.TensorProto` whose `tensor_content` is Snappy-compressed (strings: `string_val`).
    """
    array = np.asarray(array)
    proto = _TensorProto(dtype=dtype_enum(array.dtype))
    dims = proto.tensor_shape.dim
    for size in array.shape:
        dims.add().size = size
    if proto.dtype == _DT_STRING:
        proto.tensor_content = _encode_string_list(array)
        return proto
    if delta_encoded and delta_applies(array):
        unsigned = array.view(_UNSIGNED_VIEW[array.dtype.itemsize])
        diff = unsigned.copy()
        # Row i becomes in[i] - in[i-1]; unsigned arithmetic wraps, as Reverb's does.
        np.subtract(unsigned[1:], unsigned[:-1], out=diff[1:])
        array = diff
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    proto.tensor_content = bytes(cramjam.snappy.compress_raw(np.ascontiguousarray(array)))
    return proto


# Parsed headers of non-string chunk tensors: (dtype enum, serialized TensorShapeProto) ->
# (dtype, shape, byte size, delta-decodable). Serializing the shape costs a fraction of reading its dims.
_HEADERS: dict = {}
_MAX_HEADERS = 4096


def decode_tensor(proto, *, delta_encoded: bool = False) -> np.ndarray:
    """The numpy array of a chunk tensor encoded by Reverb (or `encode_tensor`).

    Raises:
      ChunkDecodeError: unsupported dtype, invalid Snappy data, or a size that contradicts the shape.
    """
    header = _HEADERS.get((proto.dtype, proto.tensor_shape.SerializeToString()))
    if header is None or header[2] > limits.MAX_CHUNK_TENSOR_BYTES:
        return _decode_tensor(proto, delta_encoded)
    dtype, shape, expected, delta = header
    out = np.empty(shape, dtype=dtype)
    _decode_into(proto.tensor_content, out, expected, delta_encoded and delta)
    return out


class PendingTensor(NamedTuple):
    """A numeric chunk tensor kept as received, decoded when (and where) it is needed.

    `dtype` and `shape` are the decoded array's; `delta` says whether prefix sums undo a delta encoding.
    """
    dtype: np.dtype
    shape: tuple
    nbytes: int
    delta: bool
    content: bytes

    def decode(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=self.dtype)
        _decode_into(self.content, out, self.nbytes, self.delta)
        return out

    def decode_into(self, out: np.ndarray) -> None:
        """Decodes into `out`, a C-contiguous array of exactly this dtype and shape (the caller checks)."""
        _decode_into(self.content, out, self.nbytes, self.delta)


def pending_tensor(proto, *, delta_encoded: bool = False) -> Optional[PendingTensor]:
    """`proto` as a `PendingTensor` when its header was seen before (else None: use `decode_tensor`, which
    checks and remembers headers). Only the content is copied; nothing is decompressed."""
    fields = pending_fields(proto.dtype, proto.tensor_shape.SerializeToString(), delta_encoded)
    return None if fields is None else PendingTensor(*fields, proto.tensor_content)


def known_header(dtype: int, shape: bytes) -> Optional[tuple]:
    """The cached `(dtype, shape, byte size, delta-decodable)` of a numeric chunk tensor whose header (dtype enum,
    serialized `tensor_shape`) was seen before, else None."""
    return _HEADERS.get((dtype, shape))


def pending_fields(dtype: int, shape: bytes, delta_encoded: bool) -> Optional[tuple]:
    """`(dtype, shape, nbytes, delta)` of a `PendingTensor` whose header (dtype enum, serialized
    `tensor_shape`) was seen before, else None; the delta encoding applies where the header allows it."""
    header = _HEADERS.get((dtype, shape))
    if header is None or header[2] > limits.MAX_CHUNK_TENSOR_BYTES:
        return None
    return header[0], header[1], header[2], delta_encoded and header[3]


def _decode_into(content: bytes, out: np.ndarray, expected: int, delta: bool) -> None:
    try:
        # cramjam takes any contiguous buffer; one too small for the content raises.
        size = _decompress_raw_into(content, out)
    except Exception as e:  # cramjam raises its own DecompressionError type
        size = _decompressed_size(content, expected, e)
    if size != expected:
        raise ChunkDecodeError(f"chunk tensor of dtype {out.dtype.name} and shape {list(out.shape)} needs "
                               f"{expected} bytes, its content decompresses to {size}")
    if delta:
        unsigned = out.view(_UNSIGNED_VIEW[out.dtype.itemsize])
        # Prefix sums undo the consecutive differences (wrapping, as they were computed).
        np.cumsum(unsigned, axis=0, dtype=unsigned.dtype, out=unsigned)


_decompress_raw_into = cramjam.snappy.decompress_raw_into


def _decompressed_size(content, expected: int, error: Exception) -> int:
    """The size that Snappy `content` announces, once decompressing it into a buffer of `expected` bytes
    raised `error`: ChunkDecodeError when the content is not valid Snappy raw data."""
    try:
        size = cramjam.snappy.decompress_raw_len(content)
    except Exception as e:  # noqa: BLE001  (cramjam raises its own DecompressionError type)
        error = e
    else:
        if size != expected:
            return size  # the caller names both sizes
    raise ChunkDecodeError(f"chunk tensor content is not valid Snappy raw data: {error}") from error


def _decode_tensor(proto, delta_encoded: bool) -> np.ndarray:
    """`decode_tensor` reading the header field by field (and caching it when it is valid and non-empty)."""
    dtype = numpy_dtype(proto.dtype)
    shape = tuple([d.size for d in proto.tensor_shape.dim])
    count = math.prod(shape)
    if count < 0 or any(size < 0 for size in shape):
        raise ChunkDecodeError(f"chunk tensor has a negative dimension: shape {list(shape)}")
    if dtype.kind == "O":
        content = proto.tensor_content
        check_string_tensor_bytes(count, len(content), shape, "chunk tensor")
        values = decode_string_list(content, count) if content else proto.string_val
        if len(values) != count:
            raise ChunkDecodeError(f"string chunk tensor of shape {list(shape)} has {len(values)} values, "
                                   f"expected {count}")
        out = np.empty(count, dtype=object)
        out[:] = list(values)
        return out.reshape(shape)
    header = _numeric_header(dtype, shape)
    _, _, expected, delta = header
    _remember_header((proto.dtype, proto.tensor_shape.SerializeToString()), header)
    # Checked before anything is allocated: the Snappy header declares the size, the shape must agree.
    try:
        declared = cramjam.snappy.decompress_raw_len(proto.tensor_content)
    except Exception:  # noqa: BLE001  (cramjam's own DecompressionError: _decode_into names it)
        declared = expected
    if declared != expected:
        raise ChunkDecodeError(f"chunk tensor of dtype {dtype.name} and shape {list(shape)} needs {expected} "
                               f"bytes, its content decompresses to {declared}")
    check_tensor_bytes(expected, dtype, shape, "chunk tensor")
    out = np.empty(shape, dtype=dtype)
    _decode_into(proto.tensor_content, out, expected, delta_encoded and delta)
    return out


def _as_bytes(value) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, np.ndarray):  # a 0-d array stored as an element of an object array
        return _as_bytes(value.item())
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"string tensors hold bytes or str, got {type(value).__name__}: {value!r}")


def _encode_string_list(array: np.ndarray) -> bytes:
    # TF's EncodeStringList: every length as a varint, then every string's bytes.
    values = [_as_bytes(v) for v in array.reshape(-1)]
    return b"".join([raw_fields.varint(len(v)) for v in values] + values)


def check_string_tensor_bytes(count: int, data_bytes: int, shape: tuple, what: str) -> None:
    """ChunkTooLargeError if a string tensor of `count` elements (its `shape`) holding at most `data_bytes` of
    strings would decode to more than the limit: each element counted as `limits.STRING_ELEMENT_BYTES` plus
    the strings' bytes; checked before any string is decoded."""
    nbytes = count * limits.STRING_ELEMENT_BYTES + data_bytes
    limit = limits.MAX_CHUNK_TENSOR_BYTES
    if nbytes > limit:
        raise ChunkTooLargeError(
            f"{what} of dtype string and shape {list(shape)} decodes to about {nbytes} bytes ({count} strings, "
            f"each counted as replay_tf.wire.limits.STRING_ELEMENT_BYTES ({limits.STRING_ELEMENT_BYTES}) plus "
            f"its bytes), over replay_tf.wire.limits.MAX_CHUNK_TENSOR_BYTES ({limit}): write its steps in "
            f"more, shorter chunks, or raise the limit in the server's and the clients' processes")


def string_lengths(proto, count: int) -> np.ndarray:
    """The byte length of each of the `count` strings of a string chunk tensor, as int64, read without making a
    Python object per string; ChunkDecodeError unless the lengths and the strings fill `tensor_content`
    exactly (TF's EncodeStringList: every length as a varint, then the strings' bytes)."""
    content = proto.tensor_content
    if not content:
        values = proto.string_val
        if len(values) != count:
            raise ChunkDecodeError(f"string chunk tensor has {len(values)} values, expected {count}")
        return np.fromiter(map(len, values), np.int64, count)
    a = np.frombuffer(content, np.uint8)
    if count == 0:
        raise ChunkDecodeError(f"string chunk tensor of no strings has {len(a)} bytes of content")
    # A length takes at most 5 varint bytes (a string under 32 GiB): the lengths lie in this head. Every varint
    # ends at a byte below 0x80; the `count`-th such byte ends the lengths.
    head = a[:5 * count]
    ends_seen = np.cumsum(head < 0x80, dtype=np.int32)
    if not len(ends_seen) or ends_seen[-1] < count:
        raise ChunkDecodeError(f"string chunk tensor content ends inside the lengths of its {count} strings")
    lengths_end = int(np.searchsorted(ends_seen, count)) + 1
    del ends_seen
    region = head[:lengths_end]
    last = region < 0x80
    if last.all():  # every length is one byte (strings under 128 bytes): the common case
        lengths = region.astype(np.int64)
    else:
        starts = np.flatnonzero(np.concatenate(([True], last[:-1])))  # where each varint starts
        varint = np.repeat(np.arange(count), np.diff(np.append(starts, lengths_end)))
        shift = 7 * (np.arange(lengths_end) - starts[varint])  # the bit position of each byte's 7 bits
        if shift.max() > 28:
            raise ChunkDecodeError(f"string chunk tensor has a length of more than 5 varint bytes")
        lengths = np.add.reduceat((region & 0x7F).astype(np.int64) << shift, starts)
    data = len(a) - lengths_end
    if int(lengths.sum()) != data:
        raise ChunkDecodeError(f"string chunk tensor content has {data} bytes of data, its {count} lengths add "
                               f"up to {int(lengths.sum())}")
    return lengths


def decode_string_list(content: bytes, count: int) -> list:
    lengths, pos = [], 0
    try:
        for _ in range(count):
            length = shift = 0
            while True:
                byte = content[pos]
                pos += 1
                length |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80:
                    break
            lengths.append(length)
    except IndexError as e:
        raise ChunkDecodeError(f"string chunk tensor content ends inside the lengths of its {count} "
                               f"strings") from e
    if pos + sum(lengths) != len(content):
        raise ChunkDecodeError(f"string chunk tensor content has {len(content) - pos} bytes of data, its "
                               f"{count} lengths add up to {sum(lengths)}")
    values = []
    for length in lengths:
        values.append(content[pos:pos + length])
        pos += length
    return values


def _numeric_header(dtype: np.dtype, shape: tuple) -> tuple:
    """`(dtype, shape, byte size, delta-decodable)` of a numeric chunk tensor: what `_HEADERS` holds."""
    return dtype, shape, math.prod(shape) * dtype.itemsize, len(shape) >= 2 and dtype.kind in "iu"


def _remember_header(key: tuple, header: tuple) -> None:
    """Caches `header` (from `_numeric_header`) if its tensor has some bytes and no negative dimension."""
    if header[2] and len(_HEADERS) < _MAX_HEADERS and not any(size < 0 for size in header[1]):
        _HEADERS[key] = header


def tensor_header(proto) -> tuple[np.dtype, tuple]:
    """`(numpy dtype, shape)` of an encoded chunk tensor, without decoding its content (a header seen before
    is read from the cache that decoding uses: a server checks every chunk it receives)."""
    key = (proto.dtype, proto.tensor_shape.SerializeToString())
    header = _HEADERS.get(key)
    if header is not None:
        return header[0], header[1]
    dtype, shape = numpy_dtype(proto.dtype), tuple([d.size for d in proto.tensor_shape.dim])
    if dtype.kind != "O":
        _remember_header(key, _numeric_header(dtype, shape))
    return dtype, shape


def uncompressed_size(array: np.ndarray) -> int:
    """The bytes of a chunk tensor before compression (strings: their bytes, without lengths)."""
    if array.dtype == object:
        return sum(len(_as_bytes(v)) for v in array.reshape(-1))
    return array.nbytes


def _tensor_proto_class():
    from tensorflow.core.framework import tensor_pb2  # noqa: PLC0415
    return tensor_pb2.TensorProto


_TensorProto = _tensor_proto_class()
