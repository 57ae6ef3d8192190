"""Normal use logs no TensorFlow / TFDS warnings: loading a dataset and sampling the in-graph buffers.

TFDS logs its `.dtype` deprecation notice only the first 10 times per process, and TF's XLA notices
("Using tf.random.uniform with XLA compilation will ignore seeds", "Ignoring Assert operator ...", once
per compiled program) come from C++ on stderr, so each case
runs in a fresh interpreter with TF's C++ logging at its most verbose, and checks Python warnings, Python
and absl log records, and stderr.
"""
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # every case starts an interpreter that imports TensorFlow

_REPO = pathlib.Path(__file__).resolve().parents[1]

_NOTICES = ("is deprecated", "will ignore seeds", "Ignoring Assert")

_PRELUDE = r'''
import json, logging, os, sys, warnings
import numpy as np
import tensorflow as tf

records = []


class _Keep(logging.Handler):
    def emit(self, record):
        records.append(f"{record.name} {record.levelname}: {record.getMessage()}")


logging.getLogger().addHandler(_Keep(logging.WARNING))
logging.getLogger().setLevel(logging.WARNING)
caught = warnings.catch_warnings(record=True)
warned = caught.__enter__()
warnings.simplefilter("always")
'''

_EPILOGUE = r'''
caught.__exit__(None, None, None)
print(json.dumps({"records": records, "warnings": [f"{w.category.__name__}: {w.message}" for w in warned]}))
'''


def _run(body: str, tmp_path) -> tuple:
    code = _PRELUDE + textwrap.dedent(body) + _EPILOGUE
    env = {**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=_REPO, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["records"], result["warnings"], done.stderr


def _assert_quiet(records, warned, stderr):
    noisy = [line for line in records + warned + stderr.splitlines() if any(n in line for n in _NOTICES)]
    assert noisy == []
    assert warned == []
    assert records == []


@pytest.mark.parametrize("file_format", ["tfrecord", "array_record"])
def test_loading_logs_no_tfds_deprecation(tmp_path, file_format):
    records, warned, stderr = _run(f"""
        import tensorflow_datasets as tfds
        import rlds_tf as rlds

        config = tfds.rlds.rlds_base.DatasetConfig(
            name="quiet", observation_info=tfds.features.Tensor(shape=(2,), dtype=tf.float32),
            action_info=tf.int64, reward_info=tf.float32, discount_info=tf.float32,
            step_metadata_info={{"note": tf.int32}}, episode_metadata_info={{"episode_id": tf.int64}})
        writer = rlds.tfds.EpisodeWriter(sys.argv[1], config, max_episodes_per_file=2,
                                         file_format={file_format!r})
        for index, length in enumerate([3, 2, 4]):
            t = np.arange(length)
            writer.add_episode({{"steps": {{
                "observation": np.stack([t, -t], 1).astype(np.float32), "action": t + index,
                "reward": (t * 0.5).astype(np.float32), "discount": np.ones(length, np.float32),
                "is_first": t == 0, "is_last": t == length - 1, "is_terminal": t == length - 1,
                "note": t.astype(np.int32)}}, "episode_id": np.int64(index)}})
        writer.close()
        records.clear()  # the writer's own messages are not what this test is about
        lengths = [len(list(e["steps"])) for e in rlds.load(sys.argv[1], "train")]
        stacked = [int(e["steps"]["action"].shape[0]) for e in rlds.load_stacked(sys.argv[1], "train")]
        steps = sum(1 for _ in rlds.load_steps(sys.argv[1], "train"))
        assert lengths == stacked == [3, 2, 4] and steps == 9, (lengths, stacked, steps)
    """, tmp_path)
    _assert_quiet(records, warned, stderr)


@pytest.mark.parametrize("buffer", ["TFUniformReplayBuffer", "PrioritizedReplayBuffer"])
def test_buffer_sampling_logs_no_xla_seed_notice(tmp_path, buffer):
    records, warned, stderr = _run(f"""
        import replay_tf

        tf.random.set_seed(7)
        rb = replay_tf.{buffer}({{"x": tf.TensorSpec([], tf.float32)}}, batch_size=2, max_length=8)
        for i in range(5):
            rb.add_batch({{"x": tf.constant([float(i), -float(i)])}})
        # Each new batch size or window length is a new program for the eager path.
        ids = [rb.get_next(4)[1].ids.numpy(), rb.get_next(6)[1].ids.numpy(),
               rb.get_next(4, num_steps=2)[1].ids.numpy()]
        ids.append(tf.function(lambda: rb.get_next(3)[1].ids)().numpy())
        ids.append(next(iter(rb.as_dataset(3, num_steps=2)))[1].ids.numpy())
        assert all((i >= 0).all() and (i < 10).all() for i in ids), ids
    """, tmp_path)
    _assert_quiet(records, warned, stderr)


@pytest.mark.parametrize("buffer", ["TFUniformReplayBuffer", "PrioritizedReplayBuffer"])
def test_eager_sampling_checks_still_raise(tmp_path, buffer):
    # The eager path's program has no asserts; what it cannot sample must still raise the graph's errors.
    records, warned, stderr = _run(f"""
        import replay_tf

        rb = replay_tf.{buffer}({{"x": tf.TensorSpec([], tf.float32)}}, batch_size=2, max_length=8)
        failures = []
        for batch_size, num_steps in [(4, None), (5, None), (2, 3)]:
            if batch_size == 2:
                rb.add_batch({{"x": tf.constant([1.0, 2.0])}})  # one step: no window of 3 steps
            try:
                rb.get_next(batch_size, num_steps=num_steps)
            except tf.errors.InvalidArgumentError as e:
                failures.append("no valid window to sample" in e.message)
        if "{buffer}" == "PrioritizedReplayBuffer":
            rb.update_priorities(tf.constant([0, 1], tf.int64), tf.constant([0.0, 0.0]))
            try:
                rb.get_next(3)
            except tf.errors.InvalidArgumentError as e:
                failures.append("every valid window has priority 0" in e.message)
        assert failures == [True] * (4 if "{buffer}" == "PrioritizedReplayBuffer" else 3), failures
    """, tmp_path)
    assert [line for line in stderr.splitlines() if "Ignoring Assert" in line] == []
    assert warned == [] and records == []
