"""Open streams never starve the replay server: idle SampleStreams and samplers blocked on a rate limiter
leave ServerInfo fast and new writers connecting; streams over `max_streams` are refused at once with
RESOURCE_EXHAUSTED while unary calls stay served; unauthenticated calls are refused from their metadata."""
import os
import subprocess
import sys
import threading
import time

import grpc
import pytest

import replay_tf as reverb
from replay_tf.wire import reverb_service_pb2

from proc_testlib import ROOT, remote_client
from stream_capacity_testlib import METHOD, StreamOpener, sample_request

SERVER_INFO_BOUND_S = 1.0  # generous for a loaded 2-core machine; the sync pool answers in ~1 ms


def _tables():
    return [reverb.Table.queue("gate", 10_000),
            reverb.Table("data", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10_000,
                         reverb.rate_limiters.MinSize(1))]


def _wait_open_streams(server, count: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while server._service.streams.open < count:
        assert time.monotonic() < deadline, f"{server._service.streams.open} of {count} streams opened"
        time.sleep(0.05)


def _server_info_seconds(address: str, metadata=None) -> float:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(METHOD + "ServerInfo")
        started = time.monotonic()
        call(reverb_service_pb2.ServerInfoRequest().SerializeToString(), timeout=10, metadata=metadata)
        return time.monotonic() - started


def _write_one(address: str, key_value: int, timeout_ms: int = 10_000) -> None:
    with remote_client(address).trajectory_writer(1) as writer:
        writer.append({"x": key_value})
        writer.create_item("data", 1.0, {"x": writer.history["x"][-1]})
        writer.flush(timeout_ms=timeout_ms)


def test_idle_streams_and_blocked_samplers_leave_server_info_and_new_writers_served():
    server = reverb.Server(_tables())
    address = f"localhost:{server.port}"
    opener = StreamOpener(address)
    try:
        opener.open(120)  # idle: never send a request
        samplers = opener.open(100, first_request=sample_request("gate"))  # wait on the empty queue
        _wait_open_streams(server, 220)
        assert _server_info_seconds(address) < SERVER_INFO_BOUND_S
        _write_one(address, 7)
        assert server.tables["data"].size() == 1
        client = remote_client(address)
        client.mutate_priorities("data", updates={next(iter(client.sample("data", emit_timesteps=False))).info.key: 2.0})
        # The blocked samplers were waiting, and each gets one of the items inserted now.
        with client.trajectory_writer(1) as writer:
            for i in range(100):
                writer.append({"x": i})
                writer.create_item("gate", 1.0, {"x": writer.history["x"][-1]})
            writer.flush(timeout_ms=10_000)
        responses = opener.first_responses(samplers, timeout=20)
        assert all(responses) and len(responses) == 100
        assert server.tables["gate"].size() == 0
    finally:
        opener.close()
        server.stop()


def test_streams_over_max_streams_are_refused_at_once_and_unary_calls_still_served():
    server = reverb.Server(_tables(), max_streams=8)
    address = f"localhost:{server.port}"
    opener = StreamOpener(address)
    try:
        held = opener.open(4) + opener.open(4, first_request=sample_request("gate"))
        _wait_open_streams(server, 8)
        started = time.monotonic()
        refused = opener.open(3) + opener.open(2, method="InsertStream")
        assert opener.codes(refused, timeout=5) == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 5
        assert time.monotonic() - started < 5
        assert "max_streams" in opener.details(refused[0])
        assert _server_info_seconds(address) < SERVER_INFO_BOUND_S
        client = remote_client(address)
        client.reset("data")
        with pytest.raises(reverb.errors.ReverbError, match="RESOURCE_EXHAUSTED"):
            _write_one(address, 1)  # its stream is refused at once, with the reason
        for call in held:
            call.cancel()
        _wait_closed = time.monotonic() + 10
        while server._service.streams.open:
            assert time.monotonic() < _wait_closed, f"{server._service.streams.open} streams still counted"
            time.sleep(0.05)
        _write_one(address, 2)
        assert server.tables["data"].size() == 1
    finally:
        opener.close()
        server.stop()


def test_unauthenticated_calls_that_never_send_a_body_are_refused_from_metadata():
    server = reverb.Server(_tables(), auth_token="s3cret")
    address = f"localhost:{server.port}"
    opener = StreamOpener(address, metadata=(("authorization", "Bearer wrong"),))
    try:
        # Unary methods called as streams that never send their request, and streams never read: every one
        # is refused from its metadata, none holds a server thread.
        calls = (opener.open(150, method="ServerInfo") + opener.open(150, method="MutatePriorities")
                 + opener.open(150))
        assert set(opener.codes(calls, timeout=20)) == {grpc.StatusCode.UNAUTHENTICATED}
        assert _server_info_seconds(address, metadata=(("authorization", "Bearer s3cret"),)) < SERVER_INFO_BOUND_S
    finally:
        opener.close()
        server.stop()


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "8"])
def test_max_streams_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match="max_streams"):
        reverb.Server(_tables(), max_streams=value)


_ACTORS = r'''
import sys, threading
sys.path.insert(0, "tests")
from proc_testlib import remote_client
address, num_actors, items = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
errors = []
start = threading.Barrier(num_actors)
release = threading.Event()  # set when the test has counted the open streams (a line on stdin)
threading.Thread(target=lambda: (sys.stdin.readline(), release.set()), daemon=True).start()
def actor(index):
    try:
        with remote_client(address).trajectory_writer(1) as writer:
            for i in range(items):
                writer.append({"x": index * 1000 + i})
                writer.create_item("data", 1.0, {"x": writer.history["x"][-1]})
                writer.flush(timeout_ms=60_000)
                if i == 0:
                    start.wait(120)  # every actor's stream is open (its first item confirmed) before the rest
            release.wait(240)  # (the stream stays open until then)
    except Exception as e:
        errors.append(f"actor {index}: {type(e).__name__}: {e}")
threads = [threading.Thread(target=actor, args=(i,)) for i in range(num_actors)]
for t in threads: t.start()
for t in threads: t.join(300)
print("ERRORS", errors, flush=True)
print("DONE", sum(t.is_alive() for t in threads), flush=True)
'''


@pytest.mark.slow
def test_200_actors_and_50_samplers_blocked_on_rate_limiters():
    """200 writers (threads of one client process) insert while 50 samplers wait on an empty queue."""
    num_actors, items = 200, 5
    server = reverb.Server(_tables())
    address = f"localhost:{server.port}"
    opener = StreamOpener(address)
    actors = None
    try:
        samplers = opener.open(50, first_request=sample_request("gate"))
        _wait_open_streams(server, 50)
        actors = subprocess.Popen([sys.executable, "-c", _ACTORS, address, str(num_actors), str(items)],
                                  cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        latencies, most_open = [], 0
        deadline = time.monotonic() + 240
        release_by, released = time.monotonic() + 120, False  # (the actors keep their streams open till then)
        while actors.poll() is None:
            assert time.monotonic() < deadline, "the actors did not finish in 240 s"
            latencies.append(_server_info_seconds(address))
            most_open = max(most_open, server._service.streams.open)
            if not released and (most_open >= 50 + num_actors or time.monotonic() > release_by):
                actors.stdin.write("release\n")
                actors.stdin.flush()
                released = True
            time.sleep(0.2)
        out, err = actors.communicate(timeout=30)
        assert "ERRORS []" in out and "DONE 0" in out, (out, err[-3000:])
        assert server.tables["data"].size() == num_actors * items
        assert max(latencies) < SERVER_INFO_BOUND_S, sorted(latencies)[-5:]
        assert most_open >= 50 + num_actors, most_open  # every actor's stream and every sampler's at once
        # The samplers waited all along, and each still gets an item now.
        with remote_client(address).trajectory_writer(1) as writer:
            for i in range(50):
                writer.append({"x": i})
                writer.create_item("gate", 1.0, {"x": writer.history["x"][-1]})
            writer.flush(timeout_ms=10_000)
        assert all(opener.first_responses(samplers, timeout=20))
    finally:
        if actors is not None and actors.poll() is None:
            actors.kill()
            actors.communicate()
        opener.close()
        server.stop()


def test_serve_refuses_a_bad_max_streams(tmp_path, capsys):
    from replay_tf import cli
    config = tmp_path / "tables.json"
    config.write_text('{"tables": [{"name": "q", "queue": 10}]}')
    assert cli.main(["serve", "--config", str(config), "--max-streams", "0"]) == 1
    assert "max_streams (0) must be a positive int" in capsys.readouterr().err


@pytest.mark.slow  # a server process
def test_serve_max_streams_option(tmp_path):
    config = tmp_path / "tables.json"
    config.write_text('{"tables": [{"name": "gate", "queue": 10}]}')
    serve = subprocess.Popen([sys.executable, "-m", "replay_tf.cli", "serve", "--config", str(config),
                              "--max-streams", "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    opener = None
    try:
        deadline = time.monotonic() + 120
        for line in serve.stdout:  # (the server prints its address once it serves)
            if "serving tables" in line:
                break
            assert time.monotonic() < deadline, "replay-tf serve did not start in 120 s"
        assert "serving tables" in line, line
        address = line.rsplit(" on ", 1)[1].split()[0]
        opener = StreamOpener(address)
        opener.open(1)
        opener.open(1, first_request=sample_request("gate"))
        time.sleep(1.0)  # both reached the server's handlers
        refused = opener.open(1)
        assert opener.codes(refused, timeout=10) == [grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert "2 open streams" in opener.details(refused[0])
        assert _server_info_seconds(address) < SERVER_INFO_BOUND_S
    finally:
        if opener is not None:
            opener.close()
        serve.kill()
        serve.communicate(timeout=30)


def _pool_threads(name_prefix: str, but=frozenset()) -> int:
    """The live threads named `name_prefix...`, other than the threads `but`."""
    return sum(t.name.startswith(name_prefix) and t not in but for t in threading.enumerate())


def test_stop_ends_the_threads_that_served_streams():
    # Other servers of this process (earlier tests') keep their own pool threads: count this server's.
    others = frozenset(t for t in threading.enumerate() if t.name.startswith("replay_tf-grpc"))
    server = reverb.Server(_tables())
    address = f"localhost:{server.port}"
    opener = StreamOpener(address)
    try:
        opener.open(40)
        _wait_open_streams(server, 40)
        assert _pool_threads("replay_tf-grpc", others) >= 40
    finally:
        opener.close()
        server.stop()
    deadline = time.monotonic() + 10
    while _pool_threads("replay_tf-grpc", others):
        assert time.monotonic() < deadline, f"{_pool_threads('replay_tf-grpc', others)} server threads left"
        time.sleep(0.05)
