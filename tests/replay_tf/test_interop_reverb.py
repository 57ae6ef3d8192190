"""Interop with dm-reverb 0.14 over gRPC, both ways, values compared element by element.

- A dm-reverb client (TF 2.15, peer venv) against our server: trajectory_writer items of several specs,
  structured_writer, client.insert, client.sample, TrajectoryDataset (batched), priorities mutated and
  reflected in sampling, server_info signature and counts, reset, checkpoint.
- Our client (remote transport) against a dm-reverb server started in the peer venv: the same list, with
  the reference values read back by Reverb's own client in the server process.
"""
import json
import os
import select
import subprocess
import tempfile

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.transport import inprocess
from replay_tf import checkpointing

pytestmark = pytest.mark.peer

_OBS_SPEC = tf.TensorSpec([3, 2], tf.float32)
_SIGNATURE = {"obs": _OBS_SPEC, "act": tf.TensorSpec([], tf.int64), "tag": tf.TensorSpec([3], tf.string)}


def _tables():
    return [
        reverb.Table("uniform", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                     reverb.rate_limiters.MinSize(1)),
        reverb.Table("prio", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 1000,
                     reverb.rate_limiters.MinSize(1)),
        reverb.Table.queue("queue", 100),
        reverb.Table("sig", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                     reverb.rate_limiters.MinSize(1), signature=_SIGNATURE),
        reverb.Table("structured", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 1000,
                     reverb.rate_limiters.MinSize(1), max_times_sampled=1),
    ]


def _step(t):
    return {"obs": np.full([2], t, np.float32) + np.array([0.0, 0.5], np.float32), "act": np.int64(t),
            "tag": f"t{t}".encode()}


# --- a dm-reverb client against our server ---

_REVERB_CLIENT = r'''
import numpy as np, tensorflow as tf, reverb
from reverb import structured_writer as sw
address = INPUTS["address"]
client = reverb.Client(address)

info = client.server_info()
emit("tables", sorted(info))
emit("sig_signature", sorted((k, repr(v)) for k, v in info["sig"].signature.items()))
emit("queue_max_size", int(info["queue"].max_size))
emit("prio_sampler", str(info["prio"].sampler_options).strip())
emit("queue_rate_limiter", [info["queue"].rate_limiter_info.max_diff, info["queue"].rate_limiter_info.min_size_to_sample])

def step(t):
    return {"obs": np.full([2], t, np.float32) + np.array([0.0, 0.5], np.float32), "act": np.int64(t),
            "tag": f"t{t}".encode()}

# trajectory_writer: items of the signature's spec, and items of two other specs into "uniform".
with client.trajectory_writer(num_keep_alive_refs=4) as writer:
    for t in range(10):
        writer.append(step(t))
        if t >= 2:
            h = writer.history
            writer.create_item("sig", 1.0, {"obs": h["obs"][-3:], "act": h["act"][-1], "tag": h["tag"][-3:]})
            writer.create_item("uniform", 1.0, {"pair": (h["obs"][-2:], h["act"][-1])})
            writer.create_item("uniform", 1.0, [h["tag"][-1], h["obs"][-1]])
    writer.end_episode()
info = client.server_info()
emit("uniform_shapes", sorted({repr([list(np.shape(c)) for c in s.data])
                               for s in client.sample("uniform", 40, emit_timesteps=False)}))
emit("counts_after_writer", [int(info["sig"].current_size), int(info["uniform"].current_size),
                             int(info["sig"].num_episodes)])

# TrajectoryDataset, batched.
dataset = reverb.TrajectoryDataset.from_table_signature(address, "sig", max_in_flight_samples_per_worker=8)
for i, sample in enumerate(dataset.batch(4).take(3)):
    emit(f"ds/{i}/key", sample.info.key.numpy().astype(np.uint64))
    emit(f"ds/{i}/probability", sample.info.probability.numpy())
    emit(f"ds/{i}/table_size", sample.info.table_size.numpy())
    emit(f"ds/{i}/times_sampled", sample.info.times_sampled.numpy())
    emit(f"ds/{i}/obs", sample.data["obs"].numpy())
    emit(f"ds/{i}/act", sample.data["act"].numpy())
    emit(f"ds/{i}/tag", [[v.decode() for v in row] for row in sample.data["tag"].numpy()])

# structured_writer.
step_spec = {"obs": tf.TensorSpec([2], tf.float32), "act": tf.TensorSpec([], tf.int64),
             "tag": tf.TensorSpec([], tf.string)}
ref = sw.create_reference_step(step_spec)
configs = [sw.create_config({"obs": ref["obs"][-2:], "act": ref["act"][-1]}, table="structured",
                            conditions=[sw.Condition.step_index() % 2 == 1])]
writer = client.structured_writer(configs)
for t in range(8):
    writer.append(step(t))
writer.flush()
for i, sample in enumerate(client.sample("structured", 4, emit_timesteps=False)):
    emit(f"structured/{i}/key", int(sample.info.key))
    emit(f"structured/{i}/data", [np.asarray(x).tolist() for x in sample.data])

# client.insert and client.sample (queue: FIFO order, each sampled once).
for t in range(3):
    client.insert(step(t), priorities={"queue": 1.0})
for i, timesteps in enumerate(client.sample("queue", 3)):
    [ts] = timesteps
    emit(f"queue/{i}/key", int(ts.info.key))
    emit(f"queue/{i}/probability", float(ts.info.probability))
    emit(f"queue/{i}/act", np.asarray(ts.data[0]))
    emit(f"queue/{i}/obs", np.asarray(ts.data[1]))
    emit(f"queue/{i}/tag", np.asarray(ts.data[2]).item().decode())

# Priorities mutated and reflected in sampling.
for t in range(4):
    client.insert(step(t), priorities={"prio": float(t + 1)})
keys = set()
for sample in client.sample("prio", 200, emit_timesteps=False):  # (40 missed p = 0.1 once in 67 runs)
    keys.add(int(sample.info.key))
keys = sorted(keys)
emit("prio/keys", keys)
client.mutate_priorities("prio", updates={k: 0.0 for k in keys[1:]} | {keys[0]: 5.0})
after = [(int(s.info.key), float(s.info.probability), float(s.info.priority))
         for s in client.sample("prio", 10, emit_timesteps=False)]
emit("prio/after", after)
client.mutate_priorities("prio", deletes=keys[1:])
emit("prio/size_after_delete", int(client.server_info()["prio"].current_size))

# A rate-limiter timeout ends a dataset (the "structured" table is empty by now).
empty = reverb.TrajectoryDataset(address, "structured", dtypes=(tf.int64, tf.float32),
                                 shapes=(tf.TensorShape([]), tf.TensorShape([2, 2])),
                                 max_in_flight_samples_per_worker=4, rate_limiter_timeout_ms=100)
emit("timeout_dataset", len(list(empty)))

# reset and checkpoint.
client.reset("uniform")
info = client.server_info()
emit("uniform_after_reset", [int(info["uniform"].current_size), int(info["uniform"].rate_limiter_info.insert_stats.completed)])
emit("checkpoint_path", client.checkpoint())
'''


@pytest.fixture(scope="module")
def our_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    server = reverb.Server(_tables(), checkpointer=checkpointing.DirectoryCheckpointer(str(root)))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def reverb_client_run(peer, our_server):
    return peer.run(_REVERB_CLIENT, {"address": f"localhost:{our_server.port}"}, timeout_s=300)


def _item_columns(server, table, key):
    item = server.tables[table].get_item(int(key))
    assert item is not None, f"key {key} is not in our table {table}"
    return item.column_arrays()


def test_reverb_client_server_info(reverb_client_run):
    out = reverb_client_run
    assert out["tables"] == ["prio", "queue", "sig", "structured", "uniform"]
    assert out["sig_signature"] == [[k, repr(v)] for k, v in sorted(_SIGNATURE.items())]
    assert out["queue_max_size"] == 100
    assert out["prio_sampler"] == "prioritized {\n  priority_exponent: 1\n}"
    assert out["queue_rate_limiter"] == [100.0, 1]


def test_reverb_trajectory_writer_and_dataset(reverb_client_run, our_server):
    out = reverb_client_run
    assert out["counts_after_writer"] == [8, 16, 1]
    # The other specs: {"pair": (obs[-2:], act[-1])} and [tag[-1], obs[-1]] (40 draws see both).
    assert out["uniform_shapes"] == ["[[2, 2], []]", "[[], [2]]"]
    for i in range(3):
        keys = out[f"ds/{i}/key"]
        assert keys.shape == (4,)
        np.testing.assert_allclose(out[f"ds/{i}/probability"], 1 / 8)
        np.testing.assert_array_equal(out[f"ds/{i}/table_size"], 8)
        for j, key in enumerate(keys):
            # Flattened signature order: act, obs, tag.
            act, obs, tag = _item_columns(our_server, "sig", key)
            np.testing.assert_array_equal(out[f"ds/{i}/obs"][j], obs)
            np.testing.assert_array_equal(out[f"ds/{i}/act"][j], act)
            assert [v.encode() for v in out[f"ds/{i}/tag"][j]] == list(tag)
            t = int(act)
            np.testing.assert_array_equal(obs, np.stack([_step(s)["obs"] for s in (t - 2, t - 1, t)]))


def test_reverb_structured_writer(reverb_client_run, our_server):
    out = reverb_client_run
    for i in range(4):
        t = 2 * i + 1  # the condition keeps odd steps
        act, obs = out[f"structured/{i}/data"]
        assert act == t
        assert obs == [_step(t - 1)["obs"].tolist(), _step(t)["obs"].tolist()]


def test_reverb_insert_and_sample(reverb_client_run):
    out = reverb_client_run
    for i in range(3):
        assert out[f"queue/{i}/probability"] == 1.0
        np.testing.assert_array_equal(out[f"queue/{i}/obs"], _step(i)["obs"])
        assert int(out[f"queue/{i}/act"]) == i and out[f"queue/{i}/tag"] == f"t{i}"
    assert len({out[f"queue/{i}/key"] for i in range(3)}) == 3


def test_reverb_priorities(reverb_client_run, our_server):
    out = reverb_client_run
    keys = out["prio/keys"]
    assert len(keys) == 4
    assert out["prio/after"] == [[keys[0], 1.0, 5.0]] * 10
    assert out["prio/size_after_delete"] == 1


def test_reverb_rate_limiter_timeout_ends_dataset(reverb_client_run):
    assert reverb_client_run["timeout_dataset"] == 0


def test_reverb_reset_and_checkpoint(reverb_client_run, our_server):
    out = reverb_client_run
    assert out["uniform_after_reset"] == [0, 0]
    path = out["checkpoint_path"]
    assert os.path.isdir(path) and os.path.dirname(path) == our_server.checkpointer.root


# --- our client against a dm-reverb server ---

_REVERB_SERVER = r'''
import json, sys
import numpy as np, tensorflow as tf, reverb
signature = {"obs": tf.TensorSpec([3, 2], tf.float32), "act": tf.TensorSpec([], tf.int64),
             "tag": tf.TensorSpec([3], tf.string)}
server = reverb.Server([
    reverb.Table("uniform", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000, reverb.rate_limiters.MinSize(1)),
    reverb.Table("prio", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 1000, reverb.rate_limiters.MinSize(1)),
    reverb.Table.queue("queue", 100),
    reverb.Table("sig", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000, reverb.rate_limiters.MinSize(1),
                 signature=signature),
    reverb.Table("structured", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 1000, reverb.rate_limiters.MinSize(1),
                 max_times_sampled=1),
], port=int(sys.argv[1]))
client = reverb.Client(f"localhost:{server.port}")
print("ready", flush=True)
for line in sys.stdin:
    command = line.split()
    if not command or command[0] == "quit":
        break
    if command[0] == "dump":  # every item of a table, read by Reverb's own client: key -> flat columns
        table, count = command[1], int(command[2])
        out = {}
        for sample in client.sample(table, count, emit_timesteps=False):
            out[str(int(sample.info.key))] = [
                [v.decode() for v in np.ravel(c)] if np.asarray(c).dtype == object else np.asarray(c).tolist()
                for c in sample.data]
        print(json.dumps(out), flush=True)
server.stop()
'''


class _ReverbServer:
    def __init__(self, peer):
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.process = peer.popen(_REVERB_SERVER, str(self.port), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        assert self._readline(120) == "ready"

    def _readline(self, timeout_s):
        ready, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        assert ready, "the dm-reverb server did not answer in time"
        return self.process.stdout.readline().strip()

    def dump(self, table, count):
        self.process.stdin.write(f"dump {table} {count}\n")
        self.process.stdin.flush()
        return {int(k): v for k, v in json.loads(self._readline(120)).items()}

    def stop(self):
        try:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            self.process.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait(10)
        finally:
            self.process.stdout.close()


@pytest.fixture(scope="module")
def reverb_server(peer):
    server = _ReverbServer(peer)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def our_client(reverb_server):
    client = reverb.Client(f"localhost:{reverb_server.port}")
    assert not isinstance(client.transport, inprocess.InProcessTransport)
    return client


def _as_lists(columns):
    return [[v.decode() for v in np.ravel(c)] if np.asarray(c).dtype == object else np.asarray(c).tolist()
            for c in columns]


def test_our_client_server_info(our_client):
    info = our_client.server_info(timeout=30)
    assert sorted(info) == ["prio", "queue", "sig", "structured", "uniform"]
    assert info["sig"].signature == _SIGNATURE
    assert info["queue"].max_size == 100 and info["queue"].max_times_sampled == 1
    assert info["prio"].sampler_options.prioritized.priority_exponent == 1.0
    assert info["queue"].rate_limiter_info.max_diff == 100.0


def test_our_trajectory_writer_and_dataset(our_client, reverb_server):
    with our_client.trajectory_writer(num_keep_alive_refs=4) as writer:
        for t in range(10):
            writer.append(_step(t))
            if t >= 2:
                h = writer.history
                writer.create_item("sig", 1.0, {"obs": h["obs"][-3:], "act": h["act"][-1], "tag": h["tag"][-3:]})
                writer.create_item("uniform", 1.0, {"pair": (h["obs"][-2:], h["act"][-1])})
        writer.end_episode()
    info = our_client.server_info()
    assert (info["sig"].current_size, info["uniform"].current_size, info["sig"].num_episodes) == (8, 8, 1)

    # Asking for rl-data-tf's stacked samples: a Reverb server ignores the request field and sends entries.
    dataset = reverb.TrajectoryDataset.from_table_signature(
        f"localhost:{reverb_server.port}", "sig", max_in_flight_samples_per_worker=8, stacked_samples=True)
    batches = list(dataset.batch(4).take(3))
    reference = reverb_server.dump("sig", 200)  # Reverb's own client, keyed by item key
    assert len(reference) == 8
    for batch in batches:
        np.testing.assert_allclose(batch.info.probability.numpy(), 1 / 8)
        np.testing.assert_array_equal(batch.info.table_size.numpy(), 8)
        for j, key in enumerate(batch.info.key.numpy()):
            act, obs, tag = reference[int(key)]
            assert batch.data["act"][j].numpy() == act
            np.testing.assert_array_equal(batch.data["obs"][j].numpy(), np.array(obs, np.float32))
            assert [v.decode() for v in batch.data["tag"][j].numpy()] == tag
            t = act
            np.testing.assert_array_equal(obs, np.stack([_step(s)["obs"] for s in (t - 2, t - 1, t)]))
    pair = reverb_server.dump("uniform", 200)
    assert sorted(v[1] for v in pair.values()) == list(range(2, 10))


def test_our_insert_sample_and_priorities(our_client, reverb_server):
    for t in range(3):
        our_client.insert(_step(t), priorities={"queue": 1.0})
    for t, [timestep] in enumerate(our_client.sample("queue", 3)):
        assert timestep.info.probability == 1.0 and timestep.info.table_size == 3 - t
        assert int(timestep.data[0]) == t
        np.testing.assert_array_equal(timestep.data[1], _step(t)["obs"])
        assert timestep.data[2] == f"t{t}".encode()

    for t in range(4):
        our_client.insert(_step(t), priorities={"prio": float(t + 1)})
    samples = list(our_client.sample("prio", 60, emit_timesteps=False))
    by_key = {int(s.info.key): s for s in samples}
    assert len(by_key) == 4
    for sample in by_key.values():
        t = int(sample.data[0][0])
        assert sample.info.priority == t + 1
        assert sample.info.probability == pytest.approx((t + 1) / 10)
    keys = sorted(by_key)
    our_client.mutate_priorities("prio", updates={**{k: 0.0 for k in keys[1:]}, keys[0]: 5.0})
    for sample in our_client.sample("prio", 10, emit_timesteps=False):
        assert (int(sample.info.key), sample.info.probability, sample.info.priority) == (keys[0], 1.0, 5.0)
    our_client.mutate_priorities("prio", deletes=keys[1:])
    assert our_client.server_info()["prio"].current_size == 1
    reference = reverb_server.dump("prio", 5)
    assert list(reference) == [keys[0]]
    assert reference[keys[0]] == _as_lists(by_key[keys[0]].data)


def test_our_structured_writer(our_client, reverb_server):
    sw = pytest.importorskip("replay_tf.structured_writer")
    step_spec = {"obs": tf.TensorSpec([2], tf.float32), "act": tf.TensorSpec([], tf.int64),
                 "tag": tf.TensorSpec([], tf.string)}
    ref = sw.create_reference_step(step_spec)
    configs = [sw.create_config({"obs": ref["obs"][-2:], "act": ref["act"][-1]}, table="structured",
                                conditions=[sw.Condition.step_index() % 2 == 1])]
    writer = our_client.structured_writer(configs)
    for t in range(8):
        writer.append(_step(t))
    writer.flush()
    reference = reverb_server.dump("structured", 4)
    for i, (act, obs) in enumerate(reference.values()):
        t = 2 * i + 1
        assert act == t and obs == [_step(t - 1)["obs"].tolist(), _step(t)["obs"].tolist()]


def test_our_rate_limiter_timeout_ends_dataset(our_client, reverb_server):
    dataset = reverb.TrajectoryDataset(f"localhost:{reverb_server.port}", "structured",
                                       dtypes=(tf.int64, tf.float32),
                                       shapes=(tf.TensorShape([]), tf.TensorShape([2, 2])),
                                       max_in_flight_samples_per_worker=4, rate_limiter_timeout_ms=100)
    assert list(dataset) == []


def test_our_reset_and_checkpoint(our_client):
    our_client.reset("uniform")
    info = our_client.server_info()["uniform"]
    assert info.current_size == 0 and info.rate_limiter_info.insert_stats.completed == 0
    path = our_client.checkpoint()
    assert path.startswith(tempfile.gettempdir())
