"""The InsertStream handler: chunks held per stream, items checked and inserted in order, back-pressure.

Requests carry chunks and items; chunks live in a per-stream map until an item refers to them, and only
the chunks listed in `keep_chunk_keys` survive a request with items. Items are inserted in order per
table; items the rate limiter holds back wait in the table's pending-insert queue (`insert_queue`), and
when it holds Reverb's `max(1, min(0.1 * max_size, 1000))` items the stream is not read meanwhile
(back-pressure); the keys of inserted items are sent back as confirmations, those completed meanwhile
coalesced into one response.

Each chunk's content is decoded once on arrival and dropped (a truncated or corrupt Snappy body is refused
with INVALID_ARGUMENT before any item can use it); items are checked against the chunks' headers and the
table signature; a length-1 unsqueezed column whose step matches the signature is accepted, because
Reverb's `client.insert` sends those and Reverb stores them. What one stream can make the server hold is
bounded by `wire.limits` (chunks and slices per request, counted before parsing; bytes of chunks held for
later items; bytes per chunk tensor and, when every table has a signature, steps that fit one of its
columns, checked before decompressing), each refusal naming the limit and the value got. Chunks are stored
as received (serialized `ChunkData`) and sent back without re-encoding.
"""
from __future__ import annotations

import sys
from typing import Callable, Iterator, Optional

import grpc

from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.grpc import common
from replay_tf.grpc import insert_queue
from replay_tf.grpc import statuses
from replay_tf.grpc import stream_slots
from replay_tf.grpc import table_entry
from replay_tf.wire import _raw
from replay_tf.wire import chunk_codec
from replay_tf.wire import tensor_codec
from replay_tf.wire import limits
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

__all__ = ["InsertStreams"]

_MAX_CHECKED_LAYOUTS = 4096      # column layouts a stream remembers as matching their table's signature
_CHUNKS_TAG = 0x0A                 # InsertStreamRequest.chunks = 1, length-delimited


class InsertStreams:
    """The InsertStream handler over a servicer's tables and chunk store."""

    def __init__(self, entry_of: Callable[[str], table_entry.TableEntry], chunk_store: chunk_store_lib.ChunkStore,
                 step_check: Optional[limits.StepCheck]):
        self._entry_of = entry_of  # table name -> TableEntry, or NOT_FOUND
        self._chunk_store = chunk_store
        # Refuses chunk tensors whose steps fit no column of the tables' signatures (None: a table has none).
        self._step_check = step_check
        # The streams' readers: threads kept once started, so that a stream closed leaves its reader to the
        # next one, even when the process cannot start another thread.
        self._readers = stream_slots.ThreadPool(sys.maxsize, spare_threads=0, name="replay_tf-insert-stream")

    def close(self) -> None:
        """Ends the readers' threads, each once its stream has ended."""
        self._readers.shutdown(wait=False)

    def stream(self, request_iterator, context) -> Iterator[bytes]:
        """Serves one InsertStream call: applies its requests and yields its confirmations."""
        # Requests are read and applied by a thread of the stream while this generator sends confirmations,
        # coalescing the keys confirmed meanwhile into one response (as Reverb does): a writer that sends
        # one item per request does not also pay for one response per request.
        common.freeze_startup_objects()
        state = insert_queue.InsertStreamState(context)
        cv = state.cv

        def read() -> None:
            try:
                self._apply_insert_requests(request_iterator, context, state)
                state.wait_for_queued()
            except BaseException as e:  # noqa: BLE001  (handed to the sending side, which reports it)
                state.fail(e)
            finally:
                with cv:
                    state.done = True
                    cv.notify_all()

        if self._readers.try_submit(read) is None:
            raise statuses.StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                       stream_slots.thread_refusal("this InsertStream's reader"))
        while True:
            with cv:
                while not (state.keys or state.done or state.error is not None):
                    cv.wait(common.WAIT_SLICE_MS / 1000.0)
                    if not context.is_active():
                        return  # the reader sees the cancelled stream and ends too
                keys, state.keys = state.keys, []
                error, done = state.error, state.done
            if keys:
                yield reverb_service_pb2.InsertStreamResponse(keys=keys).SerializeToString()
            if error is not None:
                raise error
            if done:
                return

    def _apply_insert_requests(self, request_iterator, context, state: insert_queue.InsertStreamState) -> None:
        held: dict = {}  # chunk key -> (Chunk, step headers, rows, episode id): this stream's chunks no item owns yet
        held_bytes = limits.HeldChunks()  # the bytes of the chunks in `held`
        confirmed: list = []  # keys inserted while applying the current request, confirmed together
        checked: set = set()  # (table, (dtype, shape) of each column) of this stream's items that matched
        try:
            for raw in request_iterator:
                limits.check_insert_request(raw)  # (counted in the bytes: parsing would build them all)
                request = statuses.parse(reverb_service_pb2.InsertStreamRequest, raw)
                chunk_protos, item_protos = request.chunks, request.items
                if not chunk_protos and not item_protos:
                    raise statuses.StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                               "InsertStreamRequest must contain at least one chunk or item")
                ranges = None  # each chunk's bytes in `raw`, found once a chunk is new to the stream
                for index, chunk_proto in enumerate(chunk_protos):
                    if chunk_proto.chunk_key in held:
                        continue  # the first copy wins, as in Reverb
                    if ranges is None:
                        ranges = _raw.message_field_ranges(raw, _CHUNKS_TAG)
                        if ranges is None or len(ranges) != len(chunk_protos):
                            ranges = ()  # not walkable: each chunk is serialized from its proto
                    # A chunk is kept as the bytes it arrived as (a slice of the request), not serialized again.
                    serialized = raw[ranges[index][0]:ranges[index][1]] if ranges else None
                    try:
                        chunk, headers = chunk_codec.chunk_from_proto(chunk_proto, serialized, check_content=True,
                                                                check_step=self._step_check)
                    except tensor_codec.ChunkTooLargeError as e:
                        raise statuses.StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
                    except tensor_codec.ChunkDecodeError as e:
                        raise statuses.StatusError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
                    stored = self._chunk_store.insert(chunk)
                    if stored is not chunk:
                        headers = self._stored_headers(stored, chunk, headers)
                    held_bytes.add(chunk.key, len(serialized) if serialized is not None else chunk_proto.ByteSize())
                    # Each tensor's header as (dtype, shape of one step); the chunk's rows and episode.
                    held[chunk.key] = (stored, [(dtype, shape[1:]) for dtype, shape in headers],
                                       stored.num_rows, stored.sequence_range.episode_id)
                if not item_protos:
                    held_bytes.check()
                    continue  # keep_chunk_keys only applies to requests with items
                try:
                    for item_proto in item_protos:
                        entry = self._entry_of(item_proto.table)
                        item = self._item(entry, item_proto, held, checked)
                        entry.inserts.put(item, state, confirmed)
                finally:
                    if confirmed:
                        state.confirm(confirmed)
                        confirmed.clear()
                keep = set(request.keep_chunk_keys)
                for key in [k for k in held if k not in keep]:
                    del held[key]
                    held_bytes.drop(key)
                if len(held) != len(keep):
                    missing = sorted(keep - set(held))
                    raise statuses.StatusError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"Kept less chunks than expected: keep_chunk_keys names chunks {missing} "
                        f"that this stream never received")
                held_bytes.check()
        finally:
            held.clear()  # chunks no item refers to are freed with the stream

    @staticmethod
    def _stored_headers(stored: chunk_store_lib.Chunk, received: chunk_store_lib.Chunk, headers: list) -> list:
        """Headers of the chunk that another stream (or a checkpoint) already stored under `received.key`.

        Items will refer to `stored`, so they must be checked against its headers, not against those of
        the copy just received (which may differ: a hostile or buggy client reusing a key).
        """
        serialized = chunk_codec.serialized_chunk(stored)
        if serialized == received.encoded:
            return headers
        return chunk_codec.chunk_from_proto(schema_pb2.ChunkData.FromString(serialized), serialized)[1]

    def _item(self, entry: table_entry.TableEntry, proto: schema_pb2.PrioritizedItem, held: dict,
              checked: set) -> chunk_store_lib.Item:
        """The core item of `proto`, validated against the stream's chunks (headers only, nothing decoded)
        and the table's signature (skipped for a column layout in `checked`, which it joins)."""
        key = proto.key
        resolved, columns, episode_ids = [], [], set()
        proto_columns = proto.flat_trajectory.columns
        if not proto_columns:
            raise ValueError(f"item {key} for table '{proto.table}': the trajectory must not be empty")
        for i, column in enumerate(proto_columns):
            slices = column.chunk_slices
            if not slices:
                raise ValueError(f"item {key}: column {i} has no chunk slices")
            squeeze = column.squeeze
            if squeeze and (len(slices) != 1 or slices[0].length != 1):
                raise ValueError(f"item {key}: column {i} is squeezed, so it must be exactly one slice of "
                                 f"length 1, got {len(slices)} slices")
            flat = [squeeze]
            dtype = shape = None
            rows = 0
            for s in slices:
                chunk_key, offset, length, index = s.chunk_key, s.offset, s.length, s.index
                found = held.get(chunk_key)
                if found is None:
                    raise statuses.StatusError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"Could not find sequence chunk {chunk_key}. Item {key} for table '{proto.table}' refers "
                        f"to a chunk that this stream does not hold (never sent, or not listed in the previous "
                        f"request's keep_chunk_keys)")
                chunk, headers, num_rows, episode_id = found
                if offset < 0 or length < 1 or offset + length > num_rows:
                    raise ValueError(f"item {key}: slice {(chunk_key, offset, length, index)} of column {i} is out "
                                     f"of chunk {chunk_key}'s rows [0, {num_rows})")
                if not 0 <= index < len(headers):
                    raise ValueError(f"item {key}: column {i} refers to tensor {index} of chunk {chunk_key}, "
                                     f"which has {len(headers)} tensors")
                got_dtype, got_step = headers[index]
                if dtype is None:
                    dtype, shape = got_dtype, got_step
                elif got_step != shape or (got_dtype is not dtype and got_dtype != dtype):
                    raise ValueError(f"item {key}: column {i} joins slices of different dtypes or shapes: "
                                     f"{dtype.name}{list(shape)} and {got_dtype.name}{list(got_step)}")
                rows += length
                flat += (chunk, index, offset, offset + length)
                episode_ids.add(episode_id)
            resolved.append(tuple(flat))
            columns.append((dtype, shape if squeeze else (rows, *shape)))
        priority = proto.priority
        entry.table.check_priority(key, priority)
        layout = (entry.name, *columns)
        if layout not in checked:  # the signature check, once per column layout
            self._check_signature(entry, key, columns)
            if len(checked) >= _MAX_CHECKED_LAYOUTS:
                checked.clear()
            checked.add(layout)
        item = chunk_store_lib.Item.from_resolved(key, priority, tuple(resolved), frozenset(episode_ids))
        item.times_sampled = proto.times_sampled  # taken from the request, as Reverb does
        return item

    @staticmethod
    def _check_signature(entry: table_entry.TableEntry, key: int, columns: list) -> None:
        entry.table.check_column_layout(key, columns)

