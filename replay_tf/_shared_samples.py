"""Samples of an in-process table handed to tf.data through a TensorFlow queue, for every iterator that asks
for the same batches.

TF-Agents' `ReverbReplayBuffer.as_dataset` interleaves up to 32 `TrajectoryDataset`s of a few samples each
(6 at a time for its DQN shape). Sampling them through one `numpy_function` call per batch costs more Python
time per sample than the sampling itself, spent on tf.data's threads under the GIL. Here the iterators of
one table, batch size and layout share a `SharedSamples`: one Python thread samples for all of them, packs
several batches at once (`_packed_rows`) and enqueues them with one call, and each iterator dequeues its
batches in the graph: no Python on tf.data's threads.

Samples in flight: as a Reverb worker has at most `max_in_flight_samples_per_worker` samples in flight,
each open iterator is owed at most one batch: the queue holds at most one batch per open iterator, and the
feeder samples again only after a batch was dequeued (each dequeue puts a token in a second queue, which
the feeder waits on in TensorFlow, without the GIL). When the last iterator closes, the batches left are
dropped and the thread ends; the next iterator starts another.

Used only where that changes nothing a user can tell (`TrajectoryDataset._shared_batches`): a table of
this process known by name when the dataset is built, eagerly, with items that are never deleted by
sampling (`max_times_sampled` 0: a queue's items must reach the iterator that took them), small numeric
columns of a fixed shape (packed, see `_batch_source`), one worker per iterator, no sample limit and no
rate-limiter timeout. The dataset is bound to the table it found when built. An error in the feeder (the
server stopped, an item of another shape) closes the queue for good: every iterator of that dataset raises
it, with the type and message the per-iterator source raises (`numpy_function` maps both alike); a dataset
built afterwards gets a new feeder. `REPLAY_TF_SHARED_SAMPLES=0` turns this off.
"""
from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tree

from replay_tf import _batch_source
from replay_tf import _generator_exit
from replay_tf import errors

# `SharedSamples` by (server, table, samples per batch, packed layout), while a dataset or a feeder holds them.
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_POLL_MS = 100  # the feeder re-checks for closing at least this often while the table refuses samples
_CONSUMED, _WAKE = 0, 1  # tokens: a batch was dequeued; the number of open iterators changed


def enabled() -> bool:
    """Whether `REPLAY_TF_SHARED_SAMPLES` allows shared samples (anything but "0")."""
    return os.environ.get("REPLAY_TF_SHARED_SAMPLES", "1") != "0"


class SharedSamples:
    """The batches of `request` samples of one table of `server`, packed as `packer` packs them."""

    def __init__(self, key: tuple, server, table: str, request: int, packer, stack: Callable[[list], list],
                 packing: tuple):
        self.key = key
        self._table = server.table(table)
        self._table_name = table
        self._request = request
        self._packer = packer
        self._stack = stack  # (samples -> flat columns, raising ValueError for columns of another layout)
        self._packing = packing
        with tf.init_scope():
            self.queue = tf.queue.FIFOQueue(2 ** 20, [tf.uint8, tf.int32],
                                            shapes=[[request, packer.row_bytes], []])
            self.tokens = tf.queue.FIFOQueue(2 ** 20, [tf.int8], shapes=[[]])
        self._cv = threading.Condition()
        self._open = 0           # iterators open
        self._in_flight = 0      # batches enqueued and not yet dequeued
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self.error: Optional[BaseException] = None

    # --- iterators ---

    def opened(self) -> None:
        with self._cv:
            self._open += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._feed, name="replay_tf-shared-samples", daemon=True)
                self._thread.start()
            count = self._open // 4 + 1
        self._wake(count)

    def closed(self) -> None:
        with self._cv:
            self._open -= 1
            count = self._open // 4 + 2
        self._wake(count)

    def _wake(self, count: int = 1) -> None:
        """Puts `count` wake tokens: at least as many as the feeder may be waiting for (it waits for at most
        a quarter of the open iterators' batches, counted before this change)."""
        try:
            self.tokens.enqueue_many(tf.constant(np.full([count], _WAKE, np.int8)))
        except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
            pass  # (closed: the feeder has ended)

    # --- the feeder ---

    def _feed(self) -> None:
        try:
            while True:
                with self._cv:
                    if self._stop.is_set():
                        self._thread = None
                        return
                    if self._open == 0:
                        self._drop_left_locked()
                        self._thread = None
                        return
                    owed = self._open - self._in_flight
                    # (refilled once a quarter of the open iterators' batches are taken, or the queue is
                    # empty: each round's sampling and enqueue cost the same for one batch or several)
                    threshold = max(1, self._open // 4)
                    refill = owed > 0 and (owed >= threshold or self._in_flight == 0)
                if refill:
                    self._enqueue(owed)
                else:
                    self._wait_for_tokens(threshold - max(owed, 0))
        except BaseException as e:  # noqa: BLE001  (every iterator raises it, see `finish`)
            self.error = e
            with self._cv:
                self._thread = None
            self.close()

    def _drop_left_locked(self) -> None:
        """Drops the batches no open iterator is owed (sampled for iterators now closed) and their tokens."""
        for queue in (self.queue, self.tokens):
            left = int(queue.size())
            if left:
                queue.dequeue_many(left)
        self._in_flight = 0

    def _wait_for_tokens(self, count: int) -> None:
        """Blocks (in TensorFlow, without the GIL) until `count` batches are dequeued or the iterators
        change (`_wake` puts enough tokens for any count asked before the change)."""
        tokens = self.tokens.dequeue_many(count).numpy()
        with self._cv:
            self._in_flight -= int(np.count_nonzero(tokens == _CONSUMED))

    def _enqueue(self, count: int) -> None:
        samples = self._sample(count * self._request)
        if not samples:
            return
        request = self._request
        if len(samples) == count * request:  # (full batches: packed at once)
            packed = self._packer.pack(samples)
            if packed is not None:
                with self._cv:
                    self._in_flight += count
                self.queue.enqueue_many([packed.reshape(count, request, -1), np.full([count], request, np.int32)])
                return
        batches, sizes = [], []
        for start in range(0, len(samples), self._request):
            batch = samples[start:start + self._request]
            packed = self._packer.pack(batch)
            if packed is None:  # (rows not kept for a large table, or another layout: raises for the latter)
                packed = _batch_source._pack(self._stack(batch), self._packing)
            if len(batch) < self._request:
                packed = np.concatenate([packed, np.zeros((self._request - len(batch), packed.shape[1]),
                                                          np.uint8)])
            batches.append(packed)
            sizes.append(len(batch))
        with self._cv:
            self._in_flight += len(batches)
        self.queue.enqueue_many([np.stack(batches), np.array(sizes, np.int32)])

    def _sample(self, count: int) -> list:
        while True:
            if self._stop.is_set():
                raise errors.CancelledError(f"sampling from table '{self._table_name}' was cancelled")
            try:
                return self._table.sample(count, timeout_ms=_POLL_MS, cancelled=self._stop)
            except errors.DeadlineExceededError:
                with self._cv:
                    if self._open == 0:
                        return []
                continue

    def close(self) -> None:
        """Ends the feeder; iterators still reading see the end of the queue (and `error`, if any)."""
        self._stop.set()
        try:
            self._table.wake_waiters()
        except Exception:  # noqa: BLE001  (a stopped table has no waiters)
            pass
        try:
            # (the tokens stay open: a reader that dequeued its batch before this still puts its token)
            self.queue.close(cancel_pending_enqueues=True)
        except Exception:  # noqa: BLE001  (interpreter exit)
            pass
        with self._cv:
            count = self._open // 4 + 1
        self._wake(count)  # (a feeder waiting for tokens)
        with _LOCK:
            if _SHARED.get(self.key) is self:
                del _SHARED[self.key]

    # --- the graph side ---

    def read(self, unused_key: tf.Tensor) -> tf.Tensor:
        """One batch, as `[rows, row_bytes]` uint8 (the packed layout of `_batch_source`)."""
        batch, size = self.queue.dequeue()
        with tf.control_dependencies([self.tokens.enqueue(tf.constant(_CONSUMED, tf.int8))]):
            return batch[:size]

    def finish(self, key: np.ndarray) -> np.ndarray:
        """The end of an iterator's batches: raises the feeder's error, if any (else ends the iteration)."""
        del key
        if self.error is not None:
            raise self.error
        raise StopIteration


def dataset(server, table: str, request: int, packer, stack: Callable[[list], list], element_spec: Any
            ) -> tf.data.Dataset:
    """Batches (elements of `element_spec`, a nest of `tf.TensorSpec`s with an unknown leading dimension)
    of `request` samples of `table`, packed by `packer`, from the `SharedSamples` of those."""
    flat_specs = tree.flatten(element_spec)
    packing = _batch_source._packing(flat_specs)
    key = (id(server), table, request, packer.row_bytes, packing[0], tuple(packing[2]))

    def shared() -> SharedSamples:
        with _LOCK:
            samples = _SHARED.get(key)
            if samples is None or samples._stop.is_set() or samples._table is not server.table(table):
                samples = SharedSamples(key, server, table, request, packer, stack, packing)
                _SHARED[key] = samples
            return samples

    samples = shared()

    def start():
        samples.opened()
        try:
            yield np.int64(0)
        finally:
            samples.closed()

    @tf.autograph.experimental.do_not_convert
    def read(key):
        return tree.unflatten_as(element_spec, _batch_source._unpack(samples.read(key), flat_specs, packing))

    @tf.autograph.experimental.do_not_convert
    def per_iterator(key):
        batches = tf.compat.v1.data.Dataset.from_tensors(key).repeat().map(read)
        # (after the queue ends: the feeder's error, or the end)
        end = tf.compat.v1.data.Dataset.from_tensors(key).map(
            lambda k: tree.unflatten_as(element_spec, _batch_source._unpack(
                tf.numpy_function(samples.finish, [k], tf.uint8, stateful=True), flat_specs, packing)))
        return batches.concatenate(end)

    keys = tf.data.Dataset.from_generator(lambda: _generator_exit.ending_at_exit(start()),
                                          output_signature=tf.TensorSpec([], tf.int64))
    batches = keys.flat_map(per_iterator)
    batches._shared_samples = samples  # (kept while the dataset is)
    return batches


def _close_all() -> None:
    with _LOCK:
        shared = list(_SHARED.values())
    for samples in shared:
        samples.close()


atexit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _SHARED.clear())
