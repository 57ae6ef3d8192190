"""The gRPC `deepmind.reverb.ReverbService` over the table core: what makes a `Server` reachable by Reverb.

`start(server)` is the hook `replay_tf.Server` calls: it serves the server's tables on `server.host`
(localhost unless the user chose otherwise) and `server.port`, and returns a handle with `stop()`.

Protocol (see ../shared/reference/reverb.md §2), as a dm-reverb 0.14 client expects it:
  - `InsertStream`: requests carry chunks and items; chunks live in a per-stream map until an item refers to
    them, and only the chunks listed in `keep_chunk_keys` survive a request with items. Items are inserted
    in order per table; items the rate limiter holds back wait in the table's pending-insert queue
    (`_InsertQueue`), and when it holds Reverb's `max(1, min(0.1 * max_size, 1000))` items the stream is
    not read meanwhile (back-pressure); the keys of inserted items are sent back as confirmations, those
    completed meanwhile coalesced into one response.
    Each chunk's content is decoded once on arrival and dropped (a truncated or corrupt Snappy body is
    refused with INVALID_ARGUMENT before any item can use it); items are checked against the chunks' headers
    and the table signature; a length-1 unsqueezed column whose step matches the signature is accepted,
    because Reverb's `client.insert` sends those and Reverb stores them. What one stream can make the server
    hold is bounded by `wire.limits` (chunks and slices per request, counted before parsing; bytes of chunks
    held for later items; bytes per chunk tensor and, when every table has a signature, steps that fit one of
    its columns, checked before decompressing), each refusal naming the limit and the value got.
  - `SampleStream`: each request asks for `num_samples`; the table answers in flexible batches (64 first,
    then doubling) and every sample becomes one or more entries (the first carries `info`, the last has
    `end_of_sequence`), several samples per response up to ~2 MiB. A rate-limiter timeout with nothing
    sampled ends the stream with DEADLINE_EXCEEDED and Reverb's message.
  - `InitializeConnection` always answers `address=0`: Reverb clients then sample over gRPC (a table
    pointer can never be shared with another process, and Python objects have no C++ address anyway).
  - Chunks are stored as received (serialized `ChunkData`) and sent back without re-encoding; they are
    decoded only when an in-process client reads them.

Errors never stop the server: a malformed or inconsistent request ends its own stream with a precise
status (INVALID_ARGUMENT for bad bytes, shapes or dtypes, NOT_FOUND for an unknown table,
FAILED_PRECONDITION for references to chunks the stream does not hold, CANCELLED when the server stops)
and the chunks held for that stream are released.
"""
from __future__ import annotations

import collections
import dataclasses
import hmac
import math
import logging
import threading
import time
import traceback
import weakref
from typing import Iterator, Optional

import grpc
from google.protobuf import message as protobuf_message

from replay_tf import _addresses
from replay_tf import _stacking
from replay_tf import errors
from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.core import table as table_lib
from replay_tf.grpc import common
from replay_tf.grpc import malloc
from replay_tf.grpc import shared_memory
from replay_tf.grpc import stream_slots
from replay_tf.wire import _raw
from replay_tf.wire import codec
from replay_tf.wire import limits
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_STREAMS",
    "GrpcService",
    "SERVICE_NAME",
    "start",
]

SERVICE_NAME = "deepmind.reverb.ReverbService"

#: Largest request accepted by default. Reverb's writers send requests of up to 40 MiB, and one chunk of a
#: large step may be bigger; Reverb itself accepts any size.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
DEFAULT_MAX_STREAMS = stream_slots.DEFAULT_MAX_STREAMS

_RESPONSE_TARGET_BYTES = 2 << 20   # start a new SampleStreamResponse past this size (Reverb's 2 MiB)
_FIRST_SAMPLE_BATCH = 64           # Reverb's flexible batches: 64 samples first, then doubling
_MAX_SAMPLE_BATCH = 1024
_DECODED_CHUNK_BYTES = 64 << 20    # decoded multi-row chunks kept for stacked sample streams (_stacking)
_MAX_CHECKED_LAYOUTS = 4096      # column layouts a stream remembers as matching their table's signature
_WAIT_SLICE_MS = 250               # blocked inserts and samples check this often that their client is there
_CHUNKS_TAG = 0x0A                 # InsertStreamRequest.chunks = 1, length-delimited

_log = logging.getLogger(__name__)


class _StatusError(Exception):
    """Ends the current RPC with `code` and `details`."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


def _parse(message_class, raw: bytes):
    try:
        return message_class.FromString(raw)
    except (protobuf_message.DecodeError, TypeError, ValueError) as e:
        raise _StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"malformed {message_class.DESCRIPTOR.name} ({len(raw)} bytes): {e}") from None


class _TableEntry:
    """A table and what the service caches about it."""

    def __init__(self, table: table_lib.Table):
        self.table = table
        self.name = table.name
        self.table_field = _raw.table_field(table.name)
        self._signature_proto = None
        self.inserts = _InsertQueue(table)

    def info_proto(self) -> schema_pb2.TableInfo:
        info = self.table.info
        proto = codec.table_info_to_proto(dataclasses.replace(info, signature=None))
        if info.signature is not None:
            if self._signature_proto is None:
                self._signature_proto = codec.encode_signature(info.signature)
            proto.signature.CopyFrom(self._signature_proto)
        return proto


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


class _InsertStreamState:
    """What an InsertStream's reader, its table queues and its sender share: keys to confirm, the first
    error, and how many of its items wait in table queues."""

    def __init__(self, context):
        self.cv = threading.Condition()
        self.keys: list = []
        self.error: Optional[BaseException] = None
        self.done = False
        self.outstanding = 0
        self._context = context

    def active(self) -> bool:
        return self._context.is_active()

    def confirm(self, keys: list) -> None:
        """Hands `keys` (inserted items) to the sender, which confirms them in one response."""
        with self.cv:
            self.keys += keys
            self.cv.notify_all()

    def queued(self) -> None:
        with self.cv:
            self.outstanding += 1

    def finished(self, key: int, error: Optional[BaseException]) -> None:
        """A queued item was inserted (`error` None) or failed."""
        with self.cv:
            self.outstanding -= 1
            if error is None:
                self.keys.append(key)
            elif self.error is None:
                self.error = _without_locals(error)
            self.cv.notify_all()

    def wait_for_queued(self) -> None:
        """Blocks until every queued item of the stream was inserted (or one failed)."""
        with self.cv:
            while self.outstanding and self.error is None:
                self.cv.wait(_WAIT_SLICE_MS / 1000.0)
                if not self.active():
                    raise _StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream")


class _InsertQueue:
    """A table's pending inserts, as Reverb's table worker queues them.

    An item the rate limiter admits at once is inserted by the stream's reader itself. Otherwise it
    waits here, in order, for a worker thread to insert it when the limiter allows; at most `limit`
    items (Reverb's `max(1, min(0.1 * max_size, 1000))`) wait per table, and a stream with one more item
    for a full queue is not read meanwhile (back-pressure). Items of a stream whose client went away are
    dropped instead of inserted.
    """

    def __init__(self, table: table_lib.Table):
        self._table = table
        self.limit = max(1, min(int(0.1 * table.max_size), 1000))
        self._cv = threading.Condition()
        self._pending: collections.deque = collections.deque()  # (item, stream state); [0] is being inserted
        self._working = False

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, item, stream: _InsertStreamState, confirmed: list) -> None:
        """Inserts `item` now, appending its key to `confirmed` (the caller confirms a request's keys
        together), or queues it; `confirmed` is then confirmed first, so that no key waits behind it."""
        with self._cv:
            if not self._pending:
                try:
                    self._table.insert_or_assign(item, timeout_ms=0)
                except errors.DeadlineExceededError:
                    pass  # rate-limited: queue it
                else:
                    confirmed.append(item.key)
                    return
            if confirmed:
                stream.confirm(confirmed)
                confirmed.clear()
            while len(self._pending) >= self.limit:  # back-pressure: the stream is not read meanwhile
                self._cv.wait(_WAIT_SLICE_MS / 1000.0)
                if not stream.active():
                    raise _StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream")
            self._pending.append((item, stream))
            stream.queued()
            if not self._working:
                self._working = True
                threading.Thread(target=self._work, name=f"replay_tf-inserts-{self._table.name}",
                                 daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._cv:
                if not self._pending:
                    self._working = False
                    return
                item, stream = self._pending[0]
            error = None
            try:
                if not stream.active():
                    raise _StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream")
                ReverbServicer._insert(self._table, item, stream)
            except Exception as e:  # noqa: BLE001  (reported to the item's stream)
                error = e
            with self._cv:
                self._pending.popleft()
                self._cv.notify_all()
            stream.finished(item.key, error)
            item = stream = error = None  # this frame may live on in `error`'s traceback


class ReverbServicer:
    """The handlers of `deepmind.reverb.ReverbService` over a `replay_tf.Server`'s tables (raw bytes in/out)."""

    def __init__(self, server):
        self._server = server
        self._tables = {name: _TableEntry(table) for name, table in server.tables.items()}
        # (Not `or`: an empty ChunkStore is falsy, and the server's store must be the one used.)
        store = getattr(server, "chunk_store", None)
        self._chunk_store = chunk_store_lib.ChunkStore() if store is None else store
        state_id = int(getattr(server, "tables_state_id", 0))
        self._tables_state_id = schema_pb2.Uint128(high=state_id >> 64, low=state_id & ((1 << 64) - 1))
        # Serialized unchanging fields of each sampled item (key, table, inserted_at, flat trajectory), and the
        # `SampleEntry.data` tag and length of each sampled chunk, built on first use.
        self._trajectories: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._chunk_heads: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._trajectories_lock = threading.Lock()
        self._decoded_chunks = _stacking.DecodedChunks(_DECODED_CHUNK_BYTES)  # for stacked sample streams
        # Refuses chunk tensors whose steps fit no column of the tables' signatures (None: a table has none).
        self._step_check = limits.StepCheck.for_signatures(
            table.info.signature for table in server.tables.values())

    # --- helpers ---

    def pending_inserts(self, table: str) -> tuple:
        """`(items waiting in the table's pending-insert queue, the queue's limit)`."""
        queue = self._entry(table).inserts
        return len(queue), queue.limit

    def _entry(self, name: str) -> _TableEntry:
        entry = self._tables.get(name)
        if entry is None:
            raise _StatusError(grpc.StatusCode.NOT_FOUND, str(errors.table_not_found(name, self._tables)))
        return entry

    @staticmethod
    def _run(context, handler, *args):
        """Runs a unary handler, mapping failures to statuses."""
        try:
            return handler(*args)
        except _StatusError as e:
            context.abort(e.code, e.details)
        except errors.CancelledError as e:
            context.abort(grpc.StatusCode.CANCELLED, str(e))
        except errors.UnavailableError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except Exception as e:  # noqa: BLE001  (one bad call must never take the server down)
            _log.exception("internal error in ReverbService")
            context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    @staticmethod
    def _run_stream(context, generator) -> Iterator[bytes]:
        """Drives a streaming handler, mapping failures to statuses."""
        try:
            yield from generator
        except _StatusError as e:
            context.abort(e.code, e.details)
        except errors.CancelledError as e:
            context.abort(grpc.StatusCode.CANCELLED, str(e))
        except errors.UnavailableError as e:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        except limits.LimitExceededError as e:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except ValueError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except grpc.RpcError:
            return  # the client went away while we were reading its requests
        except Exception as e:  # noqa: BLE001
            _log.exception("internal error in ReverbService stream")
            context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")

    # --- unary methods ---

    def checkpoint(self, raw: bytes, context) -> bytes:
        def run():
            _parse(reverb_service_pb2.CheckpointRequest, raw)
            if getattr(self._server, "checkpointer", None) is None:
                raise _StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                   "no Checkpointer configured for the replay service")
            path = self._server.checkpoint()
            return reverb_service_pb2.CheckpointResponse(checkpoint_path=str(path)).SerializeToString()
        return self._run(context, run)

    def mutate_priorities(self, raw: bytes, context) -> bytes:
        def run():
            request = _parse(reverb_service_pb2.MutatePrioritiesRequest, raw)
            table = self._entry(request.table).table
            table.mutate_items([(u.key, u.priority) for u in request.updates], list(request.delete_keys))
            return b""
        return self._run(context, run)

    def reset(self, raw: bytes, context) -> bytes:
        def run():
            request = _parse(reverb_service_pb2.ResetRequest, raw)
            self._entry(request.table).table.reset()
            return b""
        return self._run(context, run)

    def server_info(self, raw: bytes, context) -> bytes:
        def run():
            _parse(reverb_service_pb2.ServerInfoRequest, raw)
            response = reverb_service_pb2.ServerInfoResponse()
            response.tables_state_id.CopyFrom(self._tables_state_id)
            for entry in self._tables.values():
                response.table_info.append(entry.info_proto())
            return response.SerializeToString()
        return self._run(context, run)

    # --- InitializeConnection ---

    def initialize_connection(self, request_iterator, context) -> Iterator[bytes]:
        def run():
            for raw in request_iterator:
                _parse(reverb_service_pb2.InitializeConnectionRequest, raw)
                # Never a pointer: the client falls back to sampling over gRPC.
                yield reverb_service_pb2.InitializeConnectionResponse(address=0).SerializeToString()
                return
        return self._run_stream(context, run())

    # --- InsertStream ---

    def insert_stream(self, request_iterator, context) -> Iterator[bytes]:
        return self._run_stream(context, self._insert_stream(request_iterator, context))

    def _insert_stream(self, request_iterator, context) -> Iterator[bytes]:
        # Requests are read and applied by a thread of the stream while this generator sends confirmations,
        # coalescing the keys confirmed meanwhile into one response (as Reverb does): a writer that sends
        # one item per request does not also pay for one response per request.
        common.freeze_startup_objects()
        state = _InsertStreamState(context)
        cv = state.cv

        def read() -> None:
            try:
                self._apply_insert_requests(request_iterator, context, state)
                state.wait_for_queued()
            except BaseException as e:  # noqa: BLE001  (handed to the sending side, which reports it)
                with cv:
                    if state.error is None:
                        state.error = _without_locals(e)
            finally:
                with cv:
                    state.done = True
                    cv.notify_all()

        threading.Thread(target=read, name="replay_tf-insert-stream", daemon=True).start()
        while True:
            with cv:
                while not (state.keys or state.done or state.error is not None):
                    cv.wait(_WAIT_SLICE_MS / 1000.0)
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

    def _apply_insert_requests(self, request_iterator, context, state: _InsertStreamState) -> None:
        held: dict = {}  # chunk key -> (Chunk, step headers, rows, episode id): this stream's chunks no item owns yet
        held_bytes = limits.HeldChunks()  # the bytes of the chunks in `held`
        confirmed: list = []  # keys inserted while applying the current request, confirmed together
        checked: set = set()  # (table, (dtype, shape) of each column) of this stream's items that matched
        try:
            for raw in request_iterator:
                limits.check_insert_request(raw)  # (counted in the bytes: parsing would build them all)
                request = _parse(reverb_service_pb2.InsertStreamRequest, raw)
                chunk_protos, item_protos = request.chunks, request.items
                if not chunk_protos and not item_protos:
                    raise _StatusError(grpc.StatusCode.INVALID_ARGUMENT,
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
                        chunk, headers = codec.chunk_from_proto(chunk_proto, serialized, check_content=True,
                                                                check_step=self._step_check)
                    except codec.ChunkTooLargeError as e:
                        raise _StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)) from None
                    except codec.ChunkDecodeError as e:
                        raise _StatusError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
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
                        entry = self._entry(item_proto.table)
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
                    raise _StatusError(grpc.StatusCode.FAILED_PRECONDITION,
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
        serialized = codec.serialized_chunk(stored)
        if serialized == received.encoded:
            return headers
        return codec.chunk_from_proto(schema_pb2.ChunkData.FromString(serialized), serialized)[1]

    def _item(self, entry: _TableEntry, proto: schema_pb2.PrioritizedItem, held: dict,
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
                    raise _StatusError(
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
    def _check_signature(entry: _TableEntry, key: int, columns: list) -> None:
        entry.table.check_column_layout(key, columns)

    @staticmethod
    def _insert(table: table_lib.Table, item, stream: _InsertStreamState) -> None:
        """Inserts `item`, waiting on the rate limiter in slices so that a vanished client is noticed."""
        while True:
            try:
                table.insert_or_assign(item, timeout_ms=_WAIT_SLICE_MS)
                return
            except errors.DeadlineExceededError:
                if not stream.active():
                    raise _StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream") from None

    # --- SampleStream ---

    def sample_stream(self, request_iterator, context) -> Iterator[bytes]:
        return self._run_stream(context, self._sample_stream(request_iterator, context))

    def _sample_stream(self, request_iterator, context) -> Iterator[bytes]:
        # When the call ends (the client cancels or goes away), a sampler blocked on the rate limiter
        # stops at once and takes nothing: an item inserted after the cancellation goes to another client.
        cancelled = threading.Event()
        sampling: list = []  # the table this stream samples from, to wake its waiters on cancellation

        def on_done() -> None:
            cancelled.set()
            for table in sampling:
                table.wake_waiters()

        context.add_callback(on_done)
        ring: Optional[shared_memory.Ring] = None  # the client's shared memory, if it offered one
        try:
            for raw in request_iterator:
                request = _parse(reverb_service_pb2.SampleStreamRequest, raw)
                if request.num_samples <= 0:
                    raise _StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                       f"num_samples ({request.num_samples}) must be > 0")
                entry = self._entry(request.table)
                sampling[:] = [entry.table]
                timeout_ms = request.rate_limiter_timeout.milliseconds
                # Reverb servers wait forever for timeouts <= 0 (missing, -1 or 0).
                deadline = time.monotonic() + timeout_ms / 1000.0 if timeout_ms > 0 else None
                remaining, batch_size = request.num_samples, _FIRST_SAMPLE_BATCH
                stacked = request.replay_tf_stacked
                if stacked and ring is None and request.HasField("replay_tf_shared_memory"):
                    ring = shared_memory.Ring.attach(request.replay_tf_shared_memory)
                while remaining > 0:
                    batch = self._sample(entry.table, min(remaining, batch_size), deadline, context, cancelled)
                    remaining -= len(batch)
                    batch_size = min(batch_size * 2, _MAX_SAMPLE_BATCH)
                    if stacked:
                        yield from self._stacked_responses(entry, batch, ring, cancelled)
                    else:
                        yield from self._responses(entry, batch)
        finally:
            if ring is not None:
                ring.close()

    @staticmethod
    def _sample(table: table_lib.Table, num_samples: int, deadline: Optional[float], context,
                cancelled: threading.Event) -> list:
        waited = False
        while True:
            slice_ms = _WAIT_SLICE_MS
            if deadline is not None:
                slice_ms = min(slice_ms, max(0.0, (deadline - time.monotonic()) * 1000.0))
            if cancelled.is_set():
                raise _StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream")
            try:
                batch = table.sample(num_samples, timeout_ms=slice_ms, cancelled=cancelled)
            except errors.DeadlineExceededError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise _StatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                       errors.RATE_LIMITER_TIMEOUT_MESSAGE) from None
                if not context.is_active():
                    raise _StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream") from None
                waited = True
                continue
            if waited and batch:
                batch[0] = batch[0]._replace(rate_limited=True)
            return batch

    def _item_prefix(self, entry: _TableEntry, item) -> bytes:
        """Serialized key, table, inserted_at and flat trajectory of an item (cached: they never change)."""
        prefix = self._trajectories.get(item)
        if prefix is None:
            trajectory = codec.trajectory_to_proto(item.trajectory).SerializeToString()
            prefix = _raw.item_prefix(item.key, entry.table_field, item.inserted_at, trajectory)
            with self._trajectories_lock:
                self._trajectories[item] = prefix
        return prefix

    def _chunk_fields(self, item) -> list:
        fields = []
        for chunk in item.chunks.values():
            cached = self._chunk_heads.get(chunk)
            serialized = codec.serialized_chunk(chunk)
            if cached is None or cached[1] is not serialized:
                cached = _raw.chunk_field(serialized)
                self._chunk_heads[chunk] = cached
            fields.append(cached)
        return fields

    def _stacked_responses(self, entry: _TableEntry, batch: list, ring: Optional[shared_memory.Ring],
                           cancelled: threading.Event) -> Iterator[bytes]:
        """`_responses` for a client that asked for stacked samples (rl-data-tf's extension): each response
        holds up to ~`_RESPONSE_TARGET_BYTES` of whole samples stacked per column, gathered straight into a
        slot of the client's shared memory when it offered some (`ring`, see `shared_memory`). Samples
        whose columns differ in count, dtype or shape are sent as entries, the standard way, and so is the
        rest of the batch from a sample with a column that cannot be stacked (strings)."""
        malloc.keep_large_buffers_in_heap()  # each response is ~2 MiB of columns, then one message (see malloc)
        tensors_of, pending_of = self._decoded_chunks.readers()
        start = 0
        while start < len(batch):
            # A response never splits a sample: it takes as many whole samples as fit the target size.
            layouts = _stacking.column_layouts(batch[start].item, tensors_of, pending_of)
            if layouts is None:  # (strings: a table's items all have them, so the rest goes as entries)
                yield from self._responses(entry, batch[start:])
                return
            per_sample = max(1, sum(dtype.itemsize * math.prod(shape) for dtype, shape in layouts))
            stop = min(len(batch), start + max(1, _RESPONSE_TARGET_BYTES // per_sample))
            group, start = batch[start:stop], stop
            items = [s.item for s in group]
            layout = _stacking.StackedLayout(group, layouts)
            if ring is not None and layout.size <= ring.slot_bytes:
                acquired = ring.acquire(cancelled.is_set)
                if acquired is None:
                    raise _StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream")
                slot, buffer = acquired
                fits = layout.gather_into(buffer, items, tensors_of, pending_of)
                del buffer
                if fits:
                    ring.publish(slot)
                    response = reverb_service_pb2.SampleStreamResponse()
                    response.replay_tf_shared_slot.slot, response.replay_tf_shared_slot.size = slot, layout.size
                    yield response.SerializeToString()
                else:
                    yield from self._responses(entry, group)
                continue
            columns = _stacking.stack_items(items, layouts, tensors_of, pending_of)
            if columns is None:
                yield from self._responses(entry, group)
            else:
                yield layout.join(columns)

    def _responses(self, entry: _TableEntry, batch: list) -> Iterator[bytes]:
        parts, size = [], 0
        for sampled in batch:
            item = sampled.item
            info = _raw.sample_info(self._item_prefix(entry, item), sampled.priority, sampled.times_sampled,
                                    sampled.probability, sampled.table_size, sampled.rate_limited)
            # One entry per sample unless the response would grow past the target: then the sample
            # continues in the next response, in entries without info.
            pending: list = []
            for field in self._chunk_fields(item):
                chunk_size = len(field[1])
                if pending and size + chunk_size > _RESPONSE_TARGET_BYTES:
                    parts += _raw.entry_parts(info, pending, False)
                    yield b"".join(parts)
                    parts, size, info, pending = [], 0, None, []
                pending.append(field)
                size += chunk_size
            parts += _raw.entry_parts(info, pending, True)
            size += 64
            if size >= _RESPONSE_TARGET_BYTES:
                yield b"".join(parts)
                parts, size = [], 0
        if parts:
            yield b"".join(parts)


def _identity(value: bytes) -> bytes:
    return value


class GrpcService:
    """A running gRPC listener for a `Server`'s tables; `stop()` ends every call and releases the port."""

    def __init__(self, grpc_server: grpc.Server, port: int, servicer: ReverbServicer,
                 slots: Optional[stream_slots.StreamSlots] = None, pool=None):
        self._grpc_server = grpc_server
        self.port = port
        self.servicer = servicer
        self.streams = slots  # open streams and their limit
        self._pool = pool

    def stop(self, grace_s: Optional[float] = None) -> None:
        self._grpc_server.stop(grace_s).wait(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # its idle threads (one per stream once open at the same time) end


class _TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without `authorization: Bearer <token>` metadata with UNAUTHENTICATED.

    The token is compared in constant time (`hmac.compare_digest`), so its value cannot be guessed from
    response times. Refused calls never reach the servicer, and their request bodies are never read: every
    refusal is served by a streaming handler that aborts at once (grpc reads, and buffers in full, the one
    request of a unary handler before calling it, up to `max_message_bytes` from anyone).
    """

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

        def refuse(details: str):
            def handler(request_iterator, context):  # (the requests are never read)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, details)
            return grpc.stream_stream_rpc_method_handler(handler, request_deserializer=_identity,
                                                         response_serializer=_identity)

        # The same streaming handler refuses unary methods too: the wire format of a call does not depend on
        # it, and a unary call's client sees the status alone, as from a unary handler.
        self._refusals = {
            "missing": refuse("this replay server requires an auth token: send 'authorization: Bearer <token>' "
                              "metadata (replay_tf.Client(address, auth_token=...), "
                              "replay_tf.set_connection_options or REPLAY_TF_AUTH_TOKEN)"),
            "wrong": refuse("the auth token sent in 'authorization' metadata is not this replay server's token"),
        }

    def intercept_service(self, continuation, handler_call_details):
        sent = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                sent = value.encode() if isinstance(value, str) else bytes(value)
        if sent is not None and hmac.compare_digest(sent, self._expected):
            return continuation(handler_call_details)
        return self._refusals["missing" if sent is None else "wrong"]


def _handler(servicer: ReverbServicer, slots: stream_slots.StreamSlots) -> grpc.GenericRpcHandler:
    unary = lambda fn: grpc.unary_unary_rpc_method_handler(  # noqa: E731
        fn, request_deserializer=_identity, response_serializer=_identity)
    stream = lambda fn: grpc.stream_stream_rpc_method_handler(  # noqa: E731
        slots.wrap(fn), request_deserializer=_identity, response_serializer=_identity)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "Checkpoint": unary(servicer.checkpoint),
        "InsertStream": stream(servicer.insert_stream),
        "MutatePriorities": unary(servicer.mutate_priorities),
        "Reset": unary(servicer.reset),
        "SampleStream": stream(servicer.sample_stream),
        "ServerInfo": unary(servicer.server_info),
        "InitializeConnection": stream(servicer.initialize_connection),
    })


def start(server, *, host: Optional[str] = None, port: Optional[int] = None,
          max_message_bytes: Optional[int] = None, max_workers: Optional[int] = None,
          max_streams: Optional[int] = None, server_credentials: Optional[grpc.ServerCredentials] = None,
          auth_token: Optional[str] = None) -> GrpcService:
    """Serves `server`'s tables as `deepmind.reverb.ReverbService`; the hook `replay_tf.Server` calls.

    Args:
      server: A `replay_tf.Server` (its `tables`, `host`, `port`, `chunk_store`, `tables_state_id`,
        `checkpointer` and `checkpoint()` are used).
      host: Interface to bind; default `server.host`, else "localhost". Binding anything else (e.g.
        "0.0.0.0") exposes the tables to the network, as Reverb always does: a warning is logged unless
        TLS protects them (a token alone travels in plaintext).
      port: Port to bind; default `server.port`.
      max_message_bytes: Largest request accepted (default `server.max_message_bytes` if set, else
        `DEFAULT_MAX_MESSAGE_BYTES`); -1 for no limit. Responses are never limited.
      max_workers: Threads kept for unary calls and for refusing streams over `max_streams`; open streams
        never take them (default 64). Threads start on demand.
      max_streams: Most streams (InsertStream, SampleStream, InitializeConnection) open at once, idle or
        waiting on a rate limiter included (default `server.max_streams` if set, else
        `DEFAULT_MAX_STREAMS`); each holds a thread, started on demand. One more is refused at once with
        RESOURCE_EXHAUSTED (see `stream_slots`).
      server_credentials: `grpc.ServerCredentials` to serve over TLS (default `server.server_credentials`
        if set, else plain text).
      auth_token: Token every call must carry as `authorization: Bearer <token>` metadata (default
        `server.auth_token` if set, else none); others fail with UNAUTHENTICATED.

    Returns:
      The running `GrpcService`.

    Raises:
      ValueError: If the address cannot be bound (e.g. the port is taken).
    """
    host = host or getattr(server, "host", None) or "localhost"
    port = server.port if port is None else port
    if max_message_bytes is None:
        max_message_bytes = getattr(server, "max_message_bytes", None) or DEFAULT_MAX_MESSAGE_BYTES
    if server_credentials is None:
        server_credentials = getattr(server, "server_credentials", None)
    if auth_token is None:
        auth_token = getattr(server, "auth_token", None)
    if not _addresses.is_loopback_host(host) and server_credentials is None and auth_token is None:
        _log.warning("the replay server binds %s:%s without TLS or auth token: anyone who can reach it may read, "
                     "insert and delete data (pass server_credentials= and auth_token= to Server)", host, port)
    elif not _addresses.is_loopback_host(host) and server_credentials is None:
        # Clients refuse to send a token in plaintext to a non-loopback address unless their users opt in.
        _log.warning("the replay server binds %s:%s with an auth token but without TLS: clients send the token in "
                     "plaintext, readable by anyone on the network path (pass server_credentials= to Server for "
                     "TLS; remote clients refuse to send it in plaintext unless REPLAY_TF_ALLOW_PLAINTEXT_TOKEN=1)",
                     host, port)
    if max_streams is None:
        max_streams = getattr(server, "max_streams", None) or DEFAULT_MAX_STREAMS
    max_streams = stream_slots.check_max_streams(max_streams)
    reserved = stream_slots.DEFAULT_RESERVED_THREADS if max_workers is None else max_workers
    servicer = ReverbServicer(server)
    slots = stream_slots.StreamSlots(max_streams)
    options = [
        ("grpc.max_receive_message_length", int(max_message_bytes)),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
    ]
    pool = stream_slots.thread_pool(max_streams, max(1, reserved))
    interceptors = [_TokenInterceptor(auth_token)] if auth_token is not None else None
    grpc_server = grpc.server(pool, handlers=[_handler(servicer, slots)], interceptors=interceptors, options=options)
    bind_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    try:
        if server_credentials is None:
            bound = grpc_server.add_insecure_port(f"{bind_host}:{port}")
        else:
            bound = grpc_server.add_secure_port(f"{bind_host}:{port}", server_credentials)
    except RuntimeError as e:
        bound, error = 0, e
    else:
        error = None
    if not bound:
        pool.shutdown(wait=False)
        raise ValueError(f"could not bind the replay service to {bind_host}:{port} (port in use?)") from error
    grpc_server.start()
    return GrpcService(grpc_server, bound, servicer, slots, pool)
