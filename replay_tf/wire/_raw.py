"""Hand-assembled protobuf bytes for the hot path of `SampleStream` responses.

A sampled chunk is stored as its serialized `ChunkData`; protobuf's wire format lets a message embed it by
prefixing a tag and a length, so responses are built by joining bytes instead of parsing and re-serializing
the chunks. Only the few fields below are written; everything else goes through the generated classes.
"""
from __future__ import annotations

import struct

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
_TAG_ITEM_TRAJECTORY = b"\x42"     # PrioritizedItem.flat_trajectory = 8


def varint(value: int) -> bytes:
    """Protobuf varint of a non-negative int (negative int32/int64 are written as 10-byte two's complement)."""
    if value < 0:
        value += 1 << 64
    if value < 0x80:
        return bytes((value,))
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


def sample_info(key: int, table_field: bytes, priority: float, times_sampled: int, inserted_at_ns: int,
                trajectory: bytes, probability: float, table_size: int, rate_limited: bool) -> bytes:
    """A serialized `SampleInfo` whose item has the given fields (`table_field`: tag, length and name)."""
    item = [_TAG_ITEM_KEY, varint(key), table_field]
    if priority:
        item += [_TAG_ITEM_PRIORITY, _DOUBLE.pack(priority)]
    if times_sampled:
        item += [_TAG_ITEM_TIMES_SAMPLED, varint(times_sampled)]
    if inserted_at_ns:
        item.append(length_delimited(_TAG_ITEM_INSERTED_AT, timestamp(inserted_at_ns)))
    if trajectory:
        item.append(length_delimited(_TAG_ITEM_TRAJECTORY, trajectory))
    out = [length_delimited(_TAG_INFO_ITEM, b"".join(item))]
    if probability:
        out += [_TAG_INFO_PROBABILITY, _DOUBLE.pack(probability)]
    if table_size:
        out += [_TAG_INFO_TABLE_SIZE, varint(table_size)]
    if rate_limited:
        out.append(_INFO_RATE_LIMITED)
    return b"".join(out)


def table_field(name: str) -> bytes:
    """`PrioritizedItem.table` set to `name`, serialized (tag, length, UTF-8)."""
    return length_delimited(_TAG_ITEM_TABLE, name.encode())


def entry(info: bytes | None, chunks: list, end_of_sequence: bool) -> bytes:
    """A serialized `SampleStreamResponse.entries` element (tag and length included)."""
    parts = [length_delimited(_TAG_ENTRY_INFO, info)] if info is not None else []
    for chunk in chunks:
        parts.append(_TAG_ENTRY_DATA)
        parts.append(varint(len(chunk)))
        parts.append(chunk)
    if end_of_sequence:
        parts.append(_END_OF_SEQUENCE)
    return length_delimited(_TAG_ENTRIES, b"".join(parts))
