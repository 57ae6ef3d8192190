"""Errors that code written for TF-Agents 0.19's `TFUniformReplayBuffer` matches on: the same exception type,
raised at the same moment (building the dataset, or running the op: eagerly, in a tf.function, in
tf.data), with TF-Agents' text in the message. Expectations come from the peer venv."""
import pytest
import tensorflow as tf

import buffer_testlib
import replay_tf

# Each case builds `rb` (a buffer of int32 scalars, batch_size=2, max_length=3, `drop`: dataset_drop_remainder)
# and runs `act(rb)`; the scenario records (exception type name, message) or "ok".
_CASES = {
    "get_next_empty": (False, "rb.get_next()"),
    "get_next_batch_empty": (False, "rb.get_next(sample_batch_size=4)"),
    "get_next_empty_tf_function": (False, "tf.function(lambda: rb.get_next(sample_batch_size=4)[0])()"),
    "get_next_too_few_steps": (False, "fill(rb, 2) and rb.get_next(sample_batch_size=2, num_steps=3)"),
    "dataset_empty": (False, "next(iter(rb.as_dataset(sample_batch_size=2)))"),
    "deterministic_empty": (False, "next(iter(rb.as_dataset(single_deterministic_pass=True)))"),
    "drop_batch_too_big": (True, "rb.as_dataset(single_deterministic_pass=True, sample_batch_size=3)"),
    "drop_steps_too_many": (True, "rb.as_dataset(single_deterministic_pass=True, num_steps=4)"),
    "drop_fits": (True, "rb.as_dataset(single_deterministic_pass=True, sample_batch_size=2, num_steps=3)"),
}

_SCENARIO = """
import tensorflow as tf
def fill(rb, n):
    for i in range(n):
        rb.add_batch(tf.constant([i, 10 + i], tf.int32))
    return True
for name, (drop, act) in CASES.items():
    rb = make_buffer(drop)
    try:
        eval(act)
        emit(name, "ok")
    except Exception as e:
        emit(name, [type(e).__name__, str(e)])
"""

_PEER = """
from tf_agents.replay_buffers import tf_uniform_replay_buffer
import tensorflow as tf
CASES = INPUTS["cases"]
def make_buffer(drop):
    return tf_uniform_replay_buffer.TFUniformReplayBuffer(tf.TensorSpec([], tf.int32), batch_size=2, max_length=3,
                                                          dataset_drop_remainder=drop)
""" + _SCENARIO


def _run_local() -> dict:
    def make_buffer(drop):
        return replay_tf.TFUniformReplayBuffer(tf.TensorSpec([], tf.int32), batch_size=2, max_length=3,
                                               dataset_drop_remainder=drop)
    return buffer_testlib.run_scenario(_SCENARIO, make_buffer=make_buffer, CASES=_CASES)


# The phrases TF-Agents' own tests and its users match on, per case.
_PHRASES = {
    "get_next_empty": "TFUniformReplayBuffer is empty. Make sure to add items before sampling the buffer.",
    "get_next_batch_empty": "TFUniformReplayBuffer is empty. Make sure to add items before sampling the buffer.",
    "get_next_empty_tf_function": "TFUniformReplayBuffer is empty. Make sure to add items before sampling the "
                                  "buffer.",
    "get_next_too_few_steps": "TFUniformReplayBuffer is empty. Make sure to add items before sampling the buffer.",
    "dataset_empty": "TFUniformReplayBuffer is empty. Make sure to add items before sampling the buffer.",
    "deterministic_empty": "TFUniformReplayBuffer is empty. Make sure to add items before asking the buffer for "
                           "data.",
    "drop_batch_too_big": "ALL data will be dropped",
    "drop_steps_too_many": "ALL data will be dropped",
}


def test_messages_hold_tf_agents_phrases():
    out = _run_local()
    for name, phrase in _PHRASES.items():
        kind, message = out[name]
        assert phrase in message, (name, message)
        expected_kind = "ValueError" if name.startswith("drop_") else "InvalidArgumentError"
        assert kind == expected_kind, (name, kind)
    assert out["drop_fits"] == "ok"
    assert "sample_batch_size (3) > self.batch_size (2)" in out["drop_batch_too_big"][1]
    assert "num_steps_size (4) > self.max_length (3)" in out["drop_steps_too_many"][1]


@pytest.mark.peer
def test_same_errors_as_tf_agents(peer):
    expected = peer.run(_PEER, {"cases": _CASES})
    out = _run_local()
    assert out.keys() == expected.keys()
    for name, result in expected.items():
        if result == "ok":
            assert out[name] == "ok", name
            continue
        kind, message = result
        assert out[name][0] == kind, (name, out[name], result)
        phrase = _PHRASES[name]
        assert phrase in message, (name, message)   # (the phrase is TF-Agents' own)
        assert phrase in out[name][1], (name, out[name][1])
