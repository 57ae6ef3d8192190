"""`TrajectoryDataset`: a `tf.data.Dataset` of `ReplaySample`s streamed from a table.

Samples are fetched in flexible batches (up to `max_in_flight_samples_per_worker` per request), stacked per
column with numpy and yielded as one element per batch; tf.data's unbatch kernel turns them back into
single samples, so the Python cost is paid per batch, not per sample. A rate-limiter timeout
(`rate_limiter_timeout_ms`) ends the iteration, as in Reverb.

A sampler blocked on the rate limiter waits in slices of `_POLL_MS` and hands tf.data an empty batch
after each slice, which the pipeline drops. tf.data cannot interrupt a Python function, but it checks
for cancellation between elements: that is how dropping an iterator (or garbage collecting it) stops a
blocked sampler promptly, as Reverb's cancellable sampler does. A slice that ends without a sample takes
nothing from the table, so no item is lost or counted as sampled.

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

import operator
from typing import Any, Optional, Union

import numpy as np
import tensorflow as tf
import tree

from replay_tf import _addresses
from replay_tf.sampling import batch_source
from replay_tf.sampling import buffer_pool
from replay_tf.sampling import interpreter_exit
from replay_tf import _inprocess_transport
from replay_tf.sampling import lazy_dataset
from replay_tf.sampling import packed_rows
from replay_tf.sampling import sample_workers
from replay_tf.sampling import shared_samples
from replay_tf.sampling import signature_checks
from replay_tf.sampling import stacking
from replay_tf import _transport as transport_lib
from replay_tf import errors
from replay_tf.sampling.signature_checks import numpy_dtype
from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo
from rlds_tf.patterns import items_dataset

# How long (milliseconds) a blocked sampler waits before yielding control back to tf.data.
_POLL_MS = 100


def _lists_to_tuples(structure: Any) -> Any:
    if isinstance(structure, list):
        return tuple(_lists_to_tuples(x) for x in structure)
    if isinstance(structure, tuple) and hasattr(structure, "_fields"):
        return type(structure)(*(_lists_to_tuples(x) for x in structure))
    if isinstance(structure, tuple):
        return tuple(_lists_to_tuples(x) for x in structure)
    if isinstance(structure, dict):
        return type(structure)((k, _lists_to_tuples(v)) for k, v in structure.items())
    return structure


_get_key = operator.attrgetter("key")


def _info_arrays(batch: list) -> SampleInfo:
    """The `SampleInfo` columns of `SampledItem`s (item, priority, times_sampled, probability, table_size)."""
    n = len(batch)
    return SampleInfo(
        key=np.fromiter(map(_get_key, map(operator.itemgetter(0), batch)), np.uint64, n),
        probability=np.fromiter(map(operator.itemgetter(3), batch), np.float64, n),
        table_size=np.fromiter(map(operator.itemgetter(4), batch), np.int64, n),
        priority=np.fromiter(map(operator.itemgetter(1), batch), np.float64, n),
        times_sampled=np.fromiter(map(operator.itemgetter(2), batch), np.int32, n))


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
        dtypes = _lists_to_tuples(dtypes)
        shapes = _lists_to_tuples(shapes)
        try:
            tree.assert_same_structure(dtypes, shapes, check_types=False)
        except (ValueError, TypeError) as e:
            raise ValueError(f"dtypes and shapes must have the same structure: {e}") from e
        self._server_address = server_address
        self._table = table
        self._data_structure = dtypes
        self._column_dtypes = [tf.as_dtype(d) for d in tree.flatten(dtypes)]
        self._column_shapes = [tf.TensorShape(s) for s in tree.flatten(shapes)]
        # (numpy dtype, shape tuple) per column, and bytes per row (None where a shape is not fully defined)
        self._column_layout = [(numpy_dtype(d), tuple(s.as_list()) if s.is_fully_defined() else None)
                               for d, s in zip(self._column_dtypes, self._column_shapes)]
        self._row_bytes = [None if shape is None else int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                           for dtype, shape in self._column_layout]
        self._column_paths = ["/".join(str(p) for p in path) or "<root>" for path, _ in tree.flatten_with_path(dtypes)]
        self._max_in_flight = max_in_flight_samples_per_worker
        self._num_workers = 1 if num_workers_per_iterator == -1 else num_workers_per_iterator
        self._max_samples_per_stream = None if max_samples_per_stream == -1 else max_samples_per_stream
        self._timeout_ms = None if rate_limiter_timeout_ms == -1 else rate_limiter_timeout_ms
        self._max_samples = None if max_samples == -1 else max_samples
        self._stacked_samples = stacked_samples
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

    def _validate_against_signature(self) -> None:
        """ValueError when the table has a signature that the requested dtypes/shapes contradict."""
        signature_checks.check_requested(self._server_address, self._table, self._column_paths,
                                          self._column_dtypes, self._signature_shapes())

    def _check_item(self, item, table: str) -> None:
        """Raises ValueError for an item of `table` this dataset cannot yield (checked before its columns;
        only for samples of variable shapes, yielded one by one)."""

    def _signature_shapes(self) -> list:
        """The column shapes a table signature must be compatible with (`TimestepDataset`'s are timesteps)."""
        return self._column_shapes

    def _batch_specs(self, batch_size: Optional[int]) -> ReplaySample:
        return ReplaySample(
            info=SampleInfo(*[tf.TensorSpec([batch_size], d) for d in SampleInfo.tf_dtypes()]),
            data=tree.unflatten_as(self._data_structure, [
                tf.TensorSpec([batch_size, *s.as_list()] if s.rank is not None else None, d)
                for d, s in zip(self._column_dtypes, self._column_shapes)]))

    def _from_generator(self, batch_size: Optional[int] = None, drop_remainder: bool = False) -> tf.data.Dataset:
        """The batches of `_generate_batches` (see `batch_source`); the address and table reach it as
        tensors, so that values known only when the dataset is iterated work."""
        def generate(server_address: bytes, table: bytes):
            return interpreter_exit.ending_at_exit(self._generate_flat(
                batch_size, drop_remainder, server_address=server_address.decode(), table=table.decode(),
                packed=True))

        return batch_source.batches(generate, (self._server_address, self._table), self._batch_specs(None),
                                     wrap=interpreter_exit.ending_at_exit)

    def _build_dataset(self) -> tf.data.Dataset:
        # tf.data's unbatch kernel, without the map that `Dataset.unbatch` adds (see `ItemsDataset`): one
        # function call less per batch. It also drops the empty batches yielded while blocked.
        return items_dataset.ItemsDataset(self._shared_batches() or self._from_generator())

    def _shared_batches(self) -> Optional[tf.data.Dataset]:
        """The batches of a table of this process through `shared_samples`, where that changes nothing a
        user can tell (see its module docstring; its iterators may still read `_from_generator`'s); None
        otherwise."""
        if (not shared_samples.enabled() or type(self) is not TrajectoryDataset
                or not isinstance(self._server_address, str) or not isinstance(self._table, str)
                or self._num_workers != 1 or self._max_samples is not None or self._timeout_ms is not None
                or not all(s.is_fully_defined() for s in self._column_shapes)):
            return None
        with tf.init_scope():
            if not tf.executing_eagerly():
                return None
        transport = _inprocess_transport.for_address(self._server_address)
        packer = self._packer()
        if transport is None or packer is None or self._table not in transport.server.tables:
            return None
        if transport.server.table(self._table).max_times_sampled != 0:
            return None
        table = self._table
        return shared_samples.dataset(transport.server, self._server_address, table, self._max_in_flight, packer,
                                       lambda samples: self._stack_flat(samples, None, table),
                                       self._batch_specs(None), self._from_generator(),
                                       tuple(self._column_paths))

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        """`tf.data.Dataset.batch`, computed without unbatching: batches of samples are stacked once, in
        numpy, into 64-byte aligned arrays that TensorFlow adopts without copying (large ones are reused
        once no tensor refers to them, see `buffer_pool`). Same elements as
        `Dataset.batch` on this dataset; other arguments fall back to it."""
        simple = (num_parallel_calls is None and deterministic is None and name is None
                  and isinstance(batch_size, (int, np.integer)) and batch_size >= 1
                  and all(s.is_fully_defined() for s in self._column_shapes))
        if not simple:
            return super().batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=num_parallel_calls,
                                 deterministic=deterministic, name=name)
        batch_size = int(batch_size)
        drop_remainder = bool(drop_remainder)

        def build() -> tf.data.Dataset:
            # Drop the empty batches yielded while blocked (see the module docstring).
            dataset = self._from_generator(batch_size, drop_remainder).filter(_non_empty)
            if drop_remainder:
                dataset = dataset.map(_ensure_batch_size(self._batch_specs(batch_size)))
            return dataset

        return lazy_dataset.DatasetV1(build, self._batch_specs(batch_size if drop_remainder else None))

    def _check_columns(self, columns: list, table: str) -> None:
        """InvalidArgument (a ValueError in the generator) for columns of `table` that this dataset cannot
        yield (see `signature_checks.check_received`)."""
        signature_checks.check_received(columns, table, self._column_paths, self._column_dtypes,
                                         self._column_shapes, self._reported_shapes)

    def _reported_shapes(self, index: int, column_shape: tuple) -> tuple:
        """(the requested shape, the item's shape) of column `index` as a mismatch reports them."""
        return self._column_shapes[index], tf.TensorShape(column_shape)

    def _stack(self, samples: list, pool: Optional[buffer_pool.BufferPool] = None, table: Optional[str] = None
               ) -> ReplaySample:
        """One `ReplaySample` of arrays stacked along a new leading axis (fully defined shapes only), from a
        sample stream's batch of `table` (default: the dataset's): `SampledItem`s and `StackedSamples` (see
        `stacking`)."""
        return self._unflatten(self._stack_flat(samples, pool, self._table if table is None else table))

    def _unflatten(self, flat: list) -> ReplaySample:
        """The `ReplaySample` of a flat batch (the 5 `SampleInfo` columns, then the data columns)."""
        return ReplaySample(SampleInfo(*flat[:5]), tree.unflatten_as(self._data_structure, flat[5:]))

    def _stack_flat(self, samples: list, pool: Optional[buffer_pool.BufferPool], table: str) -> list:
        """`_stack`'s batch flat: the 5 `SampleInfo` columns, then the data columns (as `tree` flattens)."""
        count = stacking.count_samples(samples)
        if pool is None:
            data = [buffer_pool.aligned_empty((count, *shape), dtype) for dtype, shape in self._column_layout]
        else:
            data = [pool.empty((count, *shape), dtype, row_bytes)
                    for (dtype, shape), row_bytes in zip(self._column_layout, self._row_bytes)]
        infos = []
        pos = 0
        for run in _runs(samples):
            if type(run) is stacking.StackedSamples:
                # (row 0: every row has its dtype and shape)
                self._check_columns([c[0] for c in run.columns], table)
                for out, column in zip(data, run.columns):
                    out[pos:pos + len(run)] = column
                infos.append(SampleInfo(run.keys, run.probabilities, run.table_sizes, run.priorities,
                                        run.times_sampled))
            else:
                self._gather(run, data if pos == 0 and len(run) == count else
                             [out[pos:pos + len(run)] for out in data], table)
                infos.append(_info_arrays(run))
            pos += len(run)
        info = infos[0] if len(infos) == 1 else SampleInfo(*map(np.concatenate, zip(*infos)))
        return [*info, *data]

    def _gather(self, samples: list, data: list, table: str) -> None:
        """Fills `data` (one array per column) with the columns of `SampledItem`s of `table`."""
        items = [s.item for s in samples]
        per_item = None
        if any(len(item.resolved_columns) != len(data) for item in items):
            per_item = [item.column_arrays() for item in items]
            for cols in per_item:
                self._check_columns(cols, table)  # (raises for the first item of another column count)
        for i, out in enumerate(data):
            if not stacking.gather_column(items, i, out):
                if per_item is None:
                    per_item = [item.column_arrays() for item in items]
                    self._check_columns(per_item[0], table)
                try:
                    np.stack([cols[i] for cols in per_item], out=out, casting="no")
                except (ValueError, TypeError):  # some item has another dtype or shape: name it
                    for cols in per_item:
                        self._check_columns(cols, table)
                    raise

    def _packer(self) -> Optional[packed_rows.PackedRows]:
        """Packs batches from the rows items keep (see `packed_rows`), when batches of this dataset are
        handed to TensorFlow packed (small numeric rows, see `batch_source`); None otherwise."""
        if batch_source.packed_row_bytes(self._batch_specs(None)) is None:
            return None
        return packed_rows.PackedRows([numpy_dtype(d) for d in SampleInfo.tf_dtypes()], self._column_layout)

    def _packed_or_stacked(self, samples: list, packer: Optional[packed_rows.PackedRows],
                           pool: Optional[buffer_pool.BufferPool], table: str):
        """A batch as `packer` packs it (see `batch_source.packed_row_bytes`), else flat (`_stack_flat`)."""
        packed = None if packer is None else packer.pack(samples)
        return self._stack_flat(samples, pool, table) if packed is None else packed

    def _empty(self) -> ReplaySample:
        """A batch of zero samples (unknown dimensions set to 0)."""
        return self._unflatten(self._empty_flat())

    def _empty_flat(self) -> list:
        """`_empty()` flat (see `_stack_flat`)."""
        data = [np.empty((0, *(0 if d is None else d for d in s.as_list())) if s.rank is not None else (0,),
                         numpy_dtype(dtype)) for dtype, s in zip(self._column_dtypes, self._column_shapes)]
        return [*_info_arrays([]), *data]

    def _generate_batches(self, batch_size: Optional[int] = None, drop_remainder: bool = False, *,
                          server_address: Optional[str] = None, table: Optional[str] = None):
        """Yields `ReplaySample`s of stacked arrays of `table` at `server_address` (default: the dataset's,
        when known): one per flexible batch of samples, or, with `batch_size`, batches of exactly that many
        (the last one smaller unless `drop_remainder`)."""
        for flat in self._generate_flat(batch_size, drop_remainder, server_address=server_address, table=table):
            yield self._unflatten(flat)

    def _generate_flat(self, batch_size: Optional[int] = None, drop_remainder: bool = False, *,
                       server_address: Optional[str] = None, table: Optional[str] = None, packed: bool = False):
        """`_generate_batches`, each batch flat (see `_stack_flat`); with `packed`, batches of items that keep
        their rows (in-process ones) may come as the packed array of `batch_source` instead (see `_packer`)."""
        server_address = self._server_address if server_address is None else server_address
        table = self._table if table is None else table
        transport = transport_lib.make_transport(server_address)
        request = self._max_in_flight if batch_size is None else max(self._max_in_flight, batch_size)
        fully_defined = all(s.is_fully_defined() for s in self._column_shapes)
        stacked = (_addresses.is_loopback_target(server_address) if self._stacked_samples is None
                   else bool(self._stacked_samples))
        stacked = stacked and fully_defined  # (variable shapes are not stacked here either)

        def open_stream(max_samples: Optional[int]):
            return transport.open_sample_stream(table, request, self._timeout_ms,
                                                max_samples_per_stream=self._max_samples_per_stream,
                                                max_samples=max_samples, stacked=stacked)

        # Never more than `max_samples` are taken from the table (a queue loses nothing); several workers
        # share that budget (see `sample_workers`).
        if self._num_workers == 1:
            stream = open_stream(self._max_samples)
        else:
            stream = sample_workers.ParallelStreams(open_stream, self._num_workers, self._max_samples,
                                                     request_size=request, poll_ms=_POLL_MS)
        remaining = self._max_samples
        packer = self._packer() if packed and fully_defined and getattr(transport, "shares_items", False) else None
        pool = buffer_pool.BufferPool()
        pending: list = []
        pending_count = 0
        try:
            while remaining is None or remaining > 0:
                try:
                    batch = stream.next_batch(poll_ms=_POLL_MS)
                except errors.DeadlineExceededError:
                    break  # a rate-limiter timeout ends the iteration, as in Reverb
                if not batch:  # still blocked: let tf.data check for cancellation
                    yield self._empty_flat()
                    continue
                count = stacking.count_samples(batch)
                if remaining is not None:
                    if count > remaining:
                        batch, _ = stacking.split_samples(batch, remaining)
                        count = remaining
                    remaining -= count
                if batch_size is not None:
                    pending.extend(batch)
                    pending_count += count
                    while pending_count >= batch_size:
                        head, pending = stacking.split_samples(pending, batch_size)
                        pending_count -= batch_size
                        yield self._packed_or_stacked(head, packer, pool, table)
                elif fully_defined:
                    yield self._packed_or_stacked(batch, packer, pool, table)
                else:  # variable shapes cannot be stacked: one sample per element
                    for sampled in batch:
                        self._check_item(sampled.item, table)
                        cols = sampled.item.column_arrays()
                        self._check_columns(cols, table)
                        yield [*_info_arrays([sampled]), *(c[np.newaxis] for c in cols)]
            if pending and not drop_remainder:
                yield self._packed_or_stacked(pending, packer, None, table)
        finally:
            stream.close()


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


def _runs(samples: list) -> list:
    """`samples` as runs to stack: each `StackedSamples` alone, consecutive `SampledItem`s as one list."""
    runs: list = []
    start = 0
    for i, sample in enumerate(samples):
        if type(sample) is stacking.StackedSamples:
            if i > start:
                runs.append(samples[start:i])
            runs.append(sample)
            start = i + 1
    if start < len(samples):
        runs.append(samples if start == 0 else samples[start:])
    return runs
