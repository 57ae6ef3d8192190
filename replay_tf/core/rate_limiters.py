"""Rate limiters (Reverb's `reverb.rate_limiters`): configs users pass to `Table`, and the admission rule.

A limiter is `(samples_per_insert, min_size_to_sample, min_diff, max_diff)`; the table keeps the counters
`inserts`, `samples`, `deletes` in a `RateLimiterState`. Reverb's rule:
  can sample n  <=>  inserts - deletes >= min_size_to_sample  and  inserts * spi - samples - n >= min_diff
  can insert n  <=>  inserts + n - deletes <= min_size_to_sample  or  (inserts + n) * spi - samples <= max_diff
Blocking (with timeouts) is done by the table, which owns the lock the counters are read under.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import sys
from typing import Tuple, Union

from replay_tf.core._arguments import integer

_MAX = sys.float_info.max


@dataclasses.dataclass(frozen=True)
class RateLimiterCallStats:
    """Mirror of Reverb's `RateLimiterCallStats` proto."""
    completed: int = 0


@dataclasses.dataclass(frozen=True)
class RateLimiterInfo:
    """Mirror of Reverb's `RateLimiterInfo` proto."""
    samples_per_insert: float
    min_diff: float
    max_diff: float
    min_size_to_sample: int
    insert_stats: RateLimiterCallStats = RateLimiterCallStats()
    sample_stats: RateLimiterCallStats = RateLimiterCallStats()


class RateLimiter:
    """Base rate limiter: `(samples_per_insert, min_size_to_sample, min_diff, max_diff)`."""

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float):
        self.samples_per_insert = float(samples_per_insert)
        self.min_size_to_sample = integer("min_size_to_sample", min_size_to_sample)  # 2.5, 3.0: TypeError
        self.min_diff = float(min_diff)
        self.max_diff = float(max_diff)

    def _build(self) -> "RateLimiterState":
        return RateLimiterState(self.samples_per_insert, self.min_size_to_sample, self.min_diff, self.max_diff)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(samples_per_insert={self.samples_per_insert}, "
                f"min_size_to_sample={self.min_size_to_sample}, min_diff={self.min_diff}, "
                f"max_diff={self.max_diff})")


def _check_min_size(min_size_to_sample: int) -> None:
    if min_size_to_sample < 1:
        raise ValueError(f"min_size_to_sample ({min_size_to_sample}) must be a positive integer")


class MinSize(RateLimiter):
    """Blocks sampling until the table holds `min_size_to_sample` items; never blocks inserts."""

    def __init__(self, min_size_to_sample: int):
        _check_min_size(min_size_to_sample)
        super().__init__(samples_per_insert=1.0, min_size_to_sample=min_size_to_sample, min_diff=-_MAX,
                         max_diff=_MAX)


class SampleToInsertRatio(RateLimiter):
    """Keeps `inserts * samples_per_insert - samples` within a range once `min_size_to_sample` is reached.

    A scalar `error_buffer` e gives the range `spi * min_size_to_sample -+ e`; a pair `(lo, hi)` is used as is.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: Union[float, Tuple[float, float]]):
        if isinstance(error_buffer, (int, float)):
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        else:
            min_diff, max_diff = error_buffer
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert ({samples_per_insert}) must be > 0")
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError("The size of error_buffer must be >= max(1.0, samples_per_insert) as smaller values "
                             "could completely block samples and/or insert calls.")
        if max_diff < samples_per_insert * min_size_to_sample:
            logging.warning("The range covered by error_buffer is below samples_per_insert * min_size_to_sample. "
                            "If the sampler cannot sample concurrently, this will result in a deadlock as soon "
                            "as min_size_to_sample items have been inserted.")
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError("The range covered by error_buffer is above samples_per_insert * min_size_to_sample. "
                             "This will result in a deadlock as soon as min_size_to_sample items have been "
                             "inserted.")
        _check_min_size(min_size_to_sample)
        super().__init__(samples_per_insert=samples_per_insert, min_size_to_sample=min_size_to_sample,
                         min_diff=min_diff, max_diff=max_diff)


class Queue(RateLimiter):
    """Queue of `size` items: sampling waits for an item, inserting waits for room. Use `Table.queue`."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size ({size}) must be a positive integer")
        super().__init__(samples_per_insert=1.0, min_size_to_sample=1, min_diff=0.0, max_diff=float(size))


class Stack(RateLimiter):
    """Stack of `size` items: sampling waits for an item, inserting waits for room. Use `Table.stack`."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size ({size}) must be a positive integer")
        super().__init__(samples_per_insert=1.0, min_size_to_sample=1, min_diff=0.0, max_diff=float(size))


class RateLimiterState:
    """The counters of one table's limiter and Reverb's admission rule over them (not thread-safe)."""

    __slots__ = ("samples_per_insert", "min_size_to_sample", "min_diff", "max_diff", "inserts", "samples",
                 "deletes")

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, min_diff: float, max_diff: float):
        self.samples_per_insert = samples_per_insert
        self.min_size_to_sample = min_size_to_sample
        self.min_diff = min_diff
        self.max_diff = max_diff
        self.inserts = self.samples = self.deletes = 0

    def can_insert(self, num_inserts: int = 1) -> bool:
        if self.inserts + num_inserts - self.deletes <= self.min_size_to_sample:
            return True  # below the minimum size inserts are always admitted
        return (self.inserts + num_inserts) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, num_samples: int = 1) -> bool:
        if self.inserts - self.deletes < self.min_size_to_sample:
            return False
        return self.inserts * self.samples_per_insert - self.samples - num_samples >= self.min_diff

    def num_can_sample(self, limit: int) -> int:
        """The largest n <= limit with `can_sample(n)` (0 if none)."""
        if self.inserts - self.deletes < self.min_size_to_sample:
            return 0
        room = self.inserts * self.samples_per_insert - self.samples - self.min_diff
        if room >= limit:
            return limit
        return max(0, min(limit, int(math.floor(room))))

    def reset(self) -> None:
        self.inserts = self.samples = self.deletes = 0

    def config(self) -> RateLimiter:
        return RateLimiter(self.samples_per_insert, self.min_size_to_sample, self.min_diff, self.max_diff)

    def info(self) -> RateLimiterInfo:
        return RateLimiterInfo(self.samples_per_insert, self.min_diff, self.max_diff, self.min_size_to_sample,
                               RateLimiterCallStats(self.inserts), RateLimiterCallStats(self.samples))
