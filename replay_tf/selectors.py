"""Item selectors, as `reverb.selectors`: Uniform, Prioritized, Fifo, Lifo, MaxHeap, MinHeap."""
from replay_tf.core.selectors import Fifo
from replay_tf.core.selectors import Lifo
from replay_tf.core.selectors import MaxHeap
from replay_tf.core.selectors import MinHeap
from replay_tf.core.selectors import Prioritized
from replay_tf.core.selectors import Uniform

__all__ = [
    "Fifo",
    "Lifo",
    "MaxHeap",
    "MinHeap",
    "Prioritized",
    "Uniform",
]
