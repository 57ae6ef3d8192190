"""`Server`: owns tables and serves them in-process (and, when `replay_tf.grpc.server.service` exists, over gRPC).

A server registers itself under `localhost:<port>` (and the loopback aliases) so that a `Client` created in
the same process talks to its tables directly, with no serialization. The gRPC listener is started by the
`_start_service` hook; it binds to localhost unless `host` is given (Reverb binds every interface).

>>> import replay_tf as reverb
>>> server = reverb.Server([reverb.Table.queue('q', 10)])
>>> client = reverb.Client(f'localhost:{server.port}')
>>> sorted(client.server_info())
['q']
>>> server.stop()
"""
from __future__ import annotations

import importlib.util
import signal
import socket
import threading
from typing import Optional, Sequence

from replay_tf.transport import local_servers
from replay_tf import client
from replay_tf import errors
from replay_tf.core.chunk_store import ChunkStore
from replay_tf.core.chunk_store import new_key_bits
from replay_tf.table import Table
from replay_tf.core.table import TableExtensionBase  # noqa: F401  (Reverb's `reverb.server.TableExtensionBase`)

def _pick_unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


class Server:
    """Reverb's `reverb.Server`: a set of uniquely named tables reachable at `localhost:<port>`.

    Args:
      tables: At least one `Table`, with unique names.
      port: Port to serve on; `None` picks an unused one.
      checkpointer: Optional checkpointer with `save(server) -> str` and `load_latest(server) -> bool`
        (called at construction to restore the newest checkpoint).
      host: Interface the network listener binds to (keyword-only; default localhost). Reverb binds every
        interface; pass "0.0.0.0" (or "[::]") for that, knowing the tables are then served unauthenticated.
      max_message_bytes: Largest gRPC request the listener accepts, in bytes (keyword-only; `None` for the
        default of `replay_tf.grpc.server.service.DEFAULT_MAX_MESSAGE_BYTES`, -1 for no limit). A larger request (e.g.
        an insert carrying a huge chunk) fails with `RESOURCE_EXHAUSTED`; the server keeps serving. Reverb's
        C++ server accepts messages of any size. In-process clients are never limited.
      server_credentials: `grpc.ServerCredentials` (e.g. `grpc.ssl_server_credentials([(key_pem, cert_pem)])`)
        to serve over TLS (keyword-only, an addition: Reverb has no TLS); clients then need matching
        `channel_credentials` (`Client(..., channel_credentials=...)` or `replay_tf.set_connection_options`).
      auth_token: Keyword-only, an addition: every gRPC call must carry `authorization: Bearer <token>`
        metadata (`Client(..., auth_token=...)`, `replay_tf.set_connection_options`, or the
        `REPLAY_TF_AUTH_TOKEN` environment variable); others fail with UNAUTHENTICATED. Checked in constant
        time. Send tokens only over TLS or loopback. Clients in this process reach the tables in-process,
        without credentials: code running in the server's process is trusted (it could read the tables'
        memory anyway).
      max_streams: Keyword-only, an addition: most gRPC streams (writers, samplers, datasets) open at once,
        idle ones and samplers waiting on a rate limiter included (`None` for
        `replay_tf.grpc.server.service.DEFAULT_MAX_STREAMS`, 4096). One more fails at once with RESOURCE_EXHAUSTED;
        unary calls (server_info, mutate_priorities, reset, checkpoint) are always served. Reverb's C++
        server has no such limit.

    Binding a non-loopback `host` without TLS logs a warning (a token alone travels in plaintext). A Server
    that fails to start its listener (e.g. the port is taken) raises and leaves no trace in the process.

    >>> server = Server([Table.queue('q', 10)], max_message_bytes=1 << 20)
    >>> server.max_message_bytes
    1048576
    >>> server.stop()
    """

    def __init__(self, tables: Optional[Sequence[Table]] = None, port: Optional[int] = None, checkpointer=None, *,
                 host: str = "localhost", max_message_bytes: Optional[int] = None, server_credentials=None,
                 auth_token: Optional[str] = None, max_streams: Optional[int] = None):
        tables = list(tables or ())
        if not tables:
            raise ValueError("At least one table must be provided")
        names = [t.name for t in tables]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"Multiple items in tables have the same name: {', '.join(duplicates)}")
        for table in tables:
            if not isinstance(table, Table):
                raise TypeError(f"tables must be replay_tf.Table objects, got {table!r}")
        if max_message_bytes is not None and (isinstance(max_message_bytes, bool) or max_message_bytes < 1
                                              and max_message_bytes != -1):
            raise ValueError(f"max_message_bytes ({max_message_bytes!r}) must be a positive number of bytes, -1 "
                             f"for no limit, or None for the default")
        if auth_token is not None and (not isinstance(auth_token, str) or not auth_token.strip()):
            raise ValueError(f"auth_token must be a non-empty str or None, got {type(auth_token).__name__}")
        if max_streams is not None and (isinstance(max_streams, bool) or not isinstance(max_streams, int)
                                        or max_streams < 1):
            raise ValueError(f"max_streams ({max_streams!r}) must be a positive int (the most gRPC streams open "
                             f"at once), or None for the default")
        self._tables = {t.name: t for t in tables}
        self._host = host
        #: Read by `replay_tf.grpc.server.service.start`: TLS credentials and the token calls must carry.
        self.server_credentials = server_credentials
        self.auth_token = auth_token
        #: Read by `replay_tf.grpc.server.service.start` when it starts the listener.
        self.max_message_bytes = None if max_message_bytes is None else int(max_message_bytes)
        self.max_streams = max_streams
        self._port = _pick_unused_port() if port is None else int(port)
        self._checkpointer = checkpointer
        self.chunk_store = ChunkStore()
        # Reverb's ServerInfo carries a random 128-bit id fixed for the server's lifetime (from the key
        # generator, which user code cannot seed: two servers must not share an id).
        self.tables_state_id = new_key_bits(128)
        self._stopped = threading.Event()
        if checkpointer is not None and hasattr(checkpointer, "load_latest"):
            checkpointer.load_latest(self)
        local_servers.register(self._port, self)
        try:
            self._service = self._start_service()
        except BaseException:
            # Unregistered: a failed Server (e.g. its port is taken by another process) must not answer
            # in-process clients of that port, which would then miss the process that owns it.
            self._stopped.set()
            local_servers.unregister(self._port, self)
            raise

    def _start_service(self):
        """Hook that starts the network listener (`replay_tf.grpc.server.service.start(server)`), when that
        module exists."""
        if importlib.util.find_spec("replay_tf.grpc.server.service") is None:
            return None
        from replay_tf.grpc.server import service  # noqa: PLC0415  (the gRPC layer is optional for in-process use)
        start = getattr(service, "start", None)
        return start(self) if start is not None else None

    @property
    def port(self) -> int:
        return self._port

    @property
    def host(self) -> str:
        return self._host

    @property
    def address(self) -> str:
        return f"localhost:{self._port}"

    @property
    def checkpointer(self):
        return self._checkpointer

    @property
    def tables(self) -> dict:
        """Table name -> `Table`."""
        return dict(self._tables)

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    @property
    def serving(self) -> bool:
        """False once the network listener no longer answers calls: after `stop()`, or when an error ended the
        gRPC server's thread (the process then has to be restarted). True for a server without a listener."""
        return bool(getattr(self._service, "serving", True))

    def table(self, name: str) -> Table:
        """The table called `name`; `TableNotFoundError` (a ValueError) listing the tables otherwise."""
        table = self._tables.get(name)
        if table is None:
            raise errors.table_not_found(name, self._tables)
        return table

    def checkpoint(self) -> str:
        """Writes a checkpoint with the server's checkpointer and returns its path."""
        if self._checkpointer is None:
            raise ValueError("this server has no checkpointer: pass checkpointer=... to Server to checkpoint")
        return self._checkpointer.save(self)

    def refuse_inserts(self) -> None:
        """Makes every table refuse inserts from now on (sampling goes on): remote writers get UNAVAILABLE and
        keep their unconfirmed items to send again. Called before a final checkpoint (`replay-tf serve` on
        exit), so that every item whose insert was confirmed is in it."""
        for table in self._tables.values():
            table.refuse_inserts()

    def localhost_client(self):
        """A `Client` for this server."""
        return client.Client(self.address)

    def stop(self) -> None:
        """Closes every table (blocked calls fail with `CancelledError`) and the network listener.

        As in Reverb, the tables are closed first: an insert or sample waiting on a rate limiter, in this
        process or over gRPC, fails at once with `CancelledError` naming the closed table. The listener then
        gives calls still running up to 0.5 s to end (so that those errors reach remote clients
        instead of a bare "Cancelling all calls"), and cancels the rest (e.g. idle streams).
        """
        if self._stopped.is_set():
            return
        self._stopped.set()
        for table in self._tables.values():
            table.close()
        if self._service is not None:
            try:
                self._service.stop(0.5)
            except TypeError:  # a listener whose stop() takes no grace period
                self._service.stop()
        local_servers.unregister(self._port, self)

    def wait(self) -> None:
        """Blocks until `stop()`; raises KeyboardInterrupt when stopped by SIGINT (as Reverb does)."""
        interrupted = []

        def on_sigint(signum, frame):
            interrupted.append(True)
            self.stop()

        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            self._stopped.wait()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if interrupted:
            raise KeyboardInterrupt

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:  # noqa: BLE001  (never raise from a finalizer)
            pass

    def __repr__(self) -> str:
        return f"Server(port={self._port}, tables={sorted(self._tables)})"
