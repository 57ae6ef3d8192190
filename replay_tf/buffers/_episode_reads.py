"""The datasets of `EpisodicReplayBuffer.as_dataset`: sampled (endless) and one deterministic pass.

Functions of the buffer, which they read through its variables (`_episode_lengths`, `_episodes_loc_to_id_map`,
`_data_table`) and helpers; kept apart from the buffer's add/read logic.
"""
from __future__ import annotations

import tensorflow as tf

from replay_tf import specs
from replay_tf.buffers._episode_table import valid_range_ids


def sampled_dataset(buffer, sample_batch_size, num_steps, num_parallel_calls) -> tf.data.Dataset:
    """`EpisodicReplayBuffer.as_dataset(single_deterministic_pass=False)`."""
    config = buffer._config
    draws = config.buffer_size * (sample_batch_size or 1)
    # A seed for the window starts derived from `seed` (TF-Agents salts it the same way in spirit).
    window_seed = None if config.seed is None else (config.seed * 7919 + 17) % (2**31 - 1)

    def locations(_):
        with tf.device(config.device):
            ids = buffer._sample_episode_ids([draws], weigh_by_episode_length=num_steps is not None,
                                             seed=config.seed)
            where = buffer._location(ids)
            if config.completed_only:
                where = tf.boolean_mask(where, tf.gather(buffer._episode_completed, where) > 0)
            return where

    ds = tf.data.Dataset.counter().map(locations).unbatch()
    if num_steps is None:
        def read(location):
            with tf.device(config.device):
                return buffer._read_episode(location), buffer._held_id(location)
        return ds.map(read, num_parallel_calls=num_parallel_calls)

    ds = ds.map(lambda location: (location, tf.gather(buffer._episode_lengths, location)))
    ds = ds.filter(lambda location, length: length >= num_steps)

    def window(location, length):
        with tf.device(config.device):
            start = tf.random.uniform([], 0, length - num_steps + 1, dtype=tf.int64, seed=window_seed)
            steps = start + tf.range(num_steps, dtype=tf.int64)
            flat = buffer._data_table.read_steps(tf.fill([num_steps], location), steps)
            return specs.pack_sequence_as(buffer.data_spec, flat), buffer._held_id(location)

    ds = ds.map(window, num_parallel_calls=num_parallel_calls)
    if sample_batch_size:
        # The dataset never ends: dropping the remainder loses nothing and keeps the batch static.
        ds = ds.batch(sample_batch_size, drop_remainder=True)
    return ds


def deterministic_dataset(buffer, sample_batch_size, num_steps, num_parallel_calls) -> tf.data.Dataset:
    """`EpisodicReplayBuffer.as_dataset(single_deterministic_pass=True)`."""
    if sample_batch_size is not None and num_steps is None:
        raise ValueError("When requesting a batched dataset from EpisodicReplayBuffer, num_steps must be "
                         "provided (but saw num_steps=None).")
    config = buffer._config

    def episode_ids(_):
        # Evaluated when iteration starts, so a dataset made before the adds sees them.
        low, high = valid_range_ids(buffer._last_episode.read_value(), buffer.capacity)
        return tf.data.Dataset.range(low, high)

    def read(episode_id):
        with tf.device(config.device):
            return buffer._read_episode(buffer._location(episode_id))

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
