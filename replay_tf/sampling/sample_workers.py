"""Several sample streams drained by threads into one queue: the `num_workers_per_iterator` workers of
`TrajectoryDataset` (Reverb's sampler workers).

With `max_samples`, the workers share one budget (`SharedBudget`): a worker reserves the samples it will ask
for before it asks, and gives back what it did not receive. So the workers together never take more items
from a table than the dataset yields, as Reverb's sampler guarantees (a Queue table keeps the rest).
"""
from __future__ import annotations

import queue
import sys
import threading
from typing import Callable, NamedTuple, Optional

from replay_tf import errors
from replay_tf.wire import stacked_samples


class _WorkerTimedOut(NamedTuple):
    error: Exception


class SharedBudget:
    """The samples that the workers of one iterator may still take from the table, in all."""

    def __init__(self, max_samples: int):
        self._available = max_samples  # not reserved by any worker
        self._reserved = 0             # reserved by workers and not yet received or given back
        self._cv = threading.Condition()

    def reserve(self, count: int, timeout_s: float) -> Optional[int]:
        """Reserves up to `count` samples: how many (>= 1), 0 if the budget is spent for good (nothing left
        and nothing reserved that could come back), or None if none came free within `timeout_s`."""
        with self._cv:
            if not self._available and self._reserved:
                self._cv.wait(timeout_s)
            if self._available:
                granted = min(count, self._available)
                self._available -= granted
                self._reserved += granted
                return granted
            return None if self._reserved else 0

    def settle(self, reserved: int, received: int) -> None:
        """A worker is done with a reservation of `reserved` samples, of which it received `received`; the
        rest goes back to the budget."""
        with self._cv:
            self._reserved -= reserved
            self._available += reserved - received
            self._cv.notify_all()


class ParallelStreams:
    """`num_workers` sample streams, each drained by its own thread into one queue (Reverb's sampler
    workers); `next_batch` and `close` as a single stream's. The queue holds up to one flexible batch per
    worker, so each worker has at most a batch waiting plus its stream's requests in flight.

    Args:
      open_stream: opens a sample stream; called with `max_samples` (None: no limit).
      num_workers: the number of workers.
      max_samples: None, or the number of samples all workers together take (see `SharedBudget`); each
        worker then opens one stream per reservation, which asks for exactly the samples reserved.
      request_size: the most samples a worker reserves at a time (its stream's samples per request).
      poll_ms: how long a worker waits for samples (or for budget) before it checks whether to stop.
    """

    def __init__(self, open_stream: Callable, num_workers: int, max_samples: Optional[int] = None,
                 request_size: int = 1, poll_ms: float = 100):
        self._queue: queue.Queue = queue.Queue(maxsize=num_workers)
        self._stop = threading.Event()
        self._poll_ms = poll_ms
        self._timed_out = 0  # workers that ended on a rate-limiter timeout
        self._streams = []
        self._threads = []
        self._open_stream = open_stream
        self._budget = None if max_samples is None else SharedBudget(max_samples)
        self._request_size = request_size
        if self._budget is None:
            try:
                for _ in range(num_workers):
                    self._streams.append(open_stream(None))
            except BaseException:
                self.close()
                raise
            targets = [(self._work, (stream,)) for stream in self._streams]
        else:
            targets = [(self._work_on_budget, ())] * num_workers
        for i, (target, args) in enumerate(targets):
            thread = threading.Thread(target=target, args=args, name=f"replay_tf-sample-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _put(self, value) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(value, timeout=self._poll_ms / 1000.0)
                return
            except queue.Full:
                continue

    def _work(self, stream) -> None:
        try:
            while not self._stop.is_set():
                batch = stream.next_batch(poll_ms=self._poll_ms)
                if batch:
                    self._put(batch)
        except errors.DeadlineExceededError as e:  # this worker is done; see next_batch
            self._put(_WorkerTimedOut(e))
        except Exception as e:  # noqa: BLE001  (handed to the consumer, which raises it)
            self._put(e)

    def _work_on_budget(self) -> None:
        """Reserves samples, asks for exactly those on a stream of their own, gives back what did not
        arrive; ends when the budget is spent (the consumer then has every sample) or on an error."""
        try:
            while not self._stop.is_set():
                reserved = self._budget.reserve(self._request_size, self._poll_ms / 1000.0)
                if reserved == 0:
                    return
                if reserved is None:
                    continue  # other workers hold the rest: wait for what they give back
                received = 0
                stream = None
                try:
                    stream = self._open_stream(reserved)
                    while received < reserved and not self._stop.is_set():
                        batch = stream.next_batch(poll_ms=self._poll_ms)
                        if batch:
                            received += stacked_samples.count_samples(batch)
                            self._put(batch)
                finally:
                    if stream is not None:
                        stream.close()
                    self._budget.settle(reserved, received)
        except errors.DeadlineExceededError as e:
            self._put(_WorkerTimedOut(e))
        except Exception as e:  # noqa: BLE001  (handed to the consumer, which raises it)
            self._put(e)

    def next_batch(self, poll_ms: Optional[float] = None) -> list:
        """The next batch of any worker. A rate-limiter timeout is raised once every worker has timed out
        and every sample taken before has been handed out; other errors are raised as they come."""
        while True:
            try:
                value = self._queue.get(timeout=None if poll_ms is None else poll_ms / 1000.0)
            except queue.Empty:
                return []
            if isinstance(value, _WorkerTimedOut):
                self._timed_out += 1
                if self._timed_out == len(self._threads):
                    raise value.error
                continue
            if isinstance(value, Exception):
                raise value
            return value

    def close(self, _is_finalizing=sys.is_finalizing) -> None:
        """Stops the workers (each notices within one poll) and closes their streams; samples a worker
        had taken and not handed over are dropped, as Reverb drops an iterator's in-flight samples."""
        self._stop.set()
        # At interpreter exit (a dataset iterator collected during finalization) the daemon workers can no
        # longer run, so joining them would block forever; they end with the process. (`_is_finalizing` is bound
        # at definition: during finalization this module's `sys` global may already be None.)
        if not _is_finalizing():
            for thread in self._threads:
                thread.join()
        for stream in self._streams:
            stream.close()
