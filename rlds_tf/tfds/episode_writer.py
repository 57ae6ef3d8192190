"""`EpisodeWriter`: writes RLDS episodes that did not come from an environment (the `rlds.tfds` API)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

import tensorflow_datasets as tfds

from rlds_tf.recording import tfds_writer


class EpisodeWriter:
    """Writes episodes to a TFDS/RLDS directory, one shard per `max_episodes_per_file` episodes.

    Each `add_episode` is durable when it returns (see `rlds_tf.recording.tfds_writer`).

    Args:
      data_directory: where the dataset goes.
      ds_config: a `tfds.rlds.rlds_base.DatasetConfig` (see `generate_config_from_spec`).
      max_episodes_per_file: episodes per shard.
      split_name: the split, or a list of splits (then use `add_episode_to_split`).
      version: dataset version.
      overwrite: False appends to an existing dataset.
      file_format: `'tfrecord'` or `'array_record'`.

    >>> import tempfile, numpy as np, tensorflow as tf, rlds_tf as rlds
    >>> config = tfds.rlds.rlds_base.DatasetConfig(name='toy', observation_info=tf.float32,
    ...     action_info=tf.int64, reward_info=tf.float32, discount_info=tf.float32)
    >>> directory = tempfile.mkdtemp()
    >>> writer = EpisodeWriter(directory, config)
    >>> writer.add_episode({'steps': {'observation': np.float32([0, 1]), 'action': [1, 0],
    ...     'reward': np.float32([1, 0]), 'discount': np.float32([1, 0]), 'is_first': [True, False],
    ...     'is_last': [False, True], 'is_terminal': [False, True]}})
    >>> writer.close()
    >>> [int(e['steps'].cardinality()) for e in rlds.load(directory, split='train')]
    [2]
    """

    def __init__(self, data_directory: str, ds_config: tfds.rlds.rlds_base.DatasetConfig,
                 max_episodes_per_file: int = 1000, split_name: Union[str, Sequence[str], None] = "train",
                 version: str = "0.0.1", overwrite: bool = True, file_format: str = "tfrecord"):
        splits = [split_name or "train"] if isinstance(split_name, (str, type(None))) else list(split_name)
        self._writer = tfds_writer.DatasetWriter(
            data_directory, ds_config, split_names=splits, max_episodes_per_file=max_episodes_per_file,
            version=version, file_format=file_format, overwrite=overwrite)

    def add_episode(self, episode: Mapping[str, Any]) -> None:
        """Adds an episode `{'steps': <list of steps or dict of stacked arrays or Dataset>, **metadata}`."""
        self._writer.add_episode(episode)

    def add_episode_to_split(self, episode: Mapping[str, Any], split: str) -> None:
        """Adds an episode to one of the splits given at construction."""
        self._writer.add_episode(episode, split=split)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> "EpisodeWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["EpisodeWriter"]
