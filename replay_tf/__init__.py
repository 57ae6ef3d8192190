"""replay_tf: in-graph replay buffers and a Reverb-compatible replay server on current TensorFlow.

`import replay_tf as reverb` serves code written for dm-reverb; `replay_tf.TFUniformReplayBuffer` serves
code written for `tf_agents.replay_buffers`.
"""
# The public names load on first attribute access, all at once from replay_tf/_exports.py (see
# rlds_tf.lazy_names), so that importing a submodule such as `replay_tf.cli` does not import TensorFlow.
import typing as _typing

from rlds_tf import lazy_names

if _typing.TYPE_CHECKING:
    from replay_tf._exports import *  # noqa: F401,F403

__all__ = [
    # --- in-graph buffers ---
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
    # --- replay server ---
    "Client",
    "DeadlineExceededError",
    "PatternDataset",
    "ReplaySample",
    "ReverbError",
    "SampleInfo",
    "Server",
    "ShardedClient",
    "TFClient",
    "Table",
    "TimestepDataset",
    "TrajectoryColumn",
    "TrajectoryDataset",
    "TrajectoryWriter",
    "Writer",
    "checkpointers",
    "item_selectors",
    "pattern_dataset",
    "rate_limiters",
    "replay_sample",
    "reverb_types",
    "selectors",
    "set_connection_options",
    "structured",
    "structured_writer",
    # --- dataset helpers ---
    "datasets",
    "make_reverb_dataset",
    "make_reverb_fifo_sampler_dataset",
    "make_reverb_rnn_sequence_fifo_sampler_dataset",
    # --- reverb alias ---
    "register_as_reverb",
]

__getattr__, __dir__ = lazy_names.module_hooks(__name__, __all__, globals())
