"""rlds_tf.beam side by side: `rlds-tf convert` and `rlds-tf stats` on Beam with 2 and 1 DirectRunner workers,
and in one process.

Workload: a tfrecord RLDS dataset of 160 episodes x 200 steps (observation float32[64] and a uint8[32, 32, 3]
camera frame per step, int64 action, float64 reward), 10 episodes a shard (16 shards). Each command runs end
to end as a user runs it (`rlds-tf ...` in the Beam venv, process start and Beam's worker start included),
best of 2: convert to array_record with 10 episodes a shard, stats over every numeric step field.
Metric: episodes per second. Target: 2 workers >= 1.7x 1 worker (machines with >= 2 free cores).

Run: `python -m benchmarks.run beam` (builds the Beam venv with .ci/make_beam_venv.sh first).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import _harness

NUM_EPISODES = 160
EPISODE_LENGTH = 200
EPISODES_PER_SHARD = 10
REPEATS = 2
_ROOT = pathlib.Path(__file__).resolve().parent.parent

_MAKE_DATASET = """
import sys
import numpy as np, tensorflow as tf, tensorflow_datasets as tfds
from rlds_tf.recording import tfds_writer
directory, episodes, length, per_shard = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
config = tfds.rlds.rlds_base.DatasetConfig(
    name='bench', observation_info={'state': tfds.features.Tensor(shape=(64,), dtype=np.float32),
                                    'camera': tfds.features.Tensor(shape=(32, 32, 3), dtype=np.uint8)},
    action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64)
writer = tfds_writer.DatasetWriter(directory, config, max_episodes_per_file=per_shard)
rng = np.random.default_rng(0)
t = np.arange(length)
for _ in range(episodes):
    writer.add_episode({'steps': {
        'observation': {'state': rng.normal(size=(length, 64)).astype(np.float32),
                        'camera': rng.integers(0, 255, size=(length, 32, 32, 3), dtype=np.uint8)},
        'action': rng.integers(0, 4, size=length), 'reward': rng.normal(size=length), 'discount': np.ones(length),
        'is_first': t == 0, 'is_last': t == length - 1, 'is_terminal': t == length - 1}})
writer.close()
"""


def _beam_python() -> str:
    done = subprocess.run(["bash", str(_ROOT / ".ci" / "make_beam_venv.sh")], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip().splitlines()[-1]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(_ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}


def _seconds(python: str, argv: list, cleanup: str | None = None) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
        start = time.perf_counter()
        subprocess.run([python, "-m", "rlds_tf.cli", *argv], check=True, env=_env(), cwd=_ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    return best


def measure() -> dict:
    python = _beam_python()
    scratch = tempfile.mkdtemp(prefix="bench-beam-")
    try:
        source = os.path.join(scratch, "source")
        subprocess.run([python, "-c", _MAKE_DATASET, source, str(NUM_EPISODES), str(EPISODE_LENGTH),
                        str(EPISODES_PER_SHARD)], check=True, env=_env(), cwd=_ROOT, stderr=subprocess.DEVNULL)
        out = os.path.join(scratch, "out")
        convert = ["convert", source, out, "--format", "array_record", "--max-episodes-per-file",
                   str(EPISODES_PER_SHARD)]
        stats = ["stats", source, "--json"]
        rates = {}
        for label, extra in (("1 process", []), ("beam 1 worker", ["--num-workers", "1"]),
                             ("beam 2 workers", ["--num-workers", "2"])):
            rates[("convert", label)] = NUM_EPISODES / _seconds(python, convert + extra, cleanup=out)
            rates[("stats", label)] = NUM_EPISODES / _seconds(python, stats + extra)
        return rates
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    rates = measure()
    load = os.getloadavg()[0]
    rows = []
    for command in ("convert", "stats"):
        what = f"rlds-tf {command}, {NUM_EPISODES} eps x {EPISODE_LENGTH} steps, 16 shards"
        rows.append({"workload": f"{what}: Beam 2 workers vs 1", "ours": rates[(command, "beam 2 workers")],
                     "peer": rates[(command, "beam 1 worker")], "peer_name": "Beam DirectRunner, 1 worker",
                     "unit": "episodes/s", "load_average": load})
        rows.append({"workload": f"{what}: Beam 2 workers vs 1 process", "ours": rates[(command, "beam 2 workers")],
                     "peer": rates[(command, "1 process")], "peer_name": f"rlds-tf {command} in one process",
                     "unit": "episodes/s", "load_average": load})
    _harness.report("beam", rows)


if __name__ == "__main__":
    main()
