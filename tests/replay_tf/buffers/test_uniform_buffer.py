"""UniformReplayBuffer: differential tests against tf-agents 0.19, the seed notebook, graph/XLA, bad input."""
import collections
import concurrent.futures

import numpy as np
import pytest
import tensorflow as tf

import replay_tf
from replay_tf.buffers import uniform

from buffer_testlib import adding_in_background

# One driver, run against tf-agents 0.19 in the peer venv (RB = its TFUniformReplayBuffer) and against
# replay_tf here; both record the same named outputs through `emit`. Every stored value encodes where it
# was written: value = 100 * step + segment, vec = [value, -value].
DRIVER = r'''
import numpy as np
import tensorflow as tf

# (batch_size, max_length, number of add_batch calls): before, at and after wrapping, batch_size 1 and > 1.
SCENARIOS = [(1, 5, 3), (3, 5, 12), (2, 4, 4), (2, 3, 7), (3, 4, 9), (1, 4, 10), (2, 5, 2)]
DETERMINISTIC_SCENARIOS = (1, 6)  # wrapped with batch_size 3; not wrapped with batch_size 2
SPEC = (tf.TensorSpec([], tf.int64, "value"), {"vec": tf.TensorSpec([2], tf.float32, "vec")})


def _filled(RB, batch_size, max_length, adds, **kwargs):
    rb = RB(SPEC, batch_size=batch_size, max_length=max_length, **kwargs)
    for step in range(adds):
        v = np.arange(batch_size, dtype=np.int64) + 100 * step
        rb.add_batch((tf.constant(v), {"vec": tf.constant(np.stack([v, -v], 1).astype(np.float32))}))
    return rb


def _values(data):
    return np.asarray(data[0]).tolist()


def _check_vec(data):
    value, vec = np.asarray(data[0]), np.asarray(data[1]["vec"])
    assert (vec[..., 0] == value).all() and (vec[..., 1] == -value).all(), (value, vec)


def run_all(RB, emit):
    for k, (batch_size, max_length, adds) in enumerate(SCENARIOS):
        rb = _filled(RB, batch_size, max_length, adds)
        emit(f"{k}/num_frames", int(rb.num_frames()))
        emit(f"{k}/capacity", int(rb.capacity))
        everything = rb.gather_all()
        _check_vec(everything)
        emit(f"{k}/gather_all", _values(everything))
        for shift in (None, 1) if k in DETERMINISTIC_SCENARIOS else ():
            for drop in (False, True):
                det = _filled(RB, batch_size, max_length, adds, dataset_window_shift=shift,
                              dataset_drop_remainder=drop)
                for sbs, num_steps in [(None, None), (None, 2), (2, None), (2, 2), (batch_size + 1, None)]:
                    if True:
                        name = f"{k}/det/shift={shift}/drop={drop}/sbs={sbs}/T={num_steps}"
                        try:
                            ds = det.as_dataset(sample_batch_size=sbs, num_steps=num_steps,
                                                single_deterministic_pass=True)
                            elements = [(_values(d), np.asarray(info.ids).tolist()) for d, info in ds]
                        except Exception as e:  # recorded, compared by type
                            elements = f"error:{type(e).__name__}"
                        emit(name, elements)
        for num_steps in (None, 2, 3):
            name = f"{k}/random/T={num_steps}"
            tf.random.set_seed(k)
            try:
                data, info = rb.get_next(sample_batch_size=3000, num_steps=num_steps)
                _check_vec(data)
                values = np.asarray(data[0]).reshape(3000, -1)
                ids = np.asarray(info.ids).reshape(3000, -1)
                emit(name + "/windows", sorted(set(map(tuple, values.tolist()))))
                emit(name + "/ids", sorted(set(map(tuple, ids.tolist()))))
                emit(name + "/probabilities", sorted(set(np.asarray(info.probabilities).round(6).tolist())))
                if num_steps != 2:  # the other modes once per scenario (each traces new functions)
                    continue
                single, single_info = rb.get_next(num_steps=num_steps)
                emit(name + "/single_shape", list(np.asarray(single[0]).shape))
                unstacked, unstacked_info = rb.get_next(sample_batch_size=4, num_steps=num_steps,
                                                        time_stacked=False)
                emit(name + "/unstacked_shapes", [list(np.shape(t)) for t in tf.nest.flatten(unstacked)])
                ds = rb.as_dataset(num_steps=num_steps).take(200)
                emit(name + "/dataset_windows",
                     sorted(set(tuple(np.asarray(d[0]).reshape(-1).tolist()) for d, _ in ds)))
                ds = rb.as_dataset(sample_batch_size=5, num_steps=num_steps, num_parallel_calls=2).take(3)
                emit(name + "/dataset_shapes", [list(np.asarray(d[0]).shape) for d, _ in ds])
            except Exception as e:
                emit(name + "/error", type(e).__name__)
'''


def _run_driver(rb_class):
    namespace, out = {}, {}
    exec(compile(DRIVER, "DRIVER", "exec"), namespace)
    namespace["run_all"](rb_class, lambda name, value: out.__setitem__(name, value))
    return out, namespace["SCENARIOS"]


@pytest.fixture(scope="module")
def both_outputs(peer):
    """(peer outputs, (our outputs, scenarios)); the peer process runs while we compute ours."""
    code = DRIVER + (
        "\nfrom tf_agents.replay_buffers.tf_uniform_replay_buffer import TFUniformReplayBuffer\n"
        "run_all(TFUniformReplayBuffer, emit)\n")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        theirs = pool.submit(peer.run, code)
        ours = _run_driver(replay_tf.UniformReplayBuffer)
        return theirs.result(), ours


def _as_lists(value):
    """JSON round trip turns tuples into lists; do the same to ours."""
    if isinstance(value, (list, tuple)):
        return [_as_lists(v) for v in value]
    return value


@pytest.mark.peer
def test_same_outputs_as_tf_agents(both_outputs):
    peer_outputs, (ours, scenarios) = both_outputs
    assert sorted(ours) == sorted(peer_outputs)
    for name, theirs in peer_outputs.items():
        mine = _as_lists(ours[name])
        k = int(name.split("/")[0])
        batch_size, max_length, adds = scenarios[k]
        wrapped = adds > max_length
        if "/det/" in name and wrapped and batch_size > 1 and isinstance(theirs, list):
            # TF-Agents 0.19 reads row `id % capacity` in the deterministic pass, which after the ring
            # wraps belongs to another segment; ids (and order) must match, data must be the data of each
            # id: id = segment * max_length + logical step, value = 100 * step + segment.
            assert [ids for _, ids in mine] == [ids for _, ids in theirs], name
            oldest = adds - max_length
            for values, ids in mine:
                ids = np.asarray(ids)
                segment = (ids - oldest) // max_length
                np.testing.assert_array_equal(values, 100 * (ids - segment * max_length) + segment, name)
            assert any(m != t for m, t in zip(mine, theirs)), f"{name}: TF-Agents' wrap bug did not show"
            continue
        assert mine == theirs, f"{name}: ours {mine} != tf-agents {theirs}"


# ----- the seed notebook (004), with only the import changed -----
SEED_004 = '''
import tensorflow as tf
import numpy as np

from replay_tf import buffers as tf_uniform_replay_buffer   # was: from tf_agents.replay_buffers import ...

data_spec =  (
        tf.TensorSpec([3], tf.float32, 'action'),
        (
            tf.TensorSpec([5], tf.float32, 'lidar'),
            tf.TensorSpec([3, 2], tf.float32, 'camera')
        )
)

batch_size = 32
max_length = 1000

replay_buffer = tf_uniform_replay_buffer.TFUniformReplayBuffer(
    data_spec,
    batch_size=batch_size,
    max_length=max_length)

action = tf.constant(1 * np.ones(
    data_spec[0].shape.as_list(), dtype=np.float32))
lidar = tf.constant(
    2 * np.ones(data_spec[1][0].shape.as_list(), dtype=np.float32))
camera = tf.constant(
    3 * np.ones(data_spec[1][1].shape.as_list(), dtype=np.float32))

values = (action, (lidar, camera))
values_batched = tf.nest.map_structure(lambda t: tf.stack([t] * batch_size),
                                       values)

replay_buffer.add_batch(values_batched)

for _ in range(5):
  replay_buffer.add_batch(values_batched)
sample = replay_buffer.get_next(sample_batch_size=10, num_steps=1)

print(len(sample))

# Convert the replay buffer to a tf.data.Dataset and iterate through it
dataset = replay_buffer.as_dataset(
    sample_batch_size=4,
    num_steps=2)

iterator = iter(dataset)
print("Iterator trajectories:")
trajectories = []
for _ in range(3):
  t, _ = next(iterator)
  trajectories.append(t)

print(tf.nest.map_structure(lambda t: t.shape, trajectories))

# Read all elements in the replay buffer:
trajectories = replay_buffer.gather_all()

print("Trajectories from gather all:")
print(tf.nest.map_structure(lambda t: t.shape, trajectories))
'''


def test_seed_notebook_004_runs_with_only_the_import_changed(capsys):
    exec(compile(SEED_004, "seed_004", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2"
    assert lines[2] == ("[(TensorShape([4, 2, 3]), (TensorShape([4, 2, 5]), TensorShape([4, 2, 3, 2]))), "
                        "(TensorShape([4, 2, 3]), (TensorShape([4, 2, 5]), TensorShape([4, 2, 3, 2]))), "
                        "(TensorShape([4, 2, 3]), (TensorShape([4, 2, 5]), TensorShape([4, 2, 3, 2])))]")
    assert lines[4] == "(TensorShape([32, 6, 3]), (TensorShape([32, 6, 5]), TensorShape([32, 6, 3, 2])))"


# ----- graph mode, XLA, training loop -----
SPEC = {"step": tf.TensorSpec([], tf.int64), "obs": tf.TensorSpec([2], tf.float32)}


def _items(step, batch_size):
    step = tf.cast(step, tf.int64)
    segment = tf.range(batch_size, dtype=tf.int64)
    value = step * 100 + segment
    return {"step": value, "obs": tf.stack([tf.cast(value, tf.float32), -tf.cast(value, tf.float32)], 1)}


def _assert_consistent_windows(data, ids, batch_size):
    """Every window: consecutive steps of one segment; ids are the steps; obs matches."""
    value = np.asarray(data["step"]).reshape(len(np.asarray(data["step"])), -1)
    steps, segments = value // 100, value % 100
    assert (segments == segments[:, :1]).all() and (segments < batch_size).all()
    assert (np.diff(steps, axis=1) == 1).all()
    np.testing.assert_array_equal(steps, np.asarray(ids).reshape(steps.shape))
    np.testing.assert_array_equal(np.asarray(data["obs"])[..., 0].reshape(value.shape), value)


def _autograph_converts_loops() -> bool:
    """TF 2.21's AutoGraph cannot convert any function on Python 3.13.0 (its AST annotations break there)."""
    @tf.function
    def count(n):
        total = tf.constant(0)
        for i in tf.range(n):
            total += i
        return total
    try:
        return int(count(tf.constant(3))) == 3
    except Exception:  # noqa: BLE001  (OperatorNotAllowedInGraphError when the loop stays Python)
        return False


@pytest.mark.skipif(not _autograph_converts_loops(),
                    reason="this TF/Python pair's AutoGraph cannot convert `for _ in tf.range(n)` (TF 2.21 on "
                           "Python 3.13.0); the buffers themselves do not use AutoGraph")
def test_tf_agents_style_training_loop_inside_tf_function():
    rb = replay_tf.TFUniformReplayBuffer(SPEC, batch_size=4, max_length=20)
    counter = tf.Variable(-1, dtype=tf.int64)  # assign_add(1) yields the logical step id

    @tf.function
    def collect(num_steps):
        for _ in tf.range(num_steps):
            rb.add_batch(_items(counter.assign_add(1), 4))

    collect(tf.constant(5))
    iterator = iter(rb.as_dataset(sample_batch_size=8, num_steps=2, num_parallel_calls=2).prefetch(2))
    weights = tf.Variable(0.0)

    @tf.function
    def train_step():
        experience, info = next(iterator)
        loss = tf.reduce_mean(experience["obs"] ** 2) * 1e-9 + weights
        weights.assign_add(1.0)
        return experience, info, loss

    for _ in range(10):
        collect(tf.constant(3))
        experience, info, _ = train_step()
        _assert_consistent_windows(experience, info.ids, 4)
    assert int(rb.num_frames()) == 4 * 20  # 35 steps into a ring of 20 per segment


@pytest.mark.parametrize("num_steps, time_stacked, sample_batch_size", [
    (None, True, 6), (2, True, 6), (3, False, 6), (2, True, None)])
def test_add_and_sample_compile_with_xla(num_steps, time_stacked, sample_batch_size):
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=3, max_length=5, episode_end_fn=None)
    counter = tf.Variable(-1, dtype=tf.int64)  # assign_add(1) yields the logical step id

    @tf.function(jit_compile=True)
    def step():
        rb.add_batch(_items(counter.assign_add(1), 3))
        data, info = rb.get_next(sample_batch_size, num_steps, time_stacked)
        return data, info, rb.num_frames()

    for _ in range(7):
        data, info, frames = step()
    everything = rb.gather_all()  # dynamic shape [batch_size, stored steps]: not an XLA program
    if num_steps is not None and not time_stacked:
        data = tf.nest.map_structure(lambda *ts: tf.stack(ts, 1), *data)
        ids = tf.stack(info.ids, 1)
    else:
        ids = info.ids
    if sample_batch_size is None:
        data, ids = tf.nest.map_structure(lambda t: t[None], (data, ids))
    if num_steps is None:
        data, ids = tf.nest.map_structure(lambda t: t[:, None], (data, ids))
    _assert_consistent_windows(data, ids, 3)
    np.testing.assert_array_equal(everything["step"].numpy(),
                                  np.arange(2, 7)[None, :] * 100 + np.arange(3)[:, None])
    assert int(frames) == 15


def test_eager_and_traced_adds_interleave_on_one_ring():
    # Eager adds take the eager-op path, adds inside tf.function the graph path: both must claim ids
    # from the same counter and write the same rows. 3 segments, ring of 4, 7 adds (wrapped).
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=3, max_length=4)
    @tf.function(autograph=False)
    def traced_add(step):
        rb.add_batch(_items(step, 3))

    for step in range(7):
        if step % 2:
            traced_add(tf.constant(step, tf.int64))
        else:
            rb.add_batch(_items(step, 3))
    # Steps 3..6 stored, oldest first; value = 100 * step + segment.
    expected = [[100 * step + segment for step in range(3, 7)] for segment in range(3)]
    everything = rb.gather_all()
    assert everything["step"].numpy().tolist() == expected
    np.testing.assert_array_equal(everything["obs"].numpy()[..., 1], -np.array(expected, np.float32))
    assert int(rb.num_frames()) == 12
    assert (int(rb.state.last_id.numpy()), int(rb.state.write_started.numpy())) == (6, 6)
    data, info = rb.get_next(sample_batch_size=64, num_steps=2)
    _assert_consistent_windows(data, info.ids, 3)
    assert set(info.ids.numpy()[:, 0].tolist()) == {3, 4, 5}  # every valid start drawn among 64


def test_clear_and_checkpoint_round_trip(tmp_path):
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    for step in range(5):
        rb.add_batch(_items(step, 2))
    path = tf.train.Checkpoint(rb=rb).save(str(tmp_path / "ckpt"))
    restored = replay_tf.UniformReplayBuffer(SPEC, batch_size=2, max_length=3)
    tf.train.Checkpoint(rb=restored).restore(path).assert_consumed()
    for buffer in (rb, restored):
        buffer.add_batch(_items(5, 2))
    np.testing.assert_array_equal(restored.gather_all()["step"].numpy(), rb.gather_all()["step"].numpy())
    np.testing.assert_array_equal(restored.gather_all()["step"].numpy(), [[300, 400, 500], [301, 401, 501]])
    restored.clear()
    assert int(restored.num_frames()) == 0
    assert restored.gather_all()["step"].shape == (2, 0)
    restored.add_batch(_items(9, 2))
    np.testing.assert_array_equal(restored.gather_all()["step"].numpy(), [[900], [901]])


# ----- bad input -----
def _good(batch_size=2):
    return {"step": np.zeros([batch_size], np.int64), "obs": np.zeros([batch_size, 2], np.float32)}


@pytest.mark.parametrize("items, error, pattern", [
    (_good(3), ValueError, r"items\['obs'\]: expected shape \[2, 2\] .*got \[3, 2\] \(outer dimension 0 is 3, "
                           r"expected 2\)"),
    ({"step": np.zeros([2], np.int64), "obs": np.zeros([2, 3], np.float32)}, ValueError,
     r"items\['obs'\]: expected shape \[2, 2\] \(outer dims \[2\] \+ spec shape \[2\]\), got \[2, 3\]"),
    # Tensors of another dtype are rejected, as TF-Agents (numpy inputs are converted: test_buffer_compat.py).
    ({"step": tf.zeros([2], tf.int32), "obs": tf.zeros([2, 2], tf.float32)}, TypeError,
     r"items\['step'\]: expected dtype int64, got int32"),
    ({"step": tf.zeros([2], tf.int64), "obs": tf.zeros([2, 2], tf.float64)}, TypeError,
     r"items\['obs'\]: expected dtype float32, got float64"),
    ({"step": np.zeros([2], np.int64)}, TypeError, r"items: expected keys \['obs', 'step'\].*missing \['obs'\]"),
    ((np.zeros([2], np.int64), np.zeros([2, 2], np.float32)), TypeError,
     r"structure mismatch at items: expected a mapping"),
])
def test_add_batch_bad_input(items, error, pattern):
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    with pytest.raises(error, match=pattern):
        rb.add_batch(items)
    with pytest.raises(error, match=pattern):  # the same error at trace time inside tf.function
        tf.function(lambda: rb.add_batch(tf.nest.map_structure(tf.constant, items)))()
    assert int(rb.num_frames()) == 0


def test_dynamic_outer_dimension_is_checked_when_run():
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=2, max_length=4)

    @tf.function(input_signature=[{"step": tf.TensorSpec([None], tf.int64),
                                   "obs": tf.TensorSpec([None, 2], tf.float32)}])
    def add(items):
        rb.add_batch(items)

    add(_good(2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"\[3,2\] is not compatible with expected shape \[2,2\]"):
        add(_good(3))
    assert int(rb.num_frames()) == 2
    add(_good(2))  # nothing was half-written: the next add lands on the next step
    assert rb.gather_all()["step"].shape == (2, 2)


def test_sampling_errors():
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    with pytest.raises(ValueError, match=r"num_steps \(5\) must be <= max_length \(4\)"):
        rb.get_next(sample_batch_size=2, num_steps=5)
    with pytest.raises(ValueError, match=r"num_steps \(5\) must be <= max_length \(4\)"):
        rb.as_dataset(num_steps=5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no valid window to sample: it is empty"):
        rb.get_next(sample_batch_size=2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="is empty"):
        next(iter(rb.as_dataset(single_deterministic_pass=True)))
    rb.add_batch(_items(0, 2))
    rb.add_batch(_items(1, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"fewer than num_steps \(3\) steps per segment"):
        rb.get_next(sample_batch_size=2, num_steps=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"fewer than num_steps \(3\)"):
        next(iter(rb.as_dataset(sample_batch_size=2, num_steps=3)))
    rb.get_next(sample_batch_size=2, num_steps=2)  # enough now
    with pytest.raises(ValueError, match=r"sample_batch_size \(-1\) must be >= 0"):
        rb.get_next(sample_batch_size=-1)  # (0 is an empty batch, as in TF-Agents: test_buffer_compat)
    with pytest.raises(ValueError, match=r"sample_batch_size \(0\) must be >= 1"):
        rb.as_dataset(sample_batch_size=0)
    lists = replay_tf.UniformReplayBuffer([tf.TensorSpec([], tf.float32)], batch_size=1, max_length=2)
    with pytest.raises(ValueError, match="data_spec contains Python lists"):
        lists.as_dataset()


# ----- concurrency: readers while a writer adds -----
def test_concurrent_readers_never_see_torn_windows():
    batch_size, max_length = 2, 4      # a tiny ring: the writer laps readers constantly
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=batch_size, max_length=max_length)
    for step in range(max_length):
        rb.add_batch(_items(step, batch_size))
    with adding_in_background(rb, lambda step: _items(step, batch_size), last_step=max_length - 1) as counter:
        ds = rb.as_dataset(sample_batch_size=16, num_steps=3, num_parallel_calls=2)
        for data, info in ds.take(150):
            _assert_consistent_windows(data, info.ids, batch_size)
    assert int(counter.numpy()) > 2 * max_length


# ----- episode-aware windows -----
def test_episode_aware_windows_never_cross_episodes():
    spec = {"step": tf.TensorSpec([], tf.int64), "is_last": tf.TensorSpec([], tf.bool)}
    rb = replay_tf.UniformReplayBuffer(spec, batch_size=2, max_length=6,
                                       episode_end_fn=uniform.end_of_episode_from_is_last)
    # Segment 0: episodes of length 2 (steps 0-1, 2-3, 4-5, 6-7); segment 1: one long episode.
    for step in range(8):
        rb.add_batch({"step": tf.constant([step * 100, step * 100 + 1], tf.int64),
                      "is_last": tf.constant([step % 2 == 1, False])})
    data, info = rb.get_next(sample_batch_size=4000, num_steps=2)
    windows = {tuple(w) for w in data["step"].numpy().tolist()}
    # Stored steps 2..7. Segment 0 windows within an episode: (2,3), (4,5), (6,7); segment 1: 5 windows.
    expected = {(200, 300), (400, 500), (600, 700)} | {(s * 100 + 1, s * 100 + 101) for s in range(2, 7)}
    assert windows == expected
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / 8)
    data, info = rb.get_next(sample_batch_size=500, num_steps=3)
    assert {tuple(w) for w in data["step"].numpy().tolist()} == {
        (s * 100 + 1, s * 100 + 101, s * 100 + 201) for s in range(2, 6)}
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / 4)
    # Prioritized, same episodes: crossing windows never drawn.
    prb = replay_tf.PrioritizedReplayBuffer(spec, batch_size=2, max_length=6, alpha=1.0,
                                            episode_end_fn=uniform.end_of_episode_from_is_last)
    for step in range(8):
        prb.add_batch({"step": tf.constant([step * 100, step * 100 + 1], tf.int64),
                       "is_last": tf.constant([step % 2 == 1, False])})
    data, info = prb.get_next(sample_batch_size=2000, num_steps=2)
    assert {tuple(w) for w in data["step"].numpy().tolist()} == expected
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / 8, rtol=1e-5)


def test_end_of_episode_from_step_type_on_trajectory_like_items():
    Trajectory = collections.namedtuple("Trajectory", ["step_type", "observation", "next_step_type"])
    items = Trajectory(tf.constant([1, 2, 0]), tf.zeros([3]), tf.constant([2, 0, 1]))
    np.testing.assert_array_equal(uniform.end_of_episode_from_step_type(items).numpy(), [True, False, False])


def test_under_xla_an_impossible_sample_is_flagged_not_garbage():
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=2, max_length=4)
    prb = replay_tf.PrioritizedReplayBuffer(SPEC, batch_size=2, max_length=4)
    for buffer in (rb, prb):
        _, info = tf.function(lambda b=buffer: b.get_next(3, 2), jit_compile=True, autograph=False)()
        np.testing.assert_array_equal(info.ids.numpy(), -np.ones([3, 2]))
        np.testing.assert_array_equal(info.probabilities.numpy(), np.zeros([3]))


def test_eager_get_next_follows_the_global_seed_and_matches_traced_windows():
    # From Python get_next runs as one XLA program with stateless draws keyed by the global seed.
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=3, max_length=5)
    for step in range(8):                                  # wrapped: steps 3..7 stored
        rb.add_batch(_items(step, 3))
    draws = []
    for _ in range(2):
        tf.random.set_seed(11)
        draws.append([rb.get_next(sample_batch_size=50, num_steps=2)[1].ids.numpy() for _ in range(2)])
    np.testing.assert_array_equal(draws[0], draws[1])      # same seed, same calls: same samples
    assert (draws[0][0] != draws[0][1]).any()              # consecutive calls differ
    traced = tf.function(lambda: rb.get_next(sample_batch_size=2000, num_steps=2), autograph=False)
    (eager_data, eager_info), (traced_data, traced_info) = rb.get_next(sample_batch_size=2000, num_steps=2), traced()
    for data, info in ((eager_data, eager_info), (traced_data, traced_info)):
        _assert_consistent_windows(data, info.ids, 3)
        np.testing.assert_allclose(info.probabilities.numpy(), 1 / 12)   # 4 valid starts x 3 segments
    assert set(eager_info.ids.numpy()[:, 0].tolist()) == set(traced_info.ids.numpy()[:, 0].tolist()) == {3, 4, 5, 6}


def _no_injected_prefetch(ds):
    # tf.data may otherwise compute the next element ahead of `next`, before the add that follows.
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    return ds.with_options(options)


def _expected_after_adds(batch_size, max_length, adds):
    # A window of one step: every stored (segment, step) pair is equally likely; the ring keeps
    # the newest `max_length` steps of each segment.
    stored = min(adds, max_length)
    return 1.0 / (stored * batch_size), set(range(adds - stored, adds))


@pytest.mark.parametrize("batch_size", [1, 3])
def test_unbatched_as_dataset_elements_reflect_adds_made_after_iter_eager(batch_size):
    rb = replay_tf.UniformReplayBuffer(tf.TensorSpec([], tf.int32, "action"), batch_size=batch_size,
                                       max_length=3)
    iterator = iter(_no_injected_prefetch(rb.as_dataset()))
    for adds in range(1, 7):
        rb.add_batch(tf.fill([batch_size], adds - 1))      # step t stores the value t in every segment
        for _ in range(2):                                  # two draws between adds: both see this add
            data, info = next(iterator)
            probability, ids = _expected_after_adds(batch_size, 3, adds)
            assert float(info.probabilities) == pytest.approx(probability)
            assert int(info.ids) in ids and int(data) == int(info.ids)
    rb.clear()
    rb.add_batch(tf.fill([batch_size], 100))                # a clear then an add: only the new step
    data, info = next(iterator)
    assert (int(data), int(info.ids), float(info.probabilities)) == (100, 0, pytest.approx(1 / batch_size))


def test_unbatched_as_dataset_elements_reflect_adds_made_after_iter_graph_mode():
    batch_size, max_length = 2, 3
    with tf.Graph().as_default():
        rb = replay_tf.UniformReplayBuffer(tf.TensorSpec([], tf.int32, "action"), batch_size=batch_size,
                                           max_length=max_length)
        step = tf.compat.v1.placeholder(tf.int32, [])
        add = rb.add_batch(tf.fill([batch_size], step))
        iterator = tf.compat.v1.data.make_initializable_iterator(_no_injected_prefetch(rb.as_dataset()))
        sample = iterator.get_next()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(iterator.initializer)
            for adds in range(1, 6):
                session.run(add, {step: adds - 1})
                data, info = session.run(sample)
                probability, ids = _expected_after_adds(batch_size, max_length, adds)
                assert info.probabilities == pytest.approx(probability)
                assert int(info.ids) in ids and int(data) == int(info.ids)


def test_unbatched_as_dataset_of_a_static_buffer_stays_uniform():
    # Many elements without adds in between (drawn a chunk at a time): still uniform over all pairs.
    rb = replay_tf.UniformReplayBuffer(SPEC, batch_size=3, max_length=5)
    for step in range(8):                                  # wrapped: steps 3..7 stored
        rb.add_batch(_items(step, 3))
    data, info = next(iter(rb.as_dataset(num_steps=2).batch(3000)))
    _assert_consistent_windows(data, info.ids, 3)
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / 12)
    starts = collections.Counter(info.ids.numpy()[:, 0].tolist())
    assert set(starts) == {3, 4, 5, 6} and min(starts.values()) > 600   # ~750 each
