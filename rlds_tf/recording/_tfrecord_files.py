"""TFRecord framing, the dataset_info.json splits, and the writer lock: the pieces crash recovery needs.

A TFRecord is `uint64 length | uint32 crc(length) | data | uint32 crc(data)` (little endian), so the records
of a shard can be counted, and a record cut short by a crash detected, by reading only the 8-byte lengths.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import tempfile
from typing import Iterator

DATASET_INFO = "dataset_info.json"
LOCK_FILE = ".rlds_tf_writer.lock"
_HEADER = 12  # uint64 length + uint32 length crc
_FOOTER = 4  # uint32 data crc


def scan_records(path: str) -> tuple[list[int], int]:
    """Lengths of the complete records of a TFRecord file, and the byte offset where they end."""
    lengths: list[int] = []
    size = os.path.getsize(path)
    offset = 0
    with open(path, "rb") as f:
        while offset + _HEADER <= size:
            f.seek(offset)
            (length,) = struct.unpack("<Q", f.read(8))
            end = offset + _HEADER + length + _FOOTER
            if end > size:
                break
            lengths.append(length)
            offset = end
    return lengths, offset


def atomic_write_text(path: str, text: str) -> None:
    """Writes `text` to `path` so that a crash leaves either the old or the new content, never a mix."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_info_json(data_directory: str) -> dict:
    with open(os.path.join(data_directory, DATASET_INFO)) as f:
        return json.load(f)


def info_json_text(info: dict) -> str:
    return json.dumps(info, indent=2, sort_keys=True)


def split_json(name: str, template: str, shard_lengths: list[int], num_bytes: int) -> dict:
    """One entry of dataset_info.json's `splits`, as TFDS writes it (proto3 JSON: int64 as strings)."""
    entry = {"filepathTemplate": template, "name": name}
    if num_bytes:
        entry["numBytes"] = str(int(num_bytes))
    if shard_lengths:
        entry["shardLengths"] = [str(n) for n in shard_lengths]
    return entry


def shard_path(data_directory: str, dataset_name: str, split: str, suffix: str, template: str, index: int) -> str:
    """The file of shard `index` for the `{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_INDEX}` style templates."""
    name = (template.replace("{DATASET}", dataset_name).replace("{SPLIT}", split)
            .replace("{FILEFORMAT}", suffix).replace("{SHARD_INDEX}", f"{index:05d}"))
    return os.path.join(data_directory, name)


class WriterLock:
    """An advisory lock held by the process that records into a directory (released by the OS on kill -9)."""

    def __init__(self, data_directory: str):
        self._path = os.path.join(data_directory, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> None:
        while True:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as e:
                os.close(fd)
                raise RuntimeError(f"another process is recording into {os.path.dirname(self._path)!r} "
                                   f"(it holds {LOCK_FILE}); use a different data_directory or stop that "
                                   f"writer") from e
            # A writer that closed cleanly removes the file while holding its lock: if that happened between
            # our open and flock, we hold a lock on a removed file, so open the path again.
            try:
                if os.stat(self._path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            os.close(fd)
        self._fd = fd

    def release(self, *, remove: bool = False) -> None:
        """Unlocks; `remove=True` (a clean close) also deletes the file, so only a killed writer leaves one."""
        if self._fd is not None:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def writer_is_active(data_directory: str) -> bool:
    """True while a live process holds the directory's writer lock."""
    path = os.path.join(data_directory, LOCK_FILE)
    if not os.path.exists(path):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@contextlib.contextmanager
def open_for_truncate(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDWR)
    try:
        yield fd
    finally:
        os.close(fd)
