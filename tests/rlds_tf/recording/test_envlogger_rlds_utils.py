"""envlogger's `rlds_utils` for TFDS-backend users (`rlds_tf.recording.rlds_utils`), and RLDS's envlogger notebook.

The notebook records Catch with a `tfds.rlds.rlds_base.DatasetConfig`, recovers the last shard of a dataset
through its TFDS builder (`rlds_utils.maybe_recover_last_shard(builder)`), loads it with plain TFDS, and
loads two recordings as one dataset. `test_notebook_flow` runs that flow (our text, generated data) with the
imports changed as the README's name map says; the peer tests compare with envlogger 1.2's functions.
"""
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from dataset_testlib import assert_nested_equal, to_numpy

# envlogger's names: `import envlogger`, `from envlogger.backends import rlds_utils`,
# `from envlogger.backends import tfds_backend_writer`, `from envlogger.testing import catch_env`.
import rlds_tf as envlogger
from rlds_tf.recording import backend as tfds_backend_writer
from rlds_tf.recording import catch_env
from rlds_tf.recording import rlds_utils

_DATASET_INFO = "dataset_info.json"


def _dataset_dirs(root: str) -> list:
    """The directories under `root` holding a TFDS dataset (a `features.json`), as the notebook finds them."""
    return sorted(path for path, _, files in tf.io.gfile.walk(root) if "features.json" in files)


def _record(data_dir: str, num_episodes: int, max_episodes_per_shard: int) -> None:
    """Catch with a DatasetConfig and a step counter as step metadata, actions fixed by (episode, step)."""
    counter = [0]

    def step_fn(unused_timestep, unused_action, unused_env):
        counter[0] += 1
        return {"step_count": counter[0]}

    ds_config = tfds.rlds.rlds_base.DatasetConfig(
        name="catch_example",
        observation_info=tfds.features.Tensor(shape=(10, 5), dtype=tf.float32,
                                              encoding=tfds.features.Encoding.ZLIB),
        action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64,
        step_metadata_info={"step_count": tf.int64})
    backend = tfds_backend_writer.TFDSBackendWriter(data_directory=data_dir, split_name="train",
                                                    max_episodes_per_file=max_episodes_per_shard,
                                                    ds_config=ds_config)
    with envlogger.EnvLogger(catch_env.Catch(seed=3), backend=backend, step_fn=step_fn) as env:
        for episode in range(num_episodes):
            timestep, t = env.reset(), 0
            while not timestep.last():
                timestep = env.step((episode + t) % 3)
                t += 1


def _crash_before_last_shard_is_listed(data_dir: str) -> None:
    """The state a recorder killed while writing its last shard leaves: that shard is not in the metadata.

    (envlogger's writer lists a shard only once it is closed, so this is how its recordings end when the
    process dies.)"""
    with open(os.path.join(data_dir, _DATASET_INFO)) as f:
        info = json.load(f)
    split = info["splits"][0]
    last = os.path.join(data_dir, f"catch_example-train.tfrecord-{len(split['shardLengths']) - 1:05d}")
    dropped = sum(len(r.numpy()) for r in tf.data.TFRecordDataset(last))
    split["numBytes"] = str(int(split["numBytes"]) - dropped)
    split["shardLengths"] = split["shardLengths"][:-1]
    with open(os.path.join(data_dir, _DATASET_INFO), "w") as f:
        json.dump(info, f)


def _episodes(builder) -> list:
    return [{k: np.stack([s[k] for s in e["steps"]]) for k in e["steps"][0]}
            for e in to_numpy(builder.as_dataset(split="all"))]


def test_notebook_flow(tmp_path):
    root = str(tmp_path / "catch")
    reference = str(tmp_path / "reference")
    _record(reference, num_episodes=5, max_episodes_per_shard=2)  # shards of 2, 2 and 1 episodes
    want = _episodes(tfds.builder_from_directory(reference))
    assert len(want) == 5

    # Generate, then crash: the last shard is on disk but not in the metadata.
    generate_data_dir = os.path.join(root, "generated")
    shutil.copytree(reference, generate_data_dir)
    _crash_before_last_shard_is_listed(generate_data_dir)
    assert tfds.builder_from_directory(generate_data_dir).info.splits["train"].num_examples == 4

    # Recover a dataset (the notebook's cell: the builder in, a builder listing every episode out). The
    # notebook's `tfds.core.builder_from_directory` is `tfds.builder_from_directory` in current TFDS.
    builder = tfds.builder_from_directory(generate_data_dir)
    builder = rlds_utils.maybe_recover_last_shard(builder)
    assert builder.info.splits["train"].shard_lengths == [2, 2, 1]
    assert_nested_equal(_episodes(builder), want)

    # Load one dataset with plain TFDS.
    loaded_dataset = tfds.builder_from_directory(generate_data_dir).as_dataset(split="all")
    assert_nested_equal(_episodes(tfds.builder_from_directory(generate_data_dir)), want)
    assert envlogger.is_valid_rlds_dataset(loaded_dataset)

    # Load a dataset from multiple directories.
    dir_a, dir_b = os.path.join(root, "subdir_A"), os.path.join(root, "subdir_B")
    _record(dir_a, num_episodes=3, max_episodes_per_shard=2)
    _record(dir_b, num_episodes=2, max_episodes_per_shard=2)
    assert _dataset_dirs(root) == [generate_data_dir, dir_a, dir_b]
    both = _episodes(tfds.builder_from_directories([dir_a, dir_b]))
    assert len(both) == 5
    # Both recordings replay Catch(seed=3) with the same actions: B's episodes are A's first two (TFDS
    # chooses the order of the directories' episodes).
    order = lambda e: (int(e["step_count"][0]), e["observation"].tobytes())  # noqa: E731
    assert_nested_equal(sorted(both, key=order), sorted(want[:3] + want[:2], key=order))


def test_the_builder_passed_in_is_updated_too(tmp_path):
    # envlogger updates the builder it is given: code that drops the return value reads every episode too.
    data_dir = str(tmp_path)
    _record(data_dir, num_episodes=3, max_episodes_per_shard=2)
    _crash_before_last_shard_is_listed(data_dir)
    builder = tfds.builder_from_directory(data_dir)
    rlds_utils.maybe_recover_last_shard(builder)
    assert len(to_numpy(builder.as_dataset(split="train"))) == 3


def test_a_complete_dataset_is_left_as_it_is(tmp_path):
    data_dir = str(tmp_path)
    _record(data_dir, num_episodes=3, max_episodes_per_shard=2)
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(data_dir)}
    builder = tfds.builder_from_directory(data_dir)
    assert rlds_utils.maybe_recover_last_shard(builder) is builder
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(data_dir)} == before


def test_a_builder_of_a_remote_directory_is_refused():
    class RemoteBuilder:
        data_dir = "gs://bucket/catch/1.0.0"

    with pytest.raises(ValueError, match=r"builder\.data_dir must be a local directory, got "
                                         r"'gs://bucket/catch/1\.0\.0'; copy the dataset"):
        rlds_utils.maybe_recover_last_shard(RemoteBuilder())


_RECOVER_PEER_CODE = """
import tensorflow_datasets as tfds
from envlogger.backends import rlds_utils
builder = rlds_utils.maybe_recover_last_shard(tfds.builder_from_directory(INPUTS['data_dir']))
split = builder.info.splits['train']
emit('shard_lengths', list(split.shard_lengths))
emit('num_bytes', int(split.num_bytes))
emit('reloaded_num_examples', tfds.builder_from_directory(INPUTS['data_dir']).info.splits['train'].num_examples)
"""


@pytest.mark.peer
def test_recovery_lists_what_envloggers_lists(peer, tmp_path):
    reference = str(tmp_path / "reference")
    _record(reference, num_episodes=5, max_episodes_per_shard=2)
    _crash_before_last_shard_is_listed(reference)
    theirs, ours = str(tmp_path / "theirs"), str(tmp_path / "ours")
    shutil.copytree(reference, theirs)
    shutil.copytree(reference, ours)
    expected = peer.run(_RECOVER_PEER_CODE, {"data_dir": theirs})
    split = rlds_utils.maybe_recover_last_shard(tfds.builder_from_directory(ours)).info.splits["train"]
    assert expected == {"shard_lengths": [2, 2, 1], "num_bytes": int(split.num_bytes), "reloaded_num_examples": 5}
    assert list(split.shard_lengths) == expected["shard_lengths"]


# Consecutive envlogger steps (dm_env timesteps, actions, step metadata) of a terminated and a truncated episode.
_STEPS_CODE = """
obs = [np.array([i, -i], np.float32) for i in range(6)]
episodes = [
    [StepData(dm_env.restart(obs[0]), None, {'m': np.int32(0)}),
     StepData(dm_env.transition(1.0, obs[1], 0.9), np.int64(2), {'m': np.int32(1)}),
     StepData(dm_env.termination(2.5, obs[2]), np.int64(1), {'m': np.int32(2)})],
    [StepData(dm_env.restart(obs[3]), None, None),
     StepData(dm_env.truncation(0.5, obs[4]), np.int64(0), None)],
]
pairs = [(e[i], e[i + 1] if i + 1 < len(e) else None) for e in episodes for i in range(len(e))]
"""

_TO_RLDS_STEP_PEER_CODE = """
import dm_env
from envlogger.backends import rlds_utils
from envlogger.step_data import StepData
exec(INPUTS['steps_code'])
for i, (prev, cur) in enumerate(pairs):
    emit_tree(f'step{i}', rlds_utils.to_rlds_step(prev, cur))
emit('count', len(pairs))
"""


@pytest.mark.peer
def test_to_rlds_step_matches_envlogger(peer):
    import dm_env

    from rlds_tf.recording import StepData

    expected = peer.run(_TO_RLDS_STEP_PEER_CODE, {"steps_code": _STEPS_CODE})
    scope = {"np": np, "dm_env": dm_env, "StepData": StepData}
    exec(_STEPS_CODE, scope)  # noqa: S102  (the same steps as the peer's)
    assert expected["count"] == len(scope["pairs"]) == 5
    for i, (prev, cur) in enumerate(scope["pairs"]):
        step = rlds_utils.to_rlds_step(prev, cur)
        want = {key[len(f"step{i}/"):]: value for key, value in expected.items() if key.startswith(f"step{i}/")}
        assert_nested_equal({k: np.asarray(v) for k, v in step.items()}, want, path=f"step{i}")
