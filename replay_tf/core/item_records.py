"""The rules an item must meet to enter a table, one set for every way in: an insert stream's items, a
checkpoint's item records and an in-process writer's items.

`item_from_record` builds a table's item from the fields a client (or a checkpoint) sends (key, priority,
times_sampled, and columns of chunk slices) over chunks known by their headers only (`ChunkLayout`), nothing
decoded; `check_item` applies the same rules to an item of decoded chunks (in-process inserts). An insert path
and the restore of what it inserted therefore accept the same records: a checkpoint never holds an item its
restore refuses.

The rules: a priority the table accepts (`Table.check_priority`); `times_sampled >= 0`; a non-empty trajectory
whose columns each have slices, within their chunk's rows and tensors, of one dtype and step shape; a squeezed
column is one slice of one row; the columns match the table's signature (`Table.check_column_layout`); and the
item decodes to at most `max_item_bytes`, each slice counted as many times as the item names it (an item may
name one chunk row any number of times, and every sampler of it would allocate each copy). String elements
count `string_element_bytes` each, plus the bytes of the strings themselves.

The limits are arguments: the core knows nothing of the wire, whose `replay_tf.wire.limits` holds their values.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Optional

import numpy as np

from replay_tf.core.chunk_store import Chunk
from replay_tf.core.chunk_store import Item

__all__ = [
    "ChunkLayout",
    "ItemTooLargeError",
    "MissingChunkError",
    "check_item",
    "check_times_sampled",
    "item_from_record",
]


_MAX_CHECKED_LAYOUTS = 4096  # column layouts a `checked` set keeps before it starts again


class MissingChunkError(LookupError):
    """An item names a chunk that is not at hand (`chunk_key`)."""

    def __init__(self, chunk_key: int):
        super().__init__(f"Could not find sequence chunk {chunk_key}.")
        self.chunk_key = chunk_key


class ItemTooLargeError(ValueError):
    """An item would decode to more than the limit on one item's bytes."""


class ChunkLayout:
    """What the item rules read of a chunk known by its headers: each tensor's `(dtype, step shape, bytes of one
    row)` (string elements counted at `string_element_bytes`), and on demand the bytes of the strings of each row
    of a string tensor (`read_string_lengths(chunk, index)`: the length of every string, rows first)."""

    __slots__ = ("chunk", "steps", "_read_string_lengths", "_string_rows")

    def __init__(self, chunk: Chunk, headers: list, string_element_bytes: int,
                 read_string_lengths: Optional[Callable] = None):
        self.chunk = chunk
        steps = []
        for dtype, shape in headers:  # (numpy dtype, shape with the rows first)
            step = tuple(shape[1:])
            size = string_element_bytes if dtype.kind == "O" else dtype.itemsize
            steps.append((dtype, step, size * math.prod(step)))
        self.steps = steps
        self._read_string_lengths = read_string_lengths
        self._string_rows: dict = {}  # tensor index -> cumulative bytes of its rows' strings

    def string_bytes(self, index: int, start: int, stop: int) -> int:
        """The bytes of the strings in rows `[start, stop)` of string tensor `index`."""
        rows = self._string_rows.get(index)
        if rows is None:
            lengths = self._read_string_lengths(self.chunk, index)
            per_row = lengths.reshape(self.chunk.num_rows, -1).sum(axis=1) if len(lengths) else lengths
            rows = self._string_rows[index] = np.concatenate(([0], np.cumsum(per_row, dtype=np.int64)))
        return int(rows[stop] - rows[start])


def check_times_sampled(key: int, times_sampled: int) -> None:
    """ValueError for a negative `times_sampled` (a table's count of an item's samples)."""
    if times_sampled < 0:
        raise ValueError(f"times_sampled ({times_sampled}) of item {key} must be >= 0")


def _check_size(table, key: int, nbytes: int, max_item_bytes: int) -> None:
    if nbytes > max_item_bytes:
        raise ItemTooLargeError(
            f"item {key} for table '{table.name}' decodes to {nbytes} bytes (each chunk slice counted as often as "
            f"the item names it), over replay_tf.wire.limits.MAX_ITEM_BYTES ({max_item_bytes}): an item names "
            f"each step it holds once; for larger items raise the limit in the server's and the clients' "
            f"processes")


def item_from_record(table, key: int, priority: float, times_sampled: int, columns: Iterable[tuple],
                     layout_of: Callable[[int], Optional[ChunkLayout]], *, max_item_bytes: int,
                     checked: Optional[set] = None) -> Item:
    """The item of `table` that a record describes, checked by this module's rules (nothing is decoded).

    Args:
      table: The `Table` the item is for (its priority and signature rules apply).
      key, priority, times_sampled: The record's fields.
      columns: `(squeeze, slices)` per column; each slice has `chunk_key`, `offset`, `length` and `index` (a
        `FlatTrajectory.Column`'s fields, or a core `Column`'s).
      layout_of: Chunk key -> its `ChunkLayout`, or None when the chunk is not at hand.
      max_item_bytes: The most bytes the item may decode to.
      checked: Column layouts known to match the table's signature; the signature check is skipped for them
        (the item's layout joins them once checked).

    Raises:
      MissingChunkError: a slice names a chunk `layout_of` does not know.
      ItemTooLargeError: the item decodes to more than `max_item_bytes`.
      ValueError: any other rule broken, naming the item, the column and the slice.
    """
    table.check_priority(key, priority)
    check_times_sampled(key, times_sampled)
    resolved, layout, episode_ids = [], [], set()
    nbytes = 0
    for i, (squeeze, slices) in enumerate(columns):
        if not slices:
            raise ValueError(f"item {key}: column {i} has no chunk slices")
        if squeeze and (len(slices) != 1 or slices[0].length != 1):
            raise ValueError(f"item {key}: column {i} is squeezed, so it must be exactly one slice of length 1, "
                             f"got {len(slices)} slices")
        flat = [squeeze]
        dtype = step = None
        rows = 0
        for s in slices:
            chunk_key, offset, length, index = s.chunk_key, s.offset, s.length, s.index
            found = layout_of(chunk_key)
            if found is None:
                raise MissingChunkError(chunk_key)
            chunk = found.chunk
            num_rows = chunk.num_rows
            if offset < 0 or length < 1 or offset + length > num_rows:
                raise ValueError(f"item {key}: slice {(chunk_key, offset, length, index)} of column {i} is out of "
                                 f"chunk {chunk_key}'s rows [0, {num_rows})")
            steps = found.steps
            if not 0 <= index < len(steps):
                raise ValueError(f"item {key}: column {i} refers to tensor {index} of chunk {chunk_key}, which "
                                 f"has {len(steps)} tensors")
            got_dtype, got_step, row_bytes = steps[index]
            if dtype is None:
                dtype, step = got_dtype, got_step
            elif got_step != step or (got_dtype is not dtype and got_dtype != dtype):
                raise ValueError(f"item {key}: column {i} joins slices of different dtypes or shapes: "
                                 f"{dtype.name}{list(step)} and {got_dtype.name}{list(got_step)}")
            nbytes += length * row_bytes
            if got_dtype.kind == "O":
                nbytes += found.string_bytes(index, offset, offset + length)
            rows += length
            flat += (chunk, index, offset, offset + length)
            episode_ids.add(chunk.sequence_range.episode_id)
        resolved.append(tuple(flat))
        layout.append((dtype, step if squeeze else (rows, *step)))
    if not resolved:
        raise ValueError(f"item {key} for table '{table.name}': the trajectory must not be empty")
    _check_size(table, key, nbytes, max_item_bytes)
    signature_key = (table.name, *layout)
    if checked is None or signature_key not in checked:
        table.check_column_layout(key, layout)
        if checked is not None:
            if len(checked) >= _MAX_CHECKED_LAYOUTS:
                checked.clear()
            checked.add(signature_key)
    item = Item.from_resolved(key, priority, tuple(resolved), frozenset(episode_ids))
    item.times_sampled = times_sampled
    return item


def _string_size(value) -> int:
    """The bytes of one element of a string tensor as it is written (str as UTF-8)."""
    if isinstance(value, np.ndarray):  # a 0-d array stored as an element of an object array
        value = value.item()
    return len(value.encode()) if isinstance(value, str) else len(value)


def check_item(table, item: Item, *, max_item_bytes: int, string_element_bytes: int) -> None:
    """This module's rules on `item`, whose chunks hold decoded tensors (an in-process writer's): its priority,
    `times_sampled`, and its decoded size (the trajectory's bounds are checked when an `Item` is made, the
    signature by the writers that validate items)."""
    table.check_priority(item.key, item.priority)
    check_times_sampled(item.key, item.times_sampled)
    nbytes = 0
    for column in item.resolved_columns:
        for j in range(1, len(column), 4):
            tensor = column[j].tensors[column[j + 1]]
            start, stop = column[j + 2], column[j + 3]
            step = math.prod(tensor.shape[1:])
            if tensor.dtype.kind == "O":
                nbytes += (stop - start) * step * string_element_bytes
                nbytes += sum(map(_string_size, tensor[start:stop].reshape(-1)))
            else:
                nbytes += (stop - start) * step * tensor.dtype.itemsize
    _check_size(table, item.key, nbytes, max_item_bytes)
