"""Keeps large message buffers in glibc's heap instead of fresh memory maps (Linux with glibc only).

gRPC hands every message to Python as one `bytes` object: a 2 MiB `SampleStreamResponse` (Reverb's
response size, ours too) or a multi-MiB insert request. glibc serves allocations above its mmap threshold
(128 KiB) with a fresh memory map, which the kernel zero-fills page by page on first touch, and unmaps it
again on free: ~512 page faults per 2 MiB message. glibc normally raises that threshold by itself once such
a block is freed, but TensorFlow's generator datasets (which `TrajectoryDataset` uses) set
`M_TRIM_THRESHOLD`, and setting that (or the mmap threshold, top pad or mmap count) turns the dynamic
threshold off for the whole process. An
Atari-like sample stream then spends about a third of its CPU time in page faults.

`keep_large_buffers_in_heap()` sets the threshold to `MMAP_THRESHOLD_BYTES` once per process, which is
where glibc's own dynamic threshold would have settled: blocks up to that size are reused from the heap
(the top of the heap is still returned to the system as TensorFlow asked). Set the environment variable
`REPLAY_TF_MALLOC_TUNING=0` to leave malloc alone.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

MMAP_THRESHOLD_BYTES = 8 << 20  # above the 2 MiB responses and the ~4 MiB requests our writers assemble
_M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter number

_lock = threading.Lock()
_done = False


def keep_large_buffers_in_heap() -> bool:
    """Sets glibc's mmap threshold once per process; returns whether it is set (False elsewhere)."""
    global _done
    with _lock:
        if _done:
            return True
        if os.environ.get("REPLAY_TF_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
            return False
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            return False
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
        _done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
        return _done
