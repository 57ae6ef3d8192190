"""Brings a dataset directory left by a killed recorder back to a state every TFDS version reads.

The recorder (`tfds_writer.DatasetWriter`) flushes the open shard and atomically rewrites `dataset_info.json`
after every episode, so the metadata always lists exactly the episodes that are complete on disk. A `kill -9`
can still leave, in the last shard of a split only (shards are written one after the other):
  * a record cut short (killed inside a write): TFDS would fail with `DataLossError` on that shard;
  * complete records written after the last metadata update (killed between flush and rename);
  * a new shard file that the metadata does not list yet.
`recover` truncates the cut record, lists the complete ones, and drops empty unlisted shards. Like envlogger's
`maybe_recover_last_shard`, it only touches the last shard of each split.

Recovery writes, so it runs only when asked: `recover(directory)`, `rlds-tf recover DIR`, or
`rlds_tf.load(..., recover=True)`; reading a dataset never repairs it. The shard paths come from
`dataset_info.json` (its split templates, dataset and split names), which may be hostile: every path is
resolved (symlinks too) and must name a regular file directly inside the dataset directory, or recovery
refuses with a ValueError before touching anything.

>>> import tempfile
>>> needs_recovery(tempfile.mkdtemp())
False
"""
from __future__ import annotations

import glob
import os
from typing import NamedTuple

from absl import logging

from rlds_tf.recording import _tfrecord_files as files


class Plan(NamedTuple):
    """What `recover` would change in a directory."""
    info: dict                 # the new dataset_info.json content
    actions: list              # ("truncate", path, end) and ("remove", path, None) file actions
    changed: bool              # whether recovery would change anything
    unreadable: list           # listed shards TFDS cannot read as they are (a cut record, unlisted records)


def _checked_shard_path(data_directory: str, info: dict, split: dict, template: str, index: int) -> str:
    """The shard's path, refused unless it names a file directly inside `data_directory` (symlinks resolved)."""
    path = files.shard_path(data_directory, str(info.get("name", "")), str(split.get("name", "")), "tfrecord",
                            template, index)
    directory = os.path.realpath(data_directory)
    name = os.path.relpath(path, data_directory)
    resolved = os.path.realpath(path)
    if (os.path.isabs(name) or os.path.dirname(name) or name in (os.curdir, os.pardir)
            or os.path.dirname(resolved) != directory):
        raise ValueError(f"dataset_info.json of {data_directory!r} names shard {index} of split "
                         f"{split.get('name')!r} as {path!r} (filepathTemplate {template!r}), which is not a file "
                         f"directly inside the dataset directory; crash recovery only touches files there. Fix "
                         f"the template (e.g. '{{DATASET}}-{{SPLIT}}.{{FILEFORMAT}}-{{SHARD_INDEX}}') and the names")
    return path


def _plan(data_directory: str) -> Plan:
    """Works out what `recover` would change, reading only checked files inside `data_directory`."""
    try:
        return _plan_unchecked(data_directory)
    except (TypeError, AttributeError, KeyError) as e:  # e.g. a split that is not an object
        raise ValueError(f"dataset_info.json of {data_directory!r} is malformed ({type(e).__name__}: {e}); "
                         f"crash recovery needs the splits as TFDS writes them") from e


def _plan_unchecked(data_directory: str) -> Plan:
    info = files.read_info_json(data_directory)
    actions: list[tuple] = []
    unreadable: list[str] = []
    if info.get("fileFormat", "tfrecord") != "tfrecord":
        return Plan(info, actions, False, unreadable)  # array_record shards are only listed once closed.
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
            path = _checked_shard_path(data_directory, info, split, template, index)
            if not os.path.exists(path):
                continue
            if not os.path.isfile(path):
                raise ValueError(f"shard {path!r} of {data_directory!r} is not a regular file; crash recovery "
                                 f"only repairs shard files")
            record_lengths, end = files.scan_records(path)
            listed = lengths[index] if index < len(lengths) else 0
            if len(record_lengths) < listed:
                raise ValueError(f"{path}: dataset_info.json lists {listed} episodes but the shard holds only "
                                 f"{len(record_lengths)} complete records; the directory was modified by "
                                 f"something other than the recorder")
            if index < len(lengths) and (os.path.getsize(path) > end or len(record_lengths) > listed):
                unreadable.append(path)  # TFDS reads a listed shard whole and checks its record count
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
    return Plan(info, actions, changed, unreadable)


def plan(data_directory: str) -> Plan | None:
    """What `recover` would change in `data_directory` (None without dataset_info.json); writes nothing.

    Raises:
      ValueError: dataset_info.json names a shard outside the directory, or lists more episodes than a
        shard holds.
    """
    if not os.path.exists(os.path.join(data_directory, files.DATASET_INFO)):
        return None
    return _plan(data_directory)


def needs_recovery(data_directory: str) -> bool:
    """True when `data_directory` holds leftovers of a killed recorder that `recover` would repair."""
    found = plan(data_directory)
    return found is not None and found.changed


def recover(data_directory: str) -> bool:
    """Repairs the last shard of each split after a crash; returns whether anything changed.

    Only files directly inside `data_directory` are changed: the last shards (truncated to their complete
    records, or removed when empty and unlisted), leftover `.tmp-*.json` files, and `dataset_info.json`.

    Raises:
      RuntimeError: a live recorder still writes into `data_directory`.
      ValueError: dataset_info.json names a shard outside the directory (nothing is changed then).
    """
    if files.writer_is_active(data_directory):
        raise RuntimeError(f"cannot recover {data_directory!r}: a recorder is still writing into it")
    return recover_locked(data_directory)


def recover_locked(data_directory: str) -> bool:
    """`recover` for the caller that holds the directory's writer lock itself."""
    info, actions, changed, _ = _plan(data_directory)  # checks every path before anything is changed
    for leftover in glob.glob(os.path.join(glob.escape(data_directory), ".tmp-*.json")):
        if os.path.isfile(leftover) and not os.path.islink(leftover):
            os.unlink(leftover)
    if not changed:
        return False
    for action, path, end in actions:
        if action == "truncate":
            logging.warning("rlds_tf: truncating %s to %d bytes (a record cut short by a crash)", path, end)
            # O_NOFOLLOW: a shard swapped for a symlink since the check is refused, not followed.
            fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
            try:
                os.ftruncate(fd, end)
            finally:
                os.close(fd)
        elif action == "remove":
            os.unlink(path)  # removes a link itself, never its target
    files.atomic_write_text(os.path.join(data_directory, files.DATASET_INFO), files.info_json_text(info))
    return True
