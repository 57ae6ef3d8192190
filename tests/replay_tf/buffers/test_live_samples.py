"""The unbatched `as_dataset()`: each sample checked against the live buffer by one cheap call per element.

The check is one tf.data function call per element; these tests pin what keeps that call cheap (it runs
on the calling thread, nothing per element goes through the default executor, no map is left for
`map_and_batch_fusion` to fuse with the caller's `.batch`). Its cost against the chunked draws alone is a
row of the buffers benchmark (`benchmarks/bench_buffers.py`), guarded by `benchmarks.compare`.
"""

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

import replay_tf
from replay_tf.buffers import _live_samples

SMALL = (tf.TensorSpec([3], tf.float32, "action"),
         (tf.TensorSpec([5], tf.float32, "lidar"), tf.TensorSpec([3, 2], tf.float32, "camera")))


def _full_small_buffer(batch_size=32, max_length=200):
    rb = replay_tf.UniformReplayBuffer(SMALL, batch_size=batch_size, max_length=max_length)
    items = tf.nest.map_structure(lambda s: tf.ones([batch_size, *s.shape], s.dtype), SMALL)
    for _ in range(max_length):
        rb.add_batch(items)
    return rb


def _graph(dataset) -> graph_pb2.GraphDef:
    graph = graph_pb2.GraphDef()
    graph.ParseFromString(tf.raw_ops.DatasetToGraphV2(input_dataset=dataset._variant_tensor).numpy())
    return graph


def _per_element_ops(graph):
    """The dataset ops after the first unbatch (the per-element stages), in order, and the output op."""
    by_name = {node.name: node for node in graph.node}
    output = next(node for node in graph.node if node.op == "_Retval")
    chain, node = [], by_name[output.input[0].split(":")[0]]
    while node.op != "UnbatchDataset" or any(n.op == "UnbatchDataset" for n in _upstream(node, by_name)):
        chain.append(node)
        node = by_name[node.input[0].split(":")[0]]
    return chain[::-1]


def _upstream(node, by_name):
    while node.input:
        node = by_name[node.input[0].split(":")[0]]
        yield node


@pytest.mark.parametrize("num_parallel_calls", [None, tf.data.AUTOTUNE])
def test_per_element_stages_run_inline_and_end_without_a_map(num_parallel_calls):
    rb = _full_small_buffer(batch_size=2, max_length=4)
    graph = _graph(rb.as_dataset(num_parallel_calls=num_parallel_calls))
    functions = {f.signature.name: f for f in graph.library.function}
    stages = _per_element_ops(graph)
    assert [n.op for n in stages] == ["MapDataset", "FilterDataset", "MapDataset", "AssertCardinalityDataset"]
    for node in stages:
        if node.op == "MapDataset":
            # The single-threaded executor: a call does not hand its ops to the inter-op pool.
            assert node.attr["use_inter_op_parallelism"].b is False
        if node.op == "FilterDataset":
            # The predicate only returns its last input (the check's bool): tf.data calls no function.
            predicate = functions[node.attr["predicate"].func.name]
            assert {n.op for n in predicate.node_def} <= {"Identity"}
    # A map last would be fused with a following `.batch(n)` into a parallel map-and-batch.
    assert stages[-1].op != "MapDataset"


def test_without_force_synchronous_the_stateful_strip_keeps_elements_live(monkeypatch):
    # TF versions without MapDataset's `force_synchronous`: the last map reads the variable instead.
    monkeypatch.setattr(_live_samples, "_MAP_HAS_FORCE_SYNCHRONOUS", False)
    batch_size, max_length = 2, 3
    rb = replay_tf.UniformReplayBuffer(tf.TensorSpec([], tf.int32, "action"), batch_size=batch_size,
                                       max_length=max_length)
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    iterator = iter(rb.as_dataset().with_options(options))
    for adds in range(1, 6):
        rb.add_batch(tf.fill([batch_size], adds - 1))
        data, info = next(iterator)
        stored = min(adds, max_length)
        assert float(info.probabilities) == pytest.approx(1 / (stored * batch_size))
        assert adds - stored <= int(info.ids) < adds and int(data) == int(info.ids)
