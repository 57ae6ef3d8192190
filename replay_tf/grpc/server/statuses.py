"""How the service's failures become gRPC statuses.

A handler raises `StatusError` for a precise status, or one of Reverb's errors, `ValueError` or a wire
limit's error; `run_unary` and `run_stream` end the call with the matching status. Errors never stop the
server: an unexpected one ends its own call with INTERNAL and is logged.
"""
from __future__ import annotations

import logging
from typing import Iterator

import grpc
from google.protobuf import message as protobuf_message

from replay_tf import errors
from replay_tf.wire import limits

__all__ = ["StatusError", "client_gone", "parse", "run_stream", "run_unary"]

_log = logging.getLogger(__name__)


class StatusError(Exception):
    """Ends the current RPC with `code` and `details`."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


def client_gone() -> StatusError:
    """The CANCELLED status a stream's handler ends with once its client has gone away."""
    return StatusError(grpc.StatusCode.CANCELLED, "the client closed the stream")


def parse(message_class, raw: bytes):
    """`raw` parsed as a `message_class`, or INVALID_ARGUMENT naming the message and its size."""
    try:
        return message_class.FromString(raw)
    except (protobuf_message.DecodeError, TypeError, ValueError) as e:
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"malformed {message_class.DESCRIPTOR.name} ({len(raw)} bytes): {e}") from None


# Errors a handler may raise, in the order they are matched (LimitExceededError is a ValueError), and the
# status each ends its call with.
_STATUS_OF = (
    (errors.CancelledError, grpc.StatusCode.CANCELLED),
    (errors.UnavailableError, grpc.StatusCode.UNAVAILABLE),
    (limits.LimitExceededError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
)


def _abort(context, error: Exception, call: str) -> None:
    """Ends the call with the status of `error` (called while handling it); INTERNAL, logged, for others."""
    if isinstance(error, StatusError):
        context.abort(error.code, error.details)
    for error_class, code in _STATUS_OF:
        if isinstance(error, error_class):
            context.abort(code, str(error))
    _log.exception(f"internal error in ReverbService {call}")
    context.abort(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")


def run_unary(context, handler, *args):
    """Runs a unary handler, mapping failures to statuses."""
    try:
        return handler(*args)
    except Exception as e:  # noqa: BLE001  (one bad call must never take the server down)
        _abort(context, e, "call")


def run_stream(context, generator) -> Iterator[bytes]:
    """Drives a streaming handler, mapping failures to statuses."""
    try:
        yield from generator
    except grpc.RpcError:
        return  # the client went away while we were reading its requests
    except Exception as e:  # noqa: BLE001  (one bad stream must never take the server down)
        _abort(context, e, "stream")
