"""The recorder writes the same bytes for the same episodes in any process (what lets Beam workers, the
recorder and `rlds-tf convert` produce identical files)."""
import os
import subprocess
import sys

import pytest

from proc_testlib import ROOT

_RECORD = """
import sys
import numpy as np, tensorflow as tf, tensorflow_datasets as tfds
from rlds_tf.recording import tfds_writer
fast = sys.argv[2] == 'fast'
config = tfds.rlds.rlds_base.DatasetConfig(
    name='toy', observation_info=tf.float32 if fast else tfds.features.Text(), action_info=tf.int64,
    reward_info=tf.float64, discount_info=tf.float64, episode_metadata_info={'episode_id': tf.int64})
writer = tfds_writer.DatasetWriter(sys.argv[1], config)
steps = [dict(observation=1.5 if fast else 'go', action=i, reward=0.5, discount=1.0, is_first=i == 0,
              is_last=i == 2, is_terminal=False) for i in range(3)]
writer.add_episode({'steps': steps, 'episode_id': 4})
writer.close()
"""


@pytest.mark.parametrize("encoder", ["fast", "tfds"])
def test_two_processes_write_identical_records(tmp_path, encoder):
    shards = []
    for k in range(2):
        # Distinct hash seeds: map entry order must not follow the process's string hashing.
        directory = tmp_path / f"run{k}"
        subprocess.run([sys.executable, "-c", _RECORD, str(directory), encoder], cwd=ROOT, check=True,
                       env={**os.environ, "PYTHONHASHSEED": str(k + 1), "PYTHONPATH": str(ROOT),
                            "TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=120)
        shards.append((directory / "toy-train.tfrecord-00000").read_bytes())
    assert shards[0] == shards[1]
