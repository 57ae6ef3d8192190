"""The in-process transport of `replay_tf.Client`: calls the tables of a `Server` in this process directly
(no serialization, no copies on insert). Implements `replay_tf.transport.base.Transport`; `for_address` finds the
server (`local_servers`).

A `server` argument below is a `replay_tf.Server`, not imported here: the server module imports the client,
which reaches this module.
"""
from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Dict, Optional

from replay_tf import errors
from replay_tf.transport import local_servers
from replay_tf.core import insert_queue
from replay_tf.core import item_records
from replay_tf.core.chunk_store import Item
from replay_tf.wire import limits


class InsertStream:
    """Inserts straight into the tables; items the rate limiter refuses wait in the table's queue.

    As Reverb's writers send items asynchronously, an item the rate limiter refuses does not wait for the
    next writer call: it joins its table's pending-insert queue (`core.insert_queue`, shared with the gRPC
    server's streams), whose worker thread inserts it as soon as the table admits it. Items of one stream
    into one table are inserted in `send` order: while items wait, later ones queue behind them. An unblocked
    insert (nothing waiting, table admitting) happens in the calling thread with no hand-off. `send` never
    blocks on the queue's limit; `flush` waits for the stream's queued items; `close` drops those still
    queued (an item being admitted at that moment may still land). An insert that fails in the background
    is raised by the next `send` or `flush`, and the stream's other queued items are dropped (one another
    table's worker is admitting at that moment may still land).
    """

    supports_open_chunks = True
    waits_for_room = False  # (`core.insert_queue.InsertOwner`: writers wait in flush, not in send)

    def __init__(self, server):
        self._server = server
        self._cv = threading.Condition(threading.Lock())
        # Items of this stream queued in table queues, and those of them finished: counted apart, so that
        # queueing (in the sending thread, the only one that queues) takes no lock of its own.
        self._num_queued = 0
        self._num_finished = 0
        self._queues: set = set()  # the queues this stream's items went to
        self._error: Optional[Exception] = None
        self._closed = False
        self._flushing = 0  # threads waiting in flush (a finished item notifies only then)

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            with self._cv:
                error, self._error = self._error, None
            if error is not None:
                raise error

    def send(self, table: str, item: Item, live: Optional[tuple] = None) -> None:
        # (`live` only matters to remote streams: see `base.InsertStream.send`.) As in Reverb, the table
        # does not check items against its signature: writers do (validate_items). The rest of the rules of
        # every path into a table apply here too, so that a checkpoint's restore accepts what was inserted.
        target = self._server.table(table)
        item_records.check_item(target, item, max_item_bytes=limits.MAX_ITEM_BYTES,
                                string_element_bytes=limits.STRING_ELEMENT_BYTES)
        if self._error is not None:
            self._raise_if_failed()
        queue = target.insert_queue
        if queue not in self._queues:  # (before the item can wait there: close and failures drop from it)
            with self._cv:
                self._queues.add(queue)
        queue.put(item, self)

    # --- core.insert_queue.InsertOwner ---

    def active(self) -> bool:
        return not self._closed

    def gone(self) -> BaseException:
        return errors.CancelledError("the insert stream was closed")

    def will_wait(self) -> None:
        pass  # every insert is reported when it happens

    def queued(self) -> None:
        self._num_queued += 1

    def finished(self, item: Item, error: Optional[BaseException]) -> None:
        dropped = 0
        if error is not None and not self._closed and self._error is None:
            # The stream's other queued items are dropped, before the error is seen: items sent once the
            # next send or flush raised it are kept.
            with self._cv:
                queues = list(self._queues)
            dropped = sum(queue.drop(self) for queue in queues)
        with self._cv:
            self._num_finished += 1 + dropped
            if error is not None and not self._closed and self._error is None:
                self._error = error  # raised by the next send/flush, as the remote stream does
            if self._flushing:
                self._cv.notify_all()

    def start_worker(self, target, table_name: str) -> None:
        threading.Thread(target=target, name=f"replay_tf-inserts-{table_name}", daemon=True).start()

    # --- the rest of base.InsertStream ---

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        deadline = None if timeout_ms is None or timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        with self._cv:
            self._flushing += 1
            try:
                while self._num_queued - self._num_finished > block_until_num_items and self._error is None:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise errors.DeadlineExceededError(
                            f"Flush call did not complete within provided timeout of "
                            f"{datetime.timedelta(milliseconds=timeout_ms)}")
                    self._cv.wait(remaining)
            finally:
                self._flushing -= 1
        self._raise_if_failed()

    def num_pending(self) -> int:
        return self._num_queued - self._num_finished

    def close(self) -> None:
        with self._cv:
            self._closed = True
            queues = list(self._queues)
        # (An item being inserted may still land: wait for that attempt, at most a few of its slices in all.)
        deadline = time.monotonic() + insert_queue.WAIT_SLICE_MS / 1000.0 * 4
        dropped = sum(queue.drop(self, max(0.0, deadline - time.monotonic())) for queue in queues)
        with self._cv:
            self._num_finished += dropped
            self._cv.notify_all()


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
