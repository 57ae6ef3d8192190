"""WriteEpisodes, ReadEpisodes and the Beam CLI paths: duplicates, retries, progress lines, strict JSON, options.

Run in the Beam venv (`.ci/make_beam_venv.sh`); skipped where apache_beam is not importable.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam", reason="apache_beam is not installed: these tests run in the Beam venv "
                                                 "(.ci/make_beam_venv.sh; pip install rl-data-tf[beam])")

import tensorflow as tf  # noqa: E402
import tensorflow_datasets as tfds  # noqa: E402

import rlds_tf  # noqa: E402
from rlds_tf.beam import WriteEpisodes  # noqa: E402
from rlds_tf.recording import tfds_writer  # noqa: E402

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
_CONFIG = tfds.rlds.rlds_base.DatasetConfig(
    name="toy", observation_info=tfds.features.Tensor(shape=(2,), dtype=np.float32), action_info=tf.int64,
    reward_info=tf.float64, discount_info=tf.float64)


def _episode(length, seed):
    rng = np.random.default_rng(seed)
    return {"steps": {"observation": rng.normal(size=(length, 2)).astype(np.float32),
                      "action": rng.integers(0, 5, size=length), "reward": rng.normal(size=length),
                      "discount": np.ones(length), "is_first": np.arange(length) == 0,
                      "is_last": np.arange(length) == length - 1, "is_terminal": np.arange(length) == length - 1}}


def _features():
    return tfds.rlds.rlds_base.build_info(_CONFIG, tfds.core.dataset_info.DatasetIdentity(
        name="toy", version=tfds.core.Version("0.0.1"), data_dir="", module_name=""), None).features


def _rewards(directory, split="train"):
    return sorted(_key(e) for e in tfds.as_numpy(rlds_tf.load_stacked(directory, split)))


def _key(episode):
    return tuple(np.asarray(episode["steps"]["observation"], np.float32).ravel().tolist())


@pytest.mark.parametrize("num_shards", [None, 2])
def test_identical_bare_episodes_are_all_written(tmp_path, num_shards):
    a, b = _episode(3, 1), _episode(4, 2)
    destination = str(tmp_path / "out")
    with beam.Pipeline() as p:
        _ = p | beam.Create([a, a, b, a]) | WriteEpisodes(destination, _features(), num_shards,
                                                          max_episodes_per_file=1)
    expected = sorted([_key(a)] * 3 + [_key(b)])
    assert _rewards(destination) == expected
    with open(os.path.join(destination, "dataset_info.json"), encoding="utf-8") as f:
        lengths = [int(n) for n in json.load(f)["splits"][0]["shardLengths"]]
    assert lengths == ([1, 1, 1, 1] if num_shards is None else [2, 2])


def test_repeated_indices_are_named(tmp_path):
    with pytest.raises(Exception, match=r"two \(index, episode\) pairs have index 1"):
        with beam.Pipeline() as p:
            _ = (p | beam.Create([(0, _episode(2, 0)), (1, _episode(2, 1)), (1, _episode(3, 2))])
                 | WriteEpisodes(str(tmp_path / "out"), _features()))
