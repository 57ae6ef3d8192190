"""Keeps the Python thread state of the TensorFlow threads that call a sample source (CPython only).

TensorFlow runs a `numpy_function` on threads of its own, which are not Python threads: each call takes
the GIL with `PyGILState_Ensure` and gives it back with `PyGILState_Release`. On a thread without a Python
thread state of its own, that pair creates one and deletes it again, with its frame stack and its
thread-local data, at every call: about two thirds of the cost of a call that only hands over a prepared
array, and a large share of the cost per sample where many interleaved datasets fetch a few samples per
call (TF-Agents' replay pipeline, docs/benchmarks.md). `keep()` takes one more `PyGILState_Ensure` on such
a thread and never releases it, so its state outlives the call and later calls on that thread reuse it,
as the state of a Python thread is reused (Python threads are left as they are).

A kept state stays allocated after its thread ends, until the interpreter exits (a forked child frees
those of the parent's other threads): it can be freed only by its own thread, or by another one once
that thread has ended, and on CPython 3.12+ freeing another thread's state from Python also unbinds the
caller's own. Each takes about 5 KB resident (its structure, one page of its frame stack, its thread-local
data). tf.data starts new threads for every iterator (two or three call the sources of TF-Agents'
pipeline), so the states kept are capped at `MAX_KEPT` per process, counting every thread that ever kept
one: once a process has created that many, later threads pay the cost per call as before. Set the
environment variable `REPLAY_TF_KEEP_THREAD_STATES=0` to keep none.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading

ENV = "REPLAY_TF_KEEP_THREAD_STATES"
MAX_KEPT = 1024  # threads of a process that keep their state (about 5 MB at most)

# Thread-local data lives in the thread state, so it marks a thread whose state is kept (or a Python
# thread, whose state lasts as long as the thread): a thread whose state is created afresh at every call
# finds it empty.
_marks = threading.local()
_lock = threading.Lock()
_count = 0  # threads that kept their state
_enabled = None  # (decided at the first call)


def keep() -> bool:
    """Keeps the calling thread's Python thread state from now on; whether it lasts beyond this call. Call
    with the GIL held (as a `numpy_function` runs); a thread-local lookup once it lasts."""
    global _count, _enabled
    if getattr(_marks, "kept", False):
        return True
    if _enabled is None:
        _enabled = platform.python_implementation() == "CPython" and os.environ.get(ENV, "1") != "0"
    if not _enabled:
        return False
    ident = threading.get_ident()
    if any(thread.ident == ident for thread in threading.enumerate()):
        _marks.kept = True  # a Python thread (or one `threading` already knows): nothing to keep
        return True
    with _lock:
        if _count >= MAX_KEPT:
            return False
        _count += 1
    # With the GIL held this only counts one more holder of the thread's state, so the release at the end
    # of the call leaves the state in place (ctypes.pythonapi keeps the GIL during the call).
    ctypes.pythonapi.PyGILState_Ensure()
    _marks.kept = True
    return True


def kept_count() -> int:
    """The number of threads of this process that kept their state."""
    return _count


def _forget_parent_threads() -> None:
    """In a forked child: the parent's other threads, and the states they kept, are gone."""
    global _count, _lock
    _count = 0
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_parent_threads)
