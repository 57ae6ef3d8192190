"""A restart restores the checkpoint written last: periodic checkpoints follow their own interval, and the
restore orders checkpoints by the sequence number they record, not by their folder names."""
import json
import logging
import os
import shutil
import signal
import time

import numpy as np
import pytest

import proc_testlib
import replay_tf as reverb
from replay_tf import checkpointing


def _table(name="t"):
    return reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                        reverb.rate_limiters.MinSize(1))


# --- periodic checkpoints ---

@pytest.mark.slow  # two server processes
def test_periodic_checkpoints_do_not_wait_for_the_stats_interval(tmp_path):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "t", "sampler": "uniform", "remover": "fifo",
                                              "max_size": 100, "rate_limiter": {"min_size": 1}}]}))
    port = proc_testlib.free_port()
    args = ["--config", str(config), "--port", str(port), "--checkpoint-dir", str(tmp_path / "checkpoints"),
            "--checkpoint-interval", "1", "--stats-interval", "3600"]
    server = proc_testlib.ServeProcess(*args)
    try:
        server.wait_for(r"^replay-tf: serving tables")
        client = reverb.Client(f"localhost:{port}")
        for value in range(3):
            client.insert([np.float32(value)], priorities={"t": 1.0})
        time.sleep(3)  # a few checkpoint intervals, far less than one stats interval
        server.wait_for(r"^checkpoint: ", timeout_s=10)
        server.proc.send_signal(signal.SIGKILL)  # no exit checkpoint: only the periodic ones count
        server.proc.wait(30)
    finally:
        server.kill()

    restarted = proc_testlib.ServeProcess(*args)
    try:
        serving = restarted.wait_for(r"^replay-tf: serving tables.*")
        assert "'t': 3" in serving.group(0), serving.group(0)
        values = sorted(float(np.asarray(s.data[0]).item()) for s in
                        reverb.Client(f"localhost:{port}").sample("t", num_samples=30, emit_timesteps=False))
        assert set(values) == {0.0, 1.0, 2.0}
        assert restarted.stop(signal.SIGTERM) == 0
    finally:
        restarted.kill()
