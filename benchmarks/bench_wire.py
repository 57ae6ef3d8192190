"""Reverb protocol over gRPC on loopback, server and client in separate processes: `python -m benchmarks.run wire`.

Workload (the server suite's workload across processes): items of 3 overlapping steps, one item per
step, for the seed demo's spec (action f32[2], observation uint8[10,10]) and an Atari-like one (observation
uint8[84,84,4]), uniform table. Measured: trajectory_writer insert steps/s (until the final flush returns)
and `TrajectoryDataset.from_table_signature(...).batch(256)` samples/s (and samples per CPU-second of the
client process, all threads: robust under load, but it leaves out the server's work), for the four pairs
{our server, dm-reverb server} x {our client, dm-reverb client}. The reference is dm-reverb server with
dm-reverb client; the mixed pairs are reported beside it. Our client asks servers on this machine for
stacked samples (rl-data-tf's extension, which only our server implements), and our server gathers them
into the client's shared memory (the same-machine extension, `replay_tf.grpc.shared_memory`); ours -> ours
sampling is also reported without shared memory (`REPLAY_TF_SHARED_MEMORY=0`) and without either
(`stacked_samples=False`, Reverb's protocol as is). The `floor:` rows measure gRPC Python receiving the
same `SampleStream` responses (from the dm-reverb server) and protobuf parsing them, nothing decoded: the
least any Python client built on grpcio and protobuf can spend per sample.

This host's speed swings by 2x over tens of seconds, so every pair runs once per round (`BENCH_WIRE_ROUNDS`,
default 3; the order of the servers alternates): a row gives the medians of ours and of the reference, and
the median of the rounds' ratios, each taken within one round (`round_ratios` in the JSON lists them).
"""
from __future__ import annotations

import functools
import os
import select
import socket
import subprocess
import sys
import textwrap
import types

from benchmarks import _harness
from benchmarks import _reverb_workload

NUM_STEPS = int(os.environ.get("BENCH_WIRE_STEPS", "10000"))
ROUNDS = int(os.environ.get("BENCH_WIRE_ROUNDS", "3"))  # every pair runs once per round; rows give medians
SPECS = {"small": ([10, 10], 60), "atari": ([84, 84, 4], 12)}  # observation shape, batches per measurement

SERVER = r'''
import sys
import tensorflow as tf
tables = []
for name, shape in [("small", [10, 10]), ("atari", [84, 84, 4])]:
    signature = {"action": tf.TensorSpec([3, 2], tf.float32), "observation": tf.TensorSpec([3, *shape], tf.uint8)}
    tables.append(reverb.Table(f"t_{name}", reverb.selectors.Uniform(), reverb.selectors.Fifo(),
                               int(sys.argv[2]) + 10, reverb.rate_limiters.MinSize(1), signature=signature))
server = reverb.Server(tables, port=int(sys.argv[1]))
print("ready", flush=True)
sys.stdin.read()  # serve until the benchmark closes our stdin
server.stop()
'''

CLIENT = _reverb_workload.SOURCE + r'''
def run_case(address, spec_name, obs_shape, num_steps, num_batches):
    client = reverb.Client(address)
    table = f"t_{spec_name}"
    client.reset(table)
    insert_rate = write_items(client, table, make_steps(obs_shape), num_steps)
    return (insert_rate, *sample_rate(address, table, obs_shape, num_batches))

for spec_name, (obs_shape, num_batches) in SPECS.items():
    insert_rate, samples_per_s, samples_per_cpu_s = run_case(ADDRESS, spec_name, obs_shape, NUM_STEPS, num_batches)
    emit(f"{spec_name}/insert", insert_rate)
    emit(f"{spec_name}/sample", samples_per_s)
    emit(f"{spec_name}/sample_cpu", samples_per_cpu_s)
'''


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _ServerProcess:
    """A replay server in its own process: ours (this interpreter) or dm-reverb's (the peer venv)."""

    def __init__(self, kind: str, peer):
        self.port = _free_port()
        args = [str(self.port), str(NUM_STEPS)]
        kwargs = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if kind == "ours":
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
            self.process = subprocess.Popen([sys.executable, "-c", "import replay_tf as reverb\n" + SERVER, *args],
                                            env=env, **kwargs)
        else:
            self.process = peer.popen("import reverb\n" + SERVER, *args, **kwargs)
        ready, _, _ = select.select([self.process.stdout], [], [], 180)
        if not ready or self.process.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError(f"the {kind} server did not start")

    def stop(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(60)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait(10)
        self.process.stdout.close()


def _run_our_client(address: str, entries_too: bool = False) -> dict:
    """The workload with our client; with `entries_too`, its sampling twice more: stacked but without shared
    memory (`REPLAY_TF_SHARED_MEMORY=0`: every response through gRPC) as `{spec}/sample_inline[_cpu]`, and as
    Reverb's protocol has it (`stacked_samples=False`: one entry per sample, no stacked responses) as
    `{spec}/sample_entries[_cpu]`."""
    import replay_tf as reverb  # noqa: PLC0415
    from replay_tf.grpc import shared_memory  # noqa: PLC0415

    out: dict = {}
    scope = {"reverb": reverb, "ADDRESS": address, "SPECS": SPECS, "NUM_STEPS": NUM_STEPS, "emit": out.__setitem__}
    exec(textwrap.dedent(CLIENT), scope)  # noqa: S102  (our own benchmark code)
    if entries_too:
        os.environ[shared_memory.ENV] = "0"
        try:
            for spec_name, (obs_shape, num_batches) in SPECS.items():
                rate, per_cpu = scope["sample_rate"](address, f"t_{spec_name}", obs_shape, num_batches)
                out[f"{spec_name}/sample_inline"], out[f"{spec_name}/sample_inline_cpu"] = rate, per_cpu
        finally:
            del os.environ[shared_memory.ENV]
        entries_only = types.SimpleNamespace(TrajectoryDataset=types.SimpleNamespace(
            from_table_signature=functools.partial(reverb.TrajectoryDataset.from_table_signature,
                                                   stacked_samples=False)))
        scope["reverb"] = entries_only  # (sample_rate reads its module global `reverb`)
        for spec_name, (obs_shape, num_batches) in SPECS.items():
            rate, per_cpu = scope["sample_rate"](address, f"t_{spec_name}", obs_shape, num_batches)
            out[f"{spec_name}/sample_entries"], out[f"{spec_name}/sample_entries_cpu"] = rate, per_cpu
    return out


def _receive_floor(address: str) -> dict:
    """What our client's transport alone costs, without decoding a sample: gRPC Python receiving
    `SampleStream` responses (requests of 512 sent up front, so the server never waits) and protobuf (upb)
    parsing them, per spec as the dataset rows (`{spec}/floor` samples/s, `{spec}/floor_cpu` per CPU-second
    of this process). A Python Reverb client can be no faster than this: `TrajectoryDataset` adds the
    decoding, stacking and TensorFlow's hand-off on top."""
    import time  # noqa: PLC0415

    import grpc  # noqa: PLC0415

    from replay_tf.grpc import common  # noqa: PLC0415
    from replay_tf.wire import reverb_service_pb2  # noqa: PLC0415

    out = {}
    with grpc.insecure_channel(address, options=common.CHANNEL_OPTIONS) as channel:  # our client's channel
        method = channel.stream_stream(common.SERVICE + "SampleStream", request_serializer=common.identity,
                                       response_deserializer=common.identity)
        for spec_name, (_, num_batches) in SPECS.items():
            request = reverb_service_pb2.SampleStreamRequest(table=f"t_{spec_name}", num_samples=512)
            request.rate_limiter_timeout.milliseconds = -1
            wanted, best, best_cpu = 256 * num_batches, 0.0, 0.0
            for _ in range(3):  # the first run warms up
                call = method(iter([request.SerializeToString()] * (wanted // 512 + 1)))
                received, start, cpu_start = 0, time.perf_counter(), time.process_time()
                for raw in call:
                    entries = reverb_service_pb2.SampleStreamResponse.FromString(raw).entries
                    received += sum(entry.end_of_sequence for entry in entries)
                    if received >= wanted:
                        break
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
                call.cancel()
                best, best_cpu = max(best, received / elapsed), max(best_cpu, received / max(cpu, 1e-9))
            out[f"{spec_name}/floor"], out[f"{spec_name}/floor_cpu"] = best, best_cpu
    return out


def _run_peer_client(peer, address: str) -> dict:
    code = ("import reverb\nADDRESS = INPUTS['address']\nSPECS = INPUTS['specs']\nNUM_STEPS = INPUTS['num_steps']\n"
            + CLIENT)
    return peer.run(code, {"address": address, "specs": SPECS, "num_steps": NUM_STEPS}, timeout_s=1800)


def _one_round(peer, server_kinds: list) -> tuple:
    """Every pair once: `({(server, client): values}, floor values, floor's server kind)`."""
    results, floor, floor_server = {}, {}, None
    for server_kind in server_kinds:
        server = _ServerProcess(server_kind, peer)
        try:
            address = f"localhost:{server.port}"
            results[(server_kind, "ours")] = _run_our_client(address, entries_too=server_kind == "ours")
            if peer is not None:
                results[(server_kind, "reverb")] = _run_peer_client(peer, address)
            if server_kind == "reverb" or peer is None:  # the dm-reverb server, where there is one
                floor, floor_server = _receive_floor(address), server_kind
        finally:
            server.stop()
    return results, floor, floor_server


def _median(values: list):
    values = sorted(v for v in values if v)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def main() -> None:
    peer = _harness.peer()
    rounds = []
    for index in range(ROUNDS):  # the server order alternates, so no pair always runs in the same phase
        kinds = ["ours", "reverb"] if peer is not None else ["ours"]
        rounds.append(_one_round(peer, kinds if index % 2 == 0 else kinds[::-1]))
    floor_server = rounds[0][2]

    def row(workload: str, unit: str, key: str, ours_of) -> dict:
        """A row over the rounds: medians of ours and of the reference, and the median of the rounds' ratios
        (each round's ours over that round's reference: both measured minutes apart at most)."""
        ours = [ours_of(results, floor) for results, floor, _ in rounds]
        peers = [results.get(("reverb", "reverb"), {}).get(key) for results, _, _ in rounds]
        ratios = [o / p for o, p in zip(ours, peers) if o and p]
        out = {"workload": workload, "ours": _median(ours), "peer": _median(peers),
               "peer_name": "dm-reverb client -> dm-reverb server", "unit": unit}
        if ratios:
            out["ratio"] = _median(ratios)
            out["round_ratios"] = [round(r, 3) for r in ratios]
        return out

    rows = []
    pairs = sorted({pair for results, _, _ in rounds for pair in results if pair != ("reverb", "reverb")})
    for spec_name in SPECS:
        for metric, what, unit in [("insert", f"writer insert ({NUM_STEPS} steps, 3-step items)", "steps/s"),
                                   ("sample", "TrajectoryDataset.batch(256)", "samples/s"),
                                   ("sample_cpu", "TrajectoryDataset.batch(256) per client CPU-second",
                                    "samples/CPU-s")]:
            key = f"{spec_name}/{metric}"
            for server_kind, client_kind in pairs:
                rows.append(row(f"{client_kind[:6]}->{server_kind[:6]} {spec_name} {what}", unit, key,
                                lambda results, floor, pair=(server_kind, client_kind): results[pair].get(key)))
            entries_key = f"{spec_name}/{metric.replace('sample', 'sample_entries')}"
            inline_key = f"{spec_name}/{metric.replace('sample', 'sample_inline')}"
            if metric != "insert":  # ours -> ours without shared memory, and without the stacked extension
                rows.append(row(f"ours->ours {spec_name} {what}, no shared memory (REPLAY_TF_SHARED_MEMORY=0)",
                                unit, key, lambda results, floor: results.get(("ours", "ours"), {}).get(inline_key)))
                rows.append(row(f"ours->ours {spec_name} {what}, Reverb's protocol (stacked_samples=False)", unit, key,
                                lambda results, floor: results.get(("ours", "ours"), {}).get(entries_key)))
                # The transport's floor beside the dataset rows.
                rows.append(row(f"floor: gRPC receive + protobuf parse only ->{floor_server[:6]} {spec_name} "
                                f"{what.replace('TrajectoryDataset.batch(256)', 'SampleStream')}", unit, key,
                                lambda results, floor: floor.get(f"{spec_name}/{metric.replace('sample', 'floor')}")))
    _harness.report("wire", rows)


if __name__ == "__main__":
    sys.exit(main())
