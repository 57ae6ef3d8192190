"""Reverb's `TimestepDataset`: the same scenarios run by dm-reverb 0.14 and by replay_tf, timestep by
timestep, with the items' info."""
import reverb_testlib

_SETUP = """
server = reverb.Server([reverb.Table.queue("q", 100),
                        reverb.Table.queue("s", 100, signature={"a": tf.TensorSpec([2], tf.int32),
                                                                 "b": tf.TensorSpec([], tf.float32)})])
address = f"localhost:{server.port}"
client = reverb.Client(address)
def listed(element):
    info = element.info
    return {"data": tf.nest.map_structure(lambda t: [t.dtype.name, t.numpy().tolist()], element.data),
            "priority": float(info.priority), "table_size": int(info.table_size),
            "times_sampled": int(info.times_sampled), "key_dtype": info.key.dtype.name}
"""

SCENARIOS = {
    "legacy_items_split_into_timesteps": _SETUP + """
with client.writer(3) as writer:
    for i in range(3):
        writer.append({"a": np.array([i, -i], np.int32), "b": np.float32(i / 2)})
    writer.create_item("q", 3, 1.0)
    writer.create_item("q", 1, 2.0)
    writer.create_item("q", 2, 3.0)
dataset = reverb.TimestepDataset(address, "q", dtypes={"a": tf.int32, "b": tf.float32},
                                 shapes={"a": tf.TensorShape([2]), "b": tf.TensorShape([])},
                                 max_in_flight_samples_per_worker=1, max_samples=3)
emit("spec", str(dataset.element_spec.data))
emit("timesteps", [listed(e) for e in dataset])
""",
    "from_table_signature": _SETUP + """
for i in range(2):
    client.insert({"a": np.array([i, 2 * i], np.int32), "b": np.float32(i)}, {"s": 1.0})
dataset = reverb.TimestepDataset.from_table_signature(address, "s", max_in_flight_samples_per_worker=2)
emit("spec", str(dataset.element_spec.data))
emit("timesteps", [listed(e) for e in dataset.take(2)])
""",
    "batched_sequences": _SETUP + """
with client.writer(4) as writer:
    for i in range(8):
        writer.append([np.int64(i)])
        if i % 4 == 3:
            writer.create_item("q", 4, 1.0)
dataset = reverb.TimestepDataset(address, "q", dtypes=[tf.int64], shapes=[tf.TensorShape([])],
                                 max_in_flight_samples_per_worker=2, max_samples=2)
emit("batches", [b.data[0].numpy().tolist() for b in dataset.batch(4)])
""",
    # dm-reverb fails at the first element (InvalidArgumentError); an in-process server lets ours fail at
    # construction (ValueError), as TrajectoryDataset does (README "Differences").
    "signature_mismatch": _SETUP + """
client.insert({"a": np.array([1, 2], np.int32), "b": np.float32(0)}, {"s": 1.0})
try:
    dataset = reverb.TimestepDataset(address, "s", dtypes={"a": tf.int32, "b": tf.float32},
                                     shapes={"a": tf.TensorShape([3]), "b": tf.TensorShape([])},
                                     max_in_flight_samples_per_worker=1)
    next(iter(dataset))
    emit("raised", "nothing")
except (ValueError, tf.errors.InvalidArgumentError) as e:
    emit("raised", "an error naming the signature" if "signature" in str(e) else str(e))
""",
}

peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios_ran_without_errors(local_results):
    # (compared with dm-reverb by test_matches_reverb; this keeps them meaningful without the peer)
    assert not [k for k in local_results if k.endswith(".error")], local_results
    assert local_results["batched_sequences.batches"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    timesteps = local_results["legacy_items_split_into_timesteps.timesteps"]
    assert [t["data"]["a"][1] for t in timesteps] == [[0, 0], [1, -1], [2, -2], [2, -2], [1, -1], [2, -2]]
    assert [t["priority"] for t in timesteps] == [1.0, 1.0, 1.0, 2.0, 3.0, 3.0]


def test_over_grpc_and_items_that_are_not_timesteps(monkeypatch):
    import numpy as np  # noqa: PLC0415
    import pytest  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    import replay_tf as reverb  # noqa: PLC0415
    from replay_tf.grpc.client import client_transport  # noqa: PLC0415
    from replay_tf.transport import base as transport_lib  # noqa: PLC0415

    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)  # over gRPC, not in-process
    server = reverb.Server([reverb.Table.queue("q", 10)])
    address = f"localhost:{server.port}"
    client = reverb.Client(address)
    with client.writer(2) as writer:
        for i in range(2):
            writer.append([np.int32(i), np.float32(-i)])
        writer.create_item("q", 2, 1.0)
    dataset = reverb.TimestepDataset(address, "q", dtypes=[tf.int32, tf.float32], shapes=[[], []],
                                     max_in_flight_samples_per_worker=1, max_samples=1)
    assert [(int(e.data[0]), float(e.data[1])) for e in dataset] == [(0, 0.0), (1, -1.0)]
    with client.trajectory_writer(2) as writer:  # columns of 2 and 1 timesteps
        writer.append({"a": np.int32(0), "b": np.int32(0)})
        writer.append({"a": np.int32(1), "b": np.int32(1)})
        writer.create_item("q", 1.0, {"a": writer.history["a"][-2:], "b": writer.history["b"][-1:]})
    dataset = reverb.TimestepDataset(address, "q", dtypes={"a": tf.int32, "b": tf.int32}, shapes={"a": [], "b": []},
                                     max_in_flight_samples_per_worker=1, max_samples=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="same number of timesteps"):
        list(dataset)
    with client.trajectory_writer(2) as writer:  # a squeezed vector column: not 3 timesteps
        writer.append({"a": np.arange(3, dtype=np.int32)})
        writer.create_item("q", 1.0, {"a": writer.history["a"][-1]})
    dataset = reverb.TimestepDataset(address, "q", dtypes={"a": tf.int32}, shapes={"a": []},
                                     max_in_flight_samples_per_worker=1, max_samples=1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cannot be decomposed into timesteps.*squeezed"):
        list(dataset)
    server.stop()
