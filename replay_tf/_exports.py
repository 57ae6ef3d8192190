"""The public names of `replay_tf`, imported all at once by `replay_tf.__getattr__` on first access.

Add a public name here and to `replay_tf.__all__`.
"""
# Each section re-exports one part of the package; keep one name per line and mirror it in __all__.

# --- in-graph buffers (replay_tf/buffers) ---
from replay_tf.buffers import BufferInfo
from replay_tf.buffers import Episodes
from replay_tf.buffers import EpisodicReplayBuffer
from replay_tf.buffers import FrameBuffer
from replay_tf.buffers import PrioritizedBufferInfo
from replay_tf.buffers import PrioritizedReplayBuffer
from replay_tf.buffers import PyHashedReplayBuffer
from replay_tf.buffers import PyUniformReplayBuffer
from replay_tf.buffers import ReplayBuffer
from replay_tf.buffers import StatefulEpisodicReplayBuffer
from replay_tf.buffers import TFUniformReplayBuffer
from replay_tf.buffers import UniformReplayBuffer

# --- replay server: tables, selectors, rate limiters, client, writers, datasets (replay_tf/core, ...) ---
from replay_tf import checkpointers
from replay_tf import item_selectors
from replay_tf import pattern_dataset
from replay_tf import rate_limiters
from replay_tf import replay_sample
from replay_tf import reverb_types
from replay_tf import selectors
from replay_tf import structured_writer
from replay_tf import structured_writer as structured
from replay_tf.transport.base import set_connection_options
from replay_tf.client import Client
from replay_tf.errors import DeadlineExceededError
from replay_tf.errors import ReverbError
from replay_tf.legacy_writer import Writer
from replay_tf.pattern_dataset import PatternDataset
from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo
from replay_tf.server import Server
from replay_tf.sharded import ShardedClient
from replay_tf.tf_client import TFClient
from replay_tf.timestep_dataset import TimestepDataset
from replay_tf.table import Table
from replay_tf.trajectory_dataset import TrajectoryDataset
from replay_tf.trajectory_writer import TrajectoryColumn
from replay_tf.trajectory_writer import TrajectoryWriter

# --- dataset helpers (replay_tf/datasets.py) ---
from replay_tf import datasets
from replay_tf.datasets import make_reverb_dataset
from replay_tf.datasets import make_reverb_fifo_sampler_dataset
from replay_tf.datasets import make_reverb_rnn_sequence_fifo_sampler_dataset

# --- `import reverb` for libraries that import Reverb themselves (replay_tf/reverb_alias.py) ---
from replay_tf.reverb_alias import register_as_reverb
