"""The columns of a `TrajectoryWriter`: each column's history (`writer.history[path]`) and the
`TrajectoryColumn`s taken from it to make items.

A history keeps references to the last `num_keep_alive_refs` values of its column and is indexed as if it
kept them all: older positions read as `None`, which `TrajectoryColumn` rejects ("expired"). Reverb's
messages name the history class `_ColumnHistory`, and so do these.
"""
from __future__ import annotations

import itertools
from typing import Dict, Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from replay_tf.writing.column_chunker import CellRef
from rlds_tf.nests import format_path


class HistoryIndexError(IndexError, ValueError):
    """An index of `writer.history[...]` outside the column's history.

    dm-reverb raises `IndexError` for indices past the end and `ValueError` (a `None` reference) for ones
    before the start; this error is both, so either `except` clause catches it.
    """


class ColumnHistory:
    """The last `buffer_size` references of a column, indexed as if the whole history were kept.

    `live_chunks` (shared by a writer's columns) counts the references each chunk has in the histories,
    by chunk key: the chunks a later item can still use.
    """

    def __init__(self, path: tuple, buffer_size: int, history_padding: int, live_chunks: Dict[int, int]):
        self._path = path
        self._buffer_size = buffer_size
        self._refs: list = [None] * min(buffer_size, history_padding)
        self._offset = history_padding - len(self._refs)  # positions before `_refs[0]` (all expired)
        self._live = live_chunks

    def path(self) -> tuple:
        return self._path

    def append(self, ref: Optional[CellRef]) -> None:
        self._refs.append(ref)
        if ref is not None:
            self._hold(ref)
        if len(self._refs) > self._buffer_size:
            self._drop_first()

    def _hold(self, ref: CellRef) -> None:
        key = ref.chunk.key
        self._live[key] = self._live.get(key, 0) + 1

    def _drop_first(self) -> None:
        ref = self._refs.pop(0)
        self._offset += 1
        if ref is not None:  # (release what `_hold` counted)
            key = ref.chunk.key
            count = self._live[key] - 1
            if count:
                self._live[key] = count
            else:
                del self._live[key]

    def set_last(self, ref: CellRef) -> None:
        self._refs[-1] = ref  # (replaces a None: see `can_set_last`)
        self._hold(ref)

    @property
    def can_set_last(self) -> bool:
        return bool(self._refs) and self._refs[-1] is None

    def reset(self) -> None:
        while self._refs:
            self._drop_first()
        self._offset = 0

    def set_buffer_size(self, buffer_size: int) -> None:
        self._buffer_size = buffer_size
        while len(self._refs) > buffer_size:
            self._drop_first()

    def _index(self, val: int) -> Optional[CellRef]:
        """Position `val` (negative from the end); None once it dropped out of the buffer."""
        length = len(self)
        index = val - length if val >= 0 else val  # counted from the end: -1 is the last step
        if index >= 0 or index < -length:
            column = format_path(self._path, notation="subscripts")
            raise HistoryIndexError(f"history index {val} is out of range for column {column} of length {length}: "
                                    f"use an index in [{-length}, {length})")
        return None if index < -len(self._refs) else self._refs[index]

    def _slice(self, val: slice):
        """Reverb's semantics: `[:]` covers the whole history (None for dropped steps); other slices are
        taken relative to the end, and only slices with a start are padded with None for dropped steps."""
        if val.start is None and val.stop is None:
            return list(iter(self))[val]
        n = len(self)
        start = val.start - n if val.start is not None and val.start >= 0 else val.start
        stop = val.stop - n if val.stop is not None and val.stop > 0 else val.stop
        if start is None:
            if -n < stop < -len(self._refs):
                return [None]
            return self._refs[slice(None, stop, val.step)]
        overflow = abs(start) - len(self._refs)  # requested positions older than the buffer
        return [None] * max(0, overflow) + self._refs[slice(start, stop, val.step)]

    def __len__(self) -> int:
        return len(self._refs) + self._offset

    def __iter__(self) -> Iterator[Optional[CellRef]]:
        yield from itertools.repeat(None, self._offset)
        yield from self._refs

    def __getitem__(self, val) -> "TrajectoryColumn":
        if type(val) is slice and val.stop is None and val.step is None and val.start is not None:
            start = val.start
            if -len(self._refs) <= start < 0:  # the usual `history[col][-n:]`: the last n refs, all kept
                return TrajectoryColumn(self._refs[start:], path=self._path + (val,))
        path = self._path + (val,) if not isinstance(val, list) else self._path + (tuple(val),)
        if isinstance(val, (int, np.integer)):
            return TrajectoryColumn([self._index(int(val))], squeeze=True, path=path)
        if isinstance(val, slice):
            return TrajectoryColumn(self._slice(val), path=path)
        if isinstance(val, list):
            return TrajectoryColumn([self._index(int(i)) for i in val], path=path)
        raise TypeError(f"_ColumnHistory indices must be integers or slices, not {type(val)}")

    def __repr__(self) -> str:
        return f"_ColumnHistory(path={self._path}, length={len(self)})"


class TrajectoryColumn:
    """A column of an item: references to steps of one writer column, optionally squeezed."""

    def __init__(self, data_references: Sequence[CellRef], *, squeeze: bool = False,
                 path: Optional[Tuple[Union[str, int, slice], ...]] = None):
        if squeeze and len(data_references) != 1:
            raise ValueError(f"Columns must contain exactly one data reference when squeeze set, got "
                             f"{len(data_references)}")
        if None in data_references:
            raise ValueError(f"TrajectoryColumns cannot contain any None data references: TrajectoryColumn at "
                             f"path {path} got {list(data_references)} (a None is a step where the column was "
                             f"not set, or older than num_keep_alive_refs)")
        self._data_references = tuple(data_references)
        self.is_squeezed = squeeze
        self._path = path

    def __len__(self) -> int:
        return len(self._data_references)

    def __iter__(self) -> Iterator[CellRef]:
        return iter(self._data_references)

    def __getitem__(self, val) -> "TrajectoryColumn":
        if isinstance(val, (int, np.integer)):
            return TrajectoryColumn([self._data_references[val]], squeeze=True)
        if isinstance(val, slice):
            return TrajectoryColumn(self._data_references[val])
        if isinstance(val, list):
            return TrajectoryColumn([self._data_references[x] for x in val])
        raise TypeError(f"TrajectoryColumn indices must be integers or slices, not {type(val)}")

    @property
    def shape(self) -> tuple:
        if self.is_squeezed:
            return tuple(self._data_references[0].shape)
        return (len(self._data_references), *self._data_references[0].shape)

    @property
    def data_references(self) -> tuple:
        """The references, in order (what `TrajectoryWriter.create_item` reads)."""
        return self._data_references

    @property
    def dtype(self) -> np.dtype:
        return self._data_references[0].dtype

    def numpy(self) -> np.ndarray:
        """The referenced data, stacked (or the single value when squeezed)."""
        if any(ref.expired for ref in self._data_references):
            raise RuntimeError(f"Cannot create numpy array for TrajectoryColumn at path {self._path}: it "
                               f"references expired data (older than num_keep_alive_refs)")
        if self.is_squeezed:
            return self._data_references[0].numpy()
        return np.stack([ref.numpy() for ref in self._data_references])

    def __repr__(self) -> str:
        return f"TrajectoryColumn(path={self._path}, length={len(self)}, squeeze={self.is_squeezed})"
