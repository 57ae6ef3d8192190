"""Sum and min trees over `tf.Variable`s: pure functions for batched updates, prefix sums and sampling.

A tree over `num_leaves` values is a list of levels. `levels[0]` holds the leaves padded to `fanout**depth`;
`levels[i]` holds `fanout**(depth - i)` nodes, node `j` of level `i` reducing (sum, or min) the `fanout`
children `j * fanout .. j * fanout + fanout - 1` of level `i - 1`. The top level holds `fanout` nodes; the
root is their reduction (computed, not stored). A wide fanout (32 by default) keeps the tree shallow:
each level is one gather of `[n, fanout]` children plus one scatter, so an update of n leaves or a
descent of n samples is a handful of vectorized ops per level, and works under XLA.

Updates recompute each touched parent from its children (never add deltas), so float32 sums do not drift.

>>> import tensorflow as tf
>>> tree = make(5, fanout=2, reduce="sum")
>>> _ = update(tree, tf.constant([0, 1, 2, 3, 4]), tf.constant([1., 2., 3., 4., 0.]), reduce="sum")
>>> float(root(tree, "sum")), float(prefix_sum(tree, tf.constant([3]))[0])
(10.0, 6.0)
>>> find(tree, tf.constant([0.5, 1.0, 2.9, 3.0, 9.99])).numpy().tolist()
[0, 1, 1, 2, 3]
"""
from __future__ import annotations

import math

import tensorflow as tf

_IDENTITY = {"sum": 0.0, "min": math.inf}


def make(num_leaves: int, *, fanout: int = 32, reduce: str = "sum", name: str = "tree") -> list[tf.Variable]:
    """Creates the level variables (float32), all nodes at the reduction's identity (0 or +inf)."""
    if reduce not in _IDENTITY:
        raise ValueError(f"reduce ({reduce!r}) must be one of {sorted(_IDENTITY)}")
    if fanout < 2:
        raise ValueError(f"fanout ({fanout}) must be >= 2")
    depth = max(1, math.ceil(math.log(max(num_leaves, 1), fanout) - 1e-9))
    while fanout ** depth < num_leaves:  # guard against log rounding
        depth += 1
    return [tf.Variable(tf.fill([fanout ** (depth - i)], tf.constant(_IDENTITY[reduce], tf.float32)),
                        trainable=False, name=f"{name}_level{i}") for i in range(depth)]


def fanout_of(levels) -> int:
    return int(levels[-1].shape[0])


def _reduce(values, reduce: str, axis: int = -1):
    return tf.reduce_sum(values, axis) if reduce == "sum" else tf.reduce_min(values, axis)


def reset(levels, reduce: str):
    """Sets every node back to the identity (an empty tree)."""
    return tf.group(*[v.assign(tf.fill(tf.shape(v), tf.constant(_IDENTITY[reduce], tf.float32)))
                      for v in levels])


def update(levels, leaf_ids, values, reduce: str):
    """Sets leaves `leaf_ids` (int, [n]) to `values` ([n]) and recomputes their ancestors.

    With duplicate ids one of the values is kept. Atomic: the update runs as one XLA computation
    (inlined into an enclosing one), which holds the locks of the levels throughout, so concurrent
    updates never leave a parent computed from children another update has since changed. Returns a
    tensor available once every level is written (a dependency for what must follow the update).
    """
    ids = tf.cast(tf.reshape(leaf_ids, [-1]), tf.int64)
    values = tf.reshape(tf.cast(values, tf.float32), [-1])
    return _atomic_update(list(levels), ids, values, reduce)


def _update(levels, ids, values, reduce: str):
    fanout = fanout_of(levels)
    op = levels[0].scatter_update(tf.IndexedSlices(values, ids))
    offsets = tf.range(fanout, dtype=tf.int64)
    for i in range(1, len(levels)):
        ids = ids // fanout
        with tf.control_dependencies([op]):
            # Parent j of level i reduces children j*fanout .. j*fanout+fanout-1 of level i-1.
            children = levels[i - 1].sparse_read(ids[:, None] * fanout + offsets)
        op = levels[i].scatter_update(tf.IndexedSlices(_reduce(children, reduce), ids))
    with tf.control_dependencies([op]):
        return tf.size(ids)  # the function's outputs wait for all its writes


_atomic_update = tf.function(_update, jit_compile=True, autograph=False)


def root(levels, reduce: str = "sum"):
    """The reduction of all leaves (sum, or min)."""
    return _reduce(levels[-1].sparse_read(tf.range(fanout_of(levels))), reduce, axis=0)


def leaves(levels):
    """All leaves (padded to `fanout**depth`; padding holds the identity), one read of the leaf level.

    A dense read shares the variable's buffer: drop the result soon (a scatter while it is alive
    copies the leaf level first).
    """
    return levels[0].read_value()


def read_leaves(levels, leaf_ids):
    return levels[0].sparse_read(tf.cast(leaf_ids, tf.int64))


def prefix_sum(levels, ends):
    """Sum of leaves `[0, end)` for each `end` in `ends` ([n] ints, 0 <= end <= padded leaf count).

    Walks up the tree: at level i, `end_i = end // fanout**i` and the nodes of level i left of `end_i`
    inside its block (`(end_i // fanout) * fanout .. end_i - 1`) cover leaves not counted by any other
    level.
    """
    fanout = fanout_of(levels)
    ends = tf.cast(ends, tf.int64)
    offsets = tf.range(fanout, dtype=tf.int64)
    total = tf.zeros(tf.shape(ends), tf.float32)
    for i, level in enumerate(levels):
        size = int(level.shape[0])
        if i == len(levels) - 1:
            block, within = tf.zeros_like(ends), ends        # the top level is one block of `fanout` nodes
        else:
            block, within = ends // fanout, ends % fanout
        # Clamp only the gather (end == size reads past the last block; `within` is 0 there).
        nodes = level.sparse_read(tf.minimum(block[:, None] * fanout + offsets, size - 1))
        total += tf.reduce_sum(tf.where(offsets[None, :] < within[:, None], nodes, 0.0), axis=1)
        ends = ends // fanout
    return total


def find(levels, masses):
    """For each mass u ([n], 0 <= u < root), the leaf i with prefix_sum(i) <= u < prefix_sum(i + 1).

    Descends from the top level: at each node, the child whose cumulative sum first exceeds the
    remaining mass. Rounding can leave u at or beyond a node's sum; the descent then takes the last
    child with a positive sum, so a leaf with value 0 is never returned while the tree holds mass.
    """
    fanout = fanout_of(levels)
    offsets = tf.range(fanout, dtype=tf.int64)
    u = tf.cast(masses, tf.float32)
    node = tf.zeros(tf.shape(u), tf.int64)
    for level in reversed(levels):
        children = level.sparse_read(node[:, None] * fanout + offsets)    # [n, fanout]
        cumulative = _cumsum_columns(children)
        j = tf.reduce_sum(tf.cast(cumulative <= u[:, None], tf.int64), axis=1)
        # Last child with a positive sum (fanout - 1 when none is positive).
        last_positive = tf.reduce_max(tf.where(children > 0, offsets, -1), axis=1)
        j = tf.minimum(j, tf.where(last_positive < 0, tf.constant(fanout - 1, tf.int64), last_positive))
        before = tf.gather(cumulative, j, batch_dims=1) - tf.gather(children, j, batch_dims=1)
        u = tf.maximum(u - before, 0.0)
        node = node * fanout + j
    return node


def _cumsum_columns(values):
    """`tf.cumsum(values, axis=1)` for a small static width, as one running sum over the columns.

    The same additions in the same order as a sequential cumsum (so sums of non-negative values never
    decrease along a row); XLA fuses them into one loop, where its reduce-window lowering of
    `tf.cumsum` is far slower on CPU.
    """
    columns = tf.unstack(values, axis=1)
    running = [columns[0]]
    for column in columns[1:]:
        running.append(running[-1] + column)
    return tf.stack(running, axis=1)
