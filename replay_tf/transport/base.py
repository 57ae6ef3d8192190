"""What a `Client` needs from a server connection, and how one is made for an address.

`Transport`, `InsertStream` and `SampleStream` describe a connection: the in-process transport
(`inprocess`, the tables of a `Server` of this process called directly) and the remote one
(`grpc.client.client_transport`, imported only when a server is remote, so that in-process use never loads gRPC) both
implement them. Writers use `open_insert_stream()`; `TrajectoryDataset` and `Client.sample` use
`open_sample_stream(...)`; both exchange `replay_tf.core` objects (`Item`, `Chunk`, `SampledItem`), so the
remote transport only adds encoding. `make_transport` picks one for an address, with the TLS and token
options of `set_connection_options` or the environment.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Dict, Optional, Protocol

from replay_tf.transport import addresses
from replay_tf.transport import inprocess
from replay_tf.core.chunk_store import Item


class InsertStream(Protocol):
    """Where a writer sends items. Items carry their chunks (`item.chunks`)."""

    #: Whether items may refer to rows of chunks that are still growing (in-process only). When False, a
    #: writer sends an item only once every chunk it refers to is finalized (no more rows appended).
    supports_open_chunks: bool

    def send(self, table: str, item: Item, live: Optional[tuple] = None) -> None:
        """Queues `item` for insertion into `table` without blocking on the rate limiter.

        `live`: the keys of the chunks that the writer's later items may still use, as of this item's
        creation (None: unknown). A remote stream has the server keep only those of the chunks it sent.
        """

    def flush(self, block_until_num_items: int, timeout_ms: Optional[int]) -> None:
        """Blocks until at most `block_until_num_items` sent items are unconfirmed; raises
        `DeadlineExceededError` when `timeout_ms` runs out (the inserts carry on)."""

    def num_pending(self) -> int:
        """Sent items not yet confirmed."""

    def close(self) -> None:
        """Releases the stream (after a flush by the caller)."""


class SampleStream(Protocol):
    def next_batch(self, poll_ms: Optional[float] = None) -> list:
        """A flexible batch (>= 1) of `SampledItem`s; raises `DeadlineExceededError` on a rate-limiter
        timeout and `ValueError` for an unknown table.

        With `poll_ms`, returns `[]` when no sample arrived within `poll_ms` milliseconds, having taken
        nothing from the table; the next call goes on waiting (the rate-limiter timeout keeps running).
        Callers that must stay cancellable (`TrajectoryDataset`) poll instead of blocking.
        """

    def close(self) -> None:
        """Releases the stream."""


class Transport(Protocol):
    """What a `Client` needs from a server connection."""

    #: Whether sampled items are the tables' own (in-process), so that what a sampler keeps for an item
    #: (`sampling.packed_rows`) serves its later samples. Remote streams build new items for every sample.
    shares_items: bool

    def open_insert_stream(self) -> InsertStream: ...

    def open_sample_stream(self, table: str, num_samples_per_request: int,
                           rate_limiter_timeout_ms: Optional[int], *,
                           max_samples_per_stream: Optional[int] = None,
                           max_samples: Optional[int] = None, stacked: bool = False) -> SampleStream:
        """A stream that takes at most `max_samples` samples from the table in all (None: no limit), so a
        caller that wants N samples never removes more than N items from a queue. With `stacked`, its
        batches may also hold `stacked_samples.StackedSamples` (several samples each, see `count_samples`)."""

    def mutate_priorities(self, table: str, updates: list, deletes: list) -> None: ...

    def reset(self, table: str) -> None: ...

    def server_info(self, timeout_s: Optional[float]) -> Dict[str, Any]: ...

    def checkpoint(self) -> str: ...


# --- connection options (TLS and token; an addition: Reverb has neither) ---

#: Environment variable holding the token sent to every server without `set_connection_options` entry.
AUTH_TOKEN_ENV = "REPLAY_TF_AUTH_TOKEN"
#: Environment variable naming a PEM file of root certificates: when set, remote connections without a
#: `set_connection_options` entry use TLS trusting those roots.
TLS_ROOT_CERTS_ENV = "REPLAY_TF_TLS_ROOT_CERTS"

_connection_options_lock = threading.Lock()
_connection_options: Dict[str, tuple] = {}  # address -> (channel_credentials, auth_token, timeout_ms)


def set_connection_options(server_address: str, *, channel_credentials=None,
                           auth_token: Optional[str] = None, timeout_ms: Optional[int] = None) -> None:
    """Sets how this process connects to `server_address`: TLS credentials, an auth token and/or a timeout.

    Everything that connects by address uses them (`Client`, its writers, `TrajectoryDataset`,
    `make_reverb_dataset`, ...), so code written for Reverb reaches a protected server unchanged. Calling
    it again replaces the options; passing none of them clears them. Processes started later do not
    inherit them: set them there too, or use the environment variables `REPLAY_TF_AUTH_TOKEN` and
    `REPLAY_TF_TLS_ROOT_CERTS` (a PEM file of trusted roots), which apply to addresses without options.
    In-process clients of a `Server` of this process need none of them (see `Server`).

    Args:
      server_address: `host:port`, exactly as passed to `Client` or `TrajectoryDataset`.
      channel_credentials: `grpc.ChannelCredentials` (e.g. `grpc.ssl_channel_credentials(root_pem)`) for
        TLS; None for a plain connection.
      auth_token: Token sent as `authorization: Bearer <token>` call metadata; None for none.
      timeout_ms: How long the calls that fetch the server's table information wait for an answer when
        their own timeout is not given: `Client.server_info()`, the signature fetch of
        `Client.trajectory_writer` (and `ShardedClient`'s) and `from_table_signature`. They raise
        `DeadlineExceededError` naming the address, so a wrong address or a server that is down fails
        instead of waiting. None (default): they wait for the server, as Reverb's do.

    >>> set_connection_options('replay.example.com:8000', auth_token='s3cret')
    >>> set_connection_options('replay.example.com:8000')  # cleared
    """
    addresses.split_address(server_address)  # ValueError for a malformed address
    if auth_token is not None and (not isinstance(auth_token, str) or not auth_token):
        raise ValueError(f"auth_token must be a non-empty str or None, got {type(auth_token).__name__}")
    timeout_ms = checked_timeout_ms(timeout_ms, "timeout_ms")
    with _connection_options_lock:
        if channel_credentials is None and auth_token is None and timeout_ms is None:
            _connection_options.pop(server_address, None)
        else:
            _connection_options[server_address] = (channel_credentials, auth_token, timeout_ms)


def checked_timeout_ms(timeout_ms, name: str) -> Optional[int]:
    """`timeout_ms` as an int (None stays None); TypeError/ValueError naming `name` unless it is > 0."""
    if timeout_ms is None:
        return None
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)):
        raise TypeError(f"{name} must be a number of milliseconds or None, got {timeout_ms!r}")
    if not timeout_ms > 0:
        raise ValueError(f"{name} ({timeout_ms}) must be > 0, or None to wait for the server")
    return int(timeout_ms)


def connection_timeout_ms(server_address: str) -> Optional[int]:
    """The `timeout_ms` of `set_connection_options` for `server_address` (None: not set)."""
    with _connection_options_lock:
        options = _connection_options.get(server_address)
    return None if options is None else options[2]


def _resolve_connection_options(server_address: str, channel_credentials, auth_token) -> tuple:
    """Explicit options, else those set for the address, else those of the environment."""
    if channel_credentials is not None or auth_token is not None:
        return channel_credentials, auth_token
    with _connection_options_lock:
        options = _connection_options.get(server_address)
    if options is not None and (options[0] is not None or options[1] is not None):
        return options[:2]
    token = os.environ.get(AUTH_TOKEN_ENV) or None
    roots_path = os.environ.get(TLS_ROOT_CERTS_ENV)
    credentials = None
    if roots_path:
        import grpc  # noqa: PLC0415  (only remote connections need gRPC)
        try:
            with open(roots_path, "rb") as f:
                roots = f.read()
        except OSError as e:
            raise ValueError(f"{TLS_ROOT_CERTS_ENV} ({roots_path!r}) must name a readable PEM file of root "
                             f"certificates: {e}") from e
        credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    return credentials, token


def make_transport(server_address: str, *, channel_credentials=None,
                   auth_token: Optional[str] = None) -> Transport:
    """In-process when a local `Server` owns `server_address`, else the remote (gRPC) transport.

    The remote transport uses `channel_credentials` and `auth_token` when given, else the options of
    `set_connection_options` or the environment. A local server is reached in-process whatever its
    credentials: code of the same process is trusted.
    """
    local = inprocess.for_address(server_address)
    if local is not None:
        return local
    try:
        from replay_tf.grpc.client import client_transport  # noqa: PLC0415  (gRPC only for remote servers)
    except ImportError as e:
        raise ValueError(f"no Server of this process serves {server_address!r} and the remote transport "
                         f"(replay_tf.grpc.client.client_transport) is unavailable: {e}") from e
    channel_credentials, auth_token = _resolve_connection_options(server_address, channel_credentials, auth_token)
    if channel_credentials is None and auth_token is None:
        return client_transport.Transport(server_address)
    return client_transport.Transport(server_address, channel_credentials=channel_credentials,
                                     auth_token=auth_token)
