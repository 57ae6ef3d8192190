"""Samples of an in-process table handed to tf.data through a TensorFlow queue, for every iterator that asks
for the same batches.

TF-Agents' `ReverbReplayBuffer.as_dataset` interleaves up to 32 `TrajectoryDataset`s of a few samples each
(6 at a time for its DQN shape). Sampling them through one `numpy_function` call per batch costs more Python
time per sample than the sampling itself, spent on tf.data's threads under the GIL. Here the iterators of
one table, batch size and layout share a `SharedSamples`: one Python thread samples for all of them, packs
several batches at once (`packed_rows`) and enqueues them with one call, and each iterator dequeues its
batches in the graph: no Python on tf.data's threads.

Samples in flight: as a Reverb worker has at most `max_in_flight_samples_per_worker` samples in flight,
each open iterator is owed at most one batch: the queue holds at most one batch per open iterator, and the
feeder samples again only after a batch was dequeued (each dequeue puts a token in a second queue, which
the feeder waits on in TensorFlow, without the GIL, and takes all of at each round). An iterator opening
or closing ends the feeder's wait for a table that refuses samples, so a round is never sampled for
iterators gone. When the last iterator closes, the batches left are dropped and the thread ends; the next
iterator starts another.

Used only where that changes nothing a user can tell (`sources.shared_table_server`): a table of this
process known by name when the dataset is built, eagerly, with items that are never deleted by sampling
(`max_times_sampled` 0: a queue's items must reach the iterator that took them), small numeric columns of
a fixed shape (packed, see `batch_source`), one worker per iterator, no sample limit and no rate-limiter
timeout. Each iterator decides when it opens: while the server found when the dataset was built still
runs and holds the same table, and no error ended the feeder, it reads the shared queue; otherwise (a
server stopped and another started on that port, say) it reads through the per-iterator source
(`per_iterator`), exactly as with `REPLAY_TF_SHARED_SAMPLES=0`, which turns this off. An error in the
feeder (the server stopped, an item of another shape) closes the queue: the iterators reading it raise
that error, with the type and message the per-iterator source raises (both go through `batch_source`'s
ends).
"""
from __future__ import annotations

import os
import threading
from typing import Optional

import numpy as np
import tensorflow as tf
import tree

from replay_tf.transport import local_servers
from replay_tf import errors
from replay_tf.sampling import batch_source
from replay_tf.sampling import interpreter_exit
from replay_tf.sampling.per_iterator import PerIteratorBatches
from replay_tf.sampling.stacker import Stacker

# `SharedSamples` by (server, address, table, samples per batch, layout, column names). Kept for the life of
# the process: a pipeline traced with one of their queues may outlive every Python object of its dataset,
# and a queue deleted under it would fail its reads. Those of a stopped server let go of its tables
# (`_release`), so what stays is two empty queues each.
_SHARED: dict = {}
_LOCK = threading.Lock()
_POLL_MS = 100  # the feeder re-checks for closing at least this often while the table refuses samples
_CONSUMED, _WAKE = 0, 1  # tokens: a batch was dequeued; the number of open iterators changed
_SHARED_SOURCE, _OWN_SOURCE = 0, 1  # what an iterator reads: the shared queue, or the per-iterator source
# The feeder refills once 1 / _REFILL_DIVISOR of the open iterators' batches were taken (see `_feed`).
_REFILL_DIVISOR = 4


def enabled() -> bool:
    """Whether `REPLAY_TF_SHARED_SAMPLES` allows shared samples (anything but "0")."""
    return os.environ.get("REPLAY_TF_SHARED_SAMPLES", "1") != "0"


class SharedSamples:
    """The batches of `request` samples of one table of `server`, packed as `packer` packs them (or, for
    batches it cannot pack, as `stacker` stacks them, in the `packing` of `batch_source.pack`)."""

    def __init__(self, key: tuple, server, address: str, table: str, request: int, packer, stacker: Stacker,
                 packing: tuple):
        self.key = key
        self._server = server
        self._address = address
        self._table = server.table(table)
        self._table_name = table
        self._request = request
        self._packer = packer
        self._stacker = stacker  # (raises ValueError for columns of another layout)
        self._packing = packing
        with tf.init_scope():
            self.queue = tf.queue.FIFOQueue(2 ** 20, [tf.uint8, tf.int32],
                                            shapes=[[request, packer.row_bytes], []])
            # (unbounded: a put never blocks; the feeder takes every token there at each round)
            self.tokens = tf.queue.FIFOQueue(-1, [tf.int8], shapes=[[]])
        self._cv = threading.Condition()
        self._open = 0           # iterators reading the queue
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._changed = threading.Event()  # the open count changed (or stop): a round's sampling ends
        self.error: Optional[BaseException] = None

    # --- iterators ---

    def usable(self) -> bool:
        """Whether a new iterator may read the queue: no error ended the feeder, and the server found when
        the dataset was built still runs and holds the same table."""
        server = self._server
        return (server is not None and not self._stop.is_set() and not server.stopped
                and local_servers.find_local_server(self._address) is server
                and server.tables.get(self._table_name) is self._table)

    def opened(self) -> bool:
        """Counts an iterator that will read the queue; False (counting nothing) when none may (`usable`)."""
        if not self.usable():
            return False
        with self._cv:
            if self._stop.is_set():
                return False
            if self._thread is None:
                thread = threading.Thread(target=self._feed, daemon=True,
                                          name=f"replay_tf-shared-samples {self._address}/{self._table_name}")
                thread.start()  # (raises before anything is counted: a later iterator starts another)
                self._thread = thread
            self._open += 1
            count = _wake_count(self._open)
        self._counts_changed()
        self._wake(count)
        return True

    def closed(self) -> None:
        with self._cv:
            self._open -= 1
            count = _wake_count(self._open + 1)
        self._counts_changed()
        self._wake(count)

    def _counts_changed(self) -> None:
        """Ends a wait of the feeder's sampling for a table that refuses samples: that round was computed
        for other iterators (nothing is sampled for iterators gone)."""
        self._changed.set()
        table = self._table
        if table is not None:
            table.wake_waiters()

    def _wake(self, count: int = 1) -> None:
        """Puts `count` wake tokens: at least as many as the feeder may be waiting for (`_wake_count`)."""
        self.tokens.enqueue_many(tf.constant(np.full([count], _WAKE, np.int8)))

    # --- the feeder ---

    def _feed(self) -> None:
        try:
            while True:
                # Tokens first: each was put after the change it reports (a dequeue, a count changed), so
                # the counts read next include every change whose token is taken here.
                self._take_tokens(0)
                self._changed.clear()  # (before the counts are read: a change after it ends the round)
                with self._cv:
                    if self._stop.is_set():
                        self._thread = None
                        return
                    if self._open == 0:
                        self._drop_left_locked()
                        self._thread = None
                        return
                    open_ = self._open
                # Batches owed: one per open iterator, less those in the queue (a batch taken by an
                # iterator being destroyed may never put its token: the queue's size is the count).
                owed = open_ - int(self.queue.size())
                threshold = _refill_threshold(open_)
                # (refilled once that many batches are taken, or the queue is empty: each round's sampling
                # and enqueue cost the same for one batch or several)
                if owed > 0 and (owed >= threshold or owed == open_):
                    self._enqueue(owed)
                else:
                    self._take_tokens(threshold - max(owed, 0))
        except BaseException as e:  # noqa: BLE001  (the iterators reading the queue raise it, see `finish`)
            with self._cv:
                if self.error is None:
                    self.error = e
                self._stop.set()
                self._thread = None
            self.close()

    def _drop_left_locked(self) -> None:
        """Drops the batches no open iterator is owed (sampled for iterators now closed) and the tokens."""
        for queue in (self.queue, self.tokens):
            left = int(queue.size())
            if left:
                queue.dequeue_many(left)

    def _take_tokens(self, count: int) -> None:
        """Takes every token there, blocking (in TensorFlow, without the GIL) until there were at least
        `count`: batches dequeued, or the iterators changed (`_wake` puts enough tokens for any count asked
        before the change). Only this thread takes tokens, so the queue holds at least its `size()`."""
        count = max(count, int(self.tokens.size()))
        if count:
            self.tokens.dequeue_many(count)

    def _enqueue(self, count: int) -> None:
        samples = self._sample(count * self._request)
        if not samples:
            return
        request = self._request
        if len(samples) == count * request:  # (full batches: packed at once)
            packed = self._packer.pack(samples)
            if packed is not None:
                self.queue.enqueue_many([packed.reshape(count, request, -1), np.full([count], request, np.int32)])
                return
        batches, sizes = [], []
        for start in range(0, len(samples), self._request):
            batch = samples[start:start + self._request]
            packed = self._packer.pack(batch)
            if packed is None:  # (rows not kept for a large table, or another layout: raises for the latter)
                packed = batch_source.pack(self._stacker.stack_flat(batch, None, self._table_name), self._packing)
            if len(batch) < self._request:
                packed = np.concatenate([packed, np.zeros((self._request - len(batch), packed.shape[1]),
                                                          np.uint8)])
            batches.append(packed)
            sizes.append(len(batch))
        self.queue.enqueue_many([np.stack(batches), np.array(sizes, np.int32)])

    def _sample(self, count: int) -> list:
        """`count` samples; none if the open count changed while the table refused samples (the round is
        computed again, so nothing is sampled for iterators gone)."""
        while True:
            if self._stop.is_set():
                raise errors.CancelledError(f"sampling from table '{self._table_name}' was cancelled")
            try:
                return self._table.sample(count, timeout_ms=_POLL_MS, cancelled=self._changed)
            except errors.CancelledError:
                if self._stop.is_set() or not self._changed.is_set():
                    raise  # (stopped, or the table closed: its server stopped)
                return []
            except errors.DeadlineExceededError:
                pass

    def close(self, join_s: float = 0.0) -> None:
        """Ends the feeder (waiting up to `join_s` for its thread); iterators reading the queue see its end
        (and `error`, if any), later ones read through the per-iterator source."""
        self._stop.set()
        try:
            self._counts_changed()
        except Exception:  # noqa: BLE001  (a stopped table has no waiters)
            pass
        try:
            # (the tokens stay open: a reader that dequeued its batch before this still puts its token)
            self.queue.close(cancel_pending_enqueues=True)
        except Exception:  # noqa: BLE001  (interpreter exit)
            pass
        with self._cv:
            count = _wake_count(self._open)
            thread = self._thread
        self._wake(count)  # (a feeder waiting for tokens)
        if join_s and thread is not None and thread is not threading.current_thread():
            thread.join(join_s)

    def _release(self) -> bool:
        """Lets go of a stopped server's table (and its items) once no iterator reads the queue; whether
        it did (the queues stay, see `_SHARED`)."""
        with self._cv:
            if self._server is None or not self._server.stopped or self._open or self._thread is not None:
                return False
            self._stop.set()
            self._server = self._table = None
            self._stacker = None
            return True

    # --- the graph side ---

    def read(self, unused_key: tf.Tensor) -> tf.Tensor:
        """One batch, as `[rows, row_bytes]` uint8 (the packed layout of `batch_source`)."""
        batch, size = self.queue.dequeue()
        with tf.control_dependencies([batch, size]):  # (the token only once the batch has left the queue)
            token = self.tokens.enqueue(tf.constant(_CONSUMED, tf.int8))
        with tf.control_dependencies([token]):
            return batch[:size]

    def ended_by(self, key: np.ndarray) -> Optional[str]:
        """The end of an iterator's batches (see `batch_source.end_of_elements`): raises the feeder's error
        unless it is a quiet one (the server stopped), whose message it returns; None if there is none."""
        del key
        if self.error is None:
            return None
        if isinstance(self.error, batch_source.QUIET_ERRORS):
            return f"{type(self.error).__name__}: {self.error}"
        raise self.error.with_traceback(None)  # (raised by every reader: no traceback piling up)


class SharedBatches:
    """The batches of `request` samples of `table` of `server` (at `address`), packed by `packer`, from the
    `SharedSamples` of those; iterators that may not read it (`SharedSamples.usable`) read `per_iterator`,
    the per-iterator source of the same elements. `names` (the columns' paths) are part of the key: the
    feeder's errors name them."""

    def __init__(self, server, address: str, table: str, request: int, packer, per_iterator: PerIteratorBatches,
                 names: tuple):
        self._server, self._address, self._table, self._request = server, address, table, request
        self._packer, self._names = packer, names
        self.per_iterator = per_iterator

    def batches(self) -> tf.data.Dataset:
        """Elements of the per-iterator source's `element_spec`; see the class docstring."""
        element_spec = self.per_iterator.element_spec
        own_source = self.per_iterator.batches()
        server, table = self._server, self._table
        flat_specs = tree.flatten(element_spec)
        packing = batch_source.packed_layout(flat_specs)
        key = (id(server), self._address, table, self._request, packing[0], tuple(packing[2]), self._names)
        with _LOCK:
            for old in list(_SHARED.values()):
                old._release()
            samples = _SHARED.get(key)
            if samples is None or not samples.usable() or samples._table is not server.tables.get(table):
                samples = SharedSamples(key, server, self._address, table, self._request, self._packer,
                                        self.per_iterator.stacker, packing)
                _SHARED[key] = samples

        def start():
            shared = samples.opened()
            try:
                yield np.int64(_SHARED_SOURCE if shared else _OWN_SOURCE)
            finally:
                if shared:
                    samples.closed()

        @tf.autograph.experimental.do_not_convert
        def read(key):
            return tree.unflatten_as(element_spec, batch_source.unpack(samples.read(key), flat_specs, packing))

        finish = batch_source.end_of_elements(samples.ended_by, element_spec)

        @tf.autograph.experimental.do_not_convert
        def per_iterator(key):
            # (one of the two, by what `start` decided: `take(0)` never starts its input's elements)
            shared = (tf.compat.v1.data.Dataset.from_tensors(key).repeat().map(read)
                      .concatenate(tf.compat.v1.data.Dataset.from_tensors(key).map(finish)))  # (error, or end)
            everything = tf.constant(-1, tf.int64)
            nothing = tf.constant(0, tf.int64)
            return shared.take(tf.where(key == _SHARED_SOURCE, everything, nothing)).concatenate(
                own_source.take(tf.where(key == _OWN_SOURCE, everything, nothing)))

        keys = batch_source.iterator_keys(lambda: interpreter_exit.ending_at_exit(start()))
        batches = keys.flat_map(per_iterator)
        batches._shared_samples = samples  # (kept while the dataset is)
        return batches


def _refill_threshold(open_count: int) -> int:
    """The batches taken (tokens) after which the feeder refills: 1 / `_REFILL_DIVISOR` of the open
    iterators' batches, at least one."""
    return max(1, open_count // _REFILL_DIVISOR)


def _wake_count(open_count: int) -> int:
    """Wake tokens enough for any wait of a feeder that counted at most `open_count` open iterators."""
    return _refill_threshold(open_count) + 1


def _close_all() -> None:
    """At exit (see `interpreter_exit`): ends every feeder and the queues' readers."""
    with _LOCK:
        shared = list(_SHARED.values())
    for samples in shared:
        samples.close(join_s=1.0)


def _after_fork() -> None:
    """In a forked child no feeder thread runs: forget the shared sources (datasets read their own), and
    make the lock anew (a thread of the parent may have held it)."""
    global _LOCK
    _LOCK = threading.Lock()
    for samples in list(_SHARED.values()):
        samples._stop.set()
        samples._thread = None
        samples._cv = threading.Condition()
        samples._open = 0
    _SHARED.clear()


interpreter_exit.register(_close_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
