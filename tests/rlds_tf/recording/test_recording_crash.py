"""Crash safety: after `kill -9` at any moment the directory loads and holds every completed episode."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import rlds_tf as rlds
from rlds_tf.recording import crash_recovery
from rlds_tf.recording import tfrecord_files

from dataset_testlib import assert_nested_equal, to_numpy
from proc_testlib import ROOT as _ROOT

_RECORDER = textwrap.dedent("""
    import sys
    from rlds_tf.recording import Catch, EnvLogger
    directory = sys.argv[1]
    with EnvLogger(Catch(seed=1), data_directory=directory, max_episodes_per_file=3) as env:
        e = 0
        while True:  # until killed
            ts = env.reset()
            t = 0
            while not ts.last():
                ts = env.step((e + t) % 3)
                t += 1
            e += 1
            print(e, flush=True)  # the recorder's own count of completed episodes (step() returned LAST)
""")


def _expected_episodes(count):
    """Catch(seed=1) replayed with the recorder's actions, shifted to RLDS steps by hand."""
    from rlds_tf.recording import Catch
    env, episodes = Catch(seed=1), []
    for e in range(count):
        timesteps, actions = [env.reset()], []
        while not timesteps[-1].last():
            actions.append((e + len(actions)) % 3)
            timesteps.append(env.step(actions[-1]))
        n = len(timesteps)
        episodes.append({
            "observation": np.stack([ts.observation for ts in timesteps]),
            "action": np.int64(actions + [0]),
            "reward": np.float64([ts.reward for ts in timesteps[1:]] + [0]),
            "discount": np.float64([ts.discount for ts in timesteps[1:]] + [0]),
            "is_first": np.arange(n) == 0, "is_last": np.arange(n) == n - 1, "is_terminal": np.arange(n) == n - 1,
        })
    return episodes


def _listed_episodes(directory):
    try:
        with open(os.path.join(directory, "dataset_info.json")) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return 0
    return sum(int(n) for split in info.get("splits", []) for n in split.get("shardLengths", []))


@pytest.mark.slow
@pytest.mark.parametrize("min_episodes, extra_delay_s", [(4, 0.0), (7, 0.013)])
def test_kill_9_keeps_every_completed_episode(tmp_path, min_episodes, extra_delay_s):
    directory = str(tmp_path / "ds")
    env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen([sys.executable, "-c", _RECORDER, directory], env=env, cwd=_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reported = []  # completed episodes as the recorder counts them, read as it prints them

    def read_reports():
        for line in proc.stdout:
            if line.strip().isdigit():
                reported.append(int(line))

    reader = threading.Thread(target=read_reports, daemon=True)
    reader.start()
    try:
        deadline = time.time() + 120
        # Waits for the recorder's own report, not for the listing: an episode is listed before `step()`
        # returns and so before it is reported, and a kill in between keeps one episode more than reported.
        while len(reported) < min_episodes:
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "the recorder did not write episodes in time"
            time.sleep(0.002)
        time.sleep(extra_delay_s)
        completed_before_kill = _listed_episodes(directory)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        proc.stdout.close()
    assert not tfrecord_files.writer_is_active(directory)  # the OS released the lock with the process
    assert reported == list(range(1, len(reported) + 1)) and len(reported) >= min_episodes
    loaded = [e["steps"] for e in to_numpy(rlds.load_stacked(directory, "train", recover=True))]
    assert len(loaded) >= completed_before_kill
    # Every episode the recorder completed loads, and nothing else: an episode completed after its last
    # report (killed between `step()` returning LAST and the print) is the only one that may be extra.
    assert len(reported) <= len(loaded) <= len(reported) + 1
    assert_nested_equal(loaded, _expected_episodes(len(loaded)))
    # Plain TFDS reads it too (nothing of ours needed once the directory is consistent).
    assert len(to_numpy(tfds.builder_from_directory(directory).as_dataset(split="train"))) == len(loaded)


def _record(directory, num_episodes, max_per_file):
    from rlds_tf.recording import Catch, EnvLogger
    with EnvLogger(Catch(seed=1), data_directory=directory, max_episodes_per_file=max_per_file) as env:
        for e in range(num_episodes):
            ts, t = env.reset(), 0
            while not ts.last():
                ts = env.step((e + t) % 3)
                t += 1


def _shard(directory, index):
    return os.path.join(directory, f"rlds_dataset-train.tfrecord-{index:05d}")


def _record_bytes(directory, index):
    """The framed bytes of each record of a shard."""
    with open(_shard(directory, index), "rb") as f:
        data = f.read()
    lengths, _ = tfrecord_files.scan_records(_shard(directory, index))
    out, offset = [], 0
    for length in lengths:
        out.append(data[offset:offset + 16 + length])
        offset += 16 + length
    return out


@pytest.mark.parametrize("case", [
    "partial_record_in_open_shard",       # killed inside a write
    "unlisted_complete_record",           # killed between flush and the metadata rename
    "unlisted_new_shard",                 # killed after starting a new shard, before its metadata
    "empty_unlisted_shard",               # killed right after opening a new shard file
    "leftover_tmp_file",                  # killed while writing the new dataset_info.json
])
def test_recover_each_crash_point(tmp_path, case):
    """Builds each on-disk state a kill can leave (from a clean 5-episode recording) and checks the repair."""
    source, directory = str(tmp_path / "src"), str(tmp_path / "ds")
    _record(source, 5, max_per_file=3)  # shards: [3, 2]
    os.makedirs(directory)
    open(os.path.join(directory, tfrecord_files.LOCK_FILE), "w").close()  # what the rlds_tf recorder leaves
    records = _record_bytes(source, 0) + _record_bytes(source, 1)
    with open(os.path.join(source, "features.json")) as src, open(os.path.join(directory, "features.json"), "w") as dst:
        dst.write(src.read())
    with open(os.path.join(source, "dataset_info.json")) as f:
        info = json.load(f)

    def write_state(shard_lengths, shard_contents):
        state = dict(info, splits=[dict(info["splits"][0], shardLengths=[str(n) for n in shard_lengths],
                                        numBytes=str(sum(len(r) - 16 for r in records[:sum(shard_lengths)])))])
        with open(os.path.join(directory, "dataset_info.json"), "w") as f:
            f.write(json.dumps(state))
        for i, content in enumerate(shard_contents):
            with open(_shard(directory, i), "wb") as f:
                f.write(content)

    first, second = b"".join(records[:3]), records[3:]
    if case == "partial_record_in_open_shard":
        write_state([3, 1], [first, second[0] + second[1][:37]])
        expected = 4
    elif case == "unlisted_complete_record":
        write_state([3, 1], [first, second[0] + second[1]])
        expected = 5
    elif case == "unlisted_new_shard":
        write_state([3], [first, second[0] + second[1][:-3]])
        expected = 4
    elif case == "empty_unlisted_shard":
        write_state([3], [first, b""])
        expected = 3
    else:
        write_state([3, 2], [first, b"".join(second)])
        with open(os.path.join(directory, ".tmp-abc.json"), "w") as f:
            f.write('{"half": ')
        expected = 5
    needs = crash_recovery.needs_recovery(directory)
    assert needs == (case != "leftover_tmp_file")
    loaded = [e["steps"] for e in to_numpy(rlds.load_stacked(directory, "train", recover=True))]
    assert_nested_equal(loaded, _expected_episodes(expected))
    assert not crash_recovery.needs_recovery(directory)
    assert len(to_numpy(tfds.builder_from_directory(directory).as_dataset(split="train"))) == expected
    if case == "empty_unlisted_shard":
        assert not os.path.exists(_shard(directory, 1))


def test_recover_refuses_while_a_writer_is_active(tmp_path):
    from rlds_tf.recording import TFDSBackendWriter
    config = tfds.rlds.rlds_base.DatasetConfig(name="x", observation_info=tf.float32, action_info=tf.int64,
                                               reward_info=tf.float64, discount_info=tf.float64)
    writer = TFDSBackendWriter(str(tmp_path), config)
    with pytest.raises(RuntimeError, match="a recorder is still writing"):
        crash_recovery.recover(str(tmp_path))
    writer.close()
    assert crash_recovery.recover(str(tmp_path)) is False




def test_foreign_directories_are_only_recovered_on_request(tmp_path):
    """load() repairs only rlds_tf recordings; another writer's directory needs an explicit recover()."""
    directory = str(tmp_path)
    _record(directory, 4, max_per_file=3)
    assert not os.path.exists(os.path.join(directory, tfrecord_files.LOCK_FILE))  # a clean close removes it
    with open(os.path.join(directory, "dataset_info.json")) as f:
        info = json.load(f)
    info["splits"][0]["shardLengths"] = ["3"]  # as envlogger leaves it: the open shard is not listed
    with open(os.path.join(directory, "dataset_info.json"), "w") as f:
        json.dump(info, f)
    assert len(to_numpy(rlds.load(directory, split="train"))) == 3
    assert crash_recovery.needs_recovery(directory)
    assert crash_recovery.recover(directory)
    loaded = [e["steps"] for e in to_numpy(rlds.load_stacked(directory, "train"))]
    assert_nested_equal(loaded, _expected_episodes(4))


def test_overwrite_removes_old_shards_so_recovery_cannot_pick_them_up(tmp_path):
    directory = str(tmp_path)
    _record(directory, 5, max_per_file=2)  # shards 0, 1, 2
    _record(directory, 1, max_per_file=2)  # overwrite: shard 0 only
    assert sorted(f for f in os.listdir(directory) if ".tfrecord-" in f) == ["rlds_dataset-train.tfrecord-00000"]
    assert not crash_recovery.needs_recovery(directory)
    assert len(to_numpy(rlds.load(directory, split="train"))) == 1
