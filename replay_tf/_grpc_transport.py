"""The remote transport of `replay_tf.Client`: Reverb's gRPC protocol to any server (ours or dm-reverb's).

Implements `replay_tf.client.Transport` over `deepmind.reverb.ReverbService`:
  - insert streams encode each item's chunks once (`wire.codec`, as Reverb's writers do), send every chunk
    at most once per stream and list in `keep_chunk_keys` the sent chunks the writer may still refer to:
    those still alive in this process (a chunk the writer's history and queued items dropped is garbage,
    so no later item can use it). Requests are assembled by the gRPC sending thread from everything queued
    at that moment (up to ~4 MiB), so `send` never blocks and fast writers get big requests;
  - sample streams ask for `num_samples_per_request` samples per request (the next one only once those
    have arrived and the caller asks for more, so nothing is sampled ahead of the caller); a thread reads
    and decodes the responses, and `next_batch` hands out every complete sample received so far (up to the
    request) as one flexible batch. Chunks are decoded once per call (a cache keyed by chunk key and row
    count) and samples are core `Item`s, so everything built on the in-process path works unchanged.

gRPC failures become Reverb's Python errors: DEADLINE_EXCEEDED -> `DeadlineExceededError`,
INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION -> `ValueError`, others -> `ReverbError`.
"""
from __future__ import annotations

import collections
import datetime
import queue
import threading
import time
import weakref
from typing import Any, Dict, Optional

import grpc

from replay_tf import errors
from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.core import table as table_lib
from replay_tf.wire import codec
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2
from replay_tf.wire import _raw

_SERVICE = "/deepmind.reverb.ReverbService/"
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_reconnect_backoff_ms", 30_000),  # as Reverb's client
]
_MAX_REQUEST_BYTES = 4 << 20       # assemble queued items into requests up to about this size
_MAX_REQUEST_ITEMS = 256
_LINGER_S = 0.002                  # how long a request waits for more items (not while flushing)
_CHUNK_CACHE_SIZE = 4096           # decoded chunks kept per sample stream
_CLOSE_TIMEOUT_S = 10.0
_CLOSE = object()


def translate_error(error: grpc.RpcError, what: str) -> Exception:
    """A Python error for a failed call, as Reverb's client raises them."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    message = f"{what}: {details}" if details else what
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.DeadlineExceededError(details or message)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.FAILED_PRECONDITION):
        return ValueError(message)
    if code == grpc.StatusCode.CANCELLED:
        return errors.CancelledError(message)
    return errors.ReverbError(f"{message} (gRPC status {code.name if code else 'unknown'})")


def _identity(value: bytes) -> bytes:
    return value


class _InsertStream:
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
        method = self._channel.stream_stream(_SERVICE + "InsertStream", request_serializer=_identity,
                                             response_deserializer=_identity)
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
            if first is _CLOSE:
                return
            queued = [first]
            size = 0
            closing = False
            extra = None
            linger_until = time.monotonic() + _LINGER_S
            while size < _MAX_REQUEST_BYTES and len(queued) < _MAX_REQUEST_ITEMS:
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
                if extra is _CLOSE:
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
                    self._error = translate_error(e, "InsertStream failed")
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
        self._queue.put(_CLOSE)
        if self._unconfirmed:
            self._call.cancel()  # unflushed items are dropped, as documented
        self._reader.join(_CLOSE_TIMEOUT_S)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(_CLOSE_TIMEOUT_S)
        self._call = None


class _SampleStream:
    """A `SampleStream` of `replay_tf.client` over gRPC SampleStream calls."""

    def __init__(self, channel: grpc.Channel, table: str, num_samples_per_request: int,
                 rate_limiter_timeout_ms: Optional[int], max_samples_per_stream: Optional[int]):
        if num_samples_per_request < 1:
            raise ValueError(f"num_samples_per_request ({num_samples_per_request}) must be >= 1")
        self._method = channel.stream_stream(_SERVICE + "SampleStream", request_serializer=_identity,
                                             response_deserializer=_identity)
        self._table = table
        self._num_samples = num_samples_per_request
        self._max_samples_per_stream = max_samples_per_stream
        timeout = -1 if rate_limiter_timeout_ms is None or rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms
        if timeout == 0:
            timeout = 1  # Reverb servers read 0 as "wait forever"; the caller asked not to wait
        self._timeout_ms = timeout
        self._requests: Optional[queue.Queue] = None
        self._results: Optional[queue.Queue] = None
        self._call = None
        self._outstanding = 0        # samples asked for and not yet received
        self._stream_samples = 0     # samples received on the current call

    def _request(self, count: int) -> bytes:
        request = reverb_service_pb2.SampleStreamRequest(table=self._table, num_samples=count)
        request.rate_limiter_timeout.milliseconds = self._timeout_ms
        return request.SerializeToString()

    def _open(self) -> None:
        self._requests = queue.Queue()
        self._results = queue.Queue()
        requests, results = self._requests, self._results

        def iterate():
            while True:
                request = requests.get()
                if request is _CLOSE:
                    return
                yield request

        call = self._method(iterate(), wait_for_ready=True)
        self._call = call
        self._stream_samples = 0
        self._outstanding = 0
        # Responses are read and decoded by a thread, so that `next_batch` can hand out every sample that
        # has arrived (up to a request's worth) instead of one response's worth.
        threading.Thread(target=self._read, args=(call, results), name="replay_tf-sample-stream",
                         daemon=True).start()

    def _read(self, call, results: queue.Queue) -> None:
        partial: list = [None]  # (info, {chunk key: Chunk}) of a sample split over responses
        cache: "collections.OrderedDict" = collections.OrderedDict()  # this call's decoded chunks
        try:
            for raw in call:
                batch = self._samples(reverb_service_pb2.SampleStreamResponse.FromString(raw), partial, cache)
                if batch:
                    results.put(batch)
            results.put(errors.ReverbError(f"SampleStream of table '{self._table}' ended before the samples "
                                           f"asked for arrived"))
        except grpc.RpcError as e:
            results.put(translate_error(e, f"Sampling table '{self._table}' failed"))
        except Exception as e:  # noqa: BLE001  (a malformed response ends this stream, with its reason)
            results.put(errors.ReverbError(f"SampleStream of table '{self._table}' sent an unreadable "
                                           f"response: {type(e).__name__}: {e}"))

    def _ask(self) -> None:
        count = self._num_samples
        if self._max_samples_per_stream is not None:
            count = min(count, self._max_samples_per_stream - self._stream_samples)
        self._outstanding = count
        self._requests.put(self._request(count))

    def next_batch(self, poll_ms: Optional[float] = None) -> list:
        while True:
            if self._call is None:
                self._open()
            if self._outstanding == 0:
                if (self._max_samples_per_stream is not None
                        and self._stream_samples >= self._max_samples_per_stream):
                    self.close()  # re-open to rebalance across servers, as Reverb's sampler does
                    continue
                self._ask()
            try:
                # With poll_ms the request stays outstanding: the next call goes on waiting for it.
                first = self._results.get(timeout=None if poll_ms is None else poll_ms / 1000.0)
            except queue.Empty:
                return []
            if isinstance(first, Exception):
                self.close()
                raise first
            batch = first
            # Everything else that has arrived, up to the rest of the request.
            while len(batch) < self._outstanding:
                try:
                    more = self._results.get_nowait()
                except queue.Empty:
                    break
                if isinstance(more, Exception):
                    self._results.put(more)  # raised by the next call, after these samples
                    break
                batch = batch + more
            self._outstanding -= len(batch)
            self._stream_samples += len(batch)
            return batch

    @staticmethod
    def _chunk(proto: schema_pb2.ChunkData, cache) -> chunk_store_lib.Chunk:
        """The decoded chunk of `proto`, decoded once per call."""
        r = proto.sequence_range
        key = proto.chunk_key
        end = r.end
        # A chunk of one key may have grown (in-process writers' open chunks): key the cache by its rows too.
        cache_key = (key, end)
        chunk = cache.get(cache_key)
        if chunk is not None:
            cache.move_to_end(cache_key)
            return chunk
        chunk = chunk_store_lib.Chunk(key, codec.decode_chunk_tensors(proto),
                                      chunk_store_lib.SequenceRange(r.episode_id, r.start, end, r.sparse),
                                      delta_encoded=proto.delta_encoded)
        cache[cache_key] = chunk
        if len(cache) > _CHUNK_CACHE_SIZE:
            cache.popitem(last=False)
        return chunk

    def _samples(self, response, partial: list, cache) -> list:
        out = []
        for entry in response.entries:
            if entry.HasField("info"):
                partial[0] = (entry.info, {})
            if partial[0] is None:
                raise errors.ReverbError("SampleStream sent sample data before its info")
            chunks = partial[0][1]
            for proto in entry.data:
                chunks[proto.chunk_key] = self._chunk(proto, cache)
            if entry.end_of_sequence:
                info, chunks = partial[0]
                partial[0] = None
                item_proto = info.item
                priority, times_sampled = item_proto.priority, item_proto.times_sampled
                item = _sampled_item(item_proto.key, priority, times_sampled, item_proto.flat_trajectory, chunks)
                out.append(table_lib.SampledItem(item, priority, times_sampled, info.probability, info.table_size,
                                                 info.rate_limited))
        return out

    def close(self) -> None:
        if self._call is not None:
            self._requests.put(_CLOSE)
            try:
                self._call.cancel()
            except Exception:  # noqa: BLE001  (grpc may already be torn down at interpreter exit)
                pass
            self._call = None


def _sampled_item(key: int, priority: float, times_sampled: int, trajectory_proto,
                  chunks: dict) -> chunk_store_lib.Item:
    """A core `Item` for a sample, built from its proto and decoded chunks (bounds checked here, so the
    item is made with `Item.from_resolved`: a sample is unpacked once, full validation would only cost)."""
    columns, episode_ids = [], set()
    for column in trajectory_proto.columns:
        flat = [column.squeeze]
        for s in column.chunk_slices:
            chunk = chunks.get(s.chunk_key)
            if chunk is None:
                raise errors.ReverbError(f"sampled item {key} refers to chunk {s.chunk_key}, which the server did "
                                         f"not send with it")
            start, index = s.offset, s.index
            stop = start + s.length
            if start < 0 or stop > chunk.num_rows or stop <= start or not 0 <= index < len(chunk.tensors):
                raise errors.ReverbError(f"sampled item {key}: slice [{start}, {stop}) of tensor {index} is out of "
                                         f"chunk {s.chunk_key}'s {len(chunk.tensors)} tensors of {chunk.num_rows} "
                                         f"rows")
            flat += (chunk, index, start, stop)
            episode_ids.add(chunk.sequence_range.episode_id)
        if len(flat) == 1:
            raise errors.ReverbError(f"sampled item {key} has a column without chunk slices")
        columns.append(tuple(flat))
    if not columns:
        raise errors.ReverbError(f"sampled item {key} has no columns")
    item = chunk_store_lib.Item.from_resolved(key, priority, tuple(columns), frozenset(episode_ids))
    item.times_sampled = times_sampled
    return item


class Transport:
    """`replay_tf.client.Transport` to a Reverb-protocol server at `server_address` (`host:port`)."""

    def __init__(self, server_address: str):
        self._address = server_address
        self._channel = grpc.insecure_channel(server_address, options=_CHANNEL_OPTIONS)
        self._unary = {
            name: self._channel.unary_unary(_SERVICE + name, request_serializer=_identity,
                                            response_deserializer=_identity)
            for name in ("Checkpoint", "MutatePriorities", "Reset", "ServerInfo")}

    def __repr__(self) -> str:
        return f"Transport({self._address!r})"

    def _call(self, name: str, request, response_class, timeout_s: Optional[float] = None):
        try:
            raw = self._unary[name](request.SerializeToString(), timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as e:
            raise translate_error(e, f"{name} call to {self._address} failed") from None
        return response_class.FromString(raw)

    def open_insert_stream(self) -> _InsertStream:
        return _InsertStream(self._channel)

    def open_sample_stream(self, table: str, num_samples_per_request: int,
                           rate_limiter_timeout_ms: Optional[int], *,
                           max_samples_per_stream: Optional[int] = None) -> _SampleStream:
        return _SampleStream(self._channel, table, num_samples_per_request, rate_limiter_timeout_ms,
                             max_samples_per_stream)

    def mutate_priorities(self, table: str, updates: list, deletes: list) -> None:
        request = reverb_service_pb2.MutatePrioritiesRequest(table=table, delete_keys=[int(k) for k in deletes])
        for key, priority in updates:
            request.updates.add(key=int(key), priority=float(priority))
        self._call("MutatePriorities", request, reverb_service_pb2.MutatePrioritiesResponse)

    def reset(self, table: str) -> None:
        self._call("Reset", reverb_service_pb2.ResetRequest(table=table), reverb_service_pb2.ResetResponse)

    def server_info(self, timeout_s: Optional[float] = None) -> Dict[str, Any]:
        try:
            response = self._call("ServerInfo", reverb_service_pb2.ServerInfoRequest(),
                                  reverb_service_pb2.ServerInfoResponse, timeout_s)
        except errors.DeadlineExceededError as e:
            raise errors.DeadlineExceededError(
                f"ServerInfo call did not complete within provided timeout of {timeout_s}s") from e
        return {info.name: codec.table_info_from_proto(info) for info in response.table_info}

    def checkpoint(self) -> str:
        return self._call("Checkpoint", reverb_service_pb2.CheckpointRequest(),
                          reverb_service_pb2.CheckpointResponse).checkpoint_path

    def close(self) -> None:
        self._channel.close()
