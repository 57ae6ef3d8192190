"""How the ring buffers (`uniform.py`, `prioritized.py`) run their graph code, and the checks they share.

A buffer method is one graph implementation over `_ring` state. `run_in_graph` runs it: inlined inside a
trace, else as a cached ConcreteFunction (XLA-compiled where asked). `sample_from_python` is the eager
`get_next` entry. The argument checks (`check_sample_args`, `ItemChecker`, `check_list_free_spec`,
`sample_check`) and the shaping of sampled results (`window_ids`, `package`) are the same for both
buffers.

A buffer hands `run_in_graph` its device, name scope, data spec and a dict that caches the
ConcreteFunctions (not checkpointed), in one method of its own that `sample_from_python` is given too.

>>> window_ids(tf.constant([4, -1], tf.int64), num_steps=3, stride=2).numpy().tolist()
[[4, 6, 8], [-1, -1, -1]]
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

from replay_tf import specs
from replay_tf.buffers import _ring

# TF-Agents' error text (InvalidArgumentError when the op runs), which code written for it matches on.
EMPTY_SAMPLE_MESSAGE = "TFUniformReplayBuffer is empty. Make sure to add items before sampling the buffer."

# Samples drawn per map call by the unbatched `as_dataset()`: amortizes the per-element tf.data cost.
UNBATCHED_CHUNK = 128


def run_in_graph(name: str, fn: Callable, *args, tensors=(), jit_compile: bool = False, cache: dict,
                 device: str, scope: str, data_spec: Any):
    """Runs `fn(*args, *tensors)` in graph mode under a buffer's `device` and name `scope`.

    Inside a trace (a user's tf.function, a tf.data function) `fn` is called directly. Eagerly, it runs
    as a ConcreteFunction (XLA-compiled if `jit_compile` and XLA can handle every dtype of `data_spec`)
    kept in the buffer's `cache` per (name, args, jit_compile, tensor dtypes and shapes). A traced
    Operation result (an add) is dropped: a tf.function cannot return one, and its side effects run all
    the same.
    """
    if not tf.executing_eagerly():
        with tf.device(device), tf.name_scope(scope):
            return fn(*args, *tensors)
    # Calls from Python are the hot path (one per add / sample): keep one ConcreteFunction per
    # (name, args, input dtypes and shapes) and call it directly, skipping tf.function's dispatch.
    key = (name, args, jit_compile, tuple((t.dtype, tuple(t.shape)) for t in tensors))
    concrete = cache.get(key)
    if concrete is None:
        def run(*ts):
            with tf.device(device), tf.name_scope(scope):
                out = fn(*args, *ts)
            return None if isinstance(out, tf.Operation) else out
        # XLA has no strings (nor variants, resources): such specs run as plain graph functions.
        jit_compile = jit_compile and _ring.xla_compatible(data_spec)
        concrete = cache[key] = tf.function(run, autograph=False, jit_compile=jit_compile
                                            ).get_concrete_function(*tensors)
    return concrete(*tensors)


def make_draw_key() -> tf.Variable:
    """The key of the stateless draws of `get_next` called from Python: int64 `[key, counter]`.

    Create it in the buffer's device scope and keep it out of checkpoints (a stream position, not buffer
    contents).
    """
    return tf.Variable(np.array([np.random.default_rng().integers(2 ** 62), 0], np.int64), trainable=False,
                       name="draw_key")


def next_draw_seed(draw_key: tf.Variable) -> tf.Tensor:
    """The seed of one keyed draw (int64 `[2]`); advances the key's counter by one."""
    return draw_key.assign_add(tf.constant([0, 1], tf.int64))


def sample_from_python(run: Callable, fn: Callable, args: tuple, draw_key: tf.Variable):
    """A buffer's `get_next` called from Python; `run` is the buffer's `run_in_graph`.

    Runs `fn(*args, True)` (the draw keyed by `draw_key`) as one XLA program: its gathers write straight
    into the outputs and its index ops fuse, which costs less than a graph call. A graph function runs
    instead if the spec has dtypes XLA lacks. The keyed program has no asserts (XLA would compile them
    out, logging a warning for each one it drops): a sample that comes back flagged impossible (some
    probability 0) or empty runs again as `fn(*args)` in graph mode, whose asserts raise the error.

    XLA's stateful random ops ignore TF's seeds, so the draw is stateless, keyed by `draw_key`, which
    follows `tf.random.set_seed` like a stateful op's seeds would.
    """
    seed, op_seed = tf.compat.v1.random.get_seed(None)
    if seed is not None:
        tf.raw_ops.AssignVariableOp(resource=draw_key.handle, value=np.array([seed, op_seed], np.int64))
    out = run("get_next", fn, *args, True, jit_compile=True)
    probabilities = out[1].probabilities.numpy()
    if probabilities.size and np.min(probabilities) > 0:
        return out
    return run("get_next", fn, *args)


def check_sample_args(sample_batch_size, num_steps, max_length: int, empty_batch: bool = False):
    """Static `(sample_batch_size, num_steps)` of a sample; `empty_batch`: a `sample_batch_size` of 0 is
    allowed (`get_next` returns an empty batch, as TF-Agents does).

    Raises:
      TypeError: a value that is not a Python int or a constant tensor.
      ValueError: a value below 1 (0 for an allowed empty batch), or `num_steps > max_length`.
    """
    def static(value, name, least=1):
        if value is None:
            return None
        # Python ints skip tf.get_static_value (its tensor-type checks are slow next to the rest).
        static_value = value if type(value) is int else tf.get_static_value(value)
        if static_value is None:
            raise TypeError(f"{name} must be a Python int (or a constant tensor), got {value!r}")
        static_value = int(static_value)
        if static_value < least:
            raise ValueError(f"{name} ({static_value}) must be >= {least}")
        return static_value
    sample_batch_size = static(sample_batch_size, "sample_batch_size", 0 if empty_batch else 1)
    num_steps = static(num_steps, "num_steps")
    if num_steps is not None and num_steps > max_length:
        raise ValueError(f"num_steps ({num_steps}) must be <= max_length ({max_length}): a window "
                         f"cannot be longer than one ring segment")
    return sample_batch_size, num_steps


def assert_can_sample(lo, hi, num_steps):
    """Asserts that the valid starts `[lo, hi)` are not empty (InvalidArgumentError when run)."""
    # TF-Agents' text first (its tests and users match on it; it says "empty" for too-few-steps too).
    return tf.debugging.assert_greater(
        hi, lo, message=(f"{EMPTY_SAMPLE_MESSAGE} (no valid window to sample: it is empty or holds "
                         f"fewer than num_steps ({num_steps or 1}) steps per segment; add items with "
                         f"add_batch first)"))


def sample_check(num_steps, flagged: bool) -> Callable:
    """The `assert_fn` of `_ring.sample_windows`: `assert_can_sample`, or none in the eager path's
    keyed program (`flagged`), where a sample that cannot be drawn comes back flagged instead (see
    `sample_from_python`)."""
    if flagged:
        return lambda lo, hi: None
    return lambda lo, hi: assert_can_sample(lo, hi, num_steps)


def check_list_free_spec(data_spec) -> None:
    """Raises ValueError if `data_spec` holds Python lists, which tf.data would stack into one tensor."""
    if any(isinstance(s, list) for s in _all_nodes(data_spec)):
        raise ValueError(f"as_dataset: data_spec contains Python lists, which tf.data would stack into "
                         f"one tensor; use tuples instead. Spec:\n{specs.describe(data_spec, 'spec')}")


class ItemChecker:
    """Validates `add_batch` arguments: `checker(items)` -> the flat leaves (+ the episode-end flags when
    `episode_end_fn` is given), cast to the spec's dtypes.

    Raises (on call):
      TypeError: wrong structure or dtype. ValueError: wrong shape or outer dimension, or an
      `episode_end_fn` result that is not `[batch_size]`. The message names the nested path, the
      expected and the received value.
    """

    def __init__(self, data_spec, batch_size: int, episode_end_fn: Callable[[Any], tf.Tensor] | None):
        self._data_spec = data_spec
        self._batch_size = batch_size
        self._episode_end_fn = episode_end_fn
        self._expected_leaves = None

    def __call__(self, items) -> tuple:
        flat = self._validated_fast(items)
        if flat is None:
            # numpy and Python leaves are cast to the spec's dtypes, as TF-Agents stores them.
            flat = specs.validate(items, self._data_spec, outer_dims=[self._batch_size], root="items", cast=True)
        extra = ()
        if self._episode_end_fn is not None:
            ends = tf.convert_to_tensor(self._episode_end_fn(items))
            if ends.shape.rank is not None and ends.shape.as_list() != [self._batch_size]:
                raise ValueError(f"episode_end_fn must return a bool [batch_size={self._batch_size}] "
                                 f"tensor, got shape {ends.shape}")
            extra = (tf.cast(ends, tf.bool),)
        return tuple(flat) + extra

    def _validated_fast(self, items):
        """The flat leaves if `items` are eager tensors of exactly the spec's dtypes and batch shapes.

        The common case of a collect loop, checked in a few microseconds; anything else (numpy,
        symbolic tensors, mismatches) returns None and goes through `specs.validate` for its errors.
        """
        if not tf.executing_eagerly():
            return None
        try:
            tf.nest.assert_same_structure(items, self._data_spec, check_types=False)
        except (TypeError, ValueError):
            return None
        flat = tf.nest.flatten(items)
        expected = self._expected_leaves
        if expected is None:
            expected = self._expected_leaves = [
                (leaf.dtype, tuple([self._batch_size] + leaf.shape.as_list()))
                for leaf in tf.nest.flatten(self._data_spec)]
        for value, (dtype, shape) in zip(flat, expected):
            if not isinstance(value, tf.Tensor) or value.dtype != dtype or tuple(value.shape) != shape:
                return None
        return flat


def add(state: _ring.RingState, data_spec, batch_size: int, max_length: int, tensors, before_data=None):
    """The graph side of `add_batch`: writes `tensors` (an `ItemChecker` result) as one step of every
    segment; `before_data`: as `_ring.write` (runs once the step id is claimed). Returns the op."""
    flat = list(tensors[:len(state.storage)])
    ends = tensors[-1] if state.episode_index is not None else None
    # Dimensions unknown while tracing are checked when the graph runs (EnsureShape feeds the write,
    # so a wrong batch fails before anything is written).
    # The checks run one after another in flatten order, so a wrong batch is always reported for the
    # same (first) leaf rather than for whichever check TF happens to schedule first.
    checks = []
    for i, (value, leaf) in enumerate(zip(flat, tf.nest.flatten(data_spec))):
        expected = tf.TensorShape([batch_size]).concatenate(leaf.shape)
        if not value.shape.is_fully_defined():
            with tf.control_dependencies(checks[-1:]):
                flat[i] = tf.ensure_shape(value, expected)
            checks.append(flat[i])  # the step id is claimed only after the shape check passed
    published, _ = _ring.write(state, flat, batch_size, max_length, ends, deps=checks, before_data=before_data)
    return tf.group(published)


def window_ids(first_ids, num_steps, stride: int = 1):
    """Ids of sampled windows: `first_ids` `[n]` -> `[n, num_steps]` (`[n]` if `num_steps` is None), step
    k being `first + k * stride`; a flagged first id (-1) flags its whole window."""
    if num_steps is None:
        return first_ids
    steps = tf.range(num_steps, dtype=tf.int64)
    if stride != 1:
        steps *= stride
    return tf.where(first_ids[:, None] >= 0, first_ids[:, None] + steps, -1)


def package(data_spec, flat, ids, info_values, sample_batch_size, num_steps, time_stacked):
    """Shapes gathered leaves `[n, ...]`, their ids and `[n]` info values as TF-Agents returns them:
    without the batch dimension if `sample_batch_size` is None, and with `num_steps` not `time_stacked`,
    data and ids as tuples of `num_steps` steps. Returns `(data, ids, info_values)`."""
    if sample_batch_size is None:
        flat = [t[0] for t in flat]
        ids = ids[0]
        info_values = [v[0] for v in info_values]
    data = specs.pack_sequence_as(data_spec, flat)
    if num_steps is not None and not time_stacked:
        axis = 1 if sample_batch_size is not None else 0
        data = tuple(tf.nest.map_structure(lambda t, i=i: tf.gather(t, i, axis=axis), data)
                     for i in range(num_steps))
        ids = tuple(tf.gather(ids, i, axis=axis) for i in range(num_steps))
    return data, ids, info_values


def _all_nodes(nest):
    yield nest
    if isinstance(nest, dict):
        for v in nest.values():
            yield from _all_nodes(v)
    elif isinstance(nest, (list, tuple)):
        for v in nest:
            yield from _all_nodes(v)
