"""Inside a user's tf.function the ring buffers touch their storage in place: the traced `add_batch` scatters
only the new rows and the traced `get_next` gathers only the sampled rows. A dense read or a dense
assign of a storage variable would copy the whole buffer on every call."""
import collections

import pytest
import tensorflow as tf

from dataset_testlib import graph_nodes
import replay_tf

# Storage dtypes that no counter, key or priority variable of the buffers uses, so an op on a variable of
# one of them is an op on the storage.
SPEC = {"obs": tf.TensorSpec([4, 3], tf.uint8), "action": tf.TensorSpec([], tf.int16)}
STORAGE_DTYPES = {tf.uint8.as_datatype_enum, tf.int16.as_datatype_enum}
# Ops that read or write a whole variable (or a copy of it): never applied to the storage.
DENSE_OPS = {"ReadVariableOp", "AssignVariableOp", "ResourceStridedSliceAssign", "AssignAddVariableOp",
             "AssignSubVariableOp"}
BUFFERS = {
    "uniform": lambda: replay_tf.UniformReplayBuffer(SPEC, batch_size=4, max_length=5),
    "prioritized": lambda: replay_tf.PrioritizedReplayBuffer(SPEC, batch_size=4, max_length=5),
    "uniform episode-aware": lambda: replay_tf.UniformReplayBuffer(
        SPEC, batch_size=4, max_length=5, episode_end_fn=lambda items: items["action"] < 0),
}


def _storage_ops(concrete) -> collections.Counter:
    """(op type, dtype) counts of the ops on storage dtypes in a traced graph and every function it calls."""
    counts = collections.Counter()
    for node in graph_nodes(concrete.graph.as_graph_def()):
        for attr in ("dtype", "T", "Tparams"):
            if attr in node.attr and node.attr[attr].type in STORAGE_DTYPES:
                counts[node.op] += 1
    return counts


def _items():
    return {"obs": tf.ones([4, 4, 3], tf.uint8), "action": tf.ones([4], tf.int16)}


@pytest.mark.parametrize("kind", sorted(BUFFERS))
def test_traced_add_scatters_into_storage_without_dense_access(kind):
    rb = BUFFERS[kind]()

    @tf.function(autograph=False)
    def add(items):
        rb.add_batch(items)

    ops = _storage_ops(add.get_concrete_function(_items()))
    assert ops["ResourceScatterUpdate"] == len(SPEC), ops
    assert not DENSE_OPS & set(ops), f"the traced add reads or assigns whole storage variables: {ops}"


@pytest.mark.parametrize("kind", sorted(BUFFERS))
@pytest.mark.parametrize("num_steps", [None, 2])
def test_traced_get_next_gathers_from_storage_without_dense_reads(kind, num_steps):
    rb = BUFFERS[kind]()
    for _ in range(3):
        rb.add_batch(_items())

    @tf.function(autograph=False)
    def sample():
        return rb.get_next(8, num_steps)

    ops = _storage_ops(sample.get_concrete_function())
    assert ops["ResourceGather"] >= len(SPEC), ops
    assert not DENSE_OPS & set(ops), f"the traced sample reads whole storage variables: {ops}"
    data, _ = sample()
    assert data["obs"].shape[0] == 8
