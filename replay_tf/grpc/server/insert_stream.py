"""The InsertStream handler: chunks held per stream, items checked and inserted in order, back-pressure.

Requests carry chunks and items; chunks live in a per-stream map until an item refers to them, and only
the chunks listed in `keep_chunk_keys` survive a request with items. Items are inserted in order per
table; items the rate limiter holds back wait in the table's pending-insert queue (`core.insert_queue`,
shared with in-process writers), and when it holds Reverb's `max(1, min(0.1 * max_size, 1000))` items
the stream is not read meanwhile (back-pressure); the keys of inserted items are sent back as
confirmations, those completed meanwhile coalesced into one response. `InsertStreamState` is what one
stream's reader, the table queues holding its items and its sender share.

Each chunk's content is decoded once on arrival and dropped (a truncated or corrupt Snappy body is refused
with INVALID_ARGUMENT before any item can use it); items are checked against the chunks' headers and the
table signature; a length-1 unsqueezed column whose step matches the signature is accepted, because
Reverb's `client.insert` sends those and Reverb stores them. What one stream can make the server hold is
bounded by `wire.limits` (chunks, slices and kept chunk keys per request, counted before parsing; bytes of
chunks held for later items; bytes per chunk tensor, string elements included, and, when every table has a
signature, steps that fit one of its columns, checked before decompressing; bytes an item decodes to), each
refusal naming the limit and the value got. Items are checked by the rules a checkpoint's restore applies
(`core.item_records`). Chunks are stored as received (serialized `ChunkData`) and sent back without
re-encoding.
"""
from __future__ import annotations

import sys
import threading
import traceback
from typing import Callable, Iterator, Optional

import grpc

from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.core import item_records
from replay_tf.grpc import common
from replay_tf.grpc.server import statuses
from replay_tf.grpc.server import stream_slots
from replay_tf.grpc.server import table_entry
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import tensor_codec
from replay_tf.wire import limits
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

__all__ = ["InsertStreamState", "InsertStreams"]


def _without_locals(error: BaseException) -> BaseException:
    """`error`, with the local variables of the finished frames of its tracebacks (and of its chained errors'
    tracebacks) cleared; file and line information stays. An error kept in a stream's shared state would
    otherwise keep that stream's items and chunks alive in reference cycles (frame -> state -> error ->
    frame) that only a full garbage collection frees, e.g. after a writer was killed."""
    seen = set()
    pending = [error]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        pending += [e.__context__, e.__cause__]
    return error


class InsertStreamState:
    """What an InsertStream's reader, its table queues and its sender share: keys to confirm, the first
    error, and how many of its items wait in table queues. The owner of its items in those queues
    (`core.insert_queue.InsertOwner`): a full queue stops the reader (back-pressure), and the items of a
    client gone are dropped."""

    waits_for_room = True

    def __init__(self, context):
        self.cv = threading.Condition()
        self.keys: list = []
        self.inserted: list = []  # keys the reader inserted while applying a request, confirmed together
        self.error: Optional[BaseException] = None
        self.done = False
        self.outstanding = 0
        self._context = context

    def active(self) -> bool:
        return self._context.is_active()

    def gone(self) -> BaseException:
        return statuses.client_gone()

    def confirm(self, keys: list) -> None:
        """Hands `keys` (inserted items) to the sender, which confirms them in one response."""
        with self.cv:
            self.keys += keys
            self.cv.notify_all()

    def confirm_inserted(self) -> None:
        """Confirms the keys in `inserted`."""
        if self.inserted:
            self.confirm(self.inserted)
            self.inserted.clear()

    def will_wait(self) -> None:
        self.confirm_inserted()  # no key waits behind a queued item

    def queued(self) -> None:
        with self.cv:
            self.outstanding += 1

    def finished(self, item: chunk_store_lib.Item, error: Optional[BaseException]) -> None:
        """A queued item was inserted (`error` None) or failed."""
        with self.cv:
            self.outstanding -= 1
            if error is None:
                self.keys.append(item.key)
            else:
                self.fail(error)  # (`cv`'s lock is reentrant)
            self.cv.notify_all()

    def start_worker(self, target: Callable[[], None], table_name: str) -> None:
        if not stream_slots.start_thread(target, f"replay_tf-inserts-{table_name}"):
            raise statuses.StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, stream_slots.thread_refusal(
                f"the insert queue of table '{table_name}'"))

    def fail(self, error: BaseException) -> None:
        """Records `error` for the sender to report, unless the stream already failed."""
        with self.cv:
            if self.error is None:
                self.error = _without_locals(error)
            self.cv.notify_all()

    def wait_for_queued(self) -> None:
        """Blocks until every queued item of the stream was inserted (or one failed)."""
        with self.cv:
            while self.outstanding and self.error is None:
                self.cv.wait(common.WAIT_SLICE_MS / 1000.0)
                if not self.active():
                    raise statuses.client_gone()


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
        state = InsertStreamState(context)
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

    def _apply_insert_requests(self, request_iterator, context, state: InsertStreamState) -> None:
        held: dict = {}  # chunk key -> its item_records.ChunkLayout: this stream's chunks no item owns yet
        held_bytes = limits.HeldChunks()  # the bytes of the chunks in `held`
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
                        ranges = raw_fields.message_field_ranges(raw, raw_fields.REQUEST_CHUNKS_TAG)
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
                    held[chunk.key] = item_records.ChunkLayout(stored, headers, limits.STRING_ELEMENT_BYTES,
                                                               chunk_codec.string_lengths)
                if not item_protos:
                    held_bytes.check()
                    continue  # keep_chunk_keys only applies to requests with items
                try:
                    for item_proto in item_protos:
                        entry = self._entry_of(item_proto.table)
                        item = self._item(entry, item_proto, held, checked)
                        if entry.table.insert_queue.put(item, state):
                            state.inserted.append(item.key)
                finally:
                    state.confirm_inserted()
                # (at most limits.MAX_KEPT_CHUNKS_PER_REQUEST keys, counted before parsing)
                keep = set(request.keep_chunk_keys)
                for key in [k for k in held if k not in keep]:
                    del held[key]
                    held_bytes.drop(key)
                if len(held) != len(keep):
                    missing = sorted(k for k in keep if k not in held)
                    raise statuses.StatusError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"Kept less chunks than expected: keep_chunk_keys names {len(missing)} chunks "
                        f"{limits.listed_keys(missing)} that this stream never received")
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

    @staticmethod
    def _item(entry: table_entry.TableEntry, proto: schema_pb2.PrioritizedItem, held: dict,
              checked: set) -> chunk_store_lib.Item:
        """The core item of `proto`, checked by the rules of every path into a table (`core.item_records`)
        against the stream's chunks (headers only, nothing decoded) and the table's signature (skipped for a
        column layout in `checked`, which it joins). `times_sampled` is taken from the request, as Reverb does."""
        columns = [(column.squeeze, column.chunk_slices) for column in proto.flat_trajectory.columns]
        try:
            return item_records.item_from_record(entry.table, proto.key, proto.priority, proto.times_sampled,
                                                 columns, held.get, max_item_bytes=limits.MAX_ITEM_BYTES,
                                                 checked=checked)
        except item_records.MissingChunkError as e:
            raise statuses.StatusError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"Could not find sequence chunk {e.chunk_key}. Item {proto.key} for table '{proto.table}' refers "
                f"to a chunk that this stream does not hold (never sent, or not listed in the previous "
                f"request's keep_chunk_keys)") from None
        except item_records.ItemTooLargeError as e:
            raise statuses.StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
