"""`load_stacked`/`load_steps` decode plain and BYTES-encoded fields with TensorFlow ops alone.

Only ZLIB fields are inflated in Python (`tf.numpy_function`, bounded by the declared size); a Python call
in the pipeline of the other encodings would hold the GIL per episode and stop the pipeline from being
serialized.
"""
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import rlds_tf as rlds
from rlds_tf.tfds import EpisodeWriter

_PY_FUNC_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}


def _write(directory, encoding):
    config = tfds.rlds.rlds_base.DatasetConfig(
        name="toy", observation_info=tfds.features.Tensor(shape=(3, 2), dtype=tf.float32, encoding=encoding),
        action_info=tf.int64, reward_info=tf.float64, discount_info=tf.float64)
    t = np.arange(5)
    observation = np.arange(30, dtype=np.float32).reshape(5, 3, 2)
    with EpisodeWriter(directory, config) as writer:
        writer.add_episode({"steps": {"observation": observation, "action": t, "reward": t * 0.5,
                                      "discount": np.ones(5), "is_first": t == 0, "is_last": t == 4,
                                      "is_terminal": t == 4}})
    return observation


def _ops(dataset):
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())  # pylint: disable=protected-access
    return {n.op for n in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


@pytest.mark.parametrize("encoding, python_ops", [
    (tfds.features.Encoding.NONE, set()),
    (tfds.features.Encoding.BYTES, set()),
    (tfds.features.Encoding.ZLIB, {"PyFuncStateless"}),
])
def test_only_zlib_fields_leave_the_graph(tmp_path, encoding, python_ops):
    observation = _write(str(tmp_path), encoding)
    stacked = rlds.load_stacked(str(tmp_path), "train")
    steps = rlds.load_steps(str(tmp_path), "train", batch_size=5)
    for dataset in (stacked, steps):
        assert _ops(dataset) & _PY_FUNC_OPS == python_ops
    [episode] = list(stacked)
    np.testing.assert_array_equal(episode["steps"]["observation"].numpy(), observation)
    [batch] = list(steps)
    np.testing.assert_array_equal(batch["observation"].numpy(), observation)
