"""How many calls the replay service's gRPC server serves at once, and the threads it keeps for them.

The service runs on grpc's synchronous server: every call runs on a thread of one pool, and a stream
(InsertStream, SampleStream, InitializeConnection) holds its thread for as long as it is open, also while
it is idle or its sampler waits on a rate limiter. So the pool must never be the limit: it grows on
demand (`concurrent.futures.ThreadPoolExecutor` starts a thread only when none is idle) up to
`max_streams` threads for streams plus `reserved_threads` that streams can never take. A stream opened
when `max_streams` are open is refused at once with RESOURCE_EXHAUSTED (`StreamSlots`), on a reserved
thread, and never waits for a thread; unary calls (ServerInfo, MutatePriorities, Reset, Checkpoint) are
served on the reserved threads whatever the streams do.
"""
from __future__ import annotations

import concurrent.futures
import threading

import grpc

__all__ = ["DEFAULT_MAX_STREAMS", "DEFAULT_RESERVED_THREADS", "StreamSlots", "check_max_streams", "thread_pool"]

#: Streams one server keeps open at once by default: far above the actors and learners of one deployment
#: (each open stream costs a thread, about 100 KiB resident, and an InsertStream a second thread).
DEFAULT_MAX_STREAMS = 4096
#: Threads kept for unary calls and for refusing streams over the limit: streams never take them.
DEFAULT_RESERVED_THREADS = 64


def check_max_streams(max_streams, name: str = "max_streams") -> int:
    """`max_streams` as an int, or ValueError naming the argument and the rule."""
    if isinstance(max_streams, bool) or not isinstance(max_streams, int) or max_streams < 1:
        raise ValueError(f"{name} ({max_streams!r}) must be a positive int: the most gRPC streams the server "
                         f"keeps open at once (default {DEFAULT_MAX_STREAMS})")
    return max_streams


def thread_pool(max_streams: int, reserved_threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The server's pool: threads start on demand, up to one per open stream plus `reserved_threads`."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=max_streams + reserved_threads,
                                                 thread_name_prefix="replay_tf-grpc")


class StreamSlots:
    """Counts the open streams of one server and refuses those over `limit` with RESOURCE_EXHAUSTED."""

    def __init__(self, limit: int):
        self.limit = limit
        self._open = 0
        self._lock = threading.Lock()

    @property
    def open(self) -> int:
        """Streams open now."""
        return self._open

    def wrap(self, handler):
        """`handler` (a stream-stream behaviour), counted: the call takes a slot before `handler` runs and
        gives it back when the call ends however it ends (the client cancels, the server aborts or
        stops); over `limit`, the call ends at once with RESOURCE_EXHAUSTED and its requests are never read."""
        def counted(request_iterator, context):
            with self._lock:
                full = self._open >= self.limit
                if not full:
                    self._open += 1
            if full:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the replay server already has {self.limit} open streams, its max_streams: close "
                              f"idle clients or start it with a larger max_streams (replay_tf.Server(..., "
                              f"max_streams=...) or replay-tf serve --max-streams)")
            released = []

            def release() -> None:
                with self._lock:
                    if not released:
                        released.append(True)
                        self._open -= 1

            # The callback runs when the call ends, also when its response iterator is never started.
            if not context.add_callback(release):
                release()  # the call has already ended
            return handler(request_iterator, context)
        return counted
