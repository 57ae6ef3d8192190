"""Reverb's `reverb.item_selectors` (what `reverb.selectors` names): the objects of `replay_tf.selectors`."""
from replay_tf.selectors import Fifo
from replay_tf.selectors import Lifo
from replay_tf.selectors import MaxHeap
from replay_tf.selectors import MinHeap
from replay_tf.selectors import Prioritized
from replay_tf.selectors import Uniform

__all__ = [
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "Prioritized",
    "Uniform",
]
