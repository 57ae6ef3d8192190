"""Shared pieces of the gRPC transport: the service path, channel options, stream constants and the
translation of gRPC failures into Reverb's Python errors (see `replay_tf._grpc_transport`)."""
from __future__ import annotations

import grpc

from replay_tf import errors

SERVICE = "/deepmind.reverb.ReverbService/"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_reconnect_backoff_ms", 30_000),  # as Reverb's client
]
MAX_REQUEST_BYTES = 4 << 20       # assemble queued items into requests up to about this size
MAX_REQUEST_ITEMS = 256
LINGER_S = 0.002                  # how long a request waits for more items (not while flushing)
CHUNK_CACHE_SIZE = 4096           # decoded chunks kept per sample stream
CLOSE_TIMEOUT_S = 10.0
CLOSE = object()


def translate_error(error: grpc.RpcError, what: str) -> Exception:
    """A Python error for a failed call, as Reverb's client raises them."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    message = f"{what}: {details}" if details else what
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.DeadlineExceededError(details or message)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.FAILED_PRECONDITION):
        return ValueError(message)
    if code == grpc.StatusCode.CANCELLED:
        return errors.CancelledError(message)
    return errors.ReverbError(f"{message} (gRPC status {code.name if code else 'unknown'})")


def identity(value: bytes) -> bytes:
    return value
