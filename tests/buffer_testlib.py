"""Test helpers shared by the buffer tests: a writer in the background, and scenarios run here and by TF-Agents."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator

import pytest
import tensorflow as tf


@contextlib.contextmanager
def adding_in_background(buffer, items_for_step: Callable[[tf.Tensor], Any], last_step: int) -> Iterator[tf.Variable]:
    """While the block runs, a thread adds `items_for_step(step)` for steps `last_step + 1, ...` to `buffer`,
    20 adds per traced call (so it laps readers of a small ring). Yields the step counter (the last step
    added); the thread is stopped and joined when the block ends."""
    counter = tf.Variable(last_step, dtype=tf.int64)
    stop = threading.Event()

    @tf.function(autograph=False)
    def add_some():
        for _ in range(20):  # unrolled while tracing: 20 adds per call without AutoGraph
            buffer.add_batch(items_for_step(counter.assign_add(1)))

    def writer():
        while not stop.is_set():
            add_some()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        yield counter
    finally:
        stop.set()
        thread.join()


def run_scenario(scenario: str, **names: Any) -> dict:
    """Runs `scenario` (source the peer venv runs too) here with `names` bound and `emit(key, value)`
    recording into the dict returned."""
    out: dict = {}
    exec(scenario, {**names, "emit": out.__setitem__})  # noqa: S102  (our own test source)
    return out


def matches_tf_agents_test(peer_code: str, run_local: Callable[[], dict]):
    """The test that `run_local()` emits what `peer_code` emits with TF-Agents 0.19 (peer venv).

    Use at a test module's top level, under the test's name:
      test_matches_tf_agents = buffer_testlib.matches_tf_agents_test(_PEER, _run_local)
    """
    @pytest.mark.peer
    def test(peer):
        assert run_local() == peer.run(peer_code)

    return test
