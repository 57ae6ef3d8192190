"""TFRecord framing, the dataset_info.json splits, and the writer lock: the pieces crash recovery needs.

A TFRecord is `uint64 length | uint32 crc(length) | data | uint32 crc(data)` (little endian), so the records
of a shard can be counted, and a record cut short by a crash detected, by reading only the 8-byte lengths.

Every file of a dataset is opened through `open_regular`: a FIFO (or device) placed under a dataset's file
name would block a plain `open` forever, so anything but a regular file is refused without blocking.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
import struct

DATASET_INFO = "dataset_info.json"
LOCK_FILE = ".rlds_tf_writer.lock"
_HEADER = 12  # uint64 length + uint32 length crc
_FOOTER = 4  # uint32 data crc


_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISLNK, "symbolic link"))


def file_kind(mode: int) -> str:
    """'regular file', 'FIFO', 'directory', ... for an `st_mode`."""
    if stat.S_ISREG(mode):
        return "regular file"
    return next((name for test, name in _KINDS if test(mode)), f"file of mode {stat.S_IFMT(mode):#o}")


def _not_regular(path: str, mode: int) -> ValueError:
    return ValueError(f"{path!r} is a {file_kind(mode)}, not a regular file; rlds_tf opens only regular files in "
                      f"a dataset directory (a FIFO would block the read forever). Move it out of the directory")


def open_regular(path: str, flags: int = os.O_RDONLY, *, follow_symlinks: bool = True, mode: int = 0o666) -> int:
    """`os.open` that never blocks on a FIFO and returns a descriptor of a regular file only.

    Raises:
      ValueError: `path` is a FIFO, socket, device or directory (or, with `follow_symlinks=False`, a symlink).
    """
    try:
        found = os.stat(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        found = None  # O_CREAT makes it; otherwise os.open raises
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise _not_regular(path, found.st_mode)
    # O_NONBLOCK: a FIFO swapped in since the stat opens at once (then fstat refuses it) instead of waiting for a
    # writer; it changes nothing for a regular file.
    flags |= os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    fd = os.open(path, flags, mode)
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise _not_regular(path, opened.st_mode)
    return fd


def check_only_regular_files(directory: str) -> None:
    """ValueError for an entry of a dataset directory that is not a regular file or a directory.

    TFDS opens dataset files with plain blocking reads: a FIFO named like a shard, dataset_info.json or
    features.json would hang it forever. `os.stat` never blocks.
    """
    for name in sorted(os.listdir(directory)):
        try:
            mode = os.stat(os.path.join(directory, name)).st_mode
        except FileNotFoundError:
            continue  # a dangling symlink or a file removed meanwhile: whoever opens it reports it
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ValueError(f"dataset directory {directory!r} holds {name!r}, a {file_kind(mode)}, not a regular "
                             f"file; reading it could block forever. Move it out of the directory")


def scan_records(path: str) -> tuple[list[int], int]:
    """Lengths of the complete records of a TFRecord file, and the byte offset where they end."""
    lengths: list[int] = []
    offset = 0
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
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
    fd, tmp = _create_temporary(directory, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create_temporary(directory: str, *, prefix: str, suffix: str) -> tuple[int, str]:
    """A new file for writing, like `tempfile.mkstemp` but with the mode the umask gives (0644 under umask 022).

    mkstemp makes 0600 files: moved into a dataset, one would be unreadable to the other accounts that can
    read every other file there (another user's training job).
    """
    while True:
        path = os.path.join(directory, f"{prefix}{secrets.token_hex(8)}{suffix}")
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666), path
        except FileExistsError:
            continue


def read_info_json(data_directory: str) -> dict:
    with os.fdopen(open_regular(os.path.join(data_directory, DATASET_INFO)), "r") as f:
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
            # Not through a symlink: O_CREAT would make the link's target, wherever it points.
            fd = open_regular(self._path, os.O_RDWR | os.O_CREAT, follow_symlinks=False, mode=0o644)
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
    try:
        fd = open_regular(path)
    except FileNotFoundError:  # none, or a recorder closed cleanly (it removes the file) since the caller looked
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
