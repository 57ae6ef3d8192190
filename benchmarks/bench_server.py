"""Replay server, in-process, side by side with dm-reverb 0.14: `python -m benchmarks.run server`.

Workload (issue 5): items of 3 overlapping steps, one item per step, 20k steps, for the seed demo's spec
(action f32[2], observation uint8[10,10]) and an Atari-like one (observation uint8[84,84,4]); uniform and
prioritized tables. Measured: trajectory_writer insert steps/s, `TrajectoryDataset(...).batch(256)`
samples/s, and resident memory per stored byte (RSS growth while inserting / raw bytes of the steps).
The same code runs here (`import replay_tf as reverb`) and in the peer venv (`import reverb`).
"""
from __future__ import annotations

import os
import sys

from benchmarks import _harness

NUM_STEPS = int(os.environ.get("BENCH_SERVER_STEPS", "20000"))

WORKLOAD = r'''
import time
import numpy as np
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
    rng = np.random.default_rng(0)
    observations = rng.integers(0, 256, size=[64, *obs_shape], dtype=np.uint8)
    actions = rng.random([64, 2], dtype=np.float32)
    rss_before = _rss_bytes()
    start = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for i in range(num_steps):
            writer.append({'action': actions[i % 64], 'observation': observations[i % 64]})
            if i >= 2:
                writer.create_item('t', float(i % 10 + 1), {'action': writer.history['action'][-3:],
                                                          'observation': writer.history['observation'][-3:]})
    insert_rate = num_steps / (time.perf_counter() - start)
    step_bytes = observations[0].nbytes + actions[0].nbytes
    memory_per_byte = (_rss_bytes() - rss_before) / (num_steps * step_bytes)
    dataset = reverb.TrajectoryDataset.from_table_signature(address, 't', max_in_flight_samples_per_worker=512)
    iterator = iter(dataset.batch(256))
    next(iterator)
    best = 0.0
    for _ in range(2):
        start = time.perf_counter()
        for _ in range(num_batches):
            batch = next(iterator)
        best = max(best, 256 * num_batches / (time.perf_counter() - start))
    assert batch.data['observation'].shape == (256, 3, *obs_shape)
    del iterator, dataset, batch
    server.stop()
    return insert_rate, best, memory_per_byte

for spec_name, num_batches in [('small', 60), ('atari', 12)]:
    for sampler_name in ['uniform', 'prioritized']:
        insert_rate, sample_rate, memory_per_byte = run_case(spec_name, sampler_name, NUM_STEPS, num_batches)
        emit(f'{spec_name}/{sampler_name}/insert', insert_rate)
        emit(f'{spec_name}/{sampler_name}/sample', sample_rate)
        emit(f'{spec_name}/{sampler_name}/memory', memory_per_byte)
'''


def _run_ours() -> dict:
    import replay_tf as reverb  # noqa: F401  (used by WORKLOAD)

    out: dict = {}
    scope = {"reverb": reverb, "os": os, "NUM_STEPS": NUM_STEPS, "emit": out.__setitem__}
    exec(WORKLOAD, scope)  # noqa: S102  (our own benchmark code)
    return out


def main() -> None:
    ours = _run_ours()
    peer = _harness.peer()
    theirs = {}
    if peer is not None:
        theirs = peer.run("import os, reverb\nNUM_STEPS = INPUTS['num_steps']\n" + WORKLOAD,
                          {"num_steps": NUM_STEPS}, timeout_s=1800)
    rows = []
    for key in ours:
        spec_name, sampler_name, metric = key.split("/")
        unit = {"insert": "steps/s", "sample": "samples/s", "memory": "RSS bytes per stored byte"}[metric]
        what = {"insert": f"trajectory_writer insert, 3-step items, {NUM_STEPS} steps",
                "sample": "TrajectoryDataset(...).batch(256)",
                "memory": "memory per stored byte (lower is better)"}[metric]
        rows.append({"workload": f"{spec_name} {sampler_name}: {what}", "ours": ours[key], "peer": theirs.get(key),
                     "peer_name": "dm-reverb 0.14 in-process", "unit": unit})
    _harness.report("server", rows)


if __name__ == "__main__":
    sys.exit(main())
