"""PyHashedReplayBuffer and FrameBuffer against TF-Agents 0.19's (peer venv): the same adds give the same
frame counts (deduplication and reference counting through wrap and clear) and the same seeded samples;
checkpoints round trip; and what differs on purpose (digest collisions, pickled checkpoints)."""
import collections
import importlib

import numpy as np
import pytest
import tensorflow as tf

import buffer_testlib
import replay_tf
from replay_tf.buffers import py_hashed

# A Trajectory-like namedtuple, with TF-Agents' field order (tf_agents does not import on current TF).
Trajectory = collections.namedtuple("Trajectory", ["step_type", "observation", "action", "policy_info",
                                                   "next_step_type", "reward", "discount"])

_SCENARIO = """
import numpy as np
def listed(x):
    if hasattr(x, "_asdict"):
        return {k: listed(v) for k, v in x._asdict().items()}
    if isinstance(x, (list, tuple)):
        return [listed(v) for v in x]
    return np.asarray(x).tolist()
def frame(v):
    return np.full([3, 3, 1], v, np.uint8)
def traj(t):
    # observation t stacks frames t, t+1, t+2, t+3 (frame values mod 9: frames repeat after 9 steps)
    obs = np.concatenate([frame((t + k) % 9) for k in range(4)], axis=-1)[None]
    return make_traj(np.array([t % 3], np.int32), obs, np.array([t], np.int32), np.array([t], np.int32),
                     np.array([t / 2], np.float32), np.array([1.0], np.float32))
rb = make_buffer(6)
counts = []
for t in range(14):       # wraps twice: overwritten items release their frames
    rb.add_batch(traj(t))
    counts.append(len(rb._frame_buffer))
emit("counts", counts)
emit("size", int(rb.size))
np.random.seed(4)
emit("single", listed(rb.get_next()))
emit("batch_steps", listed(rb.get_next(3, num_steps=2)))
np.random.seed(5)
dataset = rb.as_dataset(sample_batch_size=2, num_steps=3)
emit("dataset", [listed(e) for e in dataset.take(2).as_numpy_iterator()])
rb.clear()
emit("cleared", [int(rb.size), len(rb._frame_buffer)])
rb.add_batch(traj(20))
emit("after_clear", [listed(rb.get_next()), len(rb._frame_buffer)])
"""

_PEER = """
from tf_agents.replay_buffers import py_hashed_replay_buffer
from tf_agents.specs import array_spec
from tf_agents.trajectories import trajectory
import numpy as np
def make_traj(step_type, obs, action, next_step_type, reward, discount):
    return trajectory.Trajectory(step_type=step_type, observation=obs, action=action, policy_info=(),
                                 next_step_type=next_step_type, reward=reward, discount=discount)
def make_buffer(capacity):
    i32 = array_spec.ArraySpec([], np.int32)
    spec = trajectory.Trajectory(step_type=i32, observation=array_spec.ArraySpec([3, 3, 4], np.uint8), action=i32,
                                 policy_info=(), next_step_type=i32, reward=array_spec.ArraySpec([], np.float32),
                                 discount=array_spec.ArraySpec([], np.float32))
    return py_hashed_replay_buffer.PyHashedReplayBuffer(spec, capacity)
""" + _SCENARIO


def _make_traj(step_type, obs, action, next_step_type, reward, discount):
    return Trajectory(step_type, obs, action, (), next_step_type, reward, discount)


def _make_buffer(capacity):
    i32 = tf.TensorSpec([], tf.int32)
    spec = Trajectory(i32, tf.TensorSpec([3, 3, 4], tf.uint8), i32, (), i32, tf.TensorSpec([], tf.float32),
                      tf.TensorSpec([], tf.float32))
    return replay_tf.PyHashedReplayBuffer(spec, capacity)


def _traj(t):
    """Item t of the scenario: observation frames t..t+3 (mod 9), action t."""
    obs = np.stack([np.full([3, 3], (t + k) % 9, np.uint8) for k in range(4)], axis=-1)[None]
    return _make_traj(np.array([0], np.int32), obs, np.array([t], np.int32), np.array([0], np.int32),
                      np.array([0.0], np.float32), np.array([1.0], np.float32))


def _run_local() -> dict:
    return buffer_testlib.run_scenario(_SCENARIO, make_buffer=_make_buffer, make_traj=_make_traj)


test_matches_tf_agents = buffer_testlib.matches_tf_agents_test(_PEER, _run_local)


def test_local_scenario_values():
    # (compared with TF-Agents above; hand-computed values keep it meaningful without the peer)
    out = _run_local()
    # Item t holds frames t..t+3 (mod 9): the first item brings 4 frames, each later one 1 new frame, until
    # all 9 values exist; once 6 items are held, the 6 items cover 9 consecutive values (all 9 frames).
    assert out["counts"] == [4, 5, 6, 7, 8, 9, 9, 9, 9, 9, 9, 9, 9, 9]
    assert out["size"] == 6 and out["cleared"] == [0, 0]
    single = out["single"]
    t = single["action"]
    assert 8 <= t <= 13 and np.array(single["observation"])[0, 0, :].tolist() == [(t + k) % 9 for k in range(4)]
    for actions in out["batch_steps"]["action"]:          # 2 consecutive items of those held (8..13)
        assert actions[1] == actions[0] + 1 and 8 <= actions[0] <= 12
    after, frames = out["after_clear"]
    assert after["action"] == 20 and frames == 4
    assert np.array(after["observation"])[1, 2, :].tolist() == [2, 3, 4, 5]


def test_frame_buffer_counts_references():
    # TF-Agents' own FrameBuffer test, plus decompression.
    fb = replay_tf.FrameBuffer()
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, [84, 84, 1], dtype=np.uint8)
    fb.on_delete([fb.add_frame(a)])
    assert len(fb) == 0
    b = rng.integers(0, 256, [84, 84, 1], dtype=np.uint8)
    key_a = fb.add_frame(a)
    fb.on_delete([fb.add_frame(b)])
    assert len(fb) == 1 and (fb.decompress([key_a]) == a).all()
    stacked = np.concatenate([a, b, a], axis=-1)
    keys = fb.compress(stacked)
    assert keys.dtype == np.int64 and keys[0] == keys[2] == key_a and len(fb) == 2
    assert (fb.decompress(keys) == stacked).all()


def test_digest_collisions_keep_frames_apart(monkeypatch):
    # TF-Agents trusts hash(): two frames with one hash decode as the first. Force every digest equal.
    class _SameDigest:
        def __init__(self, *args, **kwargs):
            pass

        def digest(self):
            return b"\x00" * 8

    monkeypatch.setattr(py_hashed.hashlib, "blake2b", _SameDigest)
    fb = py_hashed.FrameBuffer()
    frames = [np.full([2, 1], v, np.uint8) for v in (1, 2, 3)]
    keys = [fb.add_frame(f) for f in frames]
    assert keys == [0, 1, 2] and fb.add_frame(frames[1]) == 1
    assert [fb.decompress([k]).ravel().tolist() for k in keys] == [[1, 1], [2, 2], [3, 3]]
    fb.on_delete([1])
    assert len(fb) == 3                                   # frame 2 still used once
    fb.on_delete([0])
    # Key 0 is free again: an equal frame may now be held twice (a missed deduplication, never a wrong frame).
    key = fb.add_frame(frames[2])
    assert (fb.decompress([key]) == frames[2]).all() and (fb.decompress([2]) == frames[2]).all()
    fb.on_delete([key])
    assert (fb.decompress([2]) == frames[2]).all()


def test_checkpoint_round_trip(tmp_path):
    rb = _make_buffer(4)
    for t in range(7):
        rb.add_batch(_traj(t))
    path = tf.train.Checkpoint(rb=rb).save(str(tmp_path / "ckpt"))
    restored = _make_buffer(4)
    tf.train.Checkpoint(rb=restored).restore(path).assert_consumed()
    assert len(restored.frame_buffer) == len(rb.frame_buffer) == 7       # items 3..6: frames 3..9 (9 is 0)
    expected = rb.gather_all()
    got = restored.gather_all()
    for e, g in zip(tf.nest.flatten(expected), tf.nest.flatten(got)):
        np.testing.assert_array_equal(e, g)
    restored.add_batch(_traj(7))              # reference counts came back: item 3 releases frame 3
    assert len(restored.frame_buffer) == 7
    assert restored.gather_all().action.tolist() == [[4, 5, 6, 7]]


def test_pickled_frame_buffer_is_refused():
    import pickle
    fb = replay_tf.FrameBuffer()
    with pytest.raises(ValueError, match="is a pickle .*not loaded"):
        fb.deserialize(pickle.dumps({1: (np.zeros([1]), 1)}))


def test_errors():
    with pytest.raises(ValueError, match="data_spec must be the spec of a trajectory"):
        replay_tf.PyHashedReplayBuffer(tf.TensorSpec([2, 4], tf.uint8), 4)
    with pytest.raises(ValueError, match=r"data_spec.observation must be one spec of rank >= 1"):
        replay_tf.PyHashedReplayBuffer(Trajectory(*([tf.TensorSpec([], tf.int32)] * 7)), 4)


@pytest.mark.peer
def test_module_names_match_tf_agents(peer):
    names = peer.run("""
import inspect
from tf_agents.replay_buffers import py_hashed_replay_buffer as m
emit("names", sorted(n for n, v in vars(m).items() if inspect.isclass(v) and v.__module__ == m.__name__))
""")["names"]
    assert names == ["FrameBuffer", "PyHashedReplayBuffer"]
    module = importlib.import_module("replay_tf.buffers.py_hashed")
    for name in names:
        assert getattr(module, name) is getattr(replay_tf, name)
