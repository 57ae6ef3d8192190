"""Same-machine sample slots: rl-data-tf's shared-memory extension of stacked `SampleStream`s.

gRPC Python copies a large message about six times between a server's stacked columns and a client's
arrays (the server's join and send, the kernel's send and receive, then one `bytes` per slice and their
join in the client): for Atari-like samples that is most of the CPU time of both processes. When the
client runs on the server's machine it can offer a segment of shared memory instead, and the server
gathers each stacked response straight into a slot of it; the gRPC message then only names the slot.

Protocol (fields in `reverb_service.proto`):
  - The client creates `/dev/shm/replay_tf-<32 hex digits>` (mode 0600, every page allocated up front so a
    full tmpfs fails here, not as a SIGBUS in the server), maps it, and offers it in the first request of
    a call (`SampleStreamRequest.replay_tf_shared_memory`, with `replay_tf_stacked`).
  - A server on the same machine, running as the same user, opens it, checks it (a name of that form, a
    regular file owned by the server's user, the announced size, fully allocated), maps it and unlinks
    the name: nothing is left behind however either process ends. Any other server, a remote one or a
    Reverb server, finds nothing or ignores the field: responses then come inline, as before.
  - The segment is a header of `HEADER_BYTES` (byte i: 1 while slot i holds a response the client has not
    read yet) and `num_slots` slots. The server writes a stacked response (the bytes it would otherwise
    send) into a slot whose byte is 0, sets the byte to 1 and sends `SampleStreamResponse.
    replay_tf_shared_slot` (slot, size); the client copies the response out of the slot and sets the byte
    back to 0. With no slot free the server waits (back-pressure, as a full HTTP/2 window would make
    it); a response too big for a slot is sent inline.

Trust: only processes of the server's user can open the segment, and they could read the server's memory
anyway. A client that shrinks its own segment under a server could crash that server (SIGBUS), which any
process of that user can do to it by other means too. Set the environment variable
`REPLAY_TF_SHARED_MEMORY=0` to turn the extension off (clients then never offer, servers never accept).
"""
from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import stat
import sys
import threading
import time
from typing import Callable, Optional

from replay_tf import errors
from replay_tf.wire import reverb_service_pb2

ENV = "REPLAY_TF_SHARED_MEMORY"
DIRECTORY = "/dev/shm"
HEADER_BYTES = 64
MAX_SLOTS = HEADER_BYTES
NUM_SLOTS = 8
SLOT_BYTES = (2 << 20) + (64 << 10)  # a stacked response of ~2 MiB (the server's target) and its fields
MAX_SLOT_BYTES = 64 << 20
_NAME = re.compile(r"replay_tf-[0-9a-f]{32}\Z")
_WAIT_S = (50e-6, 2e-3)  # the server's polling interval while no slot is free: first, longest

_log = logging.getLogger(__name__)


def enabled() -> bool:
    """Whether this process takes part: Linux with `/dev/shm`, and not turned off by `REPLAY_TF_SHARED_MEMORY=0`."""
    return sys.platform.startswith("linux") and os.environ.get(ENV, "1") != "0" and os.path.isdir(DIRECTORY)


class Ring:
    """A segment of slots shared by a client and a server on one machine: `create` (the client: makes and
    maps it, `offer`s it) or `attach` (the server: maps the offered one). The writer (the server, for
    sample responses) `acquire`s a free slot, fills it, `publish`es it and sends its number; the reader
    (the client) `take`s the slot's content, which frees it."""

    def __init__(self, segment: mmap.mmap, num_slots: int, slot_bytes: int, name: str, path: Optional[str]):
        self._map: Optional[mmap.mmap] = segment
        self._view = memoryview(segment)
        self.num_slots, self.slot_bytes = num_slots, slot_bytes
        self.name = name
        self._path = path  # (while the name exists and is ours to remove)
        self._next = 0
        self._lock = threading.Lock()

    @classmethod
    def create(cls, num_slots: Optional[int] = None, slot_bytes: Optional[int] = None) -> "Ring":
        """A new segment (the client's side). Raises OSError when it cannot be made (e.g. /dev/shm full)."""
        num_slots = NUM_SLOTS if num_slots is None else num_slots
        slot_bytes = SLOT_BYTES if slot_bytes is None else slot_bytes
        name = "replay_tf-" + secrets.token_hex(16)
        path = os.path.join(DIRECTORY, name)
        size = HEADER_BYTES + num_slots * slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # (ENOSPC here, rather than SIGBUS in the server later)
            segment = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        return cls(segment, num_slots, slot_bytes, name, path)

    @classmethod
    def attach(cls, offer: reverb_service_pb2.SharedMemoryRing) -> Optional["Ring"]:
        """The segment `offer` names (the server's side), if it is a valid segment of a client on this
        machine running as this process's user; None otherwise (the stream then stays inline)."""
        if not enabled():
            return None
        name, num_slots, slot_bytes = offer.name, offer.num_slots, offer.slot_bytes
        if (not _NAME.match(name) or not 1 <= num_slots <= MAX_SLOTS
                or not HEADER_BYTES <= slot_bytes <= MAX_SLOT_BYTES):
            _log.debug("shared-memory offer refused: %r (%d slots of %d bytes)", name, num_slots, slot_bytes)
            return None
        path = os.path.join(DIRECTORY, name)
        size = HEADER_BYTES + num_slots * slot_bytes
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # (a client on another machine, or one that gave up)
            return None
        try:
            info = os.fstat(fd)
            if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size != size
                    or info.st_blocks * 512 < size):
                _log.debug("shared-memory offer refused: %s is not a fully allocated file of %d bytes owned by "
                           "this user", path, size)
                return None
            segment = mmap.mmap(fd, size)
        except OSError:
            return None
        finally:
            os.close(fd)
        ring = cls(segment, num_slots, slot_bytes, name, path)
        ring.unlink()  # (mapped on both sides now: nothing to clean up whoever ends first)
        return ring

    def offer(self) -> reverb_service_pb2.SharedMemoryRing:
        return reverb_service_pb2.SharedMemoryRing(name=self.name, num_slots=self.num_slots,
                                                   slot_bytes=self.slot_bytes)

    def unlink(self) -> None:
        """Removes the segment's name; the mappings stay valid. The server does when it maps the segment,
        the client once the server answered (it mapped it, or never will) and when it closes."""
        path, self._path = self._path, None
        if path is not None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def acquire(self, cancelled: Callable[[], bool]) -> Optional[tuple]:
        """`(slot, buffer)` of a free slot, waiting while none is; None once `cancelled()` is true."""
        segment, count = self._map, self.num_slots
        wait = _WAIT_S[0]
        while not cancelled():
            slot = segment.find(b"\x00", self._next, count)
            if slot < 0:
                slot = segment.find(b"\x00", 0, self._next)
            if slot >= 0:
                self._next = (slot + 1) % count
                start = HEADER_BYTES + slot * self.slot_bytes
                return slot, self._view[start:start + self.slot_bytes]
            time.sleep(wait)
            wait = min(wait * 2, _WAIT_S[1])
        return None

    def publish(self, slot: int) -> None:
        """Marks `slot` filled: the reader may take it (send its number after this)."""
        self._map[slot] = 1

    def take(self, slot: int, size: int) -> bytes:
        """A copy of the content of `slot` (its first `size` bytes); frees the slot for the writer.

        Raises:
          errors.ReverbError: a slot or size out of the segment, or a slot the writer has not filled.
        """
        with self._lock:
            segment = self._map
            if segment is None:
                raise errors.ReverbError("a shared-memory slot was named after the stream closed")
            if not 0 <= slot < self.num_slots or not 0 < size <= self.slot_bytes:
                raise errors.ReverbError(f"shared-memory slot {slot} of {size} bytes named, expected a slot below "
                                         f"{self.num_slots} of 1 to {self.slot_bytes} bytes")
            if segment[slot] != 1:
                raise errors.ReverbError(f"shared-memory slot {slot} named, which the writer did not mark as "
                                         f"filled")
            start = HEADER_BYTES + slot * self.slot_bytes
            data = segment[start:start + size]  # (one copy: the slot is free again at once)
            segment[slot] = 0
            return data

    def close(self) -> None:
        self.unlink()
        with self._lock:
            segment, self._map = self._map, None
        if segment is not None:
            try:
                self._view.release()
                segment.close()
            except BufferError:  # (a slot's buffer still referenced somewhere: the GC unmaps it later)
                pass

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass
