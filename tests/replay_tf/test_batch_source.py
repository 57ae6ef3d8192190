"""`_batch_source.batches`: a generator's flat elements as a dataset, one numpy_function call each."""
import gc

import numpy as np
import pytest
import tensorflow as tf

from replay_tf import _batch_source

SPEC = {"a": tf.TensorSpec([None], tf.int64), "b": tf.TensorSpec([None, 2], tf.float32)}


def _dataset(make):
    return _batch_source.batches(make, (b"x",), SPEC)


def test_yields_each_element_then_ends():
    def make(arg):
        assert arg == b"x"
        for n in (1, 3):
            yield [np.arange(n, dtype=np.int64), np.full([n, 2], n, np.float32)]  # ("a", "b" as tree sorts)

    elements = list(_dataset(make))
    assert [e["a"].numpy().tolist() for e in elements] == [[0], [0, 1, 2]]
    assert [e["b"].numpy().tolist() for e in elements] == [[[1.0, 1.0]], [[3.0, 3.0]] * 3]
    assert _dataset(make).element_spec == SPEC


def test_each_iterator_runs_its_own_generator_and_closes_it():
    closed = []

    def make(unused_arg):
        try:
            while True:
                yield [np.zeros([1], np.int64), np.zeros([1, 2], np.float32)]
        finally:
            closed.append(True)

    dataset = _dataset(make)
    first, second = iter(dataset), iter(dataset)
    next(first), next(second)
    del first
    gc.collect()
    assert closed == [True]
    next(second)
    del second
    gc.collect()
    assert closed == [True, True]


def test_generator_errors_reach_the_iterator_as_numpy_function_maps_them():
    def make(unused_arg):
        yield [np.zeros([1], np.int64), np.zeros([1, 2], np.float32)]
        raise ValueError("bad column")

    iterator = iter(_dataset(make))
    next(iterator)
    with pytest.raises(tf.errors.InvalidArgumentError, match="bad column"):
        next(iterator)


def test_works_inside_interleave():
    def make(unused_arg):
        for i in range(3):
            yield [np.array([i], np.int64), np.zeros([1, 2], np.float32)]

    dataset = tf.data.Dataset.range(4).interleave(lambda _: _dataset(make), cycle_length=4, num_parallel_calls=4)
    assert sorted(int(e["a"][0]) for e in dataset) == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]
