"""A restart restores the checkpoint written last: periodic checkpoints follow their own interval, and the
restore orders checkpoints by the sequence number they record, not by their folder names."""
import datetime
import json
import logging
import os
import re
import shutil
import signal
import struct
import threading
import time
import types
import zlib

import numpy as np
import pytest
from google.protobuf import wrappers_pb2

import proc_testlib
import replay_tf as reverb
from replay_tf import checkpointing
from replay_tf import cli


def _table(name="t"):
    return reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                        reverb.rate_limiters.MinSize(1))


# --- periodic checkpoints ---

@pytest.mark.slow  # two server processes
def test_periodic_checkpoints_do_not_wait_for_the_stats_interval(tmp_path):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "t", "sampler": "uniform", "remover": "fifo",
                                              "max_size": 100, "rate_limiter": {"min_size": 1}}]}))
    port = proc_testlib.free_port()
    args = ["--config", str(config), "--port", str(port), "--checkpoint-dir", str(tmp_path / "checkpoints"),
            "--checkpoint-interval", "1", "--stats-interval", "3600"]
    server = proc_testlib.ServeProcess(*args)
    try:
        server.wait_for(r"^replay-tf: serving tables")
        client = reverb.Client(f"localhost:{port}")
        for value in range(3):
            client.insert([np.float32(value)], priorities={"t": 1.0})
        time.sleep(3)  # a few checkpoint intervals, far less than one stats interval
        server.wait_for(r"^checkpoint: ", timeout_s=10)
        server.proc.send_signal(signal.SIGKILL)  # no exit checkpoint: only the periodic ones count
        server.proc.wait(30)
    finally:
        server.kill()

    restarted = proc_testlib.ServeProcess(*args)
    try:
        serving = restarted.wait_for(r"^replay-tf: serving tables.*")
        # The line names the checkpoint restored, not only the folder.
        assert re.search(r"restored from .*checkpoints/\d{8}T\d{6}\.\d{6}Z_*: \{'t': 3\}", serving.group(0)), \
            serving.group(0)
        values = sorted(float(np.asarray(s.data[0]).item()) for s in
                        reverb.Client(f"localhost:{port}").sample("t", num_samples=30, emit_timesteps=False))
        assert set(values) == {0.0, 1.0, 2.0}
        assert restarted.stop(signal.SIGTERM) == 0
    finally:
        restarted.kill()


@pytest.mark.parametrize("option, value", [
    ("--checkpoint-interval", "0"), ("--checkpoint-interval", "-1"), ("--checkpoint-interval", "nan"),
    ("--checkpoint-interval", "inf"), ("--stats-interval", "nan"), ("--stats-interval", "inf"),
])
def test_serve_refuses_an_interval_that_is_not_a_positive_number(tmp_path, monkeypatch, capsys, option, value):
    # 0 would turn periodic checkpoints off, a negative one checkpoint without pause, NaN wake the loop without
    # pause, and infinity overflow the wait.
    monkeypatch.setattr(cli, "serve", lambda args: pytest.fail(f"serve ran with {option} {value}"))
    argv = ["serve", "--config", str(tmp_path / "tables.json"), "--checkpoint-dir", str(tmp_path), option, value]
    assert cli.main(argv) == 2
    assert f"replay-tf serve: {option} ({float(value)}) must be a finite number > 0" in capsys.readouterr().err


def test_a_periodic_checkpoint_the_checkpointer_refuses_is_reported_and_serving_goes_on(tmp_path, capsys):
    root = str(tmp_path)
    server = reverb.Server([_table()], checkpointer=checkpointing.DirectoryCheckpointer(root))
    try:
        planted = server.checkpoint()
        with open(os.path.join(planted, "DONE"), "wb") as f:  # no later checkpoint can be numbered
            payload = wrappers_pb2.Int64Value(value=2 ** 63 - 1).SerializeToString()
            f.write(struct.pack("<QI", len(payload), zlib.crc32(payload)) + payload)
        stop, errors = threading.Event(), []

        def serve():
            try:
                cli.run_until_stopped(server, stop, stats_interval=3600, checkpoint_interval=0.05)
            except BaseException as e:  # noqa: BLE001  (reported by the assertion below)
                errors.append(e)

        loop = threading.Thread(target=serve, daemon=True)
        loop.start()
        deadline, err = time.monotonic() + 30, ""
        while err.count("checkpoint failed") < 2 and loop.is_alive():
            assert time.monotonic() < deadline, f"no two failed checkpoints reported: {err!r}"
            time.sleep(0.05)
            err += capsys.readouterr().err
        alive = loop.is_alive()
        stop.set()
        loop.join(30)
    finally:
        server.stop()
    assert alive and not errors, errors
    assert re.search(r"replay-tf: checkpoint failed, the previous checkpoint stays: CheckpointError: cannot number "
                     r"a checkpoint after .*9223372036854775807", err), err
    assert os.listdir(root) == [os.path.basename(planted)]


# --- which checkpoint a restart restores ---

def _step_clock_back(monkeypatch, days):
    """The checkpointer's UTC clock reads `days` behind the real one (an NTP step, a restored VM snapshot)."""
    real = datetime.datetime

    class Stepped(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return real.now(tz) - datetime.timedelta(days=days)

    monkeypatch.setattr(checkpointing, "datetime", types.SimpleNamespace(datetime=Stepped,
                                                                         timezone=datetime.timezone))


def _operator_copy(root, first):
    shutil.copytree(first, os.path.join(root, "before-upgrade"))
    return "before-upgrade"


def _stray_done_folder(root, first):
    os.makedirs(os.path.join(root, "stray"))
    open(os.path.join(root, "stray", "DONE"), "wb").close()
    return "stray"


def _unsequenced_copy_under_a_later_name(root, first):
    # As a writer without sequence numbers leaves a checkpoint: an empty DONE file.
    name = "29991231T000000.000000Z"
    shutil.copytree(first, os.path.join(root, name))
    open(os.path.join(root, name, "DONE"), "wb").close()
    return name


def _corrupt_done_under_a_later_name(root, first):
    name = "29991231T000000.000000Z"
    shutil.copytree(first, os.path.join(root, name))
    with open(os.path.join(root, name, "DONE"), "r+b") as f:
        f.truncate(5)  # not a whole record: the folder is left alone
    return name


def _values(server):
    return sorted(float(item.column_arrays()[0][0]) for item in server.tables["t"].items_snapshot())


@pytest.mark.parametrize("beside", [None, _operator_copy, _stray_done_folder, _unsequenced_copy_under_a_later_name,
                                    _corrupt_done_under_a_later_name],
                         ids=["clock_step", "operator_copy", "stray_done_folder", "unsequenced_later_name",
                              "corrupt_done_later_name"])
def test_restore_takes_the_checkpoint_written_last(tmp_path, monkeypatch, caplog, beside):
    root = str(tmp_path)
    server = reverb.Server([_table()], checkpointer=checkpointing.DirectoryCheckpointer(root))
    client = server.localhost_client()
    client.insert([np.float32(0.0)], priorities={"t": 1.0})
    first = server.checkpoint()
    other = beside(root, first) if beside else None
    _step_clock_back(monkeypatch, days=1)
    client.insert([np.float32(1.0)], priorities={"t": 1.0})
    last = server.checkpoint()
    server.stop()
    assert os.path.basename(last) < os.path.basename(first)  # the stepped clock named it earlier
    checkpointer = checkpointing.DirectoryCheckpointer(root)
    with caplog.at_level(logging.INFO, logger=checkpointing.__name__):
        restored = reverb.Server([_table()], checkpointer=checkpointer)
    try:
        assert _values(restored) == [0.0, 1.0]
        assert checkpointer.restored_checkpoint == last
        assert f"restoring checkpoint {last} (sequence 2," in caplog.text
        if other in ("before-upgrade", "stray"):
            assert f"ignoring {other}: not a checkpoint name this checkpointer writes" in caplog.text
        third = restored.checkpoint()  # numbering goes on in a new process's checkpointer
    finally:
        restored.stop()
    assert checkpointing._read_sequence(third) == 3
    kept = sorted(os.listdir(root))
    assert os.path.basename(third) in kept and os.path.basename(last) not in kept  # keep_latest=1
    if other in ("before-upgrade", "stray"):
        assert other in kept  # not ours: neither restored nor deleted


def test_a_checkpoint_without_a_sequence_number_restores(tmp_path):
    root = str(tmp_path)
    server = reverb.Server([_table()], checkpointer=checkpointing.DirectoryCheckpointer(root))
    server.localhost_client().insert([np.float32(5.0)], priorities={"t": 1.0})
    path = server.checkpoint()
    server.stop()
    open(os.path.join(path, "DONE"), "wb").close()  # an empty DONE file: no sequence number
    checkpointer = checkpointing.DirectoryCheckpointer(root)
    restored = reverb.Server([_table()], checkpointer=checkpointer)
    try:
        assert _values(restored) == [5.0] and checkpointer.restored_checkpoint == path
        assert checkpointing._read_sequence(restored.checkpoint()) == 1
    finally:
        restored.stop()
