"""`ItemsDataset`: the items a compiled pattern graph makes, one element each, batched without unbatching.

The compiled graph (`compile.compile_blocks`) makes the items of a block of steps at once, stacked. As
elements they are `unbatch()`ed, and the usual `.batch(n)` after `pattern_map` would then copy every item
twice, one element at a time; `ItemsDataset.batch` instead cuts the blocks' stacked items into batches
directly (a rebatch, one copy). The elements are those of `Dataset.batch` on the items.

Items of dense tensors (what the compiled graph makes) are split and cut by tf.data's own unbatch and
rebatch kernels (`tf.raw_ops`): `Dataset.unbatch` and `Dataset.rebatch` first `map` every element through
a function that re-encodes sparse and ragged components, which for dense ones would only add a traced
function and a pipeline stage to set up (a few milliseconds of a pipeline's first pass). Other structures
go through those public methods. (tf.distribute's batch-size rewrite looks for that map before a rebatch;
it concerns only the rebatch tf.distribute adds itself.) Replay's `TrajectoryDataset` splits its sampled
batches with it too: one function call less per batch.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf


class ItemsDataset(tf.data.Dataset):
    """The items of `per_block` (each element the items of one block, stacked), one element per item."""

    def __init__(self, per_block: tf.data.Dataset, cardinality: Optional[int] = None):
        """`cardinality`: the number of items where it is known statically (or `tf.data.INFINITE_CARDINALITY`):
        it is then asserted on the items and on their batches."""
        self._per_block = per_block
        self._cardinality = cardinality
        self._dense = _all_dense(per_block.element_spec)
        if not self._dense:
            items = per_block.unbatch()
            if cardinality is not None:
                items = items.apply(tf.data.experimental.assert_cardinality(cardinality))
            self._element_spec = items.element_spec
            variant = items._variant_tensor
        else:
            self._element_spec = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype),
                                                       per_block.element_spec)
            # (the compiled graph stacks every component of a block to the same number of items)
            variant = tf.raw_ops.UnbatchDataset(input_dataset=per_block._variant_tensor,
                                                **_kernel_outputs(self._element_spec))
            if cardinality is not None:
                variant = tf.raw_ops.AssertCardinalityDataset(
                    input_dataset=variant, cardinality=tf.constant(cardinality, tf.int64),
                    **_kernel_outputs(self._element_spec))
        super().__init__(variant)

    @property
    def element_spec(self) -> Any:
        return self._element_spec

    def _inputs(self):
        return [self._per_block]

    def with_cardinality(self, cardinality: int) -> "ItemsDataset":
        """The same items, of `cardinality` items (asserted, as `tf.data.experimental.assert_cardinality`)."""
        return ItemsDataset(self._per_block, cardinality)

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        """`tf.data.Dataset.batch`, cut from the blocks' stacked items (see the module docstring); other
        arguments than a Python batch size and `drop_remainder` fall back to it."""
        if (num_parallel_calls is not None or deterministic is not None or name is not None
                or not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1
                or not isinstance(drop_remainder, (bool, np.bool_))):
            return super().batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=num_parallel_calls,
                                 deterministic=deterministic, name=name)
        if not self._dense:
            batches = self._per_block.rebatch(int(batch_size), drop_remainder=bool(drop_remainder))
        else:
            batches = _Rebatched(self._per_block, int(batch_size), bool(drop_remainder))
        if self._cardinality is None:
            return batches
        if self._cardinality == tf.data.INFINITE_CARDINALITY:
            count = self._cardinality
        elif drop_remainder:
            count = self._cardinality // int(batch_size)
        else:
            count = -(-self._cardinality // int(batch_size))
        return batches.apply(tf.data.experimental.assert_cardinality(count))


def _all_dense(spec: Any) -> bool:
    """Whether `spec` is a structure of `tf.TensorSpec`s of known rank >= 1 (elements the kernels can split)."""
    flat = tf.nest.flatten(spec)
    return bool(flat) and all(type(s) is tf.TensorSpec and s.shape.rank is not None and s.shape.rank >= 1
                              for s in flat)


def _kernel_outputs(spec: Any) -> dict:
    """The `output_types` and `output_shapes` arguments of a dataset kernel whose elements match `spec`."""
    flat = tf.nest.flatten(spec)
    return {"output_types": [s.dtype for s in flat], "output_shapes": [s.shape for s in flat]}


class _Rebatched(tf.data.Dataset):
    """`per_block.rebatch(batch_size, drop_remainder)` of dense stacked elements (see the module docstring)."""

    def __init__(self, per_block: tf.data.Dataset, batch_size: int, drop_remainder: bool):
        self._per_block = per_block
        dim = batch_size if drop_remainder else None
        self._element_spec = tf.nest.map_structure(lambda s: tf.TensorSpec([dim, *s.shape[1:]], s.dtype),
                                                   per_block.element_spec)
        super().__init__(tf.raw_ops.RebatchDatasetV2(
            input_dataset=per_block._variant_tensor, batch_sizes=tf.constant([batch_size], tf.int64),
            drop_remainder=tf.constant(drop_remainder), **_kernel_outputs(self._element_spec)))

    @property
    def element_spec(self) -> Any:
        return self._element_spec

    def _inputs(self):
        return [self._per_block]
