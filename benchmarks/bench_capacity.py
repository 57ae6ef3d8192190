"""Many open streams on one replay server: `python -m benchmarks.run capacity`.

Workload: a server in its own process with an empty queue table ('gate') and a uniform table
('data'); this process opens `BENCH_CAPACITY_STREAMS` (default 1,000) SampleStreams at once over one
grpc.aio channel, half of them idle (no request sent) and half samplers waiting on the empty queue's rate
limiter. With all of them open it measures: ServerInfo latency p50/p99 over 200 calls (a normal client's
channel), the time a new `trajectory_writer` takes to connect and have one item confirmed, and the
server's resident memory and thread count before and after opening the streams (a first writer inserts
before the streams open, so first-use costs on either side are left out). The same runs against
dm-reverb's server (C++ async gRPC) in the peer venv when there is one; both are driven by this process's
clients (grpc.aio for the streams, rl-data-tf's client for ServerInfo and the writer).
"""
from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time

from benchmarks import _harness

import stream_capacity_testlib  # (tests/, on sys.path through _harness)

NUM_STREAMS = int(os.environ.get("BENCH_CAPACITY_STREAMS", "1000"))
NUM_SERVER_INFO = 200

SERVER = r'''
import sys
table = reverb.Table("data", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100000,
                     reverb.rate_limiters.MinSize(1))
server = reverb.Server([reverb.Table.queue("gate", 100000), table], port=int(sys.argv[1]))
print("ready", flush=True)
sys.stdin.read()  # until the benchmark closes stdin
server.stop()
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _proc_status(pid: int) -> dict:
    """VmRSS (MiB) and Threads of process `pid`."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    return {"rss_mib": int(fields["VmRSS"].split()[0]) / 1024, "threads": int(fields["Threads"])}


def _start_server(kind: str, peer) -> tuple:
    port = _free_port()
    kwargs = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if kind == "ours":
        process = subprocess.Popen([sys.executable, "-c", "import replay_tf as reverb\n" + SERVER, str(port)],
                                   env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), **kwargs)
    else:
        process = peer.popen("import reverb\n" + SERVER, str(port), **kwargs)
    ready, _, _ = select.select([process.stdout], [], [], 180)
    if not ready or process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError(f"the {kind} server did not start")
    return process, f"localhost:{port}"


def _measure(kind: str, peer) -> dict:
    import grpc  # noqa: PLC0415
    from replay_tf.wire import reverb_service_pb2  # noqa: PLC0415
    from proc_testlib import remote_client  # noqa: PLC0415

    def write_one() -> float:
        started = time.perf_counter()
        with remote_client(address).trajectory_writer(1) as writer:
            writer.append({"x": 1})
            writer.create_item("data", 1.0, {"x": writer.history["x"][-1]})
            writer.flush(timeout_ms=30_000)
        return time.perf_counter() - started

    process, address = _start_server(kind, peer)
    opener = None
    try:
        write_one()  # first-use costs of both sides (e.g. the server's gc.freeze) stay out of the figure
        before = _proc_status(process.pid)
        opener = stream_capacity_testlib.StreamOpener(address)
        started = time.perf_counter()
        opener.open(NUM_STREAMS // 2)
        opener.open(NUM_STREAMS - NUM_STREAMS // 2, first_request=stream_capacity_testlib.sample_request("gate"))
        open_s = time.perf_counter() - started
        time.sleep(2.0)  # every stream reached the server's handlers
        after = _proc_status(process.pid)
        request = reverb_service_pb2.ServerInfoRequest().SerializeToString()
        latencies = []
        with grpc.insecure_channel(address) as channel:
            server_info = channel.unary_unary(stream_capacity_testlib.METHOD + "ServerInfo")
            server_info(request, timeout=30)  # (the channel connects)
            for _ in range(NUM_SERVER_INFO):
                call_started = time.perf_counter()
                server_info(request, timeout=30)
                latencies.append(time.perf_counter() - call_started)
        latencies.sort()
        writer_s = write_one()
        return {"server_info_p50_ms": latencies[len(latencies) // 2] * 1e3,
                "server_info_p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1e3,
                "writer_connect_ms": writer_s * 1e3, "open_streams_s": open_s,
                "rss_growth_mib": after["rss_mib"] - before["rss_mib"], "threads": after["threads"]}
    finally:
        if opener is not None:
            opener.close()
        try:
            process.stdin.close()
            process.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait(10)
        process.stdout.close()


def main() -> None:
    peer = _harness.peer()
    ours = _measure("ours", None)
    theirs = _measure("reverb", peer) if peer is not None else {}
    units = {"server_info_p50_ms": "ms", "server_info_p99_ms": "ms", "writer_connect_ms": "ms",
             "open_streams_s": "s", "rss_growth_mib": "MiB", "threads": "threads"}
    rows = []
    for name, unit in units.items():
        # Lower is better for every row: the ratio is peer / ours (>1: ours is better).
        row = {"workload": f"{NUM_STREAMS} open streams: {name}", "ours": ours[name], "peer": theirs.get(name),
               "peer_name": "dm-reverb server (C++ async gRPC)", "unit": f"{unit}, lower is better"}
        row["ratio"] = theirs[name] / ours[name] if theirs.get(name) and ours[name] else None
        rows.append(row)
    _harness.report("capacity", rows)


if __name__ == "__main__":
    main()
