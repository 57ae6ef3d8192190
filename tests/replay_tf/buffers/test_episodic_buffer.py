"""EpisodicReplayBuffer and StatefulEpisodicReplayBuffer against TF-Agents 0.19's (peer venv).

The same adds (eagerly and inside tf.function) give the same episode ids, completions, stored steps,
`num_frames`, `num_writes`, `gather_all`, deterministic passes and errors; sampling is checked for its
distribution (episodes uniformly; windows by episode length) with hand-computed expectations.
"""
import collections
import importlib

import numpy as np
import pytest
import tensorflow as tf

import buffer_testlib
import replay_tf
from replay_tf.buffers import episodic

_SCENARIO = """
import numpy as np
import tensorflow as tf

def listed(x):
    if isinstance(x, dict):
        return {k: listed(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [listed(v) for v in x]
    return np.asarray(x).tolist()

def error(fn):
    try:
        fn()
    except Exception as e:
        return [type(e).__name__, str(e)]
    return "ok"

SPEC = {"a": tf.TensorSpec([], tf.int64), "b": tf.TensorSpec([2], tf.float32)}

def batch(values):
    v = np.array(values, np.int64)
    return {"a": tf.constant(v), "b": tf.constant(np.stack([v, -v], 1).astype(np.float32))}

for mode in ("eager", "function"):
    wrap = (lambda f: f) if mode == "eager" else tf.function
    # begin/end flags live in variables, so traced adds read the current ones (a vector pair for add_batch,
    # a scalar pair for add_sequence; `kind` is fixed while each function traces).
    flag_vars = {"batch": (tf.Variable([False, False]), tf.Variable([False, False])),
                 "seq": (tf.Variable(False), tf.Variable(False))}
    kind = ["batch"]
    def set_flags(which, begin, end):
        for var, value in zip(flag_vars[which], (begin, end)):
            var.assign(tf.broadcast_to(value, var.shape))
    rb = m.EpisodicReplayBuffer(SPEC, capacity=4, begin_episode_fn=lambda _: flag_vars[kind[0]][0].read_value(),
                                end_episode_fn=lambda _: flag_vars[kind[0]][1].read_value())
    add_batch_fn = wrap(lambda items, ids: rb.add_batch(items, ids))
    add_sequence_fn = wrap(lambda items, id_: rb.add_sequence(items, id_))
    def add_batch(items, ids):
        kind[0] = "batch"
        return add_batch_fn(items, ids)
    def add_sequence(items, id_):
        kind[0] = "seq"
        return add_sequence_fn(items, id_)
    out = {}
    ids = rb.create_episode_ids(2)
    # (begin, end, values): each add_batch adds one step to two episodes.
    schedule = [(False, False, [1, 10]),
                ([False, True], False, [2, 20]),      # episode 1 is left; 2 starts with 20
                (False, [True, False], [3, 30]),      # episode 0 completes
                ([True, True], False, [4, 40]),       # ids 3, 4: id 4 takes location 0 from episode 0
                ]
    returned = []
    for begin, end, values in schedule:
        set_flags("batch", begin, end)
        ids = add_batch(batch(values), ids)
        returned.append(listed(ids))
    out["ids"] = returned
    set_flags("batch", False, False)
    out["stale"] = listed(add_batch(batch([5, 50]), tf.constant([0, 1], tf.int64)))  # 0 is gone; 1 gets 50
    out["num_frames"] = int(rb.num_frames())
    out["num_writes"] = int(rb.num_writes.numpy())
    out["valid"] = listed(rb.get_valid_ids_mask(tf.constant([-1, 0, 1, 2, 3, 4, 5], tf.int64)))
    out["gather_all"] = listed(rb.gather_all())
    out["episodes"] = [listed(e) for e in rb.as_dataset(single_deterministic_pass=True)]
    # add_sequence: a new episode (id -1), then more steps for it, then a completed one.
    seq = {"a": np.array([7, 8, 9]), "b": np.ones([3, 2], np.float32)}
    id_ = add_sequence(seq, tf.constant(-1, tf.int64))
    id_ = add_sequence({"a": np.array([6]), "b": np.zeros([1, 2], np.float32)}, id_)
    set_flags("seq", True, True)
    id2 = add_sequence(seq, id_)
    out["sequence_ids"] = [int(id_), int(id2)]
    out["after_sequences"] = listed(rb.gather_all())
    out["episodes_after"] = [listed(e) for e in rb.as_dataset(single_deterministic_pass=True)]
    out["windows"] = [listed(e) for e in rb.as_dataset(num_steps=3, single_deterministic_pass=True)]
    out["frames_before_clear"] = int(rb.num_frames())
    rb.clear()
    out["cleared"] = [int(rb.num_frames()), int(rb.num_writes.numpy()), int(tf.size(rb.gather_all()["a"]))]
    add_batch(batch([11, 12]), tf.constant([int(id2), 4], tf.int64))   # ids stay valid: steps start again
    out["after_clear"] = listed(rb.gather_all())
    emit(mode, out)

# completed_only: gather_all keeps completed episodes; sampled datasets draw only them.
flags = {"begin": False, "end": False}
rb = m.EpisodicReplayBuffer(SPEC, capacity=5, completed_only=True, begin_episode_fn=lambda _: flags["begin"],
                            end_episode_fn=lambda _: flags["end"])
ids = rb.create_episode_ids(3)
for t, end in enumerate([False, [False, True, False], False, [True, False, False]]):
    flags["end"] = end
    ids = rb.add_batch(batch([t, 10 + t, 20 + t]), ids)
emit("completed_only", listed(rb.gather_all()))
emit("completed_only_sampled", sorted({int(e["a"][0]) for e, _ in rb.as_dataset().take(30)}))

# The deterministic passes of TF-Agents' own tests (3 or 6 episodes: [1, 10, 100], [2, 20, 200, 3, 30, 300],
# [-1, -10, -100]).
def three_episodes(repeat=1, **kwargs):
    flags = {"begin": True}
    rb = m.EpisodicReplayBuffer({"a": tf.TensorSpec([], tf.int32)}, capacity=10, begin_episode_fn=lambda _: flags["begin"],
                                end_episode_fn=lambda _: False, **kwargs)
    values = np.array([1.0, 10.0, 100.0])
    id_ = rb.create_episode_ids()
    for _ in range(repeat):
        flags["begin"] = True
        id_ = rb.add_sequence({"a": values}, id_)
        id_ = rb.add_sequence({"a": 2 * values}, id_)
        flags["begin"] = False
        id_ = rb.add_sequence({"a": 3 * values}, id_)
        flags["begin"] = True
        id_ = rb.add_sequence({"a": -values}, id_)
    return rb

def passes(rb, **kwargs):
    return [listed(e) for e in rb.as_dataset(single_deterministic_pass=True, **kwargs)]

emit("pass", passes(three_episodes()))
emit("pass_steps", passes(three_episodes(), num_steps=5))
emit("pass_steps_drop", passes(three_episodes(dataset_drop_remainder=True), num_steps=5))
emit("pass_steps_shift", passes(three_episodes(dataset_window_shift=2), num_steps=5))
emit("pass_batch", passes(three_episodes(repeat=2), num_steps=5, sample_batch_size=2))
emit("pass_batch_shift", passes(three_episodes(repeat=2, dataset_window_shift=1), num_steps=5, sample_batch_size=2))
emit("pass_batch_drop", passes(three_episodes(repeat=2, dataset_drop_remainder=True), num_steps=5, sample_batch_size=2))
emit("frames", int(three_episodes(repeat=2).num_frames()))

# Stateful wrapper, driven from a tf.function as a Driver observer would.
rb = m.EpisodicReplayBuffer(SPEC, capacity=3)
srb = m.StatefulEpisodicReplayBuffer(rb, num_episodes=2)
begin_var, end_var = tf.Variable([False, False]), tf.Variable([False, False])
rb._begin_episode_fn = lambda _: begin_var.read_value()     # (swapped after construction, as TF-Agents' tests do)
rb._end_episode_fn = lambda _: end_var.read_value()
observe = tf.function(lambda items: srb.add_batch(items))
stateful_ids = []
for t, (begin, end) in enumerate([([True, True], [False, False]), ([False, False], [True, False]),
                                   ([True, False], [False, True]), ([False, False], [False, False])]):
    begin_var.assign(begin)
    end_var.assign(end)
    stateful_ids.append(listed(observe(batch([t, 10 + t]))))
emit("stateful_ids", stateful_ids)
emit("stateful_var", listed(srb.episode_ids))
emit("stateful_gather", listed(rb.gather_all()))

# extract / extend_episodes: move two episodes into another buffer, through TensorLists.
def stack(tensor_lists, dtype, shape):
    return [listed(tf.raw_ops.TensorListStack(input_handle=l, element_shape=tf.constant(shape, tf.int32),
                                              element_dtype=dtype)) for l in tf.unstack(tensor_lists)]
source = m.EpisodicReplayBuffer(SPEC, capacity=3, begin_episode_fn=lambda _: True, end_episode_fn=lambda t: t["a"][-1] > 20)
id_ = source.create_episode_ids()
for values in ([1, 2], [11, 12, 13], [21]):
    id_ = source.add_sequence(batch(values), id_)
episodes = source.extract([2, 0], clear_data=True)
emit("extracted", [listed(episodes.length), listed(episodes.completed), stack(episodes.tensor_lists["a"], tf.int64, []),
                   stack(episodes.tensor_lists["b"], tf.float32, [2])])
emit("after_extract", [listed(source.gather_all()), int(source.num_frames())])
target = m.EpisodicReplayBuffer(SPEC, capacity=4, begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
ids = target.create_episode_ids(3)
ids = target.add_batch(batch([5, 6, 7]), ids)
ids = target.extend_episodes(ids, [2, 0], episodes)
target._begin_episode_fn = lambda _: [True, False]
ids = target.extend_episodes(ids, [1, 2], episodes)
emit("extended_ids", listed(ids))
emit("extended", [listed(target.gather_all()), listed(target._episode_completed), int(target.num_frames())])
emit("completed_ids", listed(target._completed_episodes()))

# Errors.
rb = m.EpisodicReplayBuffer(SPEC, capacity=2, begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
emit("err_get_next_empty", error(lambda: rb.get_next()))
emit("err_dataset_empty", error(lambda: next(iter(rb.as_dataset()))))
emit("err_batch_no_steps", error(lambda: rb.as_dataset(sample_batch_size=2)))
emit("err_pass_batch_no_steps", error(lambda: rb.as_dataset(sample_batch_size=2, single_deterministic_pass=True)))
emit("err_add_batch_no_ids", error(lambda: rb.add_batch(batch([1, 2]))))
emit("err_too_many_ids", error(lambda: rb.create_episode_ids(3)))
emit("err_preprocess", error(lambda: rb.as_dataset(num_steps=2, sequence_preprocess_fn=lambda x: x)))
emit("err_seq_vector_begin", error(lambda: m.EpisodicReplayBuffer(SPEC, capacity=2, begin_episode_fn=lambda t: t["a"] > 0,
     end_episode_fn=lambda _: False).add_sequence(batch([1, 2]), tf.constant(-1, tf.int64))))
emit("err_default_fns", error(lambda: m.EpisodicReplayBuffer(SPEC, capacity=2).add_batch(batch([1, 2]),
                                                                                       tf.constant([-1, -1], tf.int64))))
emit("err_not_callable", error(lambda: m.EpisodicReplayBuffer(SPEC, begin_episode_fn=3)))
emit("stateful_type", error(lambda: m.StatefulEpisodicReplayBuffer(object()))[0])
emit("err_stateful_capacity", error(lambda: m.StatefulEpisodicReplayBuffer(rb, num_episodes=3)))
emit("empty_gather", listed(tf.nest.map_structure(lambda t: t.shape.as_list(), rb.gather_all())))
"""

_PEER = """
from tf_agents.replay_buffers import episodic_replay_buffer as m
""" + _SCENARIO


def _run_local() -> dict:
    return buffer_testlib.run_scenario(_SCENARIO, m=episodic)


@pytest.fixture(scope="module")
def local():
    return _run_local()


@pytest.mark.peer
def test_matches_tf_agents(peer, local):
    expected = peer.run(_PEER)
    # Deliberate difference (module docstring): a wrapped object that is not an EpisodicReplayBuffer is a TypeError (TF-Agents reads its
    # data_spec first and fails with AttributeError).
    assert (expected.pop("stateful_type"), local.pop("stateful_type")) == ("AttributeError", "TypeError")
    assert local.keys() == expected.keys()
    for key in expected:
        if key.startswith("err_") and expected[key] != "ok":
            # Same exception type; TF-Agents' text is part of ours (an InvalidArgumentError's text carries
            # the op's details after it).
            assert local[key][0] == expected[key][0], (key, local[key], expected[key])
            first_line = expected[key][1].split("\n")[0].split("[[")[0].strip()
            assert _normalized(first_line)[:60] in _normalized(local[key][1]), (key, local[key], expected[key])
        else:
            assert local[key] == expected[key], (key, local[key], expected[key])


def _normalized(text: str) -> str:
    return " ".join(text.replace("\n", " ").split())


def test_local_values(local):
    # (compared with TF-Agents above; hand-computed values keep it meaningful without the peer)
    for mode in ("eager", "function"):
        out = local[mode]
        assert out["ids"] == [[0, 1], [0, 2], [0, 2], [3, 4]]
        assert out["stale"] == [0, 1]
        # Held: loc 0 = id 4 [40], loc 1 = id 1 [10, 50], loc 2 = id 2 [20, 30], loc 3 = id 3 [4].
        assert out["gather_all"]["a"] == [[10, 50, 20, 30, 4, 40]]
        assert out["gather_all"]["b"][0][1] == [50.0, -50.0]
        assert out["valid"] == [False, False, True, True, True, True, False]
        assert out["num_frames"] == 6 and out["num_writes"] == 5
        assert out["sequence_ids"] == [5, 6]            # id 5 takes location 1, id 6 location 2
        assert out["episodes_after"] == [{"a": [4], "b": [[4.0, -4.0]]},
                                         {"a": [40], "b": [[40.0, -40.0]]},
                                         {"a": [7, 8, 9, 6], "b": [[1.0, 1.0]] * 3 + [[0.0, 0.0]]},
                                         {"a": [7, 8, 9], "b": [[1.0, 1.0]] * 3}]
        assert [w["a"] for w in out["windows"]] == [[4, 40, 7], [8, 9, 6], [7, 8, 9]]
        assert out["cleared"] == [0, 0, 0]
        assert out["after_clear"]["a"] == [[12, 11]]    # id 4 (loc 0) before id 6 (loc 2)
    assert local["completed_only"]["a"] == [[0, 1, 2, 3, 10, 11, 12, 13]]   # episodes 0 and 1 completed
    assert local["completed_only_sampled"] == [0, 10]
    assert local["pass"] == [{"a": [1, 10, 100]}, {"a": [2, 20, 200, 3, 30, 300]}, {"a": [-1, -10, -100]}]
    assert local["pass_steps"] == [{"a": [1, 10, 100, 2, 20]}, {"a": [200, 3, 30, 300, -1]}, {"a": [-10, -100]}]
    assert local["pass_steps_drop"] == local["pass_steps"][:2]
    assert local["stateful_ids"] == [[0, 1], [0, 1], [2, 1], [2, 1]]
    # Source episodes at locations 2 ([21], completed: it ends > 20) and 0 ([1, 2]).
    assert local["extracted"] == [[1, 2], [1, 0], [[21], [1, 2]], [[[21.0, -21.0]], [[1.0, -1.0], [2.0, -2.0]]]]
    assert local["after_extract"][1] == 3                   # only [11, 12, 13] left
    # Target episodes 0, 1, 2 hold [5], [6], [7]; then id 2 gets [21] and id 0 gets [1, 2]; then row 1 ([21])
    # starts id 3 (begin; location 3, so id 1 stays) and row 2 ([1, 2]) goes to id 2.
    assert local["extended_ids"] == [0, 3, 2]
    assert local["extended"][0]["a"] == [[5, 1, 2, 6, 7, 21, 1, 2, 21]]
    assert local["extended"][2] == 9
    assert local["empty_gather"] == {"a": [0], "b": [0, 2]}   # (TF-Agents' shape for no steps)
    assert local["frames"] == 24


def test_sampling_distributions():
    # Episodes of lengths 1, 2, 3, 6 (ids 0..3): whole episodes uniformly; windows of 2 steps from episodes
    # by length (the length-1 one never, as it is too short), their starts uniformly.
    rb = replay_tf.EpisodicReplayBuffer({"a": tf.TensorSpec([], tf.int32)}, capacity=4, seed=7,
                                        begin_episode_fn=lambda _: True, end_episode_fn=lambda _: False)
    id_ = rb.create_episode_ids()
    for length in (1, 2, 3, 6):
        id_ = rb.add_sequence({"a": np.arange(length) + 10 * length}, id_)
    n = 4000
    episodes = collections.Counter()
    for data, episode_id in rb.as_dataset().take(n):
        length = int(data["a"].shape[0])
        assert int(episode_id) == {1: 0, 2: 1, 3: 2, 6: 3}[length]
        episodes[length] += 1
    _assert_frequencies(episodes, {1: 0.25, 2: 0.25, 3: 0.25, 6: 0.25}, n)
    starts = collections.Counter()
    for data, ids in rb.as_dataset(sample_batch_size=50, num_steps=2).take(n // 50):
        assert data["a"].shape == (50, 2)
        a = data["a"].numpy()
        assert (a[:, 1] == a[:, 0] + 1).all()
        starts.update(a[:, 0].tolist())
    # Draw probability of episode of length L is L / 12; it yields a window only if L >= 2 (so over the
    # windows kept: L / 11), starting uniformly at one of L - 1 places.
    expected = {10 * L + s: (L / 11) / (L - 1) for L in (2, 3, 6) for s in range(L - 1)}
    _assert_frequencies(starts, expected, n)


def _assert_frequencies(counts, probabilities, n):
    assert set(counts) <= set(probabilities)
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in probabilities.items())
    # 99.9% quantile of chi-square with up to 10 degrees of freedom is 29.6.
    assert chi2 < 29.6, (counts, probabilities)


def test_sampled_windows_in_tf_function_and_get_next():
    rb = replay_tf.EpisodicReplayBuffer({"a": tf.TensorSpec([], tf.int64)}, capacity=2,
                                        begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
    ids = tf.Variable(rb.create_episode_ids(2))

    @tf.function
    def collect(t):
        ids.assign(rb.add_batch({"a": tf.stack([t, 100 + t])}, ids))

    for t in range(5):
        collect(tf.constant(t, tf.int64))
    data, info = tf.function(rb.get_next)()
    assert data["a"].numpy().tolist() in ([0, 1, 2, 3, 4], [100, 101, 102, 103, 104])
    assert int(info.ids) == (0 if data["a"][0] == 0 else 1)
    iterator = iter(rb.as_dataset(sample_batch_size=3, num_steps=4))
    windows, window_ids = tf.function(lambda: next(iterator))()
    a = windows["a"].numpy()
    assert a.shape == (3, 4) and ((a[:, 1:] - a[:, :-1]) == 1).all()
    assert (window_ids.numpy() == (a[:, 0] >= 100)).all()


def test_storage_grows_with_the_longest_episode():
    rb = replay_tf.EpisodicReplayBuffer({"x": tf.TensorSpec([2], tf.float32)}, capacity=3,
                                        begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
    id_ = rb.create_episode_ids()
    for n in (1, 2, 5):
        id_ = rb.add_sequence({"x": np.ones([n, 2], np.float32) * n}, id_)
    # One episode of 1, 3, then 8 steps: the width goes 0 -> 1 -> 3 (max(3, 2 * 1)) -> 8 (max(8, 2 * 3)).
    assert int(rb._data_table.width()) == 8
    assert rb.gather_all()["x"][0, :, 0].numpy().tolist() == [1, 2, 2, 5, 5, 5, 5, 5]


def test_checkpoint_round_trip(tmp_path):
    def make():
        return replay_tf.EpisodicReplayBuffer({"a": tf.TensorSpec([], tf.int64)}, capacity=3,
                                              begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
    rb = make()
    ids = rb.create_episode_ids(2)
    for t in range(3):
        ids = rb.add_batch({"a": tf.constant([t, 10 + t], tf.int64)}, ids)
    path = tf.train.Checkpoint(rb=rb).save(str(tmp_path / "ckpt"))
    restored = make()
    tf.train.Checkpoint(rb=restored).restore(path).assert_consumed()
    assert restored.gather_all()["a"].numpy().tolist() == [[0, 1, 2, 10, 11, 12]]
    assert restored.add_batch({"a": tf.constant([3, 13], tf.int64)}, ids).numpy().tolist() == [0, 1]
    assert int(restored.num_frames()) == 8


@pytest.mark.peer
def test_module_names_match_tf_agents(peer):
    names = peer.run("""
import inspect
from tf_agents.replay_buffers import episodic_replay_buffer as m
emit("names", sorted(n for n, v in vars(m).items() if inspect.isclass(v) and v.__module__ == m.__name__))
""")["names"]
    module = importlib.import_module("replay_tf.buffers.episodic")
    assert names == ["BufferInfo", "Episodes", "EpisodicReplayBuffer", "StatefulEpisodicReplayBuffer"]
    for name in ("EpisodicReplayBuffer", "StatefulEpisodicReplayBuffer"):
        assert getattr(module, name) is getattr(replay_tf, name)
    assert module.BufferInfo._fields == ("ids",)
    assert module.Episodes._fields == ("length", "completed", "tensor_lists")


def test_tf1_graph_mode():
    # Ops built once in a TF1 graph and run through a Session, as TF-Agents' TF1 users do.
    with tf.Graph().as_default():
        rb = replay_tf.EpisodicReplayBuffer({"a": tf.TensorSpec([], tf.int64)}, capacity=3,
                                            begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
        ids_in = tf.compat.v1.placeholder(tf.int64, [2])
        new_ids = rb.add_batch({"a": tf.constant([1, 2], tf.int64)}, ids_in)
        sequence_id = rb.add_sequence({"a": tf.constant([7, 8, 9], tf.int64)}, tf.constant(-1, tf.int64))
        gather, frames = rb.gather_all(), rb.num_frames()
        iterator = tf.compat.v1.data.make_initializable_iterator(rb.as_dataset(num_steps=2, sample_batch_size=2))
        windows = iterator.get_next()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            ids = session.run(new_ids, {ids_in: [-1, -1]})
            ids = session.run(new_ids, {ids_in: ids})
            assert ids.tolist() == [0, 1] and int(session.run(sequence_id)) == 2
            assert session.run(gather)["a"].tolist() == [[1, 1, 2, 2, 7, 8, 9]] and session.run(frames) == 7
            session.run(iterator.initializer)
            data, window_ids = session.run(windows)
            for row, episode_id in zip(data["a"].tolist(), window_ids.tolist()):
                assert row in ([1, 1], [2, 2], [7, 8], [8, 9]) and episode_id == {1: 0, 2: 1}.get(row[0], 2)


def test_add_batch_rows_must_match_ids():
    rb = replay_tf.EpisodicReplayBuffer({"a": tf.TensorSpec([], tf.int64)}, capacity=3,
                                        begin_episode_fn=lambda _: False, end_episode_fn=lambda _: False)
    with pytest.raises(ValueError, match=r"outer dimension of 3 but episode_ids holds 2 ids"):
        rb.add_batch({"a": tf.constant([1, 2, 3], tf.int64)}, rb.create_episode_ids(2))
    with pytest.raises(TypeError, match=r"items\['a'\]: expected dtype int64, got float32"):
        rb.add_batch({"a": tf.constant([1.0, 2.0])}, rb.create_episode_ids(2))
