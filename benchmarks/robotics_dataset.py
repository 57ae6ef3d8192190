"""A robotics-shaped RLDS dataset, written with TFDS's own feature classes: the image-heavy workload.

Each step holds what large robot-learning collections store: a nested observation with two RGB cameras
(`tfds.features.Image`, JPEG-encoded) and a proprioceptive state vector, a float action vector, a language
instruction (`tfds.features.Text`), reward, discount and the RLDS flags; each episode carries an id and a
metadata dict with a text field. Episodes are written by `rlds_tf.tfds.EpisodeWriter`, which goes through
TFDS's own encoders for images and text, so the directory is what any TFDS-written RLDS dataset looks like
and `tfds.builder_from_directory(...).as_dataset()` reads it.

Content is a function of (episode, step) only, so two calls give equal datasets. Camera frames are smooth
gradients drifting with the step: they survive JPEG with little loss and differ from step to step.

>>> import tempfile
>>> directory = write(tempfile.mkdtemp(), num_episodes=2, episode_length=3)
>>> import tensorflow_datasets as tfds
>>> episode = next(iter(tfds.builder_from_directory(directory).as_dataset(split='train')))
>>> sorted(episode['steps'].element_spec['observation'])
['image', 'state', 'wrist_image']
"""
from __future__ import annotations

import os

import numpy as np

IMAGE_SIZE = 128
STATE_SIZE = 8
ACTION_SIZE = 7
INSTRUCTIONS = ("pick up the red block", "open the top drawer", "push the cup to the left",
                "place the sponge in the sink")
DATASET_NAME = "robotics_like"


def features():
    """The episode features: a `tfds.features.FeaturesDict` with `steps` a `tfds.features.Dataset`."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    image = lambda: tfds.features.Image(shape=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8,  # noqa: E731
                                        encoding_format="jpeg")
    return tfds.features.FeaturesDict({
        "steps": tfds.features.Dataset({
            "observation": tfds.features.FeaturesDict({
                "image": image(),
                "wrist_image": image(),
                "state": tfds.features.Tensor(shape=(STATE_SIZE,), dtype=np.float32),
            }),
            "action": tfds.features.Tensor(shape=(ACTION_SIZE,), dtype=np.float32),
            "reward": tfds.features.Scalar(dtype=np.float32),
            "discount": tfds.features.Scalar(dtype=np.float32),
            "is_first": tf.bool,
            "is_last": tf.bool,
            "is_terminal": tf.bool,
            "language_instruction": tfds.features.Text(),
        }),
        "episode_id": tf.int64,
        "episode_metadata": tfds.features.FeaturesDict({"file_path": tfds.features.Text()}),
    })


def dataset_config():
    """The `tfds.rlds.rlds_base.DatasetConfig` that gives `features()` (for `rlds_tf.tfds.EpisodeWriter`)."""
    import tensorflow_datasets as tfds

    episode = features()
    steps = episode["steps"].feature
    core = ("observation", "action", "reward", "discount", "is_first", "is_last", "is_terminal")
    return tfds.rlds.rlds_base.DatasetConfig(
        name=DATASET_NAME,
        observation_info=steps["observation"],
        action_info=steps["action"],
        reward_info=steps["reward"],
        discount_info=steps["discount"],
        step_metadata_info={k: steps[k] for k in steps.keys() if k not in core},
        episode_metadata_info={k: episode[k] for k in episode.keys() if k != "steps"})


def _camera(episode: int, steps: np.ndarray, camera: int) -> np.ndarray:
    """uint8 [T, H, W, 3] smooth gradients: each channel a slow wave whose phase moves with the step."""
    axis = np.linspace(0.0, np.pi, IMAGE_SIZE, dtype=np.float32)
    y, x = axis[:, None], axis[None, :]
    phase = (0.15 * steps + 0.7 * episode + 1.3 * camera).astype(np.float32)[:, None, None, None]
    channels = np.arange(3, dtype=np.float32)[None, None, None, :]
    wave = np.sin(x[None, :, :, None] * (1 + channels) + y[None, :, :, None] * (2 - 0.5 * channels) + phase)
    return np.round(127.5 + 120.0 * wave).astype(np.uint8)


def episode(index: int, episode_length: int) -> dict:
    """Episode `index` as `{'steps': {field: [T, ...] array}, **metadata}` (what `EpisodeWriter` takes)."""
    if episode_length < 1:
        raise ValueError(f"episode_length ({episode_length}) must be >= 1")
    t = np.arange(episode_length)
    rng = np.random.default_rng(index)
    last = t == episode_length - 1
    return {
        "steps": {
            "observation": {
                "image": _camera(index, t, 0),
                "wrist_image": _camera(index, t, 1),
                "state": rng.standard_normal((episode_length, STATE_SIZE)).astype(np.float32),
            },
            "action": rng.uniform(-1, 1, (episode_length, ACTION_SIZE)).astype(np.float32),
            "reward": last.astype(np.float32),
            "discount": np.ones(episode_length, np.float32),
            "is_first": t == 0,
            "is_last": last,
            # Every other episode is cut short (truncated) rather than ending in a terminal state.
            "is_terminal": last & (index % 2 == 0),
            "language_instruction": [INSTRUCTIONS[index % len(INSTRUCTIONS)]] * episode_length,
        },
        "episode_id": np.int64(index),
        "episode_metadata": {"file_path": f"/robot/session_{index // 4}/episode_{index:05d}.h5"},
    }


def write(directory: str, *, num_episodes: int, episode_length: int, episodes_per_shard: int = 50,
          file_format: str = "tfrecord") -> str:
    """Writes `num_episodes` episodes of `episode_length` steps into `directory` (split 'train').

    Args:
      directory: the dataset directory (created; an existing dataset there is overwritten).
      num_episodes: episodes to write (>= 1).
      episode_length: steps per episode (>= 1).
      episodes_per_shard: episodes per shard file.
      file_format: `'tfrecord'` or `'array_record'`.

    Returns:
      `directory`, which holds `dataset_info.json`, `features.json` and the shards.
    """
    from rlds_tf.tfds import EpisodeWriter

    if num_episodes < 1:
        raise ValueError(f"num_episodes ({num_episodes}) must be >= 1")
    os.makedirs(directory, exist_ok=True)
    with EpisodeWriter(directory, dataset_config(), max_episodes_per_file=episodes_per_shard,
                       file_format=file_format) as writer:
        for index in range(num_episodes):
            writer.add_episode(episode(index, episode_length))
    return directory
