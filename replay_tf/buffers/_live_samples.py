"""Samples drawn a chunk at a time and served one at a time, each checked against the live buffer.

`live_samples(draw, is_live)` unbatches the chunks `draw` makes and leaves out every sample whose mark
fails `is_live` at the moment the sample is produced (`is_live` reads the buffer's variables). That check
is one tf.data function call per sample, so the pipeline is built around what such a call costs:

- The check runs as a `MapDataset` whose function executes on the calling thread
  (`use_inter_op_parallelism=False`: TensorFlow's single-threaded executor). With the default executor a
  call hands its ops to tf.data's inter-op thread pool and waits for them, which costs several times
  the check itself. `Dataset.filter` has no such option, so the check is a map that appends a bool,
  and the filter after it only returns that bool: a function that returns one of its inputs is not
  called at all (tf.data passes the input through). A last map drops the bool the same way.
- The check reads a variable, so it is stateful and tf.data never parallelizes it. The last map is
  stateless and is kept synchronous (`force_synchronous`; a stateful read on TF versions without it):
  `map_parallelization` would otherwise run it ahead of the consumer, and the check with it, before
  adds that should count.
- A map must not end the pipeline: `map_and_batch_fusion` would fuse it with the `.batch(n)` that
  usually follows into a parallel map-and-batch, which hands every call to a pool thread. An
  `assert_cardinality` (the dataset is infinite) ends it instead.

>>> import tensorflow as tf
>>> threshold = tf.Variable(2)
>>> draw = lambda i: (tf.constant([10, 11, 12]), tf.constant([1, 2, 3]))   # (samples, marks)
>>> [int(x) for x in live_samples(draw, lambda mark: mark >= threshold.read_value()).take(4)]
[11, 12, 11, 12]
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import tensorflow as tf


def live_samples(draw: Callable[[tf.Tensor], tuple], is_live: Callable[[tf.Tensor], tf.Tensor],
                 num_parallel_calls: int | None = None) -> tf.data.Dataset:
    """An infinite dataset of the samples `draw` makes, one element each, without those not live when produced.

    Args:
      draw: a function of the chunk's index (int64 scalar) returning `(samples, marks)`: `samples` a
        nest of dense tensors `[n, ...]`, `marks` an `[n]` tensor, one mark per sample (`n` may differ
        between chunks).
      is_live: a function of one sample's mark (a scalar) returning a bool scalar; it may read variables.
      num_parallel_calls: of the `map` that calls `draw` (chunks drawn ahead, in parallel).

    Returns:
      The samples (structure of `samples`, each leaf `[...]`), in order.
    """
    traced_samples = []

    def chunk(i):
        samples, marks = draw(i)
        traced_samples.append(samples)
        return tuple(tf.nest.flatten(samples)) + (marks,)

    chunks = tf.data.Dataset.counter().map(chunk, num_parallel_calls=num_parallel_calls)
    rows = _unbatch(chunks)  # each: the sample's components, then its mark

    def check(*row):
        return [*row, is_live(row[-1])]

    checked = _inline_map(rows, check)  # each: the row, then whether it is live
    # The predicate returns one of its inputs: tf.data passes that through without calling a function.
    kept = checked.filter(lambda *checked_row: checked_row[-1])

    if _MAP_HAS_FORCE_SYNCHRONOUS:
        def strip(*checked_row):
            return list(checked_row[:-2])  # a stateless pass-through: no function call either
    else:
        def strip(*checked_row):
            # Without `force_synchronous`, only a stateful map stays unparallelized: check the mark again.
            with tf.control_dependencies([is_live(checked_row[-2])]):
                return [tf.identity(t) for t in checked_row[:-2]]
    samples = _inline_map(kept, strip, synchronous=True)
    # Not a map last, for the `.batch(n)` that usually follows (see the module docstring); the
    # counter makes the dataset infinite in any case.
    samples = samples.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    return _Shaped(samples, tf.nest.pack_sequence_as(traced_samples[0], list(samples.element_spec)))


# `force_synchronous` (TF 2.18 and later) keeps tf.data's `map_parallelization` off a stateless map.
_MAP_HAS_FORCE_SYNCHRONOUS = "force_synchronous" in inspect.signature(tf.raw_ops.MapDataset).parameters


def _inline_map(dataset: tf.data.Dataset, fn: Callable[..., list], synchronous: bool = False) -> "_Flat":
    """`dataset.map(fn)` (fn of the flat components, returning a list), run on the calling thread;
    `synchronous`: never parallelized by tf.data's `map_parallelization` (where TF has the option)."""
    specs = list(dataset.element_spec)
    traced = tf.function(fn, input_signature=specs, autograph=False).get_concrete_function()
    out_specs = [tf.TensorSpec(t.shape, t.dtype) for t in traced.outputs]
    options = {"force_synchronous": True} if synchronous and _MAP_HAS_FORCE_SYNCHRONOUS else {}
    variant = tf.raw_ops.MapDataset(input_dataset=dataset._variant_tensor, other_arguments=traced.captured_inputs,
                                    f=traced, use_inter_op_parallelism=False, preserve_cardinality=True,
                                    **options, **_kernel_outputs(out_specs))
    return _Flat(dataset, variant, out_specs)


def _unbatch(dataset: tf.data.Dataset) -> "_Flat":
    """tf.data's unbatch kernel over `dataset`'s flat components (`Dataset.unbatch` maps every element
    first, to re-encode sparse and ragged components: a function call per chunk for nothing here)."""
    out_specs = [tf.TensorSpec(s.shape[1:], s.dtype) for s in dataset.element_spec]
    variant = tf.raw_ops.UnbatchDataset(input_dataset=dataset._variant_tensor, **_kernel_outputs(out_specs))
    return _Flat(dataset, variant, out_specs)


def _kernel_outputs(specs: list) -> dict:
    return {"output_types": [s.dtype for s in specs], "output_shapes": [s.shape for s in specs]}


class _Flat(tf.data.Dataset):
    """A dataset kernel's output over `input_dataset`, its elements a tuple of the `specs`' components."""

    def __init__(self, input_dataset: tf.data.Dataset, variant: tf.Tensor, specs: list):
        self._input_dataset = input_dataset
        self._element_spec = tuple(specs)
        super().__init__(variant)

    @property
    def element_spec(self) -> Any:
        return self._element_spec

    def _inputs(self):
        return [self._input_dataset]


class _Shaped(tf.data.Dataset):
    """`dataset`'s elements, seen with the nested structure `element_spec` (same flat components)."""

    def __init__(self, dataset: tf.data.Dataset, element_spec: Any):
        self._dataset = dataset
        self._element_spec = element_spec
        super().__init__(dataset._variant_tensor)

    @property
    def element_spec(self) -> Any:
        return self._element_spec

    def _inputs(self):
        return [self._dataset]
