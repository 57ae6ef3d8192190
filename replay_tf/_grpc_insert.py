"""Insert streams of the remote transport (see `replay_tf._grpc_transport` for the design)."""
from __future__ import annotations

import datetime
import queue
import threading
import time
import weakref
from typing import Optional

import grpc

from replay_tf import _grpc_common as common
from replay_tf import errors
from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.wire import _raw
from replay_tf.wire import codec
from replay_tf.wire import reverb_service_pb2


class InsertStream:
    """An `InsertStream` of `replay_tf.client` over one gRPC InsertStream call (opened on first send)."""

    supports_open_chunks = False

    def __init__(self, channel: grpc.Channel):
        self._channel = channel
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._confirmed_cv = threading.Condition(self._lock)
        self._unconfirmed = 0
        self._error: Optional[Exception] = None
        self._call = None
        self._closing = False
        self._flushing = False
        self._reader: Optional[threading.Thread] = None
        # Chunks the server holds for this stream; entries vanish when the writer drops a chunk.
        self._sent: "weakref.WeakValueDictionary[int, chunk_store_lib.Chunk]" = weakref.WeakValueDictionary()

    def _start(self) -> None:
        method = self._channel.stream_stream(common.SERVICE + "InsertStream", request_serializer=common.identity,
                                             response_deserializer=common.identity)
        self._call = method(self._requests(), wait_for_ready=True)
        self._reader = threading.Thread(target=self._read, name="replay_tf-insert-confirmations", daemon=True)
        self._reader.start()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def send(self, table: str, item: chunk_store_lib.Item) -> None:
        with self._lock:
            self._raise_if_failed()
            self._unconfirmed += 1
            if self._call is None:
                self._start()
        self._queue.put((table, item))

    def _requests(self):
        """Runs in gRPC's sending thread: turns queued items into InsertStreamRequests.

        An item that cannot be encoded ends the stream; its error is raised by the next `send` or `flush`
        (gRPC itself would only report "Exception iterating requests!").
        """
        try:
            yield from self._encode_requests()
        except Exception as e:  # noqa: BLE001
            with self._lock:
                self._error = ValueError(f"could not encode an item for the InsertStream: {type(e).__name__}: {e}")
                self._confirmed_cv.notify_all()

    def _encode_requests(self):
        while True:
            first = self._queue.get()
            if first is common.CLOSE:
                return
            queued = [first]
            size = 0
            closing = False
            extra = None
            linger_until = time.monotonic() + common.LINGER_S
            while size < common.MAX_REQUEST_BYTES and len(queued) < common.MAX_REQUEST_ITEMS:
                try:
                    extra = self._queue.get_nowait()
                except queue.Empty:
                    # Wait a moment for more items: one request per item would cost a message (and a
                    # confirmation) per step, which is what limits Python gRPC.
                    remaining = linger_until - time.monotonic()
                    if remaining <= 0 or self._flushing:
                        break
                    try:
                        extra = self._queue.get(timeout=remaining)
                    except queue.Empty:
                        break
                if extra is common.CLOSE:
                    closing = True
                    break
                queued.append(extra)
                size += sum(len(codec.serialized_chunk(c)) for c in extra[1].chunks.values()
                            if c.key not in self._sent)
            request = reverb_service_pb2.InsertStreamRequest()
            chunks = []
            for table, item in queued:
                for chunk in item.chunks.values():
                    if chunk.key not in self._sent:
                        self._sent[chunk.key] = chunk
                        chunks.append(codec.serialized_chunk(chunk))
                request.items.append(codec.item_to_proto(item, table, times_sampled=0))
            # Drop our own references so that only the writer decides which chunks stay alive.
            queued = first = extra = table = item = chunk = None
            # Every sent chunk still alive may be used by a later item: the server must keep it.
            request.keep_chunk_keys.extend(self._sent.keys())
            serialized = request.SerializeToString()
            # ChunkData bytes are appended as repeated field 1 (chunks) without re-parsing them.
            yield b"".join([serialized] + [b"\x0a" + _raw.varint(len(c)) + c for c in chunks])
            if closing:
                return

    def _read(self) -> None:
        try:
            for raw in self._call:
                keys = reverb_service_pb2.InsertStreamResponse.FromString(raw).keys
                with self._lock:
                    self._unconfirmed -= len(keys)
                    self._confirmed_cv.notify_all()
        except grpc.RpcError as e:
            with self._lock:
                if not self._closing:
                    self._error = common.translate_error(e, "InsertStream failed")
        with self._lock:
            if self._error is None and self._unconfirmed > 0:
                self._error = errors.ReverbError(f"InsertStream ended with {self._unconfirmed} unconfirmed items")
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
        while self._unconfirmed > block_until_num_items:
            self._raise_if_failed()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise errors.DeadlineExceededError(
                    f"Flush call did not complete within provided timeout of "
                    f"{datetime.timedelta(milliseconds=timeout_ms)}")
            self._confirmed_cv.wait(remaining if remaining is not None else 1.0)
        self._raise_if_failed()

    def num_pending(self) -> int:
        return self._unconfirmed

    def close(self) -> None:
        if self._call is None:
            return
        with self._lock:
            self._closing = True
        self._queue.put(common.CLOSE)
        if self._unconfirmed:
            self._call.cancel()  # unflushed items are dropped, as documented
        self._reader.join(common.CLOSE_TIMEOUT_S)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(common.CLOSE_TIMEOUT_S)
        self._call = None
