"""Rate limiters, as `reverb.rate_limiters`: RateLimiter, MinSize, SampleToInsertRatio, Queue, Stack."""
from replay_tf.core.rate_limiters import MinSize
from replay_tf.core.rate_limiters import Queue
from replay_tf.core.rate_limiters import RateLimiter
from replay_tf.core.rate_limiters import SampleToInsertRatio
from replay_tf.core.rate_limiters import Stack

__all__ = [
    "MinSize",
    "Queue",
    "RateLimiter",
    "SampleToInsertRatio",
    "Stack",
]
