"""The remote transport of `replay_tf.Client`: Reverb's gRPC protocol to any server (ours or dm-reverb's).

Implements `replay_tf.client.Transport` over `deepmind.reverb.ReverbService`:
  - insert streams encode each item's chunks once (`wire.codec`, as Reverb's writers do) and send each
    chunk once per call while the server keeps it; `keep_chunk_keys` names the sent chunks that later
    items may use (the writer's live chunks, a handful). The writer's thread gathers items into requests
    of up to ~1 MiB and encodes each whole (gRPC's sending thread sends one that lingers 5 ms), so `send`
    never blocks (it yields the GIL while finished requests wait). An unconfirmed item is kept as its
    bytes, for re-sending after a reconnect (see `_grpc_insert`);
  - sample streams ask for `num_samples_per_request` samples per request (the next one once those have all
    arrived while fewer than a request's worth wait to be taken, as Reverb's workers keep
    `max_in_flight_samples_per_worker` in flight); a thread reads and decodes the responses, and
    `next_batch` hands out every complete sample received so far (up to the request) as one flexible
    batch. Chunks are decoded once per call (a cache by chunk key that keeps a grown chunk's longest
    version; a slice of a cached chunk is read from there, its copy in the response only named) and
    samples are core `Item`s, so everything built on the in-process path works unchanged. Stacked sample
    streams to a loopback address offer the server shared memory for their responses (`_shared_memory`).

gRPC failures become Reverb's Python errors: DEADLINE_EXCEEDED -> `DeadlineExceededError`,
INVALID_ARGUMENT / NOT_FOUND / FAILED_PRECONDITION -> `ValueError`, others -> `ReverbError`.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import grpc

from replay_tf import _addresses
from replay_tf import _grpc_common as common
from replay_tf import _grpc_insert
from replay_tf import _grpc_sample
from replay_tf import errors
from replay_tf.wire import codec
from replay_tf.wire import reverb_service_pb2

translate_error = common.translate_error


class Transport:
    """`replay_tf.client.Transport` to a Reverb-protocol server at `server_address` (`host:port`).

    `channel_credentials` (`grpc.ChannelCredentials`) makes the channel use TLS; `auth_token` is sent with
    every call as `authorization: Bearer <token>` metadata (see `replay_tf.Server(auth_token=...)`).
    """

    def __init__(self, server_address: str, *, channel_credentials: Optional[grpc.ChannelCredentials] = None,
                 auth_token: Optional[str] = None):
        self._address = server_address
        self._loopback = _addresses.is_loopback_target(server_address)  # (stacked samples may use shared memory)
        if channel_credentials is None:
            channel = grpc.insecure_channel(server_address, options=common.CHANNEL_OPTIONS)
        else:
            channel = grpc.secure_channel(server_address, channel_credentials, options=common.CHANNEL_OPTIONS)
        self._tls = channel_credentials is not None
        self._raw_channel = channel
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
        try:
            raw = self._unary[name](request.SerializeToString(), timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as e:
            raise translate_error(e, f"{name} call to {self._address} failed") from None
        return response_class.FromString(raw)

    def open_insert_stream(self) -> _grpc_insert.InsertStream:
        return _grpc_insert.InsertStream(self._channel)

    def open_sample_stream(self, table: str, num_samples_per_request: int,
                           rate_limiter_timeout_ms: Optional[int], *,
                           max_samples_per_stream: Optional[int] = None,
                           max_samples: Optional[int] = None, stacked: bool = False) -> _grpc_sample.SampleStream:
        return _grpc_sample.SampleStream(self._channel, table, num_samples_per_request, rate_limiter_timeout_ms,
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
        return {info.name: codec.table_info_from_proto(info) for info in response.table_info}

    def checkpoint(self) -> str:
        return self._call("Checkpoint", reverb_service_pb2.CheckpointRequest(),
                          reverb_service_pb2.CheckpointResponse).checkpoint_path

    def close(self) -> None:
        self._channel.close()
