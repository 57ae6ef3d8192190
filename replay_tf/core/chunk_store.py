"""Chunks, items and flat trajectories: Reverb's data model, as plain Python objects.

A *chunk* holds consecutive steps of one episode for one or more columns: `tensors[i]` is a numpy array of
shape `[num_rows, *element_shape]`. It is keyed by a uint64 and carries its `SequenceRange` (episode id and
inclusive step range). An *item* refers to chunk data through a `FlatTrajectory`: one `Column` per
flattened leaf, each the concatenation along dim 0 of `ChunkSlice(chunk_key, offset, length, index)`
(`tensors[index][offset:offset + length]`), squeezed (leading dim removed) when `squeeze` is set.

Chunks are shared between items and tables and freed when nothing refers to them: items hold strong
references to their chunks (Python reference counting plays the role of Reverb's `shared_ptr`), and
`ChunkStore` only holds weak references, so that chunks sent twice (two streams, two tables) are stored once.
"""
from __future__ import annotations

import os
import random
import threading
import weakref
from typing import Callable, Iterable, NamedTuple, Optional, Sequence

import numpy as np


# Keys come from a generator of this module's own, seeded from the OS's entropy: user code that seeds Python's
# global `random` (as many training scripts do, in every actor alike) must not make two writers draw the same
# keys, or the server would mix their items and chunks. A Mersenne Twister instance draws a key for a fraction
# of the cost of an `os.urandom` call per key, which would be paid on the per-step path. A forked child
# re-seeds it, so that parent and child never share a sequence either.
_keys = random.Random(os.urandom(32))


def _reseed_keys() -> None:
    _keys.seed(os.urandom(32))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_keys)


def new_key() -> int:
    """A random uint64 key (items, chunks, episode ids), as Reverb's writers draw them.

    Drawn from a generator private to this module and seeded from `os.urandom` (re-seeded in forked children),
    not from Python's global `random`: seeding that one (`random.seed(0)` in every actor) leaves keys unique.
    """
    return _keys.getrandbits(64)


def new_key_bits(bits: int) -> int:
    """A random integer of `bits` bits from the same private generator as `new_key` (e.g. a server's 128-bit
    `tables_state_id`)."""
    return _keys.getrandbits(bits)


class SequenceRange(NamedTuple):
    """Episode id and inclusive `[start, end]` step indices of the rows of a chunk."""
    episode_id: int
    start: int
    end: int
    sparse: bool = False


class ChunkSlice(NamedTuple):
    """Rows `[offset, offset + length)` of tensor `index` of chunk `chunk_key`."""
    chunk_key: int
    offset: int
    length: int
    index: int = 0


class Column(NamedTuple):
    """One column of a flat trajectory: slices concatenated along dim 0, squeezed if `squeeze`."""
    slices: tuple
    squeeze: bool = False


# A flat trajectory is a tuple of `Column`s, one per flattened leaf of the item's structure.
FlatTrajectory = tuple


class Chunk:
    """Column tensors of consecutive steps of one episode, keyed by a uint64.

    `tensors` are numpy arrays with the steps on dim 0. A chunk built by an in-process writer may still be
    *open*: rows are appended (never rewritten) and `sequence_range.end` grows; items only ever refer to
    rows that were written before they were created. A transport may build a chunk from its encoded form
    (`encoded`, e.g. `ChunkData` proto bytes, plus a `decoder`), decoded on first access of `tensors`; it
    may also cache the encoded form of a decoded chunk in `encoded` to send it again without re-encoding,
    and what it found reading `encoded` in `encoded_views` (e.g. where each tensor's content lies).
    """

    __slots__ = ("key", "sequence_range", "delta_encoded", "encoded", "encoded_views", "_tensors", "_decoder",
                 "__weakref__")

    def __init__(self, key: int, tensors: Sequence[np.ndarray] | None, sequence_range: SequenceRange, *,
                 delta_encoded: bool = False, encoded=None,
                 decoder: Callable[[object], list] | None = None):
        if tensors is None and (encoded is None or decoder is None):
            raise ValueError(f"chunk {key}: give either tensors or both encoded and decoder")
        self.key = int(key)
        self.sequence_range = sequence_range
        self.delta_encoded = delta_encoded
        self.encoded = encoded
        self.encoded_views = None
        # A tuple, not a list: a tuple of arrays (which the garbage collector does not track) drops out of
        # its tracking, one object less per chunk in writers' and servers' long-lived heaps.
        self._tensors = tuple(tensors) if tensors is not None else None
        self._decoder = decoder

    @property
    def tensors(self) -> tuple:
        """The column tensors (decoded from `encoded` on first access)."""
        if self._tensors is None:
            self._tensors = tuple(self._decoder(self.encoded))
        return self._tensors

    @tensors.setter
    def tensors(self, value: Sequence[np.ndarray]) -> None:
        self._tensors = tuple(value)

    def read_tensors(self) -> tuple:
        """`tensors`, without keeping them on the chunk when they had to be decoded for this call."""
        if self._tensors is not None:
            return self._tensors
        return tuple(self._decoder(self.encoded))

    @property
    def is_decoded(self) -> bool:
        """Whether `tensors` are at hand (False: only the encoded form is held so far)."""
        return self._tensors is not None

    @property
    def num_rows(self) -> int:
        return self.sequence_range.end - self.sequence_range.start + 1

    @property
    def episode_id(self) -> int:
        return self.sequence_range.episode_id

    def nbytes(self) -> int:
        """Bytes held by the decoded rows (0 while only the encoded form is held)."""
        if self._tensors is None:
            return 0
        rows = self.num_rows
        return sum(t[:rows].nbytes for t in self._tensors)

    def __repr__(self) -> str:
        return f"Chunk(key={self.key}, sequence_range={tuple(self.sequence_range)}, columns={len(self.tensors)})"


def _rows(chunk: Chunk) -> tuple:
    """The chunk's tensors cut to its rows (an open in-process chunk may hold more capacity)."""
    rows = chunk.num_rows
    return tuple(t[:rows] for t in chunk.read_tensors())


def _same_array(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.kind == "O":
        return bool(np.array_equal(a, b))
    return a.tobytes() == b.tobytes()  # bit for bit: NaNs compare equal, -0.0 and 0.0 do not


def same_chunk(a: Chunk, b: Chunk) -> bool:
    """Whether two chunks hold the same key, range and data (encoded bytes compared first, else the rows)."""
    if a is b:
        return True
    if a.key != b.key or a.sequence_range != b.sequence_range:
        return False
    if type(a.encoded) is bytes and a.encoded == b.encoded:
        return True
    try:
        ta, tb = _rows(a), _rows(b)
    except ValueError:  # data that cannot be decoded is never the same as a stored chunk's
        return False
    return len(ta) == len(tb) and all(_same_array(x, y) for x, y in zip(ta, tb))


class ChunkStore:
    """Deduplicates chunks by key without owning them (weak references; items own their chunks)."""

    def __init__(self):
        self._chunks: weakref.WeakValueDictionary[int, Chunk] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def insert(self, chunk: Chunk) -> Chunk:
        """Returns the stored chunk with `chunk.key`: the first one inserted, while it lives.

        The same chunk sent again (a second stream, a writer re-sending after a reconnect) is stored once.

        Raises:
          ValueError: If a live chunk with `chunk.key` holds other data: keys must be unique, and keeping
            either copy would give some items another writer's data.
        """
        with self._lock:
            existing = self._chunks.get(chunk.key)
            if existing is None:
                self._chunks[chunk.key] = chunk
                return chunk
        if not same_chunk(existing, chunk):
            raise ValueError(f"chunk key {chunk.key} is already used by a different chunk on this server (episode "
                             f"{existing.episode_id}, steps {existing.sequence_range.start}.."
                             f"{existing.sequence_range.end}; got episode {chunk.episode_id}, steps "
                             f"{chunk.sequence_range.start}..{chunk.sequence_range.end}): chunk keys must be "
                             f"unique; draw them with replay_tf.core.chunk_store.new_key")
        return existing

    def get(self, keys: Iterable[int]) -> list:
        """The live chunks for `keys`; KeyError naming the first missing key."""
        with self._lock:
            out = []
            for key in keys:
                chunk = self._chunks.get(key)
                if chunk is None:
                    raise KeyError(f"Could not find sequence chunk {key}.")
                out.append(chunk)
            return out

    def __len__(self) -> int:
        return len(self._chunks)

    def total_bytes(self) -> int:
        """Decoded bytes of every live chunk."""
        with self._lock:
            chunks = list(self._chunks.values())
        return sum(c.nbytes() for c in chunks)


class Item:
    """A table item: key, priority, sampling count, trajectory and the chunks it keeps alive.

    The item stores its trajectory resolved, one flat tuple per column:
    `(squeeze, chunk_0, index_0, start_0, stop_0, chunk_1, index_1, start_1, stop_1, ...)`, so that unpacking
    does no look-ups and an item is only a few objects (the garbage collector's full passes scan every live
    container, so items that are many small objects slow down every Python program that holds many of
    them). `trajectory` (the flat trajectory of `ChunkSlice`s) and `chunks` (chunk key -> `Chunk`) are
    derived from it on access.
    """

    __slots__ = ("key", "priority", "times_sampled", "inserted_at", "_columns", "_episode_ids", "__weakref__")

    def __init__(self, key: int, priority: float, trajectory: FlatTrajectory, chunks: Iterable[Chunk], *,
                 times_sampled: int = 0, inserted_at: int = 0):
        self.key = int(key)
        self.priority = float(priority)
        self.times_sampled = int(times_sampled)
        self.inserted_at = inserted_at
        trajectory = tuple(Column(tuple(ChunkSlice(*s) for s in c.slices), bool(c.squeeze)) for c in trajectory)
        by_key = {c.key: c for c in chunks}
        self._validate(trajectory, by_key)
        self._columns = tuple(
            (column.squeeze, *(v for sl in column.slices
                               for v in (by_key[sl.chunk_key], sl.index, sl.offset, sl.offset + sl.length)))
            for column in trajectory)
        self._episode_ids = frozenset(c.sequence_range.episode_id for c in by_key.values())

    @classmethod
    def from_resolved(cls, key: int, priority: float, columns: tuple,
                      episode_ids: Optional[frozenset] = None) -> "Item":
        """An item from already valid resolved columns (see the class docstring); no validation.
        `episode_ids` None: worked out from the chunks on first access (sampled items rarely need them)."""
        item = cls.__new__(cls)
        item.key = key
        item.priority = priority
        item.times_sampled = 0
        item.inserted_at = 0
        item._columns = columns
        item._episode_ids = episode_ids
        return item

    @property
    def resolved_columns(self) -> tuple:
        """The resolved columns (see the class docstring), for encoders that walk them directly."""
        return self._columns

    @property
    def trajectory(self) -> FlatTrajectory:
        """The flat trajectory: a `Column` of `ChunkSlice`s per column."""
        return tuple(Column(tuple(ChunkSlice(col[j].key, col[j + 2], col[j + 3] - col[j + 2], col[j + 1])
                                  for j in range(1, len(col), 4)), col[0])
                     for col in self._columns)

    @property
    def chunks(self) -> dict:
        """Chunk key -> `Chunk`, for every chunk the item refers to."""
        return {col[j].key: col[j] for col in self._columns for j in range(1, len(col), 4)}

    def _validate(self, trajectory: FlatTrajectory, chunks: dict) -> None:
        if not trajectory:
            raise ValueError(f"item {self.key}: the trajectory must not be empty")
        used = set()
        for i, column in enumerate(trajectory):
            if not column.slices:
                raise ValueError(f"item {self.key}: column {i} has no chunk slices")
            if column.squeeze and (len(column.slices) != 1 or column.slices[0].length != 1):
                raise ValueError(f"item {self.key}: column {i} is squeezed, so it must be exactly one slice of "
                                 f"length 1, got {[tuple(s) for s in column.slices]}")
            for s in column.slices:
                chunk = chunks.get(s.chunk_key)
                if chunk is None:
                    raise KeyError(f"Could not find sequence chunk {s.chunk_key}.")
                used.add(s.chunk_key)
                if s.offset < 0 or s.length < 1 or s.offset + s.length > chunk.num_rows:
                    raise ValueError(f"item {self.key}: slice {tuple(s)} of column {i} is out of chunk "
                                     f"{s.chunk_key}'s rows [0, {chunk.num_rows})")
                if not 0 <= s.index < len(chunk.tensors):
                    raise ValueError(f"item {self.key}: slice {tuple(s)} of column {i} refers to tensor {s.index} "
                                     f"but chunk {s.chunk_key} has {len(chunk.tensors)}")
        if used != set(chunks):
            raise ValueError(f"item {self.key}: chunks {sorted(set(chunks) - used)} are not referenced by "
                             f"the trajectory")

    def same_data(self, other: "Item") -> bool:
        """Whether `other` has this item's key and trajectory over the same chunk data (priority aside): the
        same item sent again, e.g. by a writer that re-sends its unconfirmed items after a reconnect."""
        if other is self:
            return True
        if other.key != self.key or len(other._columns) != len(self._columns):
            return False
        for mine, theirs in zip(self._columns, other._columns):
            if len(mine) != len(theirs) or mine[0] != theirs[0]:
                return False
            for j in range(1, len(mine), 4):
                if mine[j + 1:j + 4] != theirs[j + 1:j + 4] or not same_chunk(mine[j], theirs[j]):
                    return False
        return True

    @property
    def episode_ids(self) -> frozenset:
        if self._episode_ids is None:
            self._episode_ids = frozenset(col[j].sequence_range.episode_id for col in self._columns
                                          for j in range(1, len(col), 4))
        return self._episode_ids

    def column_arrays(self) -> list:
        """The item's columns as numpy arrays (views when a column is one slice)."""
        out = []
        for col in self._columns:
            if len(col) == 5:
                tensor = col[1].tensors[col[2]]
                out.append(tensor[col[3]] if col[0] else tensor[col[3]:col[4]])
            else:
                out.append(np.concatenate([col[j].tensors[col[j + 1]][col[j + 2]:col[j + 3]]
                                           for j in range(1, len(col), 4)], axis=0))
        return out

    def column_shapes(self) -> list:
        """`(dtype, shape)` of each column without copying data."""
        out = []
        for col in self._columns:
            first = col[1].tensors[col[2]]
            rows = sum(col[j + 3] - col[j + 2] for j in range(1, len(col), 4))
            out.append((first.dtype, tuple(first.shape[1:]) if col[0] else (rows, *first.shape[1:])))
        return out

    def __repr__(self) -> str:
        return (f"Item(key={self.key}, priority={self.priority}, times_sampled={self.times_sampled}, "
                f"columns={len(self._columns)})")
