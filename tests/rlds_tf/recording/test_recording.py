"""Recording: EnvLogger + TFDSBackendWriter alignment, metadata, config inference, sharding, bad input."""
import dataclasses
import json
import os

import dm_env
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import tree
from dm_env import specs
from tensorflow.core.example import example_pb2
from tensorflow_datasets.core import example_serializer

import rlds_tf as rlds
from rlds_tf.recording import Catch
from rlds_tf.recording import EnvLogger
from rlds_tf.recording import TFDSBackendWriter
from rlds_tf.recording.episode_encoder import EpisodeEncoder

from dataset_testlib import assert_nested_equal, to_numpy

CATCH_CONFIG = tfds.rlds.rlds_base.DatasetConfig(
    name="catch_example",
    observation_info=tfds.features.Tensor(shape=(10, 5), dtype=tf.float32, encoding=tfds.features.Encoding.ZLIB),
    action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64,
    step_metadata_info={"timestamp_ns": tf.int64})


def _actions(episode, t):
    return (episode + t) % 3


def _expected_catch_episodes(num_episodes, seed=1):
    """Hand-made RLDS episodes: replays Catch and shifts (o_i, a_i, r_i, d_i) the RLDS way."""
    env = Catch(seed=seed)
    episodes = []
    for e in range(num_episodes):
        timesteps, actions = [env.reset()], []
        while not timesteps[-1].last():
            actions.append(_actions(e, len(actions)))
            timesteps.append(env.step(actions[-1]))
        steps = []
        for i, ts in enumerate(timesteps):
            last = i == len(timesteps) - 1
            steps.append(dict(
                observation=ts.observation,
                action=np.int64(0 if last else actions[i]),
                reward=np.float64(0.0 if last else timesteps[i + 1].reward),
                discount=np.float64(0.0 if last else timesteps[i + 1].discount),
                is_first=np.bool_(i == 0), is_last=np.bool_(last),
                is_terminal=np.bool_(last and ts.discount == 0.0)))
        episodes.append(steps)
    return episodes


def _record_catch(directory, num_episodes, *, seed=1, **logger_kwargs):
    with EnvLogger(Catch(seed=seed), **logger_kwargs) as env:
        for e in range(num_episodes):
            ts = env.reset()
            t = 0
            while not ts.last():
                ts = env.step(_actions(e, t))
                t += 1
    return directory


def _stack(steps):
    return tree.map_structure(lambda *xs: np.stack(xs), *steps)


def _loaded_stacked(directory, split="train"):
    return [{k: v for k, v in e["steps"].items()} for e in to_numpy(rlds.load_stacked(directory, split))]


def test_step_alignment_matches_hand_computed(tmp_path):
    _record_catch(str(tmp_path), 3, data_directory=str(tmp_path))
    expected = [_stack(steps) for steps in _expected_catch_episodes(3)]
    loaded = to_numpy(rlds.load(str(tmp_path), split="train"))
    assert len(loaded) == 3
    for episode, want in zip(loaded, expected):
        assert_nested_equal(_stack(episode["steps"]), want)


_NOTEBOOK_CELL = """
import os
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import time
# The notebook's imports were `import envlogger`, `from envlogger.backends import tfds_backend_writer` and
# `from envlogger.testing import catch_env`; these are the only lines changed.
import rlds_tf as envlogger
from rlds_tf.recording import backend as tfds_backend_writer
from rlds_tf.recording import catch_env

def record_data(data_dir, num_episodes, max_episodes_per_shard):
  env = catch_env.Catch()

  def step_fn(unused_timestep, unused_action, unused_env):
    return {'timestamp_ns': time.time_ns()}

  ds_config = tfds.rlds.rlds_base.DatasetConfig(
      name='catch_example',
      observation_info=tfds.features.Tensor(
          shape=(10, 5), dtype=tf.float32,
          encoding=tfds.features.Encoding.ZLIB),
      action_info=tf.int64,
      reward_info=tf.float64,
      discount_info=tf.float64,
      step_metadata_info={'timestamp_ns': tf.int64})

  with envlogger.EnvLogger(
      env,
      backend=tfds_backend_writer.TFDSBackendWriter(
          data_directory=data_dir,
          split_name='train',
          max_episodes_per_file=max_episodes_per_shard,
          ds_config=ds_config),
      step_fn=step_fn) as env:
    print('Done wrapping environment with EnvironmentLogger.')

    print(f'Training a random agent for {num_episodes} episodes...')
    for i in range(num_episodes):
      print(f'episode {i}')
      timestep = env.reset()
      while not timestep.last():
        action = np.random.randint(low=0, high=3)
        timestep = env.step(action)
    print(f'Done training a random agent for {num_episodes} episodes.')

os.makedirs(dataset_path, exist_ok=True)
record_data(dataset_path, num_episodes, max_episodes_per_shard)
loaded_dataset = tfds.builder_from_directory(dataset_path).as_dataset(split='all')
"""


def test_notebook_recording_cell(tmp_path, capsys):
    """The recording cells of the rlds+reverb notebook (seed 000), verbatim except for the imports."""
    scope = {"dataset_path": str(tmp_path / "catch"), "num_episodes": 4, "max_episodes_per_shard": 3}
    exec(_NOTEBOOK_CELL, scope)  # pylint: disable=exec-used
    assert "Done training a random agent for 4 episodes." in capsys.readouterr().out
    loaded = scope["loaded_dataset"]
    episodes = to_numpy(loaded)
    assert len(episodes) == 4
    assert sorted(f for f in os.listdir(tmp_path / "catch") if ".tfrecord-" in f) == [
        "catch_example-train.tfrecord-00000", "catch_example-train.tfrecord-00001"]
    stamps = np.concatenate([[s["timestamp_ns"] for s in e["steps"]] for e in episodes])
    assert np.all(np.diff(stamps) > 0)  # one per step, in recording order
    assert rlds.is_valid_rlds_dataset(loaded)


def test_step_and_episode_metadata(tmp_path):
    calls = []

    def step_fn(timestep, action, env):
        return {"t": np.int32(len(calls)), "had_action": action is not None}

    def episode_fn(timestep, action, env):
        calls.append(1)
        return {"episode_len": np.int64(len(calls))} if timestep.last() else None

    _record_catch(str(tmp_path), 2, data_directory=str(tmp_path), step_fn=step_fn, episode_fn=episode_fn)
    info = tfds.builder_from_directory(str(tmp_path)).info
    assert info.features["steps"]["t"].dtype == tf.int32
    assert info.features["episode_len"].dtype == tf.int64
    episodes = to_numpy(rlds.load(str(tmp_path), split="train"))
    # Metadata is aligned with the observation (envlogger's m_i): step 0 is the reset's metadata.
    first = episodes[0]["steps"]
    assert [bool(s["had_action"]) for s in first] == [False] + [True] * 9
    assert [int(s["t"]) for s in first] == list(range(10))
    # The last non-None episode_fn value wins: 10 calls in episode 0, 20 after episode 1.
    assert [int(e["episode_len"]) for e in episodes] == [10, 20]


def test_config_inferred_from_specs(tmp_path):
    _record_catch(str(tmp_path), 1, data_directory=str(tmp_path))
    steps = tfds.builder_from_directory(str(tmp_path)).info.features["steps"]
    assert steps["observation"].shape == (10, 5) and steps["observation"].dtype == tf.float32
    assert steps["action"].dtype == tf.int64
    assert steps["reward"].dtype == tf.float64 and steps["discount"].dtype == tf.float64


@pytest.mark.parametrize("max_per_file, num_episodes, shard_lengths", [
    (2, 5, [2, 2, 1]),
    (5, 5, [5]),
    (1000, 3, [3]),
])
def test_sharding(tmp_path, max_per_file, num_episodes, shard_lengths):
    _record_catch(str(tmp_path), num_episodes, backend=TFDSBackendWriter(
        str(tmp_path), dataclasses.replace(CATCH_CONFIG, step_metadata_info={}), max_per_file, "episodes"))
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    (split,) = info["splits"]
    assert split["name"] == "episodes"
    assert [int(n) for n in split["shardLengths"]] == shard_lengths
    files = sorted(f for f in os.listdir(tmp_path) if ".tfrecord-" in f)
    assert files == [f"catch_example-episodes.tfrecord-{i:05d}" for i in range(len(shard_lengths))]
    assert len(to_numpy(rlds.load(str(tmp_path), split="episodes"))) == num_episodes


def test_progress_bar(tmp_path, capsys):
    _record_catch(str(tmp_path), 2, data_directory=str(tmp_path), show_progress=True)
    assert "recording" in capsys.readouterr().err


class _ShapeShiftingEnv(dm_env.Environment):
    """Observation (3,) float32, but episode `bad_episode` switches to `bad_obs` at its step 2."""

    def __init__(self, bad_obs, bad_episode=1):
        self._bad_obs, self._bad_episode, self._episode, self._t = bad_obs, bad_episode, -1, 0

    def reset(self):
        self._episode += 1
        self._t = 0
        return dm_env.restart(np.zeros(3, np.float32))

    def step(self, action):
        self._t += 1
        obs = np.full(3, self._t, np.float32)
        if self._episode == self._bad_episode and self._t >= 2:
            obs = self._bad_obs
        return dm_env.termination(1.0, obs) if self._t == 4 else dm_env.transition(0.0, obs)

    def observation_spec(self):
        return specs.Array((3,), np.float32)

    def action_spec(self):
        return specs.DiscreteArray(2)


@pytest.mark.parametrize("bad_obs, error", [
    (np.zeros(4, np.float32), r"steps/observation: shape changed: expected \(3,\) with dtype float32, "
                              r"got \(4,\) with dtype float32"),
    (np.zeros(3, np.float64), r"steps/observation: dtype changed: expected float32 with shape \(3,\), "
                              r"got float64 with shape \(3,\)"),
])
def test_observation_changing_mid_recording(tmp_path, bad_obs, error):
    env = EnvLogger(_ShapeShiftingEnv(bad_obs), data_directory=str(tmp_path))
    with pytest.raises(ValueError, match=error):
        for _ in range(3):
            ts = env.reset()
            while not ts.last():
                ts = env.step(0)
    env.close()
    episodes = to_numpy(rlds.load(str(tmp_path), split="train"))
    assert len(episodes) == 1  # the completed episode is on disk and loads
    assert [float(s["observation"][0]) for s in episodes[0]["steps"]] == [0, 1, 2, 3, 4]


def test_gymnasium_env(tmp_path):
    gymnasium = pytest.importorskip("gymnasium")

    class Counter(gymnasium.Env):
        observation_space = gymnasium.spaces.Dict({
            "pos": gymnasium.spaces.Box(-10, 10, (2,), np.float32), "count": gymnasium.spaces.Discrete(10)})
        action_space = gymnasium.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return {"pos": np.zeros(2, np.float32), "count": 0}, {}

        def step(self, action):
            self.t += 1
            obs = {"pos": np.full(2, self.t, np.float32), "count": self.t}
            # Episode 1 of length 3 terminates; otherwise a time limit truncates at 2.
            return obs, float(self.t * 10 + action), self.t == 3 and action == 1, self.t == 2 and action == 0, {}

    with EnvLogger(Counter(), data_directory=str(tmp_path)) as env:
        for action in (0, 1):
            obs, info = env.reset()
            done = False
            while not done:
                obs, reward, terminated, truncated, info = env.step(action)
                done = terminated or truncated
    truncated_ep, terminated_ep = to_numpy(rlds.load(str(tmp_path), split="train"))
    assert_nested_equal(_stack(truncated_ep["steps"]), {
        "observation": {"pos": np.float32([[0, 0], [1, 1], [2, 2]]), "count": np.int64([0, 1, 2])},
        "action": np.int64([0, 0, 0]), "reward": np.float64([10, 20, 0]), "discount": np.float64([1, 1, 0]),
        "is_first": np.bool_([1, 0, 0]), "is_last": np.bool_([0, 0, 1]), "is_terminal": np.bool_([0, 0, 0])})
    assert_nested_equal(_stack(terminated_ep["steps"])["is_terminal"], np.bool_([0, 0, 0, 1]))
    assert_nested_equal(_stack(terminated_ep["steps"])["discount"], np.float64([1, 1, 0, 0]))


def test_the_lock_file_is_there_while_recording_and_gone_after_a_clean_close(tmp_path):
    lock = tmp_path / ".rlds_tf_writer.lock"
    writer = TFDSBackendWriter(str(tmp_path), CATCH_CONFIG)
    assert lock.exists()
    writer.close()
    assert not lock.exists()
    TFDSBackendWriter(str(tmp_path), CATCH_CONFIG).close()  # and the directory can be recorded into again
    assert not lock.exists()


def test_a_writer_that_closes_with_an_error_leaves_its_lock_file(tmp_path, monkeypatch):
    writer = TFDSBackendWriter(str(tmp_path), CATCH_CONFIG)

    def full_disk():
        raise OSError("disk full")
    monkeypatch.setattr(writer._writer._writer, "close_all", full_disk)  # the shards' final write fails
    with pytest.raises(OSError, match="disk full"):
        writer.close()
    assert (tmp_path / ".rlds_tf_writer.lock").exists()


def test_two_writers_in_one_directory_fail(tmp_path):
    first = TFDSBackendWriter(str(tmp_path), CATCH_CONFIG)
    with pytest.raises(RuntimeError, match="another process is recording"):
        TFDSBackendWriter(str(tmp_path), CATCH_CONFIG)
    first.close()
    TFDSBackendWriter(str(tmp_path), CATCH_CONFIG).close()


def test_append_with_overwrite_false(tmp_path):
    config = dataclasses.replace(CATCH_CONFIG, step_metadata_info={})
    _record_catch(str(tmp_path), 2, backend=TFDSBackendWriter(str(tmp_path), config))
    _record_catch(str(tmp_path), 1, backend=TFDSBackendWriter(str(tmp_path), config, overwrite=False))
    assert len(to_numpy(rlds.load(str(tmp_path), split="train"))) == 3


# -- the fast encoder writes exactly what TFDS's encoder writes ------------------------------------------

_ENCODER_CASES = [
    ("scalars", {"observation_info": tf.float32, "action_info": tf.int64, "reward_info": tf.float64,
                 "discount_info": tf.float64},
     lambda i: dict(observation=np.float32(i), action=i, reward=0.5 * i, discount=1.0)),
    ("zlib_and_bytes", {"observation_info": tfds.features.Tensor(shape=(2, 3), dtype=tf.float32,
                                                                 encoding=tfds.features.Encoding.ZLIB),
                        "action_info": tfds.features.Tensor(shape=(2,), dtype=tf.int32,
                                                            encoding=tfds.features.Encoding.BYTES),
                        "reward_info": tf.float32, "discount_info": tf.float32},
     lambda i: dict(observation=np.full((2, 3), i, np.float32), action=np.int32([i, -i]), reward=1.0,
                    discount=0.0)),
    ("nested_and_metadata", {"observation_info": {"pos": tfds.features.Tensor(shape=(2,), dtype=tf.float64),
                                                  "flag": tf.bool, "u8": tfds.features.Tensor(shape=(3,),
                                                                                              dtype=tf.uint8)},
                             "action_info": tfds.features.Tensor(shape=(1,), dtype=tf.int64),
                             "reward_info": tf.float64, "discount_info": tf.float64,
                             "step_metadata_info": {"t": tf.int32},
                             "episode_metadata_info": {"episode_id": tf.int64, "score": tf.float32}},
     lambda i: dict(observation={"pos": np.float64([i, 2 * i]), "flag": i % 2 == 0, "u8": np.uint8([i, 1, 2])},
                    action=np.int64([i]), reward=1.0, discount=1.0, t=np.int32(i))),
]


@pytest.mark.parametrize("name, config_kwargs, make_step", _ENCODER_CASES, ids=[c[0] for c in _ENCODER_CASES])
@pytest.mark.parametrize("num_steps", [0, 1, 4])
def test_fast_encoder_matches_tfds(name, config_kwargs, make_step, num_steps):
    config = tfds.rlds.rlds_base.DatasetConfig(name=name, **config_kwargs)
    info = tfds.rlds.rlds_base.build_info(config, tfds.core.dataset_info.DatasetIdentity(
        name=name, version=tfds.core.Version("0.0.1"), data_dir="/unused", module_name=""))
    encoder = EpisodeEncoder(info.features)
    assert encoder.fast
    steps = [dict(make_step(i), is_first=i == 0, is_last=i == num_steps - 1, is_terminal=False)
             for i in range(num_steps)]
    metadata = {"episode_id": 7, "score": 0.25} if "episode_metadata_info" in config_kwargs else {}
    for step in steps:
        encoder.add_step(step)
    ours = encoder.serialize(metadata)
    serializer = example_serializer.ExampleSerializer(info.features.get_serialized_info())
    theirs = serializer.serialize_example(info.features.encode_example({"steps": steps, **metadata}))
    assert example_pb2.Example.FromString(ours) == example_pb2.Example.FromString(theirs)


@pytest.mark.parametrize("module_name", [
    "rlds_tf.loading", "rlds_tf.recording.env_logger", "rlds_tf.recording.tfds_writer",
    "rlds_tf.recording.catch_env", "rlds_tf.recording.config", "rlds_tf.recording.crash_recovery",
    "rlds_tf.tfds.episode_writer", "rlds_tf.tfds.config_generator",
])
def test_doctests(module_name):
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(module_name))
    assert result.attempted > 0 and result.failed == 0


def test_backend_used_directly_like_envlogger(tmp_path):
    """record_step/set_episode_metadata/close, as envlogger's EnvLogger drives a backend; a truncated episode."""
    from rlds_tf.recording import StepData
    config = tfds.rlds.rlds_base.DatasetConfig(
        name="direct", observation_info=tf.int64, action_info=tf.int64, reward_info=tf.float64,
        discount_info=tf.float64, episode_metadata_info={"tag": tf.int64})
    backend = TFDSBackendWriter(str(tmp_path), config, store_ds_metadata=True, metadata={"owner": "test"})
    backend.record_step(StepData(dm_env.restart(np.int64(10)), None), is_new_episode=True)
    backend.record_step(StepData(dm_env.transition(1.0, np.int64(11), 0.5), np.int64(5)), is_new_episode=False)
    backend.set_episode_metadata({"tag": 1})
    backend.record_step(StepData(dm_env.truncation(2.0, np.int64(12)), np.int64(6)), is_new_episode=False)
    backend.set_episode_metadata({"tag": 2})  # the last value set wins
    backend.close()  # writes the open episode, like envlogger
    (episode,) = to_numpy(rlds.load(str(tmp_path), split="train"))
    assert int(episode["tag"]) == 2
    assert_nested_equal(_stack(episode["steps"]), {
        "observation": np.int64([10, 11, 12]), "action": np.int64([5, 6, 0]), "reward": np.float64([1, 2, 0]),
        "discount": np.float64([0.5, 1, 0]), "is_first": np.bool_([1, 0, 0]), "is_last": np.bool_([0, 0, 1]),
        "is_terminal": np.bool_([0, 0, 0])})  # truncation: discount 1, so not terminal
    assert json.loads((tmp_path / "metadata.json").read_text()) == {"owner": "test"}


def test_image_observation_through_envlogger(tmp_path):
    """RGB image observations go through TFDS's own encoder; a frame of the wrong size is still named early."""
    class Camera(dm_env.Environment):
        def __init__(self):
            self.t = 0

        def reset(self):
            self.t = 0
            return dm_env.restart(self._obs())

        def step(self, action):
            self.t += 1
            return dm_env.termination(1.0, self._obs()) if self.t == 2 else dm_env.transition(0.0, self._obs())

        def _obs(self):
            size = 6 if self.t == 1 and getattr(self, "broken", False) else 4
            return {"image": np.full((size, 4, 3), self.t * 40, np.uint8), "x": np.float32(self.t)}

        def observation_spec(self):
            return {"image": specs.Array((4, 4, 3), np.uint8), "x": specs.Array((), np.float32)}

        def action_spec(self):
            return specs.DiscreteArray(2)

    camera = Camera()
    env = EnvLogger(camera, data_directory=str(tmp_path))
    ts = env.reset()
    while not ts.last():
        ts = env.step(1)
    camera.broken = True
    env.reset()
    with pytest.raises(ValueError, match=r"steps/observation/image: shape changed: expected \(4, 4, 3\) with "
                                         r"dtype uint8, got \(6, 4, 3\)"):
        env.step(1)
        env.step(1)
    env.close()
    features = tfds.builder_from_directory(str(tmp_path)).info.features["steps"]["observation"]
    assert isinstance(features["image"], tfds.features.Image)
    (episode,) = to_numpy(rlds.load(str(tmp_path), split="train"))
    assert_nested_equal(_stack(episode["steps"])["observation"],
                        {"image": np.stack([np.full((4, 4, 3), v, np.uint8) for v in (0, 40, 80)]),
                         "x": np.float32([0, 1, 2])})
