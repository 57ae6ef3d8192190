"""`TrajectoryDataset`: a `tf.data.Dataset` of `ReplaySample`s streamed from a table.

Samples are fetched in flexible batches (up to `max_in_flight_samples_per_worker` per request), stacked per
column with numpy and yielded as one element per batch; tf.data's unbatch kernel turns them back into
single samples, so the Python cost is paid per batch, not per sample. A rate-limiter timeout
(`rate_limiter_timeout_ms`) ends the iteration, as in Reverb.

The batches come from `replay_tf.sampling` (`sampling.sources` picks their source when the dataset is
built); a sampler blocked on the rate limiter hands tf.data empty batches, which the pipeline drops, so
dropping an iterator stops it promptly, as Reverb's cancellable sampler does (see `sampling.per_iterator`).

>>> import replay_tf as reverb, tensorflow as tf, numpy as np
>>> server = reverb.Server([reverb.Table.queue('q', 10, signature=tf.TensorSpec([1, 2], tf.float32))])
>>> client = reverb.Client(f'localhost:{server.port}')
>>> client.insert(np.array([1.0, 2.0], np.float32), priorities={'q': 1.0})  # a length-1 item
>>> dataset = reverb.TrajectoryDataset.from_table_signature(
...     f'localhost:{server.port}', 'q', max_in_flight_samples_per_worker=2, rate_limiter_timeout_ms=100)
>>> [s.data.numpy().tolist() for s in dataset]
[[[1.0, 2.0]]]
>>> server.stop()
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tree

from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo
from replay_tf.sampling import buffer_pool
from replay_tf.sampling import lazy_dataset
from replay_tf.sampling import signature_checks
from replay_tf.sampling import sources
from replay_tf.sampling.per_iterator import PerIteratorBatches
from replay_tf.sampling.per_iterator import SampleOptions
from replay_tf.sampling.stacker import Stacker
from rlds_tf.nests import format_path, lists_to_tuples
from rlds_tf.patterns import items_dataset


class TrajectoryDataset(lazy_dataset.LazyDatasetV1):
    """Reverb's `reverb.TrajectoryDataset`: samples of `table` as `ReplaySample(info, data)`.

    A `tf.compat.v1.data.Dataset`, as Reverb's: TF1 graphs iterate it with `make_one_shot_iterator()` or
    `make_initializable_iterator()` (see `lazy_dataset`).

    Args:
      server_address: `host:port` of the server: a str or a scalar string tensor.
      table: Table to sample from: a str or a scalar string tensor, whose value may be known only when the
        dataset is iterated (e.g. a `tf.function` argument or a placeholder), as Reverb's op takes it. A
        name known only then is checked only then: an unknown one raises InvalidArgumentError ("Priority
        table ... was not found"; Reverb's kernel raises NotFoundError, which a Python function inside a
        tf.data pipeline cannot raise).
      dtypes: Nest of `tf.DType`s of the item's columns (lists become tuples).
      shapes: Nest of `tf.TensorShape`s, same structure as `dtypes`.
      max_in_flight_samples_per_worker: Samples requested per request (2-3x the batch size is a good value).
      num_workers_per_iterator: -1 (one worker, Reverb's default) or >= 1: the number of sample streams
        each iterator keeps open, each drained by its own thread, each with up to
        `max_in_flight_samples_per_worker` samples in flight. With more than one worker the order in which
        samples arrive is not deterministic (Reverb's documented behaviour); use 1 for FIFO-like tables
        when order matters. Every sample is still delivered once (a Queue table's items exactly once).
      max_samples_per_stream: -1 or >= 1; passed to remote transports, which re-open streams after it.
      rate_limiter_timeout_ms: -1 waits forever; otherwise a rate-limiter wait longer than this ends the
        iteration (0 ends it as soon as sampling would block).
      max_samples: -1 for no limit, else the iteration ends after this many samples, and no more than that
        many are taken from the table (nothing sampled ahead is lost from a queue): several workers share
        the budget, each reserving from what is left before it asks.
      stacked_samples: (an addition) whether to ask remote servers for samples stacked per column, an
        extension of Reverb's protocol that rl-data-tf servers implement (Reverb servers ignore it and
        send samples as usual): the server gathers each response's samples into one array per column, which
        spares the client, whose single Python thread bounds the rate, most of its work per sample. The
        columns travel uncompressed, so the default (None) asks only servers on this machine (loopback
        addresses); True asks any server, False none. Needs fully defined shapes.
    """

    #: Whether the iterators of this dataset may share the samples of a table of this process (see
    #: `sampling.sources`); a subclass whose batches the shared feeder must not stack sets False.
    _MAY_SHARE_SAMPLES = True

    def __init__(self, server_address: Union[str, tf.Tensor], table: Union[str, tf.Tensor], dtypes: Any,
                 shapes: Any, max_in_flight_samples_per_worker: int, num_workers_per_iterator: int = -1,
                 max_samples_per_stream: int = -1, rate_limiter_timeout_ms: int = -1, max_samples: int = -1,
                 *, stacked_samples: Optional[bool] = None):
        server_address = _string_argument("server_address", server_address)
        table = _string_argument("table", table)
        if max_in_flight_samples_per_worker < 1:
            raise ValueError(f"max_in_flight_samples_per_worker ({max_in_flight_samples_per_worker}) must be a "
                             f"positive integer")
        if num_workers_per_iterator < 1 and num_workers_per_iterator != -1:
            raise ValueError(f"num_workers_per_iterator ({num_workers_per_iterator}) must be a positive integer "
                             f"or -1")
        if max_samples_per_stream < 1 and max_samples_per_stream != -1:
            raise ValueError(f"max_samples_per_stream ({max_samples_per_stream}) must be a positive integer or -1")
        if rate_limiter_timeout_ms < -1:
            raise ValueError(f"rate_limiter_timeout_ms ({rate_limiter_timeout_ms}) must be an integer >= -1")
        if max_samples < 1 and max_samples != -1:
            raise ValueError(f"max_samples ({max_samples}) must be a positive integer or -1")
        dtypes = lists_to_tuples(dtypes)
        shapes = lists_to_tuples(shapes)
        try:
            tree.assert_same_structure(dtypes, shapes, check_types=False)
        except (ValueError, TypeError) as e:
            raise ValueError(f"dtypes and shapes must have the same structure: {e}") from e
        self._server_address = server_address
        self._table = table
        self._data_structure = dtypes
        self._column_dtypes = [tf.as_dtype(d) for d in tree.flatten(dtypes)]
        self._column_shapes = [tf.TensorShape(s) for s in tree.flatten(shapes)]
        self._column_paths = [format_path(path) for path, _ in tree.flatten_with_path(dtypes)]
        self._options = SampleOptions(
            server_address=server_address, table=table, max_in_flight=max_in_flight_samples_per_worker,
            num_workers=1 if num_workers_per_iterator == -1 else num_workers_per_iterator,
            max_samples_per_stream=None if max_samples_per_stream == -1 else max_samples_per_stream,
            timeout_ms=None if rate_limiter_timeout_ms == -1 else rate_limiter_timeout_ms,
            max_samples=None if max_samples == -1 else max_samples, stacked_samples=stacked_samples)
        self._stacker = self._new_stacker()
        self._batches = None  # (the `sampling.sources.SampleBatches` picked when the pipeline is built)
        if isinstance(server_address, str) and isinstance(table, str):
            self._validate_against_signature()
        super().__init__()

    @classmethod
    def from_table_signature(cls, server_address: str, table: str, max_in_flight_samples_per_worker: int,
                             num_workers_per_iterator: int = -1, max_samples_per_stream: int = -1,
                             rate_limiter_timeout_ms: int = -1, get_signature_timeout_secs: Optional[int] = None,
                             max_samples: int = -1, *, stacked_samples: Optional[bool] = None
                             ) -> "TrajectoryDataset":
        """A dataset whose dtypes and shapes come from the table's signature."""
        signature = signature_checks.table_signature(server_address, table, get_signature_timeout_secs)
        return cls(server_address=server_address, table=table,
                   shapes=tree.map_structure(lambda x: x.shape, signature),
                   dtypes=tree.map_structure(lambda x: x.dtype, signature),
                   max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
                   num_workers_per_iterator=num_workers_per_iterator,
                   max_samples_per_stream=max_samples_per_stream,
                   rate_limiter_timeout_ms=rate_limiter_timeout_ms, max_samples=max_samples,
                   stacked_samples=stacked_samples)

    @property
    def element_spec(self) -> ReplaySample:
        return tree.map_structure(lambda spec: tf.TensorSpec(spec.shape[1:], spec.dtype), self._batch_specs(None))

    def _new_stacker(self) -> Stacker:
        """The `Stacker` of this dataset's batches (`TimestepDataset`'s items stack timesteps)."""
        return Stacker(self._column_paths, self._column_dtypes, self._column_shapes)

    def _validate_against_signature(self) -> None:
        """ValueError when the table has a signature that the requested dtypes/shapes contradict."""
        signature_checks.check_requested(self._server_address, self._table, self._column_paths,
                                         self._column_dtypes, self._signature_shapes())

    def _signature_shapes(self) -> list:
        """The column shapes a table signature must be compatible with (`TimestepDataset`'s are timesteps)."""
        return self._column_shapes

    def _batch_specs(self, batch_size: Optional[int]) -> ReplaySample:
        return ReplaySample(
            info=SampleInfo(*[tf.TensorSpec([batch_size], d) for d in SampleInfo.tf_dtypes()]),
            data=tree.unflatten_as(self._data_structure, [
                tf.TensorSpec([batch_size, *s.as_list()] if s.rank is not None else None, d)
                for d, s in zip(self._column_dtypes, self._column_shapes)]))

    def _per_iterator(self) -> PerIteratorBatches:
        return PerIteratorBatches(self._options, self._stacker, self._batch_specs(None))

    def _build_dataset(self) -> tf.data.Dataset:
        self._batches = sources.sample_batches(self._options, self._stacker, self._batch_specs(None),
                                               may_share=self._MAY_SHARE_SAMPLES)
        # tf.data's unbatch kernel, without the map that `Dataset.unbatch` adds (see `ItemsDataset`): one
        # function call less per batch. It also drops the empty batches yielded while blocked.
        return items_dataset.ItemsDataset(self._batches.batches())

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        """`tf.data.Dataset.batch`, computed without unbatching: batches of samples are stacked once, in
        numpy, into 64-byte aligned arrays that TensorFlow adopts without copying (large ones are reused
        once no tensor refers to them, see `sampling.buffer_pool`). Same elements as
        `Dataset.batch` on this dataset; other arguments fall back to it."""
        simple = (num_parallel_calls is None and deterministic is None and name is None
                  and isinstance(batch_size, (int, np.integer)) and batch_size >= 1
                  and self._stacker.fully_defined)
        if not simple:
            return super().batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=num_parallel_calls,
                                 deterministic=deterministic, name=name)
        batch_size = int(batch_size)
        drop_remainder = bool(drop_remainder)

        def build() -> tf.data.Dataset:
            # Drop the empty batches yielded while blocked (see `sampling.per_iterator`).
            dataset = self._per_iterator().batches(batch_size, drop_remainder).filter(_non_empty)
            if drop_remainder:
                dataset = dataset.map(_ensure_batch_size(self._batch_specs(batch_size)))
            return dataset

        return lazy_dataset.DatasetV1(build, self._batch_specs(batch_size if drop_remainder else None))

    def _stack(self, samples: list, pool: Optional[buffer_pool.BufferPool] = None, table: Optional[str] = None
               ) -> ReplaySample:
        """One `ReplaySample` of arrays stacked along a new leading axis (fully defined shapes only), from a
        sample stream's batch of `table` (default: the dataset's): `SampledItem`s and `StackedSamples`."""
        return self._unflatten(self._stacker.stack_flat(samples, pool, self._table if table is None else table))

    def _unflatten(self, flat: list) -> ReplaySample:
        """The `ReplaySample` of a flat batch (the 5 `SampleInfo` columns, then the data columns)."""
        return ReplaySample(SampleInfo(*flat[:5]), tree.unflatten_as(self._data_structure, flat[5:]))

    def _generate_batches(self, batch_size: Optional[int] = None, drop_remainder: bool = False, *,
                          server_address: Optional[str] = None, table: Optional[str] = None):
        """Yields `ReplaySample`s of stacked arrays of `table` at `server_address` (default: the dataset's,
        when known): one per flexible batch of samples, or, with `batch_size`, batches of exactly that many
        (the last one smaller unless `drop_remainder`)."""
        for flat in self._per_iterator().generate_flat(batch_size, drop_remainder, server_address=server_address,
                                                        table=table):
            yield self._unflatten(flat)


@tf.autograph.experimental.do_not_convert
def _non_empty(sample: ReplaySample) -> tf.Tensor:
    return tf.shape(sample.info.key)[0] > 0


def _ensure_batch_size(specs: ReplaySample):
    """A map function giving batches the static shapes of `specs`."""
    @tf.autograph.experimental.do_not_convert
    def ensure(sample: ReplaySample) -> ReplaySample:
        return tree.map_structure(lambda x, spec: tf.ensure_shape(x, spec.shape), sample, specs)
    return ensure


def _string_argument(name: str, value: Any) -> Union[str, tf.Tensor]:
    """`value` as a str when it is known now (a str, or a scalar string tensor of known value), else as the
    scalar string tensor it is (read when the dataset is iterated, as Reverb's op reads it); TypeError for
    anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):  # (TensorFlow converts bytes to string tensors too)
        return value.decode()
    if tf.is_tensor(value) and value.dtype == tf.string and value.shape.is_compatible_with([]):
        static = tf.get_static_value(value)  # (bytes eagerly; a 0-d object array in graphs)
        if static is None:
            return tf.reshape(value, [])
        static = np.asarray(static)
        if static.shape == ():
            static = static.item()
            return static.decode() if isinstance(static, bytes) else str(static)
    raise TypeError(f"{name} must be a str or a scalar string tensor, got {value!r}")
