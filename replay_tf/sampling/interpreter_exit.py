"""What the sample datasets of this process end before the interpreter finalizes: the sample generators that
tf.data runs (`ending_at_exit`, see `_Generators`), and what other modules `register`.

One `atexit` hook runs it all, in this order: the generators are told to end, the callbacks registered
to run first (e.g. shared feeders) run, exit waits for the generators, then the callbacks registered to run
after the generators ended (e.g. a flag that lets tf.data's finalizers skip Python) run.
"""
from __future__ import annotations

import atexit
import gc
import threading
import time
import traceback
from typing import Callable


class _Generators:
    """The sample generators of this process that tf.data runs, and whether the interpreter is exiting.

    tf.data calls a generator from threads of its own. If the interpreter starts to finalize while such a
    thread is in Python (or enters it: prefetching asks for the next element as soon as there is room),
    the thread is ended when it asks for the GIL, and the iterator's destructor, run during finalization,
    waits for it forever: a script that exited with an iterator still open hung about one time in two. At
    exit, before finalization, every generator is told to end (each ends at its next call, or within a
    poll, `per_iterator.POLL_MS`, if it is waiting for samples), and exit waits until each has ended or has
    not been called for `QUIET_S` (tf.data's buffer is full: its threads stay out of Python)."""

    # (generous: on a loaded machine tf.data's threads may take a while to come back for the element that
    # ends their iterator, and one of them entering Python during finalization hangs the exit)
    QUIET_S = 1.0
    TIMEOUT_S = 5.0

    def __init__(self):
        self.exiting = threading.Event()
        self.before_wait: list = []  # callbacks run once the generators were told to end (see `stop_all`)
        self.after_stop: list = []  # callbacks run once the generators ended
        self.live = 0      # generators started and not ended
        self.running = 0   # generators inside a call (not suspended at a yield)
        self.started = False
        self.changed = time.monotonic()
        self.cv = threading.Condition()

    def stop_all(self) -> None:
        self.exiting.set()
        _run_each(self.before_wait)
        with self.cv:
            self.changed = time.monotonic()  # (readers that woke may still enter Python: wait quietly)
        try:
            self._wait_ended()
        finally:
            _run_each(self.after_stop)

    def _wait_ended(self) -> None:
        deadline = time.monotonic() + self.TIMEOUT_S
        with self.cv:
            if not self.started:  # (no generator ever ran: nothing of tf.data's can be in Python)
                return
            while self.live and time.monotonic() < deadline:
                if not self.running and time.monotonic() - self.changed >= self.QUIET_S:
                    break
                self.cv.wait(0.05)
        time.sleep(0.05)  # an ended generator's finalizer runs in tf.data's thread, in Python
        # Iterators in reference cycles (a training loop's objects often form them) would otherwise be
        # destroyed by the collection during finalization, where a destructor that waits for a tf.data
        # thread in Python never returns; collected here, their threads can still take the GIL.
        gc.collect()

    def enter(self, started: bool = False) -> None:
        with self.cv:
            self.started = True
            self.live += started
            self.running += 1
            self.changed = time.monotonic()

    def leave(self, ended: bool = False) -> None:
        with self.cv:
            self.live -= ended
            self.running -= 1
            self.changed = time.monotonic()
            self.cv.notify_all()


def _run_each(callbacks: list) -> None:
    """Runs every callback, each whatever the others raised: one failing must not keep exit from ending
    the rest (or from waiting for the generators); its error is reported as atexit reports its own."""
    for callback in callbacks:
        try:
            callback()
        except Exception:  # noqa: BLE001  (reported, and the next callback still runs)
            traceback.print_exc()


_GENERATORS = _Generators()
atexit.register(_GENERATORS.stop_all)


def register(callback: Callable[[], None], *, after_generators_end: bool = False) -> None:
    """Runs `callback` at exit, before the interpreter finalizes: once the generators were told to end and
    before exit waits for them, or, with `after_generators_end`, once they ended (or the wait gave up)."""
    (_GENERATORS.after_stop if after_generators_end else _GENERATORS.before_wait).append(callback)


def ending_at_exit(generator):
    """`generator` for tf.data, tracked by `_GENERATORS` and ended once the interpreter exits."""
    generators = _GENERATORS
    generators.enter(started=True)
    try:
        while not generators.exiting.is_set():
            value = next(generator, _END)
            if value is _END:
                return
            generators.leave()
            try:
                yield value
            finally:
                generators.enter()
    finally:
        try:
            generator.close()
        finally:
            generators.leave(ended=True)


_END = object()
