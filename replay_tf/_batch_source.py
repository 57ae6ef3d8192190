"""`batches`: a `tf.data.Dataset` of what a Python generator yields, at one `tf.numpy_function` call each.

`tf.data.Dataset.from_generator` with an `output_signature` runs every element through an eager Python
function that converts each value to an eager tensor and checks its spec in Python: several times the cost
of the generator's own work for the small batches of many interleaved datasets (TF-Agents' replay buffer
interleaves up to 32 of them, a few samples each). Here `from_generator` only opens and closes the
generator (it yields one key per iterator, so closing follows the iterator's lifetime as before), and each
element is one stateful `numpy_function` call that hands the generator's arrays to TensorFlow as they are.

Exceptions in the generator reach the iterator as `numpy_function` maps them (ValueError and TypeError as
InvalidArgumentError, others as UnknownError), which is also how `from_generator` maps them.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tree

# The generators of live iterators, by key (each iterator's `from_generator` holds its key).
_SOURCES: dict = {}
_KEYS = itertools.count()


def batches(make_generator: Callable, args: tuple, element_spec: Any,
            wrap: Callable[[Any], Any] = lambda generator: generator) -> tf.data.Dataset:
    """The elements of `make_generator(*args)` (a new generator per iterator; `args` as `from_generator`
    passes them: bytes for strings), each a flat list of arrays matching `element_spec` (a nest of
    `tf.TensorSpec`s) flattened by `tree`. `wrap` wraps the generator that `from_generator` runs (the one
    that opens and closes `make_generator`'s), e.g. `_generator_exit.ending_at_exit`."""
    flat_specs = tree.flatten(element_spec)
    dtypes = [spec.dtype for spec in flat_specs]

    def start(*generator_args):
        generator = make_generator(*generator_args)
        key = next(_KEYS)
        _SOURCES[key] = generator
        try:
            yield np.int64(key)
        finally:
            _SOURCES.pop(key, None)
            generator.close()

    def next_element(key: np.ndarray) -> list:
        generator = _SOURCES.get(int(key))
        element = None if generator is None else next(generator, None)
        if element is None:
            raise StopIteration  # (OutOfRange: the end of the iteration, see `per_iterator`)
        return element

    @tf.autograph.experimental.do_not_convert
    def read(key: tf.Tensor):
        values = tf.numpy_function(next_element, [key], dtypes, stateful=True)
        for value, spec in zip(values, flat_specs):
            value.set_shape(spec.shape)
        return tree.unflatten_as(element_spec, values)

    @tf.autograph.experimental.do_not_convert
    def per_iterator(key: tf.Tensor) -> tf.data.Dataset:
        # The v1 `map` ends the iteration where its function raises OutOfRange (the v2 `map` keeps its
        # input's cardinality and raises instead), so no per-element predicate is needed.
        return tf.compat.v1.data.Dataset.from_tensors(key).repeat().map(read)

    keys = tf.data.Dataset.from_generator(lambda *generator_args: wrap(start(*generator_args)),
                                          output_signature=tf.TensorSpec([], tf.int64), args=args)
    return keys.flat_map(per_iterator)
