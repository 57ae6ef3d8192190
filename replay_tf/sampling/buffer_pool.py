"""Output arrays for the batches a sample dataset stacks: 64-byte aligned, so that TensorFlow adopts their
buffers without copying, and reused once no tensor refers to them (`BufferPool`)."""
from __future__ import annotations

import sys
from typing import Optional

import numpy as np


def aligned_empty(shape: tuple, dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialized array whose data is `alignment`-byte aligned, so TensorFlow can adopt its buffer."""
    if dtype == np.dtype(object):
        return np.empty(shape, dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.empty(nbytes + alignment, np.uint8)
    offset = (-buffer.ctypes.data) % alignment
    return buffer[offset:offset + nbytes].view(dtype).reshape(shape)


class BufferPool:
    """Reuses the aligned output arrays of large batches once nothing refers to them any more.

    A fresh array of many megabytes costs a page fault per 4 KiB page on first write (the kernel zeroes
    every page), which is about as slow as filling it. TensorFlow adopts an aligned array's buffer and
    keeps a reference to the array while any tensor uses it, so an array whose only reference is the
    pool's own is free to be filled again. Small arrays come straight from numpy's allocator.
    """

    MIN_BYTES = 1 << 20  # below this, malloc's own free lists already reuse memory
    MAX_ARRAYS = 8       # per (shape, dtype); beyond that, arrays are allocated and not pooled

    def __init__(self):
        self._arrays: dict = {}
        # The reference counts of an array that only the pool holds, measured on a probe held and looked
        # at exactly as `empty` does (so they hold on any interpreter's reference-counting details).
        probes = [aligned_empty((1,), np.dtype(np.uint8))]
        for array in probes:
            self._free_counts = self._counts(array)

    @staticmethod
    def _counts(array: np.ndarray) -> tuple:
        # References to the array, and to the memory it views (any view of `array` refers to `array.base`).
        return sys.getrefcount(array), sys.getrefcount(array.base)

    def empty(self, shape: tuple, dtype: np.dtype, row_bytes: Optional[int] = None) -> np.ndarray:
        """An array to fill: pooled when large; small ones straight from numpy (TensorFlow copies an array
        it cannot adopt, which costs less than aligning a small one). `row_bytes`: the bytes of
        `shape[1:]`, when known."""
        if row_bytes is None:
            row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        if dtype == np.dtype(object) or shape[0] * row_bytes < self.MIN_BYTES:
            return np.empty(shape, dtype)
        arrays = self._arrays.setdefault((shape, dtype), [])
        for array in arrays:
            if self._counts(array) == self._free_counts:  # nothing but the pool refers to it
                return array
        array = aligned_empty(shape, dtype)
        if len(arrays) < self.MAX_ARRAYS:
            arrays.append(array)
        return array
