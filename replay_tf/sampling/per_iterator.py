"""`PerIteratorBatches`: every iterator of a sample dataset opens its own sample streams and stacks their
batches in its own generator, read through `batch_source` (one `numpy_function` call per batch).

A sampler blocked on the rate limiter waits in slices of `POLL_MS` and hands tf.data an empty batch after
each slice, which the pipeline drops: tf.data cannot interrupt a Python function, but it checks for
cancellation between elements, so dropping an iterator stops a blocked sampler promptly. A slice that ends
without a sample takes nothing from the table, so no item is lost or counted as sampled.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import tensorflow as tf

from replay_tf.transport import addresses
from replay_tf.transport import base as transport_lib
from replay_tf import errors
from replay_tf.sampling import batch_source
from replay_tf.sampling import buffer_pool
from replay_tf.sampling import interpreter_exit
from replay_tf.sampling import sample_workers
from replay_tf.sampling.stacker import Stacker
from replay_tf.wire.stacked_samples import StackedSamples
from replay_tf.wire.stacked_samples import count_samples

# How long (milliseconds) a blocked sampler waits before yielding control back to tf.data.
POLL_MS = 100


@dataclasses.dataclass(frozen=True)
class SampleOptions:
    """What a sample dataset asks of a table, checked and with "not set" as None (see `TrajectoryDataset`).
    `server_address` and `table` are strs, or scalar string tensors whose values are known only when the
    dataset is iterated."""
    server_address: Any
    table: Any
    max_in_flight: int
    num_workers: int
    max_samples_per_stream: Optional[int]
    timeout_ms: Optional[int]
    max_samples: Optional[int]
    stacked_samples: Optional[bool]


class PerIteratorBatches:
    """The batches of `options`' table, stacked by `stacker`, each iterator sampling for itself; elements of
    `element_spec` (a nest of `tf.TensorSpec`s of an unknown leading dimension, flat as the stacker's)."""

    def __init__(self, options: SampleOptions, stacker: Stacker, element_spec: Any):
        self.options = options
        self.stacker = stacker
        self.element_spec = element_spec

    def batches(self, batch_size: Optional[int] = None, drop_remainder: bool = False) -> tf.data.Dataset:
        """The batches of `generate_flat` (see `batch_source`); the address and table reach it as tensors,
        so that values known only when the dataset is iterated work. Empty batches (yielded while blocked)
        included."""
        def generate(server_address: bytes, table: bytes):
            return interpreter_exit.ending_at_exit(self.generate_flat(
                batch_size, drop_remainder, server_address=server_address.decode(), table=table.decode(),
                packed=True))

        return batch_source.batches(generate, (self.options.server_address, self.options.table),
                                    self.element_spec, wrap=interpreter_exit.ending_at_exit)

    def generate_flat(self, batch_size: Optional[int] = None, drop_remainder: bool = False, *,
                      server_address: Optional[str] = None, table: Optional[str] = None, packed: bool = False):
        """Yields flat batches (see `stacker`) of `table` at `server_address` (default: the options', when
        known): one per flexible batch of samples, or, with `batch_size`, batches of exactly that many (the
        last one smaller unless `drop_remainder`). With `packed`, batches of items that keep their rows
        (in-process ones) may come as the packed array of `batch_source` instead (see `Stacker.packer`)."""
        options, stacker = self.options, self.stacker
        server_address = options.server_address if server_address is None else server_address
        table = options.table if table is None else table
        transport = transport_lib.make_transport(server_address)
        request = options.max_in_flight if batch_size is None else max(options.max_in_flight, batch_size)
        fully_defined = stacker.fully_defined
        stacked = (addresses.is_loopback_target(server_address) if options.stacked_samples is None
                   else bool(options.stacked_samples))
        stacked = stacked and fully_defined  # (variable shapes are not stacked here either)

        def open_stream(max_samples: Optional[int]):
            return transport.open_sample_stream(table, request, options.timeout_ms,
                                                max_samples_per_stream=options.max_samples_per_stream,
                                                max_samples=max_samples, stacked=stacked)

        # Never more than `max_samples` are taken from the table (a queue loses nothing); several workers
        # share that budget (see `sample_workers`).
        if options.num_workers == 1:
            stream = open_stream(options.max_samples)
        else:
            stream = sample_workers.ParallelStreams(open_stream, options.num_workers, options.max_samples,
                                                    request_size=request, poll_ms=POLL_MS)
        remaining = options.max_samples
        packer = stacker.packer() if packed and fully_defined and getattr(transport, "shares_items", False) else None
        pool = buffer_pool.BufferPool()
        pending: list = []
        pending_count = 0
        try:
            while remaining is None or remaining > 0:
                try:
                    batch = stream.next_batch(poll_ms=POLL_MS)
                except errors.DeadlineExceededError:
                    break  # a rate-limiter timeout ends the iteration, as in Reverb
                if not batch:  # still blocked: let tf.data check for cancellation
                    yield stacker.empty_flat()
                    continue
                count = count_samples(batch)
                if remaining is not None:
                    if count > remaining:
                        batch, _ = split_samples(batch, remaining)
                        count = remaining
                    remaining -= count
                if batch_size is not None:
                    pending.extend(batch)
                    pending_count += count
                    while pending_count >= batch_size:
                        head, pending = split_samples(pending, batch_size)
                        pending_count -= batch_size
                        yield stacker.packed_or_stacked(head, packer, pool, table)
                elif fully_defined:
                    yield stacker.packed_or_stacked(batch, packer, pool, table)
                else:  # variable shapes cannot be stacked: one sample per element
                    for sampled in batch:
                        yield stacker.single_flat(sampled, table)
            if pending and not drop_remainder:
                yield stacker.packed_or_stacked(pending, packer, None, table)
        finally:
            stream.close()


def split_samples(batch: list, n: int) -> tuple:
    """`(first, rest)`: the first `n` samples of a batch (`count_samples`) and the others, splitting a
    `StackedSamples` across the two if need be."""
    if len(batch) >= n and not any(type(x) is StackedSamples for x in batch[:n]):
        return batch[:n], batch[n:]
    taken = 0
    for i, piece in enumerate(batch):
        size = len(piece) if type(piece) is StackedSamples else 1
        if taken + size > n:
            k = n - taken
            return batch[:i] + [piece.rows(0, k)], [piece.rows(k, size)] + batch[i + 1:]
        taken += size
        if taken == n:
            return batch[:i + 1], batch[i + 1:]
    return batch, []
