"""Replay server, in-process, side by side with dm-reverb 0.14: `python -m benchmarks.run server`.

Workload: items of 3 overlapping steps, one item per step, 20k steps, for the seed demo's spec
(action f32[2], observation uint8[10,10]) and an Atari-like one (observation uint8[84,84,4]); uniform and
prioritized tables. Measured: trajectory_writer insert steps/s, the same items by a structured_writer
(steps/s; after the sampling, into the reset table), `TrajectoryDataset(...).batch(256)` samples/s (and
samples per CPU-second of the process, all threads: robust under load), and resident memory per stored
byte (RSS growth while inserting / raw bytes of the steps).
The same code runs here (`import replay_tf as reverb`) and in the peer venv (`import reverb`).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from benchmarks import _harness
from benchmarks import _reverb_workload

NUM_STEPS = int(os.environ.get("BENCH_SERVER_STEPS", "20000"))

WORKLOAD = _reverb_workload.SOURCE + r'''
import tensorflow as tf

def _rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')

def run_case(spec_name, sampler_name, num_steps, num_batches):
    obs_shape = [10, 10] if spec_name == 'small' else [84, 84, 4]
    sampler = reverb.selectors.Uniform() if sampler_name == 'uniform' else reverb.selectors.Prioritized(0.6)
    signature = {'action': tf.TensorSpec([3, 2], tf.float32),
                 'observation': tf.TensorSpec([3, *obs_shape], tf.uint8)}
    table = reverb.Table('t', sampler, reverb.selectors.Fifo(), num_steps + 10, reverb.rate_limiters.MinSize(1),
                         signature=signature)
    server = reverb.Server([table])
    address = f'localhost:{server.port}'
    client = reverb.Client(address)
    steps = make_steps(obs_shape)
    rss_before = _rss_bytes()
    insert_rate = write_items(client, 't', steps, num_steps, priority=lambda i: float(i % 10 + 1))
    step_bytes = steps[0][0].nbytes + steps[1][0].nbytes
    memory_per_byte = (_rss_bytes() - rss_before) / (num_steps * step_bytes)
    best, best_cpu = sample_rate(address, 't', obs_shape, num_batches)
    client.reset('t')
    structured_rate = write_structured(client, 't', steps, num_steps)
    server.stop()
    return insert_rate, best, best_cpu, memory_per_byte, structured_rate

for spec_name, sampler_name in CASES:
    num_batches = 60 if spec_name == 'small' else 12
    insert_rate, samples_per_s, samples_per_cpu_s, memory_per_byte, structured_rate = run_case(
        spec_name, sampler_name, NUM_STEPS, num_batches)
    emit(f'{spec_name}/{sampler_name}/insert', insert_rate)
    emit(f"{spec_name}/{sampler_name}/sample", samples_per_s)
    emit(f"{spec_name}/{sampler_name}/sample_cpu", samples_per_cpu_s)
    emit(f'{spec_name}/{sampler_name}/memory', memory_per_byte)
    emit(f'{spec_name}/{sampler_name}/structured_insert', structured_rate)
'''

# Each case runs in a fresh process, so that the memory figure is not blurred by the previous case's frees.
CASES = [("small", "uniform"), ("small", "prioritized"), ("atari", "uniform"), ("atari", "prioritized")]


def _run_ours(case) -> dict:
    code = ("import json, os\nimport replay_tf as reverb\n_out = {}\nemit = _out.__setitem__\n"
            f"NUM_STEPS = {NUM_STEPS}\nCASES = [{tuple(case)!r}]\n" + WORKLOAD
            + "\nprint('RESULT ' + json.dumps(_out))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=1800,
                          cwd=str(pathlib.Path(__file__).resolve().parent.parent))
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark case {case} failed:\n{proc.stderr[-4000:]}")
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    peer = _harness.peer()
    ours, theirs = {}, {}
    for case in CASES:
        ours.update(_run_ours(case))
        if peer is not None:
            theirs.update(peer.run("import os, reverb\nNUM_STEPS = INPUTS['num_steps']\n"
                                   "CASES = [tuple(INPUTS['case'])]\n" + WORKLOAD,
                                   {"num_steps": NUM_STEPS, "case": list(case)}, timeout_s=1800))
    rows = []
    for key in ours:
        spec_name, sampler_name, metric = key.split("/")
        unit = {"insert": "steps/s", "sample": "samples/s", "sample_cpu": "samples/CPU-s",
                "memory": "RSS bytes per stored byte", "structured_insert": "steps/s"}[metric]
        what = {"insert": f"trajectory_writer insert, 3-step items, {NUM_STEPS} steps",
                "sample": "TrajectoryDataset(...).batch(256)",
                "sample_cpu": "TrajectoryDataset(...).batch(256), per CPU-second (all threads)",
                "memory": "memory per stored byte (lower is better)",
                "structured_insert": f"structured_writer insert, one config of 3-step items, {NUM_STEPS} steps"}[metric]
        rows.append({"workload": f"{spec_name} {sampler_name}: {what}", "ours": ours[key], "peer": theirs.get(key),
                     "peer_name": "dm-reverb 0.14 in-process", "unit": unit})
    _harness.report("server", rows)


if __name__ == "__main__":
    sys.exit(main())
