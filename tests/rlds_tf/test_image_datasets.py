"""Image-heavy RLDS datasets: JPEG cameras, a nested observation, a text instruction per step.

The dataset is `benchmarks.robotics_dataset` (written with TFDS's own feature classes). Every expected value
comes from TFDS itself: `builder_from_directory(d).as_dataset()` decoded by TFDS, steps flattened with
`flat_map(lambda e: e['steps'])`, then turned into the expected output of each operation with numpy. Images
are compared exactly (both sides decode with TensorFlow's JPEG decoder).
"""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import rlds_tf as rlds
import replay_tf as reverb
from benchmarks import robotics_dataset
from dataset_testlib import assert_nested_equal
from dataset_testlib import dataset_graph
from dataset_testlib import graph_nodes
from dataset_testlib import to_numpy

T = rlds.transformations
NUM_EPISODES, EPISODE_LENGTH = 3, 4


@pytest.fixture(scope="module", params=["tfrecord", "array_record"])
def dataset_dir(request, tmp_path_factory):
    directory = str(tmp_path_factory.mktemp(f"robotics-{request.param}"))
    return robotics_dataset.write(directory, num_episodes=NUM_EPISODES, episode_length=EPISODE_LENGTH,
                                  episodes_per_shard=2, file_format=request.param)


@pytest.fixture(scope="module")
def tfrecord_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("robotics"))
    return robotics_dataset.write(directory, num_episodes=NUM_EPISODES, episode_length=EPISODE_LENGTH,
                                  episodes_per_shard=2)


def _tfds_episodes(directory):
    """Episodes as TFDS decodes them: metadata, and `steps` as a list of step dicts (numpy)."""
    dataset_builder = tfds.builder_from_directory(directory)
    if dataset_builder.info.file_format.value == "array_record":
        # TFDS serves array_record only as a random-access source; it decodes with the same features.
        source = dataset_builder.as_data_source(split="train")
        records = [source[i] for i in range(len(source))]
        return [dict(r, steps=[tf.nest.map_structure(lambda *x: x, s) for s in _unstack(r["steps"])])
                for r in records]
    return to_numpy(list(dataset_builder.as_dataset(split="train")))


def _unstack(stacked):
    length = len(stacked["is_first"])
    return [tf.nest.map_structure(lambda x, i=i: np.asarray(x[i]), stacked) for i in range(length)]


@pytest.fixture(scope="module")
def reference(tfrecord_dir):
    """TFDS's decoding of the tfrecord dataset: a list of episodes, each `steps` a list of step dicts."""
    return _tfds_episodes(tfrecord_dir)


def _stack(steps):
    """Steps stacked field by field, strings as numpy objects (as TF gives them)."""
    def stack(*values):
        return np.stack(values).astype(object) if isinstance(values[0], bytes) else np.stack(values)
    return tf.nest.map_structure(stack, *steps)


def _flat_steps(episodes):
    return [step for episode in episodes for step in episode["steps"]]


# --- The dataset -------------------------------------------------------------------------------------------


def test_dataset_holds_the_generated_episodes(reference):
    """TFDS reads back what the generator wrote: every field exactly, camera frames up to JPEG's loss."""
    assert len(reference) == NUM_EPISODES
    for index, episode in enumerate(reference):
        written = robotics_dataset.episode(index, EPISODE_LENGTH)
        got = _stack(episode["steps"])
        assert got["observation"]["image"].shape == (EPISODE_LENGTH, 128, 128, 3)
        for camera in ("image", "wrist_image"):
            error = np.abs(got["observation"][camera].astype(int) - written["steps"]["observation"][camera])
            assert error.mean() < 2.0, (camera, error.mean())
        exact = {k: v for k, v in got.items() if k not in ("observation", "language_instruction")}
        assert_nested_equal(exact, {k: written["steps"][k] for k in exact})
        assert_nested_equal(got["observation"]["state"], written["steps"]["observation"]["state"])
        assert [t.decode() for t in got["language_instruction"]] == written["steps"]["language_instruction"]
        assert int(episode["episode_id"]) == index
        assert episode["episode_metadata"]["file_path"].decode() == written["episode_metadata"]["file_path"]
    assert len({_stack(e["steps"])["language_instruction"][0] for e in reference}) == NUM_EPISODES


# --- Loading -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [None, 5])
def test_load_steps_equals_tfds_flat_map(dataset_dir, reference, batch_size):
    expected = _flat_steps(reference)
    if batch_size:
        expected = [_stack(expected[i:i + batch_size]) for i in range(0, len(expected), batch_size)]
    got = to_numpy(list(rlds.load_steps(dataset_dir, "train", batch_size=batch_size)))
    assert_nested_equal(got, expected)


def test_load_equals_tfds_with_nested_steps(dataset_dir, reference):
    got = to_numpy(list(rlds.load(dataset_dir, "train")))
    assert_nested_equal(got, reference)
    flat = to_numpy(list(rlds.load(dataset_dir, "train").flat_map(lambda e: e[rlds.STEPS])))
    assert_nested_equal(flat, _flat_steps(reference))


def test_load_stacked_equals_tfds_eagerly_in_flat_map_and_tf_function(dataset_dir, reference):
    expected = [dict(e, steps=_stack(e["steps"])) for e in reference]
    episodes = rlds.load_stacked(dataset_dir, "train")
    assert_nested_equal(to_numpy(list(episodes)), expected)

    flat = episodes.flat_map(lambda e: tf.data.Dataset.from_tensor_slices(e[rlds.STEPS]))
    assert_nested_equal(to_numpy(list(flat)), _flat_steps(reference))

    @tf.function
    def last_frame_and_instruction(episode):
        steps = episode[rlds.STEPS]
        return steps["observation"]["wrist_image"][-1], tf.strings.join([steps["language_instruction"][-1], "!"])

    for episode, want in zip(episodes, expected):
        frame, text = last_frame_and_instruction(episode)
        np.testing.assert_array_equal(frame.numpy(), want["steps"]["observation"]["wrist_image"][-1])
        assert text.numpy() == want["steps"]["language_instruction"][-1] + b"!"


def test_image_decoding_runs_in_the_graph_in_parallel(tfrecord_dir):
    """Frames are decoded by TF ops inside a parallel (AUTOTUNE) map over episodes: no Python per step."""
    graph = dataset_graph(rlds.load_steps(tfrecord_dir, "train", batch_size=8))
    ops = [node.op for node in graph_nodes(graph)]
    assert any(op in ("DecodeImage", "DecodeJpeg") for op in ops), sorted(set(ops))
    assert not [op for op in ops if "PyFunc" in op], sorted(set(ops))
    consts = {node.name: node for node in graph_nodes(graph) if node.op == "Const"}
    parallel = [node for node in graph.node if node.op == "ParallelMapDatasetV2"]
    assert parallel, sorted(set(ops))
    calls = [tf.make_ndarray(consts[node.input[-1].split(":")[0]].attr["value"].tensor) for node in parallel]
    assert -1 in calls, calls  # tf.data.AUTOTUNE


# --- Transformations and patterns ----------------------------------------------------------------------------


def _zeros_like_step(step):
    return tf.nest.map_structure(lambda x: b"" if isinstance(x, bytes) else np.zeros_like(x), step)


def _windows(steps, size):
    return [_stack(steps[i:i + size]) for i in range(len(steps) - size + 1)]


def _configs(spec):
    structured = reverb.structured_writer
    ref = structured.create_reference_step(spec)
    return [structured.create_config({"frames": ref["observation"]["image"][-2:],
                                      "text": ref["language_instruction"][-1], "action": ref["action"][-1]},
                                     table="items")]


def _transition(ref):
    return {"o": tf.nest.map_structure(lambda node: node[-2], ref["observation"]),
            "text": ref["language_instruction"][-2],
            "next_o": tf.nest.map_structure(lambda node: node[-1], ref["observation"])}


def _pattern_item(steps, i):
    return {"frames": np.stack([steps[i - 1]["observation"]["image"], steps[i]["observation"]["image"]]),
            "text": steps[i]["language_instruction"], "action": steps[i]["action"]}


def _double_reward(step):
    return dict(step, reward=step["reward"] * 2)


def _asks_to_open_drawer(step):
    return tf.strings.regex_full_match(step["language_instruction"], ".*drawer.*")


def _absorbing(last_step):
    return T.zero_dataset_like(tf.data.Dataset.from_tensors(last_step))


_EXTRA = {"extra": b"x"}


# name -> (kind, function, expected(list of episodes) -> list of output elements).
# "episode" cases take one episode (steps a nested dataset); "episodes" cases take a dataset of episodes (each
# episode alone in one in flat_map); "whole" cases take the whole dataset of episodes in every context.
CASES = {
    "batch": ("episode", lambda e: T.batch(e["steps"], size=2, shift=1, drop_remainder=True),
              lambda eps: [w for e in eps for w in _windows(e["steps"], 2)]),
    "map_steps": ("episode", lambda e: T.map_steps(e["steps"], _double_reward),
                  lambda eps: [dict(s, reward=s["reward"] * 2) for s in _flat_steps(eps)]),
    "final_step": ("episode", lambda e: T.final_step(e["steps"]), lambda eps: [e["steps"][-1] for e in eps]),
    "episode_length": ("episode", lambda e: T.episode_length(e["steps"]),
                       lambda eps: [np.int32(len(e["steps"])) for e in eps]),
    "sum_dataset": ("episode", lambda e: T.sum_dataset(
        e["steps"], lambda s: {"pixels": tf.cast(s["observation"]["image"], tf.int64), "r": s["reward"]}),
        lambda eps: [{"pixels": _stack(e["steps"])["observation"]["image"].astype(np.int64).sum(0),
                      "r": _stack(e["steps"])["reward"].sum(0)} for e in eps]),
    "concatenate": ("episode", lambda e: T.concatenate(e["steps"], tf.data.Dataset.from_tensors(_EXTRA)),
                    lambda eps: [x for e in eps for x in
                                 [dict(s, extra=b"") for s in e["steps"]]
                                 + [dict(_zeros_like_step(e["steps"][0]), **_EXTRA)]]),
    "concat_if_terminal": ("episode", lambda e: T.concat_if_terminal(e["steps"], _absorbing),
                           lambda eps: [x for e in eps for x in e["steps"]
                                        + ([_zeros_like_step(e["steps"][0])] if e["steps"][-1]["is_terminal"]
                                           else [])]),
    "truncate_after_condition": ("episode", lambda e: T.truncate_after_condition(e["steps"], _asks_to_open_drawer),
                                 lambda eps: [s for e in eps for s in
                                              (e["steps"][:1] if b"drawer" in e["steps"][0]["language_instruction"]
                                               else e["steps"])]),
    "shift_keys": ("episode", lambda e: T.shift_keys(e["steps"], ["action", "language_instruction"], 1),
                   lambda eps: [dict(s, action=n["action"], language_instruction=n["language_instruction"])
                                for e in eps for s, n in zip(e["steps"], e["steps"][1:])]),
    "sar_fields_mask": ("episode", lambda e: e["steps"].map(T.sar_fields_mask),
                        lambda eps: [({k: s[k] for k in ("observation", "action", "reward")},
                                      {"observation": True, "action": not s["is_last"],
                                       "reward": not s["is_last"]}) for s in _flat_steps(eps)]),
    "zero_dataset_like": ("episode", lambda e: T.zero_dataset_like(e["steps"]),
                          lambda eps: [_zeros_like_step(e["steps"][0]) for e in eps]),
    "map_nested_steps": ("episodes", lambda ds: T.map_nested_steps(ds, _double_reward).flat_map(
        lambda e: e["steps"]), lambda eps: [dict(s, reward=s["reward"] * 2) for s in _flat_steps(eps)]),
    "apply_nested_steps": ("episodes", lambda ds: T.apply_nested_steps(ds, lambda s: s.skip(1)).flat_map(
        lambda e: e["steps"]), lambda eps: [s for e in eps for s in e["steps"][1:]]),
    "pattern_map": ("episodes", lambda ds: T.pattern_map(ds, _configs(T.step_spec(ds))),
                    lambda eps: [_pattern_item(e["steps"], i) for e in eps for i in range(1, len(e["steps"]))]),
    "pattern_map_across_episodes": (
        "whole", lambda ds: T.pattern_map(ds, _configs(T.step_spec(ds)), respect_episode_boundaries=False),
        lambda eps: [_pattern_item(_flat_steps(eps), i) for i in range(1, len(_flat_steps(eps)))]),
    "pattern_map_from_transform": (
        "episodes", lambda ds: T.pattern_map_from_transform(ds, _transition),
        lambda eps: [{"o": p["observation"], "text": p["language_instruction"], "next_o": n["observation"]}
                     for e in eps for p, n in zip(e["steps"], e["steps"][1:])]),
}


def _elements(value):
    return to_numpy(list(value)) if isinstance(value, tf.data.Dataset) else [to_numpy(value)]


def _run(kind, fn, episodes, context):
    if kind == "whole" and context == "flat_map":
        return to_numpy(list(tf.data.Dataset.range(1).flat_map(lambda _: fn(episodes))))
    if kind in ("episodes", "whole"):
        if context == "eager":
            return _elements(fn(episodes))
        if context == "tf_function":
            return _elements(tf.function(fn)(episodes))
        per_episode = lambda e: fn(tf.data.Dataset.from_tensors(e))  # noqa: E731
    else:
        per_episode = fn
    if context == "eager":
        return [x for e in episodes for x in _elements(per_episode(e))]
    if context == "tf_function":
        traced = tf.function(per_episode)
        return [x for e in episodes for x in _elements(traced(e))]

    def as_dataset(e):
        value = per_episode(e)
        return value if isinstance(value, tf.data.Dataset) else tf.data.Dataset.from_tensors(value)
    return to_numpy(list(episodes.flat_map(as_dataset)))


@pytest.mark.slow
@pytest.mark.parametrize("context", ["eager", "flat_map", "tf_function"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_transformation_on_image_episodes(tfrecord_dir, reference, name, context):
    kind, fn, expected = CASES[name]
    got = _run(kind, fn, rlds.load(tfrecord_dir, "train"), context)
    assert_nested_equal(got, expected(reference))


@pytest.mark.parametrize("context", ["eager", "tf_function"])
def test_mean_and_std_of_camera_frames_equal_numpy(tfrecord_dir, reference, context):
    """uint8 frames summed over a dataset: in their own dtype they would wrap around at 255."""
    def stats(episodes):
        return T.mean_and_std(episodes, T.sar_fields_mask)
    if context == "tf_function":
        stats = tf.function(stats)
    mean, std = stats(rlds.load(tfrecord_dir, "train"))
    steps = _stack(_flat_steps(reference))
    valid = ~steps["is_last"]
    for path, values in [(("observation", "image"), steps["observation"]["image"]),
                         (("observation", "wrist_image"), steps["observation"]["wrist_image"]),
                         (("observation", "state"), steps["observation"]["state"]),
                         (("action",), steps["action"][valid]), (("reward",), steps["reward"][valid])]:
        got_mean, got_std = mean, std
        for key in path:
            got_mean, got_std = got_mean[key], got_std[key]
        values = values.astype(np.float64)
        np.testing.assert_allclose(np.asarray(got_mean), values.mean(0), rtol=1e-6, atol=1e-6, err_msg=str(path))
        np.testing.assert_allclose(np.asarray(got_std), values.std(0, ddof=1), rtol=1e-5, atol=1e-5,
                                   err_msg=str(path))


def test_mean_and_std_names_a_text_field():
    steps = {"text": tf.constant([b"a", b"b"]), "is_last": tf.constant([False, True])}
    episodes = tf.data.Dataset.from_tensors({"steps": tf.data.Dataset.from_tensor_slices(steps)})
    with pytest.raises(TypeError, match=r"field 'text' holds strings \(tf.string\), which have no mean"):
        T.mean_and_std(episodes, lambda s: ({"text": s["text"]}, {"text": True}))


@pytest.mark.parametrize("context", ["eager", "tf_function"])
def test_uniform_and_zeros_from_an_image_step_spec(tfrecord_dir, context):
    spec = T.step_spec(rlds.load(tfrecord_dir, "train"))

    def uniform():
        return T.uniform_from_spec(spec, 0, 256, seed=4)

    def zeros():
        return T.zeros_from_spec(spec)
    if context == "tf_function":
        uniform, zeros = tf.function(uniform), tf.function(zeros)
    values = to_numpy(uniform())
    image = values["observation"]["image"]
    assert image.dtype == np.uint8 and image.shape == (128, 128, 3)
    assert len(np.unique(image)) > 200  # drawn over the whole byte range
    assert values["language_instruction"] == b""
    assert values["is_first"].dtype == bool and values["action"].dtype == np.float32
    assert ((values["action"] >= 0) & (values["action"] < 256)).all()
    expected_zeros = tf.nest.map_structure(
        lambda s: b"" if s.dtype == tf.string else np.zeros(s.shape, s.dtype.as_numpy_dtype), spec)
    assert_nested_equal(to_numpy(zeros()), expected_zeros)


def test_uniform_from_spec_covers_every_integer_width_and_bool():
    spec = {"u8": tf.TensorSpec([4000], tf.uint8), "i16": tf.TensorSpec([4000], tf.int16),
            "flag": tf.TensorSpec([4000], tf.bool)}
    values = to_numpy(T.uniform_from_spec(spec, 3, 7, seed=2))
    assert values["u8"].dtype == np.uint8 and set(values["u8"]) == {3, 4, 5, 6}
    assert values["i16"].dtype == np.int16 and set(values["i16"]) == {3, 4, 5, 6}
    assert values["flag"].dtype == bool and set(values["flag"]) == {False, True}


# --- Frames whose size varies ----------------------------------------------------------------------------------


def _write_variable_size_frames(directory, sizes_per_episode):
    """Episodes whose `observation/image` (an Image of unknown height and width) has the given (H, W) per step."""
    from rlds_tf.tfds import EpisodeWriter

    config = tfds.rlds.rlds_base.DatasetConfig(
        name="variable_frames",
        observation_info=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(None, None, 3), encoding_format="png"),
            "state": tfds.features.Tensor(shape=(2,), dtype=np.float32)}),
        action_info=tf.int64, reward_info=tf.float32, discount_info=tf.float32,
        step_metadata_info={"language_instruction": tfds.features.Text()})
    with EpisodeWriter(directory, config, max_episodes_per_file=1) as writer:
        for e, sizes in enumerate(sizes_per_episode):
            last = len(sizes) - 1
            writer.add_episode({"steps": [{
                "observation": {"image": np.full((h, w, 3), 10 * e + t, np.uint8),
                                "state": np.float32([e, t])},
                "action": t, "reward": np.float32(t == last), "discount": np.float32(1),
                "is_first": t == 0, "is_last": t == last, "is_terminal": False,
                "language_instruction": f"episode {e}"} for t, (h, w) in enumerate(sizes)]})
    return directory


def test_load_steps_decodes_frames_of_varying_size_step_by_step(tmp_path):
    directory = _write_variable_size_frames(str(tmp_path), [[(4, 5), (6, 3), (2, 2)], [(3, 3), (5, 4)]])
    expected = _flat_steps(_tfds_episodes(directory))
    assert [s["observation"]["image"].shape[:2] for s in expected] == [(4, 5), (6, 3), (2, 2), (3, 3), (5, 4)]
    assert_nested_equal(to_numpy(list(rlds.load_steps(directory, "train"))), expected)


def test_load_steps_batches_frames_of_one_size_declared_variable(tmp_path):
    directory = _write_variable_size_frames(str(tmp_path), [[(4, 5)] * 3, [(4, 5)] * 2])
    steps = _flat_steps(_tfds_episodes(directory))
    got = to_numpy(list(rlds.load_steps(directory, "train", batch_size=2)))
    assert_nested_equal(got, [_stack(steps[0:2]), _stack(steps[2:4]), _stack(steps[4:5])])
