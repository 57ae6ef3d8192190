"""TF-Agents' `ReplayBuffer` base class: the same custom buffer (a subclass implementing the `_` methods)
runs on TF-Agents 0.19 (peer venv) and on replay_tf, with the same results."""
import pytest
import tensorflow as tf

import buffer_testlib
import replay_tf

# A list-backed buffer as a user would write it; `Base` is TF-Agents' ReplayBuffer or ours.
_SCENARIO = """
import numpy as np, tensorflow as tf

class ListBuffer(Base):
    def __init__(self, data_spec, capacity):
        super().__init__(data_spec, capacity, stateful_dataset=True)
        self._items = []
    def _num_frames(self):
        return len(self._items)
    def _add_batch(self, items):
        self._items.extend(tf.nest.flatten(items)[0].numpy().tolist())
        del self._items[:-self._capacity]
    def _get_next(self, sample_batch_size, num_steps, time_stacked):
        return self._items[-1] if sample_batch_size is None else self._items[-sample_batch_size:]
    def _as_dataset(self, sample_batch_size, num_steps, sequence_preprocess_fn, num_parallel_calls):
        return tf.data.Dataset.from_tensor_slices(self._items).repeat().batch(sample_batch_size or 1)
    def _single_deterministic_pass_dataset(self, sample_batch_size, num_steps, sequence_preprocess_fn,
                                           num_parallel_calls):
        return tf.data.Dataset.from_tensor_slices(self._items)
    def _gather_all(self):
        return list(self._items)
    def _clear(self):
        self._items = []

spec = tf.TensorSpec([], tf.int64)
buffer = ListBuffer(spec, capacity=4)
emit("properties", [buffer.capacity, buffer.stateful_dataset, str(buffer.data_spec)])
for start in (0, 3):
    buffer.add_batch(tf.constant([start, start + 1, start + 2], tf.int64))
emit("num_frames", buffer.num_frames())
emit("gather_all", buffer.gather_all())
emit("get_next", [buffer.get_next(), buffer.get_next(sample_batch_size=2)])
emit("dataset", [b.numpy().tolist() for b in buffer.as_dataset(sample_batch_size=3).take(2)])
emit("single_pass", [int(x) for x in buffer.as_dataset(single_deterministic_pass=True)])
buffer.clear()
emit("cleared", buffer.num_frames())
try:
    ListBuffer([spec, spec], capacity=2).as_dataset()
except ValueError as e:
    emit("list_spec", str(e).split(".")[0])
"""


def _run_local() -> dict:
    return buffer_testlib.run_scenario(_SCENARIO, Base=replay_tf.ReplayBuffer)


test_a_custom_buffer_runs_as_on_tf_agents = buffer_testlib.matches_tf_agents_test(
    "from tf_agents.replay_buffers.replay_buffer import ReplayBuffer as Base\n" + _SCENARIO, _run_local)


def test_local_values():
    # (compared with TF-Agents above; hand-checked values keep it meaningful without the peer)
    out = _run_local()
    assert out["gather_all"] == [2, 3, 4, 5] and out["num_frames"] == 4 and out["cleared"] == 0
    assert out["get_next"] == [5, [4, 5]] and out["single_pass"] == [2, 3, 4, 5]
    assert out["dataset"] == [[2, 3, 4], [5, 2, 3]]
    assert out["list_spec"] == "Cannot perform gather; data spec contains lists and this conflicts with gathering operator"


def test_unimplemented_methods_say_which():
    buffer = replay_tf.ReplayBuffer(tf.TensorSpec([], tf.int64), 3)
    with pytest.raises(NotImplementedError, match="ReplayBuffer does not implement _add_batch"):
        buffer.add_batch(tf.constant([1], tf.int64))


@pytest.mark.parametrize("buffer_class", [replay_tf.TFUniformReplayBuffer, replay_tf.PrioritizedReplayBuffer])
def test_in_graph_buffers_are_replay_buffers(buffer_class):
    # TF-Agents' TFUniformReplayBuffer is a ReplayBuffer; ours implement the public methods themselves.
    rb = buffer_class(tf.TensorSpec([], tf.int64), batch_size=2, max_length=3, stateful_dataset=True)
    assert isinstance(rb, replay_tf.ReplayBuffer)
    rb.add_batch(tf.constant([1, 2], tf.int64))
    assert int(rb.num_frames()) == 2 and int(rb.capacity) == 6 and rb.stateful_dataset
    assert rb.gather_all().numpy().tolist() == [[1], [2]]
