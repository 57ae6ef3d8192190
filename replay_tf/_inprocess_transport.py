"""The in-process transport of `replay_tf.Client`: calls the tables of a `Server` in this process directly
(no serialization, no copies on insert). Implements `replay_tf.client.Transport`."""
from __future__ import annotations

import collections
import datetime
import time
from typing import Any, Dict, Optional

from replay_tf import errors
from replay_tf import server as server_lib
from replay_tf.core.chunk_store import Item


class InsertStream:
    """Inserts straight into the tables; items the rate limiter refuses wait here until `flush`."""

    supports_open_chunks = True

    def __init__(self, server: server_lib.Server):
        self._server = server
        self._pending: collections.deque = collections.deque()

    def send(self, table: str, item: Item) -> None:
        # As in Reverb, the table does not check items against its signature: writers do (validate_items).
        target = self._server.table(table)
        self._pending.append((target, item))
        self._drain(0, deadline=time.monotonic())

    def _drain(self, block_until_num_items: int, deadline: Optional[float]) -> bool:
        """Inserts pending items in order until at most `block_until_num_items` remain; False on timeout.

        `deadline` is a `time.monotonic()` value, or None to wait as long as it takes.
        """
        pending = self._pending
        while len(pending) > block_until_num_items:
            table, item = pending[0]
            timeout_ms = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000.0
            try:
                table.insert_or_assign(item, timeout_ms=timeout_ms)
            except errors.DeadlineExceededError:
                return False
            pending.popleft()
        return True

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        deadline = None if timeout_ms is None or timeout_ms < 0 else time.monotonic() + timeout_ms / 1000.0
        if not self._drain(block_until_num_items, deadline):
            raise errors.DeadlineExceededError(
                f"Flush call did not complete within provided timeout of "
                f"{datetime.timedelta(milliseconds=timeout_ms)}")

    def num_pending(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._pending.clear()


class SampleStream:
    def __init__(self, server: server_lib.Server, table: str, num_samples_per_request: int,
                 rate_limiter_timeout_ms: Optional[int]):
        self._table = server.table(table)
        self._num_samples = num_samples_per_request
        self._timeout_ms = rate_limiter_timeout_ms
        self._waiting_since: Optional[float] = None  # time.monotonic() of the first poll of this wait

    def next_batch(self, poll_ms: Optional[float] = None) -> list:
        if poll_ms is None:
            return self._table.sample(self._num_samples, timeout_ms=self._timeout_ms)
        now = time.monotonic()
        polled_before = self._waiting_since is not None
        if not polled_before:
            self._waiting_since = now
        deadline = None if self._timeout_ms is None else self._waiting_since + self._timeout_ms / 1000.0
        slice_ms = poll_ms if deadline is None else min(poll_ms, max(0.0, deadline - now) * 1000.0)
        try:
            # Table.sample is atomic: a slice that times out has sampled nothing.
            batch = self._table.sample(self._num_samples, timeout_ms=slice_ms)
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

    def __init__(self, server: server_lib.Server):
        self.server = server

    def open_insert_stream(self) -> InsertStream:
        return InsertStream(self.server)

    def open_sample_stream(self, table: str, num_samples_per_request: int,
                           rate_limiter_timeout_ms: Optional[int], *,
                           max_samples_per_stream: Optional[int] = None) -> SampleStream:
        del max_samples_per_stream  # streams are only re-opened to balance remote servers
        return SampleStream(self.server, table, num_samples_per_request, rate_limiter_timeout_ms)

    def mutate_priorities(self, table: str, updates: list, deletes: list) -> None:
        self.server.table(table).mutate_items(updates, deletes)

    def reset(self, table: str) -> None:
        self.server.table(table).reset()

    def server_info(self, timeout_s: Optional[float] = None) -> Dict[str, Any]:
        return {name: table.info for name, table in self.server.tables.items()}

    def checkpoint(self) -> str:
        return self.server.checkpoint()
