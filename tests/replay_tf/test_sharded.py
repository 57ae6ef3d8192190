"""ShardedClient: writers spread whole episodes over several servers; datasets read them all back."""
import zlib

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf import errors


@pytest.fixture(params=["inprocess", "grpc"])
def servers(request, monkeypatch):
    if request.param == "grpc":
        from replay_tf.grpc.client import client_transport
        from replay_tf.transport import base as transport_lib
        monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    started = [reverb.Server([reverb.Table.queue("q", 100)]) for _ in range(2)]
    yield started
    for server in started:
        server.stop()


def _drain(server):
    """The items of queue 'q' of a server, oldest first, as lists of column values."""
    table = server.table("q")
    return [[np.asarray(c).tolist() for c in table.sample(1, timeout_ms=0)[0].item.column_arrays()]
            for _ in range(table.size())]


def _write_episodes(writer, num_episodes, steps=3):
    for episode in range(num_episodes):
        for step in range(steps):
            value = 10 * episode + step
            writer.append({"x": np.int64(value), "y": np.full([2], value, np.float32)})
            if step >= 1:  # items of two steps, as transitions
                writer.create_item("q", 1.0, {"x": writer.history["x"][-2:], "y": writer.history["y"][-1]})
        writer.end_episode()


def _expected(episodes):
    return [[[10 * e + s - 1, 10 * e + s], [10 * e + s] * 2] for e in episodes for s in (1, 2)]


def test_trajectory_writer_spreads_whole_episodes_round_robin(servers):
    client = reverb.ShardedClient([s.address for s in servers])
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        assert writer.current_server_address == servers[0].address
        _write_episodes(writer, 5)
        assert writer.current_server_address == servers[1].address  # episode 5 would go to server 1
    # Episodes 0, 2, 4 on the first server, 1 and 3 on the second; items intact, none lost or doubled.
    assert _drain(servers[0]) == _expected([0, 2, 4])
    assert _drain(servers[1]) == _expected([1, 3])
    # A second writer of the client starts on the other server.
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        _write_episodes(writer, 1)
    assert [_drain(s) for s in servers] == [[], _expected([0])]


def test_writers_by_key_and_custom_routes(servers):
    addresses = [s.address for s in servers]
    client = reverb.ShardedClient(addresses)
    keys = ["actor-0", "actor-1", "actor-2", "actor-3"]
    for key in keys:
        with client.trajectory_writer(num_keep_alive_refs=2, key=key) as writer:
            _write_episodes(writer, 2)
    per_server = [len(_drain(s)) for s in servers]
    expected = [0, 0]
    for key in keys:
        expected[zlib.crc32(key.encode()) % 2] += 2 * 2  # two episodes of two items each
    assert per_server == expected
    # A custom route: every episode to the last server.
    last = reverb.ShardedClient(addresses, route=lambda writer, episode: -1)
    with last.trajectory_writer(num_keep_alive_refs=2) as writer:
        _write_episodes(writer, 3)
    assert [_drain(s) for s in servers] == [[], _expected([0, 1, 2])]


def test_episode_stays_on_its_server_without_clear_buffers_and_after_a_timeout():
    servers = [reverb.Server([reverb.Table.queue("q", 1)]) for _ in range(2)]
    try:
        client = reverb.ShardedClient([s.address for s in servers])
        writer = client.trajectory_writer(num_keep_alive_refs=4)
        writer.append({"x": np.int64(0)})
        writer.end_episode(clear_buffers=False)  # stays: the next items may read this step
        writer.append({"x": np.int64(1)})
        writer.create_item("q", 1.0, writer.history["x"][-2:])
        writer.create_item("q", 1.0, writer.history["x"][-1:])  # the queue holds one: this one waits
        with pytest.raises(errors.DeadlineExceededError, match="End episode call did not complete"):
            writer.end_episode(timeout_ms=50)
        assert writer.current_server_address == servers[0].address  # the episode is not over
        assert _drain(servers[0]) == [[[0, 1]]]
        writer.end_episode(timeout_ms=10_000)
        assert _drain(servers[0]) == [[[1]]]
        assert writer.current_server_address == servers[1].address
        writer.close()
    finally:
        for server in servers:
            server.stop()


def test_structured_writer_spreads_episodes_with_the_configs_items(servers):
    client = reverb.ShardedClient([s.address for s in servers])
    ref = reverb.structured_writer.create_reference_step({"x": tf.TensorSpec([], tf.int64)})
    config = reverb.structured_writer.create_config({"pair": ref["x"][-2:]}, table="q")
    with client.structured_writer([config]) as writer:
        for episode in range(4):
            for step in range(3):
                writer.append({"x": np.int64(10 * episode + step)})
            writer.end_episode()
    pairs = lambda episodes: [[[10 * e + s - 1, 10 * e + s]] for e in episodes for s in (1, 2)]  # noqa: E731
    assert _drain(servers[0]) == pairs([0, 2])
    assert _drain(servers[1]) == pairs([1, 3])


def test_make_reverb_dataset_reads_every_server():
    signature = tf.TensorSpec([], tf.int64)
    servers = [reverb.Server([reverb.Table("priority_table", reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                                           100, reverb.rate_limiters.MinSize(1), signature=signature)])
               for _ in range(2)]
    try:
        client = reverb.ShardedClient([s.address for s in servers])
        with client.trajectory_writer(num_keep_alive_refs=1) as writer:
            for episode in range(4):  # episodes 0, 2 on the first server, 1, 3 on the second
                writer.append({"x": np.int64(episode)})
                writer.create_item("priority_table", 1.0, writer.history["x"][-1])
                writer.end_episode()
        dataset = reverb.make_reverb_dataset([s.address for s in servers], num_parallel_calls=None)
        seen = {int(sample.data) for sample in dataset.take(200)}
        # Each element comes from a server drawn at random: missing one in 200 draws has probability 2**-199.
        assert seen == {0, 1, 2, 3}
    finally:
        for server in servers:
            server.stop()


def _to_last(writer_index, episode_index):
    return -1


def test_sharded_client_pickles_with_its_route(servers):
    import pickle
    client = pickle.loads(pickle.dumps(reverb.ShardedClient([s.address for s in servers], route=_to_last)))
    assert client.server_addresses == [s.address for s in servers]
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        _write_episodes(writer, 2)
    assert [_drain(s) for s in servers] == [[], _expected([0, 1])]


def test_bad_arguments():
    with pytest.raises(TypeError, match=r"sequence of 'host:port' strings, got the string 'localhost:1'"):
        reverb.ShardedClient("localhost:1")
    with pytest.raises(ValueError, match="at least one server"):
        reverb.ShardedClient([])
    with pytest.raises(ValueError, match=r"route must be 'round_robin' or a function .* got 'random'"):
        reverb.ShardedClient(["localhost:1"], route="random")
