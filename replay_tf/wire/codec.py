"""Reverb's chunk tensor encoding, and conversions between the core's data model and the protos.

Chunk tensors are encoded exactly as Reverb's `CompressTensorAsProto` does:
  - non-string tensors: `TensorProto{dtype, tensor_shape, tensor_content}` where `tensor_content` is the
    Snappy *raw block* compression of the little-endian row-major bytes (so it is not a plain TensorProto
    payload: `tf.make_ndarray` cannot read it);
  - `delta_encoded` chunks: integer tensors of rank >= 2 hold `out[0] = in[0]`, `out[i] = in[i] - in[i-1]`
    along dim 0, computed on the unsigned reinterpretation (wrapping); other tensors are unchanged;
  - strings: uncompressed, as TF's `AsProtoTensorContent` writes them: `tensor_content` holds the varint
    length of every string, then their bytes (older writers' `string_val` is read too).

>>> import numpy as np
>>> rows = np.arange(12, dtype=np.int32).reshape(3, 4)
>>> proto = encode_tensor(rows, delta_encoded=True)
>>> bool((decode_tensor(proto, delta_encoded=True) == rows).all())
True

The conversions (`item_to_proto`, `trajectory_from_proto`, `table_info_to_proto`, ...) map the core's
plain Python objects (`replay_tf.core`) to the `deepmind.reverb` messages and back; signatures travel as
`tensorflow.StructuredValue`, written by `rlds_tf.structure_coder` (public APIs only) byte for byte as
TF's private `nested_structure_coder` writes them for Reverb.
"""
from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, NamedTuple, Optional, Sequence

import cramjam
import numpy as np

from replay_tf.core import chunk_store
from replay_tf.core import rate_limiters as rate_limiters_lib
from replay_tf.core import selectors as selectors_lib
from replay_tf.core import table as table_lib
from replay_tf.wire import limits
from replay_tf.wire import schema_pb2
from replay_tf.wire import _raw
from rlds_tf import structure_coder

__all__ = [
    "ChunkDecodeError",
    "ChunkTooLargeError",
    "PendingTensor",
    "chunk_from_proto",
    "chunk_to_proto",
    "decode_chunk_tensors",
    "decode_signature",
    "decode_tensor",
    "pending_tensor",
    "pending_tensors",
    "dtype_enum",
    "encode_signature",
    "encode_tensor",
    "item_to_proto",
    "key_distribution_options_from_proto",
    "key_distribution_options_to_proto",
    "numpy_dtype",
    "rate_limiter_info_from_proto",
    "rate_limiter_info_to_proto",
    "serialized_chunk",
    "serialized_chunk_parts",
    "table_info_from_proto",
    "table_info_to_proto",
    "tensor_header",
    "trajectory_from_proto",
    "trajectory_to_proto",
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


def _check_tensor_bytes(nbytes: int, dtype: np.dtype, shape: tuple, what: str) -> None:
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

def _delta_applies(array: np.ndarray) -> bool:
    return array.ndim >= 2 and array.dtype.kind in ("i", "u")


def encode_tensor(array: np.ndarray, *, delta_encoded: bool = False) -> "TensorProto":
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
    if delta_encoded and _delta_applies(array):
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
    fields = _pending_fields(proto.dtype, proto.tensor_shape.SerializeToString(), delta_encoded)
    return None if fields is None else PendingTensor(*fields, proto.tensor_content)


def _pending_fields(dtype: int, shape: bytes, delta_encoded: bool) -> Optional[tuple]:
    """`(dtype, shape, nbytes, delta)` of a `PendingTensor` whose header (dtype enum, serialized
    `tensor_shape`) was seen before, else None; the delta encoding applies where the header allows it."""
    header = _HEADERS.get((dtype, shape))
    if header is None or header[2] > limits.MAX_CHUNK_TENSOR_BYTES:
        return None
    return header[0], header[1], header[2], delta_encoded and header[3]


def stored_tensors(chunk: chunk_store.Chunk) -> Optional[list]:
    """`PendingTensor`s of a chunk held as serialized `ChunkData` (a server's, as received), whose contents
    are views of those bytes: decoding one copies nothing but the decompressed rows. Found once per chunk
    (kept in `chunk.encoded_views`). None when the chunk is decoded or held otherwise, or has a tensor whose
    header was not seen (`tensor_header` records the headers of every chunk a server receives) or that is
    not numeric."""
    views = chunk.encoded_views
    if views is not None:
        return views or None
    serialized = chunk.encoded
    if type(serialized) is not bytes or chunk.is_decoded:
        return None
    fields = _raw.chunk_tensor_fields(serialized)
    views = []
    if fields is not None:
        view = memoryview(serialized)
        for dtype, shape, (start, end) in fields:
            pending = _pending_fields(dtype, shape, chunk.delta_encoded)
            if pending is None:
                views = []
                break
            views.append(PendingTensor(*pending, view[start:end]))
    chunk.encoded_views = views  # ([]: not readable so, asked again never)
    return views or None


def pending_tensors(chunk: chunk_store.Chunk) -> Optional[list]:
    """The `PendingTensor`s of a chunk still held as received (see `pending_tensor`), else None."""
    encoded = chunk.encoded
    return encoded if type(encoded) is list and not chunk.is_decoded else None


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
        values = _decode_string_list(content, count) if content else proto.string_val
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
    _check_tensor_bytes(expected, dtype, shape, "chunk tensor")
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
    return b"".join([_raw.varint(len(v)) for v in values] + values)


def _decode_string_list(content: bytes, count: int) -> list:
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


# --- chunks ---

def chunk_to_proto(chunk: chunk_store.Chunk, *, delta_encoded: Optional[bool] = None) -> schema_pb2.ChunkData:
    """The `ChunkData` of a core chunk (only its first `num_rows` rows: an open chunk may still grow)."""
    delta = chunk.delta_encoded if delta_encoded is None else delta_encoded
    rows = chunk.num_rows
    proto = schema_pb2.ChunkData(chunk_key=chunk.key, delta_encoded=delta)
    sequence_range = chunk.sequence_range
    proto.sequence_range.episode_id = sequence_range.episode_id
    proto.sequence_range.start = sequence_range.start
    proto.sequence_range.end = sequence_range.end
    proto.sequence_range.sparse = sequence_range.sparse
    tensors = proto.data.tensors
    uncompressed = 0
    for tensor in chunk.tensors:
        tensor = tensor[:rows]
        tensors.append(encode_tensor(tensor, delta_encoded=delta))
        uncompressed += _total_bytes(tensor)
    proto.data_tensors_len = len(chunk.tensors)
    proto.data_uncompressed_size = uncompressed
    return proto


def _total_bytes(array: np.ndarray) -> int:
    if array.dtype == object:
        return sum(len(_as_bytes(v)) for v in array.reshape(-1))
    return array.nbytes


def _proto_tensors(proto: schema_pb2.ChunkData):
    # Chunks from old checkpoints carry their tensors in the deprecated field.
    return proto.data.tensors if proto.HasField("data") else proto.deprecated_data


def decode_chunk_tensors(proto: schema_pb2.ChunkData) -> list:
    """The decoded column tensors of a `ChunkData`."""
    return [decode_tensor(t, delta_encoded=proto.delta_encoded) for t in _proto_tensors(proto)]


def _decode_serialized(serialized: bytes) -> list:
    return decode_chunk_tensors(schema_pb2.ChunkData.FromString(serialized))


def chunk_from_proto(proto: schema_pb2.ChunkData, serialized: Optional[bytes] = None, *,
                     check_content: bool = False, check_step: Optional[Callable] = None
                     ) -> tuple[chunk_store.Chunk, list]:
    """A core chunk decoded lazily from `proto`, keeping the serialized form to send it again as is.

    The chunk's `encoded` slot holds `serialized` (or `proto` serialized); its tensors are decoded on
    first access. Headers are checked now: ChunkDecodeError for an unsupported dtype, a tensor whose rows
    contradict the sequence range, or an empty chunk. With `check_content` (a server receiving or
    restoring a chunk) every tensor's content is also decoded in full once and dropped: a Snappy body
    that ends early or is corrupt, or a string list whose lengths do not add up, is a ChunkDecodeError
    now, instead of failing every reader of the chunk later. Before any content is decompressed, every
    tensor's size (its shape's, which its Snappy header must declare) is checked against
    `limits.MAX_CHUNK_TENSOR_BYTES` (ChunkTooLargeError), and `check_step(chunk_key, index, dtype, shape)`,
    if given, is called with each tensor's header (it raises ValueError to refuse the chunk).

    Returns:
      `(chunk, headers)` with `headers[i] = (numpy dtype, shape)` of tensor `i`, for signature checks
      that must not decode the data.
    """
    sequence_range = chunk_store.SequenceRange(proto.sequence_range.episode_id, proto.sequence_range.start,
                                               proto.sequence_range.end, proto.sequence_range.sparse)
    rows = sequence_range.end - sequence_range.start + 1
    tensors = _proto_tensors(proto)
    if not tensors:
        raise ChunkDecodeError(f"chunk {proto.chunk_key} has no tensors")
    if rows < 1:
        raise ChunkDecodeError(f"chunk {proto.chunk_key} has an empty sequence range "
                               f"[{sequence_range.start}, {sequence_range.end}]")
    headers = None
    if serialized is not None:
        headers = _seen_headers(proto.chunk_key, serialized, rows, check_content, check_step)
    if headers is None:
        headers = _checked_headers(proto, tensors, sequence_range, rows)
        if check_step is not None:
            for index, (dtype, shape) in enumerate(headers):
                check_step(proto.chunk_key, index, dtype, shape)
        if serialized is None:
            serialized = proto.SerializeToString()
        if check_content:
            _check_contents(proto, serialized, tensors, headers)
    chunk = chunk_store.Chunk(proto.chunk_key, None, sequence_range, delta_encoded=proto.delta_encoded,
                              encoded=serialized, decoder=_decode_serialized)
    return chunk, headers


_SCRATCH_BYTES = 1 << 20  # contents up to this size are decompressed into a reused buffer ...
_SCRATCH_KEPT = 8         # ... of at most this many, however many threads decompress at once
_scratch_free: list = []
_scratch_lock = threading.Lock()


def _decompress_into_scratch(content, size: int) -> int:
    """The decompressed size of Snappy raw `content` (expected: `size` bytes), decompressed into a buffer
    that is then dropped. Small ones reuse a few shared buffers: a server runs one thread per open stream,
    and a buffer kept per thread would hold a megabyte for each of them."""
    if size > _SCRATCH_BYTES:
        return _decompress_raw_into(content, np.empty(size, np.uint8))
    with _scratch_lock:
        out = _scratch_free.pop() if _scratch_free else None
    if out is None:
        out = np.empty(_SCRATCH_BYTES, np.uint8)
    try:
        return _decompress_raw_into(content, out)
    finally:
        with _scratch_lock:
            if len(_scratch_free) < _SCRATCH_KEPT:
                _scratch_free.append(out)


def _check_contents(proto: schema_pb2.ChunkData, serialized: bytes, tensors, headers: list) -> None:
    """ChunkDecodeError unless every tensor of a chunk whose headers passed decodes in full (see
    `chunk_from_proto`). Numeric contents are read in place from `serialized` when its bytes can be walked."""
    fields = _raw.chunk_tensor_fields(serialized)
    if fields is not None and len(fields) == len(headers):
        view = memoryview(serialized)
        contents = [view[start:end] for _, _, (start, end) in fields]
    else:
        contents = None
    for index, (dtype, shape) in enumerate(headers):
        count = math.prod(shape)
        if dtype.kind == "O":
            tensor = tensors[index]
            content = tensor.tensor_content
            found = len(_decode_string_list(content, count)) if content else len(tensor.string_val)
            if found != count:
                raise ChunkDecodeError(f"chunk {proto.chunk_key}: string tensor {index} of shape {list(shape)} has "
                                       f"{found} values, expected {count}")
            continue
        content = contents[index] if contents is not None else tensors[index].tensor_content
        expected = count * dtype.itemsize
        try:
            size = _decompress_into_scratch(content, expected)
        except Exception as e:  # noqa: BLE001  (cramjam raises its own DecompressionError type)
            raise ChunkDecodeError(f"chunk {proto.chunk_key}: tensor {index} content is not valid Snappy raw data: "
                                   f"{e}") from None
        if size != expected:
            raise ChunkDecodeError(f"chunk {proto.chunk_key}: tensor {index} of dtype {dtype.name} and shape "
                                   f"{list(shape)} needs {expected} bytes, its content decompresses to {size}")


def _checked_headers(proto: schema_pb2.ChunkData, tensors, sequence_range: chunk_store.SequenceRange,
                     rows: int) -> list:
    headers = []
    for index, tensor in enumerate(tensors):
        dtype, shape = tensor_header(tensor)
        if not shape or shape[0] != rows:
            raise ChunkDecodeError(f"chunk {proto.chunk_key}: tensor {index} has shape {list(shape)} but the "
                                   f"sequence range [{sequence_range.start}, {sequence_range.end}] has {rows} rows")
        _check_content_size(proto.chunk_key, index, tensor, dtype, shape)
        headers.append((dtype, shape))
    return headers


def _seen_headers(chunk_key: int, serialized: bytes, rows: int, check_content: bool = False,
                  check_step: Optional[Callable] = None) -> Optional[list]:
    """The headers `chunk_from_proto` checks, read from the serialized chunk when every tensor is numeric
    with a header seen before and passes the checks (nothing is copied: protobuf would copy each
    `tensor_content` to be read), each content decompressed in full when `check_content` (after
    `check_step` accepted its header); None otherwise, for the checks on the parsed chunk to run (and name
    what is wrong)."""
    fields = _raw.chunk_tensor_fields(serialized)
    if not fields:
        return None
    view = memoryview(serialized)
    headers = []
    limit = limits.MAX_CHUNK_TENSOR_BYTES
    for index, (dtype, shape, (start, end)) in enumerate(fields):
        header = _HEADERS.get((dtype, shape))
        if header is None or not header[1] or header[1][0] != rows or header[2] > limit:
            return None
        if check_step is not None:
            check_step(chunk_key, index, header[0], header[1])
        try:
            if check_content:
                size = _decompress_into_scratch(view[start:end], header[2])
            else:
                size = cramjam.snappy.decompress_raw_len(view[start:end])
        except Exception:  # noqa: BLE001  (cramjam's own DecompressionError: reported by the full check)
            return None
        if size != header[2]:
            return None
        headers.append(header[:2])
    return headers


def _check_content_size(chunk_key: int, index: int, tensor, dtype: np.dtype, shape: tuple) -> None:
    """ChunkDecodeError unless the shape has no negative dim and, for non-string tensors, the size that the
    Snappy header of `tensor_content` announces is the shape's byte size (the header is read, not the data)
    and within `limits.MAX_CHUNK_TENSOR_BYTES` (ChunkTooLargeError)."""
    if any(size < 0 for size in shape):
        raise ChunkDecodeError(f"chunk {chunk_key}: tensor {index} has a negative dimension: shape {list(shape)}")
    if dtype.kind == "O":
        return
    expected = math.prod(shape) * dtype.itemsize
    try:
        size = cramjam.snappy.decompress_raw_len(tensor.tensor_content)
    except Exception as e:  # cramjam raises its own DecompressionError type
        raise ChunkDecodeError(f"chunk {chunk_key}: tensor {index} content is not valid Snappy raw data: "
                               f"{e}") from None
    if size != expected:
        raise ChunkDecodeError(f"chunk {chunk_key}: tensor {index} of dtype {dtype.name} and shape {list(shape)} "
                               f"needs {expected} bytes, its content announces {size}")
    _check_tensor_bytes(expected, dtype, shape, f"chunk {chunk_key}: tensor {index}")


def serialized_chunk(chunk: chunk_store.Chunk) -> bytes:
    """The serialized `ChunkData` of a core chunk, cached on the chunk (re-encoded if it grew since).

    Chunks of numeric tensors are assembled as bytes (`_raw`, the bytes protobuf writes, without building
    protos); strings, byte-swapped and delta-encoded tensors go through `chunk_to_proto`.
    """
    serialized = _cached_serialized(chunk)
    if serialized is None:
        serialized = b"".join(_encoded_chunk_parts(chunk))
        chunk.encoded = (chunk.sequence_range.end, serialized)
    return serialized


def serialized_chunk_parts(chunk: chunk_store.Chunk, key_field: Optional[bytes] = None) -> list:
    """`serialized_chunk(chunk)` as a list of bytes-like parts that join to it, for a chunk sent once (an
    insert stream): its compressed contents are not copied into one `bytes`, and nothing is cached.
    `key_field` is `_raw.key_field(chunk.key)` if the caller has it."""
    serialized = _cached_serialized(chunk)
    if serialized is not None:
        return [serialized]
    parts = _numeric_chunk_parts(chunk, key_field)
    return [chunk_to_proto(chunk).SerializeToString()] if parts is None else parts


def _cached_serialized(chunk: chunk_store.Chunk) -> Optional[bytes]:
    """The serialized `ChunkData` the chunk holds (as received, or cached while it had its current rows)."""
    encoded = chunk.encoded
    if isinstance(encoded, bytes):
        return encoded
    if isinstance(encoded, tuple) and encoded[0] == chunk.sequence_range.end:
        return encoded[1]
    return None


def _encoded_chunk_parts(chunk: chunk_store.Chunk) -> list:
    parts = _numeric_chunk_parts(chunk)
    return [chunk_to_proto(chunk).SerializeToString()] if parts is None else parts


def _numeric_chunk_parts(chunk: chunk_store.Chunk, key_field: Optional[bytes] = None) -> Optional[list]:
    """`chunk_to_proto(chunk).SerializeToString()` written by `_raw` as a list of bytes-like parts (the
    compressed contents as cramjam returns them, uncopied), or None when a tensor needs the general path
    (strings, byte-swapped, or delta-encoded)."""
    rows = chunk.num_rows
    delta = chunk.delta_encoded
    tensors = []
    uncompressed = 0
    for array in chunk.tensors:
        array = array[:rows]
        if array.dtype.kind not in "biufc" or not array.dtype.isnative or (delta and _delta_applies(array)):
            return None
        content = cramjam.snappy.compress_raw(np.ascontiguousarray(array))
        tensors.append((_raw.tensor_head(dtype_enum(array.dtype), array.shape, len(content)), content))
        uncompressed += array.nbytes
    r = chunk.sequence_range
    global _last_episode_field
    episode = _last_episode_field  # (consecutive chunks are mostly of one episode)
    if episode[0] != r.episode_id:
        episode = _last_episode_field = (r.episode_id, _raw.key_field(r.episode_id))
    if key_field is None:
        key_field = _raw.key_field(chunk.key)
    return _raw.chunk_data_parts(key_field, episode[1], r.start, r.end, r.sparse, delta, tensors, uncompressed)


_last_episode_field = (None, b"")  # (episode id, its `_raw.key_field`)


# --- items and trajectories ---

def trajectory_to_proto(trajectory: Sequence[chunk_store.Column], proto: Optional[schema_pb2.FlatTrajectory] = None
                        ) -> schema_pb2.FlatTrajectory:
    """A core flat trajectory (tuple of `Column`) as a `FlatTrajectory`."""
    proto = schema_pb2.FlatTrajectory() if proto is None else proto
    for column in trajectory:
        column_proto = proto.columns.add(squeeze=column.squeeze)
        for s in column.slices:
            column_proto.chunk_slices.add(chunk_key=s[0], offset=s[1], length=s[2], index=s[3])
    return proto


def trajectory_from_proto(proto: schema_pb2.FlatTrajectory) -> tuple:
    """A `FlatTrajectory` as a core flat trajectory (tuple of `Column`)."""
    return tuple(
        chunk_store.Column(tuple(chunk_store.ChunkSlice(s.chunk_key, s.offset, s.length, s.index)
                                 for s in column.chunk_slices), column.squeeze)
        for column in proto.columns)


def item_to_proto(item: chunk_store.Item, table: str, *, times_sampled: Optional[int] = None,
                  priority: Optional[float] = None) -> schema_pb2.PrioritizedItem:
    """A core item as a `PrioritizedItem` (`inserted_at` from the item's nanosecond clock)."""
    proto = schema_pb2.PrioritizedItem(
        key=item.key, table=table, priority=item.priority if priority is None else priority,
        times_sampled=item.times_sampled if times_sampled is None else times_sampled)
    if item.inserted_at:
        proto.inserted_at.seconds, proto.inserted_at.nanos = divmod(int(item.inserted_at), 1_000_000_000)
    trajectory_to_proto(item.trajectory, proto.flat_trajectory)
    return proto


# --- selectors, rate limiters, table info ---

def key_distribution_options_to_proto(options: Any) -> schema_pb2.KeyDistributionOptions:
    """A new `KeyDistributionOptions` message equal to `options` (the core's record or such a message)."""
    if isinstance(options, schema_pb2.KeyDistributionOptions):
        proto = schema_pb2.KeyDistributionOptions()
        proto.CopyFrom(options)
        return proto
    return options.to_proto()


def key_distribution_options_from_proto(proto: schema_pb2.KeyDistributionOptions
                                        ) -> selectors_lib.KeyDistributionOptions:
    kind = proto.WhichOneof("distribution")
    kwargs: dict[str, Any] = {"is_deterministic": proto.is_deterministic}
    if kind == "prioritized":
        kwargs["prioritized"] = selectors_lib.PrioritizedOptions(proto.prioritized.priority_exponent)
    elif kind == "heap":
        kwargs["heap"] = selectors_lib.HeapOptions(proto.heap.min_heap)
    elif kind is not None:
        kwargs[kind] = True
    return selectors_lib.KeyDistributionOptions(**kwargs)


def rate_limiter_info_to_proto(info: Any) -> schema_pb2.RateLimiterInfo:
    """A new `RateLimiterInfo` message equal to `info` (the core's record or such a message)."""
    if isinstance(info, schema_pb2.RateLimiterInfo):
        proto = schema_pb2.RateLimiterInfo()
        proto.CopyFrom(info)
        return proto
    return info.to_proto()


def rate_limiter_info_from_proto(proto: schema_pb2.RateLimiterInfo) -> rate_limiters_lib.RateLimiterInfo:
    return rate_limiters_lib.RateLimiterInfo(
        samples_per_insert=proto.samples_per_insert, min_diff=proto.min_diff, max_diff=proto.max_diff,
        min_size_to_sample=proto.min_size_to_sample,
        insert_stats=rate_limiters_lib.RateLimiterCallStats(proto.insert_stats.completed),
        sample_stats=rate_limiters_lib.RateLimiterCallStats(proto.sample_stats.completed))


def encode_signature(signature: Any):
    """A nest of `tf.TensorSpec` as the `tensorflow.StructuredValue` Reverb stores in `TableInfo`."""
    return structure_coder.encode_structure(signature)


def decode_signature(proto) -> Any:
    """The nest of `tf.TensorSpec` of a `StructuredValue` (bounded specs as TF's `BoundedTensorSpec`)."""
    return structure_coder.decode_structure(proto)


def table_info_to_proto(info: table_lib.TableInfo) -> schema_pb2.TableInfo:
    """A `TableInfo` as the `TableInfo` proto (signature encoded as a `StructuredValue`)."""
    proto = schema_pb2.TableInfo(name=info.name, max_size=info.max_size, max_times_sampled=info.max_times_sampled,
                                 current_size=info.current_size, num_episodes=info.num_episodes,
                                 num_deleted_episodes=info.num_deleted_episodes,
                                 num_unique_samples=info.num_unique_samples)
    # TableInfo holds these as messages of this module's types (it converts the core's records).
    proto.sampler_options.CopyFrom(info.sampler_options)
    proto.remover_options.CopyFrom(info.remover_options)
    proto.rate_limiter_info.CopyFrom(info.rate_limiter_info)
    proto.table_worker_time.CopyFrom(info.table_worker_time)
    if info.signature is not None:
        proto.signature.CopyFrom(encode_signature(info.signature))
    return proto


def table_info_from_proto(proto: schema_pb2.TableInfo) -> table_lib.TableInfo:
    """A `TableInfo` proto as a `TableInfo` (signature decoded to a `tf.TensorSpec` nest; the option and
    statistics fields are the proto's own sub-messages, as in Reverb's `TableInfo.from_serialized_proto`)."""
    return table_lib.TableInfo(
        name=proto.name,
        sampler_options=proto.sampler_options,
        remover_options=proto.remover_options,
        max_size=proto.max_size,
        max_times_sampled=proto.max_times_sampled,
        rate_limiter_info=proto.rate_limiter_info,
        signature=decode_signature(proto.signature) if proto.HasField("signature") else None,
        current_size=proto.current_size,
        num_episodes=proto.num_episodes,
        num_deleted_episodes=proto.num_deleted_episodes,
        num_unique_samples=proto.num_unique_samples,
        table_worker_time=proto.table_worker_time)


def _tensor_proto_class():
    from tensorflow.core.framework import tensor_pb2  # noqa: PLC0415
    return tensor_pb2.TensorProto


_TensorProto = _tensor_proto_class()
