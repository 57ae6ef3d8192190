"""A priority far above the others, set back to a normal one (diverging TD errors, then a fix), leaves sampling
proportional to priority ** exponent: in the server's `PrioritizedDistribution` and in the in-graph
`PrioritizedReplayBuffer`'s sum tree."""
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

import replay_tf as reverb
from replay_tf.core import selectors

_DRAWS = 20_000


class _Item:
    def __init__(self, key, priority):
        self.key, self.priority = key, priority


def _assert_proportional(counts, weights, draws):
    """Chi-square goodness of fit of `counts` to `weights` (zero-weight entries must never be drawn)."""
    counts, weights = np.asarray(counts, np.float64), np.asarray(weights, np.float64)
    assert counts[weights == 0].sum() == 0, f"a priority-0 item was sampled: counts {counts.tolist()}"
    live = weights > 0
    expected = weights[live] / weights[live].sum() * draws
    _, p_value = scipy.stats.chisquare(counts[live], expected)
    assert p_value > 1e-6, f"counts {counts.tolist()} do not follow weights {weights.tolist()} (p = {p_value:.3g})"


# (priority exponent, steps: (item index, priority) set in order after inserting priorities [100, 1, 0, 5])
_SCENARIOS = [
    (1.0, [(1, 1e25), (1, 1.0)]),
    (1.0, [(1, 1e25), (0, 50.0), (3, 7.0), (1, 1.0)]),   # updates while the huge one is in
    (0.5, [(3, 1e300), (3, 5.0)]),                       # weight 1e150: within the bound
    (1.0, [(1, 1e300), (1, 0.0), (1, 1.0)]),
]


@pytest.mark.parametrize("exponent, steps", _SCENARIOS)
def test_prioritized_distribution_after_a_huge_priority(exponent, steps):
    distribution = selectors.PrioritizedDistribution(exponent)
    items = [_Item(key, priority) for key, priority in enumerate([100.0, 1.0, 0.0, 5.0])]
    for item in items:
        distribution.insert(item)
    for index, priority in steps:
        items[index].priority = priority
        distribution.update(items[index])
    weights = [0.0 if it.priority == 0 else it.priority ** exponent for it in items]
    for item, weight in zip(items, weights):
        assert distribution.probability(item) == pytest.approx(weight / sum(weights), rel=1e-12)
    drawn, probabilities = distribution.sample_many(_DRAWS)
    counts = np.bincount([it.key for it in drawn], minlength=len(items))
    _assert_proportional(counts, weights, _DRAWS)
    assert all(p == pytest.approx(weights[it.key] / sum(weights), rel=1e-12) for it, p in zip(drawn, probabilities))


def test_a_table_samples_by_priority_after_a_huge_priority_update():
    table = reverb.Table("p", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 100,
                         reverb.rate_limiters.MinSize(1))
    server = reverb.Server([table])
    try:
        client = server.localhost_client()
        for value, priority in enumerate([100.0, 1.0, 0.0]):
            client.insert([np.float32(value)], priorities={"p": priority})
        entries, _ = server.tables["p"].checkpoint_snapshot()
        [key] = [item.key for item, priority, _ in entries if priority == 1.0]
        client.mutate_priorities("p", updates={key: 1e25})
        client.mutate_priorities("p", updates={key: 1.0})
        samples = client.sample("p", num_samples=_DRAWS, emit_timesteps=False)
        values = [int(np.asarray(sample.data[0]).item()) for sample in samples]
    finally:
        server.stop()
    _assert_proportional(np.bincount(values, minlength=3), [100.0, 1.0, 0.0], _DRAWS)


def test_in_graph_buffer_samples_by_priority_after_a_huge_priority():
    buffer = reverb.PrioritizedReplayBuffer(tf.TensorSpec([], tf.float32), batch_size=1, max_length=8, alpha=1.0)
    for value in range(4):
        buffer.add_batch(tf.constant([float(value)]))
    ids = tf.constant([0, 1, 2, 3], tf.int64)  # id == value: batch_size 1
    buffer.update_priorities(ids, tf.constant([100.0, 1.0, 0.0, 5.0]))
    buffer.update_priorities(tf.constant([1], tf.int64), tf.constant([1e25]))
    buffer.update_priorities(tf.constant([1], tf.int64), tf.constant([1.0]))
    data, info = buffer.get_next(sample_batch_size=_DRAWS)
    values = data.numpy().astype(np.int64)
    counts = np.bincount(values, minlength=4)
    _assert_proportional(counts, [100.0, 1.0, 0.0, 5.0], _DRAWS)
    expected = np.array([100.0, 1.0, 0.0, 5.0]) / 106.0
    np.testing.assert_allclose(info.probabilities.numpy(), expected[values], rtol=1e-5)
