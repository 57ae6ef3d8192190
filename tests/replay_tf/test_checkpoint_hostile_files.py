"""Hostile or damaged files in a checkpoint root: `DONE` files that are not a sequence number the checkpointer
writes (too large, out of range, extra fields), FIFOs in place of a checkpoint's files, and symlinked folders."""
import logging
import re
import os
import shutil
import struct
import tracemalloc
import zlib

import numpy as np
import pytest
from google.protobuf import wrappers_pb2

import replay_tf as reverb
from proc_testlib import without_hanging
from replay_tf import checkpointing

_LATER_NAME = "29991231T000000.000000Z"  # sorts after every name the checkpointer gives today


def _table():
    return reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                        reverb.rate_limiters.MinSize(1))


def _record(payload: bytes) -> bytes:
    """One record as the checkpointer frames it: uint64 length, uint32 CRC32, payload."""
    return struct.pack("<QI", len(payload), zlib.crc32(payload)) + payload


def _sequence_record(value: int) -> bytes:
    return _record(wrappers_pb2.Int64Value(value=value).SerializeToString())


def _values(server):
    return sorted(float(item.column_arrays()[0][0]) for item in server.tables["t"].items_snapshot())


def _two_checkpoints(root):
    """Checkpoints holding [0.0] and then [0.0, 1.0] (keep_latest=2); returns their paths."""
    server = reverb.Server([_table()], checkpointer=checkpointing.DirectoryCheckpointer(root, keep_latest=2))
    try:
        client = server.localhost_client()
        client.insert([np.float32(0.0)], priorities={"t": 1.0})
        first = server.checkpoint()
        client.insert([np.float32(1.0)], priorities={"t": 1.0})
        return first, server.checkpoint()
    finally:
        server.stop()


def _restart_and_save(root, caplog, level):
    """Starts a server on `root` (keep_latest=1) as a restart does, then saves once.

    Returns the checkpoint restored, the values restored, and the new checkpoint.
    """
    checkpointer = checkpointing.DirectoryCheckpointer(root, keep_latest=1)
    with caplog.at_level(level, logger=checkpointing.__name__):
        server = reverb.Server([_table()], checkpointer=checkpointer)
    try:
        return checkpointer.restored_checkpoint, _values(server), server.checkpoint()
    finally:
        server.stop()


# --- a DONE file is read only as one small sequence-number record ---

@pytest.mark.parametrize("done, error", [
    (_sequence_record(-7), r"DONE record 0 is not a sequence number: expected an Int64Value with only a value "
                           r"from 1 to 9223372036854775807, got value -7 in 11 bytes"),
    (_record(b""), r"not a sequence number: .*got value 0 in 0 bytes"),
    (_record(b"\x08\x05\x10\x01"), r"not a sequence number: .*got value 5 in 4 bytes 08051001"),  # a field 2 too
    (_sequence_record(5) + _sequence_record(6), r"DONE is 28 bytes, expected at most 23"),
    (_record(b"\x00" * 100), r"DONE is 112 bytes, expected at most 23"),
], ids=["negative", "zero", "extra_field", "two_records", "long_record"])
def test_a_done_file_that_is_no_sequence_number_is_left_alone(tmp_path, caplog, done, error):
    root = str(tmp_path)
    first, last = _two_checkpoints(root)
    planted = os.path.join(root, _LATER_NAME)
    shutil.copytree(first, planted)
    with open(os.path.join(planted, "DONE"), "wb") as f:
        f.write(done)
    restored_from, values, newest = _restart_and_save(root, caplog, logging.WARNING)
    assert restored_from == last and values == [0.0, 1.0]
    assert f"checkpoint {planted} is left alone" in caplog.text
    assert any(re.search(error, r.getMessage()) for r in caplog.records), caplog.text
    assert checkpointing._read_sequence(newest) == 3
    # keep_latest deleted the older checkpoints of its own, never the folder it cannot order.
    assert sorted(os.listdir(root)) == sorted([_LATER_NAME, os.path.basename(newest)])


def test_a_huge_done_file_is_refused_without_reading_it(tmp_path):
    root = str(tmp_path)
    first, _ = _two_checkpoints(root)
    planted = os.path.join(root, _LATER_NAME)
    shutil.copytree(first, planted)
    size = 256 << 20
    with open(os.path.join(planted, "DONE"), "wb") as f:  # one record header claiming the whole (sparse) file
        f.write(struct.pack("<QI", size - 12, 0))
        f.truncate(size)
    tracemalloc.start()
    try:
        with pytest.raises(checkpointing.CheckpointError, match=rf"DONE is {size} bytes, expected at most 23 "
                                                                 rf"\(one sequence-number record\)"):
            checkpointing._read_sequence(planted)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20), peak


def test_a_sequence_number_at_the_int64_limit_fails_the_save_clearly(tmp_path):
    root = str(tmp_path)
    first, last = _two_checkpoints(root)
    planted = os.path.join(root, _LATER_NAME)
    shutil.copytree(first, planted)
    with open(os.path.join(planted, "DONE"), "wb") as f:
        f.write(_sequence_record(2 ** 63 - 1))
    checkpointer = checkpointing.DirectoryCheckpointer(root, keep_latest=1)
    server = reverb.Server([_table()], checkpointer=checkpointer)
    try:
        assert checkpointer.restored_checkpoint == planted  # a valid number: the largest, so restored
        with pytest.raises(checkpointing.CheckpointError,
                           match=rf"cannot number a checkpoint after {planted}: its DONE file records sequence "
                                 rf"number 9223372036854775807, the largest an int64 holds .* Move that folder "
                                 rf"out of {root}"):
            server.checkpoint()
    finally:
        server.stop()
    assert sorted(os.listdir(root)) == sorted([_LATER_NAME, os.path.basename(first), os.path.basename(last)])


# --- a FIFO in a checkpoint never blocks the restore ---

@pytest.mark.parametrize("name", ["tables.records", "chunks.records", "items.records"])
def test_a_fifo_in_a_checkpoint_fails_the_restore_without_blocking(tmp_path, name):
    root = str(tmp_path)
    _, last = _two_checkpoints(root)
    fifo = os.path.join(last, name)
    os.unlink(fifo)
    os.mkfifo(fifo)
    checkpointer = checkpointing.DirectoryCheckpointer(root)
    with pytest.raises(checkpointing.CheckpointError,
                       match=rf"{fifo}: expected a regular file, got file type 'p' \(prw"):
        without_hanging(lambda: reverb.Server([_table()], checkpointer=checkpointer), fifo)


# --- a symlinked folder is not one of ours ---

def test_a_symlinked_checkpoint_folder_is_neither_restored_nor_deleted(tmp_path, caplog):
    root = str(tmp_path / "root")
    first, last = _two_checkpoints(root)
    elsewhere = str(tmp_path / "elsewhere")
    shutil.copytree(first, elsewhere)
    with open(os.path.join(elsewhere, "DONE"), "wb") as f:
        f.write(_sequence_record(99))
    link = os.path.join(root, _LATER_NAME)
    os.symlink(elsewhere, link)
    restored_from, values, newest = _restart_and_save(root, caplog, logging.INFO)
    assert restored_from == last and values == [0.0, 1.0]
    assert f"ignoring {_LATER_NAME}: a symlink, not a folder this checkpointer writes" in caplog.text
    assert checkpointing._read_sequence(newest) == 3
    assert sorted(os.listdir(root)) == sorted([_LATER_NAME, os.path.basename(newest)])
    assert os.path.islink(link) and checkpointing._read_sequence(elsewhere) == 99
