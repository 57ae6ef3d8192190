"""Reverb's `reverb.Table`: the core's table with `info`, Reverb's `TableInfo` of protobuf messages.

The core (`replay_tf.core.table.Table`) holds the items, selectors and rate limiter and reports its state
as plain records (`status`); this subclass adds what Reverb's users read.

>>> table = Table.queue('q', 10)
>>> table.info.max_size, table.info.sampler_options.WhichOneof('distribution')
(10, 'fifo')
"""
from __future__ import annotations

from replay_tf.core import table as core_table
from replay_tf.wire.table_info import TableInfo

__all__ = ["Table"]


class Table(core_table.Table):
    """A replay table (Reverb's `reverb.Table`); see `replay_tf.core.table.Table` for the arguments."""

    @property
    def info(self) -> TableInfo:
        """The table's `TableInfo` (a snapshot)."""
        return TableInfo.from_status(self.status)
