"""The remote transport of `replay_tf.Client`: Reverb's gRPC protocol to any server (ours or dm-reverb's).

Implements `replay_tf.client.Transport` over `deepmind.reverb.ReverbService`:
  - insert streams encode each item's chunks once (`wire.chunk_codec`, as Reverb's writers do) and send each
    chunk once per call while the server keeps it; `keep_chunk_keys` names the sent chunks that later
    items may use (the writer's live chunks, a handful). The writer's thread gathers items into requests
    of up to ~1 MiB and encodes each whole (gRPC's sending thread sends one that lingers 5 ms), so `send`
    never blocks (it yields the GIL while finished requests wait). An unconfirmed item is kept as its
    bytes, for re-sending after a reconnect (see `insert_stream`);
  - sample streams ask for `num_samples_per_request` samples per request (the next one once those have all
    arrived while fewer than a request's worth wait to be taken, as Reverb's workers keep
    `max_in_flight_samples_per_worker` in flight); a thread reads and decodes the responses, and
    `next_batch` hands out every complete sample received so far (up to the request) as one flexible
    batch. Chunks are decoded once per call (a cache by chunk key that keeps a grown chunk's longest
    version; a slice of a cached chunk is read from there, its copy in the response only named) and
    samples are core `Item`s, so everything built on the in-process path works unchanged. Stacked sample
    streams to a loopback address offer the server shared memory for their responses (`shared_memory`).

gRPC failures become Reverb's Python errors: DEADLINE_EXCEEDED -> `DeadlineExceededError`,
INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION -> `ValueError`, others -> `ReverbError`.

Calls wait for the server (gRPC's wait_for_ready, as Reverb's client): when a channel is still trying to
connect `WAIT_LOG_AFTER_S` seconds after its first call or stream, one warning names the address, so a
wrong address or a server that is down does not hang silently.

Tokens: an auth token is sent only over TLS or to a loopback address, unless the user opts in with
`REPLAY_TF_ALLOW_PLAINTEXT_TOKEN=1` (e.g. on a trusted private network): over plaintext anyone on the
network path can read it. The refusal is raised before any channel exists. Surrounding whitespace (a
token read from a file or an environment variable ends with a newline) is stripped.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Dict, Optional

import grpc

from replay_tf.transport import addresses
from replay_tf import errors
from replay_tf.grpc import common
from replay_tf.grpc.client import insert_stream
from replay_tf.grpc.client import sample_stream
from replay_tf.wire import table_info
from replay_tf.wire import reverb_service_pb2

translate_error = common.translate_error
_log = logging.getLogger(__name__)

#: Environment variable: "1" (or "true", "yes") lets a token travel without TLS to a non-loopback address.
ALLOW_PLAINTEXT_TOKEN_ENV = "REPLAY_TF_ALLOW_PLAINTEXT_TOKEN"
#: Seconds a channel may try to connect before the client logs that it is still waiting for the server.
WAIT_LOG_AFTER_S = 5.0


def _plaintext_token_allowed(allow_plaintext_token: Optional[bool]) -> bool:
    if allow_plaintext_token is not None:
        return bool(allow_plaintext_token)
    return os.environ.get(ALLOW_PLAINTEXT_TOKEN_ENV, "").strip().lower() in ("1", "true", "yes")


def checked_token(server_address: str, auth_token: Optional[str], tls: bool,
                  allow_plaintext_token: Optional[bool] = None) -> Optional[str]:
    """`auth_token` without surrounding whitespace; ValueError for a blank one, or for one that would travel
    in plaintext to a non-loopback address without the user's opt-in."""
    if auth_token is None:
        return None
    if not isinstance(auth_token, str) or not auth_token.strip():
        raise ValueError(f"auth_token for {server_address} must be a non-empty str (from the auth_token argument, "
                         f"set_connection_options or REPLAY_TF_AUTH_TOKEN), got {auth_token!r:.20}")
    if not tls and not addresses.is_loopback_target(server_address) and not _plaintext_token_allowed(
            allow_plaintext_token):
        raise ValueError(f"refusing to send the auth token to {server_address} in plaintext: the address is not "
                         f"loopback and the connection has no TLS, so anyone on the network path could read the "
                         f"token. Connect with TLS (channel_credentials=grpc.ssl_channel_credentials(...), or "
                         f"REPLAY_TF_TLS_ROOT_CERTS), or set {ALLOW_PLAINTEXT_TOKEN_ENV}=1 to send it anyway on a "
                         f"network you trust")
    return auth_token.strip()


def _connectivity(channel: grpc.Channel) -> Optional[int]:
    """The channel's connectivity state (`grpc.ChannelConnectivity.X.value[0]`) without connecting, or None.

    gRPC's public API offers only a subscription, whose polling thread outlives `unsubscribe` by up to
    0.2 s and raises in that thread when the channel is closed meanwhile; this reads the state once
    through the channel's core object instead (None where a gRPC version lacks it).
    """
    try:
        return int(channel._channel.check_connectivity_state(False))
    except Exception:  # noqa: BLE001  (missing attribute, or a closed channel)
        return None


class _WaitLogger:
    """Logs once when a channel is still trying to reach its server `WAIT_LOG_AFTER_S` seconds after a call.

    `arm()` (each call or stream, cheap once settled) starts one timer; when it fires, a channel that is
    connecting or failing to connect has a call waiting for the server: one warning, then nothing more.
    A connected channel, or a successful call (`connected()`), settles it silently. Holds the channel
    weakly, so a channel dropped without `close()` is still collected.
    """

    def __init__(self, address: str, tls: bool, channel: grpc.Channel):
        self._address, self._tls = address, tls
        self._channel = weakref.ref(channel)
        self._lock = threading.Lock()
        self._timer: Optional[threading.Timer] = None
        self._settled = False  # connected once, logged or closed: nothing more to do

    def arm(self) -> None:
        if self._settled or self._timer is not None:
            return
        with self._lock:
            if self._settled or self._timer is not None:
                return
            self._timer = threading.Timer(WAIT_LOG_AFTER_S, self._fire)
            self._timer.daemon = True
            self._timer.start()

    def _fire(self) -> None:
        channel = self._channel()
        state = None if channel is None else _connectivity(channel)
        waiting = state in (grpc.ChannelConnectivity.CONNECTING.value[0],
                            grpc.ChannelConnectivity.TRANSIENT_FAILURE.value[0])
        with self._lock:
            self._timer = None
            if self._settled:
                return
            # Idle (nothing waits yet) or unknown: the next call arms the timer again.
            self._settled = state == grpc.ChannelConnectivity.READY.value[0] or waiting
        if waiting:
            hint = "" if self._tls else " (a server started with TLS needs channel_credentials)"
            _log.warning("replay_tf: still waiting for the replay server at %s after %.3g s: nothing accepts the "
                         "connection yet%s; calls wait until it does. Check the address and that the server runs.",
                         self._address, WAIT_LOG_AFTER_S, hint)

    def connected(self) -> None:
        if not self._settled:
            self.close()

    def close(self) -> None:
        with self._lock:
            self._settled = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


class Transport:
    """`replay_tf.client.Transport` to a Reverb-protocol server at `server_address` (`host:port`).

    `channel_credentials` (`grpc.ChannelCredentials`) makes the channel use TLS; `auth_token` is sent with
    every call as `authorization: Bearer <token>` metadata (see `replay_tf.Server(auth_token=...)`), only
    over TLS or to a loopback address unless `allow_plaintext_token` (default: the environment variable
    `REPLAY_TF_ALLOW_PLAINTEXT_TOKEN`) is true: ValueError otherwise, before any connection.
    """

    shares_items = False  # (every sample is decoded into a new item)

    def __init__(self, server_address: str, *, channel_credentials: Optional[grpc.ChannelCredentials] = None,
                 auth_token: Optional[str] = None, allow_plaintext_token: Optional[bool] = None):
        self._address = server_address
        self._loopback = addresses.is_loopback_target(server_address)  # (stacked samples may use shared memory)
        auth_token = checked_token(server_address, auth_token, channel_credentials is not None,
                                   allow_plaintext_token)
        if channel_credentials is None:
            channel = grpc.insecure_channel(server_address, options=common.CHANNEL_OPTIONS)
        else:
            channel = grpc.secure_channel(server_address, channel_credentials, options=common.CHANNEL_OPTIONS)
        self._tls = channel_credentials is not None
        self._raw_channel = channel
        self._wait_logger = _WaitLogger(server_address, self._tls, channel)
        if auth_token is not None:
            channel = grpc.intercept_channel(channel, common.AuthTokenInterceptor(auth_token))
        self._channel = channel
        self._unary = {
            name: self._channel.unary_unary(common.SERVICE + name, request_serializer=common.identity,
                                            response_deserializer=common.identity)
            for name in ("Checkpoint", "MutatePriorities", "Reset", "ServerInfo")}

    def __repr__(self) -> str:
        return f"Transport({self._address!r})"

    def _not_connected_hint(self) -> str:
        """Why a call may have waited in vain: said when the channel is not connected now."""
        ready = grpc.channel_ready_future(self._raw_channel)
        try:
            ready.result(timeout=0.05)
            return ""
        except grpc.FutureTimeoutError:
            pass
        finally:
            ready.cancel()
        if self._tls:
            return (f" (no connection to {self._address}: is the server up, and does it serve TLS with a "
                    f"certificate that these channel_credentials trust?)")
        return (f" (no connection to {self._address}: is the server up? A server started with TLS needs "
                f"channel_credentials)")

    def _call(self, name: str, request, response_class, timeout_s: Optional[float] = None):
        self._wait_logger.arm()
        try:
            raw = self._unary[name](request.SerializeToString(), timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as e:
            raise translate_error(e, f"{name} call to {self._address} failed") from None
        self._wait_logger.connected()
        return response_class.FromString(raw)

    def open_insert_stream(self) -> insert_stream.InsertStream:
        self._wait_logger.arm()
        return insert_stream.InsertStream(self._channel)

    def open_sample_stream(self, table: str, num_samples_per_request: int,
                           rate_limiter_timeout_ms: Optional[int], *,
                           max_samples_per_stream: Optional[int] = None,
                           max_samples: Optional[int] = None, stacked: bool = False) -> sample_stream.SampleStream:
        self._wait_logger.arm()
        return sample_stream.SampleStream(self._channel, table, num_samples_per_request, rate_limiter_timeout_ms,
                                         max_samples_per_stream, max_samples, stacked,
                                         shared_memory=self._loopback)

    def mutate_priorities(self, table: str, updates: list, deletes: list) -> None:
        request = reverb_service_pb2.MutatePrioritiesRequest(table=table, delete_keys=[int(k) for k in deletes])
        for key, priority in updates:
            request.updates.add(key=int(key), priority=float(priority))
        self._call("MutatePriorities", request, reverb_service_pb2.MutatePrioritiesResponse)

    def reset(self, table: str) -> None:
        self._call("Reset", reverb_service_pb2.ResetRequest(table=table), reverb_service_pb2.ResetResponse)

    def server_info(self, timeout_s: Optional[float] = None) -> Dict[str, Any]:
        try:
            response = self._call("ServerInfo", reverb_service_pb2.ServerInfoRequest(),
                                  reverb_service_pb2.ServerInfoResponse, timeout_s)
        except errors.DeadlineExceededError as e:
            raise errors.DeadlineExceededError(
                f"ServerInfo call did not complete within provided timeout of {timeout_s}s"
                f"{self._not_connected_hint()}") from e
        return {info.name: table_info.table_info_from_proto(info) for info in response.table_info}

    def checkpoint(self) -> str:
        return self._call("Checkpoint", reverb_service_pb2.CheckpointRequest(),
                          reverb_service_pb2.CheckpointResponse).checkpoint_path

    def close(self) -> None:
        self._wait_logger.close()
        self._channel.close()
