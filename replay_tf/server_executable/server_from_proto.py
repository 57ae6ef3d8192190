"""Reverb's `reverb.server_executable.server_from_proto`: selectors, rate limiters and tables from protos.

The protos are this package's wire-compatible twins of Reverb's: `KeyDistributionOptions`
(`replay_tf.wire.schema_pb2`), `RateLimiterCheckpoint` and `PriorityTableCheckpoint`
(`replay_tf.wire.checkpoint_pb2`), e.g. the `tables` of a `reverb_config_pb2.ReverbServerConfig`.

>>> from google.protobuf import text_format
>>> from replay_tf.server_executable import reverb_config_pb2, server_from_proto
>>> config = text_format.Parse('''
...     tables { table_name: "replay" max_size: 1000 sampler { uniform: true } remover { fifo: true }
...              rate_limiter { samples_per_insert: 1.0 min_size_to_sample: 1
...                             min_diff: -1e300 max_diff: 1e300 } }
...     ''', reverb_config_pb2.ReverbServerConfig())
>>> [table] = server_from_proto.tables_from_proto(config.tables)
>>> table.name, table.info.sampler_options.WhichOneof('distribution'), table.info.max_size
('replay', 'uniform', 1000)
"""
from __future__ import annotations

from typing import Sequence

from replay_tf import rate_limiters
from replay_tf import reverb_types
from replay_tf import selectors
from replay_tf.table import Table
from replay_tf.wire import checkpoint_pb2
from replay_tf.wire import schema_pb2

__all__ = [
    "rate_limiter_from_proto",
    "selector_from_proto",
    "tables_from_proto",
]


def selector_from_proto(s: schema_pb2.KeyDistributionOptions) -> reverb_types.SelectorType:
    """The selector that a `KeyDistributionOptions` proto describes.

    Raises:
      ValueError: If the set distribution is `fifo`, `lifo` or `uniform` with the value false.
      NotImplementedError: If no distribution is set.
    """
    if s.fifo:
        return selectors.Fifo()
    if s.uniform:
        return selectors.Uniform()
    if s.lifo:
        return selectors.Lifo()
    kind = s.WhichOneof("distribution")
    if kind == "heap":
        return selectors.MinHeap() if s.heap.min_heap else selectors.MaxHeap()
    if kind == "prioritized":
        return selectors.Prioritized(s.prioritized.priority_exponent)
    if kind in ("fifo", "lifo", "uniform"):
        raise ValueError(f"distribution={kind} but the associated boolean value is false. Set {kind}: true, or "
                         f"another distribution (fifo, uniform, lifo, heap, prioritized).")
    raise NotImplementedError(f"distribution={kind}. Set one of fifo, uniform, lifo, heap or prioritized in the "
                              f"KeyDistributionOptions.")


def rate_limiter_from_proto(proto: checkpoint_pb2.RateLimiterCheckpoint) -> rate_limiters.RateLimiter:
    """The rate limiter of a `RateLimiterCheckpoint` proto's settings (its counters are not used)."""
    return rate_limiters.RateLimiter(samples_per_insert=proto.samples_per_insert,
                                     min_size_to_sample=proto.min_size_to_sample,
                                     min_diff=proto.min_diff, max_diff=proto.max_diff)


def tables_from_proto(configs: Sequence[checkpoint_pb2.PriorityTableCheckpoint]) -> Sequence[Table]:
    """One new, empty table per `PriorityTableCheckpoint`: name, sampler, remover, max_size, rate limiter and
    max_times_sampled as the proto sets them.

    Reverb ignores the proto's `signature`; here a set signature becomes the table's signature (so a
    config that declares one gets it, as it would from a checkpoint). Items and counters are not used.
    """
    tables = []
    for config in configs:
        signature = None
        if config.HasField("signature"):
            from replay_tf.wire import protos  # noqa: PLC0415  (decoding a signature needs TF's coder)
            signature = protos.decode_signature(config.signature)
        tables.append(Table(name=config.table_name,
                            sampler=selector_from_proto(config.sampler),
                            remover=selector_from_proto(config.remover),
                            max_size=config.max_size,
                            rate_limiter=rate_limiter_from_proto(config.rate_limiter),
                            max_times_sampled=config.max_times_sampled,
                            signature=signature))
    return tables
