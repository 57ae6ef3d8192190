"""Reverb's `reverb.replay_sample`: `ReplaySample` and `SampleInfo`, what samplers and datasets yield.

Plain named tuples, so the client builds them without TensorFlow; `SampleInfo.tf_dtypes` and `tf_shapes`
import it when a dataset asks.
"""
from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "ReplaySample",
    "SampleInfo",
]


class SampleInfo(NamedTuple):
    """What is known about a sampled item: key, probability, table_size, priority, times_sampled."""
    key: Any
    probability: Any
    table_size: Any
    priority: Any
    times_sampled: Any

    @classmethod
    def tf_dtypes(cls) -> "SampleInfo":
        """Dtypes of (key, probability, table_size, priority, times_sampled)."""
        import tensorflow as tf  # noqa: PLC0415  (TensorFlow only for datasets, never for the client)
        return cls(tf.uint64, tf.double, tf.int64, tf.double, tf.int32)

    @classmethod
    def tf_shapes(cls) -> "SampleInfo":
        import tensorflow as tf  # noqa: PLC0415  (TensorFlow only for datasets, never for the client)
        return cls(*[tf.TensorShape([]) for _ in cls.tf_dtypes()])

    @classmethod
    def zeros(cls) -> "SampleInfo":
        """A SampleInfo with Python zero values for all fields."""
        return cls(0, 0.0, 0, 0.0, 0)


class ReplaySample(NamedTuple):
    """A sample: `info` (`SampleInfo`) and `data` (structured like the table signature or the given dtypes)."""
    info: SampleInfo
    data: Any
