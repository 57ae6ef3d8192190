"""In-graph buffers vs TF-Agents 0.19 semantics: concurrent writers, string leaves, `variables()`, numpy inputs."""
import ast
import doctest
import threading

import numpy as np
import pytest
import tensorflow as tf

import replay_tf
from replay_tf.buffers import uniform


def test_doctests():
    failures, _ = doctest.testmod(uniform, raise_on_error=False, verbose=False)
    assert failures == 0


# ----- concurrent writers -----
def _add_concurrently(buffer, num_threads: int, adds_per_thread: int) -> None:
    """Each thread adds values `t * adds_per_thread + 1 ..` through one graph-mode tf.function."""
    @tf.function(autograph=False)
    def add(value):
        buffer.add_batch(value)

    add(tf.constant([0], tf.int64))  # traced once, before the threads start
    buffer.clear()

    def writer(t):
        for i in range(adds_per_thread):
            add(tf.constant([t * adds_per_thread + i + 1], tf.int64))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_concurrent_graph_mode_adds_write_every_step_once():
    # Each writer claims its step id atomically: no two writers get the same slot, none is skipped.
    rb = replay_tf.TFUniformReplayBuffer(tf.TensorSpec([], tf.int64), batch_size=1, max_length=10000)
    _add_concurrently(rb, num_threads=3, adds_per_thread=1000)
    assert int(rb.num_frames()) == 3000
    assert sorted(rb.gather_all().numpy()[0].tolist()) == list(range(1, 3001))
    assert (int(rb.state.last_id.numpy()), int(rb.state.write_started.numpy())) == (2999, 2999)


def test_concurrent_prioritized_adds_give_every_new_item_its_priority():
    # The new rows' priorities go to the rows the writer claimed (not to `write_started + 1` read before
    # the claim), and concurrent tree updates leave consistent sums.
    rb = replay_tf.PrioritizedReplayBuffer(tf.TensorSpec([], tf.int64), batch_size=1, max_length=2000)
    _add_concurrently(rb, num_threads=3, adds_per_thread=400)
    assert sorted(rb.gather_all().numpy()[0].tolist()) == list(range(1, 1201))
    leaves = rb._sums[0].numpy()
    np.testing.assert_array_equal(leaves[:1200], np.ones(1200))     # max priority 1.0 ** alpha
    np.testing.assert_array_equal(leaves[1200:], np.zeros(leaves.size - 1200))
    for lower, upper in zip(rb._sums[:-1], rb._sums[1:]):           # every parent sums its children
        np.testing.assert_allclose(lower.numpy().reshape(upper.shape[0], -1).sum(1), upper.numpy())


# ----- string leaves (XLA has no strings: such buffers run as plain graph functions) -----
MIXED_SPEC = {"obs": tf.TensorSpec([2], tf.float32), "info": tf.TensorSpec([], tf.string)}


def _mixed_items(step):
    """Step `step` of both segments: obs = [step, segment], info = b"s{step}b{segment}"."""
    step_text = tf.strings.as_string(step)
    return {"obs": tf.stack([tf.cast(tf.fill([2], step), tf.float32), [0.0, 1.0]], 1),
            "info": tf.strings.join(["s", step_text, "b", tf.constant(["0", "1"])])}


def _assert_mixed_windows(data, num_steps):
    """info names the same step and segment as obs; steps within a window are consecutive."""
    obs = np.asarray(data["obs"]).reshape(-1, num_steps, 2).astype(int)
    info = np.asarray(data["info"]).reshape(-1, num_steps)
    expected = [[f"s{step}b{segment}".encode() for step, segment in window] for window in obs]
    assert info.tolist() == expected
    assert (np.diff(obs[..., 0], axis=1) == 1).all() and (obs[..., 1] == obs[:, :1, 1]).all()


@pytest.mark.parametrize("buffer_class", [replay_tf.TFUniformReplayBuffer, replay_tf.PrioritizedReplayBuffer])
@pytest.mark.parametrize("traced", [False, True])
def test_string_leaves(buffer_class, traced):
    rb = buffer_class(MIXED_SPEC, batch_size=2, max_length=3)
    run = (lambda f: tf.function(f, autograph=False)()) if traced else (lambda f: f())
    def add(step):
        rb.add_batch(_mixed_items(tf.constant(step, tf.int64)))  # returns nothing (an op when traced)

    for step in range(4):                                           # wrapped: steps 1..3 stored
        run(lambda step=step: add(step))
    everything = run(rb.gather_all)
    np.testing.assert_array_equal(everything["obs"].numpy()[..., 0], [[1, 2, 3], [1, 2, 3]])
    assert everything["info"].numpy().tolist() == [[b"s1b0", b"s2b0", b"s3b0"], [b"s1b1", b"s2b1", b"s3b1"]]
    data, info = run(lambda: rb.get_next(sample_batch_size=50, num_steps=2))
    _assert_mixed_windows(data, 2)
    np.testing.assert_allclose(info.probabilities.numpy(), 1 / 4, rtol=1e-5)  # 2 starts x 2 segments
    single, _ = run(rb.get_next)
    assert single["info"].numpy() == f"s{int(single['obs'][0])}b{int(single['obs'][1])}".encode()
    for data, _ in rb.as_dataset(sample_batch_size=4, num_steps=2).take(2):
        _assert_mixed_windows(data, 2)
    iterator = iter(rb.as_dataset(sample_batch_size=4, num_steps=2))
    data, _ = run(lambda: next(iterator))
    _assert_mixed_windows(data, 2)
    windows = [d for d, _ in rb.as_dataset(num_steps=3, single_deterministic_pass=True)]
    assert [w["info"].numpy().tolist() for w in windows] == [[b"s1b0", b"s2b0", b"s3b0"],
                                                             [b"s1b1", b"s2b1", b"s3b1"]]


def test_string_buffer_errors_are_raised_eagerly():
    rb = replay_tf.TFUniformReplayBuffer(tf.TensorSpec([], tf.string), batch_size=1, max_length=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no valid window to sample: it is empty"):
        rb.get_next(sample_batch_size=2)
    rb.add_batch(tf.constant([b"hello"]))
    data, info = rb.get_next(sample_batch_size=2)
    assert data.numpy().tolist() == [b"hello", b"hello"] and info.ids.numpy().tolist() == [0, 0]


# ----- variables() -----
@pytest.mark.parametrize("buffer_class", [replay_tf.TFUniformReplayBuffer, replay_tf.PrioritizedReplayBuffer])
def test_variables_is_a_method_returning_the_storage(buffer_class):
    spec = (tf.TensorSpec([3], tf.float32, "obs"), {"info": tf.TensorSpec([], tf.string)})
    rb = buffer_class(spec, batch_size=2, max_length=4)
    rb.add_batch((tf.ones([2, 3]), {"info": tf.constant([b"a", b"b"])}))
    variables = rb.variables()
    assert isinstance(variables, list) and len(variables) > 0
    assert all(isinstance(v, tf.Variable) for v in variables)
    # The storage of every leaf, first and in flatten order: [max_length * batch_size, *leaf.shape].
    assert [(v.dtype, v.shape.as_list()) for v in variables[:2]] == [(tf.float32, [8, 3]), (tf.string, [8])]
    assert variables[1].numpy().tolist()[:2] == [b"a", b"b"]
    # Exactly the checkpointed variables (the sampling key of eager get_next is not one).
    checkpointed = {id(v) for v in tf.train.TrackableView(rb).descendants() if isinstance(v, tf.Variable)}
    assert {id(v) for v in variables} == checkpointed
    assert rb.trainable_variables == ()


# ----- numpy and Python inputs are converted to the spec's dtype, as TF-Agents -----
# (spec dtype, spec shape, input for batch_size 2, stored values): numpy's astype (truncation, wrapping).
CONVERSIONS = [
    ("float32", [2], "np.full([2, 2], 1.1, np.float64)", [[1.1, 1.1], [1.1, 1.1]]),
    ("int64", [], "np.array([1, 2], np.int32)", [1, 2]),
    ("int64", [], "np.array([1.7, -2.5])", [1, -2]),
    ("bool", [], "np.array([0, 2])", [False, True]),
    ("uint8", [], "np.array([300, -1])", [44, 255]),
    ("string", [], "np.array(['h\u00e9', 'x'])", [b"h\xc3\xa9", b"x"]),
    ("float32", [], "np.float64(3.5) * np.ones([2])", [3.5, 3.5]),
]
CONVERSION_DRIVER = '''
import numpy as np
import tensorflow as tf

def run_conversions(RB, cases, emit):
    for k, (dtype, shape, value, _) in enumerate(cases):
        for traced in (False, True):
            rb = RB(tf.TensorSpec(shape, getattr(tf, dtype)), batch_size=2, max_length=3)
            def add():
                rb.add_batch(eval(value))
            (tf.function(add) if traced else add)()
            emit(f"{k}/{traced}", repr(rb.gather_all().numpy()[:, 0].tolist()))  # a repr: JSON has no bytes
'''


def _run_conversions(rb_class):
    namespace, out = {}, {}
    exec(compile(CONVERSION_DRIVER, "CONVERSION_DRIVER", "exec"), namespace)
    namespace["run_conversions"](rb_class, CONVERSIONS, lambda name, value: out.__setitem__(name, value))
    return out


@pytest.mark.parametrize("buffer_class", [replay_tf.TFUniformReplayBuffer, replay_tf.PrioritizedReplayBuffer])
def test_numpy_inputs_are_converted_to_the_spec_dtype(buffer_class):
    ours = _run_conversions(buffer_class)
    for k, (dtype, _, value, expected) in enumerate(CONVERSIONS):
        for traced in (False, True):
            stored = ast.literal_eval(ours[f"{k}/{traced}"])
            if dtype == "float32":
                np.testing.assert_array_equal(stored, np.asarray(expected, np.float32), f"{value} traced={traced}")
            else:
                assert stored == expected, f"{value} traced={traced}"


@pytest.mark.peer
def test_numpy_inputs_are_stored_as_tf_agents_stores_them(peer):
    theirs = peer.run(CONVERSION_DRIVER + f"CASES = {CONVERSIONS!r}\n" +
                      "from tf_agents.replay_buffers.tf_uniform_replay_buffer import TFUniformReplayBuffer\n"
                      "run_conversions(TFUniformReplayBuffer, CASES, emit)\n")
    ours = _run_conversions(replay_tf.TFUniformReplayBuffer)
    assert ours == theirs


@pytest.mark.parametrize("items, error, pattern", [
    (tf.zeros([2], tf.int32), TypeError, r"items: expected dtype int64, got int32 \(cast it before adding\)"),
    (np.array(["a", "b"]), TypeError, r"items: cannot convert ndarray of numpy dtype <U1 to the spec's dtype int64"),
    ([1, 2], TypeError, r"structure mismatch at items: expected a leaf"),   # TF-Agents: a structure, too
    (np.zeros([3], np.int32), ValueError, r"items: expected shape \[2\]"),
])
def test_inputs_that_stay_rejected(items, error, pattern):
    rb = replay_tf.TFUniformReplayBuffer(tf.TensorSpec([], tf.int64), batch_size=2, max_length=3)
    with pytest.raises(error, match=pattern):
        rb.add_batch(items)
    assert int(rb.num_frames()) == 0


# ----- an empty sample batch -----
EMPTY_BATCH_DRIVER = """
import tensorflow as tf

def run_empty_batches(make_buffer, emit):
    spec = {"a": tf.TensorSpec([2], tf.float32), "b": tf.TensorSpec([], tf.int32)}
    rb = make_buffer(spec, batch_size=2, max_length=3)
    try:
        rb.get_next(sample_batch_size=0)
        emit("empty_buffer", "no error")
    except tf.errors.InvalidArgumentError:
        emit("empty_buffer", "InvalidArgumentError")
    for _ in range(2):
        rb.add_batch({"a": tf.ones([2, 2]), "b": tf.constant([1, 2])})
    for num_steps in (None, 2):
        try:
            data, info = rb.get_next(sample_batch_size=0, num_steps=num_steps)
        except tf.errors.InvalidArgumentError:
            emit(f"{num_steps}/data", "InvalidArgumentError")
            continue
        emit(f"{num_steps}/data", {k: [list(v.shape), v.dtype.name] for k, v in data.items()})
        emit(f"{num_steps}/info", [[list(v.shape), v.dtype.name] for v in info])
"""


def _run_empty_batches(buffer_class) -> dict:
    got = {}
    scope = {}
    exec(EMPTY_BATCH_DRIVER, scope)  # noqa: S102  (the same driver runs in the peer venv)
    scope["run_empty_batches"](buffer_class, lambda name, value: got.__setitem__(name, value))
    return got


@pytest.mark.peer
def test_sample_batch_size_zero_gives_an_empty_batch_as_tf_agents(peer):
    theirs = peer.run(EMPTY_BATCH_DRIVER + "from tf_agents.replay_buffers.tf_uniform_replay_buffer import "
                      "TFUniformReplayBuffer\nrun_empty_batches(TFUniformReplayBuffer, emit)\n")
    ours = _run_empty_batches(replay_tf.TFUniformReplayBuffer)
    assert ours["None/data"] == {"a": [[0, 2], "float32"], "b": [[0], "int32"]}
    assert ours["empty_buffer"] == "InvalidArgumentError"  # an empty buffer is still refused
    for key in ("empty_buffer", "None/data", "None/info"):
        assert ours[key] == theirs[key], key
    # With num_steps TF-Agents fails (its ids [0] + range(2) do not broadcast); ours gives [0, T] windows.
    assert theirs["2/data"] == "InvalidArgumentError"
    assert ours["2/data"] == {"a": [[0, 2, 2], "float32"], "b": [[0, 2], "int32"]}
    assert ours["2/info"] == [[[0, 2], "int64"], [[0], "float32"]]


def test_prioritized_sample_batch_size_zero_gives_an_empty_batch():
    got = _run_empty_batches(replay_tf.PrioritizedReplayBuffer)
    assert got["empty_buffer"] == "InvalidArgumentError"
    assert got["2/data"] == {"a": [[0, 2, 2], "float32"], "b": [[0, 2], "int32"]}
    assert got["2/info"] == [[[0, 2], "int64"], [[0], "float32"], [[0], "float32"]]  # ids, probabilities, weights
    with pytest.raises(ValueError, match=r"sample_batch_size \(-1\) must be >= 0"):
        replay_tf.PrioritizedReplayBuffer(tf.TensorSpec([], tf.int32), 1, 2).get_next(sample_batch_size=-1)


@pytest.mark.peer
def test_the_classes_of_tf_agents_buffer_modules_are_here(peer):
    # `from tf_agents.replay_buffers import tf_uniform_replay_buffer` becomes `import replay_tf as
    # tf_uniform_replay_buffer`: every class those modules define must be a name of replay_tf.
    modules = ["tf_agents.replay_buffers.tf_uniform_replay_buffer", "tf_agents.replay_buffers.py_uniform_replay_buffer",
               "tf_agents.replay_buffers.replay_buffer"]
    out = peer.run("import importlib\nfor name in INPUTS['modules']:\n"
                   "    m = importlib.import_module(name)\n"
                   "    emit(name, sorted(n for n, v in vars(m).items()\n"
                   "                      if not n.startswith('_') and getattr(v, '__module__', None) == name))",
                   {"modules": modules})
    assert out[modules[0]] == ["BufferInfo", "TFUniformReplayBuffer"] and out[modules[1]] == ["PyUniformReplayBuffer"]
    assert out[modules[2]] == ["ReplayBuffer"]
    assert [n for names in out.values() for n in names if not hasattr(replay_tf, n)] == []
