"""Limits on what one client can make a replay server (or a sampling client) hold in memory.

`max_message_bytes` bounds the bytes of one message, not what they turn into: tiny chunks cost ~1 KiB of
Python objects each, slices ~100 bytes, kept chunk keys ~100 bytes as a set, an empty string one byte on the
wire and a Python object decoded, 48 MiB of valid Snappy data may declare 1 GiB, and an item that names one row
many times decodes to that many copies. These limits bound each of those. They are read when used, so a process may change them (e.g. for a table of unusually
large steps: `replay_tf.wire.limits.MAX_CHUNK_TENSOR_BYTES = 1 << 30` before the server or client runs).

The defaults leave wide margins for real workloads: an Atari chunk of 1,000 steps of 84x84x4 uint8 frames
holds 28 MB per tensor; an item of 1,000 steps over 50 columns, one chunk per step, has 50,000 slices; a
dm-reverb writer sends at most ~40 MiB of chunks ahead of the item that uses them.

A request over a limit ends its stream with RESOURCE_EXHAUSTED (INVALID_ARGUMENT for a tensor that no
table's signature allows) and a message naming the limit and the value got; nothing is decompressed or
kept first.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from replay_tf.wire import raw_fields

#: Chunks one `InsertStreamRequest` may carry (counted in the request's bytes, before it is parsed).
MAX_CHUNKS_PER_REQUEST = 1 << 16

#: Chunk slices (over every column of every item) one `InsertStreamRequest` may carry (counted before parsing).
MAX_SLICES_PER_REQUEST = 1 << 20

#: Bytes one chunk tensor may decompress to (its Snappy header and its shape are read first; nothing larger
#: is allocated, on the server receiving it or on a client sampling it).
MAX_CHUNK_TENSOR_BYTES = 256 << 20

#: Bytes of chunks one insert stream may hold for later items (those of chunk-only requests, and those kept by
#: `keep_chunk_keys`), each counted as its serialized size plus `HELD_CHUNK_OVERHEAD_BYTES`; checked after
#: every request.
MAX_HELD_CHUNK_BYTES_PER_STREAM = 256 << 20

#: What a held chunk costs beyond its bytes (its Python objects and the stream's records of it).
HELD_CHUNK_OVERHEAD_BYTES = 1 << 10

#: Keys one `InsertStreamRequest` may name in `keep_chunk_keys` (counted before parsing). A stream never holds more
#: chunks than `MAX_HELD_CHUNK_BYTES_PER_STREAM // HELD_CHUNK_OVERHEAD_BYTES`, so a request naming more could
#: never be satisfied.
MAX_KEPT_CHUNKS_PER_REQUEST = 1 << 18

#: What one element of a string chunk tensor costs decoded (a Python `bytes` object and the references to it),
#: counted with the strings' bytes against `MAX_CHUNK_TENSOR_BYTES` and `MAX_ITEM_BYTES`: an empty string is one
#: byte on the wire.
STRING_ELEMENT_BYTES = 64

#: Bytes one item's columns may decode to, each slice counted as many times as the item names it (an item may
#: name one chunk row any number of times). Checked when an item is inserted (over gRPC or in this process) or
#: restored, and by a sampling client before it assembles a sample.
MAX_ITEM_BYTES = 256 << 20

#: Chunk keys an error message lists (the others are counted).
MAX_LISTED_KEYS = 16


class LimitExceededError(ValueError):
    """A request is over one of this module's limits (the server answers RESOURCE_EXHAUSTED)."""


# Module-level names for the field walk below (one global lookup each, not an attribute lookup per field).
_CHUNKS_TAG = raw_fields.REQUEST_CHUNKS_TAG
_ITEMS_TAG = raw_fields.REQUEST_ITEMS_TAG
_KEEP_PACKED_TAG = raw_fields.REQUEST_KEEP_PACKED_TAG
_KEEP_TAG = raw_fields.REQUEST_KEEP_TAG
_TRAJECTORY_TAG = raw_fields.ITEM_TRAJECTORY_TAG
_REPEATED_TAG = raw_fields.REPEATED_TAG
_MIN_SLICE_BYTES = 2        # a chunk slice costs at least its tag and its length on the wire


def check_insert_request(raw: bytes) -> None:
    """LimitExceededError if the serialized `InsertStreamRequest` `raw` carries more chunks than
    `MAX_CHUNKS_PER_REQUEST` or more chunk slices than `MAX_SLICES_PER_REQUEST`, counted in its bytes before
    it is parsed (parsing turns every one into objects). Slices are counted one by one only when the items'
    bytes could hold more than the limit. Bytes this walk cannot read are left to the parser to refuse.
    Keys in `keep_chunk_keys` over `MAX_KEPT_CHUNKS_PER_REQUEST` are refused the same way."""
    max_chunks, max_slices = MAX_CHUNKS_PER_REQUEST, MAX_SLICES_PER_REQUEST
    chunks = kept = 0
    items = []  # (start, end) of each item
    item_bytes = 0
    for tag, start, end in _fields(raw, 0, len(raw), _KEEP_TAG):
        if tag == _KEEP_PACKED_TAG:
            kept += _count_varints(raw, start, end)
            _check_kept(kept)
        elif tag == _KEEP_TAG:
            kept += 1
            _check_kept(kept)
        elif tag == _CHUNKS_TAG:
            chunks += 1
            if chunks > max_chunks:
                raise LimitExceededError(
                    f"InsertStreamRequest carries {chunks} or more chunks, over "
                    f"replay_tf.wire.limits.MAX_CHUNKS_PER_REQUEST ({max_chunks}): send them over several requests "
                    f"(with the items that use them), or raise the limit in the server's process")
        elif tag == _ITEMS_TAG:
            items.append((start, end))
            item_bytes += end - start
    if item_bytes // _MIN_SLICE_BYTES <= max_slices:
        return
    slices = 0
    for item_start, item_end in items:
        for tag, start, end in _fields(raw, item_start, item_end):
            if tag != _TRAJECTORY_TAG:
                continue
            for column_tag, column_start, column_end in _fields(raw, start, end):
                if column_tag != _REPEATED_TAG:
                    continue
                for slice_tag, _, _ in _fields(raw, column_start, column_end):
                    slices += slice_tag == _REPEATED_TAG
                if slices > max_slices:
                    raise LimitExceededError(
                        f"InsertStreamRequest carries {slices} or more chunk slices in its items' trajectories, "
                        f"over replay_tf.wire.limits.MAX_SLICES_PER_REQUEST ({max_slices}): send fewer items per "
                        f"request, items that use fewer and longer chunks, or raise the limit in the server's "
                        f"process")


def _check_kept(kept: int) -> None:
    limit = MAX_KEPT_CHUNKS_PER_REQUEST
    if kept > limit:
        raise LimitExceededError(
            f"InsertStreamRequest names {kept} or more chunks in keep_chunk_keys, over "
            f"replay_tf.wire.limits.MAX_KEPT_CHUNKS_PER_REQUEST ({limit}): keep only the chunks later items need, "
            f"or raise the limit in the server's process")


def _count_varints(buffer: bytes, start: int, end: int) -> int:
    """How many varints end in `buffer[start:end]`: every varint ends at its one byte below 0x80 (read a block at
    a time, so that counting costs no copy of the request)."""
    count = 0
    for block in range(start, end, _COUNT_BLOCK_BYTES):
        view = np.frombuffer(buffer, np.uint8, min(_COUNT_BLOCK_BYTES, end - block), block)
        count += int(np.count_nonzero(view < 0x80))
    return count


_COUNT_BLOCK_BYTES = 1 << 20


def _fields(buffer: bytes, pos: int, end: int, varint_tag: int = -1):
    """`(tag, start, end)` of each length-delimited field of the message in `buffer[pos:end]`, and
    `(varint_tag, pos, pos)` for each varint field of that tag (other fields are skipped); stops quietly at
    bytes it cannot read. Every step moves forward, so the walk always ends."""
    while pos < end:
        tag, pos = _varint(buffer, pos, end)
        if pos < 0:
            return
        wire_type = tag & 7
        if wire_type == 2:
            size, pos = _varint(buffer, pos, end)
            if pos < 0 or pos + size > end:
                return
            yield tag, pos, pos + size
            pos += size
        elif wire_type == 0:
            _, pos = _varint(buffer, pos, end)
            if pos < 0:
                return
            if tag == varint_tag:
                yield tag, pos, pos
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            return


def _varint(buffer: bytes, pos: int, end: int) -> tuple:
    """`(value, position after it)` of the varint at `buffer[pos]`, or `(0, -1)` when none ends before `end`."""
    value = shift = 0
    while pos < end and shift < 64:
        byte = buffer[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return 0, -1


def listed_keys(keys) -> str:
    """The first `MAX_LISTED_KEYS` of `keys` (an iterable of ints, taken in order), then how many more there are:
    an error message naming keys stays short however many a request named."""
    shown, more = [], 0
    for key in keys:
        if len(shown) < MAX_LISTED_KEYS:
            shown.append(key)
        else:
            more += 1
    return f"{shown}" + (f" and {more} more" if more else "")


class HeldChunks:
    """The bytes of the chunks an insert stream holds for items to come (received, or named by the last
    request's `keep_chunk_keys`), bounded by `MAX_HELD_CHUNK_BYTES_PER_STREAM`. A writer keeps only the chunks
    of its keep-alive window; a stream that sends chunks without the items that use them, or keeps every
    chunk it ever sent, reaches the limit."""

    def __init__(self):
        self._sizes: dict = {}  # chunk key -> counted bytes
        self.nbytes = 0

    def add(self, key: int, size: int) -> None:
        """Counts a chunk of `size` serialized bytes that the stream now holds."""
        size += HELD_CHUNK_OVERHEAD_BYTES
        self.nbytes += size - self._sizes.get(key, 0)
        self._sizes[key] = size

    def drop(self, key: int) -> None:
        """Forgets a chunk the stream let go."""
        self.nbytes -= self._sizes.pop(key, 0)

    def check(self) -> None:
        """LimitExceededError if the stream holds more than the limit (checked after each request: one
        request's chunks may wait for its own items)."""
        limit = MAX_HELD_CHUNK_BYTES_PER_STREAM
        if self.nbytes > limit:
            raise LimitExceededError(
                f"InsertStream holds {self.nbytes} bytes in {len(self._sizes)} chunks for items to come (each "
                f"counted with {HELD_CHUNK_OVERHEAD_BYTES} bytes of overhead), over "
                f"replay_tf.wire.limits.MAX_HELD_CHUNK_BYTES_PER_STREAM ({limit}): send items with the chunks "
                f"they use and keep only the chunks later items need, or raise the limit in the server's process")


class StepCheck:
    """Refuses, before anything is decompressed, a chunk tensor whose steps fit no column of the tables'
    signatures: its dtype must be a column's, and its step shape (the shape without the leading rows)
    compatible with the column's shape (a squeezed column, or a length-1 step sent unsqueezed) or with it
    without its leading dimension (a column of several steps). Built only when every table has a signature
    (`for_signatures` returns None otherwise: a table without one accepts any chunk)."""

    def __init__(self, columns: dict):
        self._columns = columns  # numpy dtype -> set of step shapes (tuples, None for an unknown dim; None: any)
        self._seen: dict = {}    # (dtype, step shape) -> allowed, bounded

    @classmethod
    def for_signatures(cls, signatures) -> Optional[StepCheck]:
        """The check for tables whose signatures (nests of `tf.TensorSpec`) are `signatures`; None if one
        of them is None or there are none."""
        import tensorflow as tf  # noqa: PLC0415  (signatures are TensorSpecs: TensorFlow is loaded)
        signatures = list(signatures)
        if not signatures or any(signature is None for signature in signatures):
            return None
        columns: dict = {}
        for signature in signatures:
            for spec in tf.nest.flatten(signature):
                dtype = np.dtype(tf.as_dtype(spec.dtype).as_numpy_dtype)
                shapes = columns.setdefault(dtype, set())
                if shapes is None:
                    continue
                dims = spec.shape.as_list() if spec.shape.rank is not None else None
                if dims is None:
                    columns[dtype] = None  # any shape of this dtype
                    continue
                shapes.add(tuple(dims))
                if dims:
                    shapes.add(tuple(dims[1:]))
        return cls(columns)

    def __call__(self, chunk_key: int, index: int, dtype, shape: tuple) -> None:
        """ValueError unless a tensor of `dtype` and `shape` (rows first) fits a column."""
        step = tuple(shape[1:])
        key = (dtype, step)
        allowed = self._seen.get(key)
        if allowed is None:
            allowed = self._allows(dtype, step)
            if len(self._seen) < 4096:
                self._seen[key] = allowed
        if not allowed:
            known = sorted(f"{d.name}{list(s)}" for d, shapes in self._columns.items() for s in (shapes or ()))
            raise ValueError(
                f"chunk {chunk_key}: tensor {index} holds steps of dtype {dtype.name} and shape {list(step)}, "
                f"which fit no column of the tables' signatures (steps of {', '.join(known[:16])}): a chunk "
                f"tensor holds the steps of one signature column")

    def _allows(self, dtype, step: tuple) -> bool:
        if dtype not in self._columns:
            return False
        shapes = self._columns[dtype]
        if shapes is None:
            return True
        return any(len(s) == len(step) and all(d is None or d == g for d, g in zip(s, step)) for s in shapes)
