"""Reverb's `reverb.reverb_types`: the selector types, `SelectorType`, `SpecNest` and `TableInfo`.

The selectors and `TableInfo` are this package's own objects (`replay_tf.selectors`,
`replay_tf.wire.table_info.TableInfo`). Reverb's `Heap(min_heap)` is its C++ heap selector; here it returns a
`MinHeap()` or a `MaxHeap()`.

>>> from replay_tf import reverb_types
>>> reverb_types.Heap(True)
MinHeap()
"""
from typing import Iterable, Mapping, Union

import tensorflow as tf

from replay_tf.core.selectors import Fifo
from replay_tf.core.selectors import Lifo
from replay_tf.core.selectors import MaxHeap
from replay_tf.core.selectors import MinHeap
from replay_tf.core.selectors import Prioritized
from replay_tf.core.selectors import Uniform
from replay_tf.wire.table_info import TableInfo

__all__ = [
    "Fifo",
    "Heap",
    "Lifo",
    "Prioritized",
    "SelectorType",
    "SpecNest",
    "TableInfo",
    "Uniform",
]


def Heap(min_heap: bool) -> Union[MinHeap, MaxHeap]:  # noqa: N802  (Reverb's name for its heap selector class)
    """A heap selector: `MinHeap()` when `min_heap`, else `MaxHeap()`."""
    return MinHeap() if min_heap else MaxHeap()


SelectorType = Union[Fifo, Lifo, MaxHeap, MinHeap, Prioritized, Uniform]

SpecNest = Union[tf.TensorSpec, Iterable["SpecNest"], Mapping[str, "SpecNest"]]
