"""Hand-assembled protobuf bytes for the hot path of `SampleStream` responses.

A sampled chunk is stored as its serialized `ChunkData`; protobuf's wire format lets a message embed it by
prefixing a tag and a length, so responses are built by joining bytes instead of parsing and re-serializing
the chunks. Only the few fields below are written; everything else goes through the generated classes.
"""
from __future__ import annotations

import struct
from typing import Optional

_DOUBLE = struct.Struct("<d")

# Tags: (field number << 3) | wire type (0 varint, 1 fixed64, 2 length-delimited).
_TAG_ENTRIES = b"\x0a"          # SampleStreamResponse.entries = 1
_TAG_ENTRY_INFO = b"\x0a"       # SampleEntry.info = 1
_TAG_ENTRY_DATA = b"\x12"       # SampleEntry.data = 2
_END_OF_SEQUENCE = b"\x18\x01"  # SampleEntry.end_of_sequence = 3, true
_TAG_INFO_ITEM = b"\x0a"        # SampleInfo.item = 1
_TAG_INFO_PROBABILITY = b"\x11" # SampleInfo.probability = 2 (double)
_TAG_INFO_TABLE_SIZE = b"\x18"  # SampleInfo.table_size = 3
_INFO_RATE_LIMITED = b"\x20\x01"  # SampleInfo.rate_limited = 4, true
_TAG_ITEM_KEY = b"\x08"         # PrioritizedItem.key = 1
_TAG_ITEM_TABLE = b"\x12"       # PrioritizedItem.table = 2
_TAG_ITEM_PRIORITY = b"\x29"    # PrioritizedItem.priority = 5 (double)
_TAG_ITEM_TIMES_SAMPLED = b"\x30"  # PrioritizedItem.times_sampled = 6
_TAG_ITEM_INSERTED_AT = b"\x3a"    # PrioritizedItem.inserted_at = 7
ITEM_TRAJECTORY_TAG = 0x42         # PrioritizedItem.flat_trajectory = 8
_TAG_ITEM_TRAJECTORY = bytes((ITEM_TRAJECTORY_TAG,))

# replay_tf's own SampleStreamResponse fields (numbers >= 1000, two-byte tags): a stacked batch of samples,
# and the shared-memory slot that holds one.
TAG_RESPONSE_STACKED = b"\xc2\x3e"     # SampleStreamResponse.replay_tf_stacked = 1000
TAG_RESPONSE_SHARED_SLOT = b"\xca\x3e" # SampleStreamResponse.replay_tf_shared_slot = 1001
TAG_STACKED_COLUMN = b"\x3a"           # StackedSamples.columns = 7


_ONE_BYTE = [bytes((i,)) for i in range(128)]


def varint(value: int) -> bytes:
    """Protobuf varint of a non-negative int (negative int32/int64 are written as 10-byte two's complement)."""
    if value < 0x80:
        if value >= 0:
            return _ONE_BYTE[value]
        value += 1 << 64
    if value < 0x4000:
        return bytes(((value & 0x7F) | 0x80, value >> 7))
    if value < 0x200000:
        return bytes(((value & 0x7F) | 0x80, ((value >> 7) & 0x7F) | 0x80, value >> 14))
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + varint(len(payload)) + payload


def timestamp(nanoseconds: int) -> bytes:
    """A serialized `google.protobuf.Timestamp` (seconds = 1, nanos = 2)."""
    seconds, nanos = divmod(int(nanoseconds), 1_000_000_000)
    out = b""
    if seconds:
        out += b"\x08" + varint(seconds)
    if nanos:
        out += b"\x10" + varint(nanos)
    return out


def item_prefix(key: int, table_field: bytes, inserted_at_ns: int, trajectory: bytes) -> bytes:
    """The fields of a sampled `PrioritizedItem` that never change: key, table, inserted_at, trajectory."""
    parts = [_TAG_ITEM_KEY, varint(key), table_field]
    if inserted_at_ns:
        parts.append(length_delimited(_TAG_ITEM_INSERTED_AT, timestamp(inserted_at_ns)))
    if trajectory:
        parts.append(length_delimited(_TAG_ITEM_TRAJECTORY, trajectory))
    return b"".join(parts)


def sample_info(prefix: bytes, priority: float, times_sampled: int, probability: float, table_size: int,
                rate_limited: bool) -> bytes:
    """A serialized `SampleInfo` whose item is `prefix` (from `item_prefix`) plus priority and times_sampled."""
    item = [prefix]
    if priority:
        item += [_TAG_ITEM_PRIORITY, _DOUBLE.pack(priority)]
    if times_sampled:
        item += [_TAG_ITEM_TIMES_SAMPLED, varint(times_sampled)]
    item = b"".join(item)
    out = [_TAG_INFO_ITEM, varint(len(item)), item]
    if probability:
        out += [_TAG_INFO_PROBABILITY, _DOUBLE.pack(probability)]
    if table_size:
        out += [_TAG_INFO_TABLE_SIZE, varint(table_size)]
    if rate_limited:
        out.append(_INFO_RATE_LIMITED)
    return b"".join(out)


def chunk_field(chunk: bytes) -> tuple:
    """`(tag and length, chunk)` of a `SampleEntry.data` element."""
    return _TAG_ENTRY_DATA + varint(len(chunk)), chunk


def table_field(name: str) -> bytes:
    """`PrioritizedItem.table` set to `name`, serialized (tag, length, UTF-8)."""
    return length_delimited(_TAG_ITEM_TABLE, name.encode())


def entry_parts(info: bytes | None, chunk_fields: list, end_of_sequence: bool) -> list:
    """The byte strings that make up a serialized `SampleStreamResponse.entries` element (tag and length
    included), for a response joined once: each join copies every chunk's bytes.

    `chunk_fields` are `chunk_field` pairs.
    """
    parts = [_TAG_ENTRY_INFO, varint(len(info)), info] if info is not None else []
    for head, chunk in chunk_fields:
        parts.append(head)
        parts.append(chunk)
    if end_of_sequence:
        parts.append(_END_OF_SEQUENCE)
    return [_TAG_ENTRIES, varint(sum(map(len, parts))), *parts]


# --- InsertStream requests (the writer's hot path) ---
#
# Fields are written in field-number order with proto3 defaults left out, as protobuf's own serializer
# writes them, so these bytes equal the generated classes' `SerializeToString()` (tests compare them).

# As ints for the walks that read requests (`limits`, the server's insert handler); as bytes for the writer.
REQUEST_CHUNKS_TAG = 0x0A          # InsertStreamRequest.chunks = 1
REQUEST_ITEMS_TAG = 0x12           # InsertStreamRequest.items = 2
REQUEST_KEEP_PACKED_TAG = 0x1A     # InsertStreamRequest.keep_chunk_keys = 3 (packed)
REQUEST_KEEP_TAG = 0x18            # the same field, one varint per key (parsers accept both)
REPEATED_TAG = 0x0A                # FlatTrajectory.columns = 1 and FlatTrajectory.Column.chunk_slices = 1
_TAG_REQUEST_CHUNKS = bytes((REQUEST_CHUNKS_TAG,))
_TAG_REQUEST_ITEMS = bytes((REQUEST_ITEMS_TAG,))
_TAG_REQUEST_KEEP = bytes((REQUEST_KEEP_PACKED_TAG,))
_TAG_COLUMN = bytes((REPEATED_TAG,))
_TAG_SLICE = bytes((REPEATED_TAG,))
_SQUEEZE = b"\x10\x01"             # FlatTrajectory.Column.squeeze = 2, true
_OFFSET_FIELDS = [b"\x10" + bytes((i,)) for i in range(128)]  # ChunkSlice.offset = 2, values < 128
_LENGTH_FIELDS = [b"\x18" + bytes((i,)) for i in range(128)]  # ChunkSlice.length = 3
_INDEX_FIELDS = [b"\x20" + bytes((i,)) for i in range(128)]   # ChunkSlice.index = 4


def _four_varint_fields(first: int, second: int, third: int, fourth: int) -> bytes:
    """Fields 1-4 of a message made only of varint fields (bools as 0/1), zeros left out as in proto3:
    `ChunkSlice` (chunk_key, offset, length, index) and `SequenceRange` (episode_id, start, end, sparse).
    Written out rather than looped: it runs for every slice and chunk a writer sends."""
    out = b"\x08" + varint(first) if first else b""
    if second:
        out += b"\x10" + varint(second)
    if third:
        out += b"\x18" + varint(third)
    if fourth:
        out += b"\x20" + varint(fourth)
    return out


def flat_trajectory(trajectory) -> bytes:
    """A serialized `FlatTrajectory` of a core trajectory (`Column`s of `(chunk_key, offset, length, index)`)."""
    parts = []
    for column in trajectory:
        body = []
        for chunk_key, offset, length, index in column.slices:
            s = _four_varint_fields(chunk_key, offset, length, index)
            body += [_TAG_SLICE, _ONE_BYTE[len(s)] if len(s) < 0x80 else varint(len(s)), s]
        if column.squeeze:
            body.append(_SQUEEZE)
        body = b"".join(body)
        parts += [_TAG_COLUMN, varint(len(body)), body]
    return b"".join(parts)


def resolved_trajectory(columns: tuple, key_fields: dict) -> bytes:
    """`flat_trajectory(item.trajectory)` written straight from an item's resolved columns (see
    `chunk_store.Item.resolved_columns`), without building the `ChunkSlice` tuples.

    `key_fields` caches the `ChunkSlice.chunk_key` field of each chunk key (a random uint64 is a 10-byte
    varint, written once per chunk instead of once per slice); the caller bounds its size.
    """
    parts = []
    for column in columns:
        body = []
        for j in range(1, len(column), 4):
            chunk_key = column[j].key
            s = key_fields.get(chunk_key)
            if s is None:
                s = key_fields[chunk_key] = key_field(chunk_key)
            index, start, stop = column[j + 1], column[j + 2], column[j + 3]
            # ChunkSlice.offset = 2, length = 3, index = 4 (the rows [start, stop)); small values from tables.
            if start:
                s += _OFFSET_FIELDS[start] if 0 < start < 0x80 else b"\x10" + varint(start)
            length = stop - start
            if length:
                s += _LENGTH_FIELDS[length] if 0 < length < 0x80 else b"\x18" + varint(length)
            if index:
                s += _INDEX_FIELDS[index] if 0 < index < 0x80 else b"\x20" + varint(index)
            body += [_TAG_SLICE, _ONE_BYTE[len(s)] if len(s) < 0x80 else varint(len(s)), s]
        if column[0]:
            body.append(_SQUEEZE)
        body = b"".join(body)
        parts += [_TAG_COLUMN, _ONE_BYTE[len(body)] if len(body) < 0x80 else varint(len(body)), body]
    return b"".join(parts)


def request_item(key: int, table_field_bytes: bytes, priority: float, inserted_at_ns: int, trajectory: bytes) -> bytes:
    """An `InsertStreamRequest.items` element (tag and length included) with times_sampled 0.

    `table_field_bytes` is `table_field(name)`; `trajectory` is `flat_trajectory(...)`.
    """
    parts = [_TAG_ITEM_KEY, varint(key)] if key else []
    parts.append(table_field_bytes)
    if priority or str(priority)[0] == "-":  # -0.0 is written, as protobuf does
        parts += [_TAG_ITEM_PRIORITY, _DOUBLE.pack(priority)]
    if inserted_at_ns:
        parts.append(length_delimited(_TAG_ITEM_INSERTED_AT, timestamp(inserted_at_ns)))
    if trajectory:
        size = len(trajectory)
        parts += [_TAG_ITEM_TRAJECTORY, _ONE_BYTE[size] if size < 0x80 else varint(size), trajectory]
    body = b"".join(parts)
    size = len(body)
    return b"".join((_TAG_REQUEST_ITEMS, _ONE_BYTE[size] if size < 0x80 else varint(size), body))


def request_chunk_head(size: int) -> bytes:
    """The tag and length of an `InsertStreamRequest.chunks` element of `size` bytes (the serialized
    `ChunkData` follows)."""
    return _TAG_REQUEST_CHUNKS + varint(size)


def keep_chunk_keys(keys, key_fields: Optional[dict] = None) -> bytes:
    """`InsertStreamRequest.keep_chunk_keys` (packed), or nothing when there are none.

    `key_fields` may hold `ChunkSlice.chunk_key` fields of keys (see `resolved_trajectory`): a key's varint
    is taken from there (after the field's one-byte tag) instead of written again.
    """
    if not keys:
        return b""
    get = (key_fields or {}).get
    parts = []
    for k in keys:
        field = get(k)
        parts.append(field[1:] if field else varint(k))  # (key 0 has an empty field)
    body = b"".join(parts)
    return _TAG_REQUEST_KEEP + varint(len(body)) + body


# tensorflow.TensorProto and TensorShapeProto fields, as ints for the readers (`stacked_samples`).
TENSOR_DTYPE_TAG = 0x08    # TensorProto.dtype = 1
TENSOR_SHAPE_TAG = 0x12    # TensorProto.tensor_shape = 2
TENSOR_CONTENT_TAG = 0x22  # TensorProto.tensor_content = 4
SHAPE_DIM_TAG = 0x12       # TensorShapeProto.dim = 2
DIM_SIZE_TAG = 0x08        # TensorShapeProto.Dim.size = 1
_TAG_TENSOR_DTYPE = bytes((TENSOR_DTYPE_TAG,))
_TAG_TENSOR_SHAPE = bytes((TENSOR_SHAPE_TAG,))
_TAG_TENSOR_CONTENT = bytes((TENSOR_CONTENT_TAG,))
_TAG_SHAPE_DIM = bytes((SHAPE_DIM_TAG,))
_TAG_DIM_SIZE = bytes((DIM_SIZE_TAG,))


def tensor_head(dtype: int, shape: tuple, content_size: int) -> bytes:
    """A serialized `tensorflow.TensorProto` (dtype = 1, tensor_shape = 2, tensor_content = 4) up to its
    content: the whole message is this head followed by the `content_size` bytes of `tensor_content`."""
    prefix = _TENSOR_PREFIXES.get((dtype, shape))
    if prefix is None:
        prefix = _tensor_prefix(dtype, shape)
        if len(_TENSOR_PREFIXES) >= _MAX_TENSOR_PREFIXES:
            _TENSOR_PREFIXES.clear()
        _TENSOR_PREFIXES[(dtype, shape)] = prefix
    return prefix + _TAG_TENSOR_CONTENT + varint(content_size) if content_size else prefix


_TENSOR_PREFIXES: dict = {}  # (dtype enum, shape) -> the head's dtype and tensor_shape fields
_MAX_TENSOR_PREFIXES = 4096


def _tensor_prefix(dtype: int, shape: tuple) -> bytes:
    dims = []
    for size in shape:
        dim = _TAG_DIM_SIZE + varint(size) if size else b""
        dims += [_TAG_SHAPE_DIM, _ONE_BYTE[len(dim)], dim]  # (a Dim is < 12 bytes)
    dims = b"".join(dims)
    parts = [_TAG_TENSOR_DTYPE, varint(dtype)] if dtype else []
    if shape:
        parts += [_TAG_TENSOR_SHAPE, varint(len(dims)), dims]
    return b"".join(parts)


def key_field(value: int) -> bytes:
    """Field 1 of a message as a varint, left out when 0: `ChunkData.chunk_key`, `ChunkSlice.chunk_key` and
    `SequenceRange.episode_id` alike (random uint64s, ten-byte varints: worth writing once per key)."""
    return b"\x08" + varint(value) if value else b""


def chunk_data_parts(chunk_key_field: bytes, episode_id_field: bytes, start: int, end: int, sparse: bool,
                     delta_encoded: bool, tensors: list, uncompressed_size: int) -> list:
    """A serialized `ChunkData` as a list of bytes-like parts, whose `data.tensors` are `tensors`, each a
    `(tensor_head(...), content)` pair: the contents are listed, not copied (joined once by whoever sends
    the chunk). The chunk key and episode id are given as their `key_field`s."""
    seq = episode_id_field + _four_varint_fields(0, start, end, int(sparse))  # (a 0 first field is left out)
    parts = [chunk_key_field, b"\x12", varint(len(seq)), seq]
    if delta_encoded:
        parts.append(b"\x20\x01")
    data = []
    data_size = 0
    for head, content in tensors:
        size = len(head) + len(content)
        field = b"\x0a" + varint(size)  # ChunkData.Data.tensors = 1
        data += [field, head, content]
        data_size += len(field) + size
    parts += [b"\x2a", varint(data_size)]
    parts += data
    if tensors:
        parts += [b"\x30", varint(len(tensors))]
    if uncompressed_size:
        parts += [b"\x38", varint(uncompressed_size)]
    return parts


# --- reading (of bytes protobuf has already accepted: a server's stored chunks) ---

def read_varint(buffer: bytes, pos: int) -> tuple:
    """`(value, position after it)` of the varint at `buffer[pos]`; IndexError past the buffer's end or
    past 10 bytes (protobuf's longest varint: untrusted input must not make it read on)."""
    byte = buffer[pos]
    if byte < 0x80:
        return byte, pos + 1
    value, shift = byte & 0x7F, 7
    while True:
        pos += 1
        byte = buffer[pos]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos + 1
        shift += 7
        if shift >= 70:
            raise IndexError(f"a varint longer than 10 bytes at byte {pos - 9}")


def message_field_ranges(serialized: bytes, tag: int) -> Optional[list]:
    """`[(start, end), ...]` of every occurrence of the length-delimited top-level field with one-byte `tag`
    in a message that protobuf parsed before (each a repeated element's bytes, in order); None for what this
    walk leaves to protobuf (groups, a tag or length it cannot read)."""
    ranges = []
    pos, end = 0, len(serialized)
    try:
        while pos < end:
            field_tag, pos = read_varint(serialized, pos)
            wire_type = field_tag & 7
            if wire_type == 2:
                size, pos = read_varint(serialized, pos)
                if field_tag == tag:
                    ranges.append((pos, pos + size))
                pos += size
            elif wire_type == 0:
                _, pos = read_varint(serialized, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            else:
                return None
    except IndexError:
        return None
    return ranges if pos == end else None


def chunk_tensor_fields(serialized: bytes) -> Optional[list]:
    """`[(dtype enum, serialized tensor_shape, (start, end) of tensor_content), ...]` for the `data.tensors`
    of a serialized `ChunkData` that protobuf parsed before, found by walking its bytes (nothing is copied);
    None for what this walk leaves to protobuf: `deprecated_data`, `data` given twice, tensors with fields
    other than dtype, tensor_shape and tensor_content (strings, ...)."""
    pos, end, data = 0, len(serialized), None
    while pos < end:
        tag = serialized[pos]  # (every ChunkData field number is < 16: one-byte tags)
        if tag & 0x80:  # a field this walk does not know
            return None
        pos += 1
        wire_type = tag & 7
        if wire_type == 0:  # skipped, not read
            while serialized[pos] & 0x80:
                pos += 1
            pos += 1
        elif wire_type == 2:
            size = serialized[pos]
            if size < 0x80:
                pos += 1
            else:
                size, pos = read_varint(serialized, pos)
            if tag == 0x2A:  # ChunkData.data = 5
                if data is not None:
                    return None
                data = (pos, pos + size)
            elif tag != 0x12:  # only sequence_range = 2 besides (deprecated_data = 3 is left to protobuf)
                return None
            pos += size
        else:
            return None
    if data is None:
        return None
    fields = []
    pos, end = data
    while pos < end:
        if serialized[pos] != 0x0A:  # Data.tensors = 1
            return None
        size, pos = read_varint(serialized, pos + 1)
        tensor_end, dtype, shape, content = pos + size, 0, b"", (pos, pos)
        while pos < tensor_end:
            tag = serialized[pos]
            if tag == 0x08:  # TensorProto.dtype = 1
                dtype, pos = read_varint(serialized, pos + 1)
            elif tag == 0x12 or tag == 0x22:  # tensor_shape = 2, tensor_content = 4
                size, pos = read_varint(serialized, pos + 1)
                if tag == 0x12:
                    shape = serialized[pos:pos + size]
                else:
                    content = (pos, pos + size)
                pos += size
            else:
                return None
        fields.append((dtype, shape, content))
    return fields
