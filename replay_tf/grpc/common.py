"""Shared pieces of the gRPC transport: the service path, channel options, stream constants and the
translation of gRPC failures into Reverb's Python errors (see `replay_tf.grpc.client.client_transport`)."""
from __future__ import annotations

import collections
import gc
import threading

import grpc

from replay_tf import errors
from replay_tf.core import insert_queue

SERVICE = "/deepmind.reverb.ReverbService/"
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.max_reconnect_backoff_ms", 30_000),  # as Reverb's client
]
# Queued items are assembled into requests of up to about this size: well below the 4 MiB up to which
# `malloc` keeps buffers in the heap (a larger request is a fresh memory map on both sides, page-faulted
# anew in the writer and in the server), and large enough that a request's fixed costs spread over many
# steps.
MAX_REQUEST_BYTES = 1 << 20
MAX_REQUEST_ITEMS = 256
LINGER_S = 0.005                  # how long a request waits for more items (not while flushing)
CHUNK_CACHE_SIZE = 65536          # decoded chunks kept per sample stream: more than a table of small steps
                                  # holds (a smaller cache decodes the same chunks again for later samples)
CHUNK_CACHE_ENTRY_BYTES = 512     # a cached chunk's Python objects, counted with its arrays' bytes
CHUNK_CACHE_BYTES = 64 << 20      # and at most about this many bytes of them (one-row chunks, e.g. Atari
                                  # frames, are not cached: see sample_stream.SampleStream._chunk)
CLOSE_TIMEOUT_S = 10.0
CLOSE = object()
# The server's waits (blocked samples, an insert stream's waits for room and confirmations) check this often
# that their client is there: the table's insert queue's slice, so that both wait alike.
WAIT_SLICE_MS = insert_queue.WAIT_SLICE_MS


AUTHORIZATION_KEY = "authorization"  # gRPC metadata keys are lower case


class _CallDetails(collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    pass


class AuthTokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to the metadata of every call of a channel."""

    def __init__(self, token: str):
        self._entry = (AUTHORIZATION_KEY, f"Bearer {token}")

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [m for m in (details.metadata or ()) if m[0] != AUTHORIZATION_KEY] + [self._entry]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, client_call_details, request):
        return continuation(self._details(client_call_details), request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        return continuation(self._details(client_call_details), request_iterator)


def translate_error(error: grpc.RpcError, what: str) -> Exception:
    """A Python error for a failed call, as Reverb's client raises them."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    message = f"{what}: {details}" if details else what
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return errors.DeadlineExceededError(details or message)
    if code == grpc.StatusCode.NOT_FOUND:
        return errors.TableNotFoundError(message)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return ValueError(message)
    if code == grpc.StatusCode.CANCELLED:
        return errors.CancelledError(message)
    return errors.ReverbError(f"{message} (gRPC status {code.name if code else 'unknown'})")


def identity(value: bytes) -> bytes:
    return value


_frozen = threading.Event()


def freeze_startup_objects() -> None:
    """Moves every object alive now into the garbage collector's permanent generation, once per process.

    Called by the server when its first insert stream opens (never in client processes: a library must not
    change its users' garbage collection). A process that imported TensorFlow tracks hundreds of thousands
    of objects, and its first full collection is due soon after the import (the import promoted them all): it
    scans them all, in the middle of the first inserts, and every later full collection rescans them
    (docs/reliability.md gives the cost). Frozen objects are still freed by reference counting; only
    reference cycles among objects alive now (a few dozen after importing TensorFlow) are never collected.
    """
    if not _frozen.is_set():
        _frozen.set()
        gc.freeze()
