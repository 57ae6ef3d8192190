"""The cardinality of a dataset as a Python int when it is known while the dataset is built.

Eagerly `Dataset.cardinality()` is a concrete tensor. Inside traced code (a `tf.function`, the function of
`Dataset.map`, `flat_map` or `interleave`, TF1 graph mode) it is a symbolic tensor, computed only when the
graph runs: `int(...)` or a Python `if` on it fails there, so transformations ask for the static value and
treat "not known while building" like an unknown cardinality.

>>> static_cardinality(tf.data.Dataset.range(3))
3
>>> static_cardinality(tf.data.Dataset.range(3).filter(lambda x: x > 0)) == tf.data.UNKNOWN_CARDINALITY
True
>>> bool(tf.function(lambda: tf.constant(static_cardinality(tf.data.Dataset.range(3)) is None))())
True
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf


def static_cardinality(dataset: tf.data.Dataset) -> Optional[int]:
    """`dataset.cardinality()` as an int (a count, INFINITE_CARDINALITY or UNKNOWN_CARDINALITY) when its value
    is known while the dataset is built (eagerly), None inside traced code."""
    value = tf.get_static_value(dataset.cardinality())
    return None if value is None else int(value)
