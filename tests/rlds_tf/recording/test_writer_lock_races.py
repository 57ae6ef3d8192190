"""The writer lock file may go away at any moment: a recorder that closes cleanly removes it."""
import os

import pytest

import rlds_tf as rlds
from rlds_dataset_testlib import record_catch
from rlds_tf.recording import tfrecord_files
from rlds_tf.recording import crash_recovery


@pytest.fixture
def lock_removed_before_open(tmp_path, monkeypatch):
    """A killed recording whose lock file is removed just before `writer_is_active` opens it, as when a
    recorder closes cleanly between that function's look at the directory and its open."""
    directory = record_catch(str(tmp_path / "ds"))
    lock = os.path.join(directory, tfrecord_files.LOCK_FILE)
    real_open = tfrecord_files.open_regular

    def open_after_removal(path, *args, **kwargs):
        if path == lock and os.path.exists(lock):
            os.unlink(lock)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(tfrecord_files, "open_regular", open_after_removal)
    return directory


def test_writer_is_active_is_false_once_the_lock_file_is_gone(lock_removed_before_open):
    assert tfrecord_files.writer_is_active(lock_removed_before_open) is False


@pytest.mark.parametrize("read, expected", [
    (lambda d: sum(1 for _ in rlds.load(d, split="train")), 3),   # every episode loads
    (crash_recovery.recover, False),                                # a clean recording: nothing to repair
], ids=["load", "recover"])
def test_load_and_recover_go_on_when_the_lock_file_goes_away(lock_removed_before_open, read, expected):
    assert read(lock_removed_before_open) == expected
