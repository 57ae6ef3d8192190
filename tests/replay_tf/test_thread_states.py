"""`thread_states.keep`: tf.data threads that call Python keep their Python thread state between calls."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from replay_tf.sampling import batch_source
from replay_tf.sampling import thread_states


def _counts_on_tf_data_threads(call, calls=6):
    """Runs `call()` in `calls` numpy_function calls on a tf.data thread (the prefetch thread); for each
    call, (native thread id, calls that thread's thread-local data had seen before): thread-local data lives
    in the thread state, so it counts on only where the state outlives the calls."""
    local = threading.local()
    seen = []

    def fn(x):
        call()
        count = getattr(local, "count", 0)
        local.count = count + 1
        seen.append((threading.get_native_id(), count))
        return x

    dataset = tf.data.Dataset.range(calls).map(lambda i: tf.numpy_function(fn, [i], tf.int64, stateful=True))
    assert list(dataset.prefetch(1).as_numpy_iterator()) == list(range(calls))
    assert threading.main_thread().native_id not in {thread for thread, _ in seen}  # (tf.data's threads)
    return seen


def _per_thread(seen):
    counts = {}
    for thread, count in seen:
        counts.setdefault(thread, []).append(count)
    return list(counts.values())


def test_a_kept_state_outlives_each_call():
    seen = _counts_on_tf_data_threads(thread_states.keep)
    assert [counts == list(range(len(counts))) for counts in _per_thread(seen)] == [True] * len(_per_thread(seen))
    assert sum(len(counts) for counts in _per_thread(seen)) == 6


@pytest.mark.parametrize("setting", ["disabled", "at the limit"])
def test_without_keeping_every_call_gets_a_new_state(monkeypatch, setting):
    if setting == "disabled":
        monkeypatch.setattr(thread_states, "_enabled", False)
    else:
        monkeypatch.setattr(thread_states, "MAX_KEPT", thread_states.kept_count())
    results = []
    seen = _counts_on_tf_data_threads(lambda: results.append(thread_states.keep()))
    assert results == [False] * 6
    assert [count for _, count in seen] == [0] * 6  # (CPython: the thread's state is new at every call)


@pytest.mark.parametrize("value, kept", [("0", False), ("1", True), (None, True)])
def test_environment_switch(value, kept):
    env = {k: v for k, v in os.environ.items() if k != thread_states.ENV}
    if value is not None:
        env[thread_states.ENV] = value
    code = ("from replay_tf.sampling import thread_states as t\n"
            "print(t.keep(), t.keep(), t.kept_count())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout.split()
    assert out == [str(kept), str(kept), "0"]  # (the main thread's state lasts anyway: nothing is kept)


def test_python_threads_take_no_kept_state():
    before = thread_states.kept_count()
    results = []
    thread = threading.Thread(target=lambda: results.extend([thread_states.keep(), thread_states.keep()]))
    thread.start()
    thread.join()
    assert results == [True, True]
    assert thread_states.keep() is True
    assert thread_states.kept_count() == before


def test_batch_sources_keep_the_state_of_the_threads_that_call_them():
    local = threading.local()
    seen = []

    def make(unused_arg):
        for i in range(5):
            count = getattr(local, "count", 0)
            local.count = count + 1
            seen.append((threading.get_native_id(), count))
            yield [np.full([1], i, np.int64)]

    dataset = batch_source.batches(make, (b"x",), tf.TensorSpec([None], tf.int64)).prefetch(1)
    assert [x.tolist() for x in dataset.as_numpy_iterator()] == [[i] for i in range(5)]
    on_tf_data_threads = _per_thread([(t, c) for t, c in seen if t != threading.main_thread().native_id])
    assert sum(map(len, on_tf_data_threads)) >= 4  # (the first element may be asked for on another thread)
    assert all(counts == list(range(counts[0], counts[0] + len(counts))) for counts in on_tf_data_threads)
    assert any(len(counts) > 1 and counts[-1] > 0 for counts in on_tf_data_threads)
