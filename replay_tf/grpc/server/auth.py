"""The server's token check: every call must carry `authorization: Bearer <token>` metadata."""
from __future__ import annotations

import hmac

import grpc

from replay_tf.grpc import common

__all__ = ["TokenInterceptor"]


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without `authorization: Bearer <token>` metadata with UNAUTHENTICATED.

    The token is compared in constant time (`hmac.compare_digest`), so its value cannot be guessed from
    response times. Refused calls never reach the servicer, and their request bodies are never read: every
    refusal is served by a streaming handler that aborts at once (grpc reads, and buffers in full, the one
    request of a unary handler before calling it, up to `max_message_bytes` from anyone).
    """

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

        def refuse(details: str):
            def handler(request_iterator, context):  # (the requests are never read)
                context.abort(grpc.StatusCode.UNAUTHENTICATED, details)
            return grpc.stream_stream_rpc_method_handler(handler, request_deserializer=common.identity,
                                                         response_serializer=common.identity)

        # The same streaming handler refuses unary methods too: the wire format of a call does not depend on
        # it, and a unary call's client sees the status alone, as from a unary handler.
        self._refusals = {
            "missing": refuse("this replay server requires an auth token: send 'authorization: Bearer <token>' "
                              "metadata (replay_tf.Client(address, auth_token=...), "
                              "replay_tf.set_connection_options or REPLAY_TF_AUTH_TOKEN)"),
            "wrong": refuse("the auth token sent in 'authorization' metadata is not this replay server's token"),
        }

    def intercept_service(self, continuation, handler_call_details):
        sent = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                sent = value.encode() if isinstance(value, str) else bytes(value)
        if sent is not None and hmac.compare_digest(sent, self._expected):
            return continuation(handler_call_details)
        return self._refusals["missing" if sent is None else "wrong"]
