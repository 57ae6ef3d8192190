"""`PrioritizedReplayBuffer`: the uniform buffer's ring, sampled proportionally to priority**alpha.

It composes a `UniformReplayBuffer` (same constructor; its ring state, `gather_all`, `num_frames` and
deterministic `as_dataset`), a sum tree (`sum_tree.py`) with one leaf per storage row, i.e. per
(segment, step) item, and the checks and execution of `_execution.py`; it writes and samples the ring
with `_ring.py`'s functions.

Items and ids. An item is a (segment, logical step) pair; its id is `step * batch_size + segment`
(unique, increasing with insertion, and `id % capacity` is its storage row). With `num_steps=T`, the
sampled item is the window's first step and `BufferInfo.ids` holds the ids of all T steps, `[B, T]`;
`update_priorities` accepts those ids (it uses the first column) or `[B]` ids.

Sampling. New items get the largest priority seen so far (1.0 initially). `get_next` draws windows
with probability `p_i**alpha / sum_j p_j**alpha` over the valid window starts (the same starts as the
uniform buffer: the newest `T - 1` steps of each segment cannot start a window). The valid starts are
one contiguous, possibly wrapped, range of rows, so the draw maps a uniform mass onto that range with
two prefix sums: exact, no rejection. Episode-aware windows are drawn by rejection among those.

Importance weights. `BufferInfo` is a `PrioritizedBufferInfo(ids, probabilities, importance_weights)`:
its first two fields are TF-Agents' `BufferInfo` fields, so code that reads `info.ids` /
`info.probabilities` (or `info[0]`, `info[1]`) keeps working. `importance_weights =
(N * P(i))**-beta / max_j (N * P(j))**-beta = (p_i / p_min)**(-alpha * beta)`, with `p_min` the smallest
priority stored (a masked min over the tree's leaves, see `_smallest_stored`), so the largest weight is 1.

>>> import tensorflow as tf
>>> rb = PrioritizedReplayBuffer(tf.TensorSpec([], tf.float32), batch_size=2, max_length=4, alpha=1.0)
>>> for t in range(3):
...     rb.add_batch(tf.constant([t, 10. + t]))
>>> data, info = rb.get_next(sample_batch_size=3)
>>> info.importance_weights.numpy().tolist()          # all priorities equal (1.0)
[1.0, 1.0, 1.0]
>>> rb.update_priorities(tf.constant([0, 1, 2, 3, 4, 5]), tf.constant([0., 0., 0., 0., 0., 2.]))
>>> data, info = rb.get_next(sample_batch_size=3)       # only id 5 (step 2, segment 1) has mass
>>> data.numpy().tolist(), info.ids.numpy().tolist(), info.probabilities.numpy().tolist()
([12.0, 12.0, 12.0], [5, 5, 5], [1.0, 1.0, 1.0])
"""
from __future__ import annotations

import collections
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from replay_tf.buffers import _execution
from replay_tf.buffers import _ring
from replay_tf.buffers import replay_buffer
from replay_tf.buffers import sum_tree
from replay_tf.buffers import uniform

PrioritizedBufferInfo = collections.namedtuple("PrioritizedBufferInfo",
                                               ["ids", "probabilities", "importance_weights"])
PrioritizedBufferInfo.__doc__ = """`BufferInfo` plus importance weights (see the module docstring)."""

# Redraw attempts for episode-aware windows before giving up with an error.
_MAX_REJECTION_ROUNDS = 1000
_ALL_ZERO_MESSAGE = ("PrioritizedReplayBuffer: every valid window has priority 0; raise some priorities with "
                     "update_priorities")
_NOT_FOUND_MESSAGE = f"PrioritizedReplayBuffer: no valid window found in {_MAX_REJECTION_ROUNDS} rounds"


class PrioritizedReplayBuffer(replay_buffer.ReplayBuffer):
    """Prioritized replay with the `UniformReplayBuffer` interface plus `update_priorities`.

    A `ReplayBuffer`, as `UniformReplayBuffer`; its spec, capacity and options are the wrapped buffer's.

    Args:
      data_spec, batch_size, max_length, scope, device, table_fn, dataset_drop_remainder,
      dataset_window_shift, stateful_dataset: as `UniformReplayBuffer`.
      alpha: keyword-only priority exponent (0: uniform, 1: proportional).
      beta: keyword-only initial importance-weight exponent; change it with `buffer.beta = value`.
      episode_end_fn: keyword-only; episode-aware windows, as `UniformReplayBuffer`.
      fanout: keyword-only; children per node of the sum tree.
    """

    def __init__(self, data_spec, batch_size: int, max_length: int = 1000, scope: str = "PrioritizedReplayBuffer",
                 device: str = "cpu:*", table_fn: Any = None, dataset_drop_remainder: bool = False,
                 dataset_window_shift: int | None = None, stateful_dataset: bool = False, *,
                 alpha: float = 0.6, beta: float = 0.4, episode_end_fn: Callable | None = None,
                 fanout: int = 32):
        super().__init__(self._no_dependency(data_spec), None, stateful_dataset)  # as UniformReplayBuffer
        if not alpha >= 0:
            raise ValueError(f"alpha ({alpha}) must be >= 0")
        if not beta >= 0:
            raise ValueError(f"beta ({beta}) must be >= 0")
        self._buffer = uniform.UniformReplayBuffer(
            data_spec, batch_size, max_length, scope, device, table_fn, dataset_drop_remainder,
            dataset_window_shift, stateful_dataset, episode_end_fn=episode_end_fn)
        self._alpha = float(alpha)
        self._device, self._scope = device, scope
        self._functions: dict = self._no_dependency({})  # traced functions, not checkpointed
        self._check_items = _execution.ItemChecker(data_spec, self._buffer.batch_size, episode_end_fn)
        capacity = self._buffer.batch_size * self._buffer.max_length
        # Largest leaf weight priority**alpha: the tree's sums of up to `capacity` leaves then stay below
        # float32's max with a factor 2 to spare for rounding, so no total ever overflows to inf (an inf
        # total would make every draw fail for ever, new items inheriting the max priority).
        self._weight_bound = float(np.finfo(np.float32).max) / (2 * capacity)
        with tf.device(device), tf.name_scope(scope):
            self._sums = sum_tree.make(capacity, fanout=fanout, reduce="sum", name="sum_tree")
            self._max_priority = tf.Variable(1.0, trainable=False, name="max_priority")
            self._beta = tf.Variable(float(beta), trainable=False, name="beta")
            self._draw_key = self._no_dependency(_execution.make_draw_key())  # see `get_next`
        self._samplers: dict = self._no_dependency({})  # (n, num_steps) -> XLA-compiled draw program

    # ----- delegated API -----
    data_spec = property(lambda self: self._buffer.data_spec)
    capacity = property(lambda self: self._buffer.capacity)
    batch_size = property(lambda self: self._buffer.batch_size)
    max_length = property(lambda self: self._buffer.max_length)
    device = property(lambda self: self._buffer.device)
    scope = property(lambda self: self._buffer.scope)
    table_fn = property(lambda self: self._buffer.table_fn)
    stateful_dataset = property(lambda self: self._buffer.stateful_dataset)

    def num_frames(self):
        return self._buffer.num_frames()

    def gather_all(self):
        return self._buffer.gather_all()

    def variables(self) -> list[tf.Variable]:
        """As `UniformReplayBuffer.variables()`, then the sum tree's levels, max priority and beta."""
        return self._buffer.variables() + list(self._sums) + [self._max_priority, self._beta]

    @property
    def alpha(self) -> float:
        return self._alpha

    @property
    def beta(self) -> tf.Variable:
        return self._beta

    @beta.setter
    def beta(self, value):
        self._beta.assign(value)

    def _run(self, name, fn, *args, tensors=(), jit_compile=False):
        return _execution.run_in_graph(name, fn, *args, tensors=tensors, jit_compile=jit_compile, cache=self._functions,
                                       device=self._device, scope=self._scope, data_spec=self.data_spec)

    # ----- writing -----
    def add_batch(self, items):
        """As `UniformReplayBuffer.add_batch`; the new items get the largest priority seen so far."""
        tensors = self._check_items(items)
        if tf.executing_eagerly():
            # From Python: one XLA program (storage updated in place), cheaper than a graph call of
            # the same ~30 small ops (tree levels, ring counters, one scatter per leaf).
            self._run("add", self._add_impl, tensors=tensors, jit_compile=True)
            return None
        return self._run("add", self._add_impl, tensors=tensors)

    def _add_impl(self, *tensors):
        buffer = self._buffer
        value = tf.fill([buffer.batch_size], tf.pow(self._max_priority.read_value(), self._alpha))
        # The new rows' priorities are set once the step is claimed and before its data is written: a
        # reader never sees a new item with its predecessor's priority (one that drew the row in between
        # re-reads `write_started` after its gather and redraws it).
        return _execution.add(buffer.state, buffer.data_spec, buffer.batch_size, buffer.max_length, tensors,
                              before_data=lambda rows: sum_tree.update(self._sums, rows, value, "sum"))

    def clear(self):
        """Forgets all items and priorities (max priority back to 1.0)."""
        def impl():
            return tf.group(_ring.clear(self._buffer.state), sum_tree.reset(self._sums, "sum"),
                            self._max_priority.assign(1.0))
        op = self._run("clear", impl)
        return None if tf.executing_eagerly() else op

    def update_priorities(self, ids, priorities):
        """Sets the priorities of sampled items.

        Args:
          ids: `BufferInfo.ids` of a `get_next` result: `[B]`, or `[B, T]` (the first column is used).
          priorities: `[B]` non-negative finite floats (0 means never sampled again).

        Ids whose items have been overwritten since they were sampled are skipped (as Reverb does for
        deleted keys). Ids never issued by this buffer (negative, or newer than the newest item) and
        negative, NaN or infinite priorities raise InvalidArgumentError, as do priorities with
        `priority**alpha` above float32's max / (2 * capacity): a larger one could make the tree's
        float32 totals overflow to inf (TF-Agents' buffer accepts it and then can never sample again).
        """
        ids = tf.convert_to_tensor(ids, dtype_hint=tf.int64)
        priorities = tf.convert_to_tensor(priorities, dtype_hint=tf.float32)
        if ids.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"update_priorities: ids must be int32/int64, got {ids.dtype.name}")
        if not priorities.dtype.is_floating:
            raise TypeError(f"update_priorities: priorities must be floats, got {priorities.dtype.name}")
        if ids.shape.rank not in (None, 1, 2):
            raise ValueError(f"update_priorities: ids must be [B] or [B, T], got shape {ids.shape}")
        if (ids.shape.rank is not None and priorities.shape.rank is not None
                and ids.shape.is_fully_defined() and priorities.shape.is_fully_defined()
                and ids.shape.as_list()[:1] != priorities.shape.as_list()):
            raise ValueError(f"update_priorities: priorities shape {priorities.shape.as_list()} must match "
                             f"ids shape {ids.shape.as_list()[:1]} (one priority per sampled item)")
        if not tf.executing_eagerly():
            return self._run("update", self._update_impl, False, tensors=(ids, priorities))
        # From Python: one XLA program (casts and slicing included; cheaper than a graph call of its ~40
        # small ops). XLA compiles asserts out, so the program returns its checks and writes
        # nothing when one fails; the error is raised here with the graph path's message.
        ok = self._run("update", self._update_impl, True, tensors=(ids, priorities), jit_compile=True).numpy()
        if not ok.all():
            raise tf.errors.InvalidArgumentError(None, None, _update_error(
                int(np.argmin(ok)), self._weight_bound, ids, priorities, self._buffer.state.last_id))
        return None

    def _update_impl(self, xla: bool, ids, priorities):
        """`xla=False`: asserts the checks, returns the update op. `xla=True` (the eager path's XLA
        program, where asserts are compiled out): returns the checks `[priorities ok, ids ok]` and
        writes only if both pass."""
        ids = tf.cast(ids, tf.int64)
        if ids.shape.rank == 2:
            ids = ids[:, 0]
        priorities = tf.cast(priorities, tf.float32)
        state, batch_size = self._buffer.state, self._buffer.batch_size
        capacity = batch_size * self._buffer.max_length
        last_id = state.last_id.read_value()
        steps = tf.math.floordiv(ids, batch_size)
        weights_ok = tf.pow(priorities, self._alpha) <= self._weight_bound  # false for an overflowing power
        ok = tf.stack([tf.reduce_all(tf.math.is_finite(priorities) & (priorities >= 0.0) & weights_ok),
                       tf.reduce_all((ids >= 0) & (steps <= last_id))])
        if not xla:
            checks = [tf.debugging.Assert(ok[0], [_update_error(0, self._weight_bound), priorities], summarize=16)]
            with tf.control_dependencies(checks):
                checks.append(tf.debugging.Assert(ok[1], [_update_error(1, self._weight_bound), ids, "newest step:",
                                                          last_id],
                                                  summarize=16))
            ids, priorities = _ring.after(checks, ids, priorities)
        rows = tf.math.floormod(ids, capacity)
        oldest = tf.maximum(last_id + 1 - self._buffer.max_length, 0)
        # Kept entries change nothing: an overwritten item's (its row holds a newer item), or every entry
        # when a check failed under XLA.
        keep = steps < oldest
        if xla:
            keep |= tf.logical_not(tf.reduce_all(ok))
        # A kept entry writes its row's current value back, unless the call has a live entry: then it
        # repeats the first live entry's row and value, so it can never undo a live update of its own row
        # (the newer item that replaced its item; the scatter keeps one value per duplicate row).
        live_values = tf.pow(priorities, self._alpha)
        live = tf.logical_not(keep)
        n = tf.size(ids, out_type=tf.int64)
        # n when there is none: the index of `_padded`'s zero (min() of no entries is int64's max).
        first_live = tf.minimum(tf.reduce_min(tf.where(live, tf.range(n), n)), n)
        redirect = keep & tf.reduce_any(live)
        values = tf.where(redirect, tf.gather(_padded(live_values), first_live),
                          tf.where(keep, sum_tree.read_leaves(self._sums, rows), live_values))
        rows = tf.where(redirect, tf.gather(_padded(rows), first_live), rows)
        # An atomic max: a concurrent update never lowers the max priority another one has just raised.
        new_max = _ring.fetch_max(self._max_priority, tf.reduce_max(tf.where(keep, 0.0, priorities)))
        update = tf.group(sum_tree.update(self._sums, rows, values, "sum"), new_max)
        if xla:
            return _ring.after([update], ok)
        return update

    # ----- sampling -----
    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True):
        """As `UniformReplayBuffer.get_next`, drawn proportionally to priority**alpha.

        Returns:
          `(data, PrioritizedBufferInfo(ids, probabilities, importance_weights))`.
        """
        sample_batch_size, num_steps = _execution.check_sample_args(sample_batch_size, num_steps,
                                                                    self._buffer.max_length, empty_batch=True)
        args = (sample_batch_size, num_steps, bool(time_stacked))
        if tf.executing_eagerly() and self._buffer.state.episode_index is None:
            # From Python: the whole sample as one XLA program, its draws keyed by `_draw_key`.
            return _execution.sample_from_python(self._run, self._get_next_impl, args, self._draw_key)
        return self._run("get_next", self._get_next_impl, *args)

    def _smallest_stored(self):
        """min over the stored items' leaves (+inf when empty).

        Rows are filled in order from row 0, so the stored items are the rows before
        `min((last_id + 1) * batch_size, capacity)`: a masked reduction over the leaf level (static
        shape, so it also compiles under XLA) replaces a min tree, which would cost a second tree
        update on every add and priority update and 4+ bytes per item.
        """
        buffer = self._buffer
        capacity = buffer.batch_size * buffer.max_length
        stored = tf.minimum((buffer.state.last_id.read_value() + 1) * buffer.batch_size, capacity)
        leaves = sum_tree.leaves(self._sums)
        mask = tf.range(tf.shape(leaves, out_type=tf.int64)[0]) < stored
        return tf.reduce_min(tf.where(mask, leaves, tf.constant(float("inf"), tf.float32)))

    def _valid_mass(self, lo, hi):
        """(prefix mass before the first valid row, mass of the unwrapped part, total valid mass)."""
        batch_size, capacity = self._buffer.batch_size, self._buffer.batch_size * self._buffer.max_length
        # Valid starts [lo, hi) are rows [first, first + count) modulo capacity: one range, maybe wrapped.
        first = tf.math.floormod(lo, self._buffer.max_length) * batch_size
        count = (hi - lo) * batch_size
        end = first + count
        prefix = sum_tree.prefix_sum(self._sums, tf.stack([first, tf.minimum(end, capacity),
                                                           tf.maximum(end - capacity, 0)]))
        head = prefix[1] - prefix[0]               # rows first .. min(end, capacity) - 1
        return prefix[0], head, head + prefix[2]   # + rows 0 .. end - capacity - 1 when wrapped

    def _draw(self, n, lo, hi, num_steps, seed, flagged: bool = False):
        """n (starts, segments, (probabilities, importance weights)) drawn by priority among valid,
        episode-respecting windows; `seed` (int64 `[2]`) keys the stateless draws.

        `flagged` (the eager path's XLA program, which would compile asserts out and log each one it
        drops): a failed check zeroes the probabilities instead of asserting, so that the caller runs the
        sample again in graph mode, where it raises.
        """
        buffer = self._buffer
        episode_aware = buffer.state.episode_index is not None and num_steps not in (None, 1)
        # Everything from the valid range to the weights runs as one XLA program instead of ~100 small ops
        # that the TF executor would dispatch one by one. Its checks come back as flags and are asserted
        # here (XLA compiles asserts out). The episode-aware normalizer has a data-dependent shape, so
        # it is computed outside (-1: the program uses the valid mass).
        normalizer = self._episode_normalizer(lo, hi, num_steps) if episode_aware else tf.constant(-1.0)
        key = (n, num_steps)
        program = self._samplers.get(key)
        if program is None:
            program = self._samplers[key] = tf.function(
                lambda *args: self._draw_program(n, num_steps, *args), jit_compile=True, autograph=False)
        has_mass, found, starts, segments, probabilities, weights = program(lo, hi, normalizer, seed)
        if flagged:
            # (no mass: the probabilities are 0 already)
            return starts, segments, (tf.where(found, probabilities, 0.0), weights)
        check = tf.debugging.assert_equal(has_mass, True, message=_ALL_ZERO_MESSAGE)
        with tf.control_dependencies([check]):  # the first failing check is the one reported
            check = tf.debugging.assert_equal(found, True, message=_NOT_FOUND_MESSAGE)
        starts, segments, probabilities, weights = _ring.after([check], starts, segments, probabilities, weights)
        return starts, segments, (probabilities, weights)

    def _episode_normalizer(self, lo, hi, num_steps):
        """Mass of the valid starts whose window stays in one episode (O(capacity))."""
        buffer = self._buffer
        batch_size, max_length = buffer.batch_size, buffer.max_length
        starts = tf.range(lo, hi)[:, None] + tf.zeros([batch_size], tf.int64)
        segments = tf.zeros_like(starts) + tf.range(batch_size, dtype=tf.int64)
        ok = tf.logical_not(_ring.crosses_episode(buffer.state, starts, segments, num_steps, max_length,
                                                  batch_size))
        leaves = sum_tree.read_leaves(self._sums, _ring.rows_for(starts, segments, None, max_length, batch_size))
        return tf.reduce_sum(tf.where(ok, leaves, 0.0))

    def _draw_program(self, n, num_steps, lo, hi, normalizer, seed):
        """The body of `_draw`'s XLA program: (has_mass, found, starts, segments, probabilities, weights)."""
        buffer = self._buffer
        batch_size, max_length = buffer.batch_size, buffer.max_length
        before, head, valid = self._valid_mass(lo, hi)
        normalizer = tf.where(normalizer < 0.0, valid, normalizer)
        first = tf.math.floormod(lo, max_length) * batch_size
        count = (hi - lo) * batch_size
        bad, starts, segments = self._rejection_loop(n, num_steps, lo, first, count, valid, before, head, seed)
        priorities = sum_tree.read_leaves(self._sums, _ring.rows_for(starts, segments, None, max_length,
                                                                     batch_size))
        probabilities = tf.math.divide_no_nan(priorities, normalizer)
        weights = tf.pow(priorities / self._smallest_stored(), -self._beta.read_value())
        return normalizer > 0.0, tf.logical_not(tf.reduce_any(bad)), starts, segments, probabilities, weights

    def _rejection_loop(self, n, num_steps, lo, first, count, valid, before, head, seed):
        """Draws n valid (start, segment) pairs by priority mass; returns (bad, starts, segments).

        `seed`: int64 `[2]`; round r of the loop draws with the stateless key `fold_in(seed, r)`.
        """
        buffer = self._buffer
        batch_size, max_length = buffer.batch_size, buffer.max_length
        capacity = batch_size * max_length
        episode_aware = buffer.state.episode_index is not None and num_steps not in (None, 1)

        def draw(round_, mask, starts, segments):
            u = tf.random.stateless_uniform([n], tf.random.experimental.stateless_fold_in(seed, round_)) * valid
            # Mass coordinate in the tree: the valid range starts at `before`; past its unwrapped part
            # (`head`) it continues from row 0.
            mass = tf.where(u < head, before + u, u - head)
            rows = sum_tree.find(self._sums, mass)
            offset = tf.math.floormod(rows - first, capacity)         # position inside the valid range
            new_starts = lo + offset // batch_size
            new_segments = tf.math.floormod(rows, batch_size)
            bad = offset >= count                                       # float rounding at the edges
            if episode_aware:
                bad |= _ring.crosses_episode(buffer.state, new_starts, new_segments, num_steps, max_length,
                                             batch_size)
            return (tf.logical_and(mask, bad), _ring.redraw(mask, new_starts, starts),
                    _ring.redraw(mask, new_segments, segments))

        zeros = tf.zeros([n], tf.int64)
        bad, starts, segments = draw(0, tf.ones([n], tf.bool), zeros, zeros)
        _, bad, starts, segments = tf.while_loop(
            lambda r, bad, s, g: tf.reduce_any(bad) & (r < _MAX_REJECTION_ROUNDS) & (valid > 0.0),
            lambda r, bad, s, g: (r + 1,) + draw(r + 1, bad, s, g),
            (tf.constant(0), bad, starts, segments))
        return bad, starts, segments

    def _get_next_impl(self, sample_batch_size, num_steps, time_stacked, keyed: bool = False):
        """`keyed`: the draw's seed comes from `_draw_key` (advanced by one per call), for
        the eager path's XLA program; else a stateful op draws it (outside the draw's XLA program).

        XLA ignores the seeds of stateful random ops, and TF warns when it compiles one, so the draw
        itself is stateless either way; both seeds follow tf.random.set_seed like TF-Agents' stateful draws.
        """
        if keyed:
            seed = _execution.next_draw_seed(self._draw_key)
        else:
            seed = tf.random.uniform([2], 0, tf.int64.max, tf.int64)
        buffer = self._buffer
        n = 1 if sample_batch_size is None else sample_batch_size
        flat, starts, segments, (probabilities, weights) = _ring.sample_windows(
            buffer.state, n, num_steps, buffer.max_length, buffer.batch_size,
            lambda lo, hi: self._draw(n, lo, hi, num_steps, seed, flagged=keyed),
            _execution.sample_check(num_steps, keyed), num_values=2)
        # ids -1 flag a sample drawn while nothing could be sampled: only reachable in the keyed XLA
        # program, which has no asserts. An item's id is `step * batch_size + segment`: a window's ids
        # step by `batch_size`.
        first_ids = tf.where(probabilities > 0, starts * buffer.batch_size + segments, -1)
        ids = _execution.window_ids(first_ids, num_steps, stride=buffer.batch_size)
        data, ids, (probabilities, weights) = _execution.package(
            buffer.data_spec, flat, ids, [probabilities, weights], sample_batch_size, num_steps, time_stacked)
        return data, PrioritizedBufferInfo(ids, probabilities, weights)

    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None, single_deterministic_pass: bool = False
                   ) -> tf.data.Dataset:
        """As `UniformReplayBuffer.as_dataset`; random draws are prioritized. The deterministic pass is
        the uniform buffer's (every stored step once, TF-Agents' ids, no priorities involved)."""
        if single_deterministic_pass:
            return self._buffer.as_dataset(sample_batch_size, num_steps, num_parallel_calls, True)
        _execution.check_list_free_spec(self._buffer.data_spec)
        sample_batch_size, num_steps = _execution.check_sample_args(sample_batch_size, num_steps,
                                                                    self._buffer.max_length)
        chunk = sample_batch_size or _execution.UNBATCHED_CHUNK

        def fn(_):
            with tf.device(self._device), tf.name_scope(self._scope):
                return self._get_next_impl(chunk, num_steps, True)

        ds = tf.data.Dataset.counter().map(fn, num_parallel_calls=num_parallel_calls)
        return ds.unbatch() if sample_batch_size is None else ds


def _padded(values):
    """`values` ([n]) with one zero appended, so index n (and any index of an empty `values`) is valid."""
    return tf.concat([values, tf.zeros([1], values.dtype)], 0)


def _update_error(check: int, weight_bound: float, ids=None, priorities=None, last_id=None) -> str:
    """The message of `update_priorities`' failed check (0: priorities, 1: ids), with the values if given."""
    if check == 0:
        message = (f"update_priorities: priorities must be finite and >= 0 with priority**alpha <= "
                   f"{weight_bound:.6g} (float32 max / (2 * capacity), so that the sum tree's totals stay "
                   f"finite); got NaN, inf, a negative value or one above the bound:")
        return message if priorities is None else f"{message} {np.asarray(priorities)[:16]}"
    message = ("update_priorities: unknown ids: every id must come from BufferInfo.ids of this buffer "
               "(0 <= id < (newest step + 1) * batch_size). ids:")
    if ids is None:
        return message
    return f"{message} {np.asarray(ids)[:16]} newest step: {int(last_id.numpy())}"

