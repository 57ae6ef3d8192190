"""Reverb's `TableInfo`: a table's configuration and state, with its option and statistics fields as
`deepmind.reverb` messages, and its conversions to and from the `TableInfo` proto.

`TableInfo.from_status` builds one from the core's `TableStatus` (plain records); `replay_tf.Table.info`
returns that.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from replay_tf.core import rate_limiters as rate_limiters_lib
from replay_tf.core import selectors as selectors_lib
from replay_tf.core import table as table_lib
from replay_tf.wire import protos
from replay_tf.wire import schema_pb2

__all__ = ["TableInfo", "table_info_from_proto", "table_info_to_proto"]


def _as_message(value: Any, message_class: type, record_class: type, convert: Callable) -> Any:
    """`value` as a `message_class` message: a message of that type is kept (not copied); the core's
    `record_class` record is converted by `convert`."""
    if isinstance(value, message_class):
        return value
    if isinstance(value, record_class):
        return convert(value)
    raise TypeError(f"TableInfo needs a {message_class.DESCRIPTOR.full_name} message, got {value!r} "
                    f"({type(value).__name__}); pass the message (or the core's {record_class.__name__})")


@dataclasses.dataclass
class TableInfo:
    """Reverb's `TableInfo`: configuration and state of a table.

    As in Reverb, `signature` is a nest of `tf.TensorSpec` (or None) and the option and statistics fields
    are the protobuf messages themselves, with the whole message API (`HasField`, `WhichOneof`, `CopyFrom`,
    `SerializeToString`, equality with other messages): `sampler_options` and `remover_options` are
    `KeyDistributionOptions`, `rate_limiter_info` a `RateLimiterInfo` and `table_worker_time` a
    `TableWorkerTime` message of `replay_tf.wire.schema_pb2` (wire-compatible with `reverb.cc.schema_pb2`).
    The constructor also accepts the core's records for them (`KeyDistributionOptions`, `RateLimiterInfo`,
    `TableWorkerTime` dataclasses) and converts them.

    >>> import replay_tf as reverb
    >>> info = reverb.Table.queue('q', 10).info
    >>> info.sampler_options.WhichOneof('distribution'), info.rate_limiter_info.HasField('insert_stats')
    ('fifo', True)
    """
    name: str
    sampler_options: Any
    remover_options: Any
    max_size: int
    max_times_sampled: int
    rate_limiter_info: Any
    signature: Any
    current_size: int
    num_episodes: int
    num_deleted_episodes: int
    num_unique_samples: int
    table_worker_time: Any = dataclasses.field(default_factory=schema_pb2.TableWorkerTime)

    def __post_init__(self):
        options = (schema_pb2.KeyDistributionOptions, selectors_lib.KeyDistributionOptions,
                   protos.key_distribution_options_to_proto)
        self.sampler_options = _as_message(self.sampler_options, *options)
        self.remover_options = _as_message(self.remover_options, *options)
        self.rate_limiter_info = _as_message(self.rate_limiter_info, schema_pb2.RateLimiterInfo,
                                             rate_limiters_lib.RateLimiterInfo, protos.rate_limiter_info_to_proto)
        self.table_worker_time = _as_message(self.table_worker_time, schema_pb2.TableWorkerTime,
                                             table_lib.TableWorkerTime, protos.table_worker_time_to_proto)

    @classmethod
    def from_status(cls, status: table_lib.TableStatus) -> "TableInfo":
        """The `TableInfo` of a core table's `status` (its records converted to messages)."""
        return cls(**{field.name: getattr(status, field.name) for field in dataclasses.fields(status)})

    @classmethod
    def from_serialized_proto(cls, proto_string: bytes) -> "TableInfo":
        """The `TableInfo` of a serialized `deepmind.reverb.TableInfo` proto (as Reverb's alternate constructor).

        Raises:
          ValueError: If `proto_string` is not a serialized `TableInfo`.
        """
        from google.protobuf import message  # noqa: PLC0415
        try:
            proto = schema_pb2.TableInfo.FromString(proto_string)
        except (message.DecodeError, TypeError) as e:
            raise ValueError(f"not a serialized deepmind.reverb.TableInfo ({len(proto_string)} bytes): {e}") from None
        return table_info_from_proto(proto)


def table_info_to_proto(info: TableInfo) -> schema_pb2.TableInfo:
    """A `TableInfo` as the `TableInfo` proto (signature encoded as a `StructuredValue`)."""
    proto = schema_pb2.TableInfo(name=info.name, max_size=info.max_size, max_times_sampled=info.max_times_sampled,
                                 current_size=info.current_size, num_episodes=info.num_episodes,
                                 num_deleted_episodes=info.num_deleted_episodes,
                                 num_unique_samples=info.num_unique_samples)
    proto.sampler_options.CopyFrom(info.sampler_options)
    proto.remover_options.CopyFrom(info.remover_options)
    proto.rate_limiter_info.CopyFrom(info.rate_limiter_info)
    proto.table_worker_time.CopyFrom(info.table_worker_time)
    if info.signature is not None:
        proto.signature.CopyFrom(protos.encode_signature(info.signature))
    return proto


def table_info_from_proto(proto: schema_pb2.TableInfo) -> TableInfo:
    """A `TableInfo` proto as a `TableInfo` (signature decoded to a `tf.TensorSpec` nest; the option and
    statistics fields are the proto's own sub-messages, as in Reverb's `TableInfo.from_serialized_proto`)."""
    return TableInfo(
        name=proto.name,
        sampler_options=proto.sampler_options,
        remover_options=proto.remover_options,
        max_size=proto.max_size,
        max_times_sampled=proto.max_times_sampled,
        rate_limiter_info=proto.rate_limiter_info,
        signature=protos.decode_signature(proto.signature) if proto.HasField("signature") else None,
        current_size=proto.current_size,
        num_episodes=proto.num_episodes,
        num_deleted_episodes=proto.num_deleted_episodes,
        num_unique_samples=proto.num_unique_samples,
        table_worker_time=proto.table_worker_time)
