"""The in-process transport of `replay_tf.Client`: calls the tables of a `Server` in this process directly
(no serialization, no copies on insert). Implements `replay_tf.transport.base.Transport`; `for_address` finds the
server (`local_servers`).

A `server` argument below is a `replay_tf.Server`, not imported here: the server module imports the client,
which reaches this module.
"""
from __future__ import annotations

import collections
import datetime
import threading
import time
from typing import Any, Dict, Optional

from replay_tf import errors
from replay_tf.transport import local_servers
from replay_tf.core import item_records
from replay_tf.core.chunk_store import Item
from replay_tf.wire import limits


class InsertStream:
    """Inserts straight into the tables; items the rate limiter refuses are inserted in the background.

    As Reverb's writers send items asynchronously, an item the rate limiter refuses does not wait for the
    next writer call: it joins a queue that a worker thread of this stream (started when first needed, gone
    after a second without work) inserts in order, each as soon as its table admits it. Items of one stream
    are inserted in `send` order: while items wait, later ones queue behind them. An unblocked insert
    (empty queue, table admitting) happens in the calling thread with no hand-off. `flush` waits for the
    queue; `close` drops the items still queued (an item being admitted at that moment may still land).
    """

    supports_open_chunks = True
    _IDLE_S = 1.0     # a worker without work for this long exits (a later refusal starts a new one)
    _SLICE_MS = 250   # the worker re-checks `close` at least this often while its table refuses

    def __init__(self, server):
        self._server = server
        self._pending: collections.deque = collections.deque()  # (table, item), oldest first
        self._cv = threading.Condition(threading.Lock())
        self._worker: Optional[threading.Thread] = None
        self._error: Optional[Exception] = None
        self._closed = False

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def send(self, table: str, item: Item, live: Optional[tuple] = None) -> None:
        # (`live` only matters to remote streams: see `base.InsertStream.send`.) As in Reverb, the table
        # does not check items against its signature: writers do (validate_items). The rest of the rules of
        # every path into a table apply here too, so that a checkpoint's restore accepts what was inserted.
        target = self._server.table(table)
        item_records.check_item(target, item, max_item_bytes=limits.MAX_ITEM_BYTES,
                                string_element_bytes=limits.STRING_ELEMENT_BYTES)
        if not self._pending:  # only this thread adds items, so the worker is idle: insert here
            self._raise_if_failed()
            try:
                target.insert_or_assign(item, timeout_ms=0)
                return
            except errors.DeadlineExceededError:
                pass
        with self._cv:
            self._raise_if_failed()
            self._pending.append((target, item))
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="replay_tf-inprocess-insert", daemon=True)
                self._worker.start()
            else:
                self._cv.notify_all()

    def _work(self) -> None:
        """The worker: inserts queued items in order, blocking (in slices) while the table refuses."""
        cv = self._cv
        while True:
            with cv:
                if not self._pending and not self._closed:
                    cv.wait(self._IDLE_S)
                if not self._pending or self._closed:
                    self._worker = None
                    cv.notify_all()
                    return
                table, item = self._pending[0]
            try:
                table.insert_or_assign(item, timeout_ms=self._SLICE_MS)
            except errors.DeadlineExceededError:
                continue  # still refused: check `close`, then wait again
            except Exception as e:  # noqa: BLE001  (raised by the next send/flush, as the remote stream does)
                with cv:
                    self._error = e
                    self._pending.clear()
                    self._worker = None
                    cv.notify_all()
                return
            with cv:
                if self._pending and self._pending[0][1] is item:
                    self._pending.popleft()
                cv.notify_all()

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        deadline = None if timeout_ms is None or timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        with self._cv:
            while len(self._pending) > block_until_num_items and self._error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise errors.DeadlineExceededError(
                        f"Flush call did not complete within provided timeout of "
                        f"{datetime.timedelta(milliseconds=timeout_ms)}")
                self._cv.wait(remaining)
            self._raise_if_failed()

    def num_pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._pending.clear()
            self._cv.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(self._SLICE_MS / 1000.0 * 4)


class SampleStream:
    def __init__(self, server, table: str, num_samples_per_request: int,
                 rate_limiter_timeout_ms: Optional[int], max_samples: Optional[int] = None):
        self._table = server.table(table)
        self._num_samples = num_samples_per_request
        self._budget = max_samples  # samples the caller may still take in all: never sample more
        self._timeout_ms = rate_limiter_timeout_ms
        self._waiting_since: Optional[float] = None  # time.monotonic() of the first poll of this wait

    def _count(self) -> int:
        return self._num_samples if self._budget is None else min(self._num_samples, self._budget)

    def _spend(self, batch: list) -> list:
        if self._budget is not None:
            self._budget -= len(batch)
        return batch

    def next_batch(self, poll_ms: Optional[float] = None) -> list:
        if self._budget == 0:
            return []
        if poll_ms is None:
            return self._spend(self._table.sample(self._count(), timeout_ms=self._timeout_ms))
        now = time.monotonic()
        polled_before = self._waiting_since is not None
        if not polled_before:
            self._waiting_since = now
        deadline = None if self._timeout_ms is None else self._waiting_since + self._timeout_ms / 1000.0
        slice_ms = poll_ms if deadline is None else min(poll_ms, max(0.0, deadline - now) * 1000.0)
        try:
            # Table.sample is atomic: a slice that times out has sampled nothing.
            batch = self._spend(self._table.sample(self._count(), timeout_ms=slice_ms))
        except errors.DeadlineExceededError:
            if deadline is not None and time.monotonic() >= deadline:
                self._waiting_since = None
                raise
            return []
        self._waiting_since = None
        if polled_before and batch:
            batch[0] = batch[0]._replace(rate_limited=True)  # it waited over several polls
        return batch

    def close(self) -> None:
        pass


class InProcessTransport:
    """Calls the tables of a `Server` in this process directly."""

    shares_items = True

    def __init__(self, server):
        self.server = server

    def open_insert_stream(self) -> InsertStream:
        return InsertStream(self.server)

    def open_sample_stream(self, table: str, num_samples_per_request: int,
                           rate_limiter_timeout_ms: Optional[int], *,
                           max_samples_per_stream: Optional[int] = None,
                           max_samples: Optional[int] = None, stacked: bool = False) -> SampleStream:
        del max_samples_per_stream  # streams are only re-opened to balance remote servers
        del stacked  # in-process samples are core items already: nothing to save by stacking them here
        return SampleStream(self.server, table, num_samples_per_request, rate_limiter_timeout_ms, max_samples)

    def mutate_priorities(self, table: str, updates: list, deletes: list) -> None:
        self.server.table(table).mutate_items(updates, deletes)

    def reset(self, table: str) -> None:
        self.server.table(table).reset()

    def server_info(self, timeout_s: Optional[float] = None) -> Dict[str, Any]:
        return {name: table.info for name, table in self.server.tables.items()}

    def checkpoint(self) -> str:
        return self.server.checkpoint()


def for_address(server_address: str) -> Optional[InProcessTransport]:
    """The in-process transport to the running `Server` of this process that owns `server_address`, if any."""
    server = local_servers.find_local_server(server_address)
    if server is None or server.stopped:
        return None
    return InProcessTransport(server)
