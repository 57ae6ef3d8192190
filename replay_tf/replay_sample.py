"""Reverb's `reverb.replay_sample`: `ReplaySample` and `SampleInfo`, defined in `replay_tf.trajectory_dataset`."""
from replay_tf.trajectory_dataset import ReplaySample
from replay_tf.trajectory_dataset import SampleInfo

__all__ = [
    "ReplaySample",
    "SampleInfo",
]
