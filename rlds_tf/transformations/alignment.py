"""Step alignment: shifting some fields relative to the others, and alignment tags."""
from __future__ import annotations

import enum
from typing import Sequence

import tensorflow as tf

from rlds_tf import rlds_types
from rlds_tf.transformations import flexible_batch


def shift_keys(steps: tf.data.Dataset, keys: Sequence[str], shift: int,
               batch_size: int = flexible_batch.BATCH_AUTO_TUNE) -> tf.data.Dataset:
    """Realigns fields: in output step i, the fields in `keys` come from input step i + shift.

    The output has `len(steps) - |shift|` steps. Like rlds it works on the flat stream it is given (apply
    it per episode with `apply_nested_steps` to keep episodes apart).

    Args:
      steps: dataset of step dicts.
      keys: top-level step keys to shift.
      shift: positions to shift (negative: take the keys from earlier steps).
      batch_size: kept for rlds compatibility; when set it must be larger than |shift|.

    >>> steps = tf.data.Dataset.from_tensor_slices({'o': [0, 1, 2], 'a': [10, 11, 12]})
    >>> [sorted((k, int(v)) for k, v in s.items()) for s in shift_keys(steps, ['a'], 1)]
    [[('a', 11), ('o', 0)], [('a', 12), ('o', 1)]]
    """
    if batch_size != flexible_batch.BATCH_AUTO_TUNE and abs(shift) >= batch_size:
        raise ValueError(f"Trying to shift {shift} positions using a batch size of {batch_size} (abs(shift) "
                         f"should be smaller than the batch size).")
    if isinstance(keys, str):
        keys = [keys]  # one key (rlds' substring test happens to accept it too)
    unknown = sorted(set(keys) - set(steps.element_spec))
    if unknown:
        raise KeyError(f"shift_keys: keys {unknown} are not step fields; fields: {sorted(steps.element_spec)}")
    earlier, later = steps, steps.skip(abs(shift))
    shifted_from_later = shift > 0

    def merge(first, second):
        # `first` is step i, `second` step i + |shift|.
        take_later = {k: (k in keys) == shifted_from_later for k in first}
        return {k: (second[k] if take_later[k] else first[k]) for k in first}

    return tf.data.Dataset.zip(earlier, later).map(merge)


@enum.unique
class AlignmentType(enum.Enum):
    """How a step's fields line up: state-action-reward (RLDS default), action-reward-state, ..."""

    UNKNOWN = enum.auto()
    SAR = enum.auto()
    ARS = enum.auto()
    RSA = enum.auto()


def add_alignment_to_step(step: rlds_types.Step, alignment: AlignmentType) -> rlds_types.Step:
    """A copy of `step` with `step['alignment'] = alignment.value` (the input dict is not modified)."""
    return {**step, rlds_types.ALIGNMENT: alignment.value}
