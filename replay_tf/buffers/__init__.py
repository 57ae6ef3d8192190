"""In-graph replay buffers on `tf.Variable` storage (TF-Agents' API, plus a prioritized variant), and TF-Agents'
Python buffers on numpy arrays (`PyUniformReplayBuffer`, `PyHashedReplayBuffer`)."""
from replay_tf.buffers.episodic import Episodes
from replay_tf.buffers.episodic import EpisodicReplayBuffer
from replay_tf.buffers.episodic import StatefulEpisodicReplayBuffer
from replay_tf.buffers.prioritized import PrioritizedBufferInfo
from replay_tf.buffers.prioritized import PrioritizedReplayBuffer
from replay_tf.buffers.py_hashed import FrameBuffer
from replay_tf.buffers.py_hashed import PyHashedReplayBuffer
from replay_tf.buffers.py_uniform import PyUniformReplayBuffer
from replay_tf.buffers.replay_buffer import ReplayBuffer
from replay_tf.buffers.uniform import BufferInfo
from replay_tf.buffers.uniform import TFUniformReplayBuffer
from replay_tf.buffers.uniform import UniformReplayBuffer
from replay_tf.buffers.uniform import end_of_episode_from_is_last
from replay_tf.buffers.uniform import end_of_episode_from_step_type

__all__ = [
    "BufferInfo",
    "Episodes",
    "EpisodicReplayBuffer",
    "FrameBuffer",
    "PrioritizedBufferInfo",
    "PrioritizedReplayBuffer",
    "PyHashedReplayBuffer",
    "PyUniformReplayBuffer",
    "ReplayBuffer",
    "StatefulEpisodicReplayBuffer",
    "TFUniformReplayBuffer",
    "UniformReplayBuffer",
    "end_of_episode_from_is_last",
    "end_of_episode_from_step_type",
]
