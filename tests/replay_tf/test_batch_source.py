"""`batch_source.batches`: a generator's flat elements as a dataset, one numpy_function call each."""
import collections
import gc
import re

import numpy as np
import pytest
import tensorflow as tf

from dataset_testlib import dataset_graph
from dataset_testlib import graph_nodes
from replay_tf.sampling import batch_source

SPEC = {"a": tf.TensorSpec([None], tf.int64), "b": tf.TensorSpec([None, 2], tf.float32)}


def _dataset(make):
    return batch_source.batches(make, (b"x",), SPEC)


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


@pytest.mark.parametrize("generator_dataset", ["tensorflow's", "none: from_generator"])
def test_iterator_keys_open_and_close_one_generator_per_iterator(monkeypatch, generator_dataset):
    # Where TensorFlow lacks the generator dataset with its own finalizer, the public `from_generator` gives
    # the same keys and closes each generator with its iterator.
    if generator_dataset != "tensorflow's":
        monkeypatch.setattr(batch_source, "_GeneratorDataset", None)
    opened, closed = [], []

    def start(arg):
        opened.append(arg)
        try:
            yield from (7, 8)
        finally:
            closed.append(arg)

    keys = batch_source.iterator_keys(start, (b"k",))
    assert keys.element_spec == tf.TensorSpec([], tf.int64)
    assert [int(k) for k in keys] == [7, 8]
    iterator = iter(keys)
    assert int(next(iterator)) == 7
    del iterator
    gc.collect()
    assert opened == [b"k", b"k"] and closed == [b"k", b"k"]


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


# Every dtype the packed hand-over carries, with row shapes of none, one and two dimensions (and none wide).
_ALL_DTYPES = [(tf.bool, [3]), (tf.int8, []), (tf.uint8, [2, 2]), (tf.int16, [1]), (tf.uint16, []),
               (tf.int32, [2]), (tf.uint32, []), (tf.int64, [2, 1]), (tf.uint64, []), (tf.float16, [2]),
               (tf.bfloat16, []), (tf.float32, [0]), (tf.float64, [3]), (tf.bool, []), (tf.bool, [2, 2]),
               (tf.uint8, []), (tf.int8, [3]), (tf.int32, [2, 0]), (tf.uint8, [0, 2])]


def _all_dtypes_element(rows: int) -> list:
    rng = np.random.default_rng(rows)
    element = []
    for dtype, shape in _ALL_DTYPES:
        numpy_dtype = dtype.as_numpy_dtype
        if dtype == tf.bool:
            values = rng.integers(0, 2, [rows, *shape]).astype(bool)
        elif dtype.is_integer:
            info = np.iinfo(numpy_dtype)  # (the extremes catch a sign or width mix-up)
            values = rng.integers(info.min, info.max, [rows, *shape], dtype=numpy_dtype, endpoint=True)
            values.reshape(-1)[:2] = [info.min, info.max][:values.size]
        else:
            values = rng.normal(size=[rows, *shape]).astype(numpy_dtype)
        element.append(values)
    return element


def test_small_numeric_rows_round_trip_through_one_packed_array():
    spec = [tf.TensorSpec([None, *shape], dtype) for dtype, shape in _ALL_DTYPES]
    sent = [_all_dtypes_element(rows) for rows in (3, 0, 1)]

    def make(unused_arg):
        yield from sent

    dataset = batch_source.batches(make, (b"x",), spec)
    assert list(dataset.element_spec) == spec
    received = list(dataset)
    assert len(received) == 3
    for got, expected in zip(received, sent):
        for value, array, (dtype, _) in zip(got, expected, _ALL_DTYPES):
            assert value.dtype == dtype and value.shape == array.shape
            np.testing.assert_array_equal(value.numpy(), array)


def _py_func_outputs(dataset) -> list:
    """The output counts of the numpy_function calls in a dataset's graph (its functions included)."""
    return [len(n.attr["Tout"].list.type) for n in graph_nodes(dataset_graph(dataset))
            if n.op in ("PyFunc", "PyFuncStateless")]


def test_each_element_is_one_array_when_rows_are_small_and_numeric():
    def make(unused_arg):
        yield [np.zeros([1], np.int64), np.zeros([1, 2], np.float32)]

    # (from_generator's own calls, which open and close the generator, have one output each too)
    assert max(_py_func_outputs(_dataset(make))) == 1
    wide = {"a": tf.TensorSpec([None], tf.int64), "b": tf.TensorSpec([None, 1024], tf.float32)}
    text = {"a": tf.TensorSpec([None], tf.int64), "b": tf.TensorSpec([None], tf.string)}
    ragged = {"a": tf.TensorSpec([None], tf.int64), "b": tf.TensorSpec([None, None], tf.float32)}
    for spec in (wide, text, ragged):  # (each component its own array)
        assert max(_py_func_outputs(batch_source.batches(make, (b"x",), spec))) == 2


def test_string_and_variable_shaped_components_are_handed_over_as_they_are():
    spec = {"a": tf.TensorSpec([None], tf.string), "b": tf.TensorSpec([None, None], tf.float32)}

    def make(unused_arg):
        yield [np.array([b"x", b"yz"], object), np.ones([2, 3], np.float32)]

    (element,) = list(batch_source.batches(make, (b"x",), spec))
    assert element["a"].numpy().tolist() == [b"x", b"yz"]
    assert element["b"].numpy().tolist() == [[1.0] * 3] * 2


@pytest.mark.parametrize("element, message", [
    ([np.zeros([2], np.int32), np.zeros([2, 2], np.float32)],
     "component 0 of a batch has dtype int32, expected int64"),
    ([np.zeros([2], np.int64), np.zeros([2, 3], np.float32)],
     r"component 1 of a batch has shape \[2, 3\], expected \[2, 2\]"),
    ([np.zeros([2], np.int64), np.zeros([1, 2], np.float32)],
     r"component 1 of a batch has shape \[1, 2\], expected \[2, 2\]"),
    ([np.zeros([2], np.int64)], "a batch has 1 components, expected 2"),
])
def test_a_packed_element_that_does_not_match_its_spec_is_an_error_naming_the_component(element, message):
    def make(unused_arg):
        yield element

    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        list(_dataset(make))


def test_packed_row_bytes_are_the_row_bytes_of_the_packed_array_or_none():
    assert batch_source.packed_row_bytes(SPEC) == 8 + 2 * 4
    assert batch_source.packed_row_bytes([tf.TensorSpec([None, 3], tf.bool), tf.TensorSpec([None], tf.int16)]) == 5
    assert batch_source.packed_row_bytes({"a": tf.TensorSpec([None], tf.string)}) is None
    assert batch_source.packed_row_bytes({"a": tf.TensorSpec([None, 257], tf.float32)}) is None  # (> 1 KiB)


def test_a_generator_may_yield_the_packed_array_itself():
    a = np.array([7, -1], np.int64)
    b = np.array([[1.5, 2.0], [-3.0, 0.25]], np.float32)
    packed = np.concatenate([a.view(np.uint8).reshape(2, 8), b.view(np.uint8).reshape(2, 8)], axis=1)

    def make(unused_arg):
        yield packed
        yield [a[:1], b[:1]]  # (flat lists may follow)

    first, second = list(_dataset(make))
    assert first["a"].numpy().tolist() == [7, -1] and first["b"].numpy().tolist() == b.tolist()
    assert second["a"].numpy().tolist() == [7] and second["b"].numpy().tolist() == b[:1].tolist()


@pytest.mark.parametrize("packed", [np.zeros([2, 15], np.uint8), np.zeros([2, 16], np.int8), np.zeros([32], np.uint8)])
def test_a_packed_array_of_another_layout_is_an_error(packed):
    def make(unused_arg):
        yield packed

    message = f"a packed batch must be uint8 of shape [rows, 16], got {packed.dtype} of shape {list(packed.shape)}"
    with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(message)):
        list(_dataset(make))


def test_a_packed_element_is_split_with_at_most_a_reshape_and_a_bitcast_per_component():
    # Every op of the function that splits an element runs once per element (a few samples in TF-Agents'
    # pipelines): a scalar component is a bitcast of its bytes, a multi-byte one a reshape and a bitcast, a
    # uint8 vector its bytes as they are; no op computes the number of rows.
    spec = {"matrix": tf.TensorSpec([None, 2, 2], tf.float32), "scalar": tf.TensorSpec([None], tf.float64),
            "u8": tf.TensorSpec([None, 3], tf.uint8), "vector": tf.TensorSpec([None, 3], tf.int32)}

    def make(unused_arg):
        yield [np.zeros([1, 2, 2], np.float32), np.zeros([1]), np.zeros([1, 3], np.uint8), np.zeros([1, 3], np.int32)]

    dataset = batch_source.batches(make, (b"x",), spec)
    ops = collections.Counter(n.op for n in graph_nodes(dataset_graph(dataset)))
    assert (ops["Bitcast"], ops["Reshape"], ops["SplitV"]) == (3, 2, 1)
    assert (ops["Pack"], ops["Shape"], ops["StridedSlice"]) == (0, 0, 0)
    element = next(iter(dataset))
    assert {k: v.shape.as_list() for k, v in element.items()} == {"matrix": [1, 2, 2], "scalar": [1], "u8": [1, 3],
                                                                  "vector": [1, 3]}
