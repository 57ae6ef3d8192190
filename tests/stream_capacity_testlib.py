"""Opens many gRPC streams to a replay server from one thread (grpc.aio: no client thread per stream)."""
from __future__ import annotations

import asyncio
import threading

import grpc

from replay_tf.wire import reverb_service_pb2

METHOD = "/deepmind.reverb.ReverbService/"


def sample_request(table: str, num_samples: int = 1) -> bytes:
    """A SampleStreamRequest that waits on the rate limiter for as long as it takes (Reverb's timeout -1)."""
    request = reverb_service_pb2.SampleStreamRequest(table=table, num_samples=num_samples)
    request.rate_limiter_timeout.milliseconds = -1
    return request.SerializeToString()


class StreamOpener:
    """Holds open streams on an event loop of its own thread; `close()` cancels them all."""

    _loop = None  # one event loop for every opener of the process: grpc.aio keeps using the first one it saw

    def __init__(self, address: str, metadata=None):
        if StreamOpener._loop is None:
            StreamOpener._loop = asyncio.new_event_loop()
            threading.Thread(target=StreamOpener._loop.run_forever, name="stream-opener", daemon=True).start()
        self._metadata = metadata
        self._channel = self._run(self._make_channel(address))
        self.calls: list = []

    async def _make_channel(self, address):
        return grpc.aio.insecure_channel(address)

    def _run(self, coroutine, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def open(self, count: int, method: str = "SampleStream", first_request: bytes | None = None) -> list:
        """Opens `count` streams of `method`, each sending `first_request` (None: nothing, an idle stream)."""
        async def go():
            calls = []
            for _ in range(count):
                call = self._channel.stream_stream(METHOD + method)(metadata=self._metadata)
                if first_request is not None:
                    await call.write(first_request)
                calls.append(call)
            return calls
        calls = self._run(go())
        self.calls += calls
        return calls

    def codes(self, calls: list, timeout: float) -> list:
        """Each call's status code, waiting at most `timeout` seconds for all of them."""
        async def go():
            return await asyncio.wait_for(asyncio.gather(*(c.code() for c in calls)), timeout)
        return self._run(go(), timeout + 5)

    def details(self, call) -> str:
        return self._run(call.details())

    def first_responses(self, calls: list, timeout: float) -> list:
        """The first response (bytes) of each call, waiting at most `timeout` seconds for all of them."""
        async def go():
            return await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), timeout)
        return self._run(go(), timeout + 5)

    def close(self) -> None:
        async def go():
            for call in self.calls:
                call.cancel()
            await self._channel.close()
        self._run(go(), 30)
