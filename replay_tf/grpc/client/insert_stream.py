"""Insert streams of the remote transport (see `replay_tf.grpc.client.client_transport` for the design)."""
from __future__ import annotations

import datetime
import queue
import threading
import time
from typing import Dict, Optional, Union

import grpc

from replay_tf import errors
from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.grpc import common
from replay_tf.grpc import malloc
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import reverb_service_pb2


_TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
_MAX_KEY_FIELDS = 4096  # chunk key fields cached per connection (a writer's live chunks are far fewer)
_BACKOFF_S = (0.001, 1.0)  # reconnect backoff: first wait, doubling up to the last (as Reverb's writer)


class _Connection:
    """One InsertStream call: its queue of requests, the request being gathered, and the chunks sent on it
    (the server holds those).

    The writer's thread gathers items into the open request and, once it is full (`MAX_REQUEST_BYTES` of
    step data, or `MAX_REQUEST_ITEMS`) or has lingered `LINGER_S`, encodes the whole request and queues it
    for gRPC's sending thread; that thread sends a request that lingers while the writer is idle itself.
    So the sending thread wakes once per request, and a request is encoded in one go, in one thread: no
    GIL hand-off per item, nor per compressed chunk (compression releases the GIL, and the sending thread
    would wait for the appending thread to give it back). docs/benchmarks.md compares this with encoding in
    the sending thread.

    The server keeps, after each request, only the sent chunks that later items can still use: the
    writer's `live` keys (see `InsertStream.send`), a handful. Naming every sent chunk still alive instead
    (unconfirmed items hold theirs) would grow the list with the requests in flight, so a server that lags
    would get longer requests to parse and lag further.
    """

    def __init__(self):
        # Finished requests (bytes), CLOSE, and the number of each request as it opens (an int): the
        # sending thread then sends that request itself if it is still open once it has lingered.
        self.queue: queue.Queue = queue.Queue()
        self.queued = 0  # finished requests in the queue (changed with the stream's lock held)
        self.call = None
        # The chunks the server holds for this call: key -> the chunk's `InsertStreamRequest.chunks` field as
        # a tuple of bytes-like parts (see `_chunk_field`), pruned to the keep list after each request.
        self.sent: Dict[int, tuple] = {}
        self._key_fields: dict = {}  # chunk key -> its serialized ChunkSlice.chunk_key field
        self._table_fields: dict = {}
        # The open request: its items, the bytes of step data they add, and the keys of the chunks they use.
        # (Tables and items in two lists rather than one list of pairs: one GC-tracked object less per item.)
        self._tables: list = []
        self._items: list = []
        self._size = 0
        self._chunk_keys: dict = {}
        self._live: Optional[tuple] = None  # the chunks later items may use, as of the last item added
        self._prune_above = _MAX_KEY_FIELDS  # (sent chunks kept without `live`, see `_keep`)
        self.number = 0  # of the open request (or the last one) on this call
        self.opened_at = 0.0

    @property
    def num_items(self) -> int:
        return len(self._items)

    def add(self, table: str, item: chunk_store_lib.Item, live: Optional[tuple] = None) -> None:
        """Adds `item` (and the chunks it uses that this call has not carried) to the open request.

        `live`: the keys of the chunks that items created after this one may use (see `InsertStream.send`).
        """
        self._live = live
        items, chunk_keys, sent = self._items, self._chunk_keys, self.sent
        if not items:
            self.number += 1
            self.opened_at = time.monotonic()
            self.queue.put(self.number)
        self._tables.append(table)
        items.append(item)
        for column in item.resolved_columns:  # (squeeze, chunk, index, start, stop, chunk, ...)
            for chunk in column[1::4]:
                chunk_key = chunk.key
                if chunk_key not in chunk_keys:
                    chunk_keys[chunk_key] = None
                    if chunk_key not in sent:
                        for array in chunk.tensors:
                            self._size += array.nbytes

    def full(self) -> bool:
        return self._size >= common.MAX_REQUEST_BYTES or len(self._items) >= common.MAX_REQUEST_ITEMS

    def _keep(self, unconfirmed: dict) -> list:
        """The keys the server keeps for later items of this call (`keep_chunk_keys`); the other chunks it
        held are forgotten here too, so an item that still uses one sends it again.

        With the writer's `live` keys of the request's last item: the sent chunks among them, which are all
        that later items can use (a handful: the chunks of the writer's history, as Reverb's writer keeps).
        Without (streams whose items do not tell, as `Client.insert`'s): every sent chunk, pruned to those
        of unconfirmed items once there are many.
        """
        sent, live = self.sent, self._live
        if live is None:
            if len(sent) > self._prune_above:
                used = _record_chunk_keys(unconfirmed.values())
                for key in [key for key in sent if key not in used]:
                    del sent[key]
                self._prune_above = max(_MAX_KEY_FIELDS, 2 * len(sent))
            return list(sent)
        keep = [key for key in live if key in sent]
        if len(keep) != len(sent):
            kept = set(keep)
            for key in [key for key in sent if key not in kept]:
                del sent[key]
        return keep

    def finish(self, unconfirmed: dict) -> Optional[bytes]:
        """The open request, encoded (None if it has no items); the next item opens a new one.

        Each item's entry in `unconfirmed` becomes its record (see `InsertStream._unconfirmed`), so the item
        and its resolved columns die here rather than when the server confirms it.

        The request is assembled as bytes (chunks = 1, items = 2, keep_chunk_keys = 3): each chunk not sent
        before on this call as its serialized ChunkData (see `chunk_codec.serialized_chunk_parts`), before the
        first item that uses it; items written field by field (see `wire.raw_fields`).
        """
        items, tables = self._items, self._tables
        if not items:
            return None
        self._items, self._tables, self._size, self._chunk_keys = [], [], 0, {}
        sent, key_fields, table_fields = self.sent, self._key_fields, self._table_fields
        request_item, trajectory_bytes = raw_fields.request_item, raw_fields.resolved_trajectory
        parts: list = []
        for table, item in zip(tables, items):
            columns = item.resolved_columns
            record: list = [None]  # [item field, chunk key, chunk field, chunk key, chunk field, ...]
            for column in columns:
                for chunk in column[1::4]:
                    chunk_key = chunk.key
                    field = sent.get(chunk_key)  # (sent on this call before, or earlier in this request)
                    if field is None:
                        key_field = key_fields.get(chunk_key)
                        if key_field is None:  # (the item's slices will use it too)
                            key_field = key_fields[chunk_key] = raw_fields.key_field(chunk_key)
                        field = sent[chunk_key] = _chunk_field(chunk, key_field)
                        parts += field  # (the compressed contents are copied once, by the join)
                    record += (chunk_key, field)
            table_field = table_fields.get(table)
            if table_field is None:
                table_field = table_fields[table] = raw_fields.table_field(table) if table else b""
            record[0] = request_item(item.key, table_field, item.priority, int(item.inserted_at or 0),
                                     trajectory_bytes(columns, key_fields))
            parts.append(record[0])
            unconfirmed[item.key] = tuple(record)
        # Drop our own references: the items die here (their records and the writer hold what is needed).
        items = tables = item = columns = column = chunk = None
        parts.append(raw_fields.keep_chunk_keys(self._keep(unconfirmed), key_fields))
        if len(key_fields) > _MAX_KEY_FIELDS:
            key_fields.clear()
        return b"".join(parts)

    def resend(self, unconfirmed: dict) -> list:
        """Requests (bytes) that send the records of `unconfirmed`, in order, on this new call: each with
        the chunks it uses that the call has not carried yet, and a keep list of the chunks later records
        use (so the server holds only those).

        Every entry of `unconfirmed` must be a record (`finish` made it) by now.
        """
        records = list(unconfirmed.values())
        last_use = {}  # chunk key -> index of the last record that uses it
        for index, record in enumerate(records):
            for chunk_key in record[1::2]:
                last_use[chunk_key] = index
        sent, requests, parts, size, num_items = self.sent, [], [], 0, 0
        for index, record in enumerate(records):
            for i in range(1, len(record), 2):
                chunk_key = record[i]
                if chunk_key not in sent:
                    field = sent[chunk_key] = record[i + 1]
                    parts += field
                    size += sum(map(len, field))
            parts.append(record[0])
            num_items += 1
            if size >= common.MAX_REQUEST_BYTES or num_items >= common.MAX_REQUEST_ITEMS or index == len(records) - 1:
                for chunk_key in [key for key in sent if last_use[key] <= index]:
                    del sent[chunk_key]
                parts.append(raw_fields.keep_chunk_keys(list(sent)))
                requests.append(b"".join(parts))
                parts, size, num_items = [], 0, 0
        return requests


def _chunk_field(chunk: chunk_store_lib.Chunk, key_field: bytes) -> tuple:
    """The chunk's `InsertStreamRequest.chunks` field (tag, length, serialized ChunkData) as bytes-like parts.

    A tuple of bytes and buffers: the garbage collector stops tracking it at its first pass and the records
    that hold it at their next (a younger generation's), so hundreds of unconfirmed items never reach its
    oldest generation.
    """
    chunk_data = chunk_codec.serialized_chunk_parts(chunk, key_field)
    return (raw_fields.request_chunk_head(sum(map(len, chunk_data))), *chunk_data)


def _record_chunk_keys(entries) -> set:
    """The chunk keys of `InsertStream._unconfirmed` entries (records, and items not yet encoded)."""
    keys = set()
    for entry in entries:
        if type(entry) is tuple:
            keys.update(entry[1::2])
        else:
            keys.update(chunk.key for column in entry.resolved_columns for chunk in column[1::4])
    return keys


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
    away. Any other failure ends the stream: the next `send` or `flush` raises it (an item that cannot be
    encoded, too: gRPC itself would only report "Exception iterating requests!").
    """

    supports_open_chunks = False

    def __init__(self, channel: grpc.Channel):
        self._channel = channel
        self._lock = threading.Lock()
        self._confirmed_cv = threading.Condition(self._lock)
        # Sent items not yet confirmed, in order: key -> the item while its request is open, then its record,
        # `(item field, chunk key, chunk field, chunk key, chunk field, ...)`: what re-sending it takes, as
        # bytes (see `_Connection.finish`). Hundreds of items are in flight; every GC-tracked object of
        # theirs that survives to the garbage collector's oldest generation brings a full collection nearer
        # (costly in a process that imported TensorFlow, which holds many objects); a record, bytes only,
        # drops out of its tracking before that (see `_chunk_field`).
        self._unconfirmed: Dict[int, Union[chunk_store_lib.Item, tuple]] = {}
        self._error: Optional[Exception] = None
        self._connection: Optional[_Connection] = None
        self._reconnecting: Optional[str] = None  # why the stream is reconnecting, while it is
        self._closing = False
        self._flushing = False
        self._reader: Optional[threading.Thread] = None

    def _connect(self) -> None:
        """Opens a new call (lock held) and queues every unconfirmed item on it, in order."""
        malloc.keep_large_buffers_in_heap()  # requests are assembled into buffers of ~1 MiB (see malloc)
        old = self._connection
        if old is not None:
            old.queue.put(common.CLOSE)  # ends the old request generator if gRPC still iterates it
            self._finish(old)  # (its open request's items become records)
            if self._error is not None:
                return  # an item could not be encoded: the stream has ended
        connection = self._connection = _Connection()
        for request in connection.resend(self._unconfirmed):
            connection.queued += 1
            connection.queue.put(request)
        method = self._channel.stream_stream(common.SERVICE + "InsertStream", request_serializer=common.identity,
                                             response_deserializer=common.identity)
        connection.call = method(self._requests(connection), wait_for_ready=True)

    def _finish(self, connection: _Connection) -> Optional[bytes]:
        """`connection.finish()` (lock held); a request that cannot be encoded ends the stream."""
        try:
            return connection.finish(self._unconfirmed)
        except Exception as e:  # noqa: BLE001
            if self._error is None:
                self._error = ValueError(f"could not encode an item for the InsertStream: {type(e).__name__}: {e}")
            self._confirmed_cv.notify_all()
            connection.queue.put(common.CLOSE)
            return None

    def _queue_request(self, connection: _Connection) -> None:
        """Queues the open request, if it has items, for the sending thread (lock held)."""
        request = self._finish(connection)
        if request is not None:
            connection.queued += 1
            connection.queue.put(request)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def send(self, table: str, item: chunk_store_lib.Item, live: Optional[tuple] = None) -> None:
        with self._lock:
            self._raise_if_failed()
            if self._connection is None:
                self._connect()
                self._reader = threading.Thread(target=self._read, name="replay_tf-insert-confirmations",
                                                daemon=True)
                self._reader.start()
            self._unconfirmed[item.key] = item
            connection = self._connection
            connection.add(table, item, live)
            if connection.full() or time.monotonic() - connection.opened_at >= common.LINGER_S:
                self._queue_request(connection)
        if connection.queued > 1:
            # The sending thread has fallen behind: let it have the GIL. An appending thread rarely releases
            # it, and gRPC's sending thread, which releases it at every write, can wait a whole switch
            # interval (5 ms) for it back: the queue (and its chunks) then grows for the whole episode, each
            # new request faulting in fresh pages. `send` does not block, as Reverb's `create_item`.
            time.sleep(0)

    def _requests(self, connection: _Connection):
        """Runs in gRPC's sending thread: yields the connection's requests as they are queued, and sends an
        open request itself once it has lingered `LINGER_S` (or is flushed).

        A request's number is queued when it opens, after every request finished before it: when its
        number comes up and it is still open, it is next in order.
        """
        requests = connection.queue
        lingering = None  # the number of the open request whose lingering this thread waits out
        while True:
            try:
                request = requests.get(timeout=None if lingering is None else
                                       max(0.0, connection.opened_at + common.LINGER_S - time.monotonic()))
            except queue.Empty:
                request = lingering
            if request is common.CLOSE:
                return
            lingering = None
            with self._lock:
                if type(request) is not int:
                    connection.queued -= 1
                elif (self._connection is not connection or not connection.num_items
                      or connection.number != request):
                    continue  # finished meanwhile: its bytes follow in the queue
                elif connection.opened_at + common.LINGER_S > time.monotonic() and not self._flushing:
                    lingering = request
                    continue
                else:
                    request = self._finish(connection)
                    if request is None:
                        return
            yield request

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
            if self._connection is not None:
                self._queue_request(self._connection)
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
