"""`TimestepDataset`: Reverb's dataset of the timesteps of sampled items, one element per timestep.

The items are sampled as `TrajectoryDataset` samples them (the same workers, limits and timeouts) with
columns of any length, then split into timesteps in the graph. As in Reverb, nothing marks where an item
ends; `TrajectoryDataset` is the better choice for whole items.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import tensorflow as tf
import tree

from replay_tf.sampling import lazy_dataset
from replay_tf.sampling.signature_checks import table_signature
from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo
from replay_tf.sampling.stacker import Stacker
from replay_tf.trajectory_dataset import TrajectoryDataset


class _Items(TrajectoryDataset):
    """The sampled items behind a `TimestepDataset`: columns `[timesteps, *timestep shape]`, checked against a
    table signature as timesteps (Reverb's timestep tables have one-timestep signatures)."""

    # (a safeguard: the leading dimension is unknown, which already keeps these off the shared feeder, and
    # items of any length are yielded one by one while a shared feeder stacks batches of fixed shapes only)
    _MAY_SHARE_SAMPLES = False

    def __init__(self, *args, timestep_shapes: list, **kwargs):
        self._timestep_shapes = timestep_shapes
        super().__init__(*args, **kwargs)

    def _signature_shapes(self) -> list:
        return self._timestep_shapes

    def _new_stacker(self) -> Stacker:
        return Stacker(self._column_paths, self._column_dtypes, self._column_shapes,
                       timestep_shapes=self._timestep_shapes)


class TimestepDataset(lazy_dataset.LazyDatasetV1):
    """A `tf.data.Dataset` of `ReplaySample`s, one per timestep of each sampled item, in order; `info`
    (scalars) is that of the item. Arguments as `TrajectoryDataset`'s, with `dtypes` and `shapes` of one
    timestep; `max_samples` counts items. A `tf.compat.v1.data.Dataset`, as `TrajectoryDataset`.

    Raises (when iterated):
      InvalidArgumentError: a sampled item whose columns are not timestep-shaped (squeezed, or of different
        lengths), or whose timesteps do not match `dtypes`/`shapes` (Reverb's "Received incompatible tensor
        ... Specification has (dtype, shape): ..." with per-timestep shapes).
    """

    def __init__(self, server_address: Union[str, tf.Tensor], table: Union[str, tf.Tensor], dtypes: Any,
                 shapes: Any, max_in_flight_samples_per_worker: int, num_workers_per_iterator: int = -1,
                 max_samples_per_stream: int = -1, rate_limiter_timeout_ms: int = -1, max_samples: int = -1):
        try:
            timestep_shapes = tree.map_structure_up_to(dtypes, tf.TensorShape, shapes)
        except (ValueError, TypeError) as e:
            raise ValueError(f"dtypes and shapes must have the same structure: {e}") from e
        item_shapes = tree.map_structure(lambda s: tf.TensorShape([None]).concatenate(s), timestep_shapes)
        self._items = _Items(server_address, table, dtypes, item_shapes, max_in_flight_samples_per_worker,
                             num_workers_per_iterator, max_samples_per_stream, rate_limiter_timeout_ms, max_samples,
                             stacked_samples=False, timestep_shapes=tree.flatten(timestep_shapes))
        self._element_spec = ReplaySample(
            info=SampleInfo(*[tf.TensorSpec(s, d) for s, d in zip(SampleInfo.tf_shapes(), SampleInfo.tf_dtypes())]),
            data=tree.unflatten_as(self._items.element_spec.data, [
                tf.TensorSpec(shape, spec.dtype)
                for shape, spec in zip(tree.flatten(timestep_shapes), tree.flatten(self._items.element_spec.data))]))
        super().__init__()

    @classmethod
    def from_table_signature(cls, server_address: str, table: str, max_in_flight_samples_per_worker: int,
                             num_workers_per_iterator: int = -1, max_samples_per_stream: int = -1,
                             rate_limiter_timeout_ms: int = -1, get_signature_timeout_secs: Optional[int] = None,
                             max_samples: int = -1) -> "TimestepDataset":
        """A dataset whose timestep dtypes and shapes are the table's signature (one timestep).

        Raises:
          ValueError: The server has no such table, or the table no signature.
          DeadlineExceededError: `get_signature_timeout_secs` ran out.
        """
        signature = table_signature(server_address, table, get_signature_timeout_secs)
        return cls(server_address, table, dtypes=tree.map_structure(lambda x: x.dtype, signature),
                   shapes=tree.map_structure(lambda x: x.shape, signature),
                   max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
                   num_workers_per_iterator=num_workers_per_iterator, max_samples_per_stream=max_samples_per_stream,
                   rate_limiter_timeout_ms=rate_limiter_timeout_ms, max_samples=max_samples)

    @property
    def element_spec(self) -> Any:
        return self._element_spec

    def _build_dataset(self) -> tf.data.Dataset:
        return self._items.flat_map(_timesteps)


def _timesteps(sample: ReplaySample) -> tf.data.Dataset:
    """The timesteps of one sampled item, each with the item's info."""
    columns = tree.flatten(sample.data)
    lengths = tf.stack([tf.shape(column, out_type=tf.int64)[0] for column in columns])
    checked = tf.debugging.assert_equal(
        lengths, tf.fill(tf.shape(lengths), lengths[0]),
        message="TimestepDataset: a sampled item's columns must all have the same number of timesteps; got")
    with tf.control_dependencies([checked]):
        count = tf.identity(lengths[0])
    info = SampleInfo(*(tf.fill([count], value) for value in sample.info))
    return tf.data.Dataset.from_tensor_slices(ReplaySample(info=info, data=sample.data))
