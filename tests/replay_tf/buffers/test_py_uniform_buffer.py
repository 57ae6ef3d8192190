"""PyUniformReplayBuffer against TF-Agents 0.19's (peer venv): the same adds and seeded reads give the same
items; and what differs on purpose (errors, gather_all)."""
import numpy as np
import pytest
import tensorflow as tf
import tree

import buffer_testlib
import replay_tf

_SCENARIO = """
import numpy as np, tree
def listed(x):  # (plain lists and dicts: TF-Agents' buffer wraps its spec's dicts as a tf.Module does)
    if hasattr(x, "items"):
        return {k: listed(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [listed(v) for v in x]
    return np.asarray(x).tolist()
def spec_of(dataset):
    return listed(tree.map_structure(lambda s: [str(s.shape), s.dtype.name], dataset.element_spec))
def step(i):
    return (np.full([1, 2], i / 2, np.float32), {"b": np.array([i], np.int64)})
rb = make_buffer(5)
for i in range(3):
    rb.add_batch(step(i))
emit("size3", int(rb.size))
np.random.seed(0)
emit("single", [listed(rb.get_next()) for _ in range(3)])
emit("batch", listed(rb.get_next(4)))
emit("batch_steps", listed(rb.get_next(4, num_steps=2)))
emit("steps_unstacked", listed(rb.get_next(num_steps=3, time_stacked=False)))
for i in range(3, 8):  # wraps: items 3..7 are held, the ring's start has moved
    rb.add_batch(step(i))
emit("size_full", int(rb.size))
np.random.seed(1)
emit("full_batch_steps", listed(rb.get_next(3, num_steps=4)))
np.random.seed(2)
dataset = rb.as_dataset(sample_batch_size=2, num_steps=2)
emit("dataset_spec", spec_of(dataset))
emit("dataset", [listed(tree.map_structure(lambda t: t.numpy(), e)) for e in dataset.take(3)])
emit("unbatched_spec", spec_of(rb.as_dataset()))
rb.clear()
emit("cleared", int(rb.size))
rb.add_batch(step(9))
emit("after_clear", listed(rb.get_next()))
"""

_PEER = """
from tf_agents.replay_buffers import py_uniform_replay_buffer
from tf_agents.specs import array_spec
import numpy as np
def make_buffer(capacity):
    spec = (array_spec.ArraySpec([2], np.float32), {"b": array_spec.ArraySpec([], np.int64)})
    return py_uniform_replay_buffer.PyUniformReplayBuffer(spec, capacity)
""" + _SCENARIO


def _make_buffer(capacity):
    spec = (tf.TensorSpec([2], tf.float32), {"b": tf.TensorSpec([], tf.int64)})
    return replay_tf.PyUniformReplayBuffer(spec, capacity)


def _run_local() -> dict:
    return buffer_testlib.run_scenario(_SCENARIO, make_buffer=_make_buffer)


test_matches_tf_agents = buffer_testlib.matches_tf_agents_test(_PEER, _run_local)


def test_local_scenario_values():
    # (compared with TF-Agents above; hand-checked values keep it meaningful without the peer)
    out = _run_local()
    assert (out["size3"], out["size_full"], out["cleared"]) == (3, 5, 0)
    for steps in out["full_batch_steps"][1]["b"]:  # 4 consecutive items of the 5 held (3..7), oldest first
        assert steps == list(range(steps[0], steps[0] + 4)) and 3 <= steps[0] <= 4
    assert out["after_clear"] == [[4.5, 4.5], {"b": 9}]
    assert out["dataset_spec"] == [["(2, 2, 2)", "float32"], {"b": ["(2, 2)", "int64"]}]


def test_gather_all_is_the_items_held_oldest_first():
    # TF-Agents returns every slot in storage order, zeros where nothing was written.
    rb = _make_buffer(4)
    assert tree.map_structure(np.shape, rb.gather_all()) == ((1, 0, 2), {"b": (1, 0)})
    for i in range(6):
        rb.add_batch((np.full([1, 2], i, np.float32), {"b": np.array([i])}))
    data = rb.gather_all()
    assert data[1]["b"].tolist() == [[2, 3, 4, 5]]
    assert data[0].tolist() == [[[2, 2], [3, 3], [4, 4], [5, 5]]]
    assert int(rb.num_frames()) == 4


def test_errors_name_what_is_wrong():
    rb = _make_buffer(3)
    with pytest.raises(ValueError, match=r"holds 0 items: sampling needs at least 1"):
        rb.get_next()
    rb.add_batch((np.zeros([1, 2], np.float32), {"b": np.array([1])}))
    with pytest.raises(ValueError, match=r"holds 1 items: sampling needs at least 2 \(num_steps=2\)"):
        rb.get_next(num_steps=2)
    with pytest.raises(NotImplementedError, match="only supports a batch size of 1.*\\[2\\]"):
        rb.add_batch((np.zeros([2, 2], np.float32), {"b": np.array([1, 2])}))
    with pytest.raises(ValueError, match=r"items\[0\] has shape \[1, 3\], expected \[1, 2\]"):
        rb.add_batch((np.zeros([1, 3], np.float32), {"b": np.array([1])}))
    with pytest.raises(ValueError, match=r"items\[1\]\['b'\] has dtype float64.*int64.*truncated"):
        rb.add_batch((np.zeros([1, 2], np.float32), {"b": np.array([1.5])}))
    with pytest.raises(TypeError, match="structure mismatch"):
        rb.add_batch((np.zeros([1, 2], np.float32),))
    with pytest.raises(ValueError, match="fully defined"):
        replay_tf.PyUniformReplayBuffer(tf.TensorSpec([None], tf.float32), 3)
    with pytest.raises(NotImplementedError, match="single_deterministic_pass"):
        rb.as_dataset(single_deterministic_pass=True)


def test_integers_and_bools_are_stored_when_their_values_fit():
    # Default-int64 arrays into uint8 or bool storage are common (images, flags): kept when the values fit.
    rb = replay_tf.PyUniformReplayBuffer({"image": tf.TensorSpec([2], tf.uint8), "done": tf.TensorSpec([], tf.bool),
                                          "x": tf.TensorSpec([], tf.float32)}, 4)
    rb.add_batch({"image": np.array([[0, 255]]), "done": np.array([1]), "x": np.array([0.5])})
    rb.add_batch({"image": np.array([[7, 8]]), "done": np.array([False]), "x": np.array([2])})
    data = rb.gather_all()
    assert data["image"].dtype == np.uint8 and data["image"].tolist() == [[[0, 255], [7, 8]]]
    assert data["done"].tolist() == [[True, False]] and data["x"].tolist() == [[0.5, 2.0]]
    with pytest.raises(ValueError, match=r"items\['image'\] has values in \[0, 300\], outside the spec's uint8 "
                                         r"range \[0, 255\]"):
        rb.add_batch({"image": np.array([[0, 300]]), "done": np.array([0]), "x": np.array([0.0])})
    assert int(rb.size) == 2


def _step(i):
    return (np.full([1, 2], i / 2, np.float32), {"b": np.array([i], np.int64)})


def test_checkpoint_round_trip(tmp_path):
    rb = _make_buffer(4)
    for i in range(6):                                   # wraps: items 2..5 held, ring start at row 2
        rb.add_batch(_step(i))
    path = tf.train.Checkpoint(rb=rb).save(str(tmp_path / "ckpt"))
    rb.add_batch(_step(9))                               # changed after saving: the restore undoes it
    restored = _make_buffer(4)
    tf.train.Checkpoint(rb=restored).restore(path).assert_consumed()
    rb.clear()
    tf.train.Checkpoint(rb=rb).restore(path)
    for buffer in (restored, rb):
        assert int(buffer.size) == 4
        assert buffer.gather_all()[1]["b"].tolist() == [[2, 3, 4, 5]]
        buffer.add_batch(_step(6))                       # the ring position came back too: 2 is overwritten
        assert buffer.gather_all()[1]["b"].tolist() == [[3, 4, 5, 6]]
    wrong = replay_tf.PyUniformReplayBuffer((tf.TensorSpec([2], tf.float32), {"b": tf.TensorSpec([], tf.int64)}), 5)
    with pytest.raises(ValueError, match=r"_storage/_np_state/buffer0 has shape \[4, 2\].*stores \[5, 2\]"):
        tf.train.Checkpoint(rb=wrong).restore(path)


_CHECKPOINT_PEER = """
import os
import numpy as np, tensorflow as tf
from tf_agents.replay_buffers import py_uniform_replay_buffer
from tf_agents.specs import array_spec
def make_buffer(capacity):
    spec = (array_spec.ArraySpec([2], np.float32), {"b": array_spec.ArraySpec([], np.int64)})
    return py_uniform_replay_buffer.PyUniformReplayBuffer(spec, capacity)
# Restore the checkpoint we wrote and sample it with a seed.
rb = make_buffer(4)
tf.train.Checkpoint(rb=rb).restore(INPUTS["ours"]).assert_consumed()
emit("size", int(rb.size))
np.random.seed(3)
emit("sampled", rb.get_next(6, num_steps=2)[1]["b"].tolist())
# Write one for us: 3 items, never wrapped (storage rows 3 untouched).
rb = make_buffer(4)
for i in range(3):
    rb.add_batch((np.full([1, 2], i, np.float32), {"b": np.array([10 + i])}))
emit("path", tf.train.Checkpoint(rb=rb).save(os.path.join(INPUTS["dir"], "theirs")))
"""


@pytest.mark.peer
def test_checkpoints_move_between_tf_agents_and_here(peer, tmp_path):
    rb = _make_buffer(4)
    for i in range(6):
        rb.add_batch(_step(i))
    ours = tf.train.Checkpoint(rb=rb).save(str(tmp_path / "ours"))
    out = peer.run(_CHECKPOINT_PEER, {"ours": ours, "dir": str(tmp_path)})
    assert out["size"] == 4
    np.random.seed(3)                                    # same numpy draws as TF-Agents: same windows
    assert rb.get_next(6, num_steps=2)[1]["b"].tolist() == out["sampled"]
    theirs = _make_buffer(4)
    tf.train.Checkpoint(rb=theirs).restore(out["path"]).assert_consumed()
    assert int(theirs.size) == 3
    assert theirs.gather_all()[1]["b"].tolist() == [[10, 11, 12]]
    assert theirs.gather_all()[0][0, :, 0].tolist() == [0.0, 1.0, 2.0]
