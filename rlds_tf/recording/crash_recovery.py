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

Recovery truncates or removes only a shard the recorder could have made: a regular file with a single link. A
shard that is a symlink or has more hard links (its data may also be a file outside the dataset, e.g. a
`cp -al` backup or a planted link) is left exactly as it is, metadata included, and named in `Plan.left_alone`,
in a logged warning, and by `rlds-tf recover`.

>>> import tempfile
>>> needs_recovery(tempfile.mkdtemp())
False
"""
from __future__ import annotations

import glob
import os
import stat
from typing import NamedTuple

from absl import logging

from rlds_tf.recording import tfrecord_files as files


class Plan(NamedTuple):
    """What `recover` would change in a directory."""
    info: dict                 # the new dataset_info.json content
    actions: list              # ("truncate", path, end, identity) and ("remove", path, None, identity), where
                               # identity is the (st_dev, st_ino) the file had when planned
    changed: bool              # whether recovery would change anything
    unreadable: list           # listed shards TFDS cannot read as they are (a cut record, unlisted records)
    left_alone: list           # (path, why and what to do) per shard recovery would repair but must not write


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


def _why_not_writable(path: str) -> str | None:
    """None for a shard recovery may truncate or remove; else why not (a symlink, a file with other links)."""
    found = os.lstat(path)
    if not stat.S_ISREG(found.st_mode):
        return f"it is a {files.file_kind(found.st_mode)}"
    if found.st_nlink != 1:
        return (f"it has {found.st_nlink} hard links, so its data may also be a file outside the dataset "
                f"directory")
    return None


def _left_alone(path: str, reason: str) -> str:
    name = os.path.basename(path)
    return (f"left {path} alone: {reason}; crash recovery only truncates or removes a shard file with a single "
            f"link. If it is this dataset's shard, give it its own copy (cp {name} {name}.copy && mv {name}.copy "
            f"{name}) and recover again; otherwise move it out of the dataset directory")


def _identity(path: str) -> tuple[int, int]:
    found = os.lstat(path)
    return found.st_dev, found.st_ino


def _plan_unchecked(data_directory: str) -> Plan:
    info = files.read_info_json(data_directory)
    actions: list[tuple] = []
    unreadable: list[str] = []
    left_alone: list[tuple[str, str]] = []
    if info.get("fileFormat", "tfrecord") != "tfrecord":
        # array_record shards are only listed once closed.
        return Plan(info, actions, False, unreadable, left_alone)
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
                raise ValueError(f"shard {path!r} of {data_directory!r} is a {files.file_kind(os.stat(path).st_mode)}, "
                                 f"not a regular file; crash recovery only repairs shard files")
            record_lengths, end = files.scan_records(path)
            listed = lengths[index] if index < len(lengths) else 0
            if len(record_lengths) < listed:
                raise ValueError(f"{path}: dataset_info.json lists {listed} episodes but the shard holds only "
                                 f"{len(record_lengths)} complete records; the directory was modified by "
                                 f"something other than the recorder")
            size = os.path.getsize(path)
            if index < len(lengths) and (size > end or len(record_lengths) > listed):
                unreadable.append(path)  # TFDS reads a listed shard whole and checks its record count
            # An unlisted shard is always repaired (listed or removed); a listed one when it holds more than listed.
            repair = index == len(lengths) or size > end or len(record_lengths) > listed
            reason = _why_not_writable(path) if repair else None
            if reason is not None:
                left_alone.append((path, _left_alone(path, reason)))
                continue
            if size > end:
                actions.append(("truncate", path, end, _identity(path)))
                changed = True
            if len(record_lengths) > listed:
                num_bytes += sum(record_lengths[listed:])
                if index < len(lengths):
                    lengths[index] = len(record_lengths)
                else:
                    lengths.append(len(record_lengths))
                changed = True
            elif index == len(lengths) and not record_lengths:
                actions.append(("remove", path, None, _identity(path)))
                changed = True
        split["shardLengths"] = [str(n) for n in lengths]
        if not lengths:
            split.pop("shardLengths")
        if num_bytes:
            split["numBytes"] = str(num_bytes)
    return Plan(info, actions, changed, unreadable, left_alone)


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
    records, or removed when empty and unlisted), leftover `.tmp-*.json` files, and `dataset_info.json`. A shard
    that is a symlink or has more than one hard link is left as it is (see the module docstring): each is
    logged as a warning, and `plan(data_directory).left_alone` names them.

    Raises:
      RuntimeError: a live recorder still writes into `data_directory`.
      ValueError: dataset_info.json names a shard outside the directory (nothing is changed then), or a file
        of the dataset is not a regular file (a FIFO, ...).
    """
    if files.writer_is_active(data_directory):
        raise RuntimeError(f"cannot recover {data_directory!r}: a recorder is still writing into it")
    return recover_locked(data_directory)


def recover_locked(data_directory: str) -> bool:
    """`recover` for the caller that holds the directory's writer lock itself."""
    info, actions, changed, _, left_alone = _plan(data_directory)  # checks every path before anything is changed
    for _, message in left_alone:
        logging.warning("rlds_tf: %s", message)
    for leftover in glob.glob(os.path.join(glob.escape(data_directory), ".tmp-*.json")):
        if os.path.isfile(leftover) and not os.path.islink(leftover):
            os.unlink(leftover)
    if not changed:
        return False
    for action, path, end, identity in actions:
        if action == "truncate":
            _truncate(path, end, identity)
        elif action == "remove" and _why_not_writable(path) is None and _identity(path) == identity:
            os.unlink(path)  # removes a link itself, never its target
    files.atomic_write_text(os.path.join(data_directory, files.DATASET_INFO), files.info_json_text(info))
    return True


def _truncate(path: str, end: int, identity: tuple[int, int]) -> None:
    """Truncates the planned shard, checked again on the open descriptor: never another file swapped in."""
    # follow_symlinks=False: a shard swapped for a symlink since the plan is refused, not followed.
    fd = files.open_regular(path, os.O_RDWR, follow_symlinks=False)
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != identity or opened.st_nlink != 1:
            logging.warning("rlds_tf: %s", _left_alone(path, "it was replaced or linked again while recovering"))
            return
        logging.warning("rlds_tf: truncating %s to %d bytes (a record cut short by a crash)", path, end)
        os.ftruncate(fd, end)
    finally:
        os.close(fd)
