"""How many calls the replay service's gRPC server serves at once, and the threads it keeps for them.

The service runs on grpc's synchronous server: every call runs on a thread of one pool (`ThreadPool`), and a
stream (InsertStream, SampleStream, InitializeConnection) holds its thread for as long as it is open, also
while it is idle or its sampler waits on a rate limiter (an InsertStream holds a second thread, its reader).
So the pool must never be the limit: it grows on demand up to `max_streams` threads for streams plus
`reserved_threads` that streams can never take, and it keeps `SPARE_THREADS` idle threads ahead of demand.
A stream opened when `max_streams` are open, or when the process cannot start another thread (its limit of
address space, threads or memory), is refused at once with RESOURCE_EXHAUSTED (`StreamSlots`) on a spare
thread, and never waits for a thread; unary calls (ServerInfo, MutatePriorities, Reset, Checkpoint) are
served on the spare threads whatever the streams do. Threads are kept once started, so a stream that closes
leaves its threads to the next one.

A thread that cannot be started never fails grpc's server thread (which hands every call to the pool, and
would die of the error, leaving the process up and answering nothing): the call waits in the pool's queue
for a thread to come free, which the spare threads do within one call. Threads the server starts
(`start_thread`) get a `THREAD_STACK_BYTES` stack instead of the platform's default (with glibc, the stack
size limit, usually 8 MiB of address space per thread), and under an address-space limit (`ulimit -v`,
`prlimit --as`) they never take its last `ADDRESS_SPACE_HEADROOM_BYTES`, which the server needs to go on
answering calls. docs/reliability.md has what a stream costs.
"""
from __future__ import annotations

import collections
import concurrent.futures
import itertools
import threading
from typing import Callable, Optional

import grpc

try:
    import resource
except ImportError:  # not POSIX: no address-space limit to watch
    resource = None

__all__ = [
    "ADDRESS_SPACE_HEADROOM_BYTES",
    "DEFAULT_MAX_STREAMS",
    "DEFAULT_RESERVED_THREADS",
    "SPARE_THREADS",
    "StreamSlots",
    "THREAD_STACK_BYTES",
    "ThreadPool",
    "check_max_streams",
    "start_thread",
    "thread_refusal",
]

#: Streams one server keeps open at once by default: far above the actors and learners of one deployment
#: (each open stream costs a thread, and an InsertStream a second thread; docs/reliability.md has their cost).
DEFAULT_MAX_STREAMS = 4096
#: Threads kept for unary calls and for refusing streams over the limit: streams never take them.
DEFAULT_RESERVED_THREADS = 64
#: Idle threads the pool keeps ahead of demand (at most `reserved_threads`): the threads that answer unary
#: calls and refuse streams once the process cannot start more.
SPARE_THREADS = 4
#: Stack of every thread the server starts: room for the handlers' work (protobuf, numpy and table code, a
#: user's checkpointer) and for a recursion as deep as Python's default limit, at a quarter of glibc's usual
#: default (docs/reliability.md, "Streams under a thread or address-space limit").
THREAD_STACK_BYTES = 2 << 20

#: Address space (of a limit such as `ulimit -v`) that thread stacks never take: what the server needs to
#: go on answering calls (messages, chunks, grpc's own buffers) once streams are refused for want of threads.
ADDRESS_SPACE_HEADROOM_BYTES = 128 << 20

_PAGE_BYTES = resource.getpagesize() if resource is not None else 4096
_stack_size_lock = threading.Lock()
_thread_numbers = itertools.count()


def check_max_streams(max_streams, name: str = "max_streams") -> int:
    """`max_streams` as an int, or ValueError naming the argument and the rule."""
    if isinstance(max_streams, bool) or not isinstance(max_streams, int) or max_streams < 1:
        raise ValueError(f"{name} ({max_streams!r}) must be a positive int: the most gRPC streams the server "
                         f"keeps open at once (default {DEFAULT_MAX_STREAMS})")
    return max_streams


def _address_space_left() -> Optional[int]:
    """Bytes the process may still map under its address-space limit (RLIMIT_AS); None without one."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm", "rb") as f:
            mapped_pages = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # no procfs: the thread start itself will tell
        return None
    return soft - mapped_pages * _PAGE_BYTES


def start_thread(target: Callable[[], None], name: str) -> bool:
    """Starts `target` on a daemon thread with a `THREAD_STACK_BYTES` stack; False if the process cannot
    start one (at its limit of address space, threads or memory), or if its stack would leave less than
    `ADDRESS_SPACE_HEADROOM_BYTES` of the address-space limit for everything else."""
    left = _address_space_left()
    if left is not None and left < THREAD_STACK_BYTES + ADDRESS_SPACE_HEADROOM_BYTES:
        return False
    try:
        thread = threading.Thread(target=target, name=f"{name}_{next(_thread_numbers)}", daemon=True)
        # The stack size is the interpreter's, not the thread's: it is set for this start only. (A thread
        # that other code starts at the same instant gets this stack too; it is still a working stack.)
        with _stack_size_lock:
            try:
                previous = threading.stack_size(THREAD_STACK_BYTES)
            except (ValueError, RuntimeError):  # a platform that cannot size stacks: its default
                previous = None
            try:
                thread.start()
            finally:
                if previous is not None:
                    threading.stack_size(previous)
    except (RuntimeError, MemoryError):  # "can't start new thread": pthread_create failed
        return False
    return True


def thread_refusal(what: str, open_streams: Optional[int] = None) -> str:
    """The details of a RESOURCE_EXHAUSTED refusal of `what` for want of a thread."""
    count = "" if open_streams is None else f" ({open_streams} streams open)"
    return (f"the replay server cannot start a thread for {what}{count}: the process is "
            f"at its limit of address space (ulimit -v), threads (ulimit -u, cgroup pids.max) or memory; "
            f"close idle clients, or raise the limit")


class ThreadPool(concurrent.futures.Executor):
    """An executor whose threads start on demand, up to `max_threads`, never end before `shutdown`, and of
    which `spare_threads` are kept idle ahead of demand. `submit` never fails for want of a thread: the
    call then waits for one to come free (grpc's server thread, which submits every call, would die of the
    error); `try_submit` returns None instead."""

    def __init__(self, max_threads: int, spare_threads: int = SPARE_THREADS, name: str = "replay_tf-grpc"):
        self.spare_threads = max(0, min(spare_threads, max_threads))
        self._max_threads = max_threads
        self._name = name
        self._cv = threading.Condition()
        self._work: collections.deque = collections.deque()  # (future, fn, args, kwargs) no thread took yet
        self._threads = 0  # started, not ended
        self._idle = 0  # started, running no call
        self._shutdown = False
        self.failed_starts = 0
        with self._cv:
            self._start_spares()

    @property
    def threads(self) -> int:
        """Threads started and not ended."""
        return self._threads

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        return self._submit(fn, args, kwargs, wait_for_thread=True)

    def try_submit(self, fn, /, *args, **kwargs) -> Optional[concurrent.futures.Future]:
        """`submit`, or None when no thread is idle and none can be started."""
        return self._submit(fn, args, kwargs, wait_for_thread=False)

    def _submit(self, fn, args, kwargs, wait_for_thread: bool) -> Optional[concurrent.futures.Future]:
        with self._cv:
            if self._shutdown:
                raise RuntimeError("the replay server's thread pool is shut down: it takes no more calls")
            if not wait_for_thread and self._idle <= len(self._work) and not self._start_thread():
                return None
            future = concurrent.futures.Future()
            self._work.append((future, fn, args, kwargs))
            self._cv.notify()
            self._start_spares()
            if wait_for_thread and self._idle < len(self._work):
                self._start_thread()  # (with no spare threads; failing, the call waits for a thread)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Idle threads end at once, the others when their call ends; with `wait`, waits for queued calls."""
        with self._cv:
            self._shutdown = True
            if cancel_futures:
                while self._work:
                    self._work.popleft()[0].cancel()
            self._cv.notify_all()
            while wait and self._threads:
                self._cv.wait()

    def _start_spares(self) -> None:
        while self._idle - len(self._work) < self.spare_threads and self._start_thread():
            pass

    def _start_thread(self) -> bool:
        """Starts one more thread (called with `_cv` held); False at `max_threads` or when it cannot start."""
        if self._threads >= self._max_threads:
            return False
        if not start_thread(self._run, self._name):
            self.failed_starts += 1
            return False
        self._threads += 1
        self._idle += 1
        return True

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._work:
                    if self._shutdown:
                        self._threads -= 1
                        self._idle -= 1
                        self._cv.notify_all()
                        return
                    self._cv.wait()
                future, fn, args, kwargs = self._work.popleft()
                self._idle -= 1
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # noqa: BLE001  (the caller's, reported through its future)
                    future.set_exception(e)
                else:
                    future.set_result(result)
            future = fn = args = kwargs = result = None  # nothing of the call outlives it on this thread
            with self._cv:
                self._idle += 1


class StreamSlots:
    """Counts the open streams of one server and refuses those over `limit`, or over what the threads of
    `pool` can serve while keeping its spare threads, with RESOURCE_EXHAUSTED."""

    def __init__(self, limit: int, pool: ThreadPool | None = None):
        self.limit = limit
        self._pool = pool
        self._open = 0
        self._lock = threading.Lock()

    @property
    def open(self) -> int:
        """Streams open now."""
        return self._open

    def wrap(self, handler):
        """`handler` (a stream-stream behaviour), counted: the call takes a slot before `handler` runs and
        gives it back when the call ends however it ends (the client cancels, the server aborts or
        stops); over `limit`, or when this call runs on one of the pool's last spare threads (the process
        could not start another), the call ends at once with RESOURCE_EXHAUSTED and its requests are never
        read."""
        def counted(request_iterator, context):
            with self._lock:
                opened = self._open
                full = opened >= self.limit
                # This call's thread plus the spare ones must exist besides the threads of the open streams.
                no_thread = (not full and self._pool is not None
                             and opened + 1 + self._pool.spare_threads > self._pool.threads)
                if not (full or no_thread):
                    self._open += 1
            if full:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the replay server already has {self.limit} open streams, its max_streams: close "
                              f"idle clients or start it with a larger max_streams (replay_tf.Server(..., "
                              f"max_streams=...) or replay-tf serve --max-streams)")
            if no_thread:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, thread_refusal("another stream", opened))
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
