"""The SampleStream handler: samples drawn in Reverb's flexible batches, sent as entries or stacked.

Each request asks for `num_samples`; the table answers in flexible batches (64 first, then doubling) and
every sample becomes one or more entries (the first carries `info`, the last has `end_of_sequence`),
several samples per response up to ~2 MiB. A rate-limiter timeout with nothing sampled ends the stream
with DEADLINE_EXCEEDED and Reverb's message. A client that asks for stacked samples (rl-data-tf's
extension) gets whole samples stacked per column, written into its shared memory when it offered some.
"""
from __future__ import annotations

import math
import threading
import time
import weakref
from typing import Callable, Iterator, Optional

import grpc

from replay_tf.sampling import stacking
from replay_tf.wire import stacked_samples
from replay_tf import errors
from replay_tf.core import table as table_lib
from replay_tf.grpc import common
from replay_tf.grpc import malloc
from replay_tf.grpc import shared_memory
from replay_tf.grpc.server import statuses
from replay_tf.grpc.server import table_entry
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import protos
from replay_tf.wire import reverb_service_pb2

__all__ = ["SampleStreams"]

_RESPONSE_TARGET_BYTES = 2 << 20   # start a new SampleStreamResponse past this size (Reverb's 2 MiB)
_FIRST_SAMPLE_BATCH = 64           # Reverb's flexible batches: 64 samples first, then doubling
_MAX_SAMPLE_BATCH = 1024
_DECODED_CHUNK_BYTES = 64 << 20    # decoded multi-row chunks kept for stacked sample streams (stacking)


class SampleStreams:
    """The SampleStream handler over a servicer's tables, with what it caches about sampled items."""

    def __init__(self, entry_of: Callable[[str], table_entry.TableEntry]):
        self._entry_of = entry_of  # table name -> TableEntry, or NOT_FOUND
        # Serialized unchanging fields of each sampled item (key, table, inserted_at, flat trajectory), and the
        # `SampleEntry.data` tag and length of each sampled chunk, built on first use.
        self._trajectories: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._chunk_heads: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._trajectories_lock = threading.Lock()
        self._decoded_chunks = stacking.DecodedChunks(_DECODED_CHUNK_BYTES)  # for stacked sample streams

    def stream(self, request_iterator, context) -> Iterator[bytes]:
        """Serves one SampleStream call: samples for each request, yielding the responses."""
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
                request = statuses.parse(reverb_service_pb2.SampleStreamRequest, raw)
                if request.num_samples <= 0:
                    raise statuses.StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                                               f"num_samples ({request.num_samples}) must be > 0")
                entry = self._entry_of(request.table)
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
            slice_ms = common.WAIT_SLICE_MS
            if deadline is not None:
                slice_ms = min(slice_ms, max(0.0, (deadline - time.monotonic()) * 1000.0))
            if cancelled.is_set():
                raise statuses.client_gone()
            try:
                batch = table.sample(num_samples, timeout_ms=slice_ms, cancelled=cancelled)
            except errors.DeadlineExceededError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise statuses.StatusError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                               errors.RATE_LIMITER_TIMEOUT_MESSAGE) from None
                if not context.is_active():
                    raise statuses.client_gone() from None
                waited = True
                continue
            if waited and batch:
                batch[0] = batch[0]._replace(rate_limited=True)
            return batch

    def _item_prefix(self, entry: table_entry.TableEntry, item) -> bytes:
        """Serialized key, table, inserted_at and flat trajectory of an item (cached: they never change)."""
        prefix = self._trajectories.get(item)
        if prefix is None:
            trajectory = protos.trajectory_to_proto(item.trajectory).SerializeToString()
            prefix = raw_fields.item_prefix(item.key, entry.table_field, item.inserted_at, trajectory)
            with self._trajectories_lock:
                self._trajectories[item] = prefix
        return prefix

    def _chunk_fields(self, item) -> list:
        fields = []
        for chunk in item.chunks.values():
            cached = self._chunk_heads.get(chunk)
            serialized = chunk_codec.serialized_chunk(chunk)
            if cached is None or cached[1] is not serialized:
                cached = raw_fields.chunk_field(serialized)
                self._chunk_heads[chunk] = cached
            fields.append(cached)
        return fields

    def _stacked_responses(self, entry: table_entry.TableEntry, batch: list, ring: Optional[shared_memory.Ring],
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
            layouts = stacking.column_layouts(batch[start].item, tensors_of, pending_of)
            if layouts is None:  # (strings: a table's items all have them, so the rest goes as entries)
                yield from self._responses(entry, batch[start:])
                return
            per_sample = max(1, sum(dtype.itemsize * math.prod(shape) for dtype, shape in layouts))
            stop = min(len(batch), start + max(1, _RESPONSE_TARGET_BYTES // per_sample))
            group, start = batch[start:stop], stop
            items = [s.item for s in group]
            layout = stacked_samples.StackedLayout(group, layouts)
            if ring is not None and layout.size <= ring.slot_bytes:
                acquired = ring.acquire(cancelled.is_set)
                if acquired is None:
                    raise statuses.client_gone()
                slot, buffer = acquired
                fits = stacking.gather_into(layout, buffer, items, tensors_of, pending_of)
                del buffer
                if fits:
                    ring.publish(slot)
                    response = reverb_service_pb2.SampleStreamResponse()
                    response.replay_tf_shared_slot.slot, response.replay_tf_shared_slot.size = slot, layout.size
                    yield response.SerializeToString()
                else:
                    yield from self._responses(entry, group)
                continue
            columns = stacking.stack_items(items, layouts, tensors_of, pending_of)
            if columns is None:
                yield from self._responses(entry, group)
            else:
                yield layout.join(columns)

    def _responses(self, entry: table_entry.TableEntry, batch: list) -> Iterator[bytes]:
        parts, size = [], 0
        for sampled in batch:
            item = sampled.item
            info = raw_fields.sample_info(self._item_prefix(entry, item), sampled.priority, sampled.times_sampled,
                                    sampled.probability, sampled.table_size, sampled.rate_limited)
            # One entry per sample unless the response would grow past the target: then the sample
            # continues in the next response, in entries without info.
            pending: list = []
            for field in self._chunk_fields(item):
                chunk_size = len(field[1])
                if pending and size + chunk_size > _RESPONSE_TARGET_BYTES:
                    parts += raw_fields.entry_parts(info, pending, False)
                    yield b"".join(parts)
                    parts, size, info, pending = [], 0, None, []
                pending.append(field)
                size += chunk_size
            parts += raw_fields.entry_parts(info, pending, True)
            size += 64
            if size >= _RESPONSE_TARGET_BYTES:
                yield b"".join(parts)
                parts, size = [], 0
        if parts:
            yield b"".join(parts)
