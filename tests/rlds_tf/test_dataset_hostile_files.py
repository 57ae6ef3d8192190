"""Hostile files in a dataset directory: hard links, FIFOs, zlib bombs, and the modes of the files we write.

Each case starts from a recorded 3-episode Catch dataset (shards of 2 and 1 episodes, observation float32[4, 5]
ZLIB-encoded, with the lock file a killed recorder leaves) and plants one file the way an attacker or an
unlucky backup would.
"""
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tensorflow as tf

import rlds_tf as rlds
from proc_testlib import ROOT
from proc_testlib import without_hanging
from rlds_dataset_testlib import SHARD
from rlds_dataset_testlib import appending_writer
from rlds_dataset_testlib import record_catch
from rlds_tf import _stacked_decoding
from rlds_tf import cli
from rlds_tf.recording import Catch
from rlds_tf.recording import tfrecord_files
from rlds_tf.recording import crash_recovery

PRECIOUS = b"precious outside data " * 50


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return record_catch(str(tmp_path_factory.mktemp("clean") / "ds"))


def _copy(clean, tmp_path):
    directory = str(tmp_path / "ds")
    shutil.copytree(clean, directory)
    return directory


def _num_episodes(directory):
    return sum(1 for _ in rlds.load(directory, split="train"))


# --- crash recovery never writes through a hard link ---

def _plant_next_shard_link(directory, tmp_path):
    """An outside file, hard-linked into the dataset as the next (unlisted) shard: no complete record in it."""
    outside = tmp_path / "outside.txt"
    outside.write_bytes(PRECIOUS)
    os.link(outside, os.path.join(directory, SHARD.format(2)))
    return outside, PRECIOUS


def _link_listed_shard_then_cut_it(directory, tmp_path):
    """A `cp -al` style backup of the last listed shard, then a crash cuts a record short in it (both names)."""
    backup = tmp_path / "backup-shard"
    os.link(os.path.join(directory, SHARD.format(1)), backup)
    with open(os.path.join(directory, SHARD.format(0)), "rb") as f:
        start = f.read(37)
    with open(os.path.join(directory, SHARD.format(1)), "ab") as f:
        f.write(start)
    return backup, backup.read_bytes()


@pytest.mark.parametrize("plant, left_alone", [
    (_plant_next_shard_link, SHARD.format(2)),
    (_link_listed_shard_then_cut_it, SHARD.format(1)),
])
def test_recovery_leaves_a_hard_linked_shard_alone(clean, tmp_path, capsys, caplog, plant, left_alone):
    directory = _copy(clean, tmp_path)
    outside, content = plant(directory, tmp_path)
    with open(os.path.join(directory, "dataset_info.json"), "rb") as f:
        info_before = f.read()
    message = rf"left {directory}/{left_alone} alone: it has 2 hard links"

    crash_recovery.recover(directory)
    assert outside.read_bytes() == content and os.stat(outside).st_nlink == 2
    assert re.search(message, caplog.text)
    [(path, why)] = crash_recovery.plan(directory).left_alone
    assert path == os.path.join(directory, left_alone) and re.search(message, why)
    caplog.clear()
    assert cli.main(["recover", directory]) == 1
    assert (f"rlds-tf recover: could not recover {directory}: left 1 shard(s) alone ({left_alone}; the warnings "
            f"above say why)") in capsys.readouterr().err
    assert re.search(message, caplog.text)
    assert outside.read_bytes() == content and os.stat(outside).st_nlink == 2
    with open(os.path.join(directory, "dataset_info.json"), "rb") as f:
        assert f.read() == info_before        # nothing listed from the file left alone
    # An appending recorder would open the next shard with truncation: it refuses instead.
    if left_alone == SHARD.format(2):
        with pytest.raises(ValueError, match=r"00002', shard 2 of split 'train' \(this recorder writes shards "
                                             r"from 2 on\), is a regular file with 2 link"):
            appending_writer(directory)
        assert outside.read_bytes() == content
        assert not tfrecord_files.writer_is_active(directory)
        assert _num_episodes(directory) == 3      # the listed episodes still load
    else:
        with pytest.raises(ValueError, match=rf"killed mid-write.*{message}"):
            rlds.load(directory, split="train")


@pytest.mark.parametrize("plant", [os.symlink, os.link], ids=["symlink", "hard_link"])
def test_an_appending_recorder_never_writes_through_a_later_shard(clean, tmp_path, plant):
    """A link planted past the next shard: the appending recorder would reach it after one shard."""
    directory = _copy(clean, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(PRECIOUS)
    plant(outside, os.path.join(directory, SHARD.format(3)))  # the recorder writes shard 2, then 3
    kind = "symbolic link with 1 link" if plant is os.symlink else "regular file with 2 link"
    with pytest.raises(ValueError, match=rf"cannot append to .*: '.*{SHARD.format(3)}', shard 3 of split 'train' "
                                         rf"\(this recorder writes shards from 2 on\), is a {kind}"):
        with rlds.EnvLogger(Catch(rows=4, seed=5), data_directory=directory, max_episodes_per_file=1,
                            overwrite=False) as env:
            for _ in range(2):
                timestep = env.reset()
                while not timestep.last():
                    timestep = env.step(0)
    assert outside.read_bytes() == PRECIOUS
    assert not tfrecord_files.writer_is_active(directory)
    assert _num_episodes(directory) == 3


def test_recovery_still_repairs_a_shard_with_one_link(clean, tmp_path):
    """The counterpart: the same cut shard without a second link is truncated, and loads."""
    directory = _copy(clean, tmp_path)
    path = os.path.join(directory, SHARD.format(1))
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\x05" * 30)
    assert crash_recovery.recover(directory) is True
    assert os.path.getsize(path) == size
    assert _num_episodes(directory) == 3


# --- nothing in a dataset is opened with a blocking open ---

_FIFO_NAMES = [tfrecord_files.LOCK_FILE, "dataset_info.json", "features.json", SHARD.format(1), SHARD.format(2)]


def _plant_fifo(clean, tmp_path, name):
    directory = _copy(clean, tmp_path)
    path = os.path.join(directory, name)
    if os.path.exists(path):
        os.unlink(path)
    os.mkfifo(path)
    return directory, path


@pytest.mark.parametrize("name", _FIFO_NAMES)
def test_a_fifo_in_a_dataset_is_refused_without_blocking(clean, tmp_path, capsys, name):
    directory, fifo = _plant_fifo(clean, tmp_path, name)
    refused = rf"holds '{re.escape(name)}', a FIFO, not a regular file"
    for loader in (rlds.load, rlds.load_stacked):
        with pytest.raises(ValueError, match=refused):
            without_hanging(lambda: loader(directory, split="train"), fifo)
    assert without_hanging(lambda: cli.main(["info", directory]), fifo) == 1
    assert re.search(refused, capsys.readouterr().err)


@pytest.mark.parametrize("name", _FIFO_NAMES)
def test_recover_and_the_recorder_never_block_on_a_fifo(clean, tmp_path, capsys, name):
    directory, fifo = _plant_fifo(clean, tmp_path, name)
    code = without_hanging(lambda: cli.main(["recover", directory]), fifo)
    if name == "features.json":   # recovery never reads it
        assert code == 0
    else:
        assert code == 1
        assert re.search(rf"{re.escape(name)}'.* is a FIFO, not a regular file", capsys.readouterr().err)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if name == "features.json":   # the recorder never reads it: it writes a new one in its place
        without_hanging(lambda: appending_writer(directory).close(), fifo)
        return
    with pytest.raises(ValueError, match="not a regular file"):
        without_hanging(lambda: appending_writer(directory), fifo)


# --- a zlib bomb is never inflated past the declared shape ---

_BOMB_BYTES = 1 << 30  # what the planted blob inflates to; the field declares 80 bytes per step


def _zlib_bomb(size, chunk=1 << 20):
    """A valid ZLIB stream of `size` zero bytes, built without compressing them all.

    After a full flush the compressor holds no history, so every further chunk of zeros compresses to the
    same bytes: repeat them. The Adler-32 of n zeros is (n mod 65521) << 16 | 1.
    """
    compressor = zlib.compressobj(9)
    first = compressor.compress(bytes(chunk)) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeated = compressor.compress(bytes(chunk)) + compressor.flush(zlib.Z_FULL_FLUSH)
    end = compressor.flush()[:-4]  # the final block, without the checksum of the two chunks
    return first + repeated * (size // chunk - 1) + end + struct.pack(">I", (size % 65521) << 16 | 1)


def _plant_bomb(directory):
    """Rewrites record 0 of shard 0 (valid framing and CRCs) with step 0's observation replaced by a bomb."""
    path = os.path.join(directory, SHARD.format(0))
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    example = tf.train.Example.FromString(records[0])
    blobs = example.features.feature["steps/observation"].bytes_list.value
    blobs[0] = _zlib_bomb(_BOMB_BYTES)
    records[0] = example.SerializeToString()
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    return len(blobs[0])


# Reads the dataset in a fresh process, so its peak RSS before the read is known: the bomb's inflation shows as
# growth there (tracemalloc sees only Python's allocations, not TF's).
_BOMB_READER = """
import json, resource, sys, tracemalloc
import tensorflow as tf
import rlds_tf as rlds
dataset = getattr(rlds, sys.argv[2])(sys.argv[1], "train")
before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
try:
    for _ in dataset:
        pass
    error = None
except tf.errors.OpError as e:
    error = e.message
peak = tracemalloc.get_traced_memory()[1]
growth_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb
print(json.dumps({"error": error, "tracemalloc_peak": peak, "rss_growth": growth_kb * 1024}))
"""


@pytest.mark.parametrize("loader", ["load_stacked", "load_steps"])
def test_a_zlib_bomb_fails_clearly_within_the_declared_size(clean, tmp_path, loader):
    assert zlib.decompress(_zlib_bomb(5 << 20)) == bytes(5 << 20)   # the bomb is a valid stream (checksum too)
    directory = _copy(clean, tmp_path)
    compressed = _plant_bomb(directory)
    assert compressed < _BOMB_BYTES // 500
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", _BOMB_READER, directory, loader], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # Inflating stops at 81 bytes: the reader's memory grows by far less than the bomb.
    assert result["rss_growth"] < _BOMB_BYTES // 4, result
    assert result["tracemalloc_peak"] < _BOMB_BYTES // 64, result
    assert ("steps/observation: step 0 inflates to more than the 80 bytes its declared shape [4, 5] and dtype "
            "float32 hold") in (result["error"] or ""), result["error"]


def _blob(values):
    return zlib.compress(np.asarray(values, dtype="<f4").tobytes())


@pytest.mark.parametrize("blobs, error", [
    ([_blob([1.0, 2.0]), _blob([3.0, 4.0])], None),
    ([_blob([1.0, 2.0, 3.0])], r"step 0 inflates to more than the 8 bytes"),
    ([_blob([1.0, 2.0]), _blob([1.0])], r"step 1 inflates to 4 bytes; its declared shape \[2\] and dtype float32 "
                                        r"hold 8 bytes"),
    ([_blob([1.0, 2.0])[:-3]], r"step 0 inflates to 8 bytes \(the ZLIB stream is cut short\)"),
    ([_blob([1.0, 2.0]) + b"xyz"], r"step 0 inflates to 8 bytes followed by extra data"),
    ([b"not zlib at all"], r"step 0 is not a valid ZLIB stream"),
])
def test_inflate_steps_checks_each_step_against_the_declared_size(blobs, error):
    inflate = _stacked_decoding._inflate_steps  # pylint: disable=protected-access
    args = (np.array(blobs, dtype=object), np.dtype("<f4"), (2,), "obs")
    if error is None:
        np.testing.assert_array_equal(inflate(*args), [[1.0, 2.0], [3.0, 4.0]])
    else:
        with pytest.raises(ValueError, match=r"steps/obs: " + error):
            inflate(*args)


# --- files we write get the mode the umask gives ---

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_dataset_files_get_the_umask_mode_and_recovery_keeps_it(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        directory = record_catch(str(tmp_path / "ds"))
        modes = {name: stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode)
                 for name in os.listdir(directory) if name != tfrecord_files.LOCK_FILE}
        assert set(modes) == {"dataset_info.json", "features.json", SHARD.format(0), SHARD.format(1)}
        assert modes == dict.fromkeys(modes, mode)
        with open(os.path.join(directory, SHARD.format(1)), "ab") as f:   # a record cut short by a crash
            f.write(b"\x05" * 30)
        assert cli.main(["recover", directory]) == 0
        assert not crash_recovery.needs_recovery(directory)
        assert {name: stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode) for name in modes} == modes
    finally:
        os.umask(previous)
