"""`UniformReplayBuffer`: TF-Agents' `TFUniformReplayBuffer` API on plain `tf.Variable` storage.

Same ring semantics as TF-Agents (which windows are valid, wrap handling, logical order of
`gather_all`, ids and probabilities in `BufferInfo`), without its `tf.CriticalSection`, so every add and
sample path also compiles with `tf.function(jit_compile=True)`. Storage layout and the lock-free
reader/writer protocol are described in `_ring.py`.

XLA notes: `gather_all` and the deterministic `as_dataset` have data-dependent shapes and are not XLA
programs. XLA compiles `tf.debugging` asserts out, so under `jit_compile=True` sampling a buffer with no
valid window cannot raise; it returns ids -1 and probability 0 instead (check `probabilities > 0`).
Eager calls run as XLA programs unless the spec has dtypes XLA lacks (strings): then as graph functions.
Memory: storage is exactly `capacity * bytes per item` plus three scalars (episode-aware: + 4 bytes per
step); there is no id table, since ids are computed from the ring position.

>>> import tensorflow as tf
>>> rb = UniformReplayBuffer(tf.TensorSpec([2], tf.float32), batch_size=2, max_length=3)
>>> for t in range(4):
...     rb.add_batch(tf.constant([[t, 0.], [t, 1.]]))
>>> rb.gather_all()[:, :, 0].numpy().tolist()   # the 3 newest steps of each segment, oldest first
[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
>>> data, info = rb.get_next(sample_batch_size=5, num_steps=2)
>>> data.shape.as_list(), info.ids.shape.as_list(), info.probabilities.shape.as_list()
([5, 2, 2], [5, 2], [5])
>>> int(rb.num_frames())
6
"""
from __future__ import annotations

import collections
from typing import Any, Callable

import tensorflow as tf

from replay_tf import specs
from replay_tf.buffers import _execution
from replay_tf.buffers import _live_samples
from replay_tf.buffers import _ring
from replay_tf.buffers import replay_buffer

BufferInfo = collections.namedtuple("BufferInfo", ["ids", "probabilities"])
BufferInfo.__doc__ = """Sample metadata, as TF-Agents' `replay_buffer.BufferInfo`.

ids: logical step ids of the sampled items (shape `[B]`, `[B, T]`, or a tuple of T `[B]` tensors).
probabilities: the probability with which each sample was drawn (`[B]`).
"""

# TF-Agents' error text (InvalidArgumentError when the op runs), which code written for it matches on.
_EMPTY_READ_MESSAGE = "TFUniformReplayBuffer is empty. Make sure to add items before asking the buffer for data."

# The mark of a chunk's first sample in the unbatched `as_dataset()`: never a `last_id` (those are >= -1).
_KEEP_ANYWAY = -2


def end_of_episode_from_step_type(items) -> tf.Tensor:
    """Episode ends of a TF-Agents `Trajectory` batch: `next_step_type == LAST` or `step_type == LAST`.

    A trajectory whose `next_step_type` is LAST closes its episode (the next stored step is the
    LAST -> FIRST boundary transition, which starts the next one).
    """
    field = getattr(items, "next_step_type", None)
    if field is None:
        field = items["step_type"] if isinstance(items, dict) else items.step_type
    return tf.equal(field, 2)


def end_of_episode_from_is_last(items) -> tf.Tensor:
    """Episode ends of an RLDS-style step batch (a mapping with an `is_last` bool field)."""
    return tf.cast(items["is_last"], tf.bool)


class UniformReplayBuffer(replay_buffer.ReplayBuffer):
    """Uniform replay buffer with TF-Agents' `TFUniformReplayBuffer` interface.

    A `ReplayBuffer`, as TF-Agents' is; it implements the public methods itself.

    Args:
      data_spec: nest of `tf.TensorSpec` for one item (no batch dimension). Shapes fully defined.
      batch_size: outer dimension of every `add_batch` call (the number of ring segments).
      max_length: steps per segment; `capacity = batch_size * max_length`.
      scope: name scope of the variables and ops.
      device: `tf.device` string for the variables and ops.
      table_fn: accepted for compatibility and ignored: storage is always one `tf.Variable` per leaf.
      dataset_drop_remainder: as TF-Agents: in `as_dataset(single_deterministic_pass=True)` drop partial
        batches (static batch dimension).
      dataset_window_shift: as TF-Agents: window shift of the deterministic pass with `num_steps`
        (None: non-overlapping windows; 1: every sliding window).
      stateful_dataset: accepted and ignored (a no-op in TF-Agents on TF 2 as well).
      episode_end_fn: keyword-only; enables episode-aware windows. A function of a batch of items (the
        `add_batch` argument) returning bool `[batch_size]`, True where that item is the last step of
        its episode; sampled `num_steps` windows then never span two episodes. See
        `end_of_episode_from_step_type` and `end_of_episode_from_is_last`. Costs 4 bytes per stored
        step, and sampling counts the valid windows (O(capacity) int32 work) for exact probabilities.
    """

    def __init__(self, data_spec, batch_size: int, max_length: int = 1000, scope: str = "TFUniformReplayBuffer",
                 device: str = "cpu:*", table_fn: Any = None, dataset_drop_remainder: bool = False,
                 dataset_window_shift: int | None = None, stateful_dataset: bool = False, *,
                 episode_end_fn: Callable[[Any], tf.Tensor] | None = None):
        # The spec is not tracked: tf.Module would wrap its dicts into DictWrapper, and results packed with it.
        # The capacity tensor is made below, in the buffer's device scope.
        super().__init__(self._no_dependency(data_spec), None, stateful_dataset)
        if int(batch_size) < 1 or int(max_length) < 1:
            raise ValueError(f"batch_size ({batch_size}) and max_length ({max_length}) must be >= 1")
        self._batch_size = int(batch_size)
        self._max_length = int(max_length)
        self._scope = scope
        self._device = device
        self._table_fn = table_fn
        self._dataset_drop_remainder = dataset_drop_remainder
        self._dataset_window_shift = dataset_window_shift
        self._episode_end_fn = episode_end_fn
        self._functions: dict = self._no_dependency({})  # traced functions, not checkpointed
        self._check_items = _execution.ItemChecker(data_spec, self._batch_size, episode_end_fn)
        with tf.device(device), tf.name_scope(scope):
            self._state = _ring.make_state(data_spec, self._batch_size, self._max_length,
                                           episode_aware=episode_end_fn is not None)
            self._capacity = tf.constant(self._batch_size * self._max_length, tf.int64)
            self._draw_key = self._no_dependency(_execution.make_draw_key())  # see `get_next`

    # ----- properties (TF-Agents names) -----
    @property
    def data_spec(self):
        return self._data_spec

    @property
    def capacity(self) -> tf.Tensor:
        """`batch_size * max_length` as an int64 scalar tensor (as TF-Agents)."""
        return self._capacity

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> str:
        return self._device

    @property
    def scope(self) -> str:
        return self._scope

    @property
    def table_fn(self):
        return self._table_fn

    @property
    def stateful_dataset(self) -> bool:
        return self._stateful_dataset

    @property
    def state(self) -> _ring.RingState:
        """The variables (for wrappers such as `PrioritizedReplayBuffer`)."""
        return self._state

    def variables(self) -> list[tf.Variable]:
        """The buffer's variables, as TF-Agents' `variables()` method: the storage of every data spec leaf
        (flatten order), then the step counters (and episode indices when episode-aware).

        >>> rb = UniformReplayBuffer({"a": tf.TensorSpec([2], tf.float32)}, batch_size=2, max_length=3)
        >>> [v.shape.as_list() for v in rb.variables()]
        [[6, 2], [], []]
        """
        return _ring.variables(self._state)

    # ----- execution helper -----
    def _run(self, name: str, fn: Callable, *args, tensors=(), jit_compile: bool = False):
        return _execution.run_in_graph(name, fn, *args, tensors=tensors, jit_compile=jit_compile, cache=self._functions,
                                       device=self._device, scope=self._scope, data_spec=self.data_spec)

    # ----- writing -----
    def add_batch(self, items):
        """Adds one step to each of the `batch_size` segments.

        Args:
          items: nest matching `data_spec`, every leaf `[batch_size, *spec.shape]`. Tensors must have the
            spec's dtype; numpy arrays and Python values are converted to it (numpy's `astype`, as
            TF-Agents: 1.7 -> 1 for an int spec).

        Returns:
          None when executing eagerly; in graph mode an op (as TF-Agents) that runs the add.

        Raises:
          TypeError: wrong structure or dtype. ValueError: wrong shape or outer dimension. The message
          names the nested path, the expected and the received value.
        """
        tensors = self._check_items(items)
        if tf.executing_eagerly():
            # From Python (a collect loop): one XLA program, storage updated in place. It costs less
            # than a graph call of the same ops and than the ~8 eager raw ops of the add. Inside a
            # tf.function the graph path below runs.
            self._run("add", self._add_impl, tensors=tensors, jit_compile=True)
            return None
        return self._run("add", self._add_impl, tensors=tensors)

    def _add_impl(self, *tensors):
        return _execution.add(self._state, self._data_spec, self._batch_size, self._max_length, tensors)

    def clear(self):
        """Forgets all items (the storage is left in place, as TF-Agents' `clear()`)."""
        op = self._run("clear", lambda: _ring.clear(self._state))
        return None if tf.executing_eagerly() else op

    # ----- TF-Agents' subclass hooks: its own tests, and subclasses of its buffer, call these directly -----
    def _get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        """TF-Agents' hook behind `get_next` (same arguments and results)."""
        return self.get_next(sample_batch_size, num_steps, time_stacked)

    def _clear(self, clear_all_variables: bool = False):
        """TF-Agents' hook behind `clear`; `clear_all_variables=True` also zeroes the storage.

        >>> rb = UniformReplayBuffer({"a": tf.TensorSpec([], tf.int32)}, batch_size=1, max_length=2)
        >>> rb.add_batch({"a": tf.constant([7])})
        >>> rb._clear(clear_all_variables=True)
        >>> int(rb._get_last_id()), rb.variables()[0].numpy().tolist()
        (-1, [0, 0])
        """
        def clear_all():
            zeroed = [v.assign(tf.zeros_like(v)) for v in self._state.storage]
            if self._state.episode_index is not None:
                zeroed.append(self._state.episode_index.assign(tf.zeros_like(self._state.episode_index)))
            with tf.control_dependencies(zeroed):
                return _ring.clear(self._state)
        if not clear_all_variables:
            return self.clear()
        op = self._run("clear_all_variables", clear_all)
        return None if tf.executing_eagerly() else op

    def _get_last_id(self) -> tf.Tensor:
        """TF-Agents' hook: the logical id of the newest fully written step (int64; -1 when empty)."""
        return self._run("last_id", lambda: tf.identity(self._state.last_id.read_value()))

    def num_frames(self) -> tf.Tensor:
        """Number of stored steps over all segments, int64: `min((last_id + 1) * batch_size, capacity)`."""
        return self._run("num_frames", lambda: tf.minimum((self._state.last_id.read_value() + 1)
                                                          * self._batch_size, self._capacity))

    # ----- sampling -----
    def _draw(self, n: int, lo, hi, num_steps, seed=None):
        """Uniform (segment, start) pairs over valid windows; episode-aware: redraws windows that cross.

        `seed`: an int64 `[2]` seed for the first draw (stateless ops), else TF's stateful random ops.
        """
        # hi > lo unless the buffer cannot be sampled (asserted, except under XLA where asserts are
        # compiled out: keep the draw defined there; the result is flagged by ids -1, probability 0).
        hi = tf.maximum(hi, lo + 1)

        def draw(mask, starts, segments, seed=None):
            if seed is None:
                new_starts = tf.random.uniform([n], lo, hi, tf.int64)
                new_segments = tf.random.uniform([n], 0, self._batch_size, tf.int64)
            else:
                # One stateless float64 draw per sample over the (hi - lo) * batch_size valid pairs (XLA's
                # int64 stateless draws are slow on CPU; 53 bits leave no visible bias).
                u = tf.random.stateless_uniform([n], seed, dtype=tf.float64)
                pair = tf.cast(tf.floor(u * tf.cast((hi - lo) * self._batch_size, tf.float64)), tf.int64)
                new_starts = lo + pair // self._batch_size
                new_segments = pair % self._batch_size
            return _ring.redraw(mask, new_starts, starts), _ring.redraw(mask, new_segments, segments)

        zeros = tf.zeros([n], tf.int64)
        starts, segments = draw(tf.ones([n], tf.bool), zeros, zeros, seed)
        if self._state.episode_index is None or num_steps in (None, 1):
            return starts, segments

        def crosses(starts, segments):
            return _ring.crosses_episode(self._state, starts, segments, num_steps, self._max_length,
                                         self._batch_size)

        _, starts, segments = tf.while_loop(
            lambda bad, s, g: tf.reduce_any(bad),
            lambda bad, s, g: (lambda s2, g2: (crosses(s2, g2), s2, g2))(*draw(bad, s, g)),
            (crosses(starts, segments), starts, segments))
        return starts, segments

    def _probability(self, lo, hi, num_steps):
        if self._state.episode_index is None or num_steps in (None, 1):
            count = (hi - lo) * self._batch_size
        else:
            count = _ring.count_episode_windows(self._state, lo, hi, num_steps, self._max_length,
                                                self._batch_size)
        return tf.math.divide_no_nan(tf.constant(1.0, tf.float32), tf.cast(count, tf.float32))

    def get_next(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                 time_stacked: bool = True):
        """Samples uniformly over (segment, valid start) pairs, with replacement (as TF-Agents).

        Returns:
          `(data, BufferInfo(ids, probabilities))`. data is `[B, ...]` (`[...]` if `sample_batch_size`
          is None); with `num_steps=T`, `[B, T, ...]`, or a tuple of T `[B, ...]` nests if not
          `time_stacked`. ids are the logical step ids of the returned steps.

        Raises:
          ValueError: `num_steps > max_length`, or `sample_batch_size < 0` (0 gives an empty batch, as
          TF-Agents). InvalidArgumentError (when run): no valid window (empty
          buffer, or fewer than `num_steps` steps per segment).
        """
        sample_batch_size, num_steps = _execution.check_sample_args(sample_batch_size, num_steps,
                                                                    self._max_length, empty_batch=True)
        args = (sample_batch_size, num_steps, bool(time_stacked))
        if tf.executing_eagerly() and self._episode_end_fn is None:
            # From Python: the whole sample as one XLA program, its draws keyed by `_draw_key`.
            return _execution.sample_from_python(self._run, self._get_next_impl, args, self._draw_key)
        return self._run("get_next", self._get_next_impl, *args)

    def _get_next_impl(self, sample_batch_size, num_steps, time_stacked, keyed: bool = False):
        """`keyed`: draw with stateless ops keyed by `_draw_key` (advanced by one per call)."""
        n = 1 if sample_batch_size is None else sample_batch_size
        seed = _execution.next_draw_seed(self._draw_key) if keyed else None

        def draw_fn(lo, hi):
            starts, segments = self._draw(n, lo, hi, num_steps, seed)
            return starts, segments, (tf.fill([n], self._probability(lo, hi, num_steps)),)

        flat, starts, _, (probs,) = _ring.sample_windows(
            self._state, n, num_steps, self._max_length, self._batch_size, draw_fn,
            _execution.sample_check(num_steps, keyed))
        starts = tf.where(probs > 0, starts, -1)  # only reachable in the keyed XLA program (see _draw)
        data, ids, (probs,) = _execution.package(self._data_spec, flat, _execution.window_ids(starts, num_steps),
                                                 [probs], sample_batch_size, num_steps, time_stacked)
        return data, BufferInfo(ids, probs)

    # ----- datasets and full reads -----
    def as_dataset(self, sample_batch_size: int | None = None, num_steps: int | None = None,
                   num_parallel_calls: int | None = None, single_deterministic_pass: bool = False
                   ) -> tf.data.Dataset:
        """A `tf.data.Dataset` of `(data, BufferInfo)`, as TF-Agents.

        `single_deterministic_pass=False`: an infinite dataset of `get_next(sample_batch_size, num_steps)`
        draws that reads the live buffer. With `sample_batch_size=None` samples are drawn
        `_execution.UNBATCHED_CHUNK` at a time while the buffer does not change, which keeps
        `.batch(256)` after it fast; a chunk is redrawn as soon as an add or a clear has moved `last_id`,
        so each element (and its probability) reflects the buffer when it is produced, as in TF-Agents.
        That check is a small tf.data function call per element; `as_dataset(sample_batch_size=N)` draws
        whole batches without it.

        `single_deterministic_pass=True`: every stored step once, segment by segment in time order (with
        `sample_batch_size`, `sample_batch_size` segments side by side), windowed by `num_steps` with
        `dataset_window_shift`; ids are TF-Agents' `segment * max_length + logical_id`. Unlike
        TF-Agents 0.19, the data is read from the right rows after the ring has wrapped (TF-Agents reads
        row `id % capacity`, which belongs to the next segment once ids exceed `max_length`).

        Raises:
          ValueError: with `dataset_drop_remainder=True`, a deterministic pass whose `sample_batch_size`
            exceeds `batch_size` or whose `num_steps` exceeds `max_length` ("ALL data will be dropped",
            TF-Agents' text). InvalidArgumentError (when iterated): an empty buffer, with TF-Agents' text
            "TFUniformReplayBuffer is empty. Make sure to add items ...".
        """
        _execution.check_list_free_spec(self._data_spec)
        static_steps = num_steps if num_steps is None or type(num_steps) is int else tf.get_static_value(num_steps)
        if (single_deterministic_pass and self._dataset_drop_remainder and static_steps is not None
                and static_steps > self._max_length):
            raise ValueError(f"num_steps_size ({static_steps}) > self.max_length ({self._max_length}) and "
                             f"dataset_drop_remainder is True.  In this case, ALL data will be dropped by the "
                             f"deterministic dataset. Lower num_steps to <= {self._max_length}.")
        sample_batch_size, num_steps = _execution.check_sample_args(sample_batch_size, num_steps, self._max_length)
        if single_deterministic_pass:
            return self._deterministic_dataset(sample_batch_size, num_steps, num_parallel_calls)
        if sample_batch_size is None:
            return self._unbatched_dataset(num_steps, num_parallel_calls)
        return tf.data.Dataset.counter().map(self._get_next_fn_for_dataset(sample_batch_size, num_steps),
                                             num_parallel_calls=num_parallel_calls)

    def _unbatched_dataset(self, num_steps, num_parallel_calls):
        """Single samples that each reflect the live buffer, drawn `_execution.UNBATCHED_CHUNK` at a time.

        Every sample of a chunk is marked with the `last_id` the chunk was drawn at; when a sample is
        produced, one whose chunk predates the current `last_id` (an add or a clear since the draw) is
        dropped, so the rest of that chunk is skipped and a new one drawn. Each element is then a uniform
        draw over the buffer as it is when the element is produced, with that moment's probability (as
        TF-Agents' one `get_next` per element); a static buffer pays one draw per chunk and one small
        check per element (`_live_samples`). The first sample of a chunk is marked to be kept whatever
        `last_id` is, so a writer adding faster than chunks are drawn cannot starve the reader. With
        `num_parallel_calls`, chunks are drawn ahead, as TF-Agents' samples are. (A `clear()` followed
        by exactly as many adds as the chunk had seen restores its `last_id`; the rest of that chunk is
        then served from before the clear.)
        """
        size = _execution.UNBATCHED_CHUNK
        draw = self._get_next_fn_for_dataset(size, num_steps)
        last_id = self._state.last_id

        def chunk(i):
            with tf.device(self._device):
                drawn_at = last_id.read_value()  # read first: a later add makes the chunk stale, never fresh
            # `_KEEP_ANYWAY` (below any last_id) marks the chunk's first sample.
            marks = tf.concat([tf.constant([_KEEP_ANYWAY], tf.int64), tf.fill([size - 1], drawn_at)], 0)
            return draw(i), marks

        def is_live(mark):
            return tf.logical_or(tf.equal(mark, _KEEP_ANYWAY), tf.equal(mark, last_id.read_value()))

        return _live_samples.live_samples(chunk, is_live, num_parallel_calls)

    def _get_next_fn_for_dataset(self, sample_batch_size, num_steps):
        def fn(_):
            with tf.device(self._device), tf.name_scope(self._scope):
                return self._get_next_impl(sample_batch_size, num_steps, True)
        return fn

    def _deterministic_dataset(self, sample_batch_size, num_steps, num_parallel_calls):
        batch_size, max_length = self._batch_size, self._max_length
        drop = self._dataset_drop_remainder
        if drop and sample_batch_size is not None and sample_batch_size > batch_size:
            raise ValueError(f"sample_batch_size ({sample_batch_size}) > self.batch_size ({batch_size}) and "
                             f"dataset_drop_remainder is True.  In this case, ALL data will be dropped by the "
                             f"deterministic dataset. Lower sample_batch_size to <= {batch_size}.")
        shift = self._dataset_window_shift
        state = self._state

        def row_ids(_):
            lo, hi = _ring.valid_range(state.last_id.read_value(), max_length, None)
            check = tf.debugging.assert_less(lo, hi, message=_EMPTY_READ_MESSAGE)
            frames = tf.range(*_ring.after([check], lo, hi))

            def physical(ids):
                # ids = segment * max_length + logical id, with lo <= logical id < lo + max_length.
                segment = tf.math.floordiv(ids - lo, max_length)
                return ids, _ring.rows_for(ids - segment * max_length, segment, None, max_length, batch_size)

            if sample_batch_size is None:
                def per_segment(b):
                    ids = tf.data.Dataset.from_tensor_slices(b * max_length + frames)
                    if num_steps is not None:
                        ids = ids.window(num_steps, shift=shift).flat_map(
                            lambda w: w.batch(num_steps, drop_remainder=drop))
                    return ids
                ds = tf.data.Dataset.range(batch_size).flat_map(per_segment)
            else:
                ds = tf.data.Dataset.range(batch_size).batch(sample_batch_size, drop_remainder=drop).flat_map(
                    lambda b: tf.data.Dataset.from_tensor_slices(frames[:, None] + b * max_length))
                if num_steps is not None:
                    ds = ds.window(num_steps, shift=shift).flat_map(
                        lambda w: w.batch(num_steps, drop_remainder=True)).map(tf.transpose)
            return ds.map(physical)

        def read(ids, rows):
            with tf.device(self._device):
                flat = _ring.gather(state, rows)
            return specs.pack_sequence_as(self._data_spec, flat), BufferInfo(ids=ids, probabilities=())

        return tf.data.Dataset.range(1).flat_map(row_ids).map(read, num_parallel_calls=num_parallel_calls)

    def gather_all(self):
        """Every stored step, `[batch_size, T, ...]` in logical time order (oldest first), as TF-Agents."""
        return self._run("gather_all", self._gather_all_impl)

    def _gather_all_impl(self):
        lo, hi = _ring.valid_range(self._state.last_id.read_value(), self._max_length, None)
        ids = tf.range(lo, hi)
        segments = tf.range(self._batch_size, dtype=tf.int64)
        rows = _ring.rows_for(ids[None, :], segments[:, None], None, self._max_length, self._batch_size)
        return specs.pack_sequence_as(self._data_spec, _ring.gather(self._state, rows))


TFUniformReplayBuffer = UniformReplayBuffer
