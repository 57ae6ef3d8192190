"""Hostile or careless input to buffers, tables, servers and clients: refused clearly, never left broken."""
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.core import selectors

FLOAT32_MAX = float(np.finfo(np.float32).max)


# --- priorities whose sums would overflow ---

def _buffer(alpha=1.0, batch_size=1, max_length=4, adds=2):
    rb = reverb.PrioritizedReplayBuffer(tf.TensorSpec([], tf.float32), batch_size, max_length, alpha=alpha)
    for t in range(adds):
        rb.add_batch(tf.fill([batch_size], float(t)))
    return rb


@pytest.mark.parametrize("graph", [False, True])
@pytest.mark.parametrize("alpha, priority", [
    (1.0, 3e38),          # finite in float32, but two of them sum to inf
    (2.0, 1e20),          # finite priority, its power overflows float32
    (1.0, FLOAT32_MAX / (2 * 4) * 1.01),  # just above the bound for capacity 4
])
def test_buffer_refuses_priorities_that_could_overflow_the_tree(graph, alpha, priority):
    rb = _buffer(alpha=alpha)
    update = rb.update_priorities
    if graph:  # the graph path asserts inside the function (the eager path runs one XLA program)
        update = tf.function(lambda ids, priorities: [rb.update_priorities(ids, priorities)] and None)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"priority\*\*alpha <= 4\.25353e\+37 \(float32 max "
                                                             r"/ \(2 \* capacity\)"):
        update(tf.constant([0], tf.int64), tf.constant([priority], tf.float32))
    # Nothing was written: new items still get priority 1 and sampling keeps working.
    rb.add_batch(tf.constant([2.0]))
    rb.add_batch(tf.constant([3.0]))
    _, info = rb.get_next(sample_batch_size=8)
    np.testing.assert_allclose(info.probabilities.numpy(), 0.25)


def test_buffer_at_the_bound_keeps_sampling_for_ever():
    # capacity 4: the bound is float32 max / 8; four items at the bound sum to half of float32's max.
    bound = FLOAT32_MAX / 8
    rb = _buffer(adds=2)
    rb.update_priorities(tf.constant([0, 1], tf.int64), tf.constant([bound, bound], tf.float32))
    rb.add_batch(tf.constant([2.0]))   # new items inherit the max priority
    rb.add_batch(tf.constant([3.0]))
    _, info = rb.get_next(sample_batch_size=16)
    np.testing.assert_allclose(info.probabilities.numpy(), 0.25, rtol=1e-5)
    assert np.all(np.isfinite(info.importance_weights.numpy()))


def _table(max_size=100, exponent=1.0, remover=None):
    return reverb.Table("t", reverb.selectors.Prioritized(exponent), remover or reverb.selectors.Fifo(), max_size,
                        reverb.rate_limiters.MinSize(1))


@pytest.mark.parametrize("exponent, priority, max_size", [
    (1.0, 1e308, 100),
    (1.0, sys.float_info.max / (2 * 3) * 1.001, 2),   # just above the bound for 2 + 1 items
    (2.0, 1e200, 100),                                # the power overflows float64
    (-1.0, 1e-320, 100),                              # a negative exponent makes a tiny priority huge
])
def test_server_refuses_priorities_that_could_overflow_the_total(exponent, priority, max_size):
    server = reverb.Server([_table(max_size=max_size, exponent=exponent)])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert(np.float32(0), {"t": 1.0})
        client.insert(np.float32(1), {"t": 1.0})
        keys = sorted({s[0].info.key for s in client.sample("t", num_samples=20)})
        message = (rf"priority \({re.escape(str(priority))}\) of item {keys[0]} is too large for table 't': its "
                   rf"weight priority \*\* {exponent} must be <= ")
        with pytest.raises(ValueError, match=message):
            client.mutate_priorities("t", {keys[0]: priority})
        with pytest.raises(ValueError, match="is too large"):
            client.insert(np.float32(2), {"t": priority})
        # The table is unchanged: two items, equal probabilities.
        samples = [s[0].info for s in client.sample("t", num_samples=20)]
        assert {s.key for s in samples} == set(keys) and {s.probability for s in samples} == {0.5}
        assert {s.priority for s in samples} == {1.0}
    finally:
        server.stop()


def test_server_at_the_bound_reports_finite_probabilities():
    table = _table(max_size=2)
    bound = selectors.max_weight(3)
    assert bound == sys.float_info.max / 6
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert(np.float32(0), {"t": bound})
        client.insert(np.float32(1), {"t": bound})
        client.insert(np.float32(2), {"t": bound})   # three items for a moment, then Fifo removes one
        samples = [s[0].info for s in client.sample("t", num_samples=50)]
        assert len({s.key for s in samples}) == 2
        np.testing.assert_allclose([s.probability for s in samples], 0.5)
    finally:
        server.stop()
