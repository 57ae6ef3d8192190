"""Reading datasets never writes, crash recovery stays inside the dataset, and broken inputs fail clearly.

Hostile directories are built from a clean 3-episode recording (shards of 2 and 1 episodes) by editing its
files the way a crash or an attacker would.
"""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

import rlds_tf as rlds
import rlds_dataset_testlib
from rlds_tf import cli
from rlds_tf.recording import tfrecord_files
from rlds_tf.recording import crash_recovery

SHARD = rlds_dataset_testlib.SHARD


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A recorded Catch dataset: 3 episodes in shards [2, 1], with the lock file a killed recorder leaves."""
    return rlds_dataset_testlib.record_catch(str(tmp_path_factory.mktemp("clean") / "ds"))


def _copy(clean, tmp_path, name="ds"):
    directory = str(tmp_path / name)
    shutil.copytree(clean, directory)
    return directory


def _snapshot(root):
    """{relative path: sha256} of every file under `root` (symlinks by their target path)."""
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                out[os.path.relpath(path, root)] = "link:" + os.readlink(path)
            else:
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _cut_last_shard(directory):
    """What a kill inside a write leaves: the start of a record after the last complete one."""
    with open(os.path.join(directory, SHARD.format(0)), "rb") as f:
        start = f.read(37)
    with open(os.path.join(directory, SHARD.format(1)), "ab") as f:
        f.write(start)


def _edit_info(directory, **split_fields):
    path = os.path.join(directory, "dataset_info.json")
    with open(path) as f:
        info = json.load(f)
    info["splits"][0].update(split_fields)
    with open(path, "w") as f:
        json.dump(info, f)


def _num_episodes(directory, **kwargs):
    return sum(1 for _ in rlds.load(directory, split="train", **kwargs))


# --- reading never writes; recovery only on request ---

def test_loading_a_crashed_recording_writes_nothing_and_says_to_recover(clean, tmp_path):
    directory = _copy(clean, tmp_path)
    _cut_last_shard(directory)
    before = _snapshot(str(tmp_path))
    with pytest.raises(ValueError, match=r"killed mid-write: shard\(s\) \['rlds_dataset-train.tfrecord-00001'\].*"
                                         r"rlds_tf.recording.recover\("):
        rlds.load(directory, split="train")
    assert cli.main(["info", directory]) == 1
    assert _snapshot(str(tmp_path)) == before
    # Recovery on request: the cut record goes, every complete episode loads.
    assert cli.main(["recover", directory]) == 0
    assert os.path.getsize(os.path.join(directory, SHARD.format(1))) == os.path.getsize(
        os.path.join(clean, SHARD.format(1)))
    assert _num_episodes(directory) == 3
    assert cli.main(["recover", directory]) == 0 and not crash_recovery.needs_recovery(directory)


def test_load_with_recover_true_repairs_first(clean, tmp_path):
    directory = _copy(clean, tmp_path)
    _cut_last_shard(directory)
    assert _num_episodes(directory, recover=True) == 3


def test_readable_crash_leftovers_load_the_listed_episodes_without_writing(clean, tmp_path):
    directory = _copy(clean, tmp_path)
    _edit_info(directory, shardLengths=["2"])        # killed before the metadata listed shard 1
    before = _snapshot(directory)
    assert crash_recovery.needs_recovery(directory)
    assert _num_episodes(directory) == 2
    assert _snapshot(directory) == before
    assert crash_recovery.recover(directory)
    assert _num_episodes(directory) == 3


@pytest.mark.parametrize("template", [
    "../victim-{SHARD_INDEX}",
    "{ABSOLUTE}/victim-{SHARD_INDEX}",
    "sub/../../victim-{SHARD_INDEX}",
])
def test_recovery_never_touches_files_outside_the_dataset(clean, tmp_path, template):
    directory = _copy(clean, tmp_path)
    victim = tmp_path / "victim-00001"                 # what the template names for the last shard
    victim.write_bytes(b"precious " * 100)
    template = template.replace("{ABSOLUTE}", str(tmp_path))
    _edit_info(directory, filepathTemplate=template)
    before = _snapshot(str(tmp_path))
    with pytest.raises(ValueError, match=r"not a file directly inside the dataset directory"):
        crash_recovery.recover(directory)
    with pytest.raises(ValueError, match=r"not a file directly inside the dataset directory"):
        rlds.load(directory, split="train")
    assert cli.main(["info", directory]) == 1
    assert cli.main(["recover", directory]) == 1
    assert _snapshot(str(tmp_path)) == before


def test_recovery_refuses_a_shard_that_links_outside(clean, tmp_path):
    directory = _copy(clean, tmp_path)
    victim = tmp_path / "victim"
    with open(os.path.join(clean, SHARD.format(1)), "rb") as f:
        victim.write_bytes(f.read() + b"\x99" * 40)
    os.unlink(os.path.join(directory, SHARD.format(1)))
    os.symlink(victim, os.path.join(directory, SHARD.format(1)))
    before = _snapshot(str(tmp_path))
    with pytest.raises(ValueError, match="not a file directly inside"):
        crash_recovery.recover(directory)
    assert _snapshot(str(tmp_path)) == before
    np.testing.assert_equal(victim.stat().st_size, os.path.getsize(os.path.join(clean, SHARD.format(1))) + 40)


# --- partial outputs and unreadable inputs ---

def _corrupt_record(directory, shard, record):
    """Flips one data byte of `record` in `shard`: its CRC no longer matches."""
    path = os.path.join(directory, SHARD.format(shard))
    lengths, _ = tfrecord_files.scan_records(path)
    offset = sum(12 + n + 4 for n in lengths[:record]) + 12 + lengths[record] // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _one_line_error(capsys):
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("dst_exists", [False, True])
def test_convert_of_a_corrupt_source_leaves_no_destination(clean, tmp_path, capsys, dst_exists):
    source = _copy(clean, tmp_path, "src")
    _corrupt_record(source, shard=0, record=1)
    dst = tmp_path / "out" / "dst"
    if dst_exists:
        dst.mkdir(parents=True)
    assert cli.main(["convert", source, str(dst), "--format", "tfrecord"]) == 1
    err = _one_line_error(capsys)
    assert err.startswith("rlds-tf convert: split 'train' of 'rlds_dataset' is unreadable: shard ")
    assert f"{SHARD.format(0)}': record 1: corrupted record at " in err
    assert os.path.exists(dst) == dst_exists and (not dst_exists or not os.listdir(dst))
    assert os.listdir(dst.parent) == (["dst"] if dst_exists else [])   # no partial sibling left behind


def test_convert_renames_a_complete_destination(clean, tmp_path, capsys):
    dst = tmp_path / "dst"
    assert cli.main(["convert", clean, str(dst), "--format", "array_record"]) == 0
    assert os.listdir(tmp_path) == ["dst"]
    assert "partial" not in (dst / "dataset_info.json").read_text()
    assert _num_episodes(str(dst)) == 3


def test_info_on_a_truncated_shard_names_it_in_one_line(clean, tmp_path, capsys):
    directory = _copy(clean, tmp_path)
    os.unlink(os.path.join(directory, tfrecord_files.LOCK_FILE))   # not a crashed rlds_tf recording
    path = os.path.join(directory, SHARD.format(1))
    os.truncate(path, os.path.getsize(path) - 10)
    assert cli.main(["info", directory]) == 1
    err = _one_line_error(capsys)
    assert err.startswith("rlds-tf info: split 'train' of 'rlds_dataset' is unreadable: shard ")
    assert f"{SHARD.format(1)}': record 0: truncated record at 0" in err


def _add_feature(directory, *path):
    features_path = os.path.join(directory, "features.json")
    with open(features_path) as f:
        features = json.load(f)
    node = features["featuresDict"]["features"]
    if path[0] == "steps":
        node = node["steps"]["sequence"]["feature"]["featuresDict"]["features"]
    node[path[-1]] = {"pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
                      "tensor": {"dtype": "float32", "encoding": "none", "shape": {}}}
    with open(features_path, "w") as f:
        json.dump(features, f)


@pytest.mark.parametrize("path, field", [(("steps", "extra"), "steps/extra"), (("meta",), "meta")])
@pytest.mark.parametrize("loader", [rlds.load, rlds.load_stacked, rlds.load_steps])
def test_features_the_records_lack_are_named(clean, tmp_path, path, field, loader):
    directory = _copy(clean, tmp_path)
    _add_feature(directory, *path)
    with pytest.raises(ValueError, match=rf"features.json declares field\(s\) \['{field}'\] but the records lack "
                                         rf"them \(record 0 of '.*{SHARD.format(0)}', split 'train'"):
        loader(directory, split="train")


def test_appending_writer_refuses_a_hostile_template_and_releases_the_lock(clean, tmp_path):
    directory = _copy(clean, tmp_path)
    victim = tmp_path / "victim-00001"   # looks like a shard with a cut record: recovery would truncate it
    with open(os.path.join(clean, SHARD.format(1)), "rb") as f:
        victim.write_bytes(f.read() + b"\x99" * 40)
    _edit_info(directory, filepathTemplate="../victim-{SHARD_INDEX}")
    before = _snapshot(str(tmp_path))
    with pytest.raises(ValueError, match="not a file directly inside the dataset directory"):
        rlds_dataset_testlib.appending_writer(directory)
    assert _snapshot(str(tmp_path)) == before
    assert not tfrecord_files.writer_is_active(directory)


def _set_splits(directory, splits):
    path = os.path.join(directory, "dataset_info.json")
    with open(path) as f:
        info = json.load(f)
    info["splits"] = splits
    with open(path, "w") as f:
        json.dump(info, f)


@pytest.mark.parametrize("splits, message", [
    ([{"name": "train", "filepathTemplate": ["x"], "shardLengths": ["2", "1"]}], "is malformed"),
    (["train"], "is malformed"),
    ([{"name": "train", "shardLengths": ["2", "x"]}], "invalid literal"),
])
def test_a_malformed_dataset_info_is_a_value_error(clean, tmp_path, splits, message):
    directory = _copy(clean, tmp_path)
    _cut_last_shard(directory)
    _set_splits(directory, splits)
    before = _snapshot(str(tmp_path))
    with pytest.raises(ValueError, match=message):
        crash_recovery.recover(directory)
    assert _snapshot(str(tmp_path)) == before
