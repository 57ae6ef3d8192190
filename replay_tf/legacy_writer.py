"""Reverb's legacy `Writer` (create with `Client.writer`): timesteps appended whole, items made of the last
`num_timesteps` of them.

It runs on a `TrajectoryWriter` whose columns are the flattened leaves of a timestep, each keeping the last
`max_sequence_length` steps in chunks of `chunk_length`: an item's data is every leaf over its timesteps,
unsqueezed (`[num_timesteps, ...]`), in `tree.flatten` order, as Reverb's. On the wire each leaf has its own
chunks (Reverb's legacy writer puts all leaves of a chunk's steps in one `ChunkData`); servers and samplers
read both alike.

Differences from dm-reverb (deliberate): a step whose leaves change dtype or shape is refused by `append`,
naming the leaf (Reverb accepts it and fails later, at `flush` or `close`, with a message about
concatenating tensors), and errors name the values they refer to.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Optional

import numpy as np
import tree

from replay_tf import errors
from replay_tf.trajectory_writer import TrajectoryWriter

_log = logging.getLogger(__name__)
_DELETE_FLUSH_TIMEOUT_MS = 10_000  # how long a writer collected unclosed may take to send its pending items


class Writer:
    """Reverb's legacy writer: `append` timesteps, `create_item(table, num_timesteps, priority)`.

    Args:
      stream: an insert stream of the client's transport.
      max_sequence_length: how many recent timesteps items may refer to.
      delta_encoded: delta-encode integer tensors of rank >= 2 on the wire.
      chunk_length: timesteps per chunk (<= `max_sequence_length`).
      max_in_flight_items: at most this many items are sent and not yet confirmed (`create_item` waits
        meanwhile); None for no limit.
    """

    _closed = True  # (until constructed: a half-built writer is never flushed nor closed by `__del__`)
    _writer: Optional[TrajectoryWriter] = None

    def __init__(self, stream, max_sequence_length: int, delta_encoded: bool, chunk_length: int,
                 max_in_flight_items: Optional[int]):
        self._stream = stream
        try:
            self._writer = TrajectoryWriter(stream, num_keep_alive_refs=max_sequence_length,
                                            delta_encoded=delta_encoded)
        except BaseException:
            stream.close()
            raise
        self._max_sequence_length = max_sequence_length
        self._chunk_length = chunk_length
        self._max_in_flight_items = max_in_flight_items
        self._num_leaves: Optional[int] = None
        self._closed = False

    def __enter__(self) -> "Writer":
        if self._closed:
            raise ValueError("Cannot reuse already closed Writer")
        return self

    def __exit__(self, exc_type, exc_value, tb) -> None:
        # Flushes (RuntimeError if `close` was called in the block, as Reverb's), then closes; after a
        # ReverbError (the server failed the stream) it only closes, without waiting on the server again.
        try:
            if exc_type is None or not issubclass(exc_type, errors.ReverbError):
                self.flush()
        finally:
            if not self._closed:
                self._close(flush=False)  # (flushed above, or not to be)

    def __del__(self, _is_finalizing=sys.is_finalizing):
        # (bound at definition: while the interpreter tears modules down, this module's `sys` may be None)
        if self._closed or self._writer is None or _is_finalizing():
            return
        _log.warning("Writer-object deleted without calling .close explicitly.")
        # As Reverb, the pending items are still sent, but the collector never waits long for a server
        # that is gone (an explicit `close` or `flush` waits as long as it takes).
        try:
            self._close(flush=True, timeout_ms=_DELETE_FLUSH_TIMEOUT_MS)
        except Exception:  # noqa: BLE001  (its server gone or slow: the items are dropped)
            pass

    def __repr__(self) -> str:
        return (f"Writer(max_sequence_length={self._max_sequence_length}, chunk_length={self._chunk_length}), "
                f"closed: {self._closed}")

    def append(self, data: Any) -> None:
        """Appends one timestep (a nest of tensors) for items to refer to; nothing is sent until an item
        refers to it."""
        self._check_open()
        leaves = tree.flatten(data)
        if self._num_leaves is None:
            if not leaves:
                raise ValueError(f"A timestep must have at least one tensor, got {data!r}")
            for i in range(len(leaves)):
                self._writer.configure((i,), num_keep_alive_refs=self._max_sequence_length,
                                       max_chunk_length=self._chunk_length)
            self._num_leaves = len(leaves)
        elif len(leaves) != self._num_leaves:
            raise ValueError(f"Number of tensors per timestep was inconsistent. Previously it was "
                             f"{self._num_leaves}, but is now {len(leaves)}.")
        self._writer.append(leaves)

    def append_sequence(self, sequence: Any) -> None:
        """Appends `T` timesteps at once: every leaf of `sequence` has the leading dimension `T`."""
        self._check_open()
        leaves = [np.asarray(leaf) for leaf in tree.flatten(sequence)]
        lengths = {leaf.shape[0] if leaf.ndim else None for leaf in leaves}
        if len(lengths) != 1 or None in lengths:
            shapes = [list(leaf.shape) for leaf in leaves]
            raise ValueError(f"append_sequence needs every tensor to have the same leading dimension (the number "
                             f"of timesteps), got shapes {shapes}")
        for t in range(lengths.pop()):
            self.append([leaf[t] for leaf in leaves])

    def create_item(self, table: str, num_timesteps: int, priority: float) -> None:
        """Creates an item of `table` referring to the last `num_timesteps` timesteps; it is sent once its
        chunks are complete (`chunk_length` timesteps, or at `flush` / `close`)."""
        self._check_open()
        if num_timesteps < 1:
            raise ValueError(f"num_timesteps ({num_timesteps}) must be a positive integer")
        if num_timesteps > self._max_sequence_length:
            raise ValueError(f"`num_timesteps` must be <= `max_timesteps`: got {num_timesteps}, and the writer keeps "
                             f"max_sequence_length={self._max_sequence_length}")
        buffered = self._writer.episode_steps
        if num_timesteps > buffered:
            raise ValueError(f"Argument `num_timesteps` is larger than number of buffered timesteps: got "
                             f"{num_timesteps}, buffered {buffered}.")
        trajectory = [column[-num_timesteps:] for column in self._writer.history]
        self._writer.create_item(table, priority, trajectory)
        if self._max_in_flight_items is not None:  # items waiting for their chunks are not in flight
            self._stream.flush(self._max_in_flight_items, None)

    def flush(self) -> None:
        """Sends every pending item (completing the current chunk) and waits until the server confirms them."""
        self._check_open()
        self._writer.flush()

    def close(self, retry_on_unavailable: bool = True) -> None:
        """Flushes, then closes the writer's stream (the writer must not be used afterwards).

        `retry_on_unavailable` is accepted for Reverb's signature and ignored: the items are delivered as
        the client's insert streams deliver them.

        Raises:
          ValueError: If `close` was called before.
        """
        del retry_on_unavailable
        if self._closed:
            raise ValueError("close() has already been called on Writer.")
        self._close(flush=True)

    def _close(self, flush: bool, timeout_ms: Optional[int] = None) -> None:
        self._closed = True
        try:
            if flush:
                self._writer.flush(timeout_ms=timeout_ms)
        finally:
            self._writer.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Writer::Close has been called.")
