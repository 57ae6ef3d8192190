"""replay_tf.datasets: acme's make_reverb_dataset and ftw's fifo / rnn-sequence dataset helpers.

Expected values are the data the tests insert (hand-built), the arithmetic of acme's weight split, and a
binomial bound for the table mix. A sampler blocked on an empty queue only returns when its server stops, so
tests stop the server before the dataset iterator is dropped (`_take_then_stop`).
"""
import collections
import re

import numpy as np
import pytest
import tensorflow as tf
import tree
from dm_env import specs as dm_specs

import replay_tf as reverb
from replay_tf import datasets as datasets_lib
from replay_tf.datasets import DeprecatedStep, EnvironmentSpec, Step


def _uniform_table(name, signature, max_size=100):
    return reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), max_size,
                        reverb.rate_limiters.MinSize(1), signature=signature)


def _take_then_stop(server, dataset, n):
    iterator = iter(dataset)
    try:
        return [tree.map_structure(lambda t: t.numpy(), next(iterator)) for _ in range(n)]
    finally:
        server.stop()  # releases a sampler waiting on an empty queue before the iterator is destroyed
        del iterator


ENV_SPEC = EnvironmentSpec(
    observations=dm_specs.Array((2,), np.float32, "obs"),
    actions=dm_specs.DiscreteArray(3, dtype=np.int32, name="action"),
    rewards=dm_specs.Array((), np.float32, "reward"),
    discounts=dm_specs.BoundedArray((), np.float32, 0.0, 1.0, "discount"))


def _step(i, extras=()):
    return Step(observation=np.float32([i, -i]), action=np.int32(i % 3), reward=np.float32(i / 10),
                discount=np.float32(1.0), start_of_episode=np.bool_(i == 0), extras=extras)


# --- make_reverb_dataset -------------------------------------------------------------------------------

@pytest.mark.parametrize("table, batch_size, max_in_flight, expected", [
    ("a", 4, None, {"a": 8}),                                    # 2 * batch_size
    ("a", None, None, {"a": 100}),                               # no batch: 100
    ({"a": 3.0, "b": 1.0}, None, None, {"a": 75, "b": 25}),      # split by normalized weight
    ({"a": 1.0, "b": 0.0, "c": -1.0}, None, 10, {"a": 10}),      # weights <= 0 drop the table
    ({"a": 1.0, "b": 1000.0}, None, 10, {"a": 1, "b": 9}),       # at least 1 per table; int() truncates
])
def test_make_reverb_dataset_splits_in_flight_samples_by_weight(monkeypatch, table, batch_size, max_in_flight,
                                                                expected):
    requested = {}

    class Recorder:
        @staticmethod
        def from_table_signature(server_address, table, max_in_flight_samples_per_worker):
            requested[table] = max_in_flight_samples_per_worker
            return tf.data.Dataset.from_tensors(np.int64(0)).repeat()

    monkeypatch.setattr(datasets_lib, "TrajectoryDataset", Recorder)
    datasets_lib.make_reverb_dataset("localhost:1", batch_size=batch_size, table=table, num_parallel_calls=None,
                                     max_in_flight_samples_per_worker=max_in_flight)
    assert requested == expected


@pytest.mark.parametrize("kwargs, error, match", [
    ({"table": {"a": 0.0, "b": -2.0}}, ValueError, "No positive weights"),
    ({"table": {}}, ValueError, "No positive weights"),
    ({"table": ["a"]}, TypeError, "table must be a table name"),
    ({"environment_spec": ENV_SPEC}, ValueError, "no longer takes environment_spec"),
    ({"extra_spec": {"x": tf.TensorSpec([], tf.float32)}}, ValueError, "no longer takes environment_spec"),
    ({"batch_size": 0}, ValueError, re.escape("batch_size (0) must be None or a positive integer")),
    ({"num_parallel_calls": -3}, ValueError, re.escape("num_parallel_calls (-3)")),
    ({"max_in_flight_samples_per_worker": 0}, ValueError, "max_in_flight_samples_per_worker"),
])
def test_make_reverb_dataset_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        datasets_lib.make_reverb_dataset("localhost:1", **kwargs)


def test_make_reverb_dataset_unknown_table_lists_known_ones():
    server = reverb.Server([_uniform_table("known", tf.TensorSpec([1], tf.int64))])
    try:
        with pytest.raises(ValueError, match="does not contain any table named missing.*known"):
            datasets_lib.make_reverb_dataset(server.address, table="missing", num_parallel_calls=None)
    finally:
        server.stop()


def test_make_reverb_dataset_mixes_tables_by_weight():
    signature = tf.TensorSpec([1], tf.int64)
    server = reverb.Server([_uniform_table("a", signature), _uniform_table("b", signature)])
    client = reverb.Client(server.address)
    client.insert(np.int64(1), priorities={"a": 1.0})
    client.insert(np.int64(2), priorities={"b": 1.0})
    dataset = datasets_lib.make_reverb_dataset(server.address, batch_size=100, table={"a": 3.0, "b": 1.0},
                                               num_parallel_calls=None)
    batches = _take_then_stop(server, dataset, 20)
    values = np.concatenate([b.data.reshape(-1) for b in batches])
    assert set(values.tolist()) == {1, 2}
    # 2000 draws with P(a) = 0.75: the count of a's lies within 5 standard deviations of 1500.
    n, p = len(values), 0.75
    assert abs(int((values == 1).sum()) - n * p) < 5 * np.sqrt(n * p * (1 - p))


def test_make_reverb_dataset_postprocess_batch_prefetch_and_interleave():
    server = reverb.Server([_uniform_table("priority_table", {"x": tf.TensorSpec([1, 2], tf.float32)})])
    client = reverb.Client(server.address)
    for i in range(5):
        client.insert({"x": np.float32([i, i])}, priorities={"priority_table": 1.0})
    dataset = datasets_lib.make_reverb_dataset(
        server.address, batch_size=4, prefetch_size=2, num_parallel_calls=2,
        postprocess=lambda sample: sample.data["x"][0] * 10.0)
    assert dataset.element_spec == tf.TensorSpec([4, 2], tf.float32)
    batches = _take_then_stop(server, dataset, 5)
    values = np.stack(batches)
    assert values.shape == (5, 4, 2)
    assert set(values[..., 0].reshape(-1).tolist()) <= {0.0, 10.0, 20.0, 30.0, 40.0}
    np.testing.assert_array_equal(values[..., 0], values[..., 1])


def test_make_reverb_dataset_reads_a_queue_exactly_once_per_item():
    server = reverb.Server([reverb.Table.queue("q", 100, signature=tf.TensorSpec([1], tf.int64))])
    client = reverb.Client(server.address)
    for i in range(12):
        client.insert(np.int64(i), priorities={"q": 1.0})
    dataset = datasets_lib.make_reverb_dataset(server.address, batch_size=3, table="q", num_parallel_calls=2)
    batches = _take_then_stop(server, dataset, 4)
    assert sorted(np.concatenate([b.data.reshape(-1) for b in batches]).tolist()) == list(range(12))


# --- spec_to_shapes_and_dtypes ---------------------------------------------------------------------------

EXTRA = {"logits": dm_specs.Array((3,), np.float32), "graph": dm_specs.Array((0, 4), np.float32)}


@pytest.mark.parametrize("kwargs, expected_type, expected_shapes", [
    ({"transition_adder": False}, Step,
     Step([2], [], [], [], [], ())),
    ({"transition_adder": False, "sequence_length": 5}, Step,
     Step([5, 2], [5], [5], [5], [5], ())),
    ({"transition_adder": True}, tuple,
     ([2], [], [], [], [2])),
    ({"transition_adder": True, "extra_spec": EXTRA}, tuple,
     ([2], [], [], [], [2], {"logits": [3], "graph": [0, 4]})),
    ({"transition_adder": False, "extra_spec": EXTRA, "convert_zero_size_to_none": True}, Step,
     Step([2], [], [], [], [], {"logits": [3], "graph": [None, 4]})),
    ({"transition_adder": False, "extra_spec": EXTRA, "convert_zero_size_to_none": True, "sequence_length": 2},
     Step, Step([2, 2], [2], [2], [2], [2], {"logits": [2, 3], "graph": [2, None, 4]})),
    ({"transition_adder": False, "using_deprecated_adder": True}, DeprecatedStep,
     DeprecatedStep([2], [], [], [], ())),
])
def test_spec_to_shapes_and_dtypes(kwargs, expected_type, expected_shapes):
    shapes, dtypes = datasets_lib.spec_to_shapes_and_dtypes(environment_spec=ENV_SPEC, **kwargs)
    assert type(shapes) is expected_type and type(dtypes) is expected_type
    assert tree.map_structure(lambda s: s.as_list(), shapes) == expected_shapes
    assert dtypes[0] == tf.float32 and dtypes[1] == tf.int32 and dtypes[2] == tf.float32
    if expected_type is Step:
        assert dtypes.start_of_episode == tf.bool


# --- make_reverb_fifo_sampler_dataset --------------------------------------------------------------------

def _queue_server(signature, max_size=100):
    return reverb.Server([reverb.Table.queue("queue", max_size, signature=signature)])


def _queue_of_3_step_items(num_steps):
    """A server whose table 'queue' holds an item per 3 steps of `x` = 0, 1, ... (`num_steps` steps), and a
    client of it."""
    server = _queue_server({"x": tf.TensorSpec([3], tf.int32)})
    client = reverb.Client(server.address)
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for i in range(num_steps):
            writer.append({"x": np.int32(i)})
            if i % 3 == 2:
                writer.create_item("queue", 1.0, {"x": writer.history["x"][-3:]})
    return server, client


def test_fifo_emits_timesteps_of_trajectories_in_insertion_order():
    server, client = _queue_of_3_step_items(9)
    dataset = datasets_lib.make_reverb_fifo_sampler_dataset(client, table="queue")
    assert dataset.element_spec.data == {"x": tf.TensorSpec([], tf.int32)}
    samples = _take_then_stop(server, dataset, 9)
    assert [int(s.data["x"]) for s in samples] == list(range(9))
    keys = [int(s.info.key) for s in samples]
    assert keys[0] == keys[1] == keys[2] != keys[3] == keys[4] == keys[5] != keys[6]  # one item per 3 steps


def test_fifo_sequence_length_emits_whole_items_batched_in_order():
    server, client = _queue_of_3_step_items(12)
    dataset = datasets_lib.make_reverb_fifo_sampler_dataset(client, table="queue", sequence_length=3,
                                                            batch_size=2, prefetch_size=1)
    assert dataset.element_spec.data == {"x": tf.TensorSpec([2, 3], tf.int32)}
    batches = _take_then_stop(server, dataset, 2)
    assert [b.data["x"].tolist() for b in batches] == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]


def test_fifo_sequence_length_must_match_the_signature():
    server = _queue_server({"x": tf.TensorSpec([3], tf.int32)})
    try:
        with pytest.raises(ValueError, match=re.escape("sequence_length (4) does not match")):
            datasets_lib.make_reverb_fifo_sampler_dataset(server.address, table="queue", sequence_length=4)
    finally:
        server.stop()


@pytest.mark.parametrize("transition_adder", [False, True])
def test_fifo_with_environment_spec(transition_adder):
    # What acme's 2020 adders wrote per timestep; inserted as length-1 items, read back one per element.
    if transition_adder:
        steps = [(np.float32([i, -i]), np.int32(i % 3), np.float32(i / 10), np.float32(1.0),
                  np.float32([i + 1, -i - 1])) for i in range(4)]
    else:
        steps = [_step(i) for i in range(4)]
    server = reverb.Server([reverb.Table.queue("priority_table", 10)])  # no signature: the spec gives shapes
    client = reverb.Client(server.address)
    for step in steps:
        client.insert(step, priorities={"priority_table": 1.0})
    dataset = datasets_lib.make_reverb_fifo_sampler_dataset(client, environment_spec=ENV_SPEC,
                                                            transition_adder=transition_adder)
    samples = _take_then_stop(server, dataset, 4)
    for sample, step in zip(samples, steps):
        assert type(sample.data) is type(step)
        for got, want in zip(tree.flatten(sample.data), tree.flatten(step)):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype


def test_fifo_with_environment_spec_and_sequence_length():
    server = reverb.Server([reverb.Table.queue("priority_table", 10)])
    client = reverb.Client(server.address)
    extra = {"logits": dm_specs.Array((3,), np.float32)}
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for i in range(4):
            writer.append(_step(i, extras={"logits": np.full(3, i, np.float32)}))
            if i % 2 == 1:
                writer.create_item("priority_table", 1.0, tree.map_structure(lambda c: c[-2:], writer.history))
    dataset = datasets_lib.make_reverb_fifo_sampler_dataset(client, environment_spec=ENV_SPEC, extra_spec=extra,
                                                            sequence_length=2)
    assert dataset.element_spec.data.observation.shape == [2, 2]
    samples = _take_then_stop(server, dataset, 2)
    assert [s.data.observation[:, 0].tolist() for s in samples] == [[0.0, 1.0], [2.0, 3.0]]
    assert [s.data.extras["logits"][:, 0].tolist() for s in samples] == [[0.0, 1.0], [2.0, 3.0]]
    assert [s.data.start_of_episode.tolist() for s in samples] == [[True, False], [False, False]]


# --- make_reverb_rnn_sequence_fifo_sampler_dataset -------------------------------------------------------

def test_rnn_sequences_keep_only_the_first_core_state():
    sequence_length = 3
    extra = {"core_state": dm_specs.Array((4,), np.float32)}
    server = reverb.Server([reverb.Table.queue("queue", 10)])
    client = reverb.Client(server.address)
    expected = []
    for k in range(3):
        # One stored timestep per unroll: [T, ...] fields and the unroll's first core state as [1, 4].
        steps = [_step(sequence_length * k + t) for t in range(sequence_length)]
        sequence = tree.map_structure(lambda *xs: np.stack(xs), *steps)
        sequence = sequence._replace(extras={"core_state": np.full((1, 4), k, np.float32)})
        client.insert(sequence, priorities={"queue": 1.0})
        expected.append(sequence)
    dataset = datasets_lib.make_reverb_rnn_sequence_fifo_sampler_dataset(
        client, environment_spec=ENV_SPEC, extra_spec=extra, sequence_length=sequence_length, table="queue",
        batch_size=1)
    spec = dataset.element_spec.data
    assert spec.extras["core_state"].shape == [1, 1, 4] and spec.observation.shape == [1, sequence_length, 2]
    batches = _take_then_stop(server, dataset, 3)
    for batch, want in zip(batches, expected):
        for got, leaf in zip(tree.flatten(batch.data), tree.flatten(want)):
            np.testing.assert_array_equal(got[0], leaf)


def test_rnn_without_environment_spec_uses_the_table_signature():
    server = _queue_server({"x": tf.TensorSpec([1, 5], tf.int32)})
    client = reverb.Client(server.address)
    for k in range(2):
        client.insert({"x": np.arange(5, dtype=np.int32) + k}, priorities={"queue": 1.0})
    dataset = datasets_lib.make_reverb_rnn_sequence_fifo_sampler_dataset(server.address, table="queue")
    assert dataset.element_spec.data == {"x": tf.TensorSpec([5], tf.int32)}
    samples = _take_then_stop(server, dataset, 2)
    assert [s.data["x"].tolist() for s in samples] == [[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"client": 42}, TypeError, "client must be a replay_tf.Client"),
    ({"table": {"a": 1.0}}, TypeError, "table must be a table name"),
    ({"sequence_length": 0}, ValueError, re.escape("sequence_length (0)")),
    ({"batch_size": -1}, ValueError, re.escape("batch_size (-1)")),
])
@pytest.mark.parametrize("make", [datasets_lib.make_reverb_fifo_sampler_dataset,
                                  datasets_lib.make_reverb_rnn_sequence_fifo_sampler_dataset])
def test_fifo_bad_arguments(make, kwargs, error, match):
    kwargs = {"client": "localhost:1", **kwargs}
    with pytest.raises(error, match=match):
        make(**kwargs)


def test_make_environment_spec_from_a_dm_env():
    from rlds_tf.recording import Catch

    spec = datasets_lib.make_environment_spec(Catch())
    assert spec.observations.shape == (10, 5) and spec.actions.num_values == 3
    shapes, dtypes = datasets_lib.spec_to_shapes_and_dtypes(False, spec)
    assert shapes.observation == [10, 5] and dtypes.observation == tf.float32
    assert collections.Counter(type(s) for s in tree.flatten(shapes)) == {tf.TensorShape: 5}


# --- several servers ---------------------------------------------------------------------------------

def test_make_reverb_dataset_over_several_servers():
    """One server in this process, one in a `replay-tf serve` process (reached over gRPC)."""
    import json
    import os
    import signal
    import socket
    import subprocess
    import sys
    import tempfile

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    signature = tf.TensorSpec([1], tf.int64)
    local = reverb.Server([_uniform_table("priority_table", signature)])
    reverb.Client(local.address).insert(np.int64(1), priorities={"priority_table": 1.0})
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        config = os.path.join(directory, "tables.json")
        with open(config, "w") as f:
            json.dump({"tables": [{"name": "priority_table", "sampler": "uniform", "remover": "fifo",
                                   "max_size": 10, "rate_limiter": {"min_size": 1},
                                   "signature": {"shape": [1], "dtype": "int64"}}]}, f)
        env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   TF_CPP_MIN_LOG_LEVEL="3")
        remote = subprocess.Popen([sys.executable, "-m", "replay_tf.cli", "serve", "--config", config,
                                   "--port", str(port), "--stats-interval", "60"], cwd=repo, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            line = ""
            for line in remote.stdout:  # bounded by the process: it prints this line or exits
                if "serving tables" in line:
                    break
            assert "serving tables" in line, line
            remote_client = reverb.Client(f"localhost:{port}")
            remote_client.insert(np.int64(2), priorities={"priority_table": 1.0})
            dataset = datasets_lib.make_reverb_dataset([local.address, f"localhost:{port}"], batch_size=5,
                                                       num_parallel_calls=None)
            iterator = iter(dataset)
            batches = [next(iterator).data.numpy().reshape(-1).tolist() for _ in range(60)]
            del iterator  # uniform tables never block: the samplers return
        finally:
            remote.send_signal(signal.SIGINT)
            try:
                remote.wait(60)
            finally:
                if remote.poll() is None:
                    remote.kill()
                remote.stdout.close()
            local.stop()
    # A batch comes from one server; both servers are drawn, each with probability 1/2.
    assert all(batch in ([1] * 5, [2] * 5) for batch in batches)
    from_local = sum(batch[0] == 1 for batch in batches)
    assert abs(from_local - 30) < 5 * np.sqrt(60 * 0.25)


def test_make_reverb_dataset_server_list_must_hold_addresses():
    with pytest.raises(ValueError, match="non-empty list"):
        datasets_lib.make_reverb_dataset([], num_parallel_calls=None)


_DM_REVERB_SERVER = r"""
import sys
import numpy as np
import reverb
import tensorflow as tf

server = reverb.Server([reverb.Table('priority_table', reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                                     reverb.rate_limiters.MinSize(1), signature=tf.TensorSpec([1], tf.int64))],
                       port=int(sys.argv[1]))
client = reverb.Client(f'localhost:{server.port}')
client.insert(np.int64(2), priorities={'priority_table': 1.0})
print('ready', flush=True)
sys.stdin.read()  # serve until the test closes stdin
server.stop()
"""


@pytest.mark.peer
def test_make_reverb_dataset_mixes_a_dm_reverb_server_and_ours(peer):
    import select
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dm_reverb = peer.popen(_DM_REVERB_SERVER, str(port), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    local = reverb.Server([_uniform_table("priority_table", tf.TensorSpec([1], tf.int64))])
    try:
        ready, _, _ = select.select([dm_reverb.stdout], [], [], 120)
        assert ready and dm_reverb.stdout.readline().strip() == "ready", "the dm-reverb server did not start"
        reverb.Client(local.address).insert(np.int64(1), priorities={"priority_table": 1.0})
        dataset = datasets_lib.make_reverb_dataset([local.address, f"localhost:{port}"], batch_size=4,
                                                   num_parallel_calls=2)
        iterator = iter(dataset)
        batches = [next(iterator).data.numpy().reshape(-1).tolist() for _ in range(40)]
        del iterator
    finally:
        local.stop()
        dm_reverb.stdin.close()
        try:
            dm_reverb.wait(30)
        except subprocess.TimeoutExpired:
            dm_reverb.kill()
            dm_reverb.wait(10)
        dm_reverb.stdout.close()
    assert all(batch in ([1] * 4, [2] * 4) for batch in batches)
    assert {batch[0] for batch in batches} == {1, 2}
