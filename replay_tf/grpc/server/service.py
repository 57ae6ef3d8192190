"""The gRPC `deepmind.reverb.ReverbService` over the table core: what makes a `Server` reachable by Reverb.

`start(server)` is the hook `replay_tf.Server` calls: it serves the server's tables on `server.host`
(localhost unless the user chose otherwise) and `server.port`, and returns a handle with `stop()`.
The protocol follows ../shared/reference/reverb.md §2, as a dm-reverb 0.14 client expects it: the
handlers are `servicer.ReverbServicer` (unary calls), `insert_stream` (InsertStream, its items queued in
the tables' `core.insert_queue`) and `sample_stream` (SampleStream), each table reached through a
`table_entry.TableEntry`; `auth` checks tokens and `stream_slots` sizes the thread pool.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

import grpc

from replay_tf.transport import addresses
from replay_tf.grpc.server import auth
from replay_tf.grpc import common
from replay_tf.grpc.server import servicer as servicer_lib
from replay_tf.grpc.server import stream_slots

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_STREAMS",
    "GrpcService",
    "SERVICE_NAME",
    "start",
]

SERVICE_NAME = "deepmind.reverb.ReverbService"

#: Largest request accepted by default. Reverb's writers send requests of up to 40 MiB, and one chunk of a
#: large step may be bigger; Reverb itself accepts any size.
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20
DEFAULT_MAX_STREAMS = stream_slots.DEFAULT_MAX_STREAMS

_log = logging.getLogger(__name__)


class GrpcService:
    """A running gRPC listener for a `Server`'s tables; `stop()` ends every call and releases the port."""

    def __init__(self, grpc_server: grpc.Server, port: int, servicer: servicer_lib.ReverbServicer,
                 slots: Optional[stream_slots.StreamSlots] = None, pool=None, serve_threads=()):
        self._grpc_server = grpc_server
        self.port = port
        self.servicer = servicer
        self.streams = slots  # open streams and their limit
        self._pool = pool
        self._serve_threads = tuple(serve_threads)  # grpc's threads that take calls and hand them to the pool

    @property
    def serving(self) -> bool:
        """False once grpc's server thread has ended: after `stop()`, or when an error killed it (then nothing
        is answered any more, and the process must be restarted)."""
        return all(thread.is_alive() for thread in self._serve_threads)

    def stop(self, grace_s: Optional[float] = None) -> None:
        self._grpc_server.stop(grace_s).wait(timeout=10)
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # its idle threads (one per stream once open at the same time) end
        self.servicer.close()


def _handler(servicer: servicer_lib.ReverbServicer, slots: stream_slots.StreamSlots) -> grpc.GenericRpcHandler:
    unary = lambda fn: grpc.unary_unary_rpc_method_handler(  # noqa: E731
        fn, request_deserializer=common.identity, response_serializer=common.identity)
    stream = lambda fn: grpc.stream_stream_rpc_method_handler(  # noqa: E731
        slots.wrap(fn), request_deserializer=common.identity, response_serializer=common.identity)
    return grpc.method_handlers_generic_handler(SERVICE_NAME, {
        "Checkpoint": unary(servicer.checkpoint),
        "InsertStream": stream(servicer.insert_stream),
        "MutatePriorities": unary(servicer.mutate_priorities),
        "Reset": unary(servicer.reset),
        "SampleStream": stream(servicer.sample_stream),
        "ServerInfo": unary(servicer.server_info),
        "InitializeConnection": stream(servicer.initialize_connection),
    })


def start(server, *, host: Optional[str] = None, port: Optional[int] = None,
          max_message_bytes: Optional[int] = None, max_workers: Optional[int] = None,
          max_streams: Optional[int] = None, server_credentials: Optional[grpc.ServerCredentials] = None,
          auth_token: Optional[str] = None) -> GrpcService:
    """Serves `server`'s tables as `deepmind.reverb.ReverbService`; the hook `replay_tf.Server` calls.

    Args:
      server: A `replay_tf.Server` (its `tables`, `host`, `port`, `chunk_store`, `tables_state_id`,
        `checkpointer` and `checkpoint()` are used).
      host: Interface to bind; default `server.host`, else "localhost". Binding anything else (e.g.
        "0.0.0.0") exposes the tables to the network, as Reverb always does: a warning is logged unless
        TLS protects them (a token alone travels in plaintext).
      port: Port to bind; default `server.port`.
      max_message_bytes: Largest request accepted (default `server.max_message_bytes` if set, else
        `DEFAULT_MAX_MESSAGE_BYTES`); -1 for no limit. Responses are never limited.
      max_workers: Threads kept for unary calls and for refusing streams over `max_streams`; open streams
        never take them (default 64). Threads start on demand.
      max_streams: Most streams (InsertStream, SampleStream, InitializeConnection) open at once, idle or
        waiting on a rate limiter included (default `server.max_streams` if set, else
        `DEFAULT_MAX_STREAMS`); each holds a thread, started on demand. One more, or one the process
        cannot start a thread for (an address-space or thread limit), is refused at once with
        RESOURCE_EXHAUSTED (see `stream_slots`).
      server_credentials: `grpc.ServerCredentials` to serve over TLS (default `server.server_credentials`
        if set, else plain text).
      auth_token: Token every call must carry as `authorization: Bearer <token>` metadata (default
        `server.auth_token` if set, else none); others fail with UNAUTHENTICATED.

    Returns:
      The running `GrpcService`.

    Raises:
      ValueError: If the address cannot be bound (e.g. the port is taken).
    """
    host = host or getattr(server, "host", None) or "localhost"
    port = server.port if port is None else port
    if max_message_bytes is None:
        max_message_bytes = getattr(server, "max_message_bytes", None) or DEFAULT_MAX_MESSAGE_BYTES
    if server_credentials is None:
        server_credentials = getattr(server, "server_credentials", None)
    if auth_token is None:
        auth_token = getattr(server, "auth_token", None)
    if not addresses.is_loopback_host(host) and server_credentials is None and auth_token is None:
        _log.warning("the replay server binds %s:%s without TLS or auth token: anyone who can reach it may read, "
                     "insert and delete data (pass server_credentials= and auth_token= to Server)", host, port)
    elif not addresses.is_loopback_host(host) and server_credentials is None:
        # Clients refuse to send a token in plaintext to a non-loopback address unless their users opt in.
        _log.warning("the replay server binds %s:%s with an auth token but without TLS: clients send the token in "
                     "plaintext, readable by anyone on the network path (pass server_credentials= to Server for "
                     "TLS; remote clients refuse to send it in plaintext unless REPLAY_TF_ALLOW_PLAINTEXT_TOKEN=1)",
                     host, port)
    if max_streams is None:
        max_streams = getattr(server, "max_streams", None) or DEFAULT_MAX_STREAMS
    max_streams = stream_slots.check_max_streams(max_streams)
    reserved = stream_slots.DEFAULT_RESERVED_THREADS if max_workers is None else max_workers
    servicer = servicer_lib.ReverbServicer(server)
    options = [
        ("grpc.max_receive_message_length", int(max_message_bytes)),
        ("grpc.max_send_message_length", -1),
        ("grpc.so_reuseport", 0),  # a second server on the same port must fail, not share it
    ]
    reserved = max(1, reserved)
    pool = stream_slots.ThreadPool(max_streams + reserved, spare_threads=min(stream_slots.SPARE_THREADS, reserved))
    slots = stream_slots.StreamSlots(max_streams, pool)
    interceptors = [auth.TokenInterceptor(auth_token)] if auth_token is not None else None
    grpc_server = grpc.server(pool, handlers=[_handler(servicer, slots)], interceptors=interceptors, options=options)
    bind_host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    try:
        if server_credentials is None:
            bound = grpc_server.add_insecure_port(f"{bind_host}:{port}")
        else:
            bound = grpc_server.add_secure_port(f"{bind_host}:{port}", server_credentials)
    except RuntimeError as e:
        bound, error = 0, e
    else:
        error = None
    if not bound:
        pool.shutdown(wait=False)
        raise ValueError(f"could not bind the replay service to {bind_host}:{port} (port in use?)") from error
    before = set(threading.enumerate())
    grpc_server.start()
    # grpc names its server thread after its function (`_serve`); without one found, `serving` stays True.
    serve_threads = [t for t in threading.enumerate() if t not in before and t.name.endswith("(_serve)")]
    return GrpcService(grpc_server, bound, servicer, slots, pool, serve_threads)
