"""A table's pending inserts: the items its rate limiter holds back, inserted in order by a worker thread.

As Reverb's table does, every table owns one queue (`Table.insert_queue`), and every path that must not
block its caller on the rate limiter puts items there: the in-process transport's insert streams and the
gRPC server's. An item is inserted at once when nothing waits and the limiter admits it; otherwise it joins
the line, which a worker thread (started when an item first waits, ended once the line stayed empty for a
second) inserts in order, each item as soon as the table admits it. So the items of one stream into one
table are inserted in the order they were put, whichever transport they came through.

Each queued item belongs to an `InsertOwner` (its stream), which hears when the item went in or failed, says
whether its items are still wanted (a closed stream, a vanished client: they are dropped, not inserted), and
chooses whether a full line blocks it (`waits_for_room`: Reverb's limit of `max(1, min(0.1 * max_size,
1000))` waiting items, the gRPC server's back-pressure) or only its flushes wait.
"""
from __future__ import annotations

import collections
import threading
import weakref
from typing import Callable, Optional, Protocol

from replay_tf import errors
from replay_tf.core.chunk_store import Item

__all__ = ["InsertOwner", "InsertQueue", "WAIT_SLICE_MS"]

#: A blocked insert or a wait for room re-checks at least this often that its owner still wants its items.
WAIT_SLICE_MS = 250
# A worker without work for this long exits (a later refused item starts a new one): starting a thread for
# every refusal would cost more than the insert, for a writer the limiter holds back now and then.
_IDLE_S = 1.0


class InsertOwner(Protocol):
    """The stream whose items wait in table queues."""

    #: Whether `put` blocks while the line is at its limit (the gRPC server then reads no more of the
    #: stream); False: the line grows and the owner's flushes wait instead (in-process writers).
    waits_for_room: bool

    def active(self) -> bool:
        """False once the owner's items are to be dropped instead of inserted."""

    def gone(self) -> BaseException:
        """The error that ends an item (or a wait for room) of an owner that is no longer active."""

    def will_wait(self) -> None:
        """Called before one of its items joins the line: an owner that reports inserted items in batches
        reports them now, so that none waits behind this item."""

    def queued(self) -> None:
        """One of its items joined the line (called with the queue's lock held)."""

    def finished(self, item: Item, error: Optional[BaseException]) -> None:
        """A queued item was inserted (`error` None) or failed, or was dropped (`error` is `gone()`)."""

    def start_worker(self, target: Callable[[], None], table_name: str) -> None:
        """Starts `target`, the queue's worker, on a new thread; raises when no thread can be started."""


class InsertQueue:
    """The pending inserts of one table (see the module docstring)."""

    def __init__(self, table):
        # (A weak reference: the table owns its queue; a running worker holds the table itself.)
        self._table = weakref.ref(table)
        self._table_name = table.name
        #: At most this many items wait for an owner that `waits_for_room` to put one more (Reverb's limit).
        self.limit = max(1, min(int(0.1 * table.max_size), 1000))
        self._cv = threading.Condition(threading.Lock())
        self._pending: collections.deque = collections.deque()  # (item, owner), oldest first
        self._current: Optional[tuple] = None  # the entry the worker is inserting: pending[0], never dropped
        self._working = False
        self._worker_thread: Optional[threading.Thread] = None
        self._num_waiting = 0  # threads waiting on `_cv` for the line to move (the worker notifies only then)
        self._idle = False  # the worker waits on `_cv` for items

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, item: Item, owner: InsertOwner) -> bool:
        """Inserts `item` now (True) when no item waits and the rate limiter admits it; else queues it
        behind the waiting items (False), to be reported to `owner.finished`. Errors of an insert attempted
        now (a closed table, a key taken by other data) are raised here."""
        # (Read without the lock: an owner puts from one thread, and its item being inserted by the worker
        # stays in the line until done, so no item of the owner's is passed; another owner's item queued at
        # this instant was refused by the limiter that admits this one, an order no lock would fix.)
        if not self._pending:
            try:
                self._table().insert_or_assign(item, timeout_ms=0)
                return True
            except errors.DeadlineExceededError:
                pass  # rate-limited: it waits
        with self._cv:
            owner.will_wait()
            if owner.waits_for_room:
                self._num_waiting += 1
                try:
                    while len(self._pending) >= self.limit:  # back-pressure: the owner is held meanwhile
                        self._cv.wait(WAIT_SLICE_MS / 1000.0)
                        if not owner.active():
                            raise owner.gone()
                finally:
                    self._num_waiting -= 1
            if not self._working:
                # (The worker waits for `_cv`, held here, before it looks at the line.)
                owner.start_worker(self._work, self._table_name)
                self._working = True
            self._pending.append((item, owner))
            owner.queued()
            if self._idle:
                self._cv.notify_all()
            return False

    def drop(self, owner: InsertOwner, wait_s: float = 0.0) -> int:
        """Removes `owner`'s waiting items (not reported to it) and returns how many; when the worker is
        inserting one of its items, waits up to `wait_s` for that attempt to end (the item may still land)."""
        with self._cv:
            kept = collections.deque(entry for entry in self._pending
                                     if entry[1] is not owner or entry is self._current)
            removed = len(self._pending) - len(kept)
            self._pending = kept
            if wait_s > 0 and threading.current_thread() is not self._worker_thread:
                self._num_waiting += 1
                try:
                    self._cv.wait_for(lambda: self._current is None or self._current[1] is not owner, wait_s)
                finally:
                    self._num_waiting -= 1
            return removed

    def _work(self) -> None:
        """The worker: inserts the waiting items in order, each blocking (in slices) while the table refuses."""
        table = self._table()
        self._worker_thread = threading.current_thread()
        while True:
            with self._cv:
                if not self._pending and table is not None:
                    self._idle = True
                    self._cv.wait(_IDLE_S)
                    self._idle = False
                if not self._pending or table is None:
                    dropped, self._pending = list(self._pending), collections.deque()
                    self._working = False
                    self._worker_thread = None
                    break
                self._current = self._pending[0]
                item, owner = self._current
            error = None
            try:
                # Waits on the rate limiter in slices, so that an owner gone meanwhile is noticed.
                while True:
                    if not owner.active():
                        raise owner.gone()
                    try:
                        table.insert_or_assign(item, timeout_ms=WAIT_SLICE_MS)
                        break
                    except errors.DeadlineExceededError:
                        continue
            except Exception as e:  # noqa: BLE001  (reported to the item's owner)
                error = e
            with self._cv:
                self._pending.popleft()
                self._current = None
                if self._num_waiting:
                    self._cv.notify_all()
            owner.finished(item, error)
            item = owner = error = None  # this frame may live on in `error`'s traceback
        for item, owner in dropped:  # (the table is gone: its items can never be inserted)
            owner.finished(item, errors.TableNotFoundError(
                f"Priority table {self._table_name} was not found: it was removed."))
