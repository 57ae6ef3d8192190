"""Loading: by directory / several directories / TFDS name, splits, pass-through options, both file formats,
the stacked and flat fast paths, the rlds.tfds writer helpers, and precise errors for bad input."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import tree

import rlds_tf as rlds
from rlds_tf.tfds import EpisodeWriter
from rlds_tf.tfds import extract_feature_from_data
from rlds_tf.tfds import generate_config_from_spec

from dataset_testlib import assert_nested_equal, to_numpy


def _episode(index, length):
    """A hand-made episode: values are functions of (episode, step) so expectations are easy to state."""
    t = np.arange(length)
    return {
        "steps": {
            "observation": {"image": (np.arange(4 * 4 * 3).reshape(1, 4, 4, 3) + index + t[:, None, None, None])
                            .astype(np.uint8),
                            "vec": np.stack([t, t * 2], axis=1).astype(np.float32) + index},
            "action": (t + index).astype(np.int64),
            "reward": (t * 0.5).astype(np.float32),
            "discount": np.float32(t < length - 1),
            "is_first": t == 0, "is_last": t == length - 1, "is_terminal": t == length - 1,
            "step_note": t.astype(np.int32) * 10,
        },
        "episode_id": np.int64(index),
    }


def _config(name="toy"):
    return tfds.rlds.rlds_base.DatasetConfig(
        name=name,
        observation_info={"image": tfds.features.Image(shape=(4, 4, 3), encoding_format="png"),
                          "vec": tfds.features.Tensor(shape=(2,), dtype=tf.float32,
                                                      encoding=tfds.features.Encoding.ZLIB)},
        action_info=tf.int64, reward_info=tf.float32, discount_info=tf.float32,
        step_metadata_info={"step_note": tf.int32}, episode_metadata_info={"episode_id": tf.int64})


TRAIN = [_episode(i, 3 + i) for i in range(5)]
TEST = [_episode(100 + i, 2) for i in range(2)]


def _write(directory, file_format, episodes=(("train", TRAIN), ("test", TEST)), max_per_file=2, name="toy"):
    writer = EpisodeWriter(str(directory), _config(name), max_episodes_per_file=max_per_file,
                           split_name=[s for s, _ in episodes], file_format=file_format)
    for split, eps in episodes:
        for episode in eps:
            writer.add_episode_to_split(episode, split)
    writer.close()
    return str(directory)


@pytest.fixture(scope="module", params=["tfrecord", "array_record"])
def dataset_dir(request, tmp_path_factory):
    return _write(tmp_path_factory.mktemp(request.param), request.param)


def _unstack(stacked_steps):
    length = len(stacked_steps["action"])
    return [tree.map_structure(lambda x, i=i: x[i], stacked_steps) for i in range(length)]


def _expected(episodes):
    return [{"steps": _unstack(e["steps"]), "episode_id": e["episode_id"]} for e in episodes]


@pytest.mark.parametrize("split, expected", [
    ("train", TRAIN),
    ("test", TEST),
    ("train[:2]", TRAIN[:2]),
    ("train[1:3]+test", TRAIN[1:3] + TEST),
    ("train[-40%:]", TRAIN[3:]),
])
def test_load_values_and_split_expressions(dataset_dir, split, expected):
    assert_nested_equal(rlds.load(dataset_dir, split=split), _expected(expected))


def test_load_all_splits_and_list(dataset_dir):
    by_split = rlds.load(dataset_dir)
    assert sorted(by_split) == ["test", "train"]
    assert_nested_equal(by_split["test"], _expected(TEST))
    train, test = rlds.load(dataset_dir, split=["train", "test"])
    assert_nested_equal(test, _expected(TEST))
    assert len(to_numpy(rlds.load(dataset_dir, split="all"))) == 7


def test_load_result_is_what_tfds_gives(tmp_path):
    directory = _write(tmp_path, "tfrecord")
    ours = rlds.load(directory, split="train")
    theirs = tfds.builder_from_directory(directory).as_dataset(split="train")
    assert ours.element_spec == theirs.element_spec
    assert isinstance(ours.element_spec["steps"], tf.data.DatasetSpec)
    assert_nested_equal(ours, theirs)
    assert rlds.is_valid_rlds_dataset(ours)


@pytest.mark.skipif(
    tuple(int(p) for p in tfds.__version__.split(".")[:3] if p.isdigit()) < (4, 9, 5),
    reason="the oracle, TFDS < 4.9.5's as_data_source, cannot decode nested Dataset features")
def test_array_record_matches_tfds_data_source(tmp_path):
    directory = _write(tmp_path, "array_record")
    # No PIL/OpenCV here for TFDS's numpy image decoding: both sides keep the PNG bytes.
    skip_image = {"steps": {"observation": {"image": tfds.decode.SkipDecoding()}}}
    source = tfds.builder_from_directory(directory).as_data_source(split="train", decoders=skip_image)
    from_source = [source[i] for i in range(len(source))]
    loaded = to_numpy(rlds.load(directory, split="train", decoders=skip_image))
    assert len(loaded) == len(from_source) == 5
    for ours, theirs in zip(loaded, from_source):
        assert int(ours["episode_id"]) == int(theirs["episode_id"])
        steps = theirs["steps"]
        assert_nested_equal(ours["steps"], [steps[i] for i in range(len(steps))])


def test_stacked_and_flat_paths_equal_nested(dataset_dir):
    nested = rlds.load(dataset_dir, split="train")
    stacked = to_numpy(rlds.load_stacked(dataset_dir, "train"))
    for got, want in zip(stacked, to_numpy(nested)):
        assert_nested_equal(got["episode_id"], want["episode_id"])
        assert_nested_equal(got["steps"], tree.map_structure(lambda *xs: np.stack(xs), *want["steps"]))
    assert_nested_equal(stacked, [dict(e, steps=e["steps"]) for e in TRAIN])
    flat = rlds.load_steps(dataset_dir, "train")
    assert_nested_equal(flat, nested.flat_map(lambda e: e["steps"]))
    for batch_size, drop in ((4, False), (4, True), (1, False), (100, False)):
        assert_nested_equal(rlds.load_steps(dataset_dir, "train", batch_size=batch_size, drop_remainder=drop),
                            nested.flat_map(lambda e: e["steps"]).batch(batch_size, drop_remainder=drop))


def test_several_directories_merged(tmp_path):
    first = _write(tmp_path / "a", "tfrecord", episodes=(("train", TRAIN[:2]),))
    second = _write(tmp_path / "b", "tfrecord", episodes=(("train", TRAIN[2:]),))
    merged = to_numpy(rlds.load([first, second], split="train"))
    assert sorted(int(e["episode_id"]) for e in merged) == [0, 1, 2, 3, 4]


def test_shuffle_files_read_config_and_decoders_pass_through(tmp_path):
    directory = _write(tmp_path, "tfrecord", max_per_file=1)
    config = tfds.ReadConfig(shuffle_seed=3, interleave_cycle_length=1)
    ids = [int(e["episode_id"]) for e in rlds.load(directory, split="train", shuffle_files=True,
                                                    read_config=config)]
    theirs = [int(e["episode_id"]) for e in tfds.builder_from_directory(directory).as_dataset(
        split="train", shuffle_files=True, read_config=tfds.ReadConfig(shuffle_seed=3, interleave_cycle_length=1))]
    assert ids == theirs and sorted(ids) == [0, 1, 2, 3, 4]
    skip = rlds.load(directory, split="train[:1]",
                     decoders={"steps": {"observation": {"image": tfds.decode.SkipDecoding()}}})
    (episode,) = to_numpy(skip)
    png = episode["steps"][0]["observation"]["image"]
    assert isinstance(png, bytes) and png.startswith(b"\x89PNG")


def test_load_by_tfds_name():
    with tfds.testing.mock_data(num_examples=2, num_sub_examples=3):
        episodes = to_numpy(rlds.load("d4rl_mujoco_halfcheetah/v2-medium", split="train"))
    assert len(episodes) == 2 and len(episodes[0]["steps"]) == 3


def test_episode_writer_config_from_spec_roundtrip(tmp_path):
    episodes = rlds.load(_write(tmp_path / "src", "tfrecord"), split="train")
    config = generate_config_from_spec(episodes.element_spec, name="copy")
    assert isinstance(config.observation_info["image"], tfds.features.Image)  # RGB (rlds 0.1.8 missed these)
    assert config.observation_info["image"].shape == (4, 4, 3)
    assert sorted(config.step_metadata_info) == ["step_note"]
    assert sorted(config.episode_metadata_info) == ["episode_id"]
    with EpisodeWriter(str(tmp_path / "copy"), config, split_name="train") as writer:
        for episode in episodes:
            writer.add_episode(episode)  # nested steps dataset in, written through TFDS's own encoder
    assert_nested_equal(rlds.load(str(tmp_path / "copy"), split="train"), _expected(TRAIN))


@pytest.mark.parametrize("data, expected", [
    (np.zeros((8, 8, 3), np.uint8), "Image(shape=(8, 8, 3)"),
    (np.zeros((8, 8, 1), np.uint8), "Image(shape=(8, 8, 1)"),
    (np.zeros((8, 8, 3), np.float32), "Tensor(shape=(8, 8, 3), dtype=float32"),
    (np.zeros((3,), np.float32), "Tensor(shape=(3,), dtype=float32"),
    (np.zeros((1,), np.int32), "Tensor(shape=(), dtype=int32)"),  # (1,) squeezed to a scalar, as in rlds
    (np.float64(1), "Tensor(shape=(), dtype=float64)"),
])
def test_extract_feature_from_data(data, expected):
    feature = extract_feature_from_data({"my_image": data}, use_images=True, image_encoding="png")["my_image"]
    assert repr(feature).startswith(expected)


def test_extract_feature_rejects_tuples():
    with pytest.raises(ValueError, match="tuples are not supported"):
        extract_feature_from_data((np.zeros(2),), use_images=False, image_encoding=None)


# -- bad input -----------------------------------------------------------------------------------------

def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"dataset directory .*nope.* does not exist"):
        rlds.load(str(tmp_path / "nope"), split="train")


@pytest.mark.parametrize("name", ["no_such_dataset_xyz", "relative/missing-dir", "foo/bar/1.0.0"])
def test_neither_directory_nor_tfds_name(name):
    with pytest.raises(FileNotFoundError, match=rf"'{name}' is neither an existing dataset directory nor a "
                                                r"registered TFDS dataset name \([^\n]*\)$"):
        rlds.load(name, split="train")


def test_directory_that_is_not_a_dataset(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match=r"not a TFDS dataset directory: missing \['dataset_info.json', "
                                         r"'features.json'\] \(it holds \['notes.txt'\]\)"):
        rlds.load(str(tmp_path), split="train")


@pytest.mark.parametrize("features, error", [
    (tfds.features.FeaturesDict({"x": tf.int64}), r"no 'steps' field \(top-level fields: \['x'\]\)"),
    (tfds.features.FeaturesDict({"steps": tfds.features.Dataset({
        "observation": tf.float32, "action": tf.int64, "reward": tf.float32, "is_first": tf.bool,
        "is_last": tf.bool, "is_terminal": tf.bool})}),
     r"its steps lack the field\(s\) \['steps/discount'\]"),
])
def test_dataset_that_is_not_rlds(tmp_path, features, error):
    info = tfds.core.DatasetInfo(builder=tfds.core.dataset_info.DatasetIdentity(
        name="plain", version=tfds.core.Version("1.0.0"), data_dir=str(tmp_path), module_name=""),
        features=features)
    writer = tfds.core.SequentialWriter(info, 10)
    writer.initialize_splits(["train"])
    writer.close_all()
    with pytest.raises(ValueError, match=error):
        rlds.load(str(tmp_path), split="train")


def test_unknown_split(tmp_path):
    directory = _write(tmp_path, "tfrecord")
    with pytest.raises(ValueError, match=r"unknown split 'valid' in split='train\+valid\[:2\]'; dataset 'toy' "
                                         r"has splits \['test', 'train'\]"):
        rlds.load(directory, split="train+valid[:2]")


def test_metadata_lists_shards_while_open(tmp_path):
    """Each add_episode is listed in dataset_info.json at once (that is what makes a crash lose nothing)."""
    writer = EpisodeWriter(str(tmp_path), _config(), max_episodes_per_file=3)
    for i, episode in enumerate(TRAIN[:4]):
        writer.add_episode(episode)
        info = json.loads((tmp_path / "dataset_info.json").read_text())
        assert sum(int(n) for n in info["splits"][0]["shardLengths"]) == i + 1
        assert len(to_numpy(tfds.builder_from_directory(str(tmp_path)).as_dataset(split="train"))) == i + 1
    writer.close()
    assert [int(n) for n in json.loads((tmp_path / "dataset_info.json").read_text())["splits"][0][
        "shardLengths"]] == [3, 1]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]
