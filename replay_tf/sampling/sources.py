"""Where a sample dataset's batches come from: `SampleBatches`, and the one place that picks its
implementation when the dataset is built (`sample_batches`).

Two implementations: `PerIteratorBatches` (`per_iterator`), where every iterator samples for itself, and
`SharedBatches` (`shared_samples`), where the iterators of one in-process table share one feeder thread,
used only where that changes nothing a user can tell (`shared_table_server`).
"""
from __future__ import annotations

from typing import Any, Optional, Protocol

import tensorflow as tf

from replay_tf.transport import inprocess
from replay_tf.sampling.per_iterator import PerIteratorBatches
from replay_tf.sampling.per_iterator import SampleOptions
from replay_tf.sampling import shared_samples
from replay_tf.sampling.shared_samples import SharedBatches
from replay_tf.sampling.stacker import Stacker


class SampleBatches(Protocol):
    """The batches of a sample dataset: flat elements of `stacker.flat_specs()` (samples stacked along an
    unknown leading dimension), the empty batches of a blocked sampler included."""

    def batches(self) -> tf.data.Dataset:
        """A new pipeline of the batches; each iterator of it samples from the start."""


def sample_batches(options: SampleOptions, stacker: Stacker, element_spec: Any, *,
                   may_share: bool = True) -> SampleBatches:
    """The batches of `options`' table for a dataset built now: shared where `shared_table_server` finds a
    server (and `may_share`), else per iterator. `element_spec` as `PerIteratorBatches` takes it."""
    per_iterator = PerIteratorBatches(options, stacker, element_spec)
    server = shared_table_server(options, stacker) if may_share else None
    if server is None:
        return per_iterator
    return SharedBatches(server, options.server_address, options.table, options.max_in_flight, stacker.packer(),
                         per_iterator, tuple(stacker.paths))


def shared_table_server(options: SampleOptions, stacker: Stacker):
    """The server of this process whose table the iterators of a dataset of `options` may share (see
    `shared_samples`), or None: sharing is on (`REPLAY_TF_SHARED_SAMPLES`), the address and table are
    known now, one worker per iterator, no sample limit and no rate-limiter timeout, shapes fully defined,
    built eagerly, the table is one of a server of this process, its items never deleted by sampling
    (`max_times_sampled` 0) and its batches are packed (`Stacker.packer`)."""
    if (not shared_samples.enabled()
            or not isinstance(options.server_address, str) or not isinstance(options.table, str)
            or options.num_workers != 1 or options.max_samples is not None or options.timeout_ms is not None
            or not stacker.fully_defined):
        return None
    with tf.init_scope():
        if not tf.executing_eagerly():
            return None
    transport = inprocess.for_address(options.server_address)
    if transport is None or stacker.packer() is None or options.table not in transport.server.tables:
        return None
    if transport.server.table(options.table).max_times_sampled != 0:
        return None
    return transport.server
