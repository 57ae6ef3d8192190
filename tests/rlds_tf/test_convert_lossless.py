"""`rlds-tf convert` copies the episode records byte for byte: JPEG frames come out exactly as stored."""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import rlds_tf as rlds
from benchmarks import robotics_dataset
from rlds_tf import cli
from stored_records_testlib import stored_records

NUM_EPISODES, EPISODE_LENGTH, PER_SHARD = 5, 3, 2


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("robotics") / "src")
    return robotics_dataset.write(directory, num_episodes=NUM_EPISODES, episode_length=EPISODE_LENGTH,
                                  episodes_per_shard=PER_SHARD)


def _frames(directory):
    """Every step's observation (both cameras decoded), in order."""
    return list(tfds.as_numpy(rlds.load_steps(directory, "train").map(lambda s: s[rlds.OBSERVATION])))


@pytest.mark.parametrize("file_format, per_file, shard_lengths",
                         [("array_record", 3, [3, 2]), ("tfrecord", 4, [4, 1]), ("array_record", 1, [1] * 5)])
def test_convert_copies_the_records_of_an_image_dataset(source, tmp_path, file_format, per_file, shard_lengths):
    destination = str(tmp_path / "dst")
    assert cli.convert(source, destination, file_format, max_episodes_per_file=per_file) == {"train": NUM_EPISODES}
    source_records, _ = stored_records(source)
    records, lengths = stored_records(destination)
    assert lengths == {"train": shard_lengths}
    assert len(records["train"]) == NUM_EPISODES
    assert records["train"] == source_records["train"]  # byte for byte, in order: the JPEGs untouched
    got, expected = _frames(destination), _frames(source)
    assert len(got) == len(expected) == NUM_EPISODES * EPISODE_LENGTH
    for a, b in zip(got, expected):
        for key in ("image", "wrist_image", "state"):
            np.testing.assert_array_equal(a[key], b[key])


def test_a_round_trip_through_array_record_gives_the_source_shards_back(source, tmp_path):
    middle, back = str(tmp_path / "array_record"), str(tmp_path / "back")
    assert cli.main(["convert", source, middle, "--format", "array_record", "--max-episodes-per-file", "3"]) == 0
    assert cli.main(["convert", middle, back, "--format", "tfrecord",
                     "--max-episodes-per-file", str(PER_SHARD)]) == 0
    shards = sorted(n for n in os.listdir(source) if ".tfrecord-" in n)
    assert sorted(n for n in os.listdir(back) if ".tfrecord-" in n) == shards and len(shards) == 3
    for name in shards:
        with open(os.path.join(source, name), "rb") as a, open(os.path.join(back, name), "rb") as b:
            assert a.read() == b.read(), name
    assert stored_records(back) == stored_records(source)


@pytest.mark.parametrize("bad_record", [b"not a tf.train.Example", b""])
def test_convert_refuses_a_record_the_features_cannot_parse(source, tmp_path, capsys, bad_record):
    """A record with intact framing (its CRCs match) that is no episode of these features is not copied."""
    broken = str(tmp_path / "broken")
    shutil.copytree(source, broken)
    shard = os.path.join(broken, "robotics_like-train.tfrecord-00000")
    records = stored_records(source)[0]["train"][:PER_SHARD]
    with tf.io.TFRecordWriter(shard) as writer:
        writer.write(records[0])
        writer.write(bad_record)
    destination = tmp_path / "out" / "dst"
    assert cli.main(["convert", broken, str(destination), "--format", "array_record"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlds-tf convert: split 'train' of 'robotics_like' could not be read: "), err
    assert "\n" not in err
    assert os.listdir(destination.parent) == []  # neither DST nor a partial sibling
