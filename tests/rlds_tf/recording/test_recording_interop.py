"""Interop with the peer venv (envlogger 1.2 + TFDS 4.9.4 on TF 2.15), in one peer process for the module:

* a dataset recorded by envlogger 1.2's TFDS backend loads in rlds_tf with identical values;
* a dataset recorded by rlds_tf loads in TFDS 4.9.4 with identical values;
* both recorders, given the same env, actions and config, store the same episodes.
"""
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import rlds_tf as rlds
from rlds_tf.recording import Catch
from rlds_tf.recording import EnvLogger
from rlds_tf.recording import TFDSBackendWriter

from dataset_testlib import assert_nested_equal, to_numpy

pytestmark = pytest.mark.peer

NUM_EPISODES = 5

_PEER_CODE = """
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import envlogger
from envlogger.backends import tfds_backend_writer
from envlogger.testing import catch_env

counter = [0]
def step_fn(unused_timestep, unused_action, unused_env):
    counter[0] += 1
    return {'timestamp_ns': counter[0]}

ds_config = tfds.rlds.rlds_base.DatasetConfig(
    name='catch_example',
    observation_info=tfds.features.Tensor(shape=(10, 5), dtype=tf.float32, encoding=tfds.features.Encoding.ZLIB),
    action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64,
    step_metadata_info={'timestamp_ns': tf.int64})
with envlogger.EnvLogger(
        catch_env.Catch(),
        backend=tfds_backend_writer.TFDSBackendWriter(
            data_directory=INPUTS['envlogger_dir'], split_name='train', max_episodes_per_file=2,
            ds_config=ds_config),
        step_fn=step_fn) as env:
    for e in range(INPUTS['num_episodes']):
        timestep = env.reset()
        t = 0
        while not timestep.last():
            timestep = env.step((e + t) % 3)
            t += 1

def emit_dir(prefix, directory):
    builder = tfds.builder_from_directory(directory)
    episodes = list(builder.as_dataset(split='train'))
    emit(prefix + '/num_episodes', len(episodes))
    emit(prefix + '/features', repr(builder.info.features))
    for i, episode in enumerate(episodes):
        steps = list(episode['steps'].as_numpy_iterator())
        emit_tree(prefix + '/' + str(i), {k: np.stack([s[k] for s in steps]) for k in steps[0]})

emit_dir('envlogger', INPUTS['envlogger_dir'])
emit_dir('ours', INPUTS['ours_dir'])
"""

CATCH_CONFIG = tfds.rlds.rlds_base.DatasetConfig(
    name="catch_example",
    observation_info=tfds.features.Tensor(shape=(10, 5), dtype=tf.float32, encoding=tfds.features.Encoding.ZLIB),
    action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64,
    step_metadata_info={"timestamp_ns": tf.int64})


def _record_ours(directory):
    counter = [0]

    def step_fn(unused_timestep, unused_action, unused_env):
        counter[0] += 1
        return {"timestamp_ns": counter[0]}

    with EnvLogger(Catch(), backend=TFDSBackendWriter(data_directory=directory, split_name="train",
                                                      max_episodes_per_file=2, ds_config=CATCH_CONFIG),
                   step_fn=step_fn) as env:
        for e in range(NUM_EPISODES):
            timestep = env.reset()
            t = 0
            while not timestep.last():
                timestep = env.step((e + t) % 3)
                t += 1


@pytest.fixture(scope="module")
def recorded(peer, tmp_path_factory):
    root = tmp_path_factory.mktemp("interop")
    envlogger_dir, ours_dir = str(root / "envlogger"), str(root / "ours")
    os.makedirs(envlogger_dir)
    _record_ours(ours_dir)
    out = peer.run(_PEER_CODE, {"envlogger_dir": envlogger_dir, "ours_dir": ours_dir,
                                "num_episodes": NUM_EPISODES})
    return envlogger_dir, ours_dir, out


def _peer_episodes(out, prefix):
    episodes = []
    for i in range(out[f"{prefix}/num_episodes"]):
        key = f"{prefix}/{i}/"
        episodes.append({k[len(key):]: v for k, v in out.items() if k.startswith(key)})
    return episodes


def _ours_stacked(directory):
    return [e["steps"] for e in to_numpy(rlds.load_stacked(directory, "train"))]


def test_envlogger_dataset_loads_in_rlds_tf(recorded):
    envlogger_dir, _, out = recorded
    expected = _peer_episodes(out, "envlogger")
    assert len(expected) == NUM_EPISODES
    nested = to_numpy(rlds.load(envlogger_dir, split="train"))
    assert_nested_equal([{k: np.stack([s[k] for s in e["steps"]]) for k in e["steps"][0]} for e in nested],
                        expected)
    assert_nested_equal(_ours_stacked(envlogger_dir), expected)


def test_rlds_tf_dataset_loads_in_peer_tfds(recorded):
    _, ours_dir, out = recorded
    assert_nested_equal(_peer_episodes(out, "ours"), _ours_stacked(ours_dir))
    assert out["ours/features"] == out["envlogger/features"]


def test_same_recording_same_episodes(recorded):
    """Same env, seed, actions and config: rlds_tf stores what envlogger 1.2 stores, step metadata included."""
    envlogger_dir, ours_dir, _ = recorded
    assert_nested_equal(_ours_stacked(ours_dir), _ours_stacked(envlogger_dir))
    ours_info = tfds.builder_from_directory(ours_dir).info
    theirs_info = tfds.builder_from_directory(envlogger_dir).info
    assert ours_info.splits["train"].shard_lengths == theirs_info.splits["train"].shard_lengths == [2, 2, 1]
    assert repr(ours_info.features) == repr(theirs_info.features)
