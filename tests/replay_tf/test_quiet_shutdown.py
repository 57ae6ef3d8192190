"""Stopping a server under open `TrajectoryDataset` iterators, and exiting with iterators open, print nothing.

TensorFlow logs from C++ on stderr (an exception raised in a `numpy_function` by tf.data's prefetching
thread, a generator finalized after the interpreter), so the scenario runs in a child interpreter with
TF's C++ logging at its most verbose; the child writes a marker to stderr between the stop and its exit.
"""
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb

_REPO = pathlib.Path(__file__).resolve().parents[2]
_MARK = "-- server stopped; exiting --"

_CHILD = r'''
import sys, time
import numpy as np
import tensorflow as tf
import replay_tf as reverb

uniform = reverb.Table("uniform", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                       reverb.rate_limiters.MinSize(1))  # (sampled through the shared feeder)
server = reverb.Server([uniform, reverb.Table.queue("queue", 100)])  # (the queue: per-iterator streams)
client = reverb.Client(server.address)
with client.trajectory_writer(1) as writer:
    for i in range(3):
        writer.append({"x": np.float32(i)})
        writer.create_item("uniform", 1.0, {"x": writer.history["x"][-1]})
        writer.create_item("queue", 1.0, {"x": writer.history["x"][-1]})


def dataset(table):
    return reverb.TrajectoryDataset(server.address, table, dtypes={"x": tf.float32},
                                    shapes={"x": tf.TensorShape([])}, max_in_flight_samples_per_worker=2)


never_read = [iter(dataset("uniform")), iter(dataset("queue").prefetch(2))]
# Read once, so that prefetching runs: the queue's prefetching threads then wait for samples that never
# come while the server stops; nobody asks for those elements.
read = [iter(dataset("uniform").batch(2).prefetch(2)), iter(dataset("queue").prefetch(4)),
        iter(tf.data.Dataset.range(2).interleave(lambda _: dataset("uniform"), cycle_length=2,
                                                  num_parallel_calls=2).batch(4).prefetch(2))]
for iterator in read:
    next(iterator)
time.sleep(0.5)
server.stop()
time.sleep(1.0)
sys.stderr.write("''' + _MARK + r'''\n")
sys.stderr.flush()
'''


@pytest.fixture(name="child_stderr", scope="module")
def child_stderr_fixture():
    env = {**os.environ, "PYTHONPATH": str(_REPO), "TF_CPP_MIN_LOG_LEVEL": "0", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", _CHILD], cwd=_REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert _MARK in done.stderr, done.stderr[-4000:]
    return done.stderr.split(_MARK)


def _noise(text: str) -> list:
    """TensorFlow's warnings and errors (W/E lines) and Python tracebacks, but not the absl preamble."""
    return [line for line in text.splitlines()
            if re.match(r"[WE]\d{4} ", line) and "cuInit" not in line or "Traceback" in line
            or "CancelledError" in line]


@pytest.mark.slow
def test_stopping_the_server_under_open_iterators_prints_nothing(child_stderr):
    assert _noise(child_stderr[0]) == []


@pytest.mark.slow
def test_exiting_with_open_iterators_prints_nothing(child_stderr):
    after = child_stderr[1]
    assert "Error occurred when finalizing GeneratorDataset iterator" not in after
    assert _noise(after) == []


@pytest.mark.parametrize("table", ["uniform", "queue"])
def test_reading_after_the_stop_still_raises_the_closed_table(table):
    server = reverb.Server([reverb.Table("uniform", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                                         reverb.rate_limiters.MinSize(1)), reverb.Table.queue("queue", 10)])
    try:
        with reverb.Client(server.address).trajectory_writer(1) as writer:
            writer.append(np.float32(1.0))
            writer.create_item(table, 1.0, writer.history[-1])
        dataset = reverb.TrajectoryDataset(server.address, table, dtypes=tf.float32, shapes=tf.TensorShape([]),
                                           max_in_flight_samples_per_worker=1)
        iterator = iter(dataset)
        assert float(next(iterator).data) == 1.0
    finally:
        server.stop()
    # (raised by a failed assert, which escapes the quotes)
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(
            f"CancelledError: Table \\'{table}\\' has been closed (its server was stopped).")):
        for _ in range(100):  # (the uniform table's batches sampled before the stop come first)
            next(iterator)
