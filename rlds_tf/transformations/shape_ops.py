"""Spec helpers: zeros and uniform values shaped like a spec, and the byte size of a step.

>>> zeros_from_spec({'a': tf.TensorSpec([None, 2], tf.int32)})['a'].shape
TensorShape([1, 2])
"""
from __future__ import annotations

import sys
from typing import Any

import tensorflow as tf


def _concrete_shape(shape: tf.TensorShape) -> tuple:
    """The spec's shape with unknown dimensions set to 1 (a spec of a batch becomes a batch of one)."""
    if shape.rank is None:
        return ()
    return tuple(1 if d is None else d for d in shape.as_list())


def size_from_spec(spec: Any) -> int:
    """Bytes of one element shaped like `spec` (`sys.maxsize` when a shape is not fully known)."""
    total = 0
    for leaf in tf.nest.flatten(spec):
        elements = leaf.shape.num_elements()
        if elements is None:
            return sys.maxsize
        total += leaf.dtype.size * elements
    return total


def zeros_from_spec(spec: Any) -> Any:
    """A nest of zeros matching a `tf.TensorSpec` nest (unknown dimensions become 1)."""
    return tf.nest.map_structure(lambda s: tf.zeros(_concrete_shape(s.shape), s.dtype), spec)


# The dtypes `tf.random.uniform` draws directly; other integers are drawn as int64 and cast.
_UNIFORM_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)


def _uniform(spec: tf.TensorSpec, minval: Any, maxval: Any, seed: int) -> tf.Tensor:
    shape = _concrete_shape(spec.shape)
    if spec.dtype == tf.string:
        # Text has no numeric range: empty strings, as `zeros_from_spec` gives.
        return tf.zeros(shape, tf.string)
    if spec.dtype == tf.bool:
        return tf.random.uniform(shape, minval=0, maxval=2, seed=seed, dtype=tf.int32) > 0
    if spec.dtype in _UNIFORM_DTYPES:
        return tf.random.uniform(shape, minval=minval, maxval=maxval, seed=seed, dtype=spec.dtype)
    if spec.dtype.is_integer:
        # uint8 images, int16 audio, ...: `tf.random.uniform` draws only int32/int64 integers.
        drawn = tf.random.uniform(shape, minval=minval, maxval=maxval, seed=seed, dtype=tf.int64)
        return tf.cast(drawn, spec.dtype)
    raise TypeError(f"uniform_from_spec: no uniform values of dtype {spec.dtype.name} (spec {spec}); supported: "
                    f"floating and integer dtypes, bool and string")


def uniform_from_spec(spec: Any, minval: Any, maxval: Any, seed: int) -> Any:
    """A nest of `tf.random.uniform` values in [minval, maxval) matching a spec nest (unknown dims become 1).

    Integers of any width are drawn in [minval, maxval) (a range the dtype holds); bools are fair coin flips
    and strings empty, whatever the range, so a whole step spec (images, flags, text) can be filled.

    >>> values = uniform_from_spec({'image': tf.TensorSpec([2, 2, 3], tf.uint8),
    ...                             'text': tf.TensorSpec([], tf.string)}, 0, 256, seed=1)
    >>> values['image'].dtype.name, values['text'].numpy()
    ('uint8', b'')
    """
    return tf.nest.map_structure(lambda s: _uniform(s, minval, maxval, seed), spec)


def zero_dataset_like(ds: tf.data.Dataset) -> tf.data.Dataset:
    """A one-element dataset of zeros with the element spec of `ds`."""
    return tf.data.Dataset.from_tensors(zeros_from_spec(ds.element_spec))
