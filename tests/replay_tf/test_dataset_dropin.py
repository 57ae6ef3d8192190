"""Drop-in details of `TrajectoryDataset`, `TimestepDataset` and `TFClient`, against dm-reverb 0.14: string
tensors as server address and table (eagerly, in `tf.function`, in TF1 graphs, and table names known only
when run), `max_samples` shared by several workers, TF1 graph iteration of these v1 datasets, and the
messages of dtype/shape mismatches."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
import reverb_testlib

_SETUP = """
server = reverb.Server([reverb.Table.queue("q", 100),
                        reverb.Table("dist", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100,
                                     reverb.rate_limiters.MinSize(1))])
address = f"localhost:{server.port}"
client = reverb.Client(address)
for i in range(10):
    client.insert([np.int64(i)], {"q": 1.0, "dist": 1.0})
trajectory = dict(dtypes=(tf.int64,), shapes=(tf.TensorShape([1]),), max_in_flight_samples_per_worker=1)
timestep = dict(dtypes=(tf.int64,), shapes=(tf.TensorShape([]),), max_in_flight_samples_per_worker=1)
def values(dataset):
    return [np.asarray(s.data[0]).tolist() for s in dataset]
"""

# The text Reverb's kernels write for a sampled tensor the dataset cannot yield (ours appends its detail).
_MISMATCH = r"""
import re
def mismatch(make):
    try:
        values(make())
        return "nothing raised"
    except Exception as e:
        found = re.search(r"Received incompatible tensor .*?Tensor has \(dtype, shape\): \([^)]*\)\."
                          r"|Inconsistent number of tensors received .*? shows \d+ tensors\.", str(e))
        return [type(e).__name__, found.group(0) if found else str(e)]
"""

SCENARIOS = {
    "string_tensors_eagerly": _SETUP + """
emit("trajectory", values(reverb.TrajectoryDataset(tf.constant(address), tf.constant("q"), max_samples=2,
                                                   **trajectory)))
emit("timestep", values(reverb.TimestepDataset(tf.constant(address), tf.constant("q"), max_samples=2,
                                               **timestep)))
emit("left", int(client.server_info()["q"].current_size))
""",
    "string_tensors_in_tf_function": _SETUP + """
@tf.function
def constant_names():
    dataset = reverb.TrajectoryDataset(tf.constant(address), tf.constant("q"), max_samples=2, **trajectory)
    return dataset.reduce(tf.constant(0, tf.int64), lambda total, s: total + s.data[0][0])
@tf.function
def table_argument(table):
    dataset = reverb.TimestepDataset(address, table, max_samples=3, **timestep)
    return dataset.reduce(tf.constant(0, tf.int64), lambda total, s: total + s.data[0])
emit("constant_names", int(constant_names()))  # items 0 + 1
emit("table_argument", int(table_argument(tf.constant("q"))))  # items 2 + 3 + 4
@tf.function
def address_argument(server_address):
    dataset = reverb.TrajectoryDataset(server_address, "q", max_samples=1, **trajectory)
    return dataset.reduce(tf.constant(0, tf.int64), lambda total, s: total + s.data[0][0])
emit("address_argument", int(address_argument(tf.constant(address))))  # item 5
emit("left", int(client.server_info()["q"].current_size))
""",
    "tf1_graph_iterators": _SETUP + """
with tf.Graph().as_default():
    one_shot = reverb.TrajectoryDataset(tf.constant(address), tf.constant("q"), max_samples=2, **trajectory)
    emit("is_v1", [isinstance(one_shot, tf.compat.v1.data.Dataset)])
    next_one = tf.compat.v1.data.make_one_shot_iterator(one_shot).get_next()
    batched = reverb.TrajectoryDataset(address, "q", max_samples=4, **trajectory).batch(2)
    emit("batched_is_v1", isinstance(batched, tf.compat.v1.data.Dataset))
    next_batch = batched.make_one_shot_iterator().get_next()
    table = tf.compat.v1.placeholder(tf.string, [])
    fed = reverb.TimestepDataset(address, table, max_samples=2, **timestep)
    fed_iterator = fed.make_initializable_iterator()
    next_fed = fed_iterator.get_next()
    mapped = reverb.TimestepDataset(address, "q", max_samples=2, **timestep).batch(2).map(lambda s: s.data[0] * 10)
    next_mapped = mapped.make_one_shot_iterator().get_next()
    with tf.compat.v1.Session() as session:
        emit("one_shot", [session.run(next_one.data[0]).tolist() for _ in range(2)])
        try:
            session.run(next_one)
            emit("one_shot_end", "no end")
        except tf.errors.OutOfRangeError:
            emit("one_shot_end", "OutOfRangeError")
        emit("batched", [session.run(next_batch.data[0]).tolist() for _ in range(2)])
        session.run(fed_iterator.initializer, feed_dict={table: "q"})
        emit("fed", [session.run(next_fed.data[0]).tolist() for _ in range(2)])
        emit("mapped", session.run(next_mapped).tolist())
emit("left", int(client.server_info()["q"].current_size))
""",
    "max_samples_shared_by_workers": _SETUP + """
for i in range(10, 40):
    client.insert([np.int64(i)], {"q": 1.0})
for workers in (2, 3):
    dataset = reverb.TrajectoryDataset(address, "q", dtypes=(tf.int64,), shapes=(tf.TensorShape([1]),),
                                       max_in_flight_samples_per_worker=2, num_workers_per_iterator=workers,
                                       max_samples=4, rate_limiter_timeout_ms=1000)
    emit(f"trajectory_{workers}", sorted(v[0] for v in values(dataset)))
    emit(f"trajectory_{workers}_left", int(client.server_info()["q"].current_size))
    dataset = reverb.TimestepDataset(address, "q", dtypes=(tf.int64,), shapes=(tf.TensorShape([]),),
                                     max_in_flight_samples_per_worker=2, num_workers_per_iterator=workers,
                                     max_samples=3, rate_limiter_timeout_ms=1000)
    emit(f"timestep_{workers}", sorted(values(dataset)))
    emit(f"timestep_{workers}_left", int(client.server_info()["q"].current_size))
""",
    "mismatch_messages": _SETUP + _MISMATCH + """
server = reverb.Server([reverb.Table.queue("m", 100)])
address = f"localhost:{server.port}"
client = reverb.Client(address)
with client.writer(2) as writer:
    for t in range(2):
        writer.append({"a": np.array([t, t], np.int32), "b": np.float64(t)})
    writer.create_item("m", 2, 1.0)
def timesteps(dtypes, shapes):
    return lambda: reverb.TimestepDataset(address, "m", dtypes, shapes, 1, max_samples=1)
def trajectories(dtypes, shapes):
    return lambda: reverb.TrajectoryDataset(address, "m", dtypes, shapes, 1, max_samples=1)
def insert():  # an item of one timestep: columns a [1, 2] int32, b [1] float64
    client.insert({"a": np.array([5, 5], np.int32), "b": np.float64(0.5)}, {"m": 1.0})
def shapes(a, b):
    return {"a": tf.TensorShape(a), "b": tf.TensorShape(b)}
emit("timestep_dtype", mismatch(timesteps({"a": tf.int64, "b": tf.float64}, shapes([2], []))))
insert()
emit("timestep_shape", mismatch(timesteps({"a": tf.int32, "b": tf.float64}, shapes([3], []))))
insert()
emit("timestep_float", mismatch(timesteps({"a": tf.int32, "b": tf.float32}, shapes([2], []))))
insert()
emit("trajectory_shape", mismatch(trajectories({"a": tf.int32, "b": tf.float64}, shapes([1, 3], [1]))))
insert()
emit("trajectory_dtype", mismatch(trajectories({"a": tf.int32, "b": tf.float32}, shapes([1, 2], [1]))))
insert()
emit("trajectory_count", mismatch(trajectories((tf.int32,), (tf.TensorShape([1, 2]),))))
insert()
emit("timestep_count", mismatch(timesteps((tf.int32, tf.float64, tf.int32),
                                          (tf.TensorShape([2]), tf.TensorShape([]), tf.TensorShape([2])))))
emit("left", int(client.server_info()["m"].current_size))
""",
    "tf_client_string_tensors": _SETUP + """
tf_client = reverb.TFClient(address)
sample = tf_client.sample(tf.constant("dist"), [tf.int64])
emit("sampled", [sample.info.key.dtype.name, sample.data[0].numpy().tolist()])
tf_client.update_priorities(table=tf.constant("dist"), keys=tf.reshape(sample.info.key, [1]),
                            priorities=tf.constant([4.0], tf.float64))
@tf.function
def sample_from(table):
    return tf_client.sample(table, [tf.int64])
again = sample_from(tf.constant("dist"))
emit("again", [again.data[0].numpy().tolist(), float(again.info.priority)])
""",
    "tf_client_dtype_mismatch_eagerly": _SETUP + """
import re
tf_client = reverb.TFClient(address)
try:
    tf_client.sample("dist", [tf.float32])
    emit("raised", "nothing")
except Exception as e:
    emit("raised", [isinstance(e, tf.errors.InvalidArgumentError),
                    re.search(r"Type mismatch: actual \\w+ vs\\. expect \\w+", str(e)).group(0)])
try:
    tf_client.sample("dist", [tf.int64, tf.int64])
    emit("count", "nothing")
except Exception as e:
    emit("count", [isinstance(e, tf.errors.InvalidArgumentError),
                   re.search(r"Number of tensors in the replay sample did not match the expected count\\. "
                             r"Got \\d+ but wanted \\d+", str(e)).group(0)])
""",
    "tf_client_dtype_mismatch_in_graphs": _SETUP + """
import re
tf_client = reverb.TFClient(address)
def failure(run):
    try:
        run()
        return "nothing raised"
    except Exception as e:  # (Reverb's output index counts the info tensors; the dtypes are compared)
        found = re.search(r"Output \\d+ of type (\\w+) does not match declared output type (\\w+)", str(e))
        return [type(e).__name__, *(found.groups() if found else [str(e)])]
for dtype in (tf.float32, tf.string, tf.int32):
    emit(f"tf_function_{dtype.name}", failure(tf.function(lambda: tf_client.sample("dist", [dtype]))))
with tf.Graph().as_default():
    sample = reverb.TFClient(address).sample(tf.constant("dist"), [tf.float64])
    with tf.compat.v1.Session() as session:
        emit("session", failure(lambda: session.run(sample.data)))
        emit("session_right_dtype", session.run(reverb.TFClient(address).sample("dist", [tf.int64]).data[0]).tolist())
""",
}

peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios(local_results):
    # (compared with dm-reverb by test_matches_reverb; these are the values worked out by hand)
    assert not [k for k in local_results if k.endswith(".error")], local_results
    assert local_results["string_tensors_eagerly.trajectory"] == [[0], [1]]
    assert local_results["string_tensors_eagerly.timestep"] == [2, 3]
    assert local_results["string_tensors_in_tf_function.table_argument"] == 2 + 3 + 4
    assert local_results["string_tensors_in_tf_function.address_argument"] == 5
    assert local_results["string_tensors_in_tf_function.left"] == 4
    assert local_results["tf1_graph_iterators.batched"] == [[[2], [3]], [[4], [5]]]
    assert local_results["tf1_graph_iterators.fed"] == [6, 7]
    assert local_results["tf1_graph_iterators.mapped"] == [80, 90]
    assert local_results["tf1_graph_iterators.left"] == 0
    # Each dataset takes exactly max_samples items from the 40 queued, whatever the number of workers.
    assert [local_results[f"max_samples_shared_by_workers.{k}"] for k in (
        "trajectory_2_left", "timestep_2_left", "trajectory_3_left", "timestep_3_left")] == [36, 33, 29, 26]
    assert local_results["max_samples_shared_by_workers.timestep_3"] == [11, 12, 13]
    assert local_results["mismatch_messages.timestep_shape"] == [
        "InvalidArgumentError", "Received incompatible tensor at flattened index 0 from table 'm'.  Specification "
        "has (dtype, shape): (int32, [3]).  Tensor has (dtype, shape): (int32, [2])."]
    assert local_results["mismatch_messages.trajectory_count"] == [
        "InvalidArgumentError", "Inconsistent number of tensors received from table 'm'.  Specification has 1 "
        "tensors, but data coming from the table shows 2 tensors."]
    assert local_results["tf_client_string_tensors.again"] == [0, 4.0]
    assert local_results["tf_client_dtype_mismatch_in_graphs.tf_function_float32"] == [
        "InternalError", "int64", "float"]
    assert local_results["tf_client_dtype_mismatch_in_graphs.session"] == ["InternalError", "int64", "double"]
    assert local_results["tf_client_dtype_mismatch_eagerly.raised"] == [
        True, "Type mismatch: actual int64 vs. expect float"]


@pytest.fixture(name="server")
def server_fixture():
    server = reverb.Server([reverb.Table.queue("q", 100), reverb.Table.queue("p", 100)])
    yield server
    server.stop()


def test_dynamic_table_of_no_table_names_it_when_run(server):
    # dm-reverb raises NotFoundError; a Python function in a tf.data pipeline can only raise what TensorFlow
    # maps Python exceptions to (InvalidArgumentError for a ValueError).
    @tf.function
    def total(table):
        dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", table, dtypes=(tf.int64,),
                                           shapes=(tf.TensorShape([1]),), max_in_flight_samples_per_worker=1,
                                           max_samples=1)
        return dataset.reduce(tf.constant(0, tf.int64), lambda t, s: t + s.data[0][0])

    with pytest.raises(tf.errors.InvalidArgumentError, match="Priority table nope was not found"):
        total(tf.constant("nope"))
    reverb.Client(f"localhost:{server.port}").insert([np.int64(7)], {"p": 1.0})
    assert int(total(tf.constant("p"))) == 7


@pytest.mark.parametrize("table, error", [
    (tf.constant(["q"]), "scalar string tensor"), (tf.constant(1), "scalar string tensor"), (1, "got 1")])
def test_table_that_is_no_string_or_scalar_is_refused(server, table, error):
    with pytest.raises(TypeError, match=error):
        reverb.TrajectoryDataset(f"localhost:{server.port}", table, dtypes=(tf.int64,), shapes=(tf.TensorShape([1]),),
                                 max_in_flight_samples_per_worker=1)


def test_tf_client_dtype_mismatch_is_internal_and_invalid_argument_eagerly(server):
    # dm-reverb raises InvalidArgumentError eagerly and InternalError in a graph; eagerly ours is both.
    client = reverb.Client(f"localhost:{server.port}")
    for _ in range(2):
        client.insert([np.int64(1)], {"q": 1.0})
    tf_client = reverb.TFClient(f"localhost:{server.port}")
    with pytest.raises(tf.errors.InternalError, match="Type mismatch: actual int64 vs. expect float"):
        tf_client.sample("q", [tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError, match="Type mismatch: actual int64 vs. expect double"):
        tf_client.sample(tf.constant("q"), [tf.float64])


_GRAPH_CONSTRUCTION = """
import sys
import tensorflow as tf
if sys.argv[1] == "reverb":
    import reverb
else:
    import replay_tf as reverb
with tf.Graph().as_default():
    trajectories = reverb.TrajectoryDataset(tf.constant("localhost:1"), tf.constant("q"), dtypes=(tf.int64,),
                                            shapes=(tf.TensorShape([1]),), max_in_flight_samples_per_worker=1)
    batches = trajectories.batch(2)
    timesteps = reverb.TimestepDataset("localhost:1", "q", dtypes=(tf.int64,), shapes=(tf.TensorShape([]),),
                                       max_in_flight_samples_per_worker=1).batch(2).prefetch(1)
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
print(len(tf.config.list_logical_devices("CPU")))
"""


def _graph_construction_devices(python: str, package: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" or package == "replay_tf"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.run([python, "-c", textwrap.dedent(_GRAPH_CONSTRUCTION), package], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_building_datasets_in_a_graph_leaves_the_runtime_uninitialized():
    # Virtual devices can only be configured before the runtime starts: building a dataset (and batching and
    # prefetching it) in a TF1 graph must not start it.
    assert _graph_construction_devices(sys.executable, "replay_tf") == "2"


@pytest.mark.slow
@pytest.mark.peer
def test_building_reverb_datasets_in_a_graph_leaves_the_runtime_uninitialized(peer):
    assert _graph_construction_devices(peer.python, "reverb") == "2"


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_lazy_batches_in_a_graph_have_the_specs_of_eager_ones(server, drop_remainder):
    address = f"localhost:{server.port}"

    def datasets():
        return [reverb.TimestepDataset(address, "q", dtypes={"a": tf.int64, "b": tf.string},
                                       shapes={"a": tf.TensorShape([2]), "b": tf.TensorShape([])},
                                       max_in_flight_samples_per_worker=1),
                reverb.TrajectoryDataset(address, "q", dtypes=(tf.float32,), shapes=(tf.TensorShape([3, 2]),),
                                         max_in_flight_samples_per_worker=1)]

    eager = [d.batch(4, drop_remainder=drop_remainder).prefetch(2).element_spec for d in datasets()]
    with tf.Graph().as_default():
        lazy = [d.batch(4, drop_remainder=drop_remainder).prefetch(2) for d in datasets()]
        assert [d.element_spec for d in lazy] == eager
        # (what the iterator yields: the built pipeline's structure, shapes and dtypes)
        built = [tf.compat.v1.data.make_initializable_iterator(d).element_spec for d in lazy]
        assert built == eager
    assert eager[0].data["a"].shape.as_list() == [4 if drop_remainder else None, 2]
