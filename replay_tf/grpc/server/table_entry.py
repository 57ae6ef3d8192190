"""`TableEntry`: a table of the service and what the service caches about it.

Each entry holds its table and the table's name as the serialized field of sample responses, and gives
the table's `TableInfo` for ServerInfo. The servicer keeps one entry per table; `insert_stream` and
`sample_stream` look them up by table name.
"""
from __future__ import annotations

import dataclasses

from replay_tf.core import table as table_lib
from replay_tf.wire import raw_fields
from replay_tf.wire import protos
from replay_tf.wire import schema_pb2
from replay_tf.wire import table_info

__all__ = ["TableEntry"]


class TableEntry:
    """A table and what the service caches about it."""

    def __init__(self, table: table_lib.Table):
        self.table = table
        self.name = table.name
        self.table_field = raw_fields.table_field(table.name)
        self._signature_proto = None

    def info_proto(self) -> schema_pb2.TableInfo:
        """The table's `TableInfo` as ServerInfo sends it; the signature is encoded once."""
        info = self.table.info
        proto = table_info.table_info_to_proto(dataclasses.replace(info, signature=None))
        if info.signature is not None:
            if self._signature_proto is None:
                self._signature_proto = protos.encode_signature(info.signature)
            proto.signature.CopyFrom(self._signature_proto)
        return proto
