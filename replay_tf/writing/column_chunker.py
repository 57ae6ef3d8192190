"""Per-column chunking shared by the writers: values of one column appended to its current `Chunk`.

A `ColumnChunker` fixes its column's dtype and shape from the first value, appends rows to the current
chunk (open in-process, or finalized at `max_chunk_length` rows for remote servers) and hands out
`CellRef`s (chunk, row) that `TrajectoryWriter` and `StructuredWriter` turn into items.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from replay_tf.core.chunk_store import Chunk, SequenceRange, new_key

# In-process chunks: at most this many bytes (and rows) per chunk, so long items are mostly one slice.
_OPEN_CHUNK_MAX_BYTES = 4 << 20
_OPEN_CHUNK_MAX_ROWS = 1024
# Remote chunks: the fixed cost of one chunk, in bytes of step data (see `remote_chunk_length`).
_CHUNK_OVERHEAD_BYTES = 4096


def remote_chunk_length(row_bytes: int, num_keep_alive_refs: int) -> int:
    """The chunk length of a column sent to a remote server when none is configured.

    A sample carries every chunk its item touches, whole: an item of L steps over chunks of c steps moves
    about (L - 1 + c) steps' bytes, while each chunk also costs a fixed overhead (a message part, headers,
    one compression call), about `_CHUNK_OVERHEAD_BYTES`. Per step that is row_bytes * (L + c) + overhead / c,
    smallest at c = sqrt(overhead / row_bytes), capped at `num_keep_alive_refs` as Reverb caps its
    auto-tuned length. This lands where dm-reverb 0.14's auto-tuner settles: one step per chunk for large
    steps (an Atari frame), `num_keep_alive_refs` steps for small ones (a few floats).
    """
    best = round(math.sqrt(_CHUNK_OVERHEAD_BYTES / max(1, row_bytes)))
    return int(min(max(1, num_keep_alive_refs), max(1, best)))


# numpy dtype names that TensorFlow's C++ `DataTypeString` (in Reverb's messages) spells differently.
_CPP_DTYPE_NAMES = {"float16": "half", "float32": "float", "float64": "double"}


def cpp_dtype_name(dtype: np.dtype) -> str:
    """`dtype` as Reverb's error messages name it (TensorFlow's C++ names: `float`, `double`, `int32`)."""
    if dtype.kind in "OSU":
        return "string"
    return _CPP_DTYPE_NAMES.get(dtype.name, dtype.name)


def cpp_shape(shape: tuple) -> str:
    """`shape` as Reverb's error messages print it (TensorFlow's C++ `TensorShape::DebugString`: `[1,2]`)."""
    return f"[{','.join(str(d) for d in shape)}]"


def with_hint(error: Exception, hint: str) -> Exception:
    """`error` with `hint` attached as a note: tracebacks show it after the message, while `str(error)` stays
    Reverb's text, which Reverb's own tests compare exactly. (Python 3.10 has no notes: the hint is dropped.)"""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(hint)
    return error


class CellRef:
    """A reference to one step of one column: row `row` of `chunk`."""

    __slots__ = ("column", "chunk", "row", "seq")

    def __init__(self, column: "ColumnChunker", chunk: Chunk, row: int, seq: int):
        self.column = column
        self.chunk = chunk
        self.row = row
        self.seq = seq

    @property
    def expired(self) -> bool:
        return self.seq < self.column.oldest_live_seq

    @property
    def shape(self) -> tuple:
        return self.column.shape

    @property
    def dtype(self) -> np.dtype:
        return self.column.dtype

    def numpy(self) -> np.ndarray:
        return np.array(self.chunk.tensors[0][self.row])

    def __repr__(self) -> str:
        return f"CellRef(column={self.column.path}, step={self.seq}, expired={self.expired})"


class ColumnChunker:
    """Appends one column's values to its current chunk and hands out references to them."""

    def __init__(self, path: str, first_value: np.ndarray, num_keep_alive_refs: int,
                 max_chunk_length: Optional[int], open_chunks: bool, delta_encoded: bool = False, *,
                 label: Optional[str] = None):
        self.path = path
        self.label = path if label is None else label  # the column as errors name it (each writer as Reverb's)
        self.delta_encoded = delta_encoded  # (how remote chunks are encoded: Reverb's delta encoding)
        self.dtype = first_value.dtype
        self.shape = tuple(first_value.shape)
        self.num_keep_alive_refs = num_keep_alive_refs
        self.open_chunks = open_chunks
        self.max_chunk_length = self._chunk_length(max_chunk_length)
        self.appended = 0          # values appended so far (the next value's `seq`)
        self.chunk: Optional[Chunk] = None
        self._array: Optional[np.ndarray] = None
        self._rows = 0
        self._start_step = 0
        self._last_step = -1
        self._sparse = False

    def _chunk_length(self, max_chunk_length: Optional[int]) -> int:
        if max_chunk_length is not None:
            return max_chunk_length
        row_bytes = max(1, int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize)
        if not self.open_chunks:
            return remote_chunk_length(row_bytes, self.num_keep_alive_refs)
        return int(min(_OPEN_CHUNK_MAX_ROWS, max(self.num_keep_alive_refs, _OPEN_CHUNK_MAX_BYTES // row_bytes)))

    @property
    def oldest_live_seq(self) -> int:
        """The `seq` of the oldest value an item may still refer to (references to older ones are expired)."""
        return self.appended - self.num_keep_alive_refs

    def configure(self, num_keep_alive_refs: int, max_chunk_length: Optional[int]) -> None:
        self.finalize()
        self.num_keep_alive_refs = num_keep_alive_refs
        self.max_chunk_length = self._chunk_length(max_chunk_length)

    def check(self, value: np.ndarray) -> None:
        """ValueError unless `value` has the column's dtype and shape (fixed by its first value), with Reverb's
        text for the same error and what to fix as a note."""
        if value.dtype != self.dtype:
            raise with_hint(ValueError(
                f"Tensor of wrong dtype provided for column {self.label}. Got {cpp_dtype_name(value.dtype)} but "
                f"expected {cpp_dtype_name(self.dtype)}."),
                f"The column {self.path} holds numpy {self.dtype.name} since its first value; got "
                f"{value.dtype.name}: convert the value to {self.dtype.name}.")
        if value.shape != self.shape:
            raise with_hint(ValueError(
                f"Tensor of incompatible shape provided for column {self.label}. Got {cpp_shape(value.shape)} "
                f"which is incompatible with {cpp_shape(self.shape)}."),
                f"The column {self.path} holds values of shape {self.shape} since its first value.")

    def append(self, value: np.ndarray, episode_id: int, step: int) -> CellRef:
        if self.chunk is None:
            # np.empty of a large block is lazily backed by the OS, so unused rows cost no memory.
            self._array = np.empty((self.max_chunk_length, *self.shape), dtype=self.dtype)
            self._rows = 0
            self._start_step = step
            self._sparse = False
            self.chunk = Chunk(new_key(), [self._array], SequenceRange(episode_id, step, step),
                               delta_encoded=self.delta_encoded)
        elif step != self._last_step + 1:
            self._sparse = True  # the column skipped steps: the chunk's rows are not contiguous steps
        chunk, row = self.chunk, self._rows
        self._array[row, ...] = value  # (`[row]` would store a 0-d object array as one element)
        self._rows = row + 1
        self._last_step = step
        if self.open_chunks:  # a remote chunk is only read once final: `finalize` sets its range
            chunk.sequence_range = SequenceRange(episode_id, self._start_step, step, self._sparse)
        ref = CellRef(self, chunk, row, self.appended)
        self.appended += 1
        if self._rows == self.max_chunk_length:
            self.finalize()
        return ref

    def finalize(self) -> Optional[Chunk]:
        """Closes the current chunk (trimming unused rows); returns it, or None if there was none."""
        chunk = self.chunk
        if chunk is None:
            return None
        if self._rows < len(self._array):
            chunk.tensors = [self._array[:self._rows].copy()]
        if not self.open_chunks:
            chunk.sequence_range = SequenceRange(chunk.sequence_range.episode_id, self._start_step,
                                                 self._last_step, self._sparse)
        self.chunk = None
        self._array = None
        return chunk
