"""Truncation of a steps dataset after the first step that meets a condition."""
from __future__ import annotations

from typing import Callable

import tensorflow as tf

from rlds_tf import rlds_types


def truncate_after_condition(steps_dataset: tf.data.Dataset,
                             truncate_condition: Callable[[rlds_types.Step], bool]) -> tf.data.Dataset:
    """Keeps the steps up to and including the first one for which `truncate_condition` is True.

    >>> ds = tf.data.Dataset.range(10)
    >>> [int(x) for x in truncate_after_condition(ds, lambda x: x == 3)]
    [0, 1, 2, 3]
    """
    # Pair each step with "the condition held at an earlier step"; stop at the first pair where it did.
    def tag(seen, step):
        hit = tf.logical_or(seen, tf.cast(truncate_condition(step), tf.bool))
        return hit, (step, seen)

    # Named functions, not two lambdas on one line: AutoGraph cannot tell such lambdas apart in the source
    # and logs a warning each time it converts them.
    def not_seen_before(step, seen):
        del step
        return tf.logical_not(seen)

    def step_only(step, seen):
        del seen
        return step

    tagged = steps_dataset.scan(tf.constant(False), tag)
    return tagged.take_while(not_seen_before).map(step_only)
