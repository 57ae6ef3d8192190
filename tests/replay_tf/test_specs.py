"""replay_tf.specs: flattening with paths, validation errors that name path, expected and got."""
import collections
import doctest

import numpy as np
import pytest
import tensorflow as tf

from replay_tf import specs

Step = collections.namedtuple("Step", ["observation", "action"])

SPEC = (tf.TensorSpec([3], tf.float32, "action"),
        {"lidar": tf.TensorSpec([5], tf.float32), "camera": tf.TensorSpec([3, 2], tf.uint8)})
NAMED = Step(observation=tf.TensorSpec([2], tf.float32), action=tf.TensorSpec([], tf.int32))


def _good(batch=4):
    return (np.zeros([batch, 3], np.float32),
            {"lidar": np.zeros([batch, 5], np.float32), "camera": np.zeros([batch, 3, 2], np.uint8)})


def test_doctests():
    failures, _ = doctest.testmod(specs, raise_on_error=False, verbose=False)
    assert failures == 0


def test_flatten_with_paths_matches_tf_nest_order():
    paths = [p for p, _ in specs.flatten_with_paths(SPEC, "items")]
    assert paths == ["items[0]", "items[1]['camera']", "items[1]['lidar']"]
    assert [l for _, l in specs.flatten_with_paths(SPEC)] == tf.nest.flatten(SPEC)
    assert [p for p, _ in specs.flatten_with_paths(NAMED, "x")] == ["x.observation", "x.action"]


@pytest.mark.parametrize("values, outer, error, pattern", [
    ((np.zeros([4, 3], np.float32),), [4], TypeError,
     r"structure mismatch at items: expected a tuple of length 2, got a tuple of length 1"),
    ((np.zeros([4, 3], np.float32), {"lidar": np.zeros([4, 5], np.float32)}), [4], TypeError,
     r"items\[1\]: expected keys \['camera', 'lidar'\].*missing \['camera'\]"),
    ((np.zeros([4, 3], np.float32), np.zeros([4, 5], np.float32)), [4], TypeError,
     r"items\[1\]: expected a mapping with keys \['camera', 'lidar'\], got a leaf"),
    ((np.zeros([4, 3], np.float64),) + _good()[1:], [4], TypeError,
     r"items\[0\]: expected dtype float32, got float64"),
    ((np.zeros([4, 3], np.float32), {"lidar": np.zeros([4, 5], np.float32),
                                     "camera": np.zeros([4, 3, 2], np.int32)}), [4], TypeError,
     r"items\[1\]\['camera'\]: expected dtype uint8, got int32"),
    (_good(5), [4], ValueError,
     r"items\[0\]: expected shape \[4, 3\] .*got \[5, 3\] \(outer dimension 0 is 5, expected 4\)"),
    ((np.zeros([4, 3], np.float32), {"lidar": np.zeros([4, 6], np.float32),
                                     "camera": np.zeros([4, 3, 2], np.uint8)}), [4], ValueError,
     r"items\[1\]\['lidar'\]: expected shape \[4, 5\] \(outer dims \[4\] \+ spec shape \[5\]\), got \[4, 6\]"),
    ((np.zeros([3], np.float32),) + _good()[1:], [4], ValueError,
     r"items\[0\]: expected shape .*got \[3\] \(rank 1, expected rank 2\)"),
    ((np.zeros([4, 3], np.float32), {"lidar": np.zeros([2, 5], np.float32),
                                     "camera": np.zeros([4, 3, 2], np.uint8)}), [None], ValueError,
     r"items\[1\]\['lidar'\]: outer dimension 0 is 2, but items\[1\]\['camera'\] has 4"),
])
def test_validate_errors(values, outer, error, pattern):
    with pytest.raises(error, match=pattern):
        specs.validate(values, SPEC, outer_dims=outer)


def test_validate_namedtuple_path_and_success():
    with pytest.raises(TypeError, match=r"items\.action: expected dtype int32, got int64"):
        specs.validate(Step(np.zeros([2, 2], np.float32), np.zeros([2], np.int64)), NAMED, outer_dims=[2])
    flat = specs.validate(Step(np.array([[1.0, 2.0]], np.float32), np.array([7], np.int32)), NAMED, outer_dims=[1])
    assert [t.dtype for t in flat] == [tf.float32, tf.int32]
    np.testing.assert_array_equal(flat[1].numpy(), [7])


def test_validate_list_accepted_for_tuple_and_traces_with_unknown_dims():
    flat = specs.validate(list(_good()), SPEC, outer_dims=[4])
    assert [t.shape.as_list() for t in flat] == [[4, 3], [4, 3, 2], [4, 5]]

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def f(x):
        flat = specs.validate(Step(x, tf.zeros([tf.shape(x)[0]], tf.int32)), 
                              Step(tf.TensorSpec([3], tf.float32), tf.TensorSpec([], tf.int32)), outer_dims=[4])
        return flat[0]
    assert f(tf.zeros([4, 3])).shape == (4, 3)


def test_helpers():
    assert specs.nbytes(SPEC) == 3 * 4 + 5 * 4 + 6
    assert specs.add_outer_dims(NAMED, [7]).observation.shape.as_list() == [7, 2]
    assert specs.describe(NAMED, "s") == "s.observation: float32[2]\ns.action: int32[]"
    with pytest.raises(ValueError, match=r"spec\[0\]: shape \[None\] must be fully defined"):
        specs.nbytes((tf.TensorSpec([None], tf.float32),))
    assert specs.pack_sequence_as(NAMED, [1, 2]) == Step(1, 2)
