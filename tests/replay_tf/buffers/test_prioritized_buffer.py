"""PrioritizedReplayBuffer: sampling proportional to p**alpha (chi-square), weights, updates, bad input."""
import doctest

import numpy as np
import pytest
import tensorflow as tf

import replay_tf
from replay_tf.buffers import prioritized

from buffer_testlib import adding_in_background

# chi2.ppf(0.999, df): a correct sampler fails these with probability 0.001 (the seed is fixed anyway).
CHI2_999 = {7: 24.3219, 11: 31.2641, 15: 37.6973, 23: 49.7282}
SPEC = {"step": tf.TensorSpec([], tf.int64), "segment": tf.TensorSpec([], tf.int64)}


def _filled(batch_size, max_length, adds, **kwargs):
    rb = replay_tf.PrioritizedReplayBuffer(SPEC, batch_size, max_length, **kwargs)
    for step in range(adds):
        rb.add_batch({"step": tf.fill([batch_size], tf.constant(step, tf.int64)),
                      "segment": tf.range(batch_size, dtype=tf.int64)})
    return rb


def _chi_square(counts, expected_probabilities):
    expected = counts.sum() * expected_probabilities
    return float(((counts - expected) ** 2 / expected).sum())


def test_doctests():
    failures, _ = doctest.testmod(prioritized, raise_on_error=False, verbose=False)
    assert failures == 0


@pytest.mark.parametrize("alpha, num_steps", [(0.6, None), (1.0, None), (0.6, 3)])
def test_sampling_is_proportional_to_priority_power_alpha(alpha, num_steps):
    tf.random.set_seed(1234)
    batch_size, max_length = 2, 8
    rb = _filled(batch_size, max_length, 11, alpha=alpha)        # wrapped: steps 3..10 stored
    ids = np.arange(3 * batch_size, 11 * batch_size)              # id = step * batch_size + segment
    priorities = np.linspace(0.5, 4.0, ids.size).astype(np.float32)
    rb.update_priorities(tf.constant(ids), tf.constant(priorities))
    # Valid window starts: all stored steps but the newest num_steps - 1.
    valid = ids // batch_size <= 10 - ((num_steps or 1) - 1)
    expected = np.where(valid, priorities ** alpha, 0.0)
    expected /= expected.sum()
    counts = np.zeros(ids.size)
    draws = 0
    for _ in range(8):
        data, info = rb.get_next(sample_batch_size=4000, num_steps=num_steps)
        first = info.ids.numpy() if num_steps is None else info.ids.numpy()[:, 0]
        np.add.at(counts, first - ids[0], 1)
        draws += first.size
        # Data and ids agree; probabilities and weights are the documented formulas.
        steps = data["step"].numpy() if num_steps is None else data["step"].numpy()[:, 0]
        np.testing.assert_array_equal(steps * batch_size + data["segment"].numpy().reshape(4000, -1)[:, 0],
                                      first)
        np.testing.assert_allclose(info.probabilities.numpy(), expected[first - ids[0]], rtol=1e-4)
        weights = (priorities[first - ids[0]] / priorities.min()) ** (-alpha * 0.4)
        np.testing.assert_allclose(info.importance_weights.numpy(), weights, rtol=1e-4)
    assert counts[~valid].sum() == 0
    df = int(valid.sum()) - 1
    assert _chi_square(counts[valid], expected[valid]) < CHI2_999[df], counts


def test_windows_and_new_items_get_max_priority():
    tf.random.set_seed(7)
    rb = _filled(2, 5, 3, alpha=1.0)
    rb.update_priorities(tf.constant([0, 1, 2, 3, 4, 5]), tf.constant([0.0, 0.0, 0.0, 0.0, 0.0, 3.0]))
    data, info = rb.get_next(sample_batch_size=50)
    assert set(info.ids.numpy().tolist()) == {5}
    # A new step enters at the max priority seen (3.0), as large as id 5's.
    rb.add_batch({"step": tf.constant([3, 3], tf.int64), "segment": tf.constant([0, 1], tf.int64)})
    data, info = rb.get_next(sample_batch_size=3000)
    counts = np.bincount(info.ids.numpy(), minlength=8)
    assert counts[:5].sum() == 0
    assert _chi_square(counts[5:8], np.array([1 / 3, 1 / 3, 1 / 3])) < 13.8  # chi2.ppf(0.999, 2)
    # Windows of 2: starts must leave room for a successor; id 7 (step 3) cannot start one.
    data, info = rb.get_next(sample_batch_size=200, num_steps=2)
    assert set(info.ids.numpy()[:, 0].tolist()) == {5}
    np.testing.assert_array_equal(data["step"].numpy(), np.tile([2, 3], (200, 1)))
    np.testing.assert_array_equal(info.ids.numpy(), np.tile([5, 7], (200, 1)))
    unstacked, info = rb.get_next(sample_batch_size=4, num_steps=2, time_stacked=False)
    assert len(unstacked) == 2 and [i.shape.as_list() for i in info.ids] == [[4], [4]]
    single, info = rb.get_next()
    assert single["step"].shape == () and info.ids.shape == () and info.importance_weights.shape == ()


def test_overwritten_ids_are_skipped_and_clear_resets():
    rb = _filled(1, 3, 5, alpha=1.0)                       # steps 2, 3, 4 stored (ids 2, 3, 4)
    rb.update_priorities(tf.constant([0, 1, 2]), tf.constant([5.0, 5.0, 0.0]))  # 0, 1: overwritten
    data, info = rb.get_next(sample_batch_size=300)
    assert set(info.ids.numpy().tolist()) == {3, 4}
    rb.clear()
    assert int(rb.num_frames()) == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match="no valid window"):
        rb.get_next(sample_batch_size=2)


@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
@pytest.mark.parametrize("traced", [False, True])
def test_an_overwritten_id_never_undoes_the_update_of_the_item_that_replaced_it(order, traced):
    rb = _filled(1, 4, 6, alpha=1.0)                 # ids 2..5 stored; id 5 replaced id 1 in row 1
    ids = tf.constant([[1, 5][i] for i in order], tf.int64)
    priorities = tf.constant([[100.0, 3.0][i] for i in order])
    if traced:
        tf.function(lambda i, p: rb.update_priorities(i, p) and None, autograph=False)(ids, priorities)
    else:
        rb.update_priorities(ids, priorities)
    np.testing.assert_allclose(rb._sums[0].numpy()[:4], [1.0, 3.0, 1.0, 1.0])  # row = id % 4
    assert float(rb._max_priority.numpy()) == 3.0
    # Only overwritten ids, or none at all: nothing changes.
    for ids, priorities in [([0, 1], [9.0, 8.0]), ([], [])]:
        ids, priorities = tf.constant(ids, tf.int64), tf.constant(priorities, tf.float32)
        if traced:
            tf.function(lambda i, p: rb.update_priorities(i, p) and None, autograph=False)(ids, priorities)
        else:
            rb.update_priorities(ids, priorities)
        np.testing.assert_allclose(rb._sums[0].numpy()[:4], [1.0, 3.0, 1.0, 1.0])
        assert float(rb._max_priority.numpy()) == 3.0


@pytest.mark.parametrize("ids, priorities, error, pattern", [
    ([0, 1], [1.0, -1.0], tf.errors.InvalidArgumentError, "priorities must be finite and >= 0"),
    ([0, 1], [1.0, float("nan")], tf.errors.InvalidArgumentError, "priorities must be finite and >= 0"),
    ([0, 1], [float("inf"), 1.0], tf.errors.InvalidArgumentError, "priorities must be finite and >= 0"),
    ([0, 99], [1.0, 1.0], tf.errors.InvalidArgumentError, "unknown ids"),
    ([-1], [1.0], tf.errors.InvalidArgumentError, "unknown ids"),
    ([0, 1], [1.0], ValueError, r"priorities shape \[1\] must match ids shape \[2\]"),
    ([0.5], [1.0], TypeError, "ids must be int32/int64"),
])
def test_update_priorities_bad_input(ids, priorities, error, pattern):
    rb = _filled(2, 4, 2)
    with pytest.raises(error, match=pattern):
        rb.update_priorities(tf.constant(ids), tf.constant(priorities))


def test_all_zero_priorities_is_an_error_not_garbage():
    rb = _filled(1, 4, 2)
    rb.update_priorities(tf.constant([0, 1]), tf.constant([0.0, 0.0]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="every valid window has priority 0"):
        rb.get_next(sample_batch_size=2)


def test_in_tf_function_and_xla():
    rb = _filled(2, 6, 3, alpha=0.6)
    counter = tf.Variable(2, dtype=tf.int64)

    @tf.function(jit_compile=True)
    def step():
        next_step = counter.assign_add(1)
        rb.add_batch({"step": tf.fill([2], next_step), "segment": tf.constant([0, 1], tf.int64)})
        data, info = rb.get_next(sample_batch_size=8, num_steps=2)
        rb.update_priorities(info.ids, tf.abs(tf.cast(data["step"][:, 0], tf.float32)) + 0.5)
        return data, info

    for _ in range(3):
        data, info = step()
    np.testing.assert_array_equal(data["step"].numpy()[:, 1] - data["step"].numpy()[:, 0], np.ones(8))
    assert int(rb.num_frames()) == 12


def test_checkpoint_round_trip_restores_priorities(tmp_path):
    rb = _filled(2, 4, 6, alpha=1.0)
    rb.update_priorities(tf.constant([4, 5, 6, 7, 8, 9, 10, 11]),
                         tf.constant([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0]))
    path = tf.train.Checkpoint(rb=rb).save(str(tmp_path / "ckpt"))
    restored = _filled(2, 4, 1, alpha=1.0)
    tf.train.Checkpoint(rb=restored).restore(path).assert_consumed()
    data, info = restored.get_next(sample_batch_size=20)
    assert set(info.ids.numpy().tolist()) == {11}
    assert int(restored.num_frames()) == 8
    restored.add_batch({"step": tf.constant([6, 6], tf.int64), "segment": tf.constant([0, 1], tf.int64)})
    data, info = restored.get_next(sample_batch_size=3000)
    assert set(info.ids.numpy().tolist()) == {11, 12, 13}   # new items at the restored max priority 9


def test_concurrent_readers_and_priority_updates_while_a_writer_adds():
    batch_size, max_length = 2, 4      # a tiny ring: the writer laps readers constantly
    rb = _filled(batch_size, max_length, max_length, alpha=1.0)
    items_for_step = lambda step: {"step": tf.fill([batch_size], step),  # noqa: E731
                                   "segment": tf.range(batch_size, dtype=tf.int64)}
    with adding_in_background(rb, items_for_step, last_step=max_length - 1) as counter:
        ds = rb.as_dataset(sample_batch_size=16, num_steps=3, num_parallel_calls=2)
        for data, info in ds.take(150):
            steps, segments, ids = data["step"].numpy(), data["segment"].numpy(), info.ids.numpy()
            # Each window: consecutive steps of one segment, never torn by the writer; ids match data.
            assert (np.diff(steps, axis=1) == 1).all() and (segments == segments[:, :1]).all()
            np.testing.assert_array_equal(ids, steps * batch_size + segments)
            probabilities, weights = info.probabilities.numpy(), info.importance_weights.numpy()
            assert ((probabilities > 0) & (probabilities <= 1)).all(), probabilities
            assert ((weights > 0) & (weights <= 1 + 1e-6)).all(), weights
            # Priorities updated while the writer overwrites: ids of overwritten items are skipped.
            rb.update_priorities(info.ids, tf.cast(data["step"][:, 0] % 5, tf.float32) + 1.0)
    assert int(counter.numpy()) > 2 * max_length
    # The tree is still consistent after the concurrent updates: the stored window starts (the 2
    # oldest stored steps, 2 segments) are drawn exactly by their priorities.
    newest = int(counter.numpy())
    starts = np.array([[(newest - 3 + k) * batch_size + s for s in range(batch_size)] for k in range(2)]).ravel()
    rb.update_priorities(tf.constant(starts), tf.constant([0.0, 1.0, 0.0, 3.0]))
    data, info = rb.get_next(sample_batch_size=4000, num_steps=3)
    first = info.ids.numpy()[:, 0]
    assert set(first.tolist()) <= {starts[1], starts[3]}
    counts = np.array([(first == starts[1]).sum(), (first == starts[3]).sum()])
    assert _chi_square(counts, np.array([0.25, 0.75])) < 10.83  # chi2.ppf(0.999, 1)
    np.testing.assert_allclose(info.probabilities.numpy(), np.where(first == starts[1], 0.25, 0.75), rtol=1e-5)


def test_eager_update_matches_the_graph_path_and_writes_nothing_when_a_check_fails():
    # Eager calls run update_priorities as one XLA program; inside tf.function the graph path runs.
    # Same updates (overwritten ids, duplicates, [B, T] and int32 ids) must leave the same trees.
    eager, traced = _filled(2, 4, 6, alpha=0.6), _filled(2, 4, 6, alpha=0.6)   # steps 2..5 stored
    @tf.function(autograph=False)
    def traced_update(ids, priorities):
        traced.update_priorities(ids, priorities)

    updates = [(tf.constant([4, 5, 11, 0, 2], tf.int64), tf.constant([2.0, 0.5, 7.0, 9.0, 1.0])),  # 0, 2 overwritten
               (tf.constant([[6, 8], [6, 8], [9, 11]], tf.int32), tf.constant([3.0, 4.0, 0.0])),
               (tf.constant([10], tf.int64), tf.constant([0.25]))]
    for ids, priorities in updates:
        eager.update_priorities(ids, priorities)
        traced_update(ids, priorities)
    for mine, theirs in zip(eager._sums, traced._sums):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-6)
    assert float(eager._max_priority.numpy()) == float(traced._max_priority.numpy()) == 7.0
    leaves = eager._sums[0].numpy()    # row = id % capacity (8)
    np.testing.assert_allclose(leaves[[4, 5, 3, 1, 2]], np.array([2.0, 0.5, 7.0, 0.0, 0.25]) ** 0.6, rtol=1e-6)
    before = [level.numpy().copy() for level in eager._sums]
    for ids, priorities in [([4, 99], [1.0, 1.0]), ([4, 5], [1.0, float("nan")])]:
        with pytest.raises(tf.errors.InvalidArgumentError):
            eager.update_priorities(tf.constant(ids), tf.constant(priorities))
    for level, old in zip(eager._sums, before):
        np.testing.assert_array_equal(level.numpy(), old)
    assert float(eager._max_priority.numpy()) == 7.0


def test_eager_and_traced_adds_interleave_with_the_same_priorities():
    # Eager adds run as one XLA program, adds inside tf.function as graph ops: both must claim the
    # same ring slots and give new items the current max priority ** alpha.
    rb = replay_tf.PrioritizedReplayBuffer(SPEC, batch_size=2, max_length=3, alpha=0.5)

    @tf.function(autograph=False)
    def traced_add(step):
        rb.add_batch({"step": tf.fill([2], step), "segment": tf.range(2, dtype=tf.int64)})

    for step in range(7):
        if step == 3:
            rb.update_priorities(tf.constant([4, 5]), tf.constant([4.0, 1.0]))  # max priority 1 -> 4
        if step % 2:
            traced_add(tf.constant(step, tf.int64))
        else:
            rb.add_batch({"step": tf.fill([2], tf.constant(step, tf.int64)), "segment": tf.range(2, dtype=tf.int64)})
    everything = rb.gather_all()
    np.testing.assert_array_equal(everything["step"].numpy(), [[4, 5, 6], [4, 5, 6]])
    np.testing.assert_array_equal(everything["segment"].numpy(), [[0, 0, 0], [1, 1, 1]])
    # Rows (step % 3) * 2 + segment: steps 4, 5, 6 were added after the max became 4 -> 4 ** 0.5.
    np.testing.assert_allclose(rb._sums[0].numpy()[:6], np.full(6, 2.0), rtol=1e-6)
    np.testing.assert_allclose(float(prioritized.sum_tree.root(rb._sums, "sum")), 12.0, rtol=1e-6)
    assert (int(rb._buffer.state.last_id.numpy()), int(rb._buffer.state.write_started.numpy())) == (6, 6)


def test_eager_get_next_reports_the_same_probabilities_and_weights_as_the_graph_path():
    # From Python get_next runs as one XLA program; inside tf.function as graph ops. For the items
    # they draw, both must report the same probabilities and importance weights.
    rb = _filled(2, 8, 11, alpha=0.7)
    ids = np.arange(6, 22)
    rb.update_priorities(tf.constant(ids), tf.constant(np.linspace(0.5, 4.0, ids.size).astype(np.float32)))
    traced = tf.function(lambda: rb.get_next(sample_batch_size=500, num_steps=2), autograph=False)
    by_id = {}
    for data, info in (rb.get_next(sample_batch_size=500, num_steps=2), traced()):
        first = info.ids.numpy()[:, 0]
        np.testing.assert_array_equal(data["step"].numpy()[:, 0] * 2 + data["segment"].numpy()[:, 0], first)
        for i, p, w in zip(first, info.probabilities.numpy(), info.importance_weights.numpy()):
            expected = by_id.setdefault(int(i), (p, w))
            np.testing.assert_allclose((p, w), expected, rtol=1e-5)
    assert len(by_id) >= 10
