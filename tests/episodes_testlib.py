"""Episodes of RLDS steps for the transformation tests: their steps as numpy arrays and as datasets.

Imports only numpy and TensorFlow: the transformation tests run it in the peer venv (rlds 0.1.8 on TF 2.15)
too, with this folder on `sys.path` (`PEER_PATH`).
"""
import os

import numpy as np
import tensorflow as tf

# Prepended to a peer snippet: makes this module importable there.
PEER_PATH = f"import sys\nsys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"


def steps_data(lengths, *, seed: int, observation_size: int) -> dict:
    """The steps of episodes of `lengths` steps, concatenated: random observations (`observation_size`
    floats) and rewards from `seed`, actions 0, 1, ...; every episode but the second ends in a terminal
    state, the second is truncated."""
    total = sum(lengths)
    rng = np.random.default_rng(seed)
    return {
        "observation": rng.random((total, observation_size)).astype(np.float32),
        "action": np.arange(total, dtype=np.int64),
        "reward": rng.random(total).astype(np.float32),
        "discount": np.ones(total, np.float32),
        "is_first": np.concatenate([[i == 0 for i in range(n)] for n in lengths]),
        "is_last": np.concatenate([[i == n - 1 for i in range(n)] for n in lengths]),
        "is_terminal": np.concatenate([[e != 1 and i == n - 1 for i in range(n)] for e, n in enumerate(lengths)]),
    }


def episode_starts(lengths) -> np.ndarray:
    """The index of each episode's first step in `steps_data(lengths, ...)`."""
    return np.cumsum([0] + list(lengths[:-1])).astype(np.int64)


def steps_dataset(data: dict) -> tf.data.Dataset:
    """One element per step of `data` (all episodes, concatenated)."""
    return tf.data.Dataset.from_tensor_slices(data)


def episodes_dataset(data: dict, lengths) -> tf.data.Dataset:
    """One element per episode: `steps`, its steps as a nested dataset (as TFDS loads them), and
    `episode_id`, the index of its first step."""
    def episode(start, length):
        return {"steps": steps_dataset(data).skip(start).take(length), "episode_id": start}
    return tf.data.Dataset.from_tensor_slices((episode_starts(lengths), np.array(lengths, np.int64))).map(episode)
