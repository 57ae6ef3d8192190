"""sum_tree: updates, prefix sums, descent and min tree against numpy on random data."""
import doctest

import numpy as np
import pytest
import tensorflow as tf

from replay_tf.buffers import sum_tree


def test_doctests():
    failures, _ = doctest.testmod(sum_tree, raise_on_error=False, verbose=False)
    assert failures == 0


@pytest.mark.parametrize("num_leaves, fanout", [(1, 2), (5, 2), (16, 4), (100, 8), (1000, 32), (33, 32)])
def test_matches_numpy(num_leaves, fanout):
    rng = np.random.default_rng(num_leaves)
    sums = sum_tree.make(num_leaves, fanout=fanout, reduce="sum")
    mins = sum_tree.make(num_leaves, fanout=fanout, reduce="min")
    leaves = np.zeros(num_leaves, np.float32)
    written = np.zeros(num_leaves, bool)
    for _ in range(4):  # several batched updates, some touching the same parents
        ids = rng.choice(num_leaves, size=min(num_leaves, 7), replace=False)
        values = rng.uniform(0.0, 3.0, size=ids.shape).astype(np.float32)
        values[::3] = 0.0
        leaves[ids] = values
        written[ids] = True
        sum_tree.update(sums, tf.constant(ids), tf.constant(values), "sum")
        sum_tree.update(mins, tf.constant(ids), tf.constant(values), "min")
    np.testing.assert_allclose(sum_tree.root(sums, "sum").numpy(), leaves.sum(), rtol=1e-5)
    ends = np.arange(num_leaves + 1)
    np.testing.assert_allclose(sum_tree.prefix_sum(sums, tf.constant(ends)).numpy(),
                               np.concatenate([[0.0], np.cumsum(leaves)]), rtol=1e-5, atol=1e-5)
    if leaves.sum() > 0:
        cumulative = np.cumsum(leaves.astype(np.float64))
        masses = rng.uniform(0, cumulative[-1], size=500).astype(np.float32)
        found = sum_tree.find(sums, tf.constant(masses)).numpy()
        assert (leaves[found] > 0).all()
        expected = np.searchsorted(cumulative, masses, side="right")
        # Equal except where a mass lies within float32 rounding of a boundary.
        close = np.abs(cumulative[np.minimum(expected, num_leaves - 1)] - masses) < 1e-4 * cumulative[-1]
        assert ((found == expected) | close).all()
    assert sum_tree.root(mins, "min").numpy() == pytest.approx(leaves[written].min())


def test_edges_of_descent_never_return_empty_leaves():
    tree = sum_tree.make(10, fanout=4, reduce="sum")
    sum_tree.update(tree, tf.constant([2, 7]), tf.constant([1.0, 2.0]), "sum")
    found = sum_tree.find(tree, tf.constant([0.0, 0.999, 1.0, 2.9999, 3.0, 100.0])).numpy()
    assert found.tolist() == [2, 2, 7, 7, 7, 7]


def test_reset_and_bad_arguments():
    tree = sum_tree.make(8, fanout=2, reduce="min")
    sum_tree.update(tree, tf.constant([1]), tf.constant([0.5]), "min")
    assert sum_tree.root(tree, "min").numpy() == 0.5
    sum_tree.reset(tree, "min")
    assert np.isinf(sum_tree.root(tree, "min").numpy())
    with pytest.raises(ValueError, match=r"reduce \('max'\) must be one of"):
        sum_tree.make(8, reduce="max")
    with pytest.raises(ValueError, match=r"fanout \(1\) must be >= 2"):
        sum_tree.make(8, fanout=1)


def test_update_and_find_compile_with_xla():
    tree = sum_tree.make(100, fanout=8, reduce="sum")

    @tf.function(jit_compile=True)
    def step(ids, values, masses):
        sum_tree.update(tree, ids, values, "sum")
        return sum_tree.find(tree, masses), sum_tree.prefix_sum(tree, tf.constant([100], tf.int64))

    found, total = step(tf.constant([3, 50], tf.int64), tf.constant([1.0, 3.0]), tf.constant([0.5, 1.5]))
    assert found.numpy().tolist() == [3, 50]
    assert total.numpy().tolist() == [4.0]


@pytest.mark.parametrize("fanout", [2, 32])
def test_find_eager_and_under_xla_match_searchsorted_on_integer_priorities(fanout):
    # Integer leaves (many zeros) keep every float32 sum exact, so the descent must find exactly the
    # leaf numpy's searchsorted finds, also for masses on a boundary, with or without XLA.
    rng = np.random.default_rng(fanout)
    leaves = rng.integers(0, 4, 2000).astype(np.float32)
    tree = sum_tree.make(leaves.size, fanout=fanout, reduce="sum")
    sum_tree.update(tree, tf.range(leaves.size), tf.constant(leaves), "sum")
    cumulative = np.cumsum(leaves)
    boundaries = cumulative[:-1][leaves[1:] > 0][:300]
    masses = np.concatenate([rng.uniform(0, cumulative[-1], 500), boundaries, [0.0]]).astype(np.float32)
    expected = np.searchsorted(cumulative, masses, side="right")
    eager = sum_tree.find(tree, tf.constant(masses)).numpy()
    compiled = tf.function(lambda m: sum_tree.find(tree, m), jit_compile=True)(tf.constant(masses)).numpy()
    np.testing.assert_array_equal(eager, expected)
    np.testing.assert_array_equal(compiled, expected)
    assert (leaves[compiled] > 0).all()
