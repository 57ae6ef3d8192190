"""`ItemsDataset`: the items a compiled pattern graph makes, one element each, batched without unbatching.

The compiled graph (`compile.compile_blocks`) makes the items of a block of steps at once, stacked. As
elements they are `unbatch()`ed, and the usual `.batch(n)` after `pattern_map` would then copy every item
twice, one element at a time; `ItemsDataset.batch` instead cuts the blocks' stacked items into batches
directly (`Dataset.rebatch`, one copy). The elements are those of `Dataset.batch` on the items.
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
        items = per_block.unbatch()
        if cardinality is not None:
            items = items.apply(tf.data.experimental.assert_cardinality(cardinality))
        self._items = items
        super().__init__(items._variant_tensor)

    @property
    def element_spec(self) -> Any:
        return self._items.element_spec

    def _inputs(self):
        return [self._per_block]

    def with_cardinality(self, cardinality: int) -> "ItemsDataset":
        """The same items, of `cardinality` items (asserted, as `tf.data.experimental.assert_cardinality`)."""
        return ItemsDataset(self._per_block, cardinality)

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        """`tf.data.Dataset.batch`, cut from the blocks' stacked items (see the module docstring); other
        arguments than a Python batch size and `drop_remainder` (and `name`) fall back to it."""
        if (num_parallel_calls is not None or deterministic is not None
                or not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size < 1
                or not isinstance(drop_remainder, (bool, np.bool_))):
            return super().batch(batch_size, drop_remainder=drop_remainder, num_parallel_calls=num_parallel_calls,
                                 deterministic=deterministic, name=name)
        batches = self._per_block.rebatch(int(batch_size), drop_remainder=bool(drop_remainder), name=name)
        if self._cardinality is None:
            return batches
        if self._cardinality == tf.data.INFINITE_CARDINALITY:
            count = self._cardinality
        elif drop_remainder:
            count = self._cardinality // int(batch_size)
        else:
            count = -(-self._cardinality // int(batch_size))
        return batches.apply(tf.data.experimental.assert_cardinality(count))
