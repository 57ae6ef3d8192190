"""Compiles pattern configs into a plain tf.data graph (no custom op, no py_function).

The step stream is cut into blocks of consecutive steps (a whole episode, or `block_size` steps) and a
`Dataset.scan` carries what crosses block boundaries: the last `history` values of every column a pattern
reads, the step index within the episode, the buffer fill and, per config, `steps_since_applied`. Inside
a block everything is vectorized: the left value of every condition for every step, which configs fire
at which step (at append time, and again at the end of the episode for configs not applied at that step),
and one `tf.gather` per pattern leaf. The items of a block come out in Reverb's order (step, then
append/end-of-episode, then config) and an `ItemsDataset` (or `unbatch()`) turns them into elements.

The semantics are those of Reverb's StructuredWriter feeding a PatternDataset; the shared rules live in
`configs.py` and the per-condition comparison in `conditions.ConditionNode.evaluate`, which the online
`evaluator.PatternEvaluator` uses too.

Iterators over the result are checkpointable (scan, map, unbatch and rebatch all save their state).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf
import tree

from rlds_tf.nests import lists_to_tuples
from rlds_tf.patterns import conditions as conditions_lib
from rlds_tf.patterns import configs as configs_lib
from rlds_tf.patterns import items_dataset
from rlds_tf.patterns import nodes

_log = logging.getLogger(__name__)



def _condition_left(condition, *, step_index, buffer_length, is_end: bool, flat_block):
    """The left value of a condition that needs no carried state, per step of a block ([B] int64), or None
    for a data condition Reverb never meets."""
    if condition.left == "step_index":
        return step_index
    if condition.left == "buffer_length":
        return buffer_length
    if condition.left == "is_end_episode":
        return (tf.ones_like if is_end else tf.zeros_like)(step_index)
    if condition.left == "flat_source_index":
        column = flat_block[condition.flat_source_index]
        if conditions_lib.data_column_problem(condition.flat_source_index, column.dtype,
                                              column.shape[1:].num_elements()) is not None:
            return None  # Reverb: never met (logged once by compile_blocks)
        column = tf.reshape(column, [-1])  # one value per step
        if column.dtype == tf.bool:
            return tf.cast(column, tf.int64)
        # Reverb casts the value to a C++ int (int32, wrapping) before comparing.
        return tf.cast(tf.cast(column, tf.int32), tf.int64)
    raise ValueError(f"no stateless left value for {condition.left!r}")


def _evaluate(condition, left: Optional[tf.Tensor], like: tf.Tensor) -> tf.Tensor:
    """`condition` on `left` per step; all False when `left` is None (a data condition Reverb never meets)."""
    if left is None:
        return tf.zeros_like(like, dtype=tf.bool)
    return condition.evaluate(left, tf.truncatemod)


def _all(masks: list, like: tf.Tensor) -> tf.Tensor:
    """The AND of `masks`, all True (shaped like `like`) when there are none: a config without conditions."""
    if not masks:
        return tf.ones_like(like, dtype=tf.bool)
    out = masks[0]
    for m in masks[1:]:
        out = tf.logical_and(out, m)
    return out


def compile_blocks(blocks: tf.data.Dataset, configs: Sequence[Any], step_spec: Any, *,
                   respect_episode_boundaries: bool,
                   is_last_fn: Callable[[Any], tf.Tensor],
                   cumulative_history: bool = True, in_parallel: bool = True) -> tf.data.Dataset:
    """Applies `configs` to a dataset of step blocks (each a nest shaped like `step_spec` plus a leading dim).

    Args:
      blocks: consecutive steps, stacked: element i holds steps [n_i, n_i + B_i) of the stream. A block
        may be a tuple `(steps, extra)`: the steps' leaves then come first in its flattening, so that
        `is_last_fn` can read a per-step flag computed beside them.
      configs: `StructuredWriterConfig`s (or their protos); all must produce the same structure.
      step_spec: the spec of one step.
      respect_episode_boundaries: clear the history at the end of every episode.
      is_last_fn: block -> [B] bool, True where a step ends its episode.
      cumulative_history: the implicit buffer-length rule of Reverb's PatternDataset (see
        `configs.with_buffer_length_conditions`).
      in_parallel: evaluate blocks in parallel, after a scan that carries only the state across them;
        False evaluates each block inside the scan, which builds one function instead of two (its graph
        is most of a pipeline's setup time): for streams of few large blocks (as `episodes_to_blocks`
        and `steps_to_blocks` report them), whose evaluation costs little next to reading their steps.

    Returns:
      A dataset of items with `configs.infer_signature(configs, step_spec)` as element spec.
    """
    # tf.data reads Python lists as tensors, so list nodes of a pattern come out as tuples.
    signature = lists_to_tuples(configs_lib.infer_signature(configs, step_spec))
    configs = configs_lib.with_buffer_length_conditions(configs_lib.validate_configs(configs, step_spec),
                                                        cumulative=cumulative_history)
    compiler = _BlockCompiler(configs, step_spec, signature, respect_episode_boundaries=respect_episode_boundaries,
                              is_last_fn=is_last_fn)
    if compiler.ssa_configs or not in_parallel:
        # steps_since_applied depends on when the config last fired: evaluate inside the scan (as large
        # blocks are, see `in_parallel`).
        items = blocks.scan(compiler.initial_state(), tf.autograph.experimental.do_not_convert(compiler.step_fn))
    else:
        # Everything else only needs the carried state: evaluate blocks in parallel, in order.
        items = blocks.scan(compiler.initial_state(),
                            tf.autograph.experimental.do_not_convert(compiler.carry_fn)).map(
            tf.autograph.experimental.do_not_convert(
                lambda state, block: compiler.step_fn(state, block, carry=False)[1]),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if not compiler.ragged_leaves:
        return items_dataset.ItemsDataset(items)
    return items.unbatch().map(compiler.cut)


class _BlockCompiler:
    """What the configs need from every block, worked out once, and the block functions built from it.

    `step_fn` (a block's items, and the state after it) runs its stages top to bottom: `block_steps`,
    `step_counters`, `fire_masks`, `apply_steps_since_applied`, `skip_end_when_appended`, `item_order`,
    `column_buffers`, `gather_items`, `next_state`. Every op they make is a node of the traced function,
    and every node adds to the pipeline's setup time: constants go through one `_Constants` per function.
    """

    def __init__(self, configs: Sequence[configs_lib.StructuredWriterConfig], step_spec: Any, signature: Any, *,
                 respect_episode_boundaries: bool, is_last_fn: Callable[[Any], tf.Tensor]):
        self.configs = configs
        self.signature = signature
        self.respect_episode_boundaries = respect_episode_boundaries
        self.is_last_fn = is_last_fn
        self.flat_spec = flat_spec = tree.flatten(step_spec)
        for index in sorted({c.flat_source_index for config in configs for c in config.conditions
                             if c.left == "flat_source_index"}):
            problem = conditions_lib.data_column_problem(index, tf.as_dtype(flat_spec[index].dtype),
                                                         tf.TensorShape(flat_spec[index].shape).num_elements())
            if problem is not None:
                _log.error(problem)
        self.num_configs = len(configs)
        # Rows of history each column needs before the block's rows (0: the column is not read back).
        self.histories = configs_lib.column_histories(configs)
        self.capacity = max(self.histories.values())
        self.columns = sorted(c for c, h in self.histories.items() if h > 0)
        # Configs with a steps_since_applied condition: their firing depends on the previous one.
        self.ssa_configs = [k for k, c in enumerate(configs)
                            if any(x.left == "steps_since_applied" for x in c.conditions)]
        self.has_end_conditions = any(x.left == "is_end_episode" for c in configs for x in c.conditions)
        self.flat_signature = tree.flatten(signature)
        self.patterns = [tree.flatten(configs_lib.unpack_pattern(c)) for c in configs]
        # Leaves whose slice length differs between configs are padded to the longest and cut after unbatch.
        self.ragged_leaves = [i for i, spec in enumerate(self.flat_signature)
                              if spec.shape.rank and spec.shape[0] is None
                              and any(not p[i].squeeze for p in self.patterns)]
        self.unknown_shape = {c: not tf.TensorShape(flat_spec[c].shape).is_fully_defined() for c in self.columns}

    def initial_state(self) -> dict:
        """The state before the first block; it holds only what these configs read: every entry is an input
        and an output of the traced function."""
        state = {
            "hist": tuple(self._zeros_history(c) for c in self.columns),
            "s": tf.constant(0, tf.int64),  # step index of the next step within its episode
        }
        if any(self.unknown_shape.values()):
            state["first"] = tf.constant(True)  # no block seen yet (histories of those are placeholders)
        if not self.respect_episode_boundaries:
            # steps in the buffer before the next step, capped at `capacity` (otherwise the step index + 1)
            state["n"] = tf.constant(0, tf.int64)
        if self.ssa_configs:
            state["ssa"] = tf.zeros([len(self.ssa_configs)], tf.int64)  # steps_since_applied of those configs
        return state

    def _zeros_history(self, c: int) -> tf.Tensor:
        """The initial history of column `c`: `histories[c]` rows of zeros (unknown dimensions as 0)."""
        shape = [self.histories[c]] + [0 if d is None else d
                                       for d in tf.TensorShape(self.flat_spec[c].shape).as_list()]
        return tf.zeros(shape, self.flat_spec[c].dtype)

    def carry_fn(self, state, block):
        """Only what crosses blocks: histories and counters (cheap, so the scan is not the bottleneck)."""
        const = _Constants()
        flat_block = tree.flatten(block)
        is_last = tf.reshape(tf.cast(self.is_last_fn(block), tf.bool), const([-1], tf.int32))
        size = tf.shape(is_last, out_type=tf.int64)[0]
        buffers = self.column_buffers(state, flat_block, const(0, tf.int32))
        t = tf.range(const(0, tf.int64), size, const(1, tf.int64))
        return self.next_state(buffers, is_last, t, size, state, state.get("ssa"), const), (state, block)

    def step_fn(self, state, block, carry=True):
        """`(next state, items)` of a block; with `carry` False the items alone (`(None, items)`)."""
        const = _Constants()
        flat_block, is_last, size, t = self.block_steps(block, const)
        step_index, buffer_length = self.step_counters(state, is_last, t, size, const)
        fire_append, fire_end, ssa_conds = self.fire_masks(
            dict(step_index=step_index, buffer_length=buffer_length, flat_block=flat_block), is_last)
        ssa_new = state.get("ssa")
        if self.ssa_configs:
            ssa_new = self.apply_steps_since_applied(fire_append, fire_end, ssa_conds, ssa_new, size)
        if self.has_end_conditions:
            self.skip_end_when_appended(fire_append, fire_end)
        item_step, item_config = self.item_order(fire_append, fire_end, const)
        buffers = self.column_buffers(state, flat_block, const(0, tf.int32))
        out = self.gather_items(buffers, item_step, item_config, const)
        if not carry:
            return None, out
        return self.next_state(buffers, is_last, t, size, state, ssa_new, const), out

    def block_steps(self, block, const: "_Constants") -> tuple:
        """The block's flat leaves, its per-step `is_last` flags ([B] bool), its size B and `t` = [0, B)."""
        flat_block = tree.flatten(block)
        # The constants the stages share, made first and in this order (later calls return these).
        const(0, tf.int32), const(0, tf.int64), const(1, tf.int64)
        flat = const([-1], tf.int32)
        is_last = tf.reshape(tf.cast(self.is_last_fn(block), tf.bool), flat)
        size = tf.size(is_last, out_type=tf.int64)
        t = tf.range(const(0, tf.int64), size, const(1, tf.int64))
        return flat_block, is_last, size, t

    def step_counters(self, state, is_last, t, size, const: "_Constants") -> tuple:
        """Per step of the block: its index within its episode and the buffer length when it is appended,
        the left values of the `step_index` and `buffer_length` conditions."""
        axis0, zero, one = const(0, tf.int32), const(0, tf.int64), const(1, tf.int64)
        # segment[t]: the episode ends before step t within the block (0 for steps of the carried episode).
        segment = tf.cumsum(tf.cast(is_last, tf.int64), axis=axis0, exclusive=True)
        # seg_start[k]: the first step of segment k (the step after the k-th episode end); B + 1 segments
        # bound the count (segment[t] <= t), and segments with no step are never gathered.
        seg_start = tf.math.unsorted_segment_min(t, segment, num_segments=size + one)
        # step_index[t]: steps of its episode before t: `s + t` in the carried episode (segment 0), else
        # t - seg_start[segment[t]].
        step_index = tf.where(segment == zero, state["s"] + t, t - tf.gather(seg_start, segment, axis=axis0))
        if self.respect_episode_boundaries:
            filled = step_index + one  # the buffer is cleared whenever the step index is reset
        else:
            filled = state["n"] + t + one  # `n` steps before the block, then one more per step
        return step_index, tf.minimum(filled, const(self.capacity, tf.int64))

    def fire_masks(self, lefts: dict, is_last) -> tuple:
        """Per config, where its stateless conditions hold: at append time ([B] bool) and at the end of the
        episode (only where some config has an is_end_episode condition or steps_since_applied is
        scanned); and its steps_since_applied conditions, which `apply_steps_since_applied` evaluates."""
        fire_append, fire_end, ssa_conds = [], [], []
        for config in self.configs:
            stateless = [c for c in config.conditions if c.left != "steps_since_applied"]
            at_append = _all([_evaluate(c, _condition_left(c, is_end=False, **lefts), is_last)
                              for c in stateless], is_last)
            fire_append.append(at_append)
            ssa_conds.append([c for c in config.conditions if c.left == "steps_since_applied"])
            if not self.has_end_conditions and not self.ssa_configs:
                continue  # (fire_end is only read where is_end_episode conditions or a scan need it)
            if self.has_end_conditions and any(c.left == "is_end_episode" for c in config.conditions):
                at_end = _all([_evaluate(c, _condition_left(c, is_end=True, **lefts), is_last)
                               for c in stateless], is_last)
            else:
                at_end = at_append
            fire_end.append(tf.logical_and(is_last, at_end))  # the end pass runs only at the episode's last step
        return fire_append, fire_end, ssa_conds

    def apply_steps_since_applied(self, fire_append: list, fire_end: list, ssa_conds: list, ssa0, size):
        """Narrows the masks of the steps_since_applied configs (in place) to where those conditions hold
        too, and returns their counters after the block: firing resets a counter, so the steps are scanned
        in order."""
        ssa_configs = self.ssa_configs
        cond_a = tf.stack([fire_append[k] for k in ssa_configs], 1)  # [B, len(ssa_configs)]
        cond_e = tf.stack([fire_end[k] for k in ssa_configs], 1)

        def ssa_step(carry, x):
            ssa, _, _ = carry
            a_in, e_in = x
            ssa = ssa + 1  # incremented once per step, before the config is tried
            ok = tf.stack([_all([c.evaluate(ssa[j], tf.truncatemod) for c in ssa_conds[k]],
                                ssa[j]) for j, k in enumerate(ssa_configs)])
            a = tf.logical_and(a_in, ok)
            e = tf.logical_and(tf.logical_and(e_in, ok), tf.logical_not(a))  # (not twice at one step)
            ssa = tf.where(tf.logical_or(a, e), tf.zeros_like(ssa), ssa)
            return ssa, a, e

        init = (ssa0, tf.zeros([len(ssa_configs)], tf.bool), tf.zeros([len(ssa_configs)], tf.bool))
        ssa_all, a_all, e_all = tf.scan(ssa_step, (cond_a, cond_e), initializer=init)
        for j, k in enumerate(ssa_configs):
            fire_append[k] = a_all[:, j]
            fire_end[k] = e_all[:, j]
        # The counters after the last step; an empty block leaves them as they were.
        return tf.cond(size > 0, lambda: ssa_all[-1], lambda: ssa0)

    @staticmethod
    def skip_end_when_appended(fire_append: list, fire_end: list) -> None:
        """A config never applies twice at one step: the end-of-episode pass skips those applied (in place)."""
        for k in range(len(fire_end)):
            fire_end[k] = tf.logical_and(fire_end[k], tf.logical_not(fire_append[k]))

    def item_order(self, fire_append: list, fire_end: list, const: "_Constants") -> tuple:
        """The block's items in Reverb's order (by step, then append before end-of-episode, then by config):
        each item's step ([N] int64, its row in the block) and config (None where there is one config)."""
        if self.has_end_conditions:
            fired = tf.stack([tf.stack(fire_append, 1), tf.stack(fire_end, 1)], 1)  # [B, 2, K]
            where = tf.where(fired)  # [N, 3] indices (step, pass, config), row-major: Reverb's order
            return where[:, 0], where[:, 2]
        if self.num_configs == 1:
            # Without is_end_episode conditions nothing fires at the end that did not fire at append.
            return tf.reshape(tf.where(fire_append[0]), const([-1], tf.int32)), None  # (config never read)
        where = tf.where(tf.stack(fire_append, 1))  # [N, 2] indices (step, config) of [B, K]
        return where[:, 0], where[:, 1]

    def column_buffers(self, state, flat_block, axis) -> dict:
        """Per carried column: its history, then the block's rows (the rows of step t at `history + t`)."""
        buffers = {}
        for j, c in enumerate(self.columns):
            old = state["hist"][j]
            if self.unknown_shape[c]:
                old = _history_or_placeholder(old, flat_block[c], self.histories[c], state["first"])
            buffers[c] = tf.concat([old, flat_block[c]], axis)
        return buffers

    def gather_items(self, buffers: dict, item_step, item_config, const: "_Constants") -> Any:
        """The items' values, one `tf.gather` per pattern leaf and config (a `tf.where` on the item's config
        picks among configs): the signature's nest, or with ragged leaves `(flat items, their lengths)`."""
        axis0 = const(0, tf.int32)
        rows_of: dict = {}  # (one index tensor per distinct row offset: every op costs building time)

        def item_rows(offset: int) -> tf.Tensor:
            """Each item's step shifted by `offset` rows."""
            if offset not in rows_of:
                rows_of[offset] = item_step + const(offset, tf.int64)
            return rows_of[offset]

        def gather_node(node, pad_to=None):
            """The rows `node` selects for every item, padded to `pad_to` rows when given."""
            buf = buffers[node.flat_source_index]
            h = self.histories[node.flat_source_index]
            # Row of step t in `buf` is h + t; offset -1 is step t itself, so offset o is row h + t + 1 + o.
            if node.squeeze:
                return tf.gather(buf, item_rows(h + 1 + node.stop), axis=axis0)
            offsets = tf.constant(nodes.node_offsets(node), tf.int64)
            # [N, len(offsets)] rows: row h + t + 1 of each item plus each of the node's offsets.
            values = tf.gather(buf, item_rows(h + 1)[:, None] + offsets[None, :], axis=axis0)
            if pad_to is not None and pad_to > len(nodes.node_offsets(node)):
                pad = [[0, 0], [0, pad_to - len(nodes.node_offsets(node))]] + [[0, 0]] * (values.shape.rank - 2)
                values = tf.pad(values, pad)
            return values

        flat_items, lengths = [], []
        for i in range(len(self.flat_signature)):
            leaf_nodes = [p[i] for p in self.patterns]
            pad_to = max(len(nodes.node_offsets(n)) for n in leaf_nodes) if i in self.ragged_leaves else None
            if self.num_configs == 1:
                flat_items.append(gather_node(leaf_nodes[0], pad_to))
            else:
                value = None
                for k, node in enumerate(leaf_nodes):
                    gathered = gather_node(node, pad_to)
                    if value is None:
                        value = gathered
                    else:
                        mask = tf.reshape(item_config == k, [-1] + [1] * (gathered.shape.rank - 1))
                        value = tf.where(mask, gathered, value)
                flat_items.append(value)
            if i in self.ragged_leaves:
                # Each item's slice length for this leaf: that of its config's node.
                lengths.append(tf.gather(tf.constant([len(nodes.node_offsets(p[i])) for p in self.patterns],
                                                     tf.int64),
                                         tf.zeros_like(item_step) if item_config is None else item_config))
        if self.ragged_leaves:
            return tuple(flat_items), tuple(lengths)
        return tree.unflatten_as(self.signature, flat_items)

    def next_state(self, buffers, is_last, t, size, state, ssa, const) -> dict:
        """The state after a block: the newest `history` rows of every column and the counters."""
        new = {"hist": tuple(_last_rows(buffers[c], self.histories[c], const) for c in self.columns),
               "s": _next_step_index(is_last, t, size, state["s"], const)}
        if "first" in state:
            new["first"] = tf.constant(False)
        if "n" in state:
            new["n"] = tf.minimum(state["n"] + size, const(self.capacity, tf.int64))
        if "ssa" in state:
            new["ssa"] = ssa
        return new

    def cut(self, flat_items, lengths):
        """One unbatched item with its ragged leaves cut back to their config's slice length."""
        flat_items = list(flat_items)
        for j, i in enumerate(self.ragged_leaves):
            flat_items[i] = flat_items[i][:lengths[j]]
        flat_items = [tf.ensure_shape(x, spec.shape) for x, spec in zip(flat_items, self.flat_signature)]
        return tree.unflatten_as(self.signature, flat_items)


class _Constants:
    """The constants of one traced function, each made once (every node adds to the pipeline's setup)."""

    def __init__(self):
        self._made: dict = {}

    def __call__(self, value: Any, dtype: tf.DType) -> tf.Tensor:
        key = (repr(value), dtype)
        if key not in self._made:
            self._made[key] = tf.constant(value, dtype)
        return self._made[key]


def _next_step_index(is_last: tf.Tensor, t: tf.Tensor, size: tf.Tensor, s0: tf.Tensor, const: _Constants
                     ) -> tf.Tensor:
    """The step index (within its episode) of the step after a block of `size` steps whose first step has
    index `s0`: the steps after the block's last episode end, or `s0 + size` if no episode ends in it."""
    zero = const(0, tf.int64)
    # (1 + the position of the last episode end; 0 if none, and for an empty block, whose maximum is lower)
    end = tf.reduce_max(tf.where(is_last, t + const(1, tf.int64), zero), axis=const(0, tf.int32))
    return tf.where(end > zero, size - end, s0 + size)


def _last_rows(buffer: tf.Tensor, rows: int, const: _Constants) -> tf.Tensor:
    """The last `rows` rows of a buffer that has at least that many, with that leading dimension known
    statically: a scan whose state changes shape traces its function again (the first pass pays for it)."""
    last = tf.strided_slice(buffer, const([-rows], tf.int32), const([0], tf.int32), const([1], tf.int32),
                            end_mask=1)
    last.set_shape([rows, *last.shape[1:]])
    return last


def _history_or_placeholder(history: tf.Tensor, block: tf.Tensor, length: int, first: tf.Tensor) -> tf.Tensor:
    """The carried history of a column whose step shape is not static, or zeros shaped like this block's.

    Zeros stand in before the first block and when the step shape changed (a new episode with other
    shapes); patterns never read them, since a config waits until its history is in the buffer.
    """
    same_shape = tf.reduce_all(tf.equal(tf.shape(history)[1:], tf.shape(block)[1:]))
    return tf.cond(tf.logical_and(tf.logical_not(first), same_shape), lambda: history,
                   lambda: tf.zeros(tf.concat([[length], tf.shape(block)[1:]], 0), block.dtype))


def episodes_to_blocks(episodes: tf.data.Dataset, steps_key: str,
                       block_size: Optional[int] = None) -> tuple[tf.data.Dataset, Any, bool]:
    """Blocks of steps from a dataset of episodes, the spec of one step, and whether the blocks are large
    (`_is_large`: evaluate them in the scan, see `compile_blocks`' `in_parallel`).

    Episodes hold their steps either as a nested `tf.data.Dataset` or, on the vectorized path, as stacked
    tensors with a leading time dimension; stacked episodes are one block each. Nested steps of a fully
    known shape are read `_EPISODES_PER_GROUP` episodes at a time: each group's steps are flattened
    (`flat_map`) and cut into blocks of `block_size` steps (default: about `_BLOCK_BYTES`, at most
    `_MAX_BLOCK_STEPS`), which run across the episodes of the group: the compiled graph finds episode
    ends from `is_last`, exactly as Reverb's PatternDataset reads the flattened steps. Large blocks
    matter because each block has a fixed cost in the compiled functions, which small blocks (one per
    short episode) pay every few steps (benchmarks/bench_patterns.py compares). The groups go through a
    deterministic `interleave` with `cycle_length=1`: blocks come out in stream order, however many a
    group has (so endless episodes stream too), while the next groups are already read in parallel
    (reading a nested steps dataset costs more than everything after it). Other nested steps (a shape
    that may change from one episode to the next) are batched per episode, one block each.
    """
    steps_spec = episodes.element_spec[steps_key]
    if not isinstance(steps_spec, tf.data.DatasetSpec):
        step_spec = tree.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), steps_spec)
        return episodes.map(lambda e: e[steps_key]), step_spec, False
    step_spec = steps_spec.element_spec
    rows = _block_rows(step_spec, block_size)
    if rows is not None:
        # (each group a structure of datasets, like an episode's; no map to pick the steps first: every
        # function of a pipeline adds to the time it takes to build and start)
        groups = episodes.window(_EPISODES_PER_GROUP)
        return groups.interleave(lambda group: group[steps_key].flat_map(lambda steps: steps).batch(rows),
                                 cycle_length=1,
                                 block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=True), step_spec, _is_large(rows)
    # Shapes may differ between episodes, so blocks never mix two: one block per episode (a batch larger
    # than any episode), several episodes at once; with exactly one element per input, a deterministic
    # interleave keeps the episodes in order.
    return episodes.interleave(lambda e: e[steps_key].batch(_WHOLE_EPISODE), cycle_length=_PARALLEL_EPISODES,
                               block_length=1, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=True), step_spec, False


def _is_large(rows: Optional[int]) -> bool:
    """Whether blocks of `rows` steps (None: one per step or episode) hold at least `_LARGE_BLOCK_STEPS`."""
    return rows is not None and rows >= _LARGE_BLOCK_STEPS


def steps_to_blocks(steps: tf.data.Dataset, block_size: Optional[int] = None) -> tuple[tf.data.Dataset, bool]:
    """Blocks of a flat stream of steps: `block_size` steps each (default: about `_BLOCK_BYTES`, at most
    `_MAX_BLOCK_STEPS`) when every leaf of a step has a fully known shape, else one step each (steps of
    different shapes cannot be stacked). Blocks span episode ends: `compile_blocks` finds those. Also
    whether the blocks are large (as `episodes_to_blocks` says)."""
    rows = _block_rows(steps.element_spec, block_size)
    return steps.batch(rows if rows is not None else 1), _is_large(rows)


def _block_rows(step_spec: Any, block_size: Optional[int]) -> Optional[int]:
    """Steps per block for steps of `step_spec`, or None if some leaf's shape is not fully known."""
    leaves = tree.flatten(step_spec)
    if not leaves or not all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in leaves):
        return None
    row_bytes = max(1, sum(max(s.dtype.size, 1) * s.shape.num_elements() for s in leaves))
    return block_size or min(max(_BLOCK_BYTES // row_bytes, 1), _MAX_BLOCK_STEPS)


# Blocks of flattened nested steps: about this many bytes (enough steps to spread a block's fixed cost;
# benchmarks/bench_patterns.py compares sizes), and at most this many steps.
_BLOCK_BYTES = 512 * 1024
_MAX_BLOCK_STEPS = 2048
_LARGE_BLOCK_STEPS = 256
_EPISODES_PER_GROUP = 16
_WHOLE_EPISODE = 2 ** 62
_PARALLEL_EPISODES = 4
