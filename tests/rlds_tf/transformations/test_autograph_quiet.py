"""rlds_tf's transformations convert under AutoGraph without "could not transform" warnings.

tf.data converts every function given to `map` with AutoGraph; a function AutoGraph cannot parse (e.g. two
lambdas on one source line) runs unconverted and logs a warning on each call, which every caller of the
transformation sees (TF-Agents' `rlds_to_reverb` calls `concatenate`).
"""
import logging

import pytest
import tensorflow as tf

from rlds_tf import transformations


@pytest.fixture
def tf_log():
    records = []

    class Collect(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Collect()
    tf.get_logger().addHandler(handler)
    yield records
    tf.get_logger().removeHandler(handler)


def test_concatenate_converts_without_autograph_warnings(tf_log):
    a = tf.data.Dataset.from_tensors({"x": 1})
    b = tf.data.Dataset.from_tensors({"y": 2.0})
    got = [{k: v.numpy().item() for k, v in s.items()} for s in transformations.concatenate(a, b)]
    assert got == [{"x": 1, "y": 0.0}, {"x": 0, "y": 2.0}]
    assert not [m for m in tf_log if "AutoGraph could not transform" in m], tf_log


def test_truncate_after_condition_converts_without_autograph_warnings(tf_log):
    steps = tf.data.Dataset.range(10)
    got = [int(x) for x in transformations.truncate_after_condition(steps, lambda x: x == 3)]
    assert got == [0, 1, 2, 3]
    assert not [m for m in tf_log if "AutoGraph could not transform" in m], tf_log
