"""Reverb's `reverb.checkpointers` namespace, over `replay_tf.checkpointing.DirectoryCheckpointer`.

Pass one as `Server(tables, checkpointer=...)`: the server restores the newest checkpoint when it starts,
and `Client.checkpoint()` (or `Server.checkpoint()`) writes a new one and returns its path.

Differences from Reverb:
  - `Server(tables)` without a checkpointer has none (`Client.checkpoint()` raises ValueError); Reverb
    always configures `default_checkpointer()`, a fresh temporary directory that is never restored from.
    Pass `checkpointer=reverb.checkpointers.default_checkpointer()` for Reverb's behaviour.
  - `group` is refused at construction (Reverb's open-source checkpointer fails on the first save).
  - `CheckpointerBase` asks for `save(server) -> str` and `load_latest(server) -> bool`, not Reverb's
    `internal_checkpointer()` (there is no C++ checkpointer to hand over); any object with those two
    methods can be a checkpointer, and `DirectoryCheckpointer` (so every checkpointer here) is one.
  - The files are this package's own record files, not Reverb's ZLIB TFRecords: the two cannot read each
    other's checkpoints (the records inside are the same `PriorityTableCheckpoint`, `PrioritizedItem` and
    `ChunkData` messages). See `replay_tf.checkpointing` for the layout and for how tables restored
    under changed settings behave.

>>> import tempfile, replay_tf as reverb
>>> root = tempfile.mkdtemp()
>>> server = reverb.Server([reverb.Table.queue('q', 10)],
...                        checkpointer=reverb.checkpointers.DefaultCheckpointer(root))
>>> client = reverb.Client(f'localhost:{server.port}')
>>> client.insert([1.0], priorities={'q': 1.0})
>>> path = client.checkpoint(); server.stop()
>>> restored = reverb.Server([reverb.Table.queue('q', 10)],
...                          checkpointer=reverb.checkpointers.DefaultCheckpointer(root))
>>> restored.tables['q'].size()
1
>>> restored.stop()
"""
from __future__ import annotations

import abc
import tempfile
from typing import Optional

from replay_tf.checkpointing import DirectoryCheckpointer

__all__ = [
    "CheckpointerBase",
    "DefaultCheckpointer",
    "DirectoryCheckpointer",
    "TempDirCheckpointer",
    "default_checkpointer",
]


class CheckpointerBase(metaclass=abc.ABCMeta):
    """Reverb's `CheckpointerBase`: what `Server(checkpointer=...)` calls."""

    @abc.abstractmethod
    def save(self, server) -> str:
        """Writes a checkpoint of every table of `server`; returns its path."""

    @abc.abstractmethod
    def load_latest(self, server) -> bool:
        """Restores the newest checkpoint (or the fallback) into `server`; whether there was one."""


CheckpointerBase.register(DirectoryCheckpointer)


class DefaultCheckpointer(DirectoryCheckpointer):
    """Reverb's `DefaultCheckpointer`: checkpoints under `path`, keeping the latest one.

    Args:
      path: Root directory of the checkpoints (created if needed).
      group: Must be empty (Reverb's open-source checkpointer does not support groups either).
      fallback_checkpoint_path: A checkpoint directory restored when `path` holds no checkpoint.
    """

    def __init__(self, path: str, group: str = "", fallback_checkpoint_path: Optional[str] = None):
        if group:
            raise ValueError(f"group ({group!r}) must be empty: checkpoint groups are not supported (as in "
                             f"Reverb's open-source checkpointer); leave it out")
        super().__init__(path, fallback_checkpoint_path=fallback_checkpoint_path)
        self.path = self.root
        self.group = group

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path={self.path!r})"


class TempDirCheckpointer(DefaultCheckpointer):
    """Reverb's `TempDirCheckpointer`: a `DefaultCheckpointer` in a fresh `tempfile.mkdtemp()` directory."""

    def __init__(self):
        super().__init__(tempfile.mkdtemp())


def default_checkpointer(group: Optional[str] = None) -> TempDirCheckpointer:
    """Reverb's `default_checkpointer()`: a `TempDirCheckpointer` (`group` must be None or empty)."""
    if group:
        raise ValueError(f"group ({group!r}) must be None or empty: checkpoint groups are not supported")
    return TempDirCheckpointer()
