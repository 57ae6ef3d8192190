"""Directory checkpoints of a server's tables: atomic, restored at start, no pickle.

`DirectoryCheckpointer(root)` is the `checkpointer=` of `replay_tf.Server`:
  - `save(server)` writes `<root>/<UTC timestamp>/` with three record files (the same messages as Reverb's
    checkpoints: `PriorityTableCheckpoint` per table with its rate-limiter counters, `ChunkData` per chunk
    (deduplicated across items and tables, still Snappy-compressed), `PrioritizedItem` per item in
    insertion order, with priority, times_sampled and inserted_at) and returns that path.
    Everything is written to `<root>/.partial-<name>/`, flushed to disk, completed by a `DONE` file and
    only then renamed into place, so a crash at any point leaves the previous checkpoint loadable. The
    `DONE` file records the checkpoint's sequence number (one `google.protobuf.Int64Value` record): one more
    than the largest under `root`, so it counts up whatever the wall clock does. Older checkpoints beyond
    `keep_latest` are deleted afterwards.
    Saves are serialized (one at a time per root in a process: a client's `Checkpoint` call during a
    periodic one waits for it), and a save deletes only its own `.partial-` folder, plus those of processes
    that no longer run.
  - `load_latest(server)` restores the checkpoint written last (or `fallback_checkpoint_path`) into the
    server's tables when the server starts, and logs its path (also kept in `restored_checkpoint`).
    "Written last" is the largest sequence number, never the folder name: a wall clock stepped back (NTP,
    a restored VM snapshot) names a newer checkpoint earlier. Only complete folders named as `save` names
    them count; others (an operator's copy such as `before-upgrade`, a stray folder with a `DONE` file, a
    symlink to a folder) are neither restored nor deleted. A checkpoint whose `DONE` file is empty (written
    without sequence numbers) orders before every checkpoint that has one, and among such checkpoints by
    name; one whose `DONE` file is not a sequence-number record as `save` writes it (one Int64Value from 1
    up, no other field, so at most 23 bytes: a larger file is never read) is left alone (logged). Every file
    of a checkpoint is opened without blocking and must be a regular file (a FIFO would block the restore
    forever). The sequence number lives in
    `DONE` rather than in `PriorityTableCheckpoint`, whose fields stay those of Reverb's message.
    Every record is checked as the insert path checks what it receives (chunk contents decoded in full,
    priorities, item keys unique per table, trajectories within their chunks, the table signature, known
    tables); a record that fails is a `CheckpointError` naming it. A chunk whose content cannot be decoded
    is the one exception: the items that use it are left out and reported (logged, and listed in
    `dropped_items`), and the rest is restored.

Restored tables keep the configuration the user passes to `Table(...)` now (sampler, remover, max_size,
max_times_sampled, rate limiter, signature); only names must match (a checkpointed table the server lacks
is a ValueError). Reverb instead restores the checkpointed configuration over the user's, and a rate
limiter restored with its old settings and counters can block inserts forever (reverb#103). Here:
  - same rate-limiter settings as when saved: the counters (inserts, samples, deletes) are restored
    exactly, so training resumes where it stopped;
  - different settings: the limiter starts as if the restored items had just been inserted
    (`inserts = len(items)`, `samples = max(0, ceil(len(items) * samples_per_insert - max_diff))`), so
    inserts and samples are admitted under the new settings at once, never blocked by stale counters.
A table holding more items than its (new) `max_size` keeps the most recently inserted ones.

>>> import tempfile, replay_tf as reverb
>>> root = tempfile.mkdtemp()
>>> server = reverb.Server([reverb.Table.queue('q', 10)], checkpointer=DirectoryCheckpointer(root))
>>> reverb.Client(f'localhost:{server.port}').insert([1.0], priorities={'q': 1.0})
>>> path = server.checkpoint(); server.stop()
>>> restored = reverb.Server([reverb.Table.queue('q', 10)], checkpointer=DirectoryCheckpointer(root))
>>> restored.tables['q'].size()
1
>>> restored.stop()
"""
from __future__ import annotations

import datetime
import logging
import math
import os
import re
import shutil
import stat
import struct
import threading
import zlib
from typing import Iterator, NamedTuple, Optional

from google.protobuf import message
from google.protobuf import wrappers_pb2

from replay_tf.core import item_records
from replay_tf.wire import checkpoint_pb2
from replay_tf.wire import chunk_codec
from replay_tf.wire import limits
from replay_tf.wire import protos
from replay_tf.wire import schema_pb2
from replay_tf.wire import tensor_codec

__all__ = ["DirectoryCheckpointer"]

_TABLES_FILE = "tables.records"
_CHUNKS_FILE = "chunks.records"
_ITEMS_FILE = "items.records"
_DONE_FILE = "DONE"
_PARTIAL_PREFIX = ".partial-"
_HEADER = struct.Struct("<QI")  # record length, CRC32 of the record
# The folder names `save` gives: the UTC time, plus one "_" per checkpoint already under that name.
_CHECKPOINT_NAME = re.compile(r"\d{8}T\d{6}\.\d{6}Z_*")
# Sequence numbers count up from 1 and are stored as an int64.
_MAX_SEQUENCE = 2 ** 63 - 1
# A `DONE` file holds one record: its header and an Int64Value (a tag byte and at most 10 varint bytes).
_MAX_DONE_BYTES = _HEADER.size + 11


_log = logging.getLogger(__name__)

# One lock per checkpoint root in this process: two saves at once (a client's Checkpoint call while a periodic
# one runs) would otherwise interleave their cleanups.
_save_locks: dict = {}
_save_locks_guard = threading.Lock()


def _save_lock(root: str) -> threading.Lock:
    with _save_locks_guard:
        return _save_locks.setdefault(root, threading.Lock())


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt."""


class _Checkpoint(NamedTuple):
    """A complete checkpoint folder of ours and its sequence number (None: its `DONE` file records none)."""
    path: str
    sequence: Optional[int]

    def order(self) -> tuple:
        """Sort key, larger for the checkpoint written later."""
        return (self.sequence is not None, self.sequence or 0, os.path.basename(self.path))


class DroppedItem(NamedTuple):
    """An item a restore left out: its table, key, and why (a chunk it uses could not be decoded)."""
    table: str
    key: int
    reason: str


def _partial_owner(name: str) -> Optional[int]:
    """The process id in a `.partial-<pid>-<timestamp>` folder name; None for another name."""
    pid, _, rest = name[len(_PARTIAL_PREFIX):].partition("-")
    return int(pid) if pid.isdigit() and rest else None


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _write_records(path: str, records: Iterator[bytes]) -> None:
    with open(path, "wb") as f:
        for record in records:
            f.write(_HEADER.pack(len(record), zlib.crc32(record)))
            f.write(record)
        f.flush()
        os.fsync(f.fileno())


def _open_regular(path: str):
    """`open(path, "rb")` for a regular file only; a FIFO is refused at once instead of blocking the read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # O_NONBLOCK: a FIFO opens without a writer
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise CheckpointError(f"{path}: expected a regular file, got file type {stat.filemode(mode)[0]!r} "
                              f"({stat.filemode(mode)}); a checkpoint folder holds only the files `save` writes")
    return os.fdopen(fd, "rb")


def _read_records(path: str) -> Iterator[bytes]:
    with _open_regular(path) as f:
        yield from _records_in(f, path)


def _records_in(f, path: str) -> Iterator[bytes]:
    """The records of the open file `f` (named `path` in errors), read from its current offset."""
    size = os.fstat(f.fileno()).st_size
    while True:
        header = f.read(_HEADER.size)
        if not header:
            return
        if len(header) < _HEADER.size:
            raise CheckpointError(f"{path}: truncated record header")
        length, crc = _HEADER.unpack(header)
        if length > size - f.tell():  # a corrupt length must not make us allocate it
            raise CheckpointError(f"{path}: truncated or corrupt record (length {length} at offset "
                                  f"{f.tell() - _HEADER.size}, file size {size})")
        record = f.read(length)
        if len(record) != length or zlib.crc32(record) != crc:
            raise CheckpointError(f"{path}: truncated or corrupt record")
        yield record


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DirectoryCheckpointer:
    """Checkpoints a server's tables into timestamped directories under `root`.

    Args:
      root: Directory holding the checkpoints (created if needed).
      keep_latest: How many complete checkpoints to keep (>= 1; Reverb keeps 1).
      fallback_checkpoint_path: A checkpoint directory restored when `root` holds none.
    """

    def __init__(self, root: str, *, keep_latest: int = 1, fallback_checkpoint_path: Optional[str] = None):
        if keep_latest < 1:
            raise ValueError(f"keep_latest ({keep_latest}) must be >= 1")
        self.root = os.path.abspath(root)
        self.keep_latest = keep_latest
        self.fallback_checkpoint_path = fallback_checkpoint_path
        #: The items the last `load` left out (a chunk they use could not be decoded), as `DroppedItem`s.
        self.dropped_items: list = []
        #: The checkpoint `load_latest` restored (None: none yet).
        self.restored_checkpoint: Optional[str] = None
        os.makedirs(self.root, exist_ok=True)

    def __repr__(self) -> str:
        return f"DirectoryCheckpointer(root={self.root!r}, keep_latest={self.keep_latest})"

    # --- saving ---

    def save(self, server) -> str:
        """Writes a checkpoint of every table of `server`; returns its directory.

        A failed save (e.g. `OSError` for a full disk) raises after deleting what it wrote; the previous
        checkpoints stay. Saves to one root wait for each other.
        """
        with _save_lock(self.root):
            return self._save(server)

    def _save(self, server) -> str:
        last = max(self._checkpoints(), key=lambda c: c.sequence or 0, default=None)
        sequence = (last.sequence or 0) + 1 if last is not None else 1
        if sequence > _MAX_SEQUENCE:
            raise CheckpointError(f"cannot number a checkpoint after {last.path}: its {_DONE_FILE} file records "
                                  f"sequence number {last.sequence}, the largest an int64 holds (counting from 1, "
                                  f"no checkpointer reaches it). Move that folder out of {self.root}")
        now = datetime.datetime.now(datetime.timezone.utc)
        name = now.strftime("%Y%m%dT%H%M%S.%fZ")
        final = os.path.join(self.root, name)
        while os.path.exists(final):  # two checkpoints within a microsecond
            name += "_"
            final = os.path.join(self.root, name)
        partial = os.path.join(self.root, f"{_PARTIAL_PREFIX}{os.getpid()}-{name}")
        os.makedirs(partial)

        table_records, item_records, chunks = [], [], {}
        for table_name, table in sorted(server.tables.items()):
            # Items, their priorities and times_sampled, and the counters as of one instant: a checkpoint
            # taken while clients insert and sample restores counters that agree with its items.
            entries, state = table.checkpoint_snapshot()
            info = table.info
            proto = checkpoint_pb2.PriorityTableCheckpoint(
                table_name=table_name, max_size=info.max_size, max_times_sampled=info.max_times_sampled,
                num_deleted_episodes=state["num_deleted_episodes"], num_unique_samples=state["num_unique_samples"])
            limiter = info.rate_limiter_info
            proto.rate_limiter.samples_per_insert = limiter.samples_per_insert
            proto.rate_limiter.min_diff = limiter.min_diff
            proto.rate_limiter.max_diff = limiter.max_diff
            proto.rate_limiter.min_size_to_sample = limiter.min_size_to_sample
            proto.rate_limiter.insert_count = state["inserts"]
            proto.rate_limiter.sample_count = state["samples"]
            proto.rate_limiter.delete_count = state["deletes"]
            proto.sampler.CopyFrom(protos.key_distribution_options_to_proto(info.sampler_options))
            proto.remover.CopyFrom(protos.key_distribution_options_to_proto(info.remover_options))
            if info.signature is not None:
                proto.signature.CopyFrom(protos.encode_signature(info.signature))
            table_records.append(proto.SerializeToString())
            for item, priority, times_sampled in entries:
                for chunk in item.chunks.values():
                    chunks.setdefault(chunk.key, chunk)
                item_records.append(protos.item_to_proto(item, table_name, priority=priority,
                                                        times_sampled=times_sampled).SerializeToString())
        try:
            _write_records(os.path.join(partial, _CHUNKS_FILE),
                           (chunk_codec.serialized_chunk(c) for c in chunks.values()))
            _write_records(os.path.join(partial, _ITEMS_FILE), iter(item_records))
            _write_records(os.path.join(partial, _TABLES_FILE), iter(table_records))
            _write_records(os.path.join(partial, _DONE_FILE),
                           iter([wrappers_pb2.Int64Value(value=sequence).SerializeToString()]))
            _fsync_dir(partial)
            os.rename(partial, final)  # atomic: the checkpoint appears complete or not at all
            _fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        self._delete_old(keep=final)
        return final

    def _checkpoints(self) -> list:
        """The complete checkpoints of ours under `root`, written last first."""
        found = []
        for name in os.listdir(self.root):
            path = os.path.join(self.root, name)
            # A folder itself, not a symlink to one: `keep_latest` could not delete a symlinked folder.
            if (_CHECKPOINT_NAME.fullmatch(name) and not os.path.islink(path)
                    and os.path.isfile(os.path.join(path, _DONE_FILE))):
                try:
                    found.append(_Checkpoint(path, _read_sequence(path)))
                except CheckpointError as e:
                    _log.warning("checkpoint %s is left alone: %s", path, e)
        return sorted(found, key=_Checkpoint.order, reverse=True)

    def _complete(self) -> list:
        """Complete checkpoint directories of ours, written last first."""
        return [c.path for c in self._checkpoints()]

    def _delete_old(self, keep: str) -> None:
        for path in self._complete()[self.keep_latest:]:
            if path != keep:
                shutil.rmtree(path, ignore_errors=True)
        for name in os.listdir(self.root):
            # Leftovers of interrupted saves: this process's (no other save of it runs: the lock is held) and
            # those of processes that no longer run; another process's save in progress is left alone.
            if name.startswith(_PARTIAL_PREFIX):
                owner = _partial_owner(name)
                if owner is None or owner == os.getpid() or not _process_runs(owner):
                    shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)

    def latest_checkpoint(self) -> Optional[str]:
        """The complete checkpoint under `root` written last (largest sequence number), else
        `fallback_checkpoint_path`, else None."""
        complete = self._complete()
        if complete:
            return complete[0]
        return self.fallback_checkpoint_path

    # --- loading ---

    def load_latest(self, server) -> bool:
        """Restores the checkpoint written last into `server`'s (empty) tables and logs which; False if there
        is none."""
        checkpoints = self._checkpoints()
        ours = {os.path.basename(c.path) for c in checkpoints}
        for name in sorted(os.listdir(self.root)):
            if (name not in ours and not name.startswith(".")  # .partial- folders of saves in progress
                    and os.path.isfile(os.path.join(self.root, name, _DONE_FILE))):
                why = ("a symlink, not a folder this checkpointer writes"
                       if os.path.islink(os.path.join(self.root, name))
                       else "not a checkpoint name this checkpointer writes")
                _log.info("checkpoint root %s: ignoring %s: %s (restore it with fallback_checkpoint_path or "
                          "DirectoryCheckpointer.load)", self.root, name, why)
        if checkpoints:
            path = checkpoints[0].path
            _log.info("restoring checkpoint %s (sequence %s, the last written of %d under %s)", path,
                      checkpoints[0].sequence, len(checkpoints), self.root)
        elif self.fallback_checkpoint_path is not None:
            path = self.fallback_checkpoint_path
            _log.info("restoring the fallback checkpoint %s (none under %s)", path, self.root)
        else:
            return False
        self.load(path, server)
        self.restored_checkpoint = path
        return True

    def load(self, path: str, server) -> list:
        """Restores the checkpoint at `path` into `server`'s tables (see the module docstring).

        Returns:
          The items left out because a chunk they use cannot be decoded (`DroppedItem`s; also kept in
          `dropped_items` and logged).

        Raises:
          CheckpointError: naming the first record that is malformed or breaks a rule of the insert path.
          ValueError: If the checkpoint has a table the server lacks.
        """
        if not os.path.isfile(os.path.join(path, _DONE_FILE)):
            raise CheckpointError(f"{path} is not a complete checkpoint (no {_DONE_FILE} file)")
        tables = server.tables
        checkpoints = {}
        for index, record in enumerate(_read_records(os.path.join(path, _TABLES_FILE))):
            checkpoint = _parse(checkpoint_pb2.PriorityTableCheckpoint, record, path, _TABLES_FILE, index)
            if checkpoint.table_name in checkpoints:
                raise CheckpointError(f"checkpoint {path}: {_TABLES_FILE} record {index} describes table "
                                      f"'{checkpoint.table_name}' a second time")
            checkpoints[checkpoint.table_name] = checkpoint
        unknown = sorted(name for name in checkpoints if name not in tables)
        if unknown:
            raise ValueError(f"checkpoint {path} has tables {unknown} that the server does not have "
                             f"(it has {sorted(tables)}); table names must match to restore")
        chunks, bad_chunks = _load_chunks(path)
        items: dict = {name: {} for name in checkpoints}
        dropped = []
        for index, record in enumerate(_read_records(os.path.join(path, _ITEMS_FILE))):
            proto = _parse(schema_pb2.PrioritizedItem, record, path, _ITEMS_FILE, index)
            where = f"checkpoint {path}: {_ITEMS_FILE} record {index} (item {proto.key} of table '{proto.table}')"
            if proto.table not in items:
                raise CheckpointError(f"{where} names a table the checkpoint does not describe (it describes "
                                      f"{sorted(items)})")
            if proto.key in items[proto.table]:
                raise CheckpointError(f"{where} repeats a key of an earlier item of that table: item keys must be "
                                      f"unique per table")
            item = _restored_item(proto, tables[proto.table], chunks, bad_chunks, where)
            if isinstance(item, DroppedItem):
                _log.error("%s: left out of the restore: %s", where, item.reason)
                dropped.append(item)
                continue
            items[proto.table][proto.key] = item
        store = getattr(server, "chunk_store", None)
        if store is not None:
            for layout in chunks.values():
                store.insert(layout.chunk)
        for name, checkpoint in checkpoints.items():
            table = tables[name]
            restored = sorted(items[name].values(), key=lambda it: it.inserted_at)
            restored = restored[-table.max_size:]
            table.restore(restored, _limiter_state(checkpoint, table, len(restored)))
        self.dropped_items = dropped
        return dropped


def _read_sequence(path: str) -> Optional[int]:
    """The sequence number a checkpoint's `DONE` file records; None for an empty one (written without).

    Raises:
      CheckpointError: `DONE` is not one record of an Int64Value from 1 to the int64 maximum, written as
        `save` writes it (no other fields), or is larger than such a record (it is never read whole then).
    """
    done = os.path.join(path, _DONE_FILE)
    with _open_regular(done) as f:
        size = os.fstat(f.fileno()).st_size
        if size > _MAX_DONE_BYTES:  # checked on the open file, so a hostile one is never read whole
            raise CheckpointError(f"checkpoint {path}: {_DONE_FILE} is {size} bytes, expected at most "
                                  f"{_MAX_DONE_BYTES} (one sequence-number record)")
        records = list(_records_in(f, done))
    if not records:
        return None
    if len(records) > 1:
        raise CheckpointError(f"checkpoint {path}: {_DONE_FILE} holds {len(records)} records, expected one "
                              f"(the sequence number)")
    value = _parse(wrappers_pb2.Int64Value, records[0], path, _DONE_FILE, 0).value
    if value < 1 or wrappers_pb2.Int64Value(value=value).SerializeToString() != records[0]:
        raise CheckpointError(f"checkpoint {path}: {_DONE_FILE} record 0 is not a sequence number: expected an "
                              f"Int64Value with only a value from 1 to {_MAX_SEQUENCE}, got value {value} in "
                              f"{len(records[0])} bytes {records[0][:16].hex()}")
    return value


def _parse(message_class, record: bytes, path: str, file_name: str, index: int):
    try:
        return message_class.FromString(record)
    except (message.DecodeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: {file_name} record {index} is not a "
                              f"{message_class.DESCRIPTOR.name}: {e}") from None


def _load_chunks(path: str) -> tuple:
    """`({key: its item_records.ChunkLayout}, {key: why it cannot be decoded})` of a checkpoint's chunk records."""
    chunks, bad = {}, {}
    for index, record in enumerate(_read_records(os.path.join(path, _CHUNKS_FILE))):
        proto = _parse(schema_pb2.ChunkData, record, path, _CHUNKS_FILE, index)
        key = proto.chunk_key
        if key in chunks or key in bad:
            raise CheckpointError(f"checkpoint {path}: {_CHUNKS_FILE} record {index} repeats chunk key {key}")
        try:
            chunk, headers = chunk_codec.chunk_from_proto(proto, record, check_content=True)
            chunks[key] = item_records.ChunkLayout(chunk, headers, limits.STRING_ELEMENT_BYTES,
                                                   chunk_codec.string_lengths)
        except tensor_codec.ChunkDecodeError as e:
            bad[key] = f"chunk {key} ({_CHUNKS_FILE} record {index}) cannot be decoded: {e}"
            _log.error("checkpoint %s: %s", path, bad[key])
    return chunks, bad


def _restored_item(proto, table, chunks: dict, bad_chunks: dict, where: str):
    """The core item of a checkpoint record, checked by the rules of the insert stream (`core.item_records`:
    chunk headers, not their data); a `DroppedItem` when it uses a chunk that cannot be decoded;
    CheckpointError otherwise."""
    columns = [(column.squeeze, column.chunk_slices) for column in proto.flat_trajectory.columns]
    keys = {s.chunk_key for _, slices in columns for s in slices}
    poisoned = sorted(keys & bad_chunks.keys())
    if poisoned:
        return DroppedItem(proto.table, proto.key, bad_chunks[poisoned[0]])
    missing = sorted(keys - chunks.keys())
    if missing:
        raise CheckpointError(f"{where} refers to missing chunks {limits.listed_keys(missing)}")
    try:
        item = item_records.item_from_record(table, proto.key, proto.priority, proto.times_sampled, columns,
                                             chunks.get, max_item_bytes=limits.MAX_ITEM_BYTES)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}") from None
    item.inserted_at = proto.inserted_at.seconds * 1_000_000_000 + proto.inserted_at.nanos
    return item


def _limiter_state(checkpoint, table, num_items: int) -> dict:
    """Counters for the restored table: exact when its limiter settings are unchanged, else rebalanced."""
    saved = checkpoint.rate_limiter
    now = table.info.rate_limiter_info
    same = (saved.samples_per_insert, saved.min_diff, saved.max_diff, saved.min_size_to_sample) == (
        now.samples_per_insert, now.min_diff, now.max_diff, now.min_size_to_sample)
    if same and saved.insert_count - saved.delete_count == num_items:
        inserts, samples, deletes = saved.insert_count, saved.sample_count, saved.delete_count
    else:
        inserts, deletes = num_items, 0
        samples = max(0, math.ceil(num_items * now.samples_per_insert - now.max_diff))
    return {"inserts": inserts, "samples": samples, "deletes": deletes,
            "num_deleted_episodes": checkpoint.num_deleted_episodes,
            "num_unique_samples": checkpoint.num_unique_samples}
