"""Brings a dataset directory left by a killed recorder back to a state every TFDS version reads.

The recorder (`tfds_writer.DatasetWriter`) flushes the open shard and atomically rewrites `dataset_info.json`
after every episode, so the metadata always lists exactly the episodes that are complete on disk. A `kill -9`
can still leave, in the last shard of a split only (shards are written one after the other):
  * a record cut short (killed inside a write): TFDS would fail with `DataLossError` on that shard;
  * complete records written after the last metadata update (killed between flush and rename);
  * a new shard file that the metadata does not list yet.
`recover` truncates the cut record, lists the complete ones, and drops empty unlisted shards. Like envlogger's
`maybe_recover_last_shard`, it only touches the last shard of each split.

>>> import tempfile
>>> needs_recovery(tempfile.mkdtemp())
False
"""
from __future__ import annotations

import glob
import os

from absl import logging

from rlds_tf.recording import _tfrecord_files as files


def _plan(data_directory: str) -> tuple[dict, list[tuple], bool]:
    """Works out what `recover` would change: (new info, file actions, changed?)."""
    info = files.read_info_json(data_directory)
    actions: list[tuple] = []
    if info.get("fileFormat", "tfrecord") != "tfrecord":
        return info, actions, False  # array_record shards are only listed once closed; nothing to repair.
    changed = False
    for split in info.get("splits", []):
        template = split.get("filepathTemplate", "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}")
        if "{NUM_SHARDS}" in template:
            continue  # written by a regular TFDS builder, never by a sequential writer.
        lengths = [int(n) for n in split.get("shardLengths", [])]
        num_bytes = int(split.get("numBytes", 0))
        candidates = []
        if lengths:
            candidates.append(len(lengths) - 1)
        candidates.append(len(lengths))
        for index in candidates:
            path = files.shard_path(data_directory, info["name"], split["name"], "tfrecord", template, index)
            if not os.path.exists(path):
                continue
            record_lengths, end = files.scan_records(path)
            listed = lengths[index] if index < len(lengths) else 0
            if len(record_lengths) < listed:
                raise ValueError(f"{path}: dataset_info.json lists {listed} episodes but the shard holds only "
                                 f"{len(record_lengths)} complete records; the directory was modified by "
                                 f"something other than the recorder")
            if os.path.getsize(path) > end:
                actions.append(("truncate", path, end))
                changed = True
            if len(record_lengths) > listed:
                num_bytes += sum(record_lengths[listed:])
                if index < len(lengths):
                    lengths[index] = len(record_lengths)
                else:
                    lengths.append(len(record_lengths))
                changed = True
            elif index == len(lengths) and not record_lengths:
                actions.append(("remove", path, None))
                changed = True
        split["shardLengths"] = [str(n) for n in lengths]
        if not lengths:
            split.pop("shardLengths")
        if num_bytes:
            split["numBytes"] = str(num_bytes)
    return info, actions, changed


def needs_recovery(data_directory: str) -> bool:
    """True when `data_directory` holds leftovers of a killed recorder that `recover` would repair."""
    if not os.path.exists(os.path.join(data_directory, files.DATASET_INFO)):
        return False
    return _plan(data_directory)[2]


def recover(data_directory: str) -> bool:
    """Repairs the last shard of each split after a crash; returns whether anything changed.

    Raises:
      RuntimeError: a live recorder still writes into `data_directory`.
    """
    if files.writer_is_active(data_directory):
        raise RuntimeError(f"cannot recover {data_directory!r}: a recorder is still writing into it")
    return recover_locked(data_directory)


def recover_locked(data_directory: str) -> bool:
    """`recover` for the caller that holds the directory's writer lock itself."""
    for leftover in glob.glob(os.path.join(data_directory, ".tmp-*.json")):
        os.unlink(leftover)
    info, actions, changed = _plan(data_directory)
    if not changed:
        return False
    for action, path, end in actions:
        if action == "truncate":
            logging.warning("rlds_tf: truncating %s to %d bytes (a record cut short by a crash)", path, end)
            os.truncate(path, end)
        elif action == "remove":
            os.unlink(path)
    files.atomic_write_text(os.path.join(data_directory, files.DATASET_INFO), files.info_json_text(info))
    return True
