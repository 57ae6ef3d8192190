"""Writing to several replay servers: `ShardedClient` and its writers spread whole episodes over servers.

An extension of Reverb's API (dm-reverb has no equivalent; acme runs one writer per server). Scale-out
uses independent servers (ours or dm-reverb's), each holding the same tables: writers spread the items
over the servers, and readers interleave the servers with `replay_tf.make_reverb_dataset([address, ...])`
(or one `TrajectoryDataset` per server).

A sharded writer has the interface of the writer it wraps (`TrajectoryWriter`: `append`, `history`,
`create_item`, `flush`, `end_episode`, `episode_steps`, `configure`, `close`; `StructuredWriter`: `append`,
`step_is_open`, `flush`, `end_episode`, `close`) and keeps one writer per server. Chunks belong to one
server, and items refer to steps of their episode, so the writer routes *whole episodes*: every step and
item of an episode go to one server, and the writer moves to the next server after each
`end_episode(clear_buffers=True)` that completed. With `clear_buffers=False` the writer stays on the
same server (the next episode's items may still refer to the previous episode's steps, which live there)
and both count as one episode for routing.

Routing, per writer:
  - round-robin (default): episode `i` of the `w`-th writer the client created goes to server
    `(w + i) % len(addresses)`, so several writers of one client start on different servers;
  - by key: `trajectory_writer(..., key=actor_id)` pins every episode of the writer to server
    `crc32(str(key)) % len(addresses)` (stable across processes: actor `k` always feeds the same server);
  - custom: `ShardedClient(addresses, route=fn)` with `fn(writer_index, episode_index) -> server index`.

>>> import numpy as np, replay_tf as reverb
>>> servers = [reverb.Server([reverb.Table.queue('q', 10)]) for _ in range(2)]
>>> client = reverb.ShardedClient([s.address for s in servers])
>>> with client.trajectory_writer(num_keep_alive_refs=1) as writer:
...   for episode in range(4):
...     writer.append({'x': np.int32(episode)})
...     writer.create_item('q', 1.0, writer.history['x'][-1:])
...     writer.end_episode()
>>> [s.table('q').size() for s in servers]
[2, 2]
>>> for s in servers:
...   s.stop()
"""
from __future__ import annotations

import itertools
import threading
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from replay_tf.writing.context import FlushOnExitCloseOnDelete
from replay_tf.client import Client

Route = Callable[[int, int], int]


class ShardedClient:
    """Clients of several replay servers holding the same tables; its writers route episodes over them.

    Args:
      server_addresses: `host:port` of each server (at least one; local servers are reached in process).
      route: How writers choose the server of each episode: "round_robin" (default), or a function
        `(writer_index, episode_index) -> server index` (taken modulo the number of servers).
    """

    def __init__(self, server_addresses: Sequence[str], *, route: Union[str, Route] = "round_robin"):
        if isinstance(server_addresses, str):
            raise TypeError(f"server_addresses must be a sequence of 'host:port' strings, got the string "
                            f"{server_addresses!r} (use replay_tf.Client for one server)")
        addresses = list(server_addresses)
        if not addresses:
            raise ValueError("server_addresses must name at least one server, got an empty sequence")
        if route != "round_robin" and not callable(route):
            raise ValueError(f"route must be 'round_robin' or a function (writer_index, episode_index) -> server "
                             f"index, got {route!r}")
        self._addresses = addresses
        self._clients = [Client(address) for address in addresses]
        self._route = route
        self._writers_created = itertools.count()
        self._inserts = itertools.count()
        self._lock = threading.Lock()

    def __reduce__(self):
        # Picklable like `Client` (actors in other processes get their own connections); a custom route
        # must be picklable itself (a module-level function).
        return _sharded_client, (self._addresses, self._route)

    def __repr__(self) -> str:
        return f"ShardedClient({self._addresses!r})"

    @property
    def server_addresses(self) -> List[str]:
        return list(self._addresses)

    @property
    def clients(self) -> List[Client]:
        """One `Client` per server, in the order of `server_addresses`."""
        return list(self._clients)

    def _router(self, key: Any) -> Callable[[int], int]:
        n = len(self._clients)
        if key is not None:
            shard = zlib.crc32(str(key).encode("utf-8")) % n
            return lambda episode: shard
        with self._lock:
            writer_index = next(self._writers_created)
        if self._route == "round_robin":
            return lambda episode: (writer_index + episode) % n
        route = self._route
        return lambda episode: int(route(writer_index, episode)) % n

    def trajectory_writer(self, num_keep_alive_refs: int, *, validate_items: bool = True,
                          get_signature_timeout_ms: Optional[int] = None, key: Any = None) -> "ShardedWriter":
        """A `TrajectoryWriter` interface whose episodes go to the servers in turn (or, with `key`, to the
        server of that key). Each server's writer is opened with its first episode, and fetching its
        signatures waits at most `get_signature_timeout_ms` (see `Client.trajectory_writer`)."""
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive integer")
        return ShardedWriter(
            lambda client: client.trajectory_writer(num_keep_alive_refs, validate_items=validate_items,
                                                    get_signature_timeout_ms=get_signature_timeout_ms),
            self._clients, self._router(key))

    def structured_writer(self, configs, *, key: Any = None) -> "ShardedWriter":
        """A `StructuredWriter` interface whose episodes go to the servers in turn (or to the server of `key`)."""
        if not configs:
            raise ValueError("At least one config must be provided.")
        return ShardedWriter(lambda client: client.structured_writer(configs), self._clients, self._router(key))

    def insert(self, data: Any, priorities: Dict[str, float]) -> None:
        """`Client.insert` on the servers in turn (each call is one single-step episode)."""
        with self._lock:
            shard = next(self._inserts) % len(self._clients)
        self._clients[shard].insert(data, priorities)

    def server_info(self, timeout: Optional[int] = None) -> List[Dict[str, Any]]:
        """Each server's `server_info()`, in the order of `server_addresses`."""
        return [client.server_info(timeout) for client in self._clients]


def _sharded_client(server_addresses: Sequence[str], route: Union[str, Route]) -> ShardedClient:
    return ShardedClient(server_addresses, route=route)


class ShardedWriter(FlushOnExitCloseOnDelete):
    """A writer (trajectory or structured) routing whole episodes to one of several servers.

    Create it with `ShardedClient.trajectory_writer` or `ShardedClient.structured_writer`.
    """

    def __init__(self, make_writer: Callable[[Client], Any], clients: Sequence[Client],
                 route: Callable[[int], int]):
        self._make_writer = make_writer
        self._clients = list(clients)
        self._route = route
        self._writers: Dict[int, Any] = {}
        self._configured: List[Tuple[tuple, int, Optional[int]]] = []
        self._episode = 0
        self._current = self._writer(route(0))
        self._closed = False

    def _writer(self, shard: int):
        writer = self._writers.get(shard)
        if writer is None:
            writer = self._writers[shard] = self._make_writer(self._clients[shard])
            for path, num_keep_alive_refs, max_chunk_length in self._configured:
                writer.configure(path, num_keep_alive_refs=num_keep_alive_refs, max_chunk_length=max_chunk_length)
        return writer

    @property
    def current_server_address(self) -> str:
        """The server the current episode goes to."""
        for shard, writer in self._writers.items():
            if writer is self._current:
                return self._clients[shard].server_address
        raise AssertionError("the current writer is not one of the shards")  # unreachable

    # --- the wrapped writer's interface, on the current episode's writer ---

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        self._current.append(data, partial_step=partial_step)

    @property
    def history(self):
        return self._current.history

    @property
    def episode_steps(self) -> int:
        return self._current.episode_steps

    @property
    def step_is_open(self) -> bool:
        return self._current.step_is_open

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        self._current.create_item(table, priority, trajectory)

    def configure(self, path: Tuple[Union[int, str], ...], *, num_keep_alive_refs: int,
                  max_chunk_length: Optional[int]) -> None:
        """Configures the column on every server's writer (those opened later too)."""
        self._current.configure(path, num_keep_alive_refs=num_keep_alive_refs, max_chunk_length=max_chunk_length)
        self._configured.append((tuple(path), num_keep_alive_refs, max_chunk_length))
        for writer in self._writers.values():
            if writer is not self._current:
                writer.configure(path, num_keep_alive_refs=num_keep_alive_refs, max_chunk_length=max_chunk_length)

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        """Blocks until at most `block_until_num_items` items of the current episode are unconfirmed (the
        items of earlier episodes were confirmed when they ended)."""
        self._current.flush(block_until_num_items, timeout_ms)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None:
        """Ends the episode on its server; the next episode goes to the next server (with
        `clear_buffers=True`; otherwise it stays on this server). A timeout leaves the episode open, on
        its server."""
        self._current.end_episode(clear_buffers=clear_buffers, timeout_ms=timeout_ms)
        if clear_buffers:
            self._episode += 1
            self._current = self._writer(self._route(self._episode))

    def close(self) -> None:
        """Closes every server's writer; items not yet confirmed may be dropped (flush first)."""
        if not self._closed:
            self._closed = True
            for writer in self._writers.values():
                writer.close()
