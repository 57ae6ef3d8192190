"""A table's pending inserts and the back-pressure they put on insert streams.

`InsertQueue` holds the items of a table that the rate limiter holds back, inserted in order by a worker
thread; `InsertStreamState` is what one InsertStream's reader, the queues holding its items and its
sender share (keys to confirm, the first error, items still queued).
"""
from __future__ import annotations

import collections
import threading
import traceback
from typing import Optional

import grpc

from replay_tf import errors
from replay_tf.core import table as table_lib
from replay_tf.grpc import common
from replay_tf.grpc.server import statuses
from replay_tf.grpc.server import stream_slots

__all__ = ["InsertQueue", "InsertStreamState"]


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
            else:
                self.fail(error)  # (`cv`'s lock is reentrant)
            self.cv.notify_all()

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


class InsertQueue:
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

    def put(self, item, stream: InsertStreamState, confirmed: list) -> None:
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
                self._cv.wait(common.WAIT_SLICE_MS / 1000.0)
                if not stream.active():
                    raise statuses.client_gone()
            if not self._working:
                # (The worker waits for `_cv`, held here, before it looks at the queue.)
                if not stream_slots.start_thread(self._work, f"replay_tf-inserts-{self._table.name}"):
                    raise statuses.StatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, stream_slots.thread_refusal(
                        f"the insert queue of table '{self._table.name}'"))
                self._working = True
            self._pending.append((item, stream))
            stream.queued()

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
                    raise statuses.client_gone()
                _insert(self._table, item, stream)
            except Exception as e:  # noqa: BLE001  (reported to the item's stream)
                error = e
            with self._cv:
                self._pending.popleft()
                self._cv.notify_all()
            stream.finished(item.key, error)
            item = stream = error = None  # this frame may live on in `error`'s traceback


def _insert(table: table_lib.Table, item, stream: InsertStreamState) -> None:
    """Inserts `item`, waiting on the rate limiter in slices so that a vanished client is noticed."""
    while True:
        try:
            table.insert_or_assign(item, timeout_ms=common.WAIT_SLICE_MS)
            return
        except errors.DeadlineExceededError:
            if not stream.active():
                raise statuses.client_gone() from None
