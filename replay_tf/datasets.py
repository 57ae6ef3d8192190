"""Dataset helpers over `TrajectoryDataset`: acme's `make_reverb_dataset` and ftw's fifo / rnn-sequence variants.

* `make_reverb_dataset` is acme's current helper: the data shapes come from the table signatures, `table` is a
  name or a `{name: weight}` mix, several `TrajectoryDataset`s are interleaved for throughput (in no fixed
  order), then `postprocess`, `batch` and `prefetch`.
* `make_reverb_fifo_sampler_dataset` and `make_reverb_rnn_sequence_fifo_sampler_dataset` are the 2020-era
  helpers as `ftw.datasets.reverb` ships them: one sampling worker (so a FIFO/queue table is read in insertion
  order), shapes either from the table signature or from an acme-style environment spec (`EnvironmentSpec`,
  `extra_spec`, `transition_adder`, `sequence_length`, ...), deterministic interleaving by default.

Reverb's old `ReplayDataset(emit_timesteps=True)` streamed an item one timestep at a time; here the item is
sampled as one `[T, ...]` trajectory and split into its T timesteps in the graph (each timestep carries the
item's `SampleInfo`). With `sequence_length` set (fifo helper), an item is one element of `[T, ...]` tensors.

>>> import numpy as np, tensorflow as tf, replay_tf as reverb
>>> server = reverb.Server([reverb.Table.queue('queue', 10, signature=tf.TensorSpec([1], tf.int64))])
>>> client = reverb.Client(server.address)
>>> for i in range(4):
...     client.insert(np.int64(i), priorities={'queue': 1.0})
>>> iterator = iter(make_reverb_fifo_sampler_dataset(client, table='queue', batch_size=2))
>>> [next(iterator).data.numpy().tolist() for _ in range(2)]
[[0, 1], [2, 3]]
>>> server.stop()  # before the iterator goes: its sampler waits on the empty queue until the server stops
"""
from __future__ import annotations

import collections
import os
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
import tree

from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo
from replay_tf.trajectory_dataset import TrajectoryDataset
from rlds_tf.nests import format_path

#: acme's `adders.DEFAULT_PRIORITY_TABLE`.
DEFAULT_PRIORITY_TABLE = "priority_table"


class EnvironmentSpec(NamedTuple):
    """acme's `specs.EnvironmentSpec`: nests of specs (anything with `.shape` and `.dtype`)."""
    observations: Any
    actions: Any
    rewards: Any
    discounts: Any


class Step(NamedTuple):
    """acme's `adders.reverb.Step` (what the 2020-era `SequenceAdder`/`EpisodeAdder` wrote per timestep)."""
    observation: Any
    action: Any
    reward: Any
    discount: Any
    start_of_episode: Any
    extras: Any = ()


class DeprecatedStep(NamedTuple):
    """acme's `adders.reverb.deprecated.base.Step` (no `start_of_episode`)."""
    observation: Any
    action: Any
    reward: Any
    discount: Any
    extras: Any = ()


def make_environment_spec(environment: Any) -> EnvironmentSpec:
    """acme's `specs.make_environment_spec`: the specs of a `dm_env.Environment`."""
    return EnvironmentSpec(observations=environment.observation_spec(), actions=environment.action_spec(),
                           rewards=environment.reward_spec(), discounts=environment.discount_spec())


def _server_address(client: Any) -> str:
    """The address of a `Client` (or anything with `server_address` / `_server_address`) or of a string."""
    if isinstance(client, str):
        return client
    for attribute in ("server_address", "_server_address"):
        address = getattr(client, attribute, None)
        if isinstance(address, str):
            return address
    raise TypeError(f"client must be a replay_tf.Client or a 'host:port' string, got {client!r}")


def _check_positive(name: str, value: Optional[int]) -> None:
    if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} ({value!r}) must be None or a positive integer")


def _table_weights(table: Union[str, Mapping[str, float]]) -> "collections.OrderedDict[str, float]":
    """`{name: normalized weight}`: a single name weighs 1; weights <= 0 are dropped, the rest sum to 1."""
    if isinstance(table, str):
        return collections.OrderedDict([(table, 1.0)])
    if not isinstance(table, Mapping):
        raise TypeError(f"table must be a table name or a {{name: weight}} mapping, got {table!r}")
    weights = collections.OrderedDict((name, float(weight)) for name, weight in table.items() if weight > 0.0)
    if not weights:
        raise ValueError(f"No positive weights in input tables {dict(table)}: give at least one table a weight > 0")
    total = sum(weights.values())
    return collections.OrderedDict((name, weight / total) for name, weight in weights.items())


def make_reverb_dataset(server_address: Union[str, Sequence[str]], batch_size: Optional[int] = None,
                        prefetch_size: Optional[int] = None,
                        table: Union[str, Mapping[str, float]] = DEFAULT_PRIORITY_TABLE,
                        num_parallel_calls: Optional[int] = 12,
                        max_in_flight_samples_per_worker: Optional[int] = None,
                        postprocess: Optional[Callable[[ReplaySample], Any]] = None,
                        # Deprecated arguments, kept (as acme keeps them) so old call sites fail clearly.
                        environment_spec: Any = None, extra_spec: Any = None, transition_adder: bool = False,
                        convert_zero_size_to_none: bool = False, using_deprecated_adder: bool = False,
                        sequence_length: Optional[int] = None) -> tf.data.Dataset:
    """acme's `make_reverb_dataset`: a dataset streaming `ReplaySample`s of one table or a weighted mix.

    Args:
      server_address: `host:port` of the replay server, or a list of them (an extension of acme's helper):
        each server gets the whole pipeline described below (same tables, weights and parallelism) and
        every element (every batch, when batched) comes from a server drawn uniformly at random.
      batch_size: If set, elements are batched (remainder dropped) after `postprocess`.
      prefetch_size: If set, batches to prefetch.
      table: A table name, or `{name: weight}`: each element comes from a table drawn with the normalized
        weights (weights <= 0 drop the table).
      num_parallel_calls: How many `TrajectoryDataset` pipelines to interleave (`tf.data.AUTOTUNE`: one per
        CPU); None builds a single pipeline. Interleaving is not deterministic.
      max_in_flight_samples_per_worker: Samples requested per call, split over the tables by weight
        (at least 1 each); default `2 * batch_size`, or 100 without a batch size.
      postprocess: Optional function applied to every `ReplaySample` before batching.
      environment_spec, extra_spec: No longer supported (the table signature gives the shapes): ValueError.
      transition_adder, convert_zero_size_to_none, using_deprecated_adder, sequence_length: ignored, as in acme.

    Returns:
      A `tf.data.Dataset` of `ReplaySample`s (or of what `postprocess` returns), batched when `batch_size`.

    >>> import numpy as np, tensorflow as tf, replay_tf as reverb
    >>> server = reverb.Server([reverb.Table('priority_table', reverb.selectors.Uniform(),
    ...     reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1), signature=tf.TensorSpec([1], tf.int64))])
    >>> reverb.Client(server.address).insert(np.int64(7), priorities={'priority_table': 1.0})
    >>> iterator = iter(make_reverb_dataset(server.address, batch_size=3, num_parallel_calls=None))
    >>> next(iterator).data.numpy().tolist()
    [[7], [7], [7]]
    >>> server.stop()
    """
    if environment_spec is not None or extra_spec is not None:
        raise ValueError("make_reverb_dataset no longer takes environment_spec or extra_spec: the shapes come from "
                         "the signature of the table (pass signature=... to replay_tf.Table), or use "
                         "make_reverb_fifo_sampler_dataset, which still builds them from an environment spec")
    del transition_adder, convert_zero_size_to_none, using_deprecated_adder, sequence_length
    _check_positive("batch_size", batch_size)
    _check_positive("prefetch_size", prefetch_size)
    _check_positive("max_in_flight_samples_per_worker", max_in_flight_samples_per_worker)
    if num_parallel_calls is not None and num_parallel_calls != tf.data.AUTOTUNE:
        _check_positive("num_parallel_calls", num_parallel_calls)
    if max_in_flight_samples_per_worker is None:
        # Reverb's default, from the TFClient.dataset() of earlier Reverb releases.
        max_in_flight_samples_per_worker = 2 * batch_size if batch_size else 100
    weights = _table_weights(table)
    if isinstance(server_address, str):
        addresses = [server_address]
    else:
        addresses = list(server_address)
        if not addresses or not all(isinstance(a, str) for a in addresses):
            raise ValueError(f"server_address ({server_address!r}) must be a 'host:port' string or a non-empty "
                             f"list of them")
    per_server = [_server_dataset(address, batch_size, num_parallel_calls, max_in_flight_samples_per_worker,
                                  postprocess, weights) for address in addresses]
    if len(per_server) > 1:
        dataset = tf.data.Dataset.sample_from_datasets(per_server, weights=[1.0 / len(per_server)] * len(per_server))
    else:
        dataset = per_server[0]
    if prefetch_size:
        dataset = dataset.prefetch(prefetch_size)
    return dataset


def _server_dataset(server_address: str, batch_size: Optional[int], num_parallel_calls: Optional[int],
                    max_in_flight_samples_per_worker: int, postprocess: Optional[Callable],
                    weights: Mapping[str, float]) -> tf.data.Dataset:
    """acme's pipeline for one server: per-table `TrajectoryDataset`s mixed by weight, interleaved."""

    # Plain Python building datasets: AutoGraph must not convert it (nor, through it, the gRPC client).
    @tf.autograph.experimental.do_not_convert
    def make_dataset(unused_index: tf.Tensor) -> tf.data.Dataset:
        datasets = [TrajectoryDataset.from_table_signature(
            server_address=server_address, table=name,
            max_in_flight_samples_per_worker=max(1, int(max_in_flight_samples_per_worker * weight)))
            for name, weight in weights.items()]
        if len(datasets) > 1:
            dataset = tf.data.Dataset.sample_from_datasets(datasets, weights=list(weights.values()))
        else:
            dataset = datasets[0]
        if postprocess is not None:
            dataset = dataset.map(postprocess)
        if batch_size:
            dataset = dataset.batch(batch_size, drop_remainder=True)
        return dataset

    if num_parallel_calls is not None:
        num_datasets = (os.cpu_count() or 1) if num_parallel_calls == tf.data.AUTOTUNE else num_parallel_calls
        dataset = tf.data.Dataset.range(num_datasets).interleave(
            map_func=make_dataset, cycle_length=num_datasets, num_parallel_calls=num_datasets,
            deterministic=False)
    else:
        dataset = make_dataset(tf.constant(0))
    return dataset


def spec_to_shapes_and_dtypes(transition_adder: bool, environment_spec: Any, extra_spec: Any = None,
                              sequence_length: Optional[int] = None, convert_zero_size_to_none: bool = False,
                              using_deprecated_adder: bool = False) -> tuple:
    """`(shapes, dtypes)` of what an acme adder wrote per timestep, from the environment spec (acme 2020).

    `transition_adder`: `(observation, action, reward, discount, next_observation[, extras])`; otherwise a
    `Step` (`DeprecatedStep` with `using_deprecated_adder`). `sequence_length` prefixes every shape with
    `[sequence_length]`; `convert_zero_size_to_none` turns 0-sized dimensions into None.

    Difference from acme: acme's `convert_zero_size_to_none` dropped the `sequence_length` prefix (its second
    shape function replaced the first); here both apply.
    """
    if environment_spec is None:
        raise ValueError("environment_spec is required to build shapes and dtypes from specs")
    environment_spec = EnvironmentSpec(*environment_spec)
    if transition_adder:
        adder_spec = tuple(environment_spec) + (environment_spec.observations,)
        if extra_spec:
            adder_spec += (extra_spec,)
    elif using_deprecated_adder:
        adder_spec = DeprecatedStep(observation=environment_spec.observations, action=environment_spec.actions,
                                    reward=environment_spec.rewards, discount=environment_spec.discounts,
                                    extras=extra_spec or ())
    else:
        adder_spec = Step(observation=environment_spec.observations, action=environment_spec.actions,
                          reward=environment_spec.rewards, discount=environment_spec.discounts,
                          start_of_episode=tf.TensorSpec([], tf.bool), extras=extra_spec or ())

    def shape_of(spec) -> tf.TensorShape:
        dims = list(tf.TensorShape(spec.shape).as_list())
        if convert_zero_size_to_none:
            dims = [d if d else None for d in dims]
        return tf.TensorShape([sequence_length, *dims] if sequence_length else dims)

    shapes = tree.map_structure(shape_of, adder_spec)
    dtypes = tree.map_structure(lambda spec: tf.as_dtype(spec.dtype), adder_spec)
    return shapes, dtypes


def _split_into_timesteps(sample: ReplaySample) -> tf.data.Dataset:
    """The T timesteps of one `[T, ...]` sample, each with the sample's info (Reverb's `emit_timesteps`)."""
    length = tf.shape(tree.flatten(sample.data)[0])[0]
    info = SampleInfo(*[tf.fill([length], field) for field in sample.info])
    return tf.data.Dataset.from_tensor_slices(ReplaySample(info=info, data=sample.data))


def _legacy_replay_dataset(server_address: str, table: str, shapes: Any, dtypes: Any, max_in_flight: int,
                           sequence_length: Optional[int], emit_timesteps: bool) -> tf.data.Dataset:
    """Reverb's old `ReplayDataset` (one worker) on top of `TrajectoryDataset`.

    `shapes`/`dtypes` (None: from the table signature) describe one emitted element: a timestep when
    `emit_timesteps`, else a `[sequence_length, ...]` sequence.
    """
    if shapes is None:
        dataset = TrajectoryDataset.from_table_signature(
            server_address=server_address, table=table, max_in_flight_samples_per_worker=max_in_flight,
            num_workers_per_iterator=1)
        if not emit_timesteps and sequence_length:
            for path, spec in tree.flatten_with_path(dataset.element_spec.data):
                if spec.shape.rank is None or spec.shape.rank == 0 or spec.shape[0] not in (None, sequence_length):
                    where = format_path(path)
                    raise ValueError(f"sequence_length ({sequence_length}) does not match the signature of table "
                                     f"{table!r} at {where!r} (shape {spec.shape}): items must be "
                                     f"[{sequence_length}, ...] trajectories")
    else:
        # The item is a trajectory of such elements: one more leading (time) dimension, unless whole sequences.
        item_shapes = shapes if not emit_timesteps else tree.map_structure(
            lambda s: tf.TensorShape([None]).concatenate(s), shapes)
        dataset = TrajectoryDataset(server_address=server_address, table=table, dtypes=dtypes, shapes=item_shapes,
                                    max_in_flight_samples_per_worker=max_in_flight, num_workers_per_iterator=1)
    if emit_timesteps:
        dataset = dataset.flat_map(_split_into_timesteps)
    return dataset


def _fifo_dataset(client: Any, environment_spec: Any, batch_size: Optional[int], prefetch_size: Optional[int],
                  sequence_length: Optional[int], extra_spec: Any, transition_adder: bool, table: str,
                  convert_zero_size_to_none: bool, num_parallel_calls: int, using_deprecated_adder: bool,
                  deterministic: bool, rnn: bool) -> tf.data.Dataset:
    server_address = _server_address(client)
    _check_positive("batch_size", batch_size)
    _check_positive("prefetch_size", prefetch_size)
    _check_positive("sequence_length", sequence_length)
    if num_parallel_calls != tf.data.AUTOTUNE:
        _check_positive("num_parallel_calls", num_parallel_calls)
    if not isinstance(table, str):
        raise TypeError(f"table must be a table name, got {table!r}")
    # Reverb's default, from the TFClient.dataset() of earlier Reverb releases.
    max_in_flight = 2 * batch_size if batch_size else 100
    shapes = dtypes = None
    if environment_spec is not None:
        shapes, dtypes = spec_to_shapes_and_dtypes(
            transition_adder, environment_spec, extra_spec=extra_spec, sequence_length=sequence_length,
            convert_zero_size_to_none=convert_zero_size_to_none, using_deprecated_adder=using_deprecated_adder)
        extras = shapes[-1]
        if rnn and sequence_length and isinstance(extras, Mapping) and "core_state" in extras:
            # Sequences keep only their first recurrent state: core_state is [1, ...], not [T, ...].
            shapes = shapes._replace(extras=dict(extras)) if hasattr(shapes, "_replace") else (
                shapes[:-1] + (dict(extras),))
            shapes[-1]["core_state"] = tree.map_structure(
                lambda spec: tf.TensorShape([1, *tf.TensorShape(spec.shape).as_list()]), extra_spec["core_state"])
    if rnn:
        # Every emitted element is one stored timestep that holds a whole sequence.
        emit_timesteps, item_sequence_length = True, None
    else:
        emit_timesteps, item_sequence_length = sequence_length is None, sequence_length

    def make_dataset(unused_index: tf.Tensor) -> tf.data.Dataset:
        dataset = _legacy_replay_dataset(server_address, table, shapes, dtypes, max_in_flight,
                                         item_sequence_length, emit_timesteps)
        if batch_size:
            dataset = dataset.batch(batch_size, drop_remainder=True)
        return dataset

    # One dataset: a single sampling worker keeps a queue's order.
    dataset = tf.data.Dataset.range(1).interleave(
        map_func=make_dataset, cycle_length=num_parallel_calls, num_parallel_calls=num_parallel_calls,
        deterministic=deterministic)
    if prefetch_size:
        dataset = dataset.prefetch(prefetch_size)
    return dataset


def make_reverb_fifo_sampler_dataset(client: Any, environment_spec: Any = None, batch_size: Optional[int] = None,
                                     prefetch_size: Optional[int] = None, sequence_length: Optional[int] = None,
                                     extra_spec: Any = None, transition_adder: bool = False,
                                     table: str = DEFAULT_PRIORITY_TABLE, convert_zero_size_to_none: bool = False,
                                     num_parallel_calls: int = 1, using_deprecated_adder: bool = False,
                                     deterministic: bool = True) -> tf.data.Dataset:
    """ftw's `make_reverb_fifo_sampler_dataset`: one sampling worker, so a FIFO/queue table is read in order.

    Args:
      client: A `replay_tf.Client` (or a `host:port` string).
      environment_spec: Optional `EnvironmentSpec`; with it the element shapes and dtypes come from the specs
        (see `spec_to_shapes_and_dtypes`), without it from the table signature.
      batch_size: If set, consecutive elements are batched (remainder dropped); also sets the samples per
        request to `2 * batch_size` (100 without).
      prefetch_size: If set, batches to prefetch.
      sequence_length: None: every timestep of an item is one element. Set: every item is one element of
        `[sequence_length, ...]` tensors.
      extra_spec, transition_adder, convert_zero_size_to_none, using_deprecated_adder: shape the spec-based
        element as the matching acme adder wrote it.
      table: The table to sample from (`'priority_table'` by default).
      num_parallel_calls: interleave threads (there is one dataset, so one suffices).
      deterministic: deterministic interleaving (True keeps the order).

    Returns:
      A `tf.data.Dataset` of `ReplaySample`s.
    """
    return _fifo_dataset(client, environment_spec, batch_size, prefetch_size, sequence_length, extra_spec,
                         transition_adder, table, convert_zero_size_to_none, num_parallel_calls,
                         using_deprecated_adder, deterministic, rnn=False)


def make_reverb_rnn_sequence_fifo_sampler_dataset(
        client: Any, environment_spec: Any = None, batch_size: Optional[int] = None,
        prefetch_size: Optional[int] = None, sequence_length: Optional[int] = None, extra_spec: Any = None,
        transition_adder: bool = False, table: str = DEFAULT_PRIORITY_TABLE,
        convert_zero_size_to_none: bool = False, num_parallel_calls: int = 1, using_deprecated_adder: bool = False,
        deterministic: bool = True) -> tf.data.Dataset:
    """ftw's `make_reverb_rnn_sequence_fifo_sampler_dataset`: sequences that keep only the first core state.

    For recurrent learners trained on unrolls of `sequence_length` steps that only need the recurrent state at
    the start of the unroll. Each stored timestep holds a whole sequence (what ftw's actors append: one step
    per unroll); with `environment_spec`, every field is `[sequence_length, ...]` except
    `extra_spec['core_state']`, which is `[1, ...]`. Every stored timestep is one element. Arguments as
    `make_reverb_fifo_sampler_dataset`.
    """
    return _fifo_dataset(client, environment_spec, batch_size, prefetch_size, sequence_length, extra_spec,
                         transition_adder, table, convert_zero_size_to_none, num_parallel_calls,
                         using_deprecated_adder, deterministic, rnn=True)


__all__ = [
    "DEFAULT_PRIORITY_TABLE",
    "DeprecatedStep",
    "EnvironmentSpec",
    "Step",
    "make_environment_spec",
    "make_reverb_dataset",
    "make_reverb_fifo_sampler_dataset",
    "make_reverb_rnn_sequence_fifo_sampler_dataset",
    "spec_to_shapes_and_dtypes",
]
