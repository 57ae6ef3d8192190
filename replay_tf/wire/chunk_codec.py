"""Reverb's `ChunkData`: core chunks <-> chunk protos and their serialized bytes, with the checks a
server runs on every chunk it receives or restores.

Encoding: `chunk_to_proto` builds the message; `serialized_chunk` / `serialized_chunk_parts` assemble the
bytes of numeric chunks directly (`raw_fields.py`), without building protos. Decoding: `chunk_from_proto` checks
the headers (and with `check_content` every content, decompressed into a few shared scratch buffers) and
returns a chunk decoded on first access; `stored_tensors` / `pending_tensors` read a chunk's tensors as
`PendingTensor`s without decoding them. Tensors are encoded by `tensor_codec`.
"""
from __future__ import annotations

import math
import threading
from typing import Callable, Optional

import cramjam
import numpy as np

from replay_tf.core import chunk_store
from replay_tf.wire import limits
from replay_tf.wire import schema_pb2
from replay_tf.wire import tensor_codec
from replay_tf.wire import raw_fields
from replay_tf.wire.tensor_codec import ChunkDecodeError

__all__ = [
    "chunk_from_proto",
    "chunk_to_proto",
    "decode_chunk_tensors",
    "pending_tensors",
    "serialized_chunk",
    "serialized_chunk_parts",
    "stored_tensors",
    "string_lengths",
]


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
    fields = raw_fields.chunk_tensor_fields(serialized)
    views = []
    if fields is not None:
        view = memoryview(serialized)
        for dtype, shape, (start, end) in fields:
            pending = tensor_codec.pending_fields(dtype, shape, chunk.delta_encoded)
            if pending is None:
                views = []
                break
            views.append(tensor_codec.PendingTensor(*pending, view[start:end]))
    chunk.encoded_views = views  # ([]: not readable so, asked again never)
    return views or None


def pending_tensors(chunk: chunk_store.Chunk) -> Optional[list]:
    """The `PendingTensor`s of a chunk still held as received (see `tensor_codec.pending_tensor`), else None."""
    encoded = chunk.encoded
    return encoded if type(encoded) is list and not chunk.is_decoded else None


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
        tensors.append(tensor_codec.encode_tensor(tensor, delta_encoded=delta))
        uncompressed += tensor_codec.uncompressed_size(tensor)
    proto.data_tensors_len = len(chunk.tensors)
    proto.data_uncompressed_size = uncompressed
    return proto


def _proto_tensors(proto: schema_pb2.ChunkData):
    # Chunks from old checkpoints carry their tensors in the deprecated field.
    return proto.data.tensors if proto.HasField("data") else proto.deprecated_data


def decode_chunk_tensors(proto: schema_pb2.ChunkData) -> list:
    """The decoded column tensors of a `ChunkData`."""
    return [tensor_codec.decode_tensor(t, delta_encoded=proto.delta_encoded) for t in _proto_tensors(proto)]


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
    `limits.MAX_CHUNK_TENSOR_BYTES` (`ChunkTooLargeError`), and `check_step(chunk_key, index, dtype,
    shape)`, if given, is called with each tensor's header (it raises ValueError to refuse the chunk).

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
        if serialized is None:
            serialized = proto.SerializeToString()
        headers = _checked_headers(proto, tensors, sequence_range, rows, len(serialized))
        if check_step is not None:
            for index, (dtype, shape) in enumerate(headers):
                check_step(proto.chunk_key, index, dtype, shape)
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
        return cramjam.snappy.decompress_raw_into(content, np.empty(size, np.uint8))
    with _scratch_lock:
        out = _scratch_free.pop() if _scratch_free else None
    if out is None:
        out = np.empty(_SCRATCH_BYTES, np.uint8)
    try:
        return cramjam.snappy.decompress_raw_into(content, out)
    finally:
        with _scratch_lock:
            if len(_scratch_free) < _SCRATCH_KEPT:
                _scratch_free.append(out)


def _check_contents(proto: schema_pb2.ChunkData, serialized: bytes, tensors, headers: list) -> None:
    """ChunkDecodeError unless every tensor of a chunk whose headers passed decodes in full (see
    `chunk_from_proto`). Numeric contents are read in place from `serialized` when its bytes can be walked."""
    fields = raw_fields.chunk_tensor_fields(serialized)
    if fields is not None and len(fields) == len(headers):
        view = memoryview(serialized)
        contents = [view[start:end] for _, _, (start, end) in fields]
    else:
        contents = None
    for index, (dtype, shape) in enumerate(headers):
        count = math.prod(shape)
        if dtype.kind == "O":
            try:  # (read with numpy: a Python object per string would cost many times its byte on the wire)
                tensor_codec.string_lengths(tensors[index], count)
            except ChunkDecodeError as e:
                raise ChunkDecodeError(f"chunk {proto.chunk_key}: tensor {index} of shape {list(shape)}: {e}") from None
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
                     rows: int, chunk_bytes: int) -> list:
    """The `(dtype, shape)` of each tensor, checked (see `chunk_from_proto`); `chunk_bytes`, the chunk's
    serialized size, bounds the bytes of its strings (read so, their content is not copied to be measured)."""
    headers = []
    for index, tensor in enumerate(tensors):
        dtype, shape = tensor_codec.tensor_header(tensor)
        if not shape or shape[0] != rows:
            raise ChunkDecodeError(f"chunk {proto.chunk_key}: tensor {index} has shape {list(shape)} but the "
                                   f"sequence range [{sequence_range.start}, {sequence_range.end}] has {rows} rows")
        _check_content_size(proto.chunk_key, index, tensor, dtype, shape, chunk_bytes)
        headers.append((dtype, shape))
    return headers


def _seen_headers(chunk_key: int, serialized: bytes, rows: int, check_content: bool = False,
                  check_step: Optional[Callable] = None) -> Optional[list]:
    """The headers `chunk_from_proto` checks, read from the serialized chunk when every tensor is numeric
    with a header seen before and passes the checks (nothing is copied: protobuf would copy each
    `tensor_content` to be read), each content decompressed in full when `check_content` (after
    `check_step` accepted its header); None otherwise, for the checks on the parsed chunk to run (and name
    what is wrong)."""
    fields = raw_fields.chunk_tensor_fields(serialized)
    if not fields:
        return None
    view = memoryview(serialized)
    headers = []
    limit = limits.MAX_CHUNK_TENSOR_BYTES
    for index, (dtype, shape, (start, end)) in enumerate(fields):
        header = tensor_codec.known_header(dtype, shape)
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


def _check_content_size(chunk_key: int, index: int, tensor, dtype: np.dtype, shape: tuple,
                        chunk_bytes: int) -> None:
    """ChunkDecodeError unless the shape has no negative dim and, for non-string tensors, the size that the
    Snappy header of `tensor_content` announces is the shape's byte size (the header is read, not the data)
    and within `limits.MAX_CHUNK_TENSOR_BYTES` (`ChunkTooLargeError`; for string tensors, their elements
    counted as `tensor_codec.check_string_tensor_bytes` counts them, with the chunk's `chunk_bytes`)."""
    if any(size < 0 for size in shape):
        raise ChunkDecodeError(f"chunk {chunk_key}: tensor {index} has a negative dimension: shape {list(shape)}")
    if dtype.kind == "O":
        tensor_codec.check_string_tensor_bytes(math.prod(shape), chunk_bytes, shape,
                                               f"chunk {chunk_key}: tensor {index}")
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
    tensor_codec.check_tensor_bytes(expected, dtype, shape, f"chunk {chunk_key}: tensor {index}")


def string_lengths(chunk: chunk_store.Chunk, index: int) -> np.ndarray:
    """The length of each string of string tensor `index` of `chunk` (rows first), read from the chunk's
    serialized form without a Python object per string (see `tensor_codec.string_lengths`)."""
    tensor = _proto_tensors(schema_pb2.ChunkData.FromString(serialized_chunk(chunk)))[index]
    return tensor_codec.string_lengths(tensor, math.prod(tensor_codec.tensor_header(tensor)[1]))


def serialized_chunk(chunk: chunk_store.Chunk) -> bytes:
    """The serialized `ChunkData` of a core chunk, cached on the chunk (re-encoded if it grew since).

    Chunks of numeric tensors are assembled as bytes (`raw_fields.py`, the bytes protobuf writes, without building
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
    `key_field` is `raw_fields.key_field(chunk.key)` if the caller has it."""
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
    """`chunk_to_proto(chunk).SerializeToString()` written by `raw_fields` as a list of bytes-like parts (the
    compressed contents as cramjam returns them, uncopied), or None when a tensor needs the general path
    (strings, byte-swapped, or delta-encoded)."""
    rows = chunk.num_rows
    delta = chunk.delta_encoded
    tensors = []
    uncompressed = 0
    for array in chunk.tensors:
        array = array[:rows]
        if array.dtype.kind not in "biufc" or not array.dtype.isnative or (delta and tensor_codec.delta_applies(array)):
            return None
        content = cramjam.snappy.compress_raw(np.ascontiguousarray(array))
        tensors.append((raw_fields.tensor_head(tensor_codec.dtype_enum(array.dtype), array.shape, len(content)), content))
        uncompressed += array.nbytes
    r = chunk.sequence_range
    global _last_episode_field
    episode = _last_episode_field  # (consecutive chunks are mostly of one episode)
    if episode[0] != r.episode_id:
        episode = _last_episode_field = (r.episode_id, raw_fields.key_field(r.episode_id))
    if key_field is None:
        key_field = raw_fields.key_field(chunk.key)
    return raw_fields.chunk_data_parts(key_field, episode[1], r.start, r.end, r.sparse, delta, tensors, uncompressed)


_last_episode_field = (None, b"")  # (episode id, its `raw_fields.key_field`)
