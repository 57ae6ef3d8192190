"""Conversions between the core's plain Python objects (`replay_tf.core`) and the `deepmind.reverb`
messages: flat trajectories, items, selector options, rate-limiter info, worker times and signatures
(`table_info` assembles Reverb's `TableInfo` from them).

Signatures travel as `tensorflow.StructuredValue`, written by `rlds_tf.structure_coder` (public APIs
only) byte for byte as TF's private `nested_structure_coder` writes them for Reverb.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

from replay_tf.core import chunk_store
from replay_tf.core import rate_limiters as rate_limiters_lib
from replay_tf.core import selectors as selectors_lib
from replay_tf.wire import schema_pb2
from rlds_tf import structure_coder

__all__ = [
    "decode_signature",
    "encode_signature",
    "item_to_proto",
    "key_distribution_options_from_proto",
    "key_distribution_options_to_proto",
    "rate_limiter_info_from_proto",
    "rate_limiter_info_to_proto",
    "table_worker_time_to_proto",
    "trajectory_from_proto",
    "trajectory_to_proto",
]


# --- items and trajectories ---

def trajectory_to_proto(trajectory: Sequence[chunk_store.Column], proto: Optional[schema_pb2.FlatTrajectory] = None
                        ) -> schema_pb2.FlatTrajectory:
    """A core flat trajectory (tuple of `Column`) as a `FlatTrajectory`."""
    proto = schema_pb2.FlatTrajectory() if proto is None else proto
    for column in trajectory:
        column_proto = proto.columns.add(squeeze=column.squeeze)
        for s in column.slices:
            column_proto.chunk_slices.add(chunk_key=s[0], offset=s[1], length=s[2], index=s[3])
    return proto


def trajectory_from_proto(proto: schema_pb2.FlatTrajectory) -> tuple:
    """A `FlatTrajectory` as a core flat trajectory (tuple of `Column`)."""
    return tuple(
        chunk_store.Column(tuple(chunk_store.ChunkSlice(s.chunk_key, s.offset, s.length, s.index)
                                 for s in column.chunk_slices), column.squeeze)
        for column in proto.columns)


def item_to_proto(item: chunk_store.Item, table: str, *, times_sampled: Optional[int] = None,
                  priority: Optional[float] = None) -> schema_pb2.PrioritizedItem:
    """A core item as a `PrioritizedItem` (`inserted_at` from the item's nanosecond clock)."""
    proto = schema_pb2.PrioritizedItem(
        key=item.key, table=table, priority=item.priority if priority is None else priority,
        times_sampled=item.times_sampled if times_sampled is None else times_sampled)
    if item.inserted_at:
        proto.inserted_at.seconds, proto.inserted_at.nanos = divmod(int(item.inserted_at), 1_000_000_000)
    trajectory_to_proto(item.trajectory, proto.flat_trajectory)
    return proto


# --- selectors, rate limiters, worker time, signatures ---

def key_distribution_options_to_proto(options: Any) -> schema_pb2.KeyDistributionOptions:
    """A new `KeyDistributionOptions` message equal to `options` (the core's record or such a message)."""
    proto = schema_pb2.KeyDistributionOptions()
    if isinstance(options, schema_pb2.KeyDistributionOptions):
        proto.CopyFrom(options)
        return proto
    proto.is_deterministic = options.is_deterministic
    kind = options.WhichOneof("distribution")
    if kind == "prioritized":
        proto.prioritized.priority_exponent = options.prioritized.priority_exponent
    elif kind == "heap":
        proto.heap.min_heap = options.heap.min_heap
    elif kind is not None:
        setattr(proto, kind, True)
    return proto


def key_distribution_options_from_proto(proto: schema_pb2.KeyDistributionOptions
                                        ) -> selectors_lib.KeyDistributionOptions:
    kind = proto.WhichOneof("distribution")
    kwargs: dict[str, Any] = {"is_deterministic": proto.is_deterministic}
    if kind == "prioritized":
        kwargs["prioritized"] = selectors_lib.PrioritizedOptions(proto.prioritized.priority_exponent)
    elif kind == "heap":
        kwargs["heap"] = selectors_lib.HeapOptions(proto.heap.min_heap)
    elif kind is not None:
        kwargs[kind] = True
    return selectors_lib.KeyDistributionOptions(**kwargs)


def rate_limiter_info_to_proto(info: Any) -> schema_pb2.RateLimiterInfo:
    """A new `RateLimiterInfo` message equal to `info` (the core's record or such a message)."""
    proto = schema_pb2.RateLimiterInfo()
    if isinstance(info, schema_pb2.RateLimiterInfo):
        proto.CopyFrom(info)
        return proto
    proto.samples_per_insert = info.samples_per_insert
    proto.min_diff = info.min_diff
    proto.max_diff = info.max_diff
    proto.min_size_to_sample = info.min_size_to_sample
    proto.insert_stats.completed = info.insert_stats.completed
    proto.sample_stats.completed = info.sample_stats.completed
    return proto


def rate_limiter_info_from_proto(proto: schema_pb2.RateLimiterInfo) -> rate_limiters_lib.RateLimiterInfo:
    return rate_limiters_lib.RateLimiterInfo(
        samples_per_insert=proto.samples_per_insert, min_diff=proto.min_diff, max_diff=proto.max_diff,
        min_size_to_sample=proto.min_size_to_sample,
        insert_stats=rate_limiters_lib.RateLimiterCallStats(proto.insert_stats.completed),
        sample_stats=rate_limiters_lib.RateLimiterCallStats(proto.sample_stats.completed))


def table_worker_time_to_proto(times: Any) -> schema_pb2.TableWorkerTime:
    """A new `TableWorkerTime` message equal to `times` (the core's record or such a message)."""
    proto = schema_pb2.TableWorkerTime()
    if isinstance(times, schema_pb2.TableWorkerTime):
        proto.CopyFrom(times)
        return proto
    for field in dataclasses.fields(times):
        setattr(proto, field.name, getattr(times, field.name))
    return proto


def encode_signature(signature: Any):
    """A nest of `tf.TensorSpec` as the `tensorflow.StructuredValue` Reverb stores in `TableInfo`."""
    return structure_coder.encode_structure(signature)


def decode_signature(proto) -> Any:
    """The nest of `tf.TensorSpec` of a `StructuredValue` (bounded specs as TF's `BoundedTensorSpec`)."""
    return structure_coder.decode_structure(proto)
