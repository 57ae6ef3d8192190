"""`PatternDataset`: Reverb's dataset applying structured-writer patterns to a stream of steps.

dm-reverb runs it as a custom op (`ReverbPatternDataset`); here the configs compile to a plain tf.data graph,
the same compiler as `rlds_tf.transformations.pattern_map` (one pattern language, one semantics, also run
online by `structured_writer.StructuredWriter`). The items are those a `StructuredWriter` would write for
the same steps and a sampler would read back, in the order it writes them.

Differences from dm-reverb: its iterators can be checkpointed; the configs passed in are left as they are
(Reverb appends its implicit `buffer_length` condition to the callers' protos); and it can be created inside
traced code as often as needed: in `episodes.flat_map(lambda e: PatternDataset(e['steps'], ...))` every
episode gives its items, where dm-reverb 0.14's gives the first episode's only
(tests/rlds_tf/transformations/test_traced_transformations.py). Steps are processed in blocks
(`compile.steps_to_blocks`): items come out in the same order, but a block's items only once its last step has
been read.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo
from rlds_tf.patterns import compile as compile_lib

_FLAG_SPEC = tf.TensorSpec([], tf.bool)


class PatternDataset(tf.data.Dataset):
    """A `tf.data.Dataset` of the trajectories that `configs` make of the steps of `input_dataset`."""

    def __init__(self, input_dataset: tf.data.Dataset, configs: Sequence[Any], respect_episode_boundaries: bool,
                 is_end_of_episode: Callable[..., Any]):
        """Applies the configs to the input dataset's steps.

        Args:
          input_dataset: a flat dataset of steps (a dataset of episodes must be flattened first, e.g.
            `episodes.flat_map(lambda e: e['steps'])`).
          configs: `StructuredWriterConfig`s (protos or `structured_writer.create_config` results) to apply;
            at each step their items come out in this order.
          respect_episode_boundaries: if True, no trajectory mixes steps of two episodes.
          is_end_of_episode: called on every step as `Dataset.map` calls its function (a tuple element is
            passed as arguments); returns a scalar bool, True at the last step of an episode.

        Raises:
          TypeError: `input_dataset` is not a `tf.data.Dataset`.
          ValueError: `is_end_of_episode` does not return a scalar bool; a config that does not fit the steps.
        """
        if not isinstance(input_dataset, tf.data.Dataset):
            raise TypeError(f"input_dataset must be a tf.data.Dataset of steps, got {type(input_dataset).__name__}")
        step_spec = input_dataset.element_spec
        unpacked = type(step_spec) is tuple  # (tf.data's rule for calling a map function)

        def with_flag(*args):
            return (args if unpacked else args[0]), is_end_of_episode(*args)

        flagged = input_dataset.map(with_flag)
        flag_spec = flagged.element_spec[1]
        if not (isinstance(flag_spec, tf.TensorSpec) and flag_spec.is_compatible_with(_FLAG_SPEC)):
            raise ValueError(f"Invalid `is_end_of_episode`: it must return a scalar `bool` tensor, but its return "
                             f"type is {flag_spec}.")
        blocks, large = compile_lib.steps_to_blocks(flagged)
        self._input_dataset = input_dataset
        self._dataset = compile_lib.compile_blocks(blocks, configs, step_spec,
                                                   respect_episode_boundaries=respect_episode_boundaries,
                                                   is_last_fn=lambda block: block[1],
                                                   in_parallel=not large)
        super().__init__(self._dataset._variant_tensor)

    @property
    def element_spec(self) -> Any:
        return self._dataset.element_spec

    def _inputs(self):
        return [self._input_dataset]

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        """`tf.data.Dataset.batch`, cut straight from the compiled graph's blocks of items where it can be
        (`rlds_tf.patterns.items_dataset`)."""
        return self._dataset.batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=num_parallel_calls,
                                   deterministic=deterministic, name=name)


def pattern_dataset_with_info(input_dataset: tf.data.Dataset, configs: Sequence[Any],
                              respect_episode_boundaries: bool,
                              is_end_of_episode: Callable[..., Any]) -> tf.data.Dataset:
    """`PatternDataset` whose elements are `ReplaySample`s: the trajectory as `data`, an `info` of zeros.

    The info has `SampleInfo.tf_dtypes()`, as `TrajectoryDataset`'s samples (dm-reverb's converts Python
    zeros: int32 keys, float32 probabilities), and trajectories that are tuples work (dm-reverb's fails on
    them: `Dataset.map` passes a tuple as several arguments)."""
    dataset = PatternDataset(input_dataset, configs, respect_episode_boundaries, is_end_of_episode)
    unpacked = type(dataset.element_spec) is tuple

    def with_info(*data):
        info = SampleInfo(*(tf.zeros([], dtype) for dtype in SampleInfo.tf_dtypes()))
        return ReplaySample(info=info, data=data if unpacked else data[0])

    return dataset.map(with_info)
