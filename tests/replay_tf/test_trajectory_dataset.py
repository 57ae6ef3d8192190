"""TrajectoryDataset: element specs, values, batching, timeouts and bad input, against dm-reverb."""
import numpy as np
import pytest
import tensorflow as tf

import reverb_testlib
from dataset_testlib import dataset_graph
from dataset_testlib import graph_nodes
import replay_tf as reverb

_PRELUDE = """
def setup(signature=None, table=None):
    table = table or reverb.Table('t', reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100,
                                  reverb.rate_limiters.MinSize(1), max_times_sampled=1, signature=signature)
    server = reverb.Server([table])
    return server, reverb.Client(f'localhost:{server.port}'), f'localhost:{server.port}'

def spec_str(spec):
    import tree
    return [[str(s.dtype.name), s.shape.as_list() if s.shape.rank is not None else None]
            for s in tree.flatten(spec)]

def fill(client, n, length=3):
    with client.trajectory_writer(num_keep_alive_refs=length) as writer:
        for i in range(n + length - 1):
            writer.append({'obs': np.full([2, 2], i, np.uint8), 'act': np.float32(i), 'n': (np.int64(i), np.bool_(i % 2))})
            if i + 1 >= length:
                h = writer.history
                writer.create_item('t', 1.0, {'obs': h['obs'][-length:], 'act': h['act'][-1],
                                              'n': [h['n'][0][-length:], h['n'][1][-2:]]})
"""

_SIGNATURE = ("{'obs': tf.TensorSpec([3, 2, 2], tf.uint8), 'act': tf.TensorSpec([], tf.float32), "
              "'n': [tf.TensorSpec([3], tf.int64), tf.TensorSpec([2], tf.bool)]}")

SCENARIOS = {
    "from_signature": _PRELUDE + f"""
server, client, address = setup({_SIGNATURE})
fill(client, 6)
ds = reverb.TrajectoryDataset.from_table_signature(address, 't', max_in_flight_samples_per_worker=4,
                                                   rate_limiter_timeout_ms=200)
emit('spec', spec_str(ds.element_spec))
emit('type', [type(ds.element_spec).__name__, type(ds.element_spec.info).__name__, type(ds.element_spec.data['n']).__name__])
samples = list(ds)
emit('count', len(samples))
emit('values', [[s.data['obs'].numpy().tolist(), float(s.data['act']), s.data['n'][0].numpy().tolist(),
                 s.data['n'][1].numpy().tolist(), float(s.info.probability), int(s.info.table_size),
                 float(s.info.priority), int(s.info.times_sampled)] for s in samples])
emit('info_dtypes', [s.dtype.name for s in samples[0].info])
""",
    "explicit_dtypes_batched": _PRELUDE + """
server, client, address = setup()
fill(client, 5)
ds = reverb.TrajectoryDataset(address, 't', dtypes={'obs': tf.uint8, 'act': tf.float32, 'n': [tf.int64, tf.bool]},
                              shapes={'obs': tf.TensorShape([3, 2, 2]), 'act': tf.TensorShape([]),
                                      'n': [tf.TensorShape([3]), tf.TensorShape([None])]},
                              max_in_flight_samples_per_worker=2, rate_limiter_timeout_ms=100)
batched = ds.batch(2)
emit('spec', spec_str(batched.element_spec))
emit('shapes', [[list(x.shape) for x in tf.nest.flatten(b)] for b in batched])
""",
    "max_samples": _PRELUDE + """
server, client, address = setup()
fill(client, 5)
ds = reverb.TrajectoryDataset(address, 't', dtypes={'obs': tf.uint8, 'act': tf.float32, 'n': (tf.int64, tf.bool)},
                              shapes={'obs': tf.TensorShape([3, 2, 2]), 'act': tf.TensorShape([]),
                                      'n': (tf.TensorShape([3]), tf.TensorShape([2]))},
                              max_in_flight_samples_per_worker=3, max_samples=2, rate_limiter_timeout_ms=100)
emit('count', len(list(ds)))
""",
    "bad_input": _PRELUDE + f"""
server, client, address = setup({_SIGNATURE})
fill(client, 2)
for name, kwargs in [('in_flight', dict(max_in_flight_samples_per_worker=0)),
                     ('workers', dict(max_in_flight_samples_per_worker=1, num_workers_per_iterator=0)),
                     ('per_stream', dict(max_in_flight_samples_per_worker=1, max_samples_per_stream=0)),
                     ('timeout', dict(max_in_flight_samples_per_worker=1, rate_limiter_timeout_ms=-2)),
                     ('max_samples', dict(max_in_flight_samples_per_worker=1, max_samples=0))]:
    try:
        reverb.TrajectoryDataset.from_table_signature(address, 't', **kwargs)
    except ValueError as e:
        emit(name, str(e))
for name, table in [('unknown', 'nope')]:
    try:
        reverb.TrajectoryDataset.from_table_signature(address, table, 1)
    except ValueError as e:
        emit(name, str(e).replace(address, 'ADDRESS'))
try:
    ds = reverb.TrajectoryDataset(address, 't', dtypes={{'obs': tf.float32, 'act': tf.float32, 'n': (tf.int64, tf.bool)}},
                                  shapes={{'obs': tf.TensorShape([3, 2, 2]), 'act': tf.TensorShape([]), 'n': (tf.TensorShape([3]), tf.TensorShape([2]))}},
                                  max_in_flight_samples_per_worker=1, rate_limiter_timeout_ms=100)
    list(ds)
    emit('wrong_dtype', 'ok')
except Exception as e:
    emit('wrong_dtype', 'error')
try:
    ds = reverb.TrajectoryDataset(address, 't', dtypes={{'obs': tf.uint8, 'act': tf.float32, 'n': (tf.int64, tf.bool)}},
                                  shapes={{'obs': tf.TensorShape([4, 2, 2]), 'act': tf.TensorShape([]), 'n': (tf.TensorShape([3]), tf.TensorShape([2]))}},
                                  max_in_flight_samples_per_worker=1, rate_limiter_timeout_ms=100)
    list(ds)
    emit('wrong_shape', 'ok')
except Exception as e:
    emit('wrong_shape', 'error')
""",
    "no_signature": _PRELUDE + """
server, client, address = setup()
try:
    reverb.TrajectoryDataset.from_table_signature(address, 't', 1)
except ValueError as e:
    emit('error', str(e).replace(address, 'ADDRESS'))
""",
}


peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios_run_without_unexpected_errors(local_results):
    assert set(k for k in local_results if k.endswith(".error")) == {"no_signature.error"}


def test_wrong_dtype_error_names_the_column():
    server = reverb.Server([reverb.Table.queue("q", 10, signature={"a": tf.TensorSpec([2], tf.float32)})])
    with pytest.raises(ValueError, match=r"Requested incompatible tensor at 'a'.*requested dtype=int32"):
        reverb.TrajectoryDataset(f"localhost:{server.port}", "q", dtypes={"a": tf.int32}, shapes={"a": tf.TensorShape([2])},
                                 max_in_flight_samples_per_worker=1)
    server.stop()


def test_dataset_waits_for_data_inserted_from_another_thread():
    import threading
    server = reverb.Server([reverb.Table.queue("q", 10)])
    client = reverb.Client(f"localhost:{server.port}")
    ds = reverb.TrajectoryDataset(f"localhost:{server.port}", "q", dtypes=(tf.int32,), shapes=(tf.TensorShape([1]),),
                                  max_in_flight_samples_per_worker=4, rate_limiter_timeout_ms=5000)
    threading.Timer(0.2, lambda: [client.insert(np.int32(i), {"q": 1.0}) for i in range(3)]).start()
    values = [int(s.data[0][0]) for s in ds.take(3)]
    assert values == [0, 1, 2]
    server.stop()


def test_samples_are_split_from_their_batches_without_an_extra_map():
    # `Dataset.unbatch` maps every batch through a function that re-encodes sparse and ragged components;
    # the samples of dense batches are split by the unbatch kernel alone (one function call less per batch).
    server = reverb.Server([reverb.Table.queue("q", 10)])
    client = reverb.Client(f"localhost:{server.port}")
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "q", dtypes={"x": tf.int64},
                                       shapes={"x": tf.TensorShape([1, 2])}, max_in_flight_samples_per_worker=2,
                                       rate_limiter_timeout_ms=50)
    nodes = graph_nodes(dataset_graph(dataset))
    # (the read, and the end of an iterator's batches: one call per iterator)
    assert [n.op for n in nodes if n.op in ("MapDataset", "ParallelMapDatasetV2")] == ["MapDataset"] * 2
    assert [n.op for n in nodes if n.op == "UnbatchDataset"] == ["UnbatchDataset"]
    for i in range(3):
        client.insert({"x": np.array([i, -i], np.int64)}, priorities={"q": 1.0})
    assert [s.data["x"].numpy().tolist() for s in dataset] == [[[0, 0]], [[1, -1]], [[2, -2]]]
    server.stop()


@pytest.mark.parametrize("batch_size, drop_remainder", [(3, False), (3, True), (8, False), (1, False)])
def test_batch_matches_generic_batching(batch_size, drop_remainder):
    server = reverb.Server([reverb.Table.queue("q", 100)])
    client = reverb.Client(f"localhost:{server.port}")
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "q", dtypes={"x": tf.int64, "y": tf.float32},
                                       shapes={"x": tf.TensorShape([1]), "y": tf.TensorShape([1, 2])},
                                       max_in_flight_samples_per_worker=2, rate_limiter_timeout_ms=50)
    results = []
    for batched in (dataset.batch(batch_size, drop_remainder=drop_remainder),
                    tf.data.Dataset.batch(dataset, batch_size, drop_remainder=drop_remainder)):
        for i in range(7):
            client.insert({"x": np.int64(i), "y": np.full([2], i, np.float32)}, priorities={"q": 1.0})
        results.append([(b.data["x"].numpy().tolist(), b.data["y"].numpy().tolist(),
                         b.info.times_sampled.numpy().tolist(), b.info.probability.numpy().dtype)
                        for b in batched])
    assert results[0] == results[1]
    assert dataset.batch(batch_size, drop_remainder=drop_remainder).element_spec == tf.data.Dataset.batch(
        dataset, batch_size, drop_remainder=drop_remainder).element_spec
    server.stop()


def test_batch_gathers_items_spanning_chunks_and_squeezed_columns():
    server = reverb.Server([reverb.Table.queue("q", 100)])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        writer.configure(("obs",), num_keep_alive_refs=3, max_chunk_length=2)  # items span two chunks
        for i in range(9):
            writer.append({"obs": np.full([2], i, np.int32), "act": np.float32(i)})
            if i >= 2:
                writer.create_item("q", 1.0, {"obs": writer.history["obs"][-3:], "act": writer.history["act"][-1]})
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "q", dtypes={"obs": tf.int32, "act": tf.float32},
                                       shapes={"obs": tf.TensorShape([3, 2]), "act": tf.TensorShape([])},
                                       max_in_flight_samples_per_worker=4, rate_limiter_timeout_ms=50)
    [batch] = list(dataset.batch(10))
    expected_obs = [[[i - 2] * 2, [i - 1] * 2, [i] * 2] for i in range(2, 9)]
    assert batch.data["obs"].numpy().tolist() == expected_obs
    assert batch.data["act"].numpy().tolist() == [float(i) for i in range(2, 9)]
    server.stop()


def test_large_batches_held_by_the_caller_keep_their_values():
    # Batches of >= 1 MiB per column come from reused buffers (buffer_pool.BufferPool): a batch the
    # caller still holds must never be refilled with later samples, also when only a view of it is held.
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))])
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(20):  # item i (a length-1 trajectory) is all i's, so every sample's data follows from its key
        client.insert(np.full([64, 64, 4], i, np.uint8), {"t": 1.0})
    value_of = {item.key: i for i, item in enumerate(server.table("t").items_snapshot())}  # insertion order
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "t", dtypes=tf.uint8,
                                       shapes=tf.TensorShape([1, 64, 64, 4]), max_in_flight_samples_per_worker=128)
    held, views = [], []
    for batch in dataset.batch(128).take(12):  # 2 MiB per batch
        held.append(batch)
        views.append(batch.data.numpy()[::2])  # a view into the numpy copy of one batch: stays valid too
    for batch, view in zip(held, views):
        expected = np.array([value_of[key] for key in batch.info.key.numpy().tolist()], np.uint8)
        assert (batch.data.numpy() == expected[:, None, None, None, None]).all()
        assert (view == expected[::2, None, None, None, None]).all()
    server.stop()


def _record_chunk_cache(monkeypatch) -> list:
    """Makes clients sample over gRPC and records (entries, bytes) of the chunk cache after every chunk."""
    from replay_tf.grpc.client import sample_stream
    from replay_tf.grpc.client import client_transport
    from replay_tf.transport import base as transport_lib
    sizes = []
    original = sample_stream.SampleStream._chunk

    def recording_chunk(proto, cache):
        entry = original(proto, cache)
        sizes.append((len(cache), cache.nbytes))
        return entry
    monkeypatch.setattr(sample_stream.SampleStream, "_chunk", staticmethod(recording_chunk))
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    return sizes


def test_remote_chunk_cache_is_bounded_in_bytes_and_samples_stay_exact(monkeypatch):
    from replay_tf.grpc import common
    entry_bytes = 2 * 16 * 16 * 4 + common.CHUNK_CACHE_ENTRY_BYTES  # a two-row chunk and its objects
    monkeypatch.setattr(common, "CHUNK_CACHE_BYTES", 3 * entry_bytes)  # room for 3 of them
    sizes = _record_chunk_cache(monkeypatch)
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:  # 1 KiB steps: chunks of 2 rows
        for i in range(40):
            writer.append(np.full([16, 16, 4], i, np.uint8))
            if i % 2:
                writer.create_item("t", 1.0, writer.history[-2:])
    first_step = {item.key: int(item.column_arrays()[0][0, 0, 0, 0])
                  for item in server.table("t").items_snapshot()}
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "t", dtypes=tf.uint8,
                                       shapes=tf.TensorShape([2, 16, 16, 4]), max_in_flight_samples_per_worker=8,
                                       stacked_samples=False)  # (the cache serves entries only)
    for batch in dataset.batch(8).take(10):
        first = np.array([first_step[key] for key in batch.info.key.numpy().tolist()], np.uint8)
        expected = np.stack([first, first + 1], axis=1)
        assert (batch.data.numpy() == expected[:, :, None, None, None]).all()
    assert sizes and max(n for n, _ in sizes) == 3 and max(b for _, b in sizes) == 3 * entry_bytes
    server.stop()


def test_remote_one_row_chunks_are_read_from_each_sample_not_cached(monkeypatch):
    sizes = _record_chunk_cache(monkeypatch)
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))])
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(20):
        client.insert(np.full([16, 16, 4], i, np.uint8), {"t": 1.0})
    value_of = {item.key: i for i, item in enumerate(server.table("t").items_snapshot())}
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "t", dtypes=tf.uint8,
                                       shapes=tf.TensorShape([1, 16, 16, 4]), max_in_flight_samples_per_worker=8,
                                       stacked_samples=False)  # (the cache serves entries only)
    for batch in dataset.batch(8).take(10):
        expected = np.array([value_of[key] for key in batch.info.key.numpy().tolist()], np.uint8)
        assert (batch.data.numpy() == expected[:, None, None, None, None]).all()
    assert len(sizes) >= 80 and max(sizes) == (0, 0)  # every sample's chunk was read, none kept
    server.stop()


def _wait_until(condition, timeout_s=10.0):
    import time
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


@pytest.fixture(params=["in_process", "grpc"])
def queue_server(request, monkeypatch):
    """A server with a 10-item queue of int32 [1] items, reached in-process or over gRPC."""
    from replay_tf.grpc.client import client_transport
    from replay_tf.transport import base as transport_lib
    server = reverb.Server([reverb.Table.queue("q", 10, signature=tf.TensorSpec([1], tf.int32))])
    if request.param == "grpc":
        monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    yield server
    server.stop()


@pytest.mark.parametrize("batched", [False, True])
def test_dropping_an_iterator_blocked_on_the_rate_limiter_cancels_its_sample(queue_server, batched):
    # Regression: `del it` used to block forever in Table._wait (the prefetch thread never returned).
    import threading
    address = f"localhost:{queue_server.port}"
    client = reverb.Client(address)
    for i in range(2):
        client.insert(np.int32(i), {"q": 1.0})
    dataset = reverb.TrajectoryDataset.from_table_signature(address, "q", 1)
    if batched:
        dataset = dataset.batch(1, drop_remainder=True)
    holder = [iter(dataset.prefetch(2))]
    assert [np.asarray(next(holder[0]).data).ravel().tolist() for _ in range(2)] == [[0], [1]]
    dropper = threading.Thread(target=holder.clear, daemon=True)  # drops the last reference
    dropper.start()
    dropper.join(10)
    assert not dropper.is_alive(), "dropping the iterator hung"

    table = queue_server.table("q")
    _wait_until(lambda: table._num_waiting == 0)  # the server side of a gRPC stream gives up too
    assert table.info.rate_limiter_info.sample_stats.completed == 2  # the cancelled sample is not counted
    client.insert(np.int32(2), {"q": 1.0})
    later = reverb.TrajectoryDataset.from_table_signature(address, "q", 1, rate_limiter_timeout_ms=500)
    assert [int(s.data[0]) for s in later] == [2]  # not taken by the cancelled sampler
    assert table.info.rate_limiter_info.sample_stats.completed == 3


def test_closing_a_blocked_batch_generator_releases_its_stream(queue_server):
    dataset = reverb.TrajectoryDataset.from_table_signature(f"localhost:{queue_server.port}", "q", 1)
    batches = dataset._generate_batches()
    empty = next(batches)  # nothing to sample: an empty batch after one poll, nothing taken
    assert empty.info.key.shape == (0,) and empty.data.shape == (0, 1)
    del batches  # garbage collection closes the generator and its stream
    _wait_until(lambda: queue_server.table("q")._num_waiting == 0)
    assert queue_server.table("q").info.rate_limiter_info.sample_stats.completed == 0


@pytest.fixture(params=["in_process", "grpc"])
def transport_kind(request, monkeypatch):
    """Runs a test with the in-process transport and again over gRPC; counts the sample streams opened."""
    from replay_tf.grpc.client import client_transport
    from replay_tf.transport import base as transport_lib
    opened = []
    make = client_transport.Transport if request.param == "grpc" else transport_lib.make_transport

    def counting_make_transport(address):
        transport = make(address)
        original = transport.open_sample_stream

        def open_sample_stream(*args, **kwargs):
            opened.append(args)
            return original(*args, **kwargs)
        transport.open_sample_stream = open_sample_stream
        return transport
    monkeypatch.setattr(transport_lib, "make_transport", counting_make_transport)
    return opened


@pytest.mark.parametrize("num_workers, max_samples_per_stream, batch_size", [
    (2, -1, None), (3, 4, None), (2, -1, 5), (-1, -1, None)])
def test_workers_deliver_every_queue_item_exactly_once(transport_kind, num_workers, max_samples_per_stream,
                                                        batch_size):
    server = reverb.Server([reverb.Table.queue("q", 100, signature=tf.TensorSpec([1], tf.int32))])
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(40):
        client.insert(np.int32(i), {"q": 1.0})
    dataset = reverb.TrajectoryDataset.from_table_signature(
        f"localhost:{server.port}", "q", max_in_flight_samples_per_worker=3, num_workers_per_iterator=num_workers,
        max_samples_per_stream=max_samples_per_stream, rate_limiter_timeout_ms=300)
    if batch_size is None:
        values = [int(s.data[0]) for s in dataset]
    else:
        values = [v for b in dataset.batch(batch_size) for v in b.data.numpy().ravel().tolist()]
    assert sorted(values) == list(range(40))  # each item once: none lost, none twice
    assert len(transport_kind) == (1 if num_workers == -1 else num_workers)  # one stream per worker
    assert {args[0] for args in transport_kind} == {"q"}
    assert server.table("q").info.rate_limiter_info.sample_stats.completed == 40
    server.stop()


def test_workers_samples_match_their_info_and_max_samples_holds(transport_kind):
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))])
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(10):
        client.insert(np.full([2], i, np.int64), {"t": float(i + 1)})
    value_of = {item.key: i for i, item in enumerate(server.table("t").items_snapshot())}
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "t", dtypes=tf.int64,
                                       shapes=tf.TensorShape([1, 2]), max_in_flight_samples_per_worker=4,
                                       num_workers_per_iterator=3, max_samples=50)
    samples = list(dataset)
    assert len(samples) == 50
    for s in samples:
        i = value_of[int(s.info.key)]
        assert s.data.numpy().tolist() == [[i, i]]
        assert float(s.info.priority) == i + 1 and float(s.info.probability) == pytest.approx(0.1)
        assert int(s.info.table_size) == 10
    # The workers share max_samples: each opens one stream per reservation of up to 4 samples, so 50 samples
    # (none ever refused by this table) take ceil(50 / 4) streams.
    assert len(transport_kind) == 13
    server.stop()


@pytest.mark.parametrize("max_samples, max_in_flight, batch_size", [(4, 4, None), (3, 8, None), (5, 2, 2)])
def test_max_samples_takes_no_more_than_that_from_a_queue(transport_kind, max_samples, max_in_flight, batch_size):
    server = reverb.Server([reverb.Table.queue("q", 100, signature=tf.TensorSpec([1], tf.int32))])
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(50):
        client.insert(np.int32(i), {"q": 1.0})
    dataset = reverb.TrajectoryDataset.from_table_signature(
        f"localhost:{server.port}", "q", max_in_flight_samples_per_worker=max_in_flight, max_samples=max_samples)
    if batch_size is None:
        values = [int(s.data[0]) for s in dataset]
    else:
        values = [v for b in dataset.batch(batch_size) for v in b.data.numpy().ravel().tolist()]
    assert values == list(range(max_samples))  # a queue hands items out in insertion order
    # Nothing was sampled ahead and dropped: the rest is still queued, the next reader gets item max_samples.
    assert server.table("q").info.current_size == 50 - max_samples
    assert server.table("q").info.rate_limiter_info.sample_stats.completed == max_samples
    assert [int(np.asarray(s.data[0]).ravel()[0]) for s in client.sample("q", 3, emit_timesteps=False)] == [
        max_samples, max_samples + 1, max_samples + 2]
    assert server.table("q").info.current_size == 47 - max_samples  # client.sample took exactly 3
    server.stop()


def test_doctests():
    import doctest
    from replay_tf import trajectory_dataset
    failures, _ = doctest.testmod(trajectory_dataset, raise_on_error=False, verbose=False)
    assert failures == 0


def _sample_response(entries):
    """A SampleStreamResponse of `entries`: (item key or None, chunks, end_of_sequence, trajectory columns)."""
    from replay_tf.core import chunk_store
    from replay_tf.wire import chunk_codec
    from replay_tf.wire import reverb_service_pb2
    response = reverb_service_pb2.SampleStreamResponse()
    for key, chunks, end, columns in entries:
        entry = response.entries.add(end_of_sequence=end)
        if key is not None:
            entry.info.item.key = key
            entry.info.item.priority = 0.5
            entry.info.item.times_sampled = 3
            entry.info.probability = 0.25
            entry.info.table_size = 4
            for squeeze, slices in columns:
                column = entry.info.item.flat_trajectory.columns.add(squeeze=squeeze)
                for chunk_key, offset, length, index in slices:
                    column.chunk_slices.add(chunk_key=chunk_key, offset=offset, length=length, index=index)
        for chunk_key, episode, start, tensors in chunks:
            chunk = chunk_store.Chunk(chunk_key, tensors, chunk_store.SequenceRange(episode, start,
                                                                                   start + len(tensors[0]) - 1))
            entry.data.append(chunk_codec.chunk_to_proto(chunk))
    return response


def _read_samples(*responses):
    from replay_tf.grpc.client import sample_stream
    stream = sample_stream.SampleStream.__new__(sample_stream.SampleStream)
    partial, cache, out = [None], sample_stream._ChunkCache(), []
    for response in responses:
        out += stream._samples(response, partial, cache)
    return out


def test_remote_samples_are_built_from_slices_of_chunks_sent_over_several_entries():
    a = [np.arange(6, dtype=np.int32).reshape(3, 2), np.array([1.5, 2.5, 3.5], np.float32)]
    b = [np.arange(10, 14, dtype=np.int32).reshape(2, 2), np.array([4.5, 5.5], np.float32)]
    columns = [(False, [(7, 2, 1, 0), (8, 0, 2, 0)]), (True, [(8, 1, 1, 1)])]
    first = _sample_response([(11, [(7, 1, 0, a)], False, columns)])
    second = _sample_response([(None, [(8, 1, 3, b)], True, None),  # the rest of sample 11, then sample 12
                               (12, [(8, 1, 3, b)], True, [(True, [(8, 0, 1, 1)])])])
    samples = _read_samples(first, second)
    assert [s.item.key for s in samples] == [11, 12]
    cols = samples[0].item.column_arrays()
    assert cols[0].tolist() == [[4, 5], [10, 11], [12, 13]] and cols[0].dtype == np.int32
    assert cols[1].tolist() == 5.5 and cols[1].dtype == np.float32
    assert samples[1].item.column_arrays()[0].tolist() == 4.5
    assert (samples[0].priority, samples[0].times_sampled, samples[0].probability, samples[0].table_size) == (
        0.5, 3, 0.25, 4)
    assert samples[0].item.times_sampled == 3 and samples[0].item.priority == 0.5
    assert samples[0].item.chunks[8] is samples[1].item.chunks[8]  # decoded once per call


def test_remote_samples_read_a_grown_chunk_from_its_longest_version():
    # An open chunk grows by appended rows: sent first with 2 rows, then with 3, then with 2 again.
    rows = np.arange(6, dtype=np.int32).reshape(3, 2)
    samples = _read_samples(_sample_response([
        (11, [(7, 1, 0, [rows[:2]])], True, [(False, [(7, 0, 2, 0)])]),
        (12, [(7, 1, 0, [rows])], True, [(False, [(7, 1, 2, 0)])]),
        (13, [(7, 1, 0, [rows[:2]])], True, [(False, [(7, 0, 2, 0)])])]))
    assert [s.item.column_arrays()[0].tolist() for s in samples] == [[[0, 1], [2, 3]], [[2, 3], [4, 5]],
                                                                      [[0, 1], [2, 3]]]
    first, second, third = (s.item.chunks[7] for s in samples)
    assert first.num_rows == 2 and second.num_rows == 3
    assert third is second  # the cached 3-row chunk serves the later 2-row slice: rows are only appended


def test_remote_samples_must_carry_every_chunk_they_use_even_when_cached():
    from replay_tf import errors
    chunk = (7, 1, 0, [np.zeros([3, 2], np.int32)])
    first = _sample_response([(11, [chunk], True, [(False, [(7, 0, 1, 0)])])])
    second = _sample_response([(12, [], True, [(False, [(7, 1, 1, 0)])])])  # chunk 7 not sent again
    with pytest.raises(errors.ReverbError, match=r"sampled item 12 refers to chunk 7, which the server did not "
                                                 r"send with it"):
        _read_samples(first, second)


def test_remote_sample_items_know_their_episodes():
    chunks = [(7, 41, 0, [np.zeros([3, 2], np.int32)]), (8, 42, 0, [np.ones([3], np.float32)])]
    [sample] = _read_samples(_sample_response([(11, chunks, True, [(False, [(7, 0, 3, 0)]),
                                                                      (True, [(8, 1, 1, 0)])])]))
    assert sample.item.episode_ids == frozenset({41, 42})


@pytest.mark.parametrize("columns,error", [
    ([(False, [(9, 0, 1, 0)])], r"sampled item 11 refers to chunk 9, which the server did not send with it"),
    ([(False, [(7, 2, 2, 0)])], r"sampled item 11: slice \[2, 4\) of tensor 0 is out of chunk 7's 1 tensors "
                                r"of 3 rows"),
    ([(False, [(7, 0, 1, 1)])], r"slice \[0, 1\) of tensor 1 is out of chunk 7's 1 tensors"),
    ([(False, [(7, 0, 0, 0)])], r"slice \[0, 0\) of tensor 0 is out of"),
    ([(False, [(7, 0, 1, 0)]), (False, [])], r"sampled item 11 has a column without chunk slices"),
    ([], r"sampled item 11 has no columns"),
])
def test_remote_samples_with_bad_trajectories_name_the_item_and_slice(columns, error):
    from replay_tf import errors
    chunk = (7, 1, 0, [np.zeros([3, 2], np.int32)])
    with pytest.raises(errors.ReverbError, match=error):
        _read_samples(_sample_response([(11, [chunk], True, columns)]))


def test_remote_sample_data_before_its_info_is_an_error():
    from replay_tf import errors
    with pytest.raises(errors.ReverbError, match=r"SampleStream sent sample data before its info"):
        _read_samples(_sample_response([(None, [(7, 1, 0, [np.zeros([3], np.int32)])], True, None)]))


def test_remote_samples_with_columns_over_several_chunks_stack_into_batches():
    a, b = np.arange(6, dtype=np.int32).reshape(3, 2), np.arange(10, 16, dtype=np.int32).reshape(3, 2)
    chunks = [(7, 1, 0, [a]), (8, 1, 3, [b])]
    samples = _read_samples(_sample_response([(11, chunks, True, [(False, [(7, 2, 1, 0), (8, 0, 2, 0)])]),
                                              (12, chunks, True, [(False, [(7, 0, 2, 0), (8, 2, 1, 0)])])]))
    dataset = reverb.TrajectoryDataset("localhost:1", "t", dtypes=tf.int32, shapes=tf.TensorShape([3, 2]),
                                       max_in_flight_samples_per_worker=2)
    batch = dataset._stack(samples)
    assert batch.data.dtype == np.int32 and batch.info.key.tolist() == [11, 12]
    assert batch.data.tolist() == [[[4, 5], [10, 11], [12, 13]], [[0, 1], [2, 3], [14, 15]]]
    short = _read_samples(_sample_response([(13, chunks, True, [(False, [(7, 2, 1, 0), (8, 0, 1, 0)])])]))
    with pytest.raises(ValueError, match=r"column '<root>' has dtype=int32 shape=\[2, 2\], but the dataset "
                                         r"expects dtype=int32 shape=\(3, 2\)"):
        dataset._stack(samples + short)


_EXIT_WITH_OPEN_ITERATOR = """
import sys
import replay_tf as reverb
dataset = reverb.TrajectoryDataset.from_table_signature(sys.argv[1], "t", max_in_flight_samples_per_worker=512,
                                                        stacked_samples=sys.argv[2] == "1")
iterator = iter(dataset.batch(256))
for _ in range(5):
    next(iterator)
print("sampled", flush=True)
"""  # ... and exits with the iterator open, tf.data prefetching from a remote server


@pytest.mark.slow  # client processes
def test_a_process_exits_with_an_iterator_still_open():
    # tf.data's prefetching thread could be in (or entering) the sample generator when the interpreter began
    # to finalize: it was ended there and the iterator's destructor waited for it forever (about one exit in
    # two hung). Three clients at once, two with stacked samples.
    import os
    import subprocess
    import sys
    import proc_testlib
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                                         reverb.rate_limiters.MinSize(1), signature=tf.TensorSpec([1, 64], tf.float32))])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for i in range(2000):
            writer.append(np.full([64], i, np.float32))
            writer.create_item("t", 1.0, writer.history[-1:])
    env = dict(os.environ, PYTHONPATH=proc_testlib.ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    procs = [subprocess.Popen([sys.executable, "-c", _EXIT_WITH_OPEN_ITERATOR, f"localhost:{server.port}", stacked],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for stacked in ("1", "0", "1")]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=90)
            assert proc.returncode == 0 and out.strip() == "sampled", err[-2000:]
    finally:
        for proc in procs:
            proc.kill()
        server.stop()
