"""`Client`: Reverb's Python client over a pluggable transport.

`Client(address)` uses the in-process transport when a `Server` of this process owns `address` (tables are
called directly: no serialization, no copies on insert), and otherwise the remote transport from
`replay_tf.grpc.client.client_transport`, imported lazily (see `replay_tf.transport.base`, which also holds
`set_connection_options`).

>>> import replay_tf as reverb
>>> server = reverb.Server([reverb.Table.queue('q', 10)])
>>> client = reverb.Client(f'localhost:{server.port}')
>>> client.insert([1.0, 2], priorities={'q': 1.0})
>>> [sample] = next(client.sample('q'))
>>> [float(x) for x in sample.data]
[1.0, 2.0]
>>> server.stop()
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Iterator, List, Optional

import numpy as np
import tree

from replay_tf.transport import base as transport_lib
from replay_tf import errors
from replay_tf.writing.leaves import leaf_array
from replay_tf.transport.base import Transport
from replay_tf.transport.base import set_connection_options  # noqa: F401  (a public name of this module)
from replay_tf.legacy_writer import Writer
from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo
from replay_tf.trajectory_writer import TrajectoryWriter
from replay_tf.core.chunk_store import Chunk, ChunkSlice, Column, Item, SequenceRange, new_key


class Client:
    """Reverb's `reverb.Client`: insert, sample, mutate and inspect tables of a server.

    Args:
      server_address: `host:port` of the server, e.g. `f'localhost:{server.port}'`.
      channel_credentials: Keyword-only, an addition to Reverb: `grpc.ChannelCredentials` for a server
        started with TLS (`Server(server_credentials=...)`); default: `set_connection_options` or the
        environment (`REPLAY_TF_TLS_ROOT_CERTS`).
      auth_token: Keyword-only, an addition to Reverb: token of a server started with `auth_token`; default:
        `set_connection_options` or `REPLAY_TF_AUTH_TOKEN`. A refused call raises `ReverbError` naming
        gRPC status UNAUTHENTICATED.
      timeout_ms: Keyword-only, an addition to Reverb: how long `server_info()` without a timeout and the
        signature fetch of `trajectory_writer` wait for the server before raising `DeadlineExceededError`
        (see `set_connection_options`, whose `timeout_ms` is the default); None: they wait.

    A `Client` pickled for another process (multiprocessing) reconnects by address (with its `timeout_ms`):
    explicit credentials and tokens are not pickled; the other process finds them with
    `set_connection_options` or the environment.
    """

    def __init__(self, server_address: str, *, channel_credentials=None, auth_token: Optional[str] = None,
                 timeout_ms: Optional[int] = None):
        self._server_address = server_address
        self._timeout_ms = transport_lib.checked_timeout_ms(timeout_ms, "timeout_ms")
        if channel_credentials is None and auth_token is None:
            self._transport = transport_lib.make_transport(server_address)
        else:
            self._transport = transport_lib.make_transport(
                server_address, channel_credentials=channel_credentials, auth_token=auth_token)
        self._signature_cache: Dict[str, Any] = {}

    def __reduce__(self):
        # The address and timeout only: secrets are never pickled (see the class docstring).
        if self._timeout_ms is None:
            return Client, (self._server_address,)
        return functools.partial(Client, timeout_ms=self._timeout_ms), (self._server_address,)

    def __repr__(self) -> str:
        return f"Client(server_address={self._server_address!r})"

    @property
    def server_address(self) -> str:
        return self._server_address

    @property
    def transport(self) -> Transport:
        return self._transport

    def insert(self, data: Any, priorities: Dict[str, float]) -> None:
        """Inserts `data` (one step) as a length-1 item into every table of `priorities`; blocks until done."""
        if not priorities:
            raise ValueError("priorities must contain at least one item")
        # Every leaf must be set: None is refused too.
        flat = [leaf_array(leaf, path, "the inserted data") for path, leaf in tree.flatten_with_path(data)]
        if not flat:
            raise ValueError(f"data must have at least one leaf, got {data!r}")
        # Like Reverb's legacy writer: one chunk holding one length-1 tensor per leaf.
        chunk = Chunk(new_key(), [leaf[np.newaxis] for leaf in flat], SequenceRange(new_key(), 0, 0))
        trajectory = tuple(Column((ChunkSlice(chunk.key, 0, 1, i),), False) for i in range(len(flat)))
        stream = self._transport.open_insert_stream()
        try:
            for table, priority in priorities.items():
                stream.send(table, Item(new_key(), priority, trajectory, [chunk]))
            stream.flush(0, None)
        finally:
            stream.close()

    def sample(self, table: str, num_samples: int = 1, *, emit_timesteps: bool = True,
               unpack_as_table_signature: bool = False) -> Iterator:
        """Yields `num_samples` samples of `table` (blocking on its rate limiter).

        Yields lists of per-timestep `ReplaySample`s when `emit_timesteps`, else one `ReplaySample` whose
        data is flat, or shaped like the table signature when `unpack_as_table_signature`.
        """
        if num_samples < 1:  # (-1 takes none, as in Reverb)
            if num_samples == -1:
                return
            raise ValueError(f"max_samples ({num_samples}) must be -1 or >= 1")
        signature = self._get_signature_for_table(table) if unpack_as_table_signature else None
        unflatten = (lambda x: tree.unflatten_as(signature, x)) if signature else (lambda x: x)
        stream = self._transport.open_sample_stream(table, 1, None, max_samples=num_samples)
        try:
            for _ in range(num_samples):
                [sampled] = stream.next_batch()
                info = SampleInfo(key=sampled.item.key, probability=float(sampled.probability),
                                  table_size=int(sampled.table_size), priority=float(sampled.priority),
                                  times_sampled=int(sampled.times_sampled))
                data = [np.array(column) for column in sampled.item.column_arrays()]
                if emit_timesteps:
                    if len({len(col) if np.ndim(col) else -1 for col in data}) != 1 or np.ndim(data[0]) == 0:
                        raise ValueError("Can't split non timestep trajectory into timesteps.")
                    yield [ReplaySample(info=info, data=unflatten([np.asarray(col[i], col.dtype) for col in data]))
                           for i in range(data[0].shape[0])]
                else:
                    yield ReplaySample(info, unflatten(data))
        finally:
            stream.close()

    def mutate_priorities(self, table: str, updates: Optional[Dict[int, float]] = None,
                          deletes: Optional[List[int]] = None) -> None:
        """Deletes `deletes` keys, then updates priorities (unknown keys are ignored)."""
        self._transport.mutate_priorities(table, list((updates or {}).items()),
                                          [] if deletes is None else [int(k) for k in deletes])

    def reset(self, table: str) -> None:
        """Deletes every item of `table` and resets its rate limiter."""
        self._transport.reset(table)

    def server_info(self, timeout: Optional[int] = None) -> Dict[str, Any]:
        """Table name -> `TableInfo`; `timeout` (seconds; None or 0: the client's `timeout_ms`, else waits)
        raises `DeadlineExceededError`."""
        if not timeout:
            timeout_ms = self._default_timeout_ms()
            timeout = None if timeout_ms is None else timeout_ms / 1000.0
        info = self._transport.server_info(timeout)
        self._signature_cache = {name: table_info.signature for name, table_info in info.items()}
        return info

    def _default_timeout_ms(self) -> Optional[int]:
        if self._timeout_ms is not None:
            return self._timeout_ms
        return transport_lib.connection_timeout_ms(self._server_address)

    def checkpoint(self) -> str:
        """Checkpoints the server; returns the checkpoint's path."""
        return self._transport.checkpoint()

    def trajectory_writer(self, num_keep_alive_refs: int, *, validate_items: bool = True,
                          get_signature_timeout_ms: Optional[int] = None):
        """A `TrajectoryWriter` keeping the last `num_keep_alive_refs` steps of each column referable.

        Args:
          num_keep_alive_refs: How many recent steps of each column items may refer to (>= 1).
          validate_items: Fetch the tables' signatures from the server now and check every item against
            them in `create_item`.
          get_signature_timeout_ms: How long fetching the signatures may wait for the server (Acme passes
            it, as older Reverb releases took it); None: the client's `timeout_ms`, else no limit.

        Raises:
          DeadlineExceededError: The server did not answer within the timeout (the message names the
            address: a wrong one, or a server that is not up).
        """
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive integer")
        timeout_ms = transport_lib.checked_timeout_ms(get_signature_timeout_ms, "get_signature_timeout_ms")
        signatures = self._signatures_for_writer(timeout_ms) if validate_items else None
        return TrajectoryWriter(self._transport.open_insert_stream(), num_keep_alive_refs=num_keep_alive_refs,
                                table_infos=signatures)

    def _signatures_for_writer(self, timeout_ms: Optional[int]) -> Dict[str, Any]:
        what = "get_signature_timeout_ms"
        if timeout_ms is None:
            timeout_ms, what = self._default_timeout_ms(), "timeout_ms"
        try:
            return self.server_info(None if timeout_ms is None else timeout_ms / 1000.0)
        except errors.DeadlineExceededError as e:
            raise errors.DeadlineExceededError(
                f"trajectory_writer could not fetch the table signatures from the replay server at "
                f"{self._server_address} within {what}={timeout_ms} ms: {e}") from e

    def writer(self, max_sequence_length: int, delta_encoded: bool = False, chunk_length: Optional[int] = None,
               max_in_flight_items: Optional[int] = 25):
        """Reverb's legacy `Writer` (prefer `trajectory_writer`): items of the last `num_timesteps` appended
        timesteps, up to `max_sequence_length`; `chunk_length` defaults to `min(10, max_sequence_length)`.

        Raises:
          ValueError: If `max_sequence_length` or `max_in_flight_items` is < 1, or `chunk_length` is not in
            [1, max_sequence_length].
        """
        if max_sequence_length < 1:
            raise ValueError(f"max_sequence_length ({max_sequence_length}) must be a positive integer")
        if chunk_length is None:
            chunk_length = min(10, max_sequence_length)
        if chunk_length < 1 or chunk_length > max_sequence_length:
            raise ValueError(f"chunk_length ({chunk_length}) must be a positive integer le to max_sequence_length "
                             f"({max_sequence_length})")
        if max_in_flight_items is not None and max_in_flight_items < 1:
            raise ValueError(f"max_in_flight_items ({max_in_flight_items}) must be a positive integer")
        return Writer(self._transport.open_insert_stream(), max_sequence_length, delta_encoded, chunk_length,
                      max_in_flight_items)

    def structured_writer(self, configs):
        """A `StructuredWriter` applying the pattern `configs` to every appended step."""
        from replay_tf.structured_writer import StructuredWriter  # noqa: PLC0415  (imports TensorFlow)

        if not configs:
            raise ValueError("At least one config must be provided.")
        return StructuredWriter(self._transport.open_insert_stream(), configs)

    def _get_signature_for_table(self, table: str):
        if table not in self._signature_cache:
            self.server_info()
        if table not in self._signature_cache:
            raise ValueError(f"Could not find table '{table}'. Available tables: {sorted(self._signature_cache)}")
        return self._signature_cache[table]
