"""Keeps message-sized buffers in glibc's heap instead of fresh memory maps (Linux with glibc only).

gRPC hands every message to Python as one `bytes` object: a 2 MiB `SampleStreamResponse` (Reverb's
response size, ours too) or an insert request of ~1 MiB. glibc serves allocations above its mmap
threshold (128 KiB) with a fresh memory map, which the kernel zero-fills page by page on first touch and
unmaps again on free, and gives the top of its heap back to the system past its trim threshold: ~512 page
faults per 2 MiB message. glibc normally raises both thresholds by itself once such a block is freed (the
trim threshold to twice the mmap threshold), but TensorFlow's generator datasets (which `TrajectoryDataset`
uses) set `M_TRIM_THRESHOLD` to 128 KiB, and setting it turns that adjustment off for the whole process:
a sample stream of large steps then spends a large share of its CPU time in page faults.

`keep_large_buffers_in_heap()` sets the thresholds where glibc's own adjustment would have put them for
blocks of up to `MMAP_THRESHOLD_BYTES` (the process keeps at most `TRIM_THRESHOLD_BYTES` of free memory at
the top of its heap instead of 128 KiB). Remote client streams call it (their processes are the ones that
run generator datasets), and so do servers once they serve stacked sample streams: each of their responses
is assembled from ~2 MiB of freshly gathered columns into a ~2 MiB message, and freeing both leaves more
free memory at the top of the heap than glibc's adjusted trim threshold, so without the tuning every
response would page-fault anew. Other servers leave malloc alone, where
glibc's adjustment works. Set the environment variable `REPLAY_TF_MALLOC_TUNING=0` to leave malloc alone
everywhere.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading

# Above the ~2 MiB responses and the ~1 MiB requests our writers assemble (MAX_REQUEST_BYTES); no higher:
# heap blocks this large, once freed, get reused for small long-lived objects and keep their pages resident
# (a larger threshold leaves a server process further above its warm level, see docs/benchmarks.md).
MMAP_THRESHOLD_BYTES = 4 << 20
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES  # glibc's own rule for its dynamic thresholds
_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_mallopt = None


def keep_large_buffers_in_heap() -> bool:
    """Sets glibc's mmap and trim thresholds; returns whether they are set (False off glibc or opted out).

    Called whenever a stream opens: TensorFlow sets its trim threshold when a generator dataset starts,
    which may come after an earlier call. Two `mallopt` calls, a few microseconds.
    """
    global _mallopt
    if os.environ.get("REPLAY_TF_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    with _lock:
        if _mallopt is None:
            try:
                mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
            except (OSError, AttributeError):  # not glibc (musl has no mallopt)
                _mallopt = False
                return False
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            mallopt.restype = ctypes.c_int
            _mallopt = mallopt
        if not _mallopt:
            return False
        return (_mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
                and _mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1)
