"""Sample streams of the remote transport (see `replay_tf.grpc.client.client_transport` for the design)."""
from __future__ import annotations

import collections
import logging
import queue
import threading
from typing import Optional

import grpc

from replay_tf import errors
from replay_tf.core import chunk_store as chunk_store_lib
from replay_tf.core import table as table_lib
from replay_tf.grpc import common
from replay_tf.grpc import malloc
from replay_tf.grpc import shared_memory as shared_memory_lib
from replay_tf.wire import raw_fields
from replay_tf.wire import stacked_samples
from replay_tf.wire import limits
from replay_tf.wire import tensor_codec
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

_log = logging.getLogger(__name__)


class _ChunkCache(collections.OrderedDict):
    """Decoded chunks of one call by chunk key, least recently used first, with their total size in bytes.

    A chunk may arrive again with more rows (an in-process writer's open chunk grows); rows are only ever
    appended, so the entry with the most rows serves every slice within them."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0


class SampleStream:
    """A `SampleStream` of `replay_tf.client` over gRPC SampleStream calls.

    With `stacked`, the call asks for rl-data-tf's extension: the server may send whole responses of
    samples stacked per column, which `next_batch` hands out as `stacked_samples.StackedSamples` among the
    `SampledItem`s (Reverb servers ignore the request field and send entries). With `shared_memory` too, each
    call offers the server a segment of shared memory for those responses (`shared_memory`; servers on
    other machines, and Reverb servers, send them inline)."""

    def __init__(self, channel: grpc.Channel, table: str, num_samples_per_request: int,
                 rate_limiter_timeout_ms: Optional[int], max_samples_per_stream: Optional[int],
                 max_samples: Optional[int] = None, stacked: bool = False, shared_memory: bool = False):
        if num_samples_per_request < 1:
            raise ValueError(f"num_samples_per_request ({num_samples_per_request}) must be >= 1")
        self._method = channel.stream_stream(common.SERVICE + "SampleStream", request_serializer=common.identity,
                                             response_deserializer=common.identity)
        self._table = table
        self._num_samples = num_samples_per_request
        self._max_samples_per_stream = max_samples_per_stream
        self._budget = max_samples  # samples the caller may still take in all: never ask for more
        timeout = -1 if rate_limiter_timeout_ms is None or rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms
        if timeout == 0:
            timeout = 1  # Reverb servers read 0 as "wait forever"; the caller asked not to wait
        self._timeout_ms = timeout
        self._stacked = stacked
        self._shared_memory = stacked and shared_memory and shared_memory_lib.enabled()
        self._ring: Optional[shared_memory_lib.Ring] = None
        self._count = stacked_samples.count_samples if stacked else len
        self._requests: Optional[queue.Queue] = None
        self._results: Optional[queue.Queue] = None
        self._call = None
        self._state: Optional[_CallState] = None

    def _request(self, count: int, ring: Optional[shared_memory_lib.Ring] = None) -> bytes:
        request = reverb_service_pb2.SampleStreamRequest(table=self._table, num_samples=count,
                                                         replay_tf_stacked=self._stacked)
        request.rate_limiter_timeout.milliseconds = self._timeout_ms
        if ring is not None:
            request.replay_tf_shared_memory.CopyFrom(ring.offer())
        return request.SerializeToString()

    def _open(self) -> None:
        malloc.keep_large_buffers_in_heap()  # every response is one buffer of up to ~2 MiB (see malloc)
        self._requests = queue.Queue()
        self._results = queue.Queue()
        requests, results = self._requests, self._results
        state = self._state = _CallState()
        ring = self._ring = self._new_ring()

        def iterate():
            while True:
                request = requests.get()
                if request is common.CLOSE:
                    return
                yield request

        call = self._method(iterate(), wait_for_ready=True)
        self._call = call
        # Responses are read and decoded by a thread, which also sends the next request as soon as the
        # previous one's samples have all arrived while fewer than a request's worth wait to be taken (as
        # Reverb's workers keep `max_in_flight_samples_per_worker` in flight): the server samples and sends
        # while the caller stacks. `next_batch` hands out every sample that has arrived.
        count = self._next_count(0)
        self._spend(count)
        requests.put(self._request(count, ring))
        threading.Thread(target=self._read, args=(call, requests, results, state, count, ring),
                         name="replay_tf-sample-stream", daemon=True).start()

    def _new_ring(self) -> Optional[shared_memory_lib.Ring]:
        """A shared-memory segment to offer this call's server, if this stream uses them and one can be made."""
        if not self._shared_memory:
            return None
        try:
            return shared_memory_lib.Ring.create()
        except OSError as e:  # (e.g. /dev/shm full: the samples come inline)
            _log.debug("no shared memory for sample stream of table '%s': %s", self._table, e)
            return None

    def _next_count(self, stream_samples: int) -> int:
        """Samples to ask for next on a call that has received `stream_samples` (0: re-open the call)."""
        count = self._num_samples
        if self._budget is not None:
            count = min(count, self._budget)
        if self._max_samples_per_stream is None:
            return count
        return max(0, min(count, self._max_samples_per_stream - stream_samples))

    def _spend(self, count: int) -> None:
        if self._budget is not None:
            self._budget -= count

    def _read(self, call, requests: queue.Queue, results: queue.Queue, state: "_CallState", asked: int,
              ring: Optional[shared_memory_lib.Ring]) -> None:
        partial: list = [None]  # (info, {chunk key: Chunk}) of a sample split over responses
        cache = _ChunkCache()  # this call's decoded chunks
        received = stream_samples = 0
        try:
            for raw in call:
                if ring is not None:
                    ring.unlink()  # (the server has mapped it, or never will)
                    if raw[:2] == raw_fields.TAG_RESPONSE_SHARED_SLOT:
                        slot = reverb_service_pb2.SampleStreamResponse.FromString(raw).replay_tf_shared_slot
                        raw = ring.take(slot.slot, slot.size)
                        if raw[:2] != raw_fields.TAG_RESPONSE_STACKED:
                            raise errors.ReverbError("SampleStream wrote a response other than stacked samples "
                                                     "into shared memory")
                stacked = stacked_samples.read_stacked_response(raw) if self._stacked else None
                if stacked is not None and partial[0] is None:
                    batch = [stacked]
                else:  # (a stacked response inside a sample is an error, which _samples raises)
                    batch = self._samples(reverb_service_pb2.SampleStreamResponse.FromString(raw), partial, cache)
                if batch:
                    count = self._count(batch)
                    with state.cv:
                        state.buffered += count
                    results.put(batch)
                    received += count
                    stream_samples += count
                if received < asked:
                    continue
                received = 0
                if self._budget == 0:
                    return  # the caller takes no more: asking on would sample items nobody receives
                asked = self._next_count(stream_samples)
                if asked == 0:  # max_samples_per_stream reached: re-open to rebalance, as Reverb's sampler does
                    results.put(_REOPEN)
                    return
                with state.cv:
                    while state.buffered >= self._num_samples and not state.closed:
                        state.cv.wait()
                    if state.closed:
                        return
                self._spend(asked)
                requests.put(self._request(asked))
            results.put(errors.ReverbError(f"SampleStream of table '{self._table}' ended before the samples "
                                           f"asked for arrived"))
        except grpc.RpcError as e:
            results.put(common.translate_error(e, f"Sampling table '{self._table}' failed"))
        except Exception as e:  # noqa: BLE001  (a malformed response ends this stream, with its reason)
            results.put(errors.ReverbError(f"SampleStream of table '{self._table}' sent an unreadable "
                                           f"response: {type(e).__name__}: {e}"))

    def next_batch(self, poll_ms: Optional[float] = None) -> list:
        while True:
            if self._call is None:
                self._open()
            try:
                # With poll_ms the request stays outstanding: the next call goes on waiting for it.
                first = self._results.get(timeout=None if poll_ms is None else poll_ms / 1000.0)
            except queue.Empty:
                return []
            if first is _REOPEN:
                self.close()
                continue
            if isinstance(first, Exception):
                self.close()
                raise first
            batch = first
            count = self._count(batch)
            # Everything else that has arrived, up to a request's worth.
            while count < self._num_samples:
                try:
                    more = self._results.get_nowait()
                except queue.Empty:
                    break
                if more is _REOPEN or isinstance(more, Exception):
                    self._results.put(more)  # handled by the next call, after these samples (nothing follows it)
                    break
                batch = batch + more
                count += self._count(more)
            state = self._state
            with state.cv:
                state.buffered -= count
                state.cv.notify()
            return batch

    @staticmethod
    def _chunk(proto: schema_pb2.ChunkData, cache, decode=tensor_codec.decode_tensor,
               pending=tensor_codec.pending_tensor) -> tuple:
        """`(chunk, rows, tensors, nbytes)` for `proto`: its chunk, its number of rows and of tensors (for the
        bounds checks of `_sampled_item`) and its decoded bytes (what the cache counts).

        A one-row chunk (Reverb's writers and ours send big steps one per chunk) stays encoded and is not
        cached: every slice of it is all of it, so `TrajectoryDataset` decodes it straight into its batch
        (its `tensors` decode on first access otherwise), and keeping it would cost a copy of its content
        all the same while crowding the cache. Longer chunks, whose
        slices overlap, are decoded now, once per call: `cache` keeps them while they have the most rows
        seen for their key."""
        r = proto.sequence_range
        key, start = proto.chunk_key, r.start
        rows = r.end - start + 1
        entry = cache.get(key)
        if entry is not None and entry[1] >= rows:
            cache.move_to_end(key)
            return entry
        delta = proto.delta_encoded
        # (chunk_codec.decode_chunk_tensors, inlined: chunks from old checkpoints keep their tensors elsewhere)
        encoded = proto.data.tensors if proto.HasField("data") else proto.deprecated_data
        sequence_range = chunk_store_lib.SequenceRange(r.episode_id, start, r.end, r.sparse)
        # (indexing a repeated field costs a fraction of iterating over it)
        if rows == 1:
            tensors = [pending(encoded[i], delta_encoded=delta) for i in range(len(encoded))]
            if None not in tensors:  # (None: a header not seen before, which decode_tensor checks)
                for t in tensors:
                    if t.shape[:1] != (1,):
                        raise errors.ReverbError(f"chunk {key} has 1 row but a tensor of shape {list(t.shape)}")
                chunk = chunk_store_lib.Chunk(key, None, sequence_range, delta_encoded=delta, encoded=tensors,
                                              decoder=_decode_pending)
                return chunk, 1, len(tensors), sum(t.nbytes for t in tensors)
        tensors = [decode(encoded[i], delta_encoded=delta) for i in range(len(encoded))]
        chunk = chunk_store_lib.Chunk(key, tensors, sequence_range, delta_encoded=delta)
        nbytes = common.CHUNK_CACHE_ENTRY_BYTES + sum(t.nbytes for t in tensors)
        if entry is not None:  # the same chunk with fewer rows
            cache.nbytes -= entry[3]
            del cache[key]
        entry = cache[key] = (chunk, rows, len(tensors), nbytes)
        cache.nbytes += nbytes
        while len(cache) > 1 and (len(cache) > common.CHUNK_CACHE_SIZE or cache.nbytes > common.CHUNK_CACHE_BYTES):
            cache.nbytes -= cache.popitem(last=False)[1][3]
        return entry

    def _samples(self, response, partial: list, cache) -> list:
        if response.HasField("replay_tf_shared_slot"):
            raise errors.ReverbError("SampleStream sent a shared-memory slot, which this stream did not offer")
        if response.HasField("replay_tf_stacked"):
            if not self._stacked:
                raise errors.ReverbError("SampleStream sent stacked samples, which this stream did not ask for")
            if len(response.entries) or partial[0] is not None:
                raise errors.ReverbError("SampleStream sent stacked samples with entries, or inside a sample")
            return [stacked_samples.stacked_from_proto(response.replay_tf_stacked)]
        out = []
        sampled_item = table_lib.SampledItem
        entries = response.entries
        for e in range(len(entries)):
            entry = entries[e]
            if entry.HasField("info"):
                partial[0] = (entry.info, [])
            elif partial[0] is None:
                raise errors.ReverbError("SampleStream sent sample data before its info")
            data = entry.data
            if len(data):
                partial[0][1].append(data)
            if entry.end_of_sequence:
                info, sent = partial[0]
                partial[0] = None
                item_proto = info.item
                priority, times_sampled = item_proto.priority, item_proto.times_sampled
                item = _sampled_item(item_proto.key, priority, times_sampled, item_proto.flat_trajectory, sent,
                                     cache, self._chunk)
                out.append(sampled_item(item, priority, times_sampled, info.probability, info.table_size,
                                        info.rate_limited))
        return out

    def close(self) -> None:
        if self._call is not None:
            with self._state.cv:
                self._state.closed = True
                self._state.cv.notify()
            self._requests.put(common.CLOSE)
            try:
                self._call.cancel()
            except Exception:  # noqa: BLE001  (grpc may already be torn down at interpreter exit)
                pass
            self._call = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None


class _CallState:
    """What the reader thread of one call shares with `next_batch`: samples received and not yet taken."""

    def __init__(self):
        self.cv = threading.Condition()
        self.buffered = 0
        self.closed = False


_REOPEN = object()  # the reader's marker: max_samples_per_stream reached, open a new call


def _decode_pending(tensors: list) -> list:
    return [t.decode() for t in tensors]


def _slice_bytes(chunk: chunk_store_lib.Chunk, index: int, start: int, stop: int) -> int:
    """The bytes rows `[start, stop)` of tensor `index` of a sampled chunk decode to (strings: each element
    counted as `limits.STRING_ELEMENT_BYTES` plus its bytes), read from headers or the decoded tensor's view."""
    encoded = chunk.encoded
    if type(encoded) is list and not chunk.is_decoded:  # a one-row chunk's PendingTensors
        return encoded[index].nbytes * (stop - start)
    part = chunk.tensors[index][start:stop]
    if part.dtype.kind == "O":
        return part.size * limits.STRING_ELEMENT_BYTES + sum(map(len, part.reshape(-1)))
    return part.nbytes


def _sampled_item(key: int, priority: float, times_sampled: int, trajectory_proto, sent: list, cache,
                  chunk_of) -> chunk_store_lib.Item:
    """A core `Item` for a sample, from its proto and the `ChunkData` lists of its entries (`sent`).

    A slice whose chunk the call's cache already holds with enough rows is read from there (the server
    sends every chunk with every sample that uses it: looking at its key is enough); otherwise every chunk
    sent with the sample goes through `chunk_of` first. Bounds are checked here, so the item is made with
    `Item.from_resolved`: a sample is unpacked once, full validation would only cost."""
    sent_keys = {data[i].chunk_key for data in sent for i in range(len(data))}
    own = None  # chunk key -> (chunk, rows, tensors, nbytes) of the chunks sent with this sample, when needed
    get, touch = cache.get, cache.move_to_end
    columns = []
    nbytes = 0  # what the item's columns decode to: checked before anything is assembled
    trajectory = trajectory_proto.columns
    for c in range(len(trajectory)):  # (indexing a repeated field costs a fraction of iterating over it)
        column = trajectory[c]
        flat = [column.squeeze]
        slices = column.chunk_slices
        for j in range(len(slices)):
            s = slices[j]
            chunk_key = s.chunk_key
            start, index = s.offset, s.index
            stop = start + s.length
            found = get(chunk_key) if chunk_key in sent_keys else None
            if found is None or stop > found[1]:
                if own is None:
                    own = {}
                    for data in sent:
                        for i in range(len(data)):
                            entry = chunk_of(data[i], cache)
                            own[entry[0].key] = entry
                found = own.get(chunk_key)
                if found is None:
                    raise errors.ReverbError(f"sampled item {key} refers to chunk {chunk_key}, which the server "
                                             f"did not send with it")
            else:
                touch(chunk_key)
            chunk, rows, tensors, _ = found
            if start < 0 or stop > rows or stop <= start or not 0 <= index < tensors:
                raise errors.ReverbError(f"sampled item {key}: slice [{start}, {stop}) of tensor {index} is out of "
                                         f"chunk {chunk_key}'s {tensors} tensors of {rows} rows")
            flat += (chunk, index, start, stop)
            nbytes += _slice_bytes(chunk, index, start, stop)
        if len(flat) == 1:
            raise errors.ReverbError(f"sampled item {key} has a column without chunk slices")
        columns.append(tuple(flat))
    if not columns:
        raise errors.ReverbError(f"sampled item {key} has no columns")
    if nbytes > limits.MAX_ITEM_BYTES:
        raise errors.ReverbError(
            f"sampled item {key} decodes to {nbytes} bytes (each chunk slice counted as often as the item names "
            f"it), over replay_tf.wire.limits.MAX_ITEM_BYTES ({limits.MAX_ITEM_BYTES}); nothing was allocated for "
            f"it: raise the limit in this process to sample it")
    item = chunk_store_lib.Item.from_resolved(key, priority, tuple(columns))
    item.times_sampled = times_sampled
    return item
