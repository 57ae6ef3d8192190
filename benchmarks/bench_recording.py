"""Recording throughput side by side: rlds_tf's EnvLogger vs envlogger 1.2's TFDS backend (peer venv).

Workload (identical code both sides, only the imports differ): the recording cell of the rlds+reverb
notebook: Catch (10x5 float32 board, ZLIB-encoded), random actions, a `step_fn` adding `timestamp_ns`,
`max_episodes_per_file=1000`; 300 episodes (3,000 env steps) per run into a fresh directory, best of 3.
Metric: recorded env steps per second, end to end (env + wrapper + encoding + writing + metadata).

Run: `python -m benchmarks.run recording`.
"""
from __future__ import annotations

from benchmarks import _harness

NUM_EPISODES = 300

_WORKLOAD = """
import shutil, tempfile, time
import numpy as np, tensorflow as tf, tensorflow_datasets as tfds

def step_fn(unused_timestep, unused_action, unused_env):
    return {{'timestamp_ns': time.time_ns()}}

ds_config = tfds.rlds.rlds_base.DatasetConfig(
    name='catch_example',
    observation_info=tfds.features.Tensor(shape=(10, 5), dtype=tf.float32, encoding=tfds.features.Encoding.ZLIB),
    action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64,
    step_metadata_info={{'timestamp_ns': tf.int64}})

def record_once():
    data_dir = tempfile.mkdtemp()
    steps = 0
    try:
        with EnvLogger(Catch(), backend=TFDSBackendWriter(data_directory=data_dir, split_name='train',
                                                          max_episodes_per_file=1000, ds_config=ds_config),
                       step_fn=step_fn) as env:
            for _ in range({episodes}):
                timestep = env.reset()
                steps += 1
                while not timestep.last():
                    timestep = env.step(np.random.randint(low=0, high=3))
                    steps += 1
    finally:
        shutil.rmtree(data_dir)
    return steps

record_once()  # warm-up (imports, first TFDS metadata write)
rate = best_rate(record_once, repeats=3, min_seconds=0.0)
""".format(episodes=NUM_EPISODES)

_BEST_RATE = '''
def best_rate(fn, repeats=3, min_seconds=0.0):
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        count = fn()
        best = max(best, count / (time.perf_counter() - start))
    return best
'''


def _ours() -> float:
    from rlds_tf.recording import Catch, EnvLogger, TFDSBackendWriter
    scope = {"EnvLogger": EnvLogger, "TFDSBackendWriter": TFDSBackendWriter, "Catch": Catch,
             "best_rate": _harness.best_rate}
    exec(_WORKLOAD, scope)  # pylint: disable=exec-used
    return scope["rate"]


def _theirs() -> float | None:
    peer = _harness.peer()
    if peer is None:
        return None
    code = ("import time\n" + _BEST_RATE +
            "from envlogger import EnvLogger\n"
            "from envlogger.backends.tfds_backend_writer import TFDSBackendWriter\n"
            "from envlogger.testing.catch_env import Catch\n" + _WORKLOAD + "\nemit('rate', rate)\n")
    return float(peer.run(code)["rate"])


def main() -> None:
    ours, theirs = _ours(), _theirs()
    _harness.report("recording", [{
        "workload": f"record Catch, {NUM_EPISODES} eps, ZLIB obs + step_fn (steps/s)",
        "ours": ours, "peer": theirs, "peer_name": "envlogger 1.2 TFDSBackendWriter", "unit": "env steps/s"}])


if __name__ == "__main__":
    main()
