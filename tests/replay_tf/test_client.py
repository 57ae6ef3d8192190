"""Client: in-process lookup, insert/sample forms, mutate, reset, server_info, checkpoint, pickling."""
import pickle

import numpy as np
import pytest
import tensorflow as tf

import reverb_testlib
import replay_tf as reverb


@pytest.fixture
def server():
    server = reverb.Server([
        reverb.Table("sig", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1),
                     signature={"a": tf.TensorSpec([1], tf.int32), "b": tf.TensorSpec([1, 2], tf.float32)}),
        reverb.Table("plain", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1)),
    ])
    yield server
    server.stop()


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]"])
def test_loopback_aliases_are_in_process(server, host):
    client = reverb.Client(f"{host}:{server.port}")
    assert type(client.transport).__name__ == "InProcessTransport"
    assert sorted(client.server_info()) == ["plain", "sig"]


def test_client_pickles(server):
    client = pickle.loads(pickle.dumps(reverb.Client(f"localhost:{server.port}")))
    assert client.server_address == f"localhost:{server.port}"


def test_bad_address():
    with pytest.raises(ValueError, match=r"must look like 'host:port'"):
        reverb.Client("no-port")


def test_insert_and_sample_forms(server):
    client = server.localhost_client()
    client.insert({"a": np.int32(3), "b": np.array([1.0, 2.0], np.float32)}, priorities={"sig": 1.0, "plain": 2.0})
    [step] = next(client.sample("plain"))
    assert step.info.priority == 2.0 and step.info.times_sampled == 1
    assert [x.tolist() for x in step.data] == [3, [1.0, 2.0]]
    flat = next(client.sample("sig", emit_timesteps=False))
    assert [x.tolist() for x in flat.data] == [[3], [[1.0, 2.0]]]
    nested = next(client.sample("sig", emit_timesteps=False, unpack_as_table_signature=True))
    assert nested.data["b"].tolist() == [[1.0, 2.0]] and nested.info.times_sampled == 2
    with pytest.raises(ValueError, match="priorities must contain at least one item"):
        client.insert(1, priorities={})


def test_mutate_reset_and_unknown_tables(server):
    client = server.localhost_client()
    for i in range(3):
        client.insert(np.int32(i), priorities={"plain": 1.0})
    keys = [s[0].info.key for s in client.sample("plain", 3)]
    client.mutate_priorities("plain", updates={keys[1]: 5.0}, deletes=[keys[0]])
    assert client.server_info()["plain"].current_size == 2
    with pytest.raises(ValueError, match=r"Priority table nope was not found.*\['plain', 'sig'\]"):
        client.mutate_priorities("nope", updates={1: 1.0})
    with pytest.raises(ValueError, match="Priority table nope was not found"):
        client.reset("nope")
    with pytest.raises(ValueError, match="Priority table nope was not found"):
        next(client.sample("nope"))
    client.reset("plain")
    info = client.server_info()["plain"]
    assert info.current_size == 0 and info.rate_limiter_info.insert_stats.completed == 0


@pytest.fixture(params=["in-process", "remote"])
def any_client(request, server, monkeypatch):
    """A client of `server`, reaching it in-process or over gRPC."""
    if request.param == "remote":
        from replay_tf.grpc.client import client_transport
        from replay_tf.transport import base as transport_lib
        monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    return reverb.Client(f"localhost:{server.port}")


def test_unknown_tables_raise_what_reverb_and_we_raised(any_client):
    # dm-reverb's client raises RuntimeError, ours raised ValueError: TableNotFoundError is both.
    for call in (lambda: any_client.reset("nope"), lambda: next(any_client.sample("nope")),
                 lambda: any_client.mutate_priorities("nope", updates={1: 1.0})):
        with pytest.raises(RuntimeError, match="Priority table nope was not found") as info:
            call()
        assert isinstance(info.value, ValueError) and isinstance(info.value, reverb.errors.TableNotFoundError)


def test_deletes_may_be_a_numpy_array_and_sample_counts_are_checked(any_client):
    for i in range(3):
        any_client.insert(np.int32(i), priorities={"plain": 1.0})
    oldest = next(any_client.sample("plain"))[0].info.key  # (the table is a FIFO)
    any_client.mutate_priorities("plain", deletes=np.array([oldest, oldest], np.uint64))  # (2 elements: no bool)
    assert any_client.server_info()["plain"].current_size == 2
    assert next(any_client.sample("plain"))[0].info.key != oldest
    with pytest.raises(ValueError, match=r"max_samples \(0\) must be -1 or >= 1"):
        list(any_client.sample("plain", 0))
    assert list(any_client.sample("plain", -1)) == []  # (as Reverb: none)


def test_a_closed_writer_refuses_calls_and_one_left_by_with_stays_usable(any_client):
    with any_client.trajectory_writer(num_keep_alive_refs=1) as writer:
        writer.append({"x": np.float32(1)})
        writer.create_item("plain", 1.0, {"x": writer.history["x"][-1]})
    # As Reverb's: leaving the block flushes, and the writer is closed only by close() or when collected.
    writer.append({"x": np.float32(2)})
    writer.create_item("plain", 1.0, {"x": writer.history["x"][-1]})
    writer.flush()
    assert any_client.server_info()["plain"].current_size == 2
    writer.close()
    for call in (lambda: writer.append({"x": np.float32(3)}), lambda: writer.flush(), lambda: writer.end_episode(),
                 lambda: writer.create_item("plain", 1.0, {"x": writer.history["x"][-1]}),
                 lambda: writer.configure(("x",), num_keep_alive_refs=1, max_chunk_length=1)):
        with pytest.raises(RuntimeError, match=r"TrajectoryWriter::Close has been called\."):
            call()
    writer.close()  # again: nothing
    assert any_client.server_info()["plain"].current_size == 2


def test_trajectory_dataset_takes_string_tensors_for_address_and_table(any_client, server):
    any_client.insert(np.float32(7), priorities={"plain": 1.0})
    dataset = reverb.TrajectoryDataset(tf.constant(f"localhost:{server.port}"), tf.constant("plain"), tf.float32,
                                       tf.TensorShape([1]), max_in_flight_samples_per_worker=1)
    assert next(iter(dataset)).data.numpy().tolist() == [7.0]
    with pytest.raises(TypeError, match="table must be a str or a scalar string tensor"):
        reverb.TrajectoryDataset(f"localhost:{server.port}", 5, tf.float32, tf.TensorShape([1]), 1)


def test_a_server_needs_a_table():
    with pytest.raises(ValueError, match="At least one table must be provided"):
        reverb.Server()


def test_checkpoint_needs_a_checkpointer(server):
    with pytest.raises(ValueError, match="no checkpointer"):
        server.localhost_client().checkpoint()


def test_stopped_server_cancels_blocked_sample(server):
    client = server.localhost_client()
    error = reverb_testlib.error_of_call_released_by_stop(server, lambda: next(client.sample("plain")))
    assert "closed" in str(error)


SCENARIOS = {
    "sample_forms": """
server = reverb.Server([reverb.Table('t', reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10,
                                     reverb.rate_limiters.MinSize(1),
                                     signature={'a': tf.TensorSpec([1], tf.int32), 'b': [tf.TensorSpec([1, 2], tf.float32)]})])
client = reverb.Client(f'localhost:{server.port}')
client.insert({'a': np.int32(3), 'b': [np.array([1.0, 2.0], np.float32)]}, priorities={'t': 1.5})
with client.trajectory_writer(2) as w:
    for i in range(3):
        w.append({'a': np.int32(i), 'b': [np.full([2], i, np.float32)]})
    w.create_item('t', 2.5, {'a': w.history['a'][-1:], 'b': [w.history['b'][0][-1:]]})
for emit_timesteps in [True, False]:
    for unpack in [False, True]:
        out = []
        for s in client.sample('t', 2, emit_timesteps=emit_timesteps, unpack_as_table_signature=unpack):
            steps = s if emit_timesteps else [s]
            out.append([[type(x.data).__name__, [np.asarray(v).tolist() for v in tf.nest.flatten(x.data)],
                         x.info.priority, x.info.times_sampled, type(x.info.key).__name__] for x in steps])
        emit(f'{emit_timesteps}_{unpack}', out)
info = client.server_info()['t']
emit('info', [info.current_size, info.num_unique_samples, info.rate_limiter_info.sample_stats.completed])
""",
    # dm-reverb's insert converts each leaf to a tensor: TypeError for a leaf that does not convert, None
    # included (insert has no unset columns); nothing is inserted.
    "insert_non_tensor_leaves": """
import decimal
server = reverb.Server([reverb.Table.queue('q', 100)])
client = reverb.Client(f'localhost:{server.port}')
values = {'none': None, 'object': object(), 'set': {1, 2}, 'decimal': decimal.Decimal(1),
          'object_ints': np.array([1, 2], dtype=object), 'object_none': np.array([None], dtype=object),
          'object_strings': np.array(['a', b'b'], dtype=object), 'str': 'abc', 'bytes': b'x',
          'string_tensor': tf.constant(['a']), 'complex': 1 + 2j, 'datetime': np.datetime64('2020-01-01'),
          'ragged': tf.ragged.constant([[1], [2, 3]])}
for name, value in values.items():
    for where, data in [('leaf', value), ('nested', {'a': np.float32(1), 'b': [np.int32(0), value]})]:
        try:
            client.insert(data, priorities={'q': 1.0})
            emit(f'{name}_{where}', 'ok')
        except Exception as e:
            emit(f'{name}_{where}', type(e).__name__)
emit('size', client.server_info()['q'].current_size)
""",
}


peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


@pytest.mark.parametrize("data, message", [
    ({"a": np.float32(1), "b": [np.int32(0), None]}, r"Field \['b'\]\[1\] of the inserted data must be a tensor, "
                                                     r"numpy array, Python number, bool, str or bytes, got NoneType "
                                                     r"\(None\)"),
    ({"obs": {"x": object()}}, r"Field \['obs'\]\['x'\] of the inserted data must be .*, got object \(<object"),
    (np.array([1.5, "a"], dtype=object), r"Field <root> of the inserted data must be .*, got ndarray of dtype "
                                         r"object holding float \(1.5\)"),
])
def test_insert_refuses_non_tensor_leaves_naming_field_and_type(any_client, data, message):
    with pytest.raises(TypeError, match=message):
        any_client.insert(data, priorities={"plain": 1.0})
    any_client.insert({"s": "abc", "b": [b"x", np.array([b"y"], dtype=object)]}, priorities={"plain": 1.0})
    assert any_client.server_info()["plain"].current_size == 1  # only the good insert


@pytest.mark.parametrize("max_message_bytes, error", [
    (0, r"max_message_bytes \(0\) must be a positive number of bytes, -1 for no limit, or None"),
    (-2, r"max_message_bytes \(-2\) must be"),
    (True, r"max_message_bytes \(True\) must be"),
])
def test_server_rejects_bad_max_message_bytes(max_message_bytes, error):
    with pytest.raises(ValueError, match=error):
        reverb.Server([reverb.Table.queue("q", 10)], max_message_bytes=max_message_bytes)


def test_server_refuses_requests_above_max_message_bytes_and_keeps_serving(monkeypatch):
    import grpc
    from replay_tf.grpc.client import client_transport
    from replay_tf.transport import base as transport_lib
    from replay_tf.grpc.server import service
    server = reverb.Server([reverb.Table.queue("q", 10)], max_message_bytes=64 << 10)
    try:
        assert server.max_message_bytes == 64 << 10 and server.host == "localhost"
        monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
        client = reverb.Client(f"localhost:{server.port}")
        # Random bytes: Snappy cannot shrink them below the limit.
        big = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)
        with pytest.raises(reverb.ReverbError, match=r"RESOURCE_EXHAUSTED"):
            client.insert(big, {"q": 1.0})
        # A unary call too, checked by its gRPC status.
        channel = grpc.insecure_channel(f"localhost:{server.port}")
        call = channel.unary_unary(f"/{service.SERVICE_NAME}/MutatePriorities")
        with pytest.raises(grpc.RpcError) as raised:
            call(b"\x00" * (128 << 10), timeout=10)  # refused by size, before it is parsed
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        channel.close()
        client.insert(np.arange(10, dtype=np.uint8), {"q": 1.0})  # the server keeps serving
        assert client.server_info()["q"].current_size == 1
        sample = next(client.sample("q", emit_timesteps=False))
        assert np.asarray(sample.data[0]).ravel().tolist() == list(range(10))
    finally:
        server.stop()


def test_server_default_max_message_bytes_is_unset():
    server = reverb.Server([reverb.Table.queue("q", 10)])
    assert server.max_message_bytes is None
    server.stop()


def test_doctests():
    import doctest
    from replay_tf import client, server
    for module in (client, server):
        failures, _ = doctest.testmod(module, raise_on_error=False, verbose=False)
        assert failures == 0, module.__name__
