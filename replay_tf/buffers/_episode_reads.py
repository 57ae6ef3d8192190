"""Reading an `EpisodicReplayBuffer`'s episodes: drawing them, reading them whole or in windows, and the
datasets of `as_dataset` (sampled and endless, or one deterministic pass).

`EpisodeReader` is handed the buffer's storage and settings when the buffer is built; the buffer's adds
write that storage, and its `get_next`, `gather_all` and `as_dataset` read it through the reader.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from replay_tf import specs
from replay_tf.buffers._episode_table import EpisodeTable
from replay_tf.buffers._episode_table import valid_range_ids


class EpisodeReader:
    """Reads of the episodes an `EpisodicReplayBuffer` holds.

    Args:
      config: The buffer's settings (`data_spec`, `capacity`, `completed_only`, `buffer_size`, `device`,
        `seed`, `drop_remainder`, `window_shift`).
      table: The steps of the episode at each location.
      lengths: int64 `[capacity]` variable: steps held per location.
      completed: uint8 `[capacity]` variable: whether the episode at each location is completed.
      held_ids: int64 `[capacity]` variable: the id of the episode at each location.
      last_episode: int64 scalar variable: the newest id handed out (-1 before the first).
    """

    def __init__(self, config: Any, table: EpisodeTable, *, lengths: tf.Variable, completed: tf.Variable,
                 held_ids: tf.Variable, last_episode: tf.Variable):
        self.config = config
        self._table = table
        self._lengths = lengths
        self._completed = completed
        self._held_ids = held_ids
        self._last_episode = last_episode

    def location(self, episode_ids):
        """Where episodes `episode_ids` are (or were) held: `id % capacity`."""
        return tf.math.floormod(episode_ids, self.config.capacity)

    def held_id(self, locations):
        """The ids of the episodes now at `locations`."""
        return tf.gather(self._held_ids, locations)

    def length(self, locations):
        """The steps held at `locations`."""
        return tf.gather(self._lengths, locations)

    def read_episode(self, location):
        """The steps of the episode at `location`, as a nest like the data spec."""
        flat = self._table.read_episode(location, self.length(location))
        return specs.pack_sequence_as(self.config.data_spec, flat)

    def read_window(self, location, start, num_steps: int):
        """Steps `start, ..., start + num_steps - 1` of the episode at `location`, as a nest like the data spec."""
        steps = start + tf.range(num_steps, dtype=tf.int64)
        flat = self._table.read_steps(tf.fill([num_steps], location), steps)
        return specs.pack_sequence_as(self.config.data_spec, flat)

    def sample_episode_ids(self, shape, weigh_by_episode_length: bool = False):
        """Ids of held episodes drawn uniformly; with `weigh_by_episode_length`, locations (not ids) drawn
        with probability proportional to their episode's length.

        Raises:
          InvalidArgumentError (when run): the buffer holds no episode.
        """
        last_id = self._last_episode.read_value()
        check = tf.debugging.assert_non_negative(
            last_id, message="EpisodicReplayBuffer is empty. Make sure to add items before sampling the buffer.")
        with tf.control_dependencies([check]):
            if weigh_by_episode_length:
                held = tf.minimum(last_id + 1, self.config.capacity)
                logits = tf.math.log(tf.cast(self._lengths[:held], tf.float32))
                draws = tf.random.categorical(logits[None], tf.reduce_prod(shape), dtype=tf.int64,
                                              seed=self.config.seed)
                return tf.reshape(draws, shape)
            low, high = valid_range_ids(last_id, self.config.capacity)
            return tf.random.uniform(shape, minval=low, maxval=high, dtype=tf.int64, seed=self.config.seed)

    def sample_locations(self, num_draws: int, weigh_by_episode_length: bool):
        """`num_draws` locations of sampled episodes, less those not completed with `completed_only`."""
        where = self.location(self.sample_episode_ids([num_draws], weigh_by_episode_length))
        if self.config.completed_only:
            where = tf.boolean_mask(where, tf.gather(self._completed, where) > 0)
        return where

    def held_id_range(self):
        """`(low, high)`: the ids of the episodes held are `low, ..., high - 1`."""
        return valid_range_ids(self._last_episode.read_value(), self.config.capacity)

    def gather_steps(self):
        """Every step held (completed episodes only with `completed_only`), oldest episode first, as
        `[1, total steps, ...]` leaves."""
        low, high = self.held_id_range()
        locations = self.location(tf.range(low, high))
        lengths = self.length(locations)
        if self.config.completed_only:
            lengths *= tf.cast(tf.gather(self._completed, locations), tf.int64)
        # Element k of the result is step (k - start of its episode) of the episode it falls in.
        rows = tf.repeat(locations, lengths)
        starts = tf.repeat(tf.cumsum(lengths, exclusive=True), lengths)
        steps = tf.range(tf.reduce_sum(lengths)) - starts
        flat = self._table.read_steps(rows, steps)
        return specs.pack_sequence_as(self.config.data_spec, [leaf[None] for leaf in flat])


def sampled_dataset(reader: EpisodeReader, sample_batch_size, num_steps, num_parallel_calls) -> tf.data.Dataset:
    """`EpisodicReplayBuffer.as_dataset(single_deterministic_pass=False)`."""
    config = reader.config
    draws = config.buffer_size * (sample_batch_size or 1)
    # A seed for the window starts derived from `seed` (TF-Agents salts it the same way in spirit).
    window_seed = None if config.seed is None else (config.seed * 7919 + 17) % (2**31 - 1)

    def locations(_):
        with tf.device(config.device):
            return reader.sample_locations(draws, weigh_by_episode_length=num_steps is not None)

    ds = tf.data.Dataset.counter().map(locations).unbatch()
    if num_steps is None:
        def read(location):
            with tf.device(config.device):
                return reader.read_episode(location), reader.held_id(location)
        return ds.map(read, num_parallel_calls=num_parallel_calls)

    ds = ds.map(lambda location: (location, reader.length(location)))
    ds = ds.filter(lambda location, length: length >= num_steps)

    def window(location, length):
        with tf.device(config.device):
            start = tf.random.uniform([], 0, length - num_steps + 1, dtype=tf.int64, seed=window_seed)
            return reader.read_window(location, start, num_steps), reader.held_id(location)

    ds = ds.map(window, num_parallel_calls=num_parallel_calls)
    if sample_batch_size:
        # The dataset never ends: dropping the remainder loses nothing and keeps the batch static.
        ds = ds.batch(sample_batch_size, drop_remainder=True)
    return ds


def deterministic_dataset(reader: EpisodeReader, sample_batch_size, num_steps, num_parallel_calls
                          ) -> tf.data.Dataset:
    """`EpisodicReplayBuffer.as_dataset(single_deterministic_pass=True)`."""
    if sample_batch_size is not None and num_steps is None:
        raise ValueError("When requesting a batched dataset from EpisodicReplayBuffer, num_steps must be "
                         "provided (but saw num_steps=None).")
    config = reader.config

    def episode_ids(_):
        # Evaluated when iteration starts, so a dataset made before the adds sees them.
        low, high = reader.held_id_range()
        return tf.data.Dataset.range(low, high)

    def read(episode_id):
        with tf.device(config.device):
            return reader.read_episode(reader.location(episode_id))

    episodes = tf.data.Dataset.range(1).flat_map(episode_ids)

    def windows(ds, drop_remainder):
        return ds.unbatch().window(num_steps, shift=config.window_shift).flat_map(
            lambda window: tf.data.Dataset.zip(tf.nest.map_structure(
                lambda d: d.batch(num_steps, drop_remainder=drop_remainder), window)))

    if sample_batch_size is None:
        ds = episodes.map(read, num_parallel_calls=num_parallel_calls)
        return ds if num_steps is None else windows(ds, config.drop_remainder)
    # Shard i holds episodes i, i + sample_batch_size, ...; each becomes whole windows; one window of
    # each shard in turn, then batches of sample_batch_size.
    shards = tf.data.Dataset.range(sample_batch_size).interleave(
        lambda i: windows(episodes.shard(sample_batch_size, i).map(read), True),
        cycle_length=sample_batch_size, block_length=1)
    return shards.batch(sample_batch_size, drop_remainder=config.drop_remainder)
