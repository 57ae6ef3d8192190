"""Concatenating steps datasets whose fields differ, and appending absorbing steps after terminal ones."""
from __future__ import annotations

from typing import Callable, Mapping

import tensorflow as tf

from rlds_tf import rlds_types
from rlds_tf.transformations import nested_ops
from rlds_tf.transformations import shape_ops


def _fill_missing(step: rlds_types.Step, spec: Mapping[str, tf.TensorSpec]) -> rlds_types.Step:
    """A copy of `step` with zeros for the fields of `spec` it lacks."""
    return {**step, **{k: shape_ops.zeros_from_spec(s) for k, s in spec.items() if k not in step}}


def concatenate(steps1: tf.data.Dataset, steps2: tf.data.Dataset) -> tf.data.Dataset:
    """`steps1` then `steps2`; fields present in only one of them are filled with zeros in the other.

    >>> a = tf.data.Dataset.from_tensors({'x': 1})
    >>> b = tf.data.Dataset.from_tensors({'y': 2.0})
    >>> [{k: v.numpy().item() for k, v in s.items()} for s in concatenate(a, b)]
    [{'x': 1, 'y': 0.0}, {'x': 0, 'y': 2.0}]
    """
    spec1, spec2 = steps1.element_spec, steps2.element_spec

    # Named functions, not two lambdas on one line: AutoGraph cannot tell such lambdas apart in the source
    # and logs a warning each time it converts them.
    def fill_from_spec2(step):
        return _fill_missing(step, spec2)

    def fill_from_spec1(step):
        return _fill_missing(step, spec1)

    return steps1.map(fill_from_spec2).concatenate(steps2.map(fill_from_spec1))


def concat_if_terminal(steps: tf.data.Dataset,
                       make_extra_steps: Callable[[rlds_types.Step], tf.data.Dataset]) -> tf.data.Dataset:
    """Appends `make_extra_steps(last_step)` when the last step is terminal (e.g. absorbing states).

    The result always has the fields of both (see `concatenate`), whether or not the steps were added.
    """
    last = nested_ops.final_step(steps)
    extra = make_extra_steps(last)
    # take(-1) keeps every extra step, take(0) none: one graph for both cases, no tf.cond over datasets.
    count = tf.where(tf.cast(last[rlds_types.IS_TERMINAL], tf.bool), tf.constant(-1, tf.int64),
                     tf.constant(0, tf.int64))
    return concatenate(steps, extra.take(count))
