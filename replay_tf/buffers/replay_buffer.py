"""`ReplayBuffer`: TF-Agents' base class for custom replay buffers.

A subclass implements the `_`-prefixed methods (`_add_batch`, `_get_next`, `_as_dataset`,
`_single_deterministic_pass_dataset`, `_gather_all`, `_clear`, `_num_frames`); the public methods, with
TF-Agents' names and arguments, call them. `UniformReplayBuffer` and `PrioritizedReplayBuffer` derive
from it, as TF-Agents' `TFUniformReplayBuffer` does, and implement the public methods themselves.
"""
from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from replay_tf import specs


class ReplayBuffer(tf.Module):
    """Base class of a replay buffer holding items of `data_spec`, at most `capacity` of them.

    Args:
      data_spec: a spec or nest of specs describing one item.
      capacity: how many items the buffer holds.
      stateful_dataset: whether `as_dataset`'s datasets hold stateful ops (kept for TF-Agents' API: the
        tf.data option it sets is gone from TensorFlow 2, where stateful ops are allowed anyway).
    """

    def __init__(self, data_spec: Any, capacity: Any, stateful_dataset: bool = False):
        super().__init__()
        self._data_spec = data_spec
        self._capacity = capacity
        self._stateful_dataset = stateful_dataset

    @property
    def data_spec(self) -> Any:
        return self._data_spec

    @property
    def capacity(self) -> Any:
        return self._capacity

    @property
    def stateful_dataset(self) -> bool:
        return self._stateful_dataset

    def num_frames(self):
        """The number of frames (items) in the buffer."""
        return self._num_frames()

    def add_batch(self, items):
        """Adds `items` (a nest like `data_spec`, with an outer batch dimension)."""
        return self._add_batch(items)

    def get_next(self, sample_batch_size: Optional[int] = None, num_steps: Optional[int] = None,
                 time_stacked: bool = True):
        """An item, or a batch of `sample_batch_size`, of `num_steps` consecutive steps if given."""
        return self._get_next(sample_batch_size, num_steps, time_stacked)

    def as_dataset(self, sample_batch_size: Optional[int] = None, num_steps: Optional[int] = None,
                   num_parallel_calls: Optional[int] = None, sequence_preprocess_fn=None,
                   single_deterministic_pass: bool = False) -> tf.data.Dataset:
        """A `tf.data.Dataset` of samples (`_as_dataset`), or one pass over every item in order
        (`_single_deterministic_pass_dataset`).

        Raises:
          ValueError: `data_spec` holds lists (tf.data reads them as tensors: use tuples).
        """
        if specs.has_lists(self._data_spec):
            raise ValueError(f"Cannot perform gather; data spec contains lists and this conflicts with gathering "
                             f"operator. Convert any lists to tuples. For example, if your spec looks like "
                             f"[a, b, c], change it to (a, b, c). Spec structure is:\n  "
                             f"{tf.nest.map_structure(lambda spec: spec.dtype, self._data_spec)}")
        make = self._single_deterministic_pass_dataset if single_deterministic_pass else self._as_dataset
        dataset = make(sample_batch_size=sample_batch_size, num_steps=num_steps,
                       sequence_preprocess_fn=sequence_preprocess_fn, num_parallel_calls=num_parallel_calls)
        # TF-Agents allows stateful ops through an option that TensorFlow 2's `tf.data.Options` lacks (it
        # skips it then).
        options = tf.data.Options()
        if self._stateful_dataset and hasattr(options, "experimental_allow_stateful"):
            options.experimental_allow_stateful = True
            dataset = dataset.with_options(options)
        return dataset

    def gather_all(self):
        """Every item in the buffer."""
        return self._gather_all()

    def clear(self):
        """Empties the buffer."""
        return self._clear()

    # Subclasses implement these.
    def _num_frames(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement _num_frames")

    def _add_batch(self, items):
        raise NotImplementedError(f"{type(self).__name__} does not implement _add_batch")

    def _get_next(self, sample_batch_size, num_steps, time_stacked):
        raise NotImplementedError(f"{type(self).__name__} does not implement _get_next")

    def _as_dataset(self, sample_batch_size, num_steps, sequence_preprocess_fn, num_parallel_calls):
        raise NotImplementedError(f"{type(self).__name__} does not implement _as_dataset")

    def _single_deterministic_pass_dataset(self, sample_batch_size, num_steps, sequence_preprocess_fn,
                                           num_parallel_calls):
        raise NotImplementedError(f"{type(self).__name__} does not implement _single_deterministic_pass_dataset")

    def _gather_all(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement _gather_all")

    def _clear(self):
        raise NotImplementedError(f"{type(self).__name__} does not implement _clear")
