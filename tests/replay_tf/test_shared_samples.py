"""TrajectoryDatasets of an in-process replay table read through a shared, queue-fed source
(`replay_tf/sampling/shared_samples.py`): the same samples and errors as the per-iterator source, at most one batch
in flight per open iterator, iterators that close and reopen, and the cases that keep the per-iterator
source."""
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import proc_testlib
import replay_tf as reverb
from replay_tf.sampling import shared_samples

def _feeders(address: str) -> int:
    """Feeder threads running for table "t" of the server at `address`."""
    return sum(t.name == f"replay_tf-shared-samples {address}/t" for t in threading.enumerate())


def _wait_until(condition, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _server(num_items: int, selector=None, max_times_sampled: int = 0, signature=True, port=None, first=0):
    spec = {"obs": tf.TensorSpec([2, 3], tf.float32), "step": tf.TensorSpec([2], tf.int64)}
    table = reverb.Table("t", selector or reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                         reverb.rate_limiters.MinSize(1), max_times_sampled=max_times_sampled,
                         signature=spec if signature else None)
    server = reverb.Server([table], port=port)
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for i in range(first, first + num_items + 1):
            writer.append({"obs": np.full([3], i, np.float32), "step": np.int64(i)})
            if i > first:
                writer.create_item("t", 1.0 + i, {k: v[-2:] for k, v in writer.history.items()})  # steps i-1, i
    return server, f"localhost:{server.port}"


def _empty_server(min_size: int):
    """A server whose table "t" holds nothing yet and samples once it holds `min_size` items."""
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                                         reverb.rate_limiters.MinSize(min_size))])
    return server, f"localhost:{server.port}"


def _dataset(address: str, max_in_flight: int = 3, **kwargs) -> reverb.TrajectoryDataset:
    return reverb.TrajectoryDataset(address, "t", {"obs": tf.float32, "step": tf.int64},
                                    {"obs": tf.TensorShape([2, 3]), "step": tf.TensorShape([2])},
                                    max_in_flight_samples_per_worker=max_in_flight, **kwargs)


def _tf_agents_shape(address: str, cycles: int = 8) -> tf.data.Dataset:
    """TF-Agents' `as_dataset(sample_batch_size=2 * cycles)`: `cycles` TrajectoryDatasets interleaved."""
    return tf.data.Dataset.range(cycles).interleave(lambda _: _dataset(address, 6), cycle_length=cycles,
                                                   num_parallel_calls=tf.data.AUTOTUNE).batch(2 * cycles)


def _check_samples(sample, num_items, priorities=None):
    """Every sample's data is its item's (item i holds steps i-1 and i) and its info is the table's."""
    steps = sample.data["step"].numpy().reshape(-1, 2)
    np.testing.assert_array_equal(steps[:, 1], steps[:, 0] + 1)
    np.testing.assert_array_equal(sample.data["obs"].numpy().reshape(-1, 2, 3),
                                  np.repeat(steps[:, :, None], 3, axis=2).astype(np.float32))
    if num_items is None:  # (a queue's size changes as it is sampled)
        return
    assert set(sample.info.table_size.numpy().ravel().tolist()) == {num_items}
    if priorities is None:
        np.testing.assert_allclose(sample.info.probability.numpy(), 1.0 / num_items)
    np.testing.assert_allclose(sample.info.priority.numpy().ravel(), 1.0 + steps[:, 1])


def test_interleaved_datasets_share_one_feeder_and_sample_what_the_table_holds():
    server, address = _server(50)
    try:
        iterator = iter(_tf_agents_shape(address))
        for _ in range(20):
            _check_samples(next(iterator), 50)
        assert _feeders(address) == 1
        del iterator
        assert _wait_until(lambda: _feeders(address) == 0)
    finally:
        server.stop()


def test_prioritized_samples_carry_their_items_priority_and_probability():
    server, address = _server(20, selector=reverb.selectors.Prioritized(1.0))
    try:
        iterator = iter(_dataset(address).take(64).batch(64))
        sample = next(iterator)
        _check_samples(sample, 20, priorities=True)
        total = sum(1.0 + i for i in range(1, 21))
        steps = sample.data["step"].numpy()[:, 1]
        np.testing.assert_allclose(sample.info.probability.numpy(), (1.0 + steps) / total, rtol=1e-6)
    finally:
        server.stop()


def _taken(server) -> int:
    return sum(item.times_sampled for item in server.table("t").items_snapshot())


def test_an_open_iterator_is_owed_at_most_one_batch():
    """Without prefetching, an iterator that took a batch is owed exactly one more; each round starts a new
    iterator (and feeder), so a dequeue's token reaching the feeder before the batch left the queue (a
    feeder that then waits for ever) shows in one round or another."""
    server, address = _server(100)
    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    try:
        for round_ in range(6):
            taken = _taken(server)
            iterator = iter(_dataset(address, max_in_flight=4).with_options(options))
            next(iterator)  # one batch of 4 dequeued, one more owed
            assert _wait_until(lambda: _taken(server) >= taken + 8), (round_, _taken(server) - taken)
            time.sleep(0.2)
            assert _taken(server) == taken + 8 and _feeders(address) == 1
            for _ in range(4):
                next(iterator)
            assert _wait_until(lambda: _taken(server) >= taken + 12), (round_, _taken(server) - taken)
            time.sleep(0.2)
            assert _taken(server) == taken + 12
            del iterator
            assert _wait_until(lambda: _feeders(address) == 0)
    finally:
        server.stop()


def _shared_of(address: str):
    """The `SharedSamples` built for table "t" at `address`."""
    (shared,) = [s for s in shared_samples._SHARED.values() if s.key[1] == address]
    return shared


def test_tokens_do_not_pile_up_while_readers_outpace_the_feeder():
    # Every dequeue puts a token; a feeder that only took the tokens it waited for left about one a batch
    # behind whenever it never had to wait, until the token queue filled and puts blocked.
    server, address = _server(50)
    try:
        iterator = iter(_tf_agents_shape(address))
        for _ in range(300):  # (4,800 samples: 800 dequeues of 6)
            next(iterator)
        shared = _shared_of(address)
        assert int(shared.tokens.size()) <= 3 * 8  # (at most the tokens of the dequeues since its last round)
        del iterator
        assert _wait_until(lambda: _feeders(address) == 0)
    finally:
        server.stop()


def test_nothing_is_sampled_for_iterators_gone_while_the_table_refused_samples():
    # The feeder asked for 8 iterators' batches while the table was below its minimum size; all 8 closed
    # and one opened before the table filled: that one is owed one batch, not eight.
    server, address = _empty_server(min_size=5)
    try:
        _dataset(address, 6)
        shared = _shared_of(address)
        with shared._cv:  # (the feeder starts its first round once all 8 are counted)
            for _ in range(8):
                assert shared.opened()
        time.sleep(0.35)  # (the feeder polls the table for 8 batches)
        for _ in range(8):
            shared.closed()
        assert shared.opened()
        with reverb.Client(address).trajectory_writer(num_keep_alive_refs=2) as writer:
            for i in range(8):
                writer.append({"obs": np.full([3], i, np.float32), "step": np.int64(i)})
                if i:
                    writer.create_item("t", 1.0, {k: v[-2:] for k, v in writer.history.items()})
        assert _wait_until(lambda: _taken(server) >= 6)
        time.sleep(0.3)
        assert _taken(server) == 6 and int(shared.queue.size()) == 1
        shared.closed()
        assert _wait_until(lambda: _feeders(address) == 0)
    finally:
        server.stop()


def test_a_feeder_that_fails_to_start_counts_no_iterator(monkeypatch):
    server, address = _server(10)
    try:
        _dataset(address)
        shared = _shared_of(address)
        def refuse(self):
            raise RuntimeError("can't start new thread")
        with monkeypatch.context() as patched:
            patched.setattr(threading.Thread, "start", refuse)
            with pytest.raises(RuntimeError, match="can't start new thread"):
                shared.opened()
        assert shared._open == 0 and shared._thread is None
        _check_samples(next(iter(_dataset(address))), 10)  # (the next iterator starts a feeder)
    finally:
        server.stop()


_FORK_WHILE_LOCKED = """
import os, threading
from replay_tf.sampling import shared_samples
held, release = threading.Event(), threading.Event()
def hold():
    with shared_samples._LOCK:
        held.set()
        release.wait()
threading.Thread(target=hold, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    os._exit(0 if shared_samples._LOCK.acquire(timeout=2) else 1)
release.set()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_thread_held_the_lock_can_take_it():
    env = dict(os.environ, PYTHONPATH=proc_testlib.ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", _FORK_WHILE_LOCKED], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stderr[-2000:]


def test_a_dataset_iterates_again_after_its_iterators_closed():
    server, address = _server(30)
    try:
        dataset = _dataset(address)
        for _ in range(3):
            samples = list(dataset.take(7).batch(7))
            _check_samples(samples[0], 30)
            assert _wait_until(lambda: _feeders(address) == 0)
    finally:
        server.stop()


def test_an_iterator_waits_for_the_first_item():
    server, address = _empty_server(min_size=1)
    got = {}
    try:
        iterator = iter(_dataset(address))
        thread = threading.Thread(target=lambda: got.update(sample=next(iterator)), daemon=True)
        thread.start()
        time.sleep(0.3)
        assert thread.is_alive() and not got
        with reverb.Client(address).trajectory_writer(num_keep_alive_refs=2) as writer:
            for i in range(2):
                writer.append({"obs": np.full([3], i, np.float32), "step": np.int64(i)})
            writer.create_item("t", 2.0, {k: v[-2:] for k, v in writer.history.items()})
        thread.join(5)
        assert got["sample"].data["step"].numpy().tolist() == [0, 1]
    finally:
        server.stop()


def _stopped_server_error(monkeypatch, shared: str):
    monkeypatch.setenv("REPLAY_TF_SHARED_SAMPLES", shared)
    server, address = _server(10)
    iterator = iter(_dataset(address))
    next(iterator)
    assert _feeders(address) == (shared == "1")
    server.stop()
    with pytest.raises(tf.errors.OpError) as raised:
        for _ in range(100):
            next(iterator)
    return type(raised.value), _python_error(raised.value)


def _python_error(error: tf.errors.OpError) -> str:
    """The Python exception a pipeline function raised, as the OpError's message gives it (the rest names
    the pipeline's nodes)."""
    return re.search(r"(\w+Error: [^\n]*)", str(error)).group(1)


def test_a_stopped_server_raises_what_the_per_iterator_source_raises(monkeypatch):
    error, message = _stopped_server_error(monkeypatch, "1")
    assert (error, message) == _stopped_server_error(monkeypatch, "0")


def _mismatch_error(monkeypatch, shared: str):
    monkeypatch.setenv("REPLAY_TF_SHARED_SAMPLES", shared)
    server, address = _server(10, signature=False)
    try:
        dataset = reverb.TrajectoryDataset(address, "t", {"obs": tf.float32, "step": tf.int64},
                                           {"obs": tf.TensorShape([2, 4]), "step": tf.TensorShape([2])},
                                           max_in_flight_samples_per_worker=3)
        with pytest.raises(tf.errors.OpError) as raised:
            next(iter(dataset))
        feeder_errors = [s.error for s in shared_samples._SHARED.values() if s.key[1] == address]
        assert any(e is not None for e in feeder_errors) == (shared == "1")  # (the feeder raised it)
        return type(raised.value), _python_error(raised.value)
    finally:
        server.stop()


def test_items_of_another_shape_raise_what_the_per_iterator_source_raises(monkeypatch):
    error, message = _mismatch_error(monkeypatch, "1")
    assert (error, message) == _mismatch_error(monkeypatch, "0")
    assert error is tf.errors.InvalidArgumentError and "expects dtype=float32 shape=(2, 4)" in message


@pytest.mark.parametrize("case", ["replay table", "queue table", "two workers", "timeout", "max_samples",
                                  "switched off"])
def test_which_datasets_share_a_feeder(case, monkeypatch):
    server, address = _server(10, max_times_sampled=1 if case == "queue table" else 0)
    kwargs = {"two workers": {"num_workers_per_iterator": 2}, "timeout": {"rate_limiter_timeout_ms": 1000},
              "max_samples": {"max_samples": 5}}.get(case, {})
    if case == "switched off":
        monkeypatch.setenv("REPLAY_TF_SHARED_SAMPLES", "0")
    try:
        iterator = iter(_dataset(address, **kwargs))
        sample = next(iterator)
        _check_samples(sample, 10 if case != "queue table" else None)
        assert _feeders(address) == (case == "replay table")
    finally:
        server.stop()


def test_a_server_started_again_on_the_port_is_sampled_through_the_per_iterator_source():
    server, address = _server(10)
    port = server.port
    dataset = _dataset(address)
    iterator = iter(dataset)
    next(iterator)
    assert _feeders(address) == 1
    del iterator
    server.stop()
    assert _wait_until(lambda: _feeders(address) == 0)
    server, address = _server(10, port=port, first=100)  # (steps 100-110)
    try:
        sample = next(iter(dataset.take(5).batch(5)))
        _check_samples(sample, 10)
        assert sample.data["step"].numpy().min() >= 100 and _feeders(address) == 0
    finally:
        server.stop()


def test_tf1_graphs_keep_the_per_iterator_source():
    server, address = _server(10)
    try:
        with tf.Graph().as_default():
            element = tf.compat.v1.data.make_one_shot_iterator(_dataset(address)).get_next()
            with tf.compat.v1.Session() as session:
                step = session.run(element.data["step"])
        assert step[1] == step[0] + 1
        assert _feeders(address) == 0
    finally:
        server.stop()


_EXIT_WITH_OPEN_ITERATORS = """
import sys
import numpy as np, tensorflow as tf
import replay_tf as reverb
from replay_tf.sampling import shared_samples
server = reverb.Server([reverb.Table('t', reverb.selectors.Uniform(), reverb.selectors.Fifo(), 1000,
                                     reverb.rate_limiters.MinSize(1))])
with reverb.Client(f'localhost:{server.port}').trajectory_writer(num_keep_alive_refs=1) as writer:
    for i in range(100):
        writer.append(np.full([4], i, np.float32))
        writer.create_item('t', 1.0, writer.history[-1:])
dataset = tf.data.Dataset.range(16).interleave(
    lambda _: reverb.TrajectoryDataset(f'localhost:{server.port}', 't', tf.float32, tf.TensorShape([1, 4]), 6),
    cycle_length=16, num_parallel_calls=tf.data.AUTOTUNE).batch(32)
iterator = iter(dataset)
for _ in range(20):
    next(iterator)
print('sampled', flush=True)
"""  # ... and exits with the iterator open and the feeder running


@pytest.mark.slow  # processes of their own
def test_a_process_exits_with_shared_iterators_still_open():
    env = dict(os.environ, PYTHONPATH=proc_testlib.ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    procs = [subprocess.Popen([sys.executable, "-c", _EXIT_WITH_OPEN_ITERATORS], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and out.strip() == "sampled", err[-2000:]
    finally:
        for proc in procs:
            proc.kill()


def test_iterators_outlive_the_python_objects_of_their_datasets():
    # Datasets traced inside an interleave function leave no Python object behind: the shared source (its
    # queue) must stay alive for the iterators that read it.
    import gc
    server, address = _server(20)
    try:
        iterator = iter(_tf_agents_shape(address, cycles=4))
        for _ in range(3):
            gc.collect()
            _check_samples(next(iterator), 20)
        dataset = _dataset(address)
        iterator = iter(dataset)
        del dataset
        gc.collect()
        for _ in range(10):
            next(iterator)
    finally:
        server.stop()
