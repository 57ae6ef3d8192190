"""A `replay-tf serve` process at its address-space limit refuses new streams with RESOURCE_EXHAUSTED and
goes on serving: ServerInfo, the streams already open (inserts and samples), and new streams once others
close; SIGTERM still writes the exit checkpoint and ends it. A server whose gRPC thread dies ends itself,
after its exit checkpoint, instead of staying up answering nothing."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from replay_tf.wire import reverb_service_pb2

from proc_testlib import ROOT, remote_client
from stream_capacity_testlib import METHOD, StreamOpener, sample_request

pytestmark = pytest.mark.slow  # a server process (TensorFlow's import) and a few hundred streams

#: Address space left to the server over what it maps once serving: a few dozen streams' threads.
_ADDRESS_SPACE_LEFT_BYTES = 320 << 20
_MAX_STREAMS_TRIED = 400
_SERVER_INFO_BOUND_S = 5.0
_EXIT_BOUND_S = 30.0

_TABLES = {"tables": [{"name": "gate", "queue": 10},
                      {"name": "data", "sampler": "fifo", "remover": "fifo", "max_size": 1000,
                       "rate_limiter": {"min_size": 1}}]}


class _Serve:
    """A `replay-tf serve` process (run as `python -c CODE`), its output lines collected by a thread."""

    def __init__(self, code: str, args: list):
        self.popen = subprocess.Popen([sys.executable, "-c", code, "serve", *args], cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "3"})
        self.lines: list = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))
            self._queue.put(line)

    def address(self, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"replay-tf serve did not start in {timeout_s} s: {self.output()}") from None
            if "serving tables" in line:
                return line.rsplit(" on ", 1)[1].split()[0]

    def output(self) -> str:
        return "\n".join(self.lines[-40:])

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(30)
        self.popen.stdout.close()


_SERVE = "import sys; from replay_tf import cli; sys.exit(cli.main(sys.argv[1:]))"


def _mapped_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmSize for process {pid}")


def _server_info(address: str) -> float:
    with grpc.insecure_channel(address) as channel:
        started = time.monotonic()
        channel.unary_unary(METHOD + "ServerInfo")(reverb_service_pb2.ServerInfoRequest().SerializeToString(),
                                                   timeout=_SERVER_INFO_BOUND_S)
        return time.monotonic() - started


def _ended(opener: StreamOpener, calls: list) -> list:
    """`(call, status code)` of the calls that have ended."""
    done = [call for call in calls if call.done()]
    return list(zip(done, opener.codes(done, timeout=10))) if done else []


def _open_until_refused(opener: StreamOpener) -> tuple:
    """Opens idle InsertStreams, 8 at a time, until some are refused: (the open ones, the refused ones)."""
    held: list = []
    while len(held) < _MAX_STREAMS_TRIED:
        batch = opener.open(8, method="InsertStream")
        time.sleep(0.5)  # (a refusal comes at once)
        held += batch
        if any(call.done() for call in batch):
            time.sleep(1.0)  # (refusals slower to arrive end too)
            ended = _ended(opener, held)
            return [call for call in held if not call.done()], ended
    raise AssertionError(f"none of {len(held)} streams was refused under the address-space limit")


def test_serve_at_its_address_space_limit_refuses_streams_and_keeps_serving(tmp_path):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps(_TABLES))
    serve = _Serve(_SERVE, ["--config", str(config), "--checkpoint-dir", str(tmp_path / "checkpoints"),
                            "--stats-interval", "60"])
    opener = None
    try:
        address = serve.address()
        writer = remote_client(address).trajectory_writer(1)
        writer.append({"x": 0})
        writer.create_item("data", 1.0, {"x": writer.history["x"][-1]})
        writer.flush(timeout_ms=10_000)  # its InsertStream is open from now on
        opener = StreamOpener(address)
        [sampler] = opener.open(1, first_request=sample_request("gate"))  # waits on the empty queue
        limit = _mapped_bytes(serve.popen.pid) + _ADDRESS_SPACE_LEFT_BYTES
        subprocess.run(["prlimit", f"--pid={serve.popen.pid}", f"--as={limit}"], check=True)

        held, refused = _open_until_refused(opener)
        assert len(held) >= 4, f"only {len(held)} streams opened under the limit"
        assert {code for _, code in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}, refused
        assert "cannot start a thread" in opener.details(refused[0][0]), opener.details(refused[0][0])
        # More streams are refused the same way, at once.
        again = opener.open(8, method="InsertStream")
        assert opener.codes(again, timeout=10) == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 8

        # Unary calls and the streams already open are served.
        assert max(_server_info(address) for _ in range(5)) < _SERVER_INFO_BOUND_S
        writer.append({"x": 1})
        writer.create_item("data", 1.0, {"x": writer.history["x"][-1]})
        writer.create_item("gate", 1.0, {"x": writer.history["x"][-1]})
        writer.flush(timeout_ms=10_000)
        assert opener.first_responses([sampler], timeout=10)[0]  # the waiting sampler got the gate item
        assert not any(call.done() for call in held)
        assert remote_client(address).server_info()["data"].current_size == 2

        # Streams closed leave their threads to new ones.
        for call in held:
            call.cancel()
        time.sleep(1.0)
        fresh = opener.open(8, method="InsertStream")
        time.sleep(1.0)  # (a refusal comes at once)
        assert _ended(opener, fresh) == []
        with remote_client(address).trajectory_writer(1) as new_writer:
            new_writer.append({"x": 2})
            new_writer.create_item("data", 1.0, {"x": new_writer.history["x"][-1]})
            new_writer.flush(timeout_ms=10_000)
        writer.close()
        assert remote_client(address).server_info()["data"].current_size == 3

        serve.popen.send_signal(signal.SIGTERM)
        try:
            code = serve.popen.wait(_EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM did not end the server in {_EXIT_BOUND_S} s: {serve.output()}") from None
        assert code == 0, serve.output()
        assert any(line.startswith("checkpoint: ") for line in serve.lines), serve.output()
    finally:
        if opener is not None:
            opener.close()
        serve.close()


# grpc's server thread dies of an error at the first call, as when its executor cannot start a thread.
_SERVE_WITH_FAILING_EXECUTOR = """
import sys
import grpc
class FailingExecutor:
    def submit(self, fn, /, *args, **kwargs):
        raise RuntimeError("can't start new thread")
grpc_server = grpc.server
grpc.server = lambda executor, **kwargs: grpc_server(FailingExecutor(), **kwargs)
from replay_tf import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_serve_whose_grpc_thread_dies_checkpoints_and_exits(tmp_path):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps(_TABLES))
    serve = _Serve(_SERVE_WITH_FAILING_EXECUTOR, ["--config", str(config), "--checkpoint-dir",
                                              str(tmp_path / "checkpoints"), "--stats-interval", "60"])
    try:
        address = serve.address()
        with pytest.raises(grpc.RpcError):
            _server_info(address)  # never answered: the thread that would hand it on is gone
        try:
            code = serve.popen.wait(_EXIT_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server stayed up answering nothing: {serve.output()}") from None
        assert code == 1, serve.output()
        output = serve.output()
        assert "the gRPC server stopped answering calls" in output and "restart the server" in output, output
        assert any(line.startswith("checkpoint: ") for line in serve.lines), output
    finally:
        serve.close()
