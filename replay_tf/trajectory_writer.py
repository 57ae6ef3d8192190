"""`TrajectoryWriter`: Reverb's column-wise writer. Steps go into per-column chunks; items reference them.

Every leaf path of the appended data is a *column* with its own chunker: a `Chunk` holding one tensor whose
rows are that column's consecutive steps in the episode. The column's dtype and shape are fixed by its first
value. `history[path]` (`replay_tf.writing.columns`) keeps references to the last `num_keep_alive_refs` values
of each column (older ones read as `None`, which `TrajectoryColumn` rejects: "expired"). `create_item` turns
columns of references into a flat trajectory of chunk slices (adjacent rows of one chunk merged into one
slice).

With the in-process transport, chunks are *open*: rows are appended in place and items are inserted at
once, referring to rows already written. With a remote transport (`supports_open_chunks=False`), a chunk is
finalized when it reaches `max_chunk_length` rows, at `end_episode`, or when `flush` needs it, and items are
sent once every chunk they use is final, as Reverb's writer does.

Delivery is asynchronous, as in Reverb: `create_item` never blocks. In process, an item the rate limiter
refuses waits in the table's insert queue, whose worker thread inserts it as soon as the table admits it
(a stream's items into one table keep their order). A remote stream that loses its server (UNAVAILABLE,
e.g. a restart at the same address) reconnects and re-sends the items the server has not confirmed, with
their chunks (at-least-once, keyed: see `replay_tf.grpc.client.insert_stream.InsertStream`). `flush` and
`end_episode` wait for the items; `close` drops those still waiting.

>>> import replay_tf as reverb
>>> server = reverb.Server([reverb.Table.queue('q', 10)])
>>> client = reverb.Client(f'localhost:{server.port}')
>>> with client.trajectory_writer(num_keep_alive_refs=2) as writer:
...   writer.append({'x': 1.0})
...   writer.append({'x': 2.0})
...   writer.create_item('q', priority=1.0, trajectory={'x': writer.history['x'][-2:]})
>>> next(client.sample('q', emit_timesteps=False)).data[0].tolist()
[1.0, 2.0]
>>> server.stop()
"""
from __future__ import annotations

import collections
import datetime
import itertools
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import tree

from replay_tf import errors
from replay_tf.writing.context import FlushOnExitCloseOnDelete
from replay_tf.writing.column_chunker import CellRef, ColumnChunker
from replay_tf.writing.columns import ColumnHistory
from replay_tf.writing.columns import HistoryIndexError  # noqa: F401  (a public name of this module)
from replay_tf.writing.columns import TrajectoryColumn
from replay_tf.writing.leaves import flat_dict_keys, leaf_array
from replay_tf.core.chunk_store import Chunk, Item, new_key
from replay_tf.core.signatures import shape_compatible, signature_entries
from rlds_tf.nests import format_path


def _tree_union(a: Any, b: Any) -> Any:
    """The union of two structures of `None` leaves (new dict keys and longer sequences added)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        merged = dict(a)
        for key, value in b.items():
            merged[key] = _tree_union(a.get(key), value)
        return type(a)(merged) if not isinstance(a, collections.OrderedDict) else collections.OrderedDict(merged)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
        values = [_tree_union(x, y) for x, y in itertools.zip_longest(longer, shorter)]
        if hasattr(longer, "_fields"):
            return type(longer)(*values)
        return type(longer)(values)
    raise ValueError(f"Cannot merge the appended structure {b} into the earlier structure {a}")


def _column_count_error(table: str, entries: list, trajectory: Any, count: int) -> ValueError:
    """The error for a trajectory of `count` columns where the table's signature (`entries`) has another
    number, naming the columns that one has and the other lacks when the trajectory's paths say it."""
    expected = [entry[0] for entry in entries]
    got = [format_path(path) for path, _ in tree.flatten_with_path(trajectory)]
    missing = [path for path in expected if path not in got]
    unknown = [path for path in got if path not in expected]
    def names(paths):
        return f"column{'s' if len(paths) > 1 else ''} {', '.join(repr(p) for p in paths)}"

    if missing and len(missing) < len(expected):  # the paths name columns: say which
        detail = f"the trajectory has no {names(missing)}; "
    elif unknown and len(unknown) < len(got):
        detail = f"the table's signature has no {names(unknown)}; "
    else:
        detail = ""
    return ValueError(f"Unable to create item in table '{table}' since the provided trajectory is inconsistent "
                      f"with the table signature: {detail}the table expects {len(expected)} columns {expected} "
                      f"but the trajectory has {count}: {got}")


class TrajectoryWriter(FlushOnExitCloseOnDelete):
    """Reverb's `TrajectoryWriter` (create with `Client.trajectory_writer`).

    Args:
      stream: An insert stream of the client's transport (`replay_tf.transport.base.InsertStream`).
      num_keep_alive_refs: How many recent steps of each column items may refer to.
      table_infos: Table name -> `TableInfo` used to validate items (None: no validation).
      delta_encoded: (an addition, for the legacy `Writer`) delta-encode the chunks' integer tensors of
        rank >= 2 on the wire, as Reverb's `Client.writer(delta_encoded=True)`.
    """

    def __init__(self, stream, *, num_keep_alive_refs: int, table_infos: Optional[Dict[str, Any]] = None,
                 delta_encoded: bool = False):
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive integer")
        self._stream = stream
        self._open_chunks = bool(getattr(stream, "supports_open_chunks", False))
        self._num_keep_alive_refs = num_keep_alive_refs
        self._table_infos = table_infos
        self._delta_encoded = delta_encoded
        self._signature_entries: Dict[str, Any] = {}
        self._structure = None
        self._path_to_index: Dict[tuple, int] = {}
        self._paths: List[tuple] = []
        self._chunkers: List[Optional[ColumnChunker]] = []
        self._column_history: List[ColumnHistory] = []
        self._column_config: Dict[tuple, Tuple[int, Optional[int]]] = {}
        self._order_cache: Dict[tuple, list] = {}
        self._history_cache = None
        self._last_step_is_open = False
        self._episode_id = new_key()
        self._episode_steps = 0
        self._episode_ids_cache: Dict[frozenset, frozenset] = {}
        self._unsent: collections.deque = collections.deque()  # (table, item, live) waiting for final chunks
        # Chunk key -> references in the column histories: the chunks later items can still use. Each item
        # is sent with the keys as they were when it was created (see `InsertStream.send`).
        self._live_chunks: Dict[int, int] = {}
        self._closed = False

    # --- properties ---

    @property
    def history(self):
        """References to the recent data, structured like the appended data (`history['obs'][-3:]`)."""
        if not self._column_history:
            raise RuntimeError("history cannot be accessed before `append` is called at least once.")
        if self._history_cache is None:
            by_path = {path: self._column_history[i] for path, i in self._path_to_index.items()}
            flat = [by_path[path] for path, _ in tree.flatten_with_path(self._structure)]
            self._history_cache = tree.unflatten_as(self._structure, flat)
        return self._history_cache

    @property
    def episode_steps(self) -> int:
        """Number of (non-partial) `append` calls since the last `end_episode`."""
        return self._episode_steps

    # --- configuration ---

    def configure(self, path: Tuple[Union[int, str], ...], *, num_keep_alive_refs: int,
                  max_chunk_length: Optional[int]) -> None:
        """Overrides `num_keep_alive_refs` and the chunk length of the column at `path`."""
        if self._closed:
            self._raise_closed()
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive integer")
        if max_chunk_length is not None and (max_chunk_length < 1 or max_chunk_length > num_keep_alive_refs):
            raise ValueError(f"max_chunk_length ({max_chunk_length}) must be None or a positive integer <= "
                             f"num_keep_alive_refs ({num_keep_alive_refs})")
        path = tuple(path)
        self._column_config[path] = (num_keep_alive_refs, max_chunk_length)
        index = self._path_to_index.get(path)
        if index is not None:
            self._column_history[index].set_buffer_size(num_keep_alive_refs)
            chunker = self._chunkers[index]
            if chunker is not None:
                self._on_finalized(chunker.finalize())
                chunker.configure(num_keep_alive_refs, max_chunk_length)

    # --- appending ---

    def _update_structure(self, structure: Any) -> None:
        self._structure = structure
        history_padding = len(self._column_history[0]) if self._column_history else 0
        for path, _ in tree.flatten_with_path(structure):
            if path not in self._path_to_index:
                self._path_to_index[path] = len(self._paths)
                self._paths.append(path)
                self._chunkers.append(None)
                buffer_size = self._column_config.get(path, (self._num_keep_alive_refs, None))[0]
                self._column_history.append(ColumnHistory(path, buffer_size, history_padding, self._live_chunks))
        self._order_cache.clear()
        self._history_cache = None

    def _column_order(self, paths: tuple) -> list:
        order = self._order_cache.get(paths)
        if order is None:
            order = [self._path_to_index[p] for p in paths]  # KeyError for a new path
            self._order_cache[paths] = order
        return order

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Appends a step (or, with `partial_step=True`, part of one) column by column."""
        if self._closed:
            self._raise_closed()
        if self._structure is None:
            self._update_structure(tree.map_structure(lambda _: None, data))
        keys = flat_dict_keys(data)
        order = self._order_cache.get(keys) if keys is not None else None
        if order is not None:  # fast path: a flat dict with keys seen before
            leaves = [data[k] for k in keys]
        else:
            with_path = tree.flatten_with_path(data)
            paths = tuple(p for p, _ in with_path)
            try:
                order = self._column_order(paths)
            except KeyError:
                self._update_structure(_tree_union(self._structure, tree.map_structure(lambda _: None, data)))
                order = self._column_order(paths)
            if keys is not None:
                self._order_cache[keys] = order
            leaves = [value for _, value in with_path]
        values: list = [None] * len(self._paths)
        for index, value in zip(order, leaves):
            values[index] = value
        histories = self._column_history
        if self._last_step_is_open:
            for index, value in enumerate(values):
                if value is not None and not histories[index].can_set_last:
                    raise ValueError(f"Field {self._paths[index]} has already been set in the active step by "
                                     f"previous (partial) append call and thus must be omitted or set to None but "
                                     f"got: {value}")
        # Validate every value before appending any, so a bad step leaves the writer unchanged (new columns'
        # chunkers, which fix their dtype and shape, are kept only once the whole step is valid).
        arrays: list = [None] * len(values)
        new_chunkers: Optional[list] = None  # (index, chunker) of the step's new columns
        for index, value in enumerate(values):
            if value is None:
                continue
            array = leaf_array(value, self._paths[index], "the appended step", none_ok=True)
            chunker = self._chunkers[index]
            if chunker is None:
                num_keep_alive, max_chunk_length = self._column_config.get(
                    self._paths[index], (self._num_keep_alive_refs, None))
                chunker = ColumnChunker(format_path(self._paths[index], notation="subscripts"), array, num_keep_alive,
                                        max_chunk_length, self._open_chunks, self._delta_encoded,
                                        label=repr(tuple(self._paths[index])))  # Reverb's `column ('b', 'c')`
                if new_chunkers is None:
                    new_chunkers = []
                new_chunkers.append((index, chunker))
            else:
                chunker.check(array)
            arrays[index] = array
        if new_chunkers:
            for index, chunker in new_chunkers:
                self._chunkers[index] = chunker
        step = self._episode_steps
        for index, array in enumerate(arrays):
            ref = None
            if array is not None:
                chunker = self._chunkers[index]
                ref = chunker.append(array, self._episode_id, step)
                if chunker.chunk is None and self._unsent:  # the append filled (and finalized) the chunk
                    self._on_finalized(ref.chunk)
            if not self._last_step_is_open:
                histories[index].append(ref)
            elif ref is not None:
                histories[index].set_last(ref)
        self._last_step_is_open = partial_step
        if not partial_step:
            self._episode_steps += 1

    # --- items ---

    def _signature_for(self, table: str):
        if self._table_infos is None:
            return None
        if table not in self._table_infos:
            raise ValueError(f"Unable to create item in table '{table}' since the table could not be found. "
                             f"Available tables: {sorted(self._table_infos)}")
        if table not in self._signature_entries:
            signature = self._table_infos[table].signature
            self._signature_entries[table] = None if signature is None else signature_entries(signature)
        return self._signature_entries[table]

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        """Queues an item of `table` made of the `TrajectoryColumn`s in `trajectory` (does not block)."""
        if self._closed:
            self._raise_closed()
        flat = None
        if type(trajectory) is dict:
            flat = [trajectory[k] for k in sorted(trajectory)]  # tree.flatten's order for a flat dict
            for col in flat:
                if type(col) is not TrajectoryColumn:
                    flat = None
                    break
        if flat is None:
            flat = [trajectory] if isinstance(trajectory, TrajectoryColumn) else tree.flatten(trajectory)
            if not all(isinstance(col, TrajectoryColumn) for col in flat):
                raise TypeError(f"All leaves of `trajectory` must be `TrajectoryColumn` but got {trajectory}")
        if not flat:
            raise ValueError(f"trajectory must contain at least one TrajectoryColumn, got {trajectory}")
        priority = float(priority)
        if math.isnan(priority):
            raise ValueError(f"priority must not be NaN (item for table '{table}')")
        entries = self._signature_for(table)
        if entries is not None and len(entries) != len(flat):
            raise _column_count_error(table, entries, trajectory, len(flat))
        columns = []
        episode_ids = set()
        final = True  # every chunk the item uses is final (a chunk is open while its chunker still holds it)
        for i, col in enumerate(flat):
            refs = col.data_references
            if not refs:
                raise ValueError(f"Column {i} of the trajectory for table '{table}' is empty; every column needs "
                                 f"at least one data reference")
            first_ref, last_ref = refs[0], refs[-1]
            first = first_ref.column
            chunk = first_ref.chunk
            if (last_ref.chunk is chunk and last_ref.row - first_ref.row == len(refs) - 1
                    and last_ref.seq - first_ref.seq == len(refs) - 1):
                # Fast path: consecutive rows of one chunk (the usual `history[col][-n:]`), one slice.
                if first_ref.seq < first.oldest_live_seq:
                    self._expired(table, i, first_ref)
                columns.append((col.is_squeezed, chunk, 0, first_ref.row, last_ref.row + 1))
                episode_ids.add(chunk.sequence_range.episode_id)
                final = final and first.chunk is not chunk
            else:
                columns.append((col.is_squeezed, *self._slices(table, i, refs, episode_ids)))
                final = final and all(ref.column.chunk is not ref.chunk for ref in refs)
            if entries is not None:
                path, dtype, shape, spec = entries[i]
                got = first.shape if col.is_squeezed else (len(refs), *first.shape)
                if first.dtype != dtype or not shape_compatible(shape, got):
                    raise ValueError(f"Unable to create item in table '{table}' since the provided trajectory is "
                                     f"inconsistent with the table signature: column {i} ('{path}') expected "
                                     f"{spec} but got dtype={first.dtype.name} shape={list(got)}")
        episode_ids = frozenset(episode_ids)
        # Items of one episode share one frozenset object (fewer objects per item for the GC to scan).
        episode_ids = self._episode_ids_cache.setdefault(episode_ids, episode_ids)
        item = Item.from_resolved(new_key(), priority, tuple(columns), episode_ids)
        live = None if self._open_chunks else tuple(self._live_chunks)
        if self._open_chunks or (not self._unsent and final):
            self._stream.send(table, item, live)
        else:
            self._unsent.append((table, item, live))

    @staticmethod
    def _expired(table: str, i: int, ref: CellRef):
        raise ValueError(f"Column {i} of the trajectory for table '{table}' contains an expired CellRef (step "
                         f"older than num_keep_alive_refs={ref.column.num_keep_alive_refs} of column "
                         f"{ref.column.path})")

    def _slices(self, table: str, i: int, refs: Sequence[CellRef], episode_ids: set) -> list:
        """Flat `[chunk, index, start, stop, ...]` of a column of any references (adjacent rows merged)."""
        first = refs[0].column
        oldest_kept = first.oldest_live_seq  # (`ref.expired` for refs of `first`, read once)
        flat: list = []
        for ref in refs:
            if ref.column is first:
                if ref.seq < oldest_kept:
                    self._expired(table, i, ref)
            else:
                if ref.expired:
                    self._expired(table, i, ref)
                if ref.dtype != first.dtype or ref.shape != first.shape:
                    raise ValueError(f"Column {i} of the trajectory for table '{table}' mixes references of "
                                     f"different dtypes or shapes: {first.dtype.name}{list(first.shape)} and "
                                     f"{ref.dtype.name}{list(ref.shape)}")
            chunk, row = ref.chunk, ref.row
            if flat and flat[-4] is chunk and flat[-1] == row:
                flat[-1] = row + 1  # the next row of the same chunk extends the slice
            else:
                flat += (chunk, 0, row, row + 1)
                episode_ids.add(chunk.sequence_range.episode_id)
        return flat

    # --- chunk finalization (remote transports) ---

    def _on_finalized(self, chunk: Optional[Chunk]) -> None:
        """Sends the queued items whose chunks are now all final, in order."""
        unsent = self._unsent
        if not unsent:
            return
        open_chunks = {id(c.chunk) for c in self._chunkers if c is not None and c.chunk is not None}
        while unsent and not any(id(c) in open_chunks for col in unsent[0][1].resolved_columns for c in col[1::4]):
            self._stream.send(*unsent.popleft())

    def _finalize_for(self, items: Sequence[Item]) -> None:
        needed = {key for item in items for key in item.chunks}
        for chunker in self._chunkers:
            if chunker is not None and chunker.chunk is not None and chunker.chunk.key in needed:
                chunker.finalize()
        self._on_finalized(None)

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        """Blocks until at most `block_until_num_items` items are unconfirmed by the server.

        Raises:
          ValueError: If `block_until_num_items < 0`.
          DeadlineExceededError: If `timeout_ms` ran out (the items are still inserted later).
        """
        if self._closed:
            self._raise_closed()
        if block_until_num_items < 0:
            raise ValueError(f"block_until_num_items must be >= 0, got {block_until_num_items}")
        if self._unsent:
            keep = max(0, len(self._unsent) - block_until_num_items)
            self._finalize_for([entry[1] for entry in itertools.islice(self._unsent, keep)])
        self._stream.flush(block_until_num_items, timeout_ms)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None:
        """Flushes every item, finalizes the chunks and starts a new episode (new id, step 0).

        Raises:
          DeadlineExceededError: If `timeout_ms` ran out; the episode then goes on (call again to end it).
        """
        if self._closed:
            self._raise_closed()
        for chunker in self._chunkers:
            if chunker is not None:
                chunker.finalize()
        self._on_finalized(None)
        try:
            self._stream.flush(0, timeout_ms)
        except errors.DeadlineExceededError:
            # As in Reverb, the episode is not ended: the items are still inserted later and a later
            # `end_episode` call ends it.
            raise errors.DeadlineExceededError(
                f"End episode call did not complete within provided timeout of "
                f"{datetime.timedelta(milliseconds=timeout_ms)}") from None
        self._episode_id = new_key()
        self._episode_steps = 0
        self._last_step_is_open = False
        self._episode_ids_cache.clear()
        if clear_buffers:
            for column in self._column_history:
                column.reset()

    def close(self) -> None:
        """Releases the writer's stream; items not yet confirmed may be dropped (flush first). Later calls
        raise RuntimeError, as Reverb's."""
        if not self._closed:
            self._closed = True
            self._stream.close()
