"""`EpisodicReplayBuffer` and `StatefulEpisodicReplayBuffer`: TF-Agents 0.19's episode-organised buffer.

The buffer holds up to `capacity` episodes of any length. Episode ids are logical and only grow; episode
`id` lives at location `id % capacity`, and a location's current id is in `episodes_loc_to_id_map`, so an
id whose location was taken by a newer episode is no longer valid and writes to it are ignored. Callers
keep the ids of the episodes they are writing (`create_episode_ids`, then the ids `add_batch` /
`add_sequence` return), or let `StatefulEpisodicReplayBuffer` keep them in a variable.

Same API and results as TF-Agents: which ids are assigned when (`begin_episode_fn`, ids of -1), which
episodes are completed (`end_episode_fn`), what is stored, `num_frames`, `gather_all`, the deterministic
pass, the error texts; sampling draws the same distributions (episodes uniformly; windows by episode
length). Storage is `tf.Variable`s (see `_episode_table.py`) instead of hash tables of TensorLists, and
there is no `tf.CriticalSection`: adds run in order in eager code, `tf.function` and tf.data functions,
but concurrent adds from several threads are not serialised.

Differences from TF-Agents 0.19 (deliberate):
- Sampled items carry their real episode id (`BufferInfo.ids`, and the id in `as_dataset` elements);
  TF-Agents reads them from a table it never writes, so its ids are always 0.
- The batched deterministic pass interleaves its `sample_batch_size` shards one window each in turn
  (TF-Agents leaves the interleave's cycle length to tf.data, which makes the order depend on the number
  of CPU cores when there are more shards than cores).
- `StatefulEpisodicReplayBuffer` of something that is not an `EpisodicReplayBuffer` raises TypeError, as
  TF-Agents documents (it reads `data_spec` first and raises AttributeError).

>>> import tensorflow as tf
>>> rb = EpisodicReplayBuffer({"x": tf.TensorSpec([], tf.int32)}, capacity=3,
...                           begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
>>> ids = rb.create_episode_ids(2)
>>> for t in range(3):
...     ids = rb.add_batch({"x": tf.constant([t, 10 + t])}, ids)
>>> ids.numpy().tolist(), int(rb.num_frames())
([0, 1], 6)
>>> rb.gather_all()["x"].numpy().tolist()
[[0, 1, 2, 10, 11, 12]]
>>> [e["x"].numpy().tolist() for e in rb.as_dataset(single_deterministic_pass=True)]
[[0, 1, 2], [10, 11, 12]]
"""
from __future__ import annotations

import collections
import types
from typing import Any, Callable, Optional

import tensorflow as tf

from replay_tf import specs
from replay_tf.buffers import _episode_reads
from replay_tf.buffers._episode_table import EpisodeTable

# The id of episode id holders that point to no episode.
_INVALID_EPISODE_ID = -1
# TF-Agents' StepType values that its Trajectory.is_first / is_last compare with.
_FIRST, _LAST = 0, 2

Episodes = collections.namedtuple("Episodes", ["length", "completed", "tensor_lists"])
Episodes.__doc__ = """Whole episodes moved between buffers (`extract`, `extend_episodes`), as TF-Agents':

length: int64 `[n]` steps per episode. completed: uint8 `[n]`. tensor_lists: a nest like the data spec
whose leaves are variant `[n]` vectors of TensorLists, one list of steps per episode.
"""

BufferInfo = collections.namedtuple("BufferInfo", ["ids"])
BufferInfo.__doc__ = """Sample metadata of `EpisodicReplayBuffer.get_next`, as TF-Agents': the episode id."""


def _default_begin_episode_fn(items):
    """`items.is_first()` (TF-Agents' Trajectory); for other namedtuples with a `step_type` field, the same
    test written out (`step_type == FIRST`), since TF-Agents' Trajectory does not import on current TF."""
    is_first = getattr(items, "is_first", None)
    if callable(is_first):
        return is_first()
    if specs.is_namedtuple(items) and "step_type" in type(items)._fields:
        return tf.equal(items.step_type, _FIRST)
    raise TypeError(f"Argument t is not a Trajectory; did you forget to pass the proper begin_episode_fn to "
                    f"EpisodicReplayBuffer?  Saw: '{items}'")


def _default_end_episode_fn(items):
    """`items.is_last()`, or `next_step_type == LAST` for namedtuples with that field."""
    is_last = getattr(items, "is_last", None)
    if callable(is_last):
        return is_last()
    if specs.is_namedtuple(items) and "next_step_type" in type(items)._fields:
        return tf.equal(items.next_step_type, _LAST)
    raise TypeError(f"Argument t is not a Trajectory; did you forget to pass the proper end_episode_fn to "
                    f"EpisodicReplayBuffer?  Saw: '{items}'")


def _episode_ids_shape(num_episodes, capacity: int) -> tuple:
    """Shape of the ids of `num_episodes` episodes written side by side: `()` (one scalar id) for None or
    a count <= 0, else `(num_episodes,)`.

    Raises:
      ValueError: `num_episodes` > `capacity` (TF-Agents' text).
    """
    if num_episodes is None or num_episodes <= 0:
        return ()
    if num_episodes > capacity:
        raise ValueError(f"Buffer cannot create episode_ids when num_episodes {num_episodes} > capacity "
                         f"{capacity}.")
    return (num_episodes,)


def _scatter(variable: tf.Variable, indices, values):
    """`variable[indices] = values`; the result is for control dependencies."""
    return variable.scatter_update(tf.IndexedSlices(values, indices))


class EpisodicReplayBuffer(tf.Module):
    """A replay buffer of whole episodes with uniform sampling (TF-Agents' `EpisodicReplayBuffer`).

    Args:
      data_spec: a nest of `tf.TensorSpec` describing one step.
      capacity: the most episodes held; a new episode takes the place of the episode `capacity` ids older.
      completed_only: sample (and `gather_all`) only episodes that `end_episode_fn` has marked completed.
      buffer_size: `as_dataset` draws `buffer_size * sample_batch_size` episodes at a time, so new episodes
        and lengths are seen after up to that many elements.
      name_prefix: prefix of the variable names.
      device: device of the variables and ops.
      seed: op seed of the sampling ops.
      begin_episode_fn: batched items -> bool scalar or vector: which ones start a new episode (a new id).
        Default: `items.is_first()` (or `step_type == FIRST`).
      end_episode_fn: batched items -> bool scalar or vector: which ones complete their episode. Default:
        `items.is_last()` (or `next_step_type == LAST`).
      dataset_drop_remainder: drop the last, partial batch of the deterministic pass.
      dataset_window_shift: window shift of the deterministic pass with `num_steps` (None: no overlap).

    Raises:
      TypeError: `begin_episode_fn` or `end_episode_fn` not callable.
    """

    def __init__(self, data_spec: Any, capacity: int = 1000, completed_only: bool = False, buffer_size: int = 8,
                 name_prefix: str = "EpisodicReplayBuffer", device: str = "cpu:*", seed: Optional[int] = None,
                 begin_episode_fn: Optional[Callable] = None, end_episode_fn: Optional[Callable] = None,
                 dataset_drop_remainder: bool = False, dataset_window_shift: Optional[int] = None):
        super().__init__()
        begin_episode_fn = _default_begin_episode_fn if begin_episode_fn is None else begin_episode_fn
        end_episode_fn = _default_end_episode_fn if end_episode_fn is None else end_episode_fn
        if not callable(begin_episode_fn):
            raise TypeError(f"begin_episode_fn is not callable: {begin_episode_fn}")
        if not callable(end_episode_fn):
            raise TypeError(f"end_episode_fn is not callable: {end_episode_fn}")
        if int(capacity) < 1:
            raise ValueError(f"capacity ({capacity}) must be a positive integer (it counts episodes)")
        capacity = int(capacity)
        # A plain holder: tf.Module would wrap the spec's dicts and lists in its trackable containers.
        self._config = types.SimpleNamespace(
            data_spec=data_spec, capacity=capacity, completed_only=completed_only, buffer_size=buffer_size,
            name_prefix=name_prefix, device=device, seed=seed, drop_remainder=dataset_drop_remainder,
            window_shift=dataset_window_shift)
        # (Attributes with TF-Agents' names: its tests and users swap them between adds.)
        self._begin_episode_fn = begin_episode_fn
        self._end_episode_fn = end_episode_fn
        with tf.device(device):
            self._data_table = EpisodeTable(data_spec, capacity, name_prefix)
            self._episodes_loc_to_id_map = tf.Variable(tf.fill([capacity], tf.constant(_INVALID_EPISODE_ID, tf.int64)),
                                                       trainable=False, name="episodes_loc_to_id_map")
            self._episode_lengths = tf.Variable(tf.zeros([capacity], tf.int64), trainable=False,
                                                name="episode_lengths")
            self._episode_completed = tf.Variable(tf.zeros([capacity], tf.uint8), trainable=False,
                                                  name="episode_completed")
            self._last_episode = tf.Variable(tf.constant(_INVALID_EPISODE_ID, tf.int64), trainable=False,
                                             name="last_episode")
            self._num_writes = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="num_writes_counter")
        self._reader = _episode_reads.EpisodeReader(
            self._config, self._data_table, lengths=self._episode_lengths, completed=self._episode_completed,
            held_ids=self._episodes_loc_to_id_map, last_episode=self._last_episode)

    # ----- properties -----
    @property
    def data_spec(self) -> Any:
        return self._config.data_spec

    @property
    def capacity(self) -> int:
        return self._config.capacity

    @property
    def stateful_dataset(self) -> bool:
        return True

    @property
    def num_writes(self) -> tf.Variable:
        """How many `add_batch` calls wrote something (reset by `clear`)."""
        return self._num_writes

    @property
    def name_prefix(self) -> str:
        return self._config.name_prefix

    def num_frames(self) -> tf.Tensor:
        """The number of steps held, over all episodes."""
        return tf.reduce_sum(self._episode_lengths)

    # ----- episode ids -----
    def create_episode_ids(self, num_episodes=None) -> tf.Tensor:
        """Ids of -1 ("no episode yet"), a scalar or `[num_episodes]`, for `add_batch` / `add_sequence`.

        Raises:
          ValueError: `num_episodes` > capacity, or a non-scalar tensor.
        """
        if tf.is_tensor(num_episodes):
            if num_episodes.shape.rank != 0:
                raise ValueError(f"num_episodes must be a scalar, but saw shape: {num_episodes.shape}")
            return tf.fill([num_episodes], tf.constant(_INVALID_EPISODE_ID, tf.int64), name="episode_id")
        shape = _episode_ids_shape(num_episodes, self.capacity)
        return tf.constant(_INVALID_EPISODE_ID, shape=shape, dtype=tf.int64, name="episode_id")

    def _reserve_ids(self, ids, update_mask):
        """Gives the positions of `update_mask` new consecutive ids (in order) and resets their locations;
        returns `ids` with those replaced."""
        num = tf.reduce_sum(tf.cast(update_mask, tf.int64))
        end_id = self._last_episode.assign_add(num) + 1
        new_ids = tf.range(end_id - num, end_id)
        positions = tf.where(update_mask)
        updated = tf.where(update_mask, tf.scatter_nd(positions, new_ids, tf.shape(ids, out_type=tf.int64)), ids)
        locations = self._reader.location(new_ids)
        resets = [_scatter(self._episodes_loc_to_id_map, locations, new_ids),
                  _scatter(self._episode_completed, locations, tf.zeros_like(locations, tf.uint8)),
                  _scatter(self._episode_lengths, locations, tf.zeros_like(locations))]
        with tf.control_dependencies(resets):
            return tf.identity(updated)

    def _maybe_end_batch_episodes(self, batch_episode_ids, end_episode=False):
        """Marks the valid episodes of `batch_episode_ids` where `end_episode` holds as completed; returns
        whether each is completed."""
        ids = tf.convert_to_tensor(batch_episode_ids, tf.int64)
        locations = self._reader.location(ids)
        valid = tf.equal(ids, tf.gather(self._episodes_loc_to_id_map, locations))
        mask = tf.convert_to_tensor(end_episode) & (ids >= 0) & valid
        chosen = tf.boolean_mask(locations, tf.broadcast_to(mask, tf.shape(ids)))
        mark = _scatter(self._episode_completed, chosen, tf.ones_like(chosen, tf.uint8))
        with tf.control_dependencies([mark]):
            return tf.gather(self._episode_completed, locations) > 0

    def _maybe_end_episode(self, episode_id, end_episode=False):
        """`_maybe_end_batch_episodes` for one id (scalars).

        Raises:
          ValueError: `end_episode` is not a scalar (TF-Agents' text).
        """
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        pred = tf.convert_to_tensor(end_episode) & (episode_id >= 0)
        if pred.shape.rank != 0:
            raise ValueError(f"Invalid condition shape: {pred.shape} (should be scalar).")
        return self._maybe_end_batch_episodes(episode_id[None], pred[None])[0]

    def _get_batch_episode_ids(self, batch_episode_ids, begin_episode=False, end_episode=False, mask=None):
        """New ids where the id is -1 or `begin_episode` holds (within `mask`); completes `end_episode` ones."""
        batch_episode_ids = tf.convert_to_tensor(batch_episode_ids, tf.int64)
        if batch_episode_ids.shape.rank != 1:
            raise ValueError("batch_episode_ids must be a vector with 1 dimension")
        update = (batch_episode_ids < 0) | tf.convert_to_tensor(begin_episode)
        if mask is not None:
            update &= mask
        update = tf.broadcast_to(update, tf.shape(batch_episode_ids))
        ids = self._reserve_ids(batch_episode_ids, update)
        with tf.control_dependencies([self._maybe_end_batch_episodes(ids, end_episode)]):
            return tf.identity(ids)

    def _get_episode_id(self, episode_id, begin_episode=False, end_episode=False):
        """A new id if `episode_id` is -1 or `begin_episode`; completes the episode if `end_episode`."""
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        begin_episode = tf.convert_to_tensor(begin_episode, name="begin_episode")
        end_episode = tf.convert_to_tensor(end_episode, name="end_episode")
        pred = begin_episode | (episode_id < 0)
        if pred.shape.rank != 0:
            raise ValueError(f"Invalid condition predicate shape: {pred.shape} (should be scalar).")
        updated = tf.cond(pred, lambda: self._reserve_ids(episode_id[None], tf.constant([True]))[0],
                          lambda: tf.identity(episode_id))
        with tf.control_dependencies([self._maybe_end_episode(updated, end_episode)]):
            return tf.identity(updated)

    def _get_last_episode_id(self) -> tf.Tensor:
        return self._last_episode.read_value()

    def _completed_episodes(self) -> tf.Tensor:
        """The ids of the completed episodes held, by location."""
        return tf.boolean_mask(self._episodes_loc_to_id_map, tf.equal(self._episode_completed, 1))

    def _get_episode(self, episode_id):
        """The steps of episode `episode_id`.

        Raises:
          InvalidArgumentError (when run): the id is not held.
        """
        with tf.device(self._config.device), tf.name_scope("get_episode"):
            episode_id = tf.convert_to_tensor(episode_id, tf.int64, name="episode_id")
            location = self._reader.location(episode_id)
            held = tf.gather(self._episodes_loc_to_id_map, location)
            check = tf.debugging.Assert(tf.equal(held, episode_id), [
                "Episode id", episode_id, "is not valid.  It points to location", location,
                "but the episode at that location is currently id", held])
            with tf.control_dependencies([check]):
                return self._reader.read_episode(tf.identity(location))

    def get_valid_ids_mask(self, episode_ids) -> tf.Tensor:
        """Whether each id names an episode still held."""
        with tf.device(self._config.device), tf.name_scope("get_valid_ids_mask"):
            episode_ids = tf.convert_to_tensor(episode_ids, tf.int64)
            held = tf.gather(self._episodes_loc_to_id_map, self._reader.location(episode_ids))
            return (episode_ids >= 0) & tf.equal(episode_ids, held)

    # ----- adding -----
    def _flat_items(self, items, where: str):
        flat = specs.validate(items, self.data_spec, outer_dims=[None], root=where, cast=True)
        return flat, specs.pack_sequence_as(self.data_spec, flat)

    def _add_batch(self, items):
        """TF-Agents' base-class entry point, which has no episode ids."""
        raise NotImplementedError("add_batch(items) is not implemented in EpisodicReplayBuffer. Use "
                                  "add_batch(items, episode_ids) instead")

    def add_batch(self, items, episode_ids) -> tf.Tensor:
        """Adds one step to each of a batch of episodes and returns their (updated) ids.

        Args:
          items: a nest like `data_spec` with an outer dimension `[num_episodes]`.
          episode_ids: int64 `[num_episodes]`: the episodes the steps belong to (-1: start one).

        Returns:
          The ids after `begin_episode_fn` started new episodes; steps for ids no longer held are dropped.
        """
        episode_ids = tf.convert_to_tensor(episode_ids, tf.int64)
        episode_ids.shape.assert_has_rank(1)
        with tf.device(self._config.device), tf.name_scope("add_batch"):
            flat, _ = self._flat_items(items, "items")
            num_items, num_ids = flat[0].shape[0], episode_ids.shape[0]
            if num_items is not None and num_ids is not None and num_items != num_ids:
                raise ValueError(f"items have an outer dimension of {num_items} but episode_ids holds {num_ids} "
                                 f"ids: add_batch adds one step to each episode, so give one id per row")
            begin = self._begin_episode_fn(items)
            end = self._end_episode_fn(items)
            ids = self._get_batch_episode_ids(episode_ids, begin, end)
            locations = self._reader.location(ids)
            valid = tf.equal(tf.gather(self._episodes_loc_to_id_map, locations), ids)

            def add():
                chosen = tf.where(valid)[:, 0]
                where = tf.gather(locations, chosen)
                lengths = tf.gather(self._episode_lengths, where)
                write = self._data_table.write(where, lengths, [tf.gather(leaf, chosen) for leaf in flat])
                with tf.control_dependencies([write]):
                    grow = _scatter(self._episode_lengths, where, lengths + 1)
                    count = self._num_writes.assign_add(1, read_value=False)
                with tf.control_dependencies([grow, count]):
                    return tf.identity(ids)

            return tf.cond(tf.reduce_any(valid), add, lambda: tf.identity(episode_ids))

    def add_sequence(self, items, episode_id) -> tf.Tensor:
        """Appends a sequence of steps (outer dimension: time) to one episode; returns its (updated) id.

        `begin_episode_fn(items)` and `end_episode_fn(items)` must give scalars here (TF-Agents raises
        ValueError on vectors too).
        """
        episode_id = tf.convert_to_tensor(episode_id, tf.int64)
        episode_id.shape.assert_has_rank(0)
        with tf.device(self._config.device), tf.name_scope("add_steps"):
            flat, converted = self._flat_items(items, "items")
            num_steps = tf.shape(flat[0], out_type=tf.int64)[0]
            new_id = self._get_episode_id(episode_id, self._begin_episode_fn(converted),
                                          self._end_episode_fn(converted))
            location = self._reader.location(new_id)
            valid = tf.equal(tf.gather(self._episodes_loc_to_id_map, location), new_id)

            def add():
                length = tf.gather(self._episode_lengths, location)
                write = self._data_table.write(tf.fill([num_steps], location),
                                               length + tf.range(num_steps, dtype=tf.int64), flat)
                with tf.control_dependencies([write]):
                    grow = _scatter(self._episode_lengths, location[None], (length + num_steps)[None])
                with tf.control_dependencies([grow]):
                    return tf.identity(new_id)

            return tf.cond(valid, add, lambda: tf.identity(new_id))

    # ----- reading -----
    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        """One whole episode drawn uniformly, and `BufferInfo(ids=its id)` (the arguments are ignored, as in
        TF-Agents; use `as_dataset` for batches and windows).

        Raises:
          InvalidArgumentError (when run): the buffer holds no episode.
        """
        del sample_batch_size, num_steps, time_stacked
        with tf.device(self._config.device), tf.name_scope("get_next"):
            episode_id = self._reader.sample_episode_ids([])
            return self._reader.read_episode(self._reader.location(episode_id)), BufferInfo(ids=episode_id)

    def as_dataset(self, sample_batch_size=None, num_steps=None, num_parallel_calls=None,
                   sequence_preprocess_fn=None, single_deterministic_pass: bool = False) -> tf.data.Dataset:
        """Episodes or windows as a `tf.data.Dataset` (TF-Agents' elements and order).

        Random (`single_deterministic_pass=False`, endless): `num_steps=None` gives `(episode, id)` with
        episodes drawn uniformly; with `num_steps`, episodes are drawn with probability proportional to
        their length, those shorter than `num_steps` skipped, and a uniformly placed window of `num_steps`
        steps taken: `(window, id)`, batched by `sample_batch_size` (which needs `num_steps`).

        Deterministic: every episode held, oldest first, as its steps (no id); with `num_steps`, the steps
        of all episodes in order, cut into windows (`dataset_window_shift`, `dataset_drop_remainder`); with
        `sample_batch_size` too, episodes are dealt to `sample_batch_size` shards (episode i to shard
        i % sample_batch_size), each cut into whole windows, and batches take one window of each shard.

        Raises:
          ValueError: a spec with lists; `sample_batch_size` without `num_steps`.
          NotImplementedError: `sequence_preprocess_fn`.
        """
        if specs.has_lists(self.data_spec):
            raise ValueError(f"Cannot perform gather; data spec contains lists and this conflicts with gathering "
                             f"operator.  Convert any lists to tuples.  For example, if your spec looks like "
                             f"[a, b, c], change it to (a, b, c).  Spec structure is:\n  "
                             f"{tf.nest.map_structure(lambda spec: spec.dtype, self.data_spec)}")
        if sequence_preprocess_fn is not None:
            raise NotImplementedError("sequence_preprocess_fn is not supported.")
        if single_deterministic_pass:
            return _episode_reads.deterministic_dataset(self._reader, sample_batch_size, num_steps, num_parallel_calls)
        if sample_batch_size and num_steps is None:
            raise ValueError("`num_steps` must be set if `sample_batch_size` is set in EpisodicReplayBuffer "
                             "as_dataset.")
        return _episode_reads.sampled_dataset(self._reader, sample_batch_size, num_steps, num_parallel_calls)

    def gather_all(self) -> Any:
        """Every step of every episode held (completed ones with `completed_only`), oldest episode first,
        concatenated as `[1, sum of lengths, ...]`; with no steps, `[0, ...]` (TF-Agents' shapes)."""
        with tf.device(self._config.device), tf.name_scope("gather_all"):
            total = tf.reduce_sum(self._episode_lengths)
            if self._config.completed_only:
                total = tf.reduce_sum(self._episode_lengths * tf.cast(self._episode_completed, tf.int64))

            def empty():
                return specs.pack_sequence_as(self.data_spec, [tf.zeros([0, *spec.shape], spec.dtype)
                                                               for spec in specs.flatten(self.data_spec)])
            return tf.cond(total > 0, self._reader.gather_steps, empty)

    def extract(self, locations, clear_data: bool = False) -> Episodes:
        """The episodes at `locations` (locations, not ids: `0 <= location < capacity`) as `Episodes`;
        `clear_data` empties them (length 0, not completed)."""
        locations = tf.cast(locations, tf.int64, name="locations")
        locations.shape.assert_has_rank(1)
        with tf.device(self._config.device), tf.name_scope("extract"):
            lengths = tf.gather(self._episode_lengths, locations)
            lists = self._data_table.to_tensor_lists(locations, lengths)
            episodes = Episodes(length=lengths, completed=tf.gather(self._episode_completed, locations),
                                tensor_lists=specs.pack_sequence_as(self.data_spec, lists))
            if not clear_data:
                return episodes
            with tf.control_dependencies(tf.nest.flatten(episodes)):
                clears = [_scatter(self._episode_lengths, locations, tf.zeros_like(locations)),
                          _scatter(self._episode_completed, locations, tf.zeros_like(locations, tf.uint8))]
            with tf.control_dependencies(clears):
                return tf.nest.map_structure(tf.identity, episodes)

    def extend_episodes(self, episode_ids, episode_ids_indices, episodes: Episodes) -> tf.Tensor:
        """Appends `episodes` (row k to the episode `episode_ids[episode_ids_indices[k]]`) and returns the
        updated `episode_ids` (`begin_episode_fn(episodes)` starts new ones; ids no longer held are
        skipped). Lengths grow by `episodes.length`; completion is set to `episodes.completed`."""
        episode_ids = tf.convert_to_tensor(episode_ids, tf.int64)
        episode_ids.shape.assert_has_rank(1)
        indices = tf.cast(tf.convert_to_tensor(episode_ids_indices, name="episode_ids_indices"), tf.int64)
        indices.shape.assert_has_rank(1)
        with tf.device(self._config.device), tf.name_scope("extend"):
            # Spread the per-row begin flags over all of episode_ids; only the rows given may change.
            ids_shape = tf.shape(episode_ids, out_type=tf.int64)
            begin = tf.broadcast_to(self._begin_episode_fn(episodes), tf.shape(indices))
            begin = tf.scatter_nd(indices[:, None], begin, ids_shape)
            mask = tf.scatter_nd(indices[:, None], tf.fill(tf.shape(indices), True), ids_shape)
            expanded_ids = self._get_batch_episode_ids(episode_ids, begin_episode=begin, mask=mask)
            ids = tf.gather(expanded_ids, indices)
            locations = self._reader.location(ids)
            chosen = tf.where(tf.equal(tf.gather(self._episodes_loc_to_id_map, locations), ids))[:, 0]
            where = tf.gather(locations, chosen)
            lengths = tf.gather(self._episode_lengths, where)
            lists = [tf.gather(leaf, chosen) for leaf in specs.flatten(episodes.tensor_lists)]
            write = self._data_table.append_tensor_lists(where, lengths, lists)
            with tf.control_dependencies([write]):
                added = tf.gather(tf.cast(episodes.length, tf.int64), chosen)
                updates = [_scatter(self._episode_lengths, where, lengths + added),
                           _scatter(self._episode_completed, where,
                                    tf.gather(tf.cast(episodes.completed, tf.uint8), chosen))]
            with tf.control_dependencies(updates):
                return tf.identity(expanded_ids)

    def clear(self):
        """Empties every episode (ids stay valid: adds to them start again from step 0)."""
        return self._clear()

    def _clear(self, clear_all_variables: bool = False):
        """`clear`; with `clear_all_variables`, also forgets every id and completion (ids restart at 0)."""
        ops = [self._episode_lengths.assign(tf.zeros_like(self._episode_lengths), read_value=False),
               self._num_writes.assign(0, read_value=False), self._data_table.clear()]
        if clear_all_variables:
            ops += [self._episode_completed.assign(tf.zeros_like(self._episode_completed), read_value=False),
                    self._episodes_loc_to_id_map.assign(
                        tf.fill([self.capacity], tf.constant(_INVALID_EPISODE_ID, tf.int64)), read_value=False),
                    self._last_episode.assign(_INVALID_EPISODE_ID, read_value=False)]
        return tf.group(ops, name="clear")


class StatefulEpisodicReplayBuffer(tf.Module):
    """An `EpisodicReplayBuffer` that keeps its writers' episode ids in a variable (for Driver observers).

    Args:
      replay_buffer: the `EpisodicReplayBuffer` to write to.
      num_episodes: how many episodes are written side by side (`add_batch`'s outer dimension); None: one,
        with a scalar id (`add_sequence`).

    Raises:
      TypeError: `replay_buffer` is not an `EpisodicReplayBuffer`.
      ValueError: `num_episodes` > the buffer's capacity.
    """

    def __init__(self, replay_buffer: EpisodicReplayBuffer, num_episodes: Optional[int] = None):
        super().__init__()
        if not isinstance(replay_buffer, EpisodicReplayBuffer):
            raise TypeError(f"Expected an EpisodicReplayBuffer, saw {replay_buffer}")
        shape = _episode_ids_shape(num_episodes, replay_buffer.capacity)
        self._replay_buffer = replay_buffer
        self._episode_ids_var = tf.Variable(tf.fill(shape, tf.constant(_INVALID_EPISODE_ID, tf.int64)),
                                            trainable=False, name="episode_id")

    @property
    def data_spec(self) -> Any:
        return self._replay_buffer.data_spec

    @property
    def capacity(self) -> int:
        return self._replay_buffer.capacity

    @property
    def episode_ids(self) -> tf.Variable:
        """The variable holding the ids of the episodes being written."""
        return self._episode_ids_var

    def add_batch(self, items) -> tf.Tensor:
        """`EpisodicReplayBuffer.add_batch(items, self.episode_ids)`, keeping the returned ids."""
        return self._keep(self._replay_buffer.add_batch(items=items, episode_ids=self._episode_ids_var.read_value()))

    def add_sequence(self, items) -> tf.Tensor:
        """`EpisodicReplayBuffer.add_sequence(items, self.episode_ids)`, keeping the returned id."""
        return self._keep(self._replay_buffer.add_sequence(items=items,
                                                           episode_id=self._episode_ids_var.read_value()))

    def extend_episodes(self, episode_ids_indices, episodes: Episodes) -> tf.Tensor:
        """`EpisodicReplayBuffer.extend_episodes(self.episode_ids, ...)`, keeping the returned ids."""
        return self._keep(self._replay_buffer.extend_episodes(self._episode_ids_var.read_value(),
                                                              episode_ids_indices, episodes))

    def _keep(self, new_ids) -> tf.Tensor:
        """`new_ids`, once stored in `episode_ids`."""
        with tf.control_dependencies([self._episode_ids_var.assign(new_ids, read_value=False)]):
            return tf.identity(new_ids)

    def get_next(self, sample_batch_size=None, num_steps=None, time_stacked=True):
        return self._replay_buffer.get_next(sample_batch_size, num_steps, time_stacked)

    def as_dataset(self, sample_batch_size=None, num_steps=None, num_parallel_calls=None,
                   sequence_preprocess_fn=None, single_deterministic_pass: bool = False) -> tf.data.Dataset:
        return self._replay_buffer.as_dataset(sample_batch_size, num_steps, num_parallel_calls,
                                              sequence_preprocess_fn, single_deterministic_pass)

    def gather_all(self) -> Any:
        return self._replay_buffer.gather_all()

    def num_frames(self) -> tf.Tensor:
        return self._replay_buffer.num_frames()

    def clear(self):
        return self._replay_buffer.clear()
