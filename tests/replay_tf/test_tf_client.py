"""Reverb's `TFClient` (client calls as TensorFlow ops): the same scenarios run by dm-reverb 0.14 and by
replay_tf, eagerly and in `tf.function`."""
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
import reverb_testlib

_SETUP = """
server = reverb.Server([reverb.Table.queue("q", 100),
                        reverb.Table("p", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 100,
                                     reverb.rate_limiters.MinSize(1))])
client = reverb.Client(f"localhost:{server.port}")
tf_client = reverb.TFClient(f"localhost:{server.port}")
def listed(sample):
    info = sample.info
    return {"info": [type(v).__name__ if not hasattr(v, "dtype") else v.dtype.name for v in info],
            "priority": float(info.priority), "times_sampled": int(info.times_sampled),
            "table_size": int(info.table_size),
            "data": tf.nest.map_structure(lambda t: [t.dtype.name, t.numpy().tolist()], sample.data)}
"""

SCENARIOS = {
    "insert_and_sample_eagerly": _SETUP + """
data = [tf.constant([1, 2], tf.int32), tf.constant(3.5, tf.float64)]
result = tf_client.insert(data, tf.constant(["q", "p", "q"]), tf.constant([1.0, 2.0, 3.0], tf.float64))
emit("insert_result", repr(result))
emit("sizes", [client.server_info()[t].current_size for t in ("q", "p")])
sample = tf_client.sample("q", {"a": tf.int32, "b": tf.float64})
emit("q", listed(sample))
emit("p", listed(tf_client.sample("p", [tf.int32, tf.float64])))
""",
    "in_tf_function": _SETUP + """
@tf.function
def step(i):
    tf_client.insert([tf.fill([3], i), tf.cast(i, tf.float32)], tf.constant(["q"]),
                     tf.constant([1.0], tf.float64))
    return tf_client.sample("q", (tf.int64, tf.float32))
emit("first", listed(step(tf.constant(4, tf.int64))))
emit("second", listed(step(tf.constant(5, tf.int64))))
""",
    "update_priorities": _SETUP + """
for i in range(3):
    client.insert(np.int32(i), {"p": 1.0})
keys = {int(s.data[0][0]): s.info.key for s in client.sample("p", 100, emit_timesteps=False)}
tf_client.update_priorities("p", tf.constant([keys[1], 12345], tf.uint64), tf.constant([0.5, 9.0], tf.float64))
@tf.function
def update(key, priority):
    tf_client.update_priorities("p", key, priority)
update(tf.constant([keys[2]], tf.uint64), tf.constant([4.0], tf.float64))
info = {int(s.data[0][0]): float(s.info.priority) for s in client.sample("p", 300, emit_timesteps=False)}
emit("priorities", sorted(info.items()))
""",
    # An item's first timestep, as dm-reverb's op returns it; an item of squeezed columns whole.
    "first_timestep": _SETUP + """
with client.writer(3) as writer:
    for i in range(3):
        writer.append([np.int32(i), np.float32(i)])
    writer.create_item("q", 3, 1.0)
    writer.create_item("q", 1, 1.0)
with client.trajectory_writer(2) as writer:
    for i in range(2):
        writer.append({"a": np.int32(10 + i)})
    writer.create_item("q", 1.0, {"a": writer.history["a"][-2:]})
    writer.create_item("q", 1.0, {"a": writer.history["a"][-1]})
emit("legacy", [listed(tf_client.sample("q", [tf.int32, tf.float32]))["data"] for _ in range(2)])
emit("trajectory", [listed(tf_client.sample("q", {"a": tf.int32}))["data"] for _ in range(2)])
client.insert([np.int32(1)], {"q": 1.0})
try:
    tf_client.sample("q", [tf.float32])
except tf.errors.InvalidArgumentError as e:
    emit("wrong_dtype", "an InvalidArgumentError")
""",
    # Items of squeezed (vector) columns come back whole; columns of other lengths cannot be split.
    "squeezed_and_ragged_items": _SETUP + """
with client.trajectory_writer(3) as writer:
    for i in range(3):
        writer.append({"a": np.arange(3, dtype=np.int32) + i, "b": np.float32(i)})
    writer.create_item("q", 1.0, {"a": writer.history["a"][-1], "b": writer.history["b"][-1]})
    writer.create_item("q", 1.0, {"a": writer.history["a"][-2:], "b": writer.history["b"][-3:]})
    writer.create_item("q", 1.0, {"a": writer.history["a"][-2:], "b": writer.history["b"][-1]})
emit("squeezed", listed(tf_client.sample("q", {"a": tf.int32, "b": tf.float32}))["data"])
for name in ("ragged", "mixed"):
    try:
        tf_client.sample("q", {"a": tf.int32, "b": tf.float32})
        emit(name, "no error")
    except tf.errors.InvalidArgumentError:
        emit(name, "an InvalidArgumentError")
""",
    # Op errors, eagerly: an unknown table, keys and priorities of other shapes.
    "op_errors": _SETUP + """
for name, call in [
        ("sample", lambda: tf_client.sample("nope", [tf.int32])),
        ("update", lambda: tf_client.update_priorities("nope", tf.constant([1], tf.uint64),
                                                       tf.constant([1.0], tf.float64))),
        ("insert", lambda: tf_client.insert([tf.constant(1)], tf.constant(["nope"]), tf.constant([1.0], tf.float64))),
        ("shapes", lambda: tf_client.update_priorities("p", tf.constant([[1, 2]], tf.uint64),
                                                       tf.constant([1.0, 2.0], tf.float64)))]:
    try:
        call()
        emit(name, "no error")
    except tf.errors.OpError as e:
        emit(name, [c.__name__ for c in type(e).__mro__ if c.__module__.startswith("tensorflow")][0])
""",
    "argument_errors": _SETUP + """
for tables, priorities in [(tf.constant("q"), tf.constant([1.0], tf.float64)),
                           (tf.constant(["q"]), tf.constant([1.0], tf.float32)),
                           (tf.constant(["q", "p"]), tf.constant([1.0], tf.float64))]:
    try:
        tf_client.insert([tf.constant(1)], tables, priorities)
    except ValueError as e:
        emit(f"{tables.shape}/{priorities.dtype.name}/{priorities.shape}", str(e))
""",
}

peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios_ran_without_errors(local_results):
    # (compared with dm-reverb by test_matches_reverb; this keeps them meaningful without the peer)
    assert not [k for k in local_results if k.endswith(".error")], local_results
    assert local_results["update_priorities.priorities"] == [[0, 1.0], [1, 0.5], [2, 4.0]]
    assert local_results["insert_and_sample_eagerly.q"]["data"] == {"a": ["int32", [1, 2]], "b": ["float64", 3.5]}


def test_sample_names_a_dtype_that_does_not_match():
    server = reverb.Server([reverb.Table.queue("q", 10)])
    client = reverb.Client(f"localhost:{server.port}")
    client.insert([np.int32(1)], {"q": 1.0})
    client.insert([np.int32(1)], {"q": 1.0})
    client.insert([np.int32(1)], {"q": 1.0})
    tf_client = reverb.TFClient(f"localhost:{server.port}")
    with pytest.raises(tf.errors.InvalidArgumentError, match="column 0 of dtype int32, but data_dtypes expects float32"):
        tf_client.sample("q", [tf.float32])
    with pytest.raises(tf.errors.InvalidArgumentError, match="has 1 columns, but data_dtypes has 2"):
        tf_client.sample("q", [tf.int32, tf.int32])

    @tf.function
    def sample():
        return tf_client.sample("q", [tf.float32])

    # (dm-reverb's kernel fails TensorFlow's output type check in a graph: InternalError)
    with pytest.raises(tf.errors.InternalError, match="Output 0 of type int32 does not match declared output type "
                                                      "float"):
        sample()
    server.stop()
