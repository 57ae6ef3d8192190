"""Insert streams of the remote transport (see `replay_tf._grpc_transport` for the design)."""
from __future__ import annotations

import collections
import datetime
import queue
import threading
import time
import weakref
from typing import Optional

import grpc

from replay_tf import _grpc_common as common
from replay_tf import _malloc
from replay_tf import errors
from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.wire import _raw
from replay_tf.wire import codec
from replay_tf.wire import reverb_service_pb2


_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
_MAX_KEY_FIELDS = 4096  # chunk key fields cached per connection (a writer's live chunks are far fewer)
_BACKOFF_S = (0.001, 1.0)  # reconnect backoff: first wait, doubling up to the last (as Reverb's writer)


class _Connection:
    """One InsertStream call: its request queue and the chunks sent on it (the server holds those)."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self.call = None
        # Entries vanish when the writer (and the unconfirmed items) drop a chunk.
        self.sent: "weakref.WeakValueDictionary[int, chunk_store_lib.Chunk]" = weakref.WeakValueDictionary()


class InsertStream:
    """An `InsertStream` of `replay_tf.client` over gRPC InsertStream calls (the first opened on first send).

    Delivery, as dm-reverb's `TrajectoryWriter`: when the call fails with UNAVAILABLE or CANCELLED (the
    server stopped, restarted at the same address, or restored from a checkpoint), the stream opens a new
    call (waiting for the server, backoff 1 ms doubling to 1 s between failed attempts) and re-sends, in
    their original order, every item the server has not confirmed, with the chunks they use (a new call
    starts with no chunks on the server side); later items follow. An item the server confirmed is never
    sent again; one inserted but not yet confirmed when the connection broke is sent again with the same
    key, which the table treats as a priority update, not a second item (at-least-once delivery,
    idempotent by key while the table holds the item). The stream retries for as long as the writer lives:
    `flush(timeout_ms=...)` raises `DeadlineExceededError` naming the connection failure while the server is
    away. Any other failure ends the stream: the next `send` or `flush` raises it.
    """

    supports_open_chunks = False

    def __init__(self, channel: grpc.Channel):
        self._channel = channel
        self._lock = threading.Lock()
        self._confirmed_cv = threading.Condition(self._lock)
        self._unconfirmed: "collections.OrderedDict[int, tuple]" = collections.OrderedDict()  # key -> (table, item)
        self._error: Optional[Exception] = None
        self._connection: Optional[_Connection] = None
        self._reconnecting: Optional[str] = None  # why the stream is reconnecting, while it is
        self._closing = False
        self._flushing = False
        self._reader: Optional[threading.Thread] = None

    def _connect(self) -> None:
        """Opens a new call (lock held) and queues every unconfirmed item on it, in order."""
        _malloc.keep_large_buffers_in_heap()  # requests are assembled into buffers of ~1 MiB (see _malloc)
        old = self._connection
        if old is not None:
            old.queue.put(common.CLOSE)  # ends the old request generator if gRPC still iterates it
        connection = self._connection = _Connection()
        for entry in self._unconfirmed.values():
            connection.queue.put(entry)
        method = self._channel.stream_stream(common.SERVICE + "InsertStream", request_serializer=common.identity,
                                             response_deserializer=common.identity)
        connection.call = method(self._requests(connection), wait_for_ready=True)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def send(self, table: str, item: chunk_store_lib.Item) -> None:
        with self._lock:
            self._raise_if_failed()
            self._unconfirmed[item.key] = entry = (table, item)
            if self._connection is None:
                self._connect()
                self._reader = threading.Thread(target=self._read, name="replay_tf-insert-confirmations",
                                                daemon=True)
                self._reader.start()
            else:
                self._connection.queue.put(entry)
        if self._connection.queue.qsize() > common.MAX_REQUEST_ITEMS:
            # The sending thread has fallen behind: let it have the GIL. An appending thread rarely releases
            # it, and gRPC's sending thread, which releases it at every write, can wait a whole switch
            # interval (5 ms) for it back: the queue (and its chunks) then grows for the whole episode, each
            # new chunk faulting in fresh pages. `send` does not block, as Reverb's `create_item`.
            time.sleep(0)

    def _requests(self, connection: _Connection):
        """Runs in gRPC's sending thread: turns queued items into InsertStreamRequests.

        An item that cannot be encoded ends the stream; its error is raised by the next `send` or `flush`
        (gRPC itself would only report "Exception iterating requests!").
        """
        try:
            yield from self._encode_requests(connection)
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self._error = ValueError(f"could not encode an item for the InsertStream: {type(e).__name__}: {e}")
                self._confirmed_cv.notify_all()

    def _encode_requests(self, connection: _Connection):
        sent = connection.sent
        requests = connection.queue
        request_item, chunk_head, trajectory_bytes = _raw.request_item, _raw.request_chunk_head, _raw.resolved_trajectory
        chunk_parts = codec.serialized_chunk_parts
        table_fields: dict = {}
        key_fields: dict = {}  # chunk key -> its serialized ChunkSlice.chunk_key field
        while True:
            entry = requests.get()
            if entry is common.CLOSE:
                return
            # The request is assembled as bytes (chunks = 1, items = 2, keep_chunk_keys = 3): the chunks are
            # sent as their cached serialized ChunkData, the items written field by field (see `_raw`).
            chunks = []
            items = []
            size = 0
            num_items = 0
            closing = False
            linger_until = time.monotonic() + common.LINGER_S
            if len(key_fields) > _MAX_KEY_FIELDS:
                key_fields.clear()
            in_request: dict = {}  # chunk key -> chunk, for the chunks this request's items use (a cheap check
            # before the weak dictionary's: consecutive items share most of their chunks)
            while True:
                table, item = entry
                columns = item.resolved_columns  # (squeeze, chunk, index, start, stop, chunk, ...) per column
                for column in columns:
                    for chunk in column[1::4]:
                        chunk_key = chunk.key
                        if chunk_key in in_request:
                            continue
                        in_request[chunk_key] = chunk
                        if chunk_key not in sent:
                            sent[chunk_key] = chunk
                            key_field = key_fields.get(chunk_key)
                            if key_field is None:  # (the item's slices will use it too)
                                key_field = key_fields[chunk_key] = _raw.key_field(chunk_key)
                            parts = chunk_parts(chunk, key_field)
                            data_size = sum(map(len, parts))
                            chunks.append(chunk_head(data_size))
                            chunks += parts  # (the compressed contents are copied once, by the join)
                            size += data_size
                table_field = table_fields.get(table)
                if table_field is None:
                    table_field = table_fields[table] = _raw.table_field(table) if table else b""
                items.append(request_item(item.key, table_field, item.priority, int(item.inserted_at or 0),
                                          trajectory_bytes(columns, key_fields)))
                num_items += 1
                if size >= common.MAX_REQUEST_BYTES or num_items >= common.MAX_REQUEST_ITEMS:
                    break
                try:
                    entry = requests.get_nowait()
                except queue.Empty:
                    # Wait a moment for more items: one request per item would cost a message (and a
                    # confirmation) per step, which is what limits Python gRPC.
                    remaining = linger_until - time.monotonic()
                    if remaining <= 0 or self._flushing:
                        break
                    try:
                        entry = requests.get(timeout=remaining)
                    except queue.Empty:
                        break
                if entry is common.CLOSE:
                    closing = True
                    break
            # Drop our own references so that only the writer decides which chunks stay alive.
            entry = table = item = columns = column = chunk = parts = in_request = None
            # Every sent chunk still alive may be used by a later item: the server must keep it.
            chunks += items
            chunks.append(_raw.keep_chunk_keys(list(sent.keys()), key_fields))
            request = b"".join(chunks)
            chunks = items = None
            yield request
            if closing:
                return

    def _read(self) -> None:
        """The reader thread: counts confirmations; reconnects after a transient failure."""
        backoff = _BACKOFF_S[0]
        while True:
            call = self._connection.call
            try:
                for raw in call:
                    keys = reverb_service_pb2.InsertStreamResponse.FromString(raw).keys
                    with self._lock:
                        pop = self._unconfirmed.pop
                        for key in keys:
                            pop(key, None)
                        self._reconnecting = None
                        if self._flushing:  # only flush waits for confirmations (it sets the flag first)
                            self._confirmed_cv.notify_all()
                    backoff = _BACKOFF_S[0]
            except grpc.RpcError as e:
                with self._lock:
                    if self._closing:
                        break
                    if e.code() in _TRANSIENT and self._error is None:
                        self._reconnecting = f"{e.code().name}: {e.details()}"
                        self._confirmed_cv.notify_all()
                        # Wait before reopening (close() cuts the wait short).
                        self._confirmed_cv.wait_for(lambda: self._closing, backoff)
                        backoff = min(2 * backoff, _BACKOFF_S[1])
                        if self._closing:
                            break
                        self._connect()
                        continue
                    if self._error is None:
                        self._error = common.translate_error(e, "InsertStream failed")
            break
        with self._lock:
            if self._error is None and self._unconfirmed and not self._closing:
                self._error = errors.ReverbError(
                    f"InsertStream ended with {len(self._unconfirmed)} unconfirmed items")
            self._confirmed_cv.notify_all()

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        deadline = None if timeout_ms is None or timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        with self._lock:
            self._flushing = True
            try:
                self._wait_confirmed(block_until_num_items, deadline, timeout_ms)
            finally:
                self._flushing = False

    def _wait_confirmed(self, block_until_num_items: int, deadline: Optional[float], timeout_ms) -> None:
        """Waits (lock held) until at most `block_until_num_items` items are unconfirmed."""
        while len(self._unconfirmed) > block_until_num_items:
            self._raise_if_failed()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                why = ""
                if self._reconnecting is not None:
                    why = (f" ({len(self._unconfirmed)} items unconfirmed; the InsertStream lost its server and "
                           f"is reconnecting after {self._reconnecting})")
                raise errors.DeadlineExceededError(
                    f"Flush call did not complete within provided timeout of "
                    f"{datetime.timedelta(milliseconds=timeout_ms)}{why}")
            self._confirmed_cv.wait(remaining if remaining is not None else 1.0)
        self._raise_if_failed()

    def num_pending(self) -> int:
        return len(self._unconfirmed)

    def close(self) -> None:
        if self._connection is None:
            return
        with self._lock:
            self._closing = True
            self._confirmed_cv.notify_all()
            connection = self._connection
            connection.queue.put(common.CLOSE)
            if self._unconfirmed or self._reconnecting is not None:
                connection.call.cancel()  # unflushed items are dropped, as documented
        self._reader.join(common.CLOSE_TIMEOUT_S)
        if self._reader.is_alive():
            self._connection.call.cancel()
            self._reader.join(common.CLOSE_TIMEOUT_S)
        self._connection = None
