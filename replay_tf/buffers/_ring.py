"""Ring storage shared by the in-graph buffers: explicit state (`RingState`) and pure functions over it.

Layout. A buffer holds `batch_size` independent segments (one per parallel environment), each a ring
of `max_length` steps, exactly like TF-Agents' `TFUniformReplayBuffer`. Every `add_batch` writes one
step to every segment, so all segments share one logical step counter `last_id` (-1 when empty).
The storage of each leaf of the data spec is ONE `tf.Variable` of shape `[max_length * batch_size, ...]`
laid out time-major:

    row(logical_id, segment) = (logical_id mod max_length) * batch_size + segment

so an `add_batch` writes `batch_size` consecutive rows (one scatter of a contiguous block per leaf) and
any set of sampled windows is one gather per leaf. (TF-Agents uses `segment * max_length + slot`,
which makes each add a strided scatter; logical ids and windows are the same in both layouts.)

Concurrency. Any number of writers and readers. A writer claims its step id with an atomic
fetch-and-add on `write_started` (`claim`) BEFORE it overwrites a slot, so concurrent writers always get
distinct ids (and slots), and advances `last_id` with an atomic max AFTER it has written the slot.
A reader (`sample_windows`) samples from the windows valid for the `last_id` it read, gathers,
then re-reads `write_started`: a window whose oldest step is `<= write_started - max_length` may have
been overwritten during the gather, and is drawn again (see `stale_mask`). Each gather/scatter on a
variable holds the variable's lock, so a row is never half written. With several concurrent writers a
newer step can be published while an older one is still being written (as in TF-Agents, which
publishes the id before the data); with one writer at a time every published step is complete.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import tensorflow as tf

from replay_tf import specs


class RingState(NamedTuple):
    """The variables of a ring buffer (owned by a `tf.Module`, passed to the functions below)."""
    storage: list             # one tf.Variable [max_length * batch_size, *leaf.shape] per data spec leaf
    last_id: tf.Variable      # int64 scalar: logical id of the newest fully written step, -1 when empty
    write_started: tf.Variable  # int64 scalar: logical id of the newest step whose write has begun
    episode_index: tf.Variable | None  # int32 [rows]: per-segment episode counter of each stored step
    episode_count: tf.Variable | None  # int32 [batch_size]: episodes finished so far in each segment


def make_state(data_spec, batch_size: int, max_length: int, *, episode_aware: bool) -> RingState:
    """Creates the variables (zero-filled storage; call inside the owner's device/name scope)."""
    rows = batch_size * max_length
    storage = []
    for where, leaf in specs.flatten_with_paths(data_spec, "data_spec"):
        if not isinstance(leaf, tf.TensorSpec):
            raise TypeError(f"{where} must be a tf.TensorSpec, got {type(leaf).__name__}")
        if not leaf.shape.is_fully_defined():
            raise ValueError(f"{where} has shape {leaf.shape}; buffer storage needs fully defined shapes")
        name = (leaf.name or "slot").replace("/", "_")
        storage.append(tf.Variable(tf.zeros([rows] + leaf.shape.as_list(), leaf.dtype), trainable=False,
                                   name=name))
    last_id = tf.Variable(tf.constant(-1, tf.int64), trainable=False, name="last_id")
    write_started = tf.Variable(tf.constant(-1, tf.int64), trainable=False, name="write_started")
    episode_index = episode_count = None
    if episode_aware:
        episode_index = tf.Variable(tf.zeros([rows], tf.int32), trainable=False, name="episode_index")
        episode_count = tf.Variable(tf.zeros([batch_size], tf.int32), trainable=False, name="episode_count")
    return RingState(storage, last_id, write_started, episode_index, episode_count)


def xla_compatible(data_spec) -> bool:
    """Whether XLA can compile programs over storage of `data_spec` (numbers and bools; not strings,
    variants, resources or quantized types)."""
    return all(leaf.dtype.is_bool or ((leaf.dtype.is_floating or leaf.dtype.is_integer or leaf.dtype.is_complex)
                                      and not leaf.dtype.is_quantized)
               for leaf in tf.nest.flatten(data_spec))


def variables(state: RingState) -> list[tf.Variable]:
    """Every variable of `state` (storage first, in data spec flatten order): what a checkpoint holds."""
    extra = [state.episode_index, state.episode_count]
    return list(state.storage) + [state.last_id, state.write_started] + [v for v in extra if v is not None]


@tf.function(jit_compile=True, autograph=False)
def _fetch_add(var, delta):
    """`var += delta`, returning the new value, as ONE atomic step.

    An XLA kernel holds the lock of every resource variable it updates for the whole computation, so the
    read of the new value cannot interleave with another writer's add (`var.assign_add(delta)` returns a
    separate, later read, which can). Inside an outer `jit_compile=True` function this is inlined, and
    the outer computation holds the lock instead. Unlike `tf.CriticalSection`, it compiles under XLA.
    """
    return var.assign_add(delta).read_value()


@tf.function(jit_compile=True, autograph=False)
def fetch_max(var, value):
    """`var = max(var, value)`, returning the new value, as one atomic step (see `_fetch_add`)."""
    return var.assign(tf.maximum(var.read_value(), value)).read_value()


def claim(state: RingState, deps=()) -> tf.Tensor:
    """Claims the next logical step id after `deps`: distinct for every caller, even concurrent ones."""
    return _fetch_add(state.write_started, after(deps, tf.constant(1, tf.int64)))


def after(deps, *tensors):
    """`tensors`, made to wait for `deps` through identities (a data dependency for everything using them).

    `tf.control_dependencies` alone is not enough inside a tf.function: an op whose resource input is
    first captured inside the block counts as depending on the block and gets no control input.
    An identity of a tensor created before the block always gets one.
    """
    deps = [d for d in deps if d is not None]
    if not deps:
        return tensors[0] if len(tensors) == 1 else tensors
    with tf.control_dependencies(deps):
        out = tuple(tf.identity(t) for t in tensors)
    return out[0] if len(out) == 1 else out


def valid_range(last_id, max_length: int, num_steps) -> tuple[tf.Tensor, tf.Tensor]:
    """`[lo, hi)` of logical start ids whose `num_steps` window lies inside the stored steps.

    Stored ids are `[0, last_id]` before the ring wraps and `[last_id + 1 - max_length, last_id]` after;
    a window `s .. s + n - 1` must end at or before `last_id`, so `s < last_id + 2 - n`. Same rule as
    TF-Agents' `_valid_range_ids`.
    """
    n = tf.constant(1 if num_steps is None else num_steps, tf.int64)
    full = last_id >= max_length
    lo = tf.where(full, last_id + 1 - max_length, tf.constant(0, tf.int64))
    hi = tf.maximum(last_id + 2 - n, lo)
    return lo, hi


def rows_for(starts, segments, num_steps, max_length: int, batch_size: int) -> tf.Tensor:
    """Storage rows of windows: `starts`, `segments` [...] -> rows [..., num_steps] (or [...] if None)."""
    if num_steps is None:
        return tf.math.floormod(starts, max_length) * batch_size + segments
    ids = starts[..., None] + tf.range(num_steps, dtype=tf.int64)
    return tf.math.floormod(ids, max_length) * batch_size + segments[..., None]


def gather(state: RingState, rows) -> list[tf.Tensor]:
    """One gather per leaf (`sparse_read`: never a dense read, which would make the next scatter copy)."""
    return [var.sparse_read(rows) for var in state.storage]


def write(state: RingState, flat_items: Sequence[tf.Tensor], batch_size: int, max_length: int,
          episode_ends=None, deps=(), before_data=None):
    """Appends one step to every segment after `deps`: returns (op, new_id). Leaves are [batch_size, ...].

    `before_data(rows)`: an optional op-returning function run after the step id is claimed and
    before any data is written (the prioritized buffer sets the new rows' priorities there).
    """
    new_id = claim(state, deps)
    slot = tf.math.floormod(new_id, max_length)
    # Rows [slot * batch_size, (slot + 1) * batch_size): one contiguous block per leaf.
    rows = slot * batch_size + tf.range(batch_size, dtype=tf.int64)
    if before_data is not None:
        rows = after([before_data(rows)], rows)
    writes = [var.scatter_update(tf.IndexedSlices(value, rows)) for var, value in
              zip(state.storage, flat_items)]
    if state.episode_index is not None:
        counts = state.episode_count.read_value()
        writes.append(state.episode_index.scatter_update(tf.IndexedSlices(counts, rows)))
        with tf.control_dependencies([writes[-1]]):
            # The episode counter advances AFTER the step that ends the episode: that step still belongs
            # to the episode, the next step written in this segment starts a new one.
            ends = tf.cast(episode_ends, tf.int32)
            writes.append(state.episode_count.assign(tf.math.floormod(counts + ends, 2 ** 30)))
    # Publish the step only after all its data is in place; a max, so that a concurrent writer of an
    # older step finishing later never moves `last_id` back.
    published = fetch_max(state.last_id, after(writes, new_id))
    return published, new_id


def clear(state: RingState):
    """Forgets all steps (storage is left in place, as TF-Agents' `clear()`)."""
    ops = [state.last_id.assign(-1), state.write_started.assign(-1)]
    if state.episode_count is not None:
        ops.append(state.episode_count.assign(tf.zeros_like(state.episode_count)))
    return tf.group(*ops)


def stale_mask(state: RingState, starts, max_length: int, gathered) -> tf.Tensor:
    """True where a window starting at `starts` may have been overwritten while it was gathered.

    Read after `gathered` (the gathers). Steps `<= write_started - max_length` share a slot with a step
    whose write has begun, so their rows may already hold newer data.
    """
    handle = state.write_started.handle  # captured before the block, so the read gets the control input
    with tf.control_dependencies(gathered):
        started = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.int64)
    return starts <= started - max_length


def sample_windows(state: RingState, n: int, num_steps, max_length: int, batch_size: int, draw_fn, assert_fn,
                   num_values: int = 1):
    """The reader side of the protocol above: draws `n` windows, gathers them, and redraws any window
    overwritten by a concurrent writer during the gather.

    `draw_fn(lo, hi)` -> (starts, segments, values) draws among the valid starts `[lo, hi)`; `values` is
    a tuple of `num_values` float32 `[n]` tensors describing each draw (probabilities, ...), redrawn with
    it. `assert_fn(lo, hi)` returns the check that `[lo, hi)` can be sampled. Returns
    (flat, starts, segments, values).
    """
    def attempt(mask, starts, segments, values):
        last_id = state.last_id.read_value()
        lo, hi = valid_range(last_id, max_length, num_steps)
        lo, hi = after([assert_fn(lo, hi)], lo, hi)
        new_starts, new_segments, new_values = draw_fn(lo, hi)
        starts = redraw(mask, new_starts, starts)
        segments = redraw(mask, new_segments, segments)
        values = tuple(redraw(mask, new, old) for new, old in zip(new_values, values))
        rows = rows_for(starts, segments, num_steps, max_length, batch_size)
        flat = gather(state, rows)
        stale = stale_mask(state, starts, max_length, flat)
        return stale, starts, segments, values, flat

    zeros = tf.zeros([n], tf.int64)
    first = attempt(tf.ones([n], tf.bool), zeros, zeros, (tf.zeros([n], tf.float32),) * num_values)
    stale, starts, segments, values, flat = tf.while_loop(
        lambda stale, *_: tf.reduce_any(stale),
        lambda stale, s, g, v, f: attempt(stale, s, g, v),
        first)
    return flat, starts, segments, values


def crosses_episode(state: RingState, starts, segments, num_steps, max_length: int, batch_size: int):
    """True where the window `starts .. starts + num_steps - 1` spans more than one episode."""
    if state.episode_index is None or num_steps is None or num_steps == 1:
        return tf.zeros_like(starts, tf.bool)
    first = tf.math.floormod(starts, max_length) * batch_size + segments
    last = tf.math.floormod(starts + num_steps - 1, max_length) * batch_size + segments
    return tf.not_equal(state.episode_index.sparse_read(first), state.episode_index.sparse_read(last))


def count_episode_windows(state: RingState, lo, hi, num_steps, max_length: int, batch_size: int):
    """Number of (segment, start) pairs in `[lo, hi)` whose window stays in one episode (O(capacity))."""
    starts = tf.range(lo, hi)[:, None] + tf.zeros([batch_size], tf.int64)
    segments = tf.zeros_like(starts) + tf.range(batch_size, dtype=tf.int64)
    bad = crosses_episode(state, starts, segments, num_steps, max_length, batch_size)
    return tf.reduce_sum(tf.cast(tf.logical_not(bad), tf.int64))


def redraw(mask, new, old):
    """`new` where `mask`, else `old` (elementwise over the sample batch)."""
    return tf.where(mask, new, old)
