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


def uniform_from_spec(spec: Any, minval: Any, maxval: Any, seed: int) -> Any:
    """A nest of `tf.random.uniform` values in [minval, maxval) matching a spec nest (unknown dims become 1)."""
    return tf.nest.map_structure(
        lambda s: tf.random.uniform(_concrete_shape(s.shape), minval=minval, maxval=maxval, seed=seed,
                                    dtype=s.dtype), spec)


def zero_dataset_like(ds: tf.data.Dataset) -> tf.data.Dataset:
    """A one-element dataset of zeros with the element spec of `ds`."""
    return tf.data.Dataset.from_tensors(zeros_from_spec(ds.element_spec))
