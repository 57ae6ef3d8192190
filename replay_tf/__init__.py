"""replay_tf: in-graph replay buffers and a Reverb-compatible replay server on current TensorFlow.

`import replay_tf as reverb` serves code written for dm-reverb; `replay_tf.TFUniformReplayBuffer` serves
code written for `tf_agents.replay_buffers`.
"""
# The public names load on first attribute access, each from the module named in `_PUBLIC_NAMES` (see
# rlds_tf.lazy_names), so that importing a submodule such as `replay_tf.cli` does not import TensorFlow.
from rlds_tf import lazy_names

# Each public name -> where it is defined (`module:name`, or a module). Add a public name here.
_PUBLIC_NAMES = {
    # --- in-graph buffers ---
    "BufferInfo": "replay_tf.buffers:BufferInfo",
    "Episodes": "replay_tf.buffers:Episodes",
    "EpisodicReplayBuffer": "replay_tf.buffers:EpisodicReplayBuffer",
    "FrameBuffer": "replay_tf.buffers:FrameBuffer",
    "PrioritizedBufferInfo": "replay_tf.buffers:PrioritizedBufferInfo",
    "PrioritizedReplayBuffer": "replay_tf.buffers:PrioritizedReplayBuffer",
    "PyHashedReplayBuffer": "replay_tf.buffers:PyHashedReplayBuffer",
    "PyUniformReplayBuffer": "replay_tf.buffers:PyUniformReplayBuffer",
    "ReplayBuffer": "replay_tf.buffers:ReplayBuffer",
    "StatefulEpisodicReplayBuffer": "replay_tf.buffers:StatefulEpisodicReplayBuffer",
    "TFUniformReplayBuffer": "replay_tf.buffers:TFUniformReplayBuffer",
    "UniformReplayBuffer": "replay_tf.buffers:UniformReplayBuffer",
    # --- replay server ---
    "Client": "replay_tf.client:Client",
    "DeadlineExceededError": "replay_tf.errors:DeadlineExceededError",
    "PatternDataset": "replay_tf.pattern_dataset:PatternDataset",
    "ReplaySample": "replay_tf.replay_sample:ReplaySample",
    "ReverbError": "replay_tf.errors:ReverbError",
    "SampleInfo": "replay_tf.replay_sample:SampleInfo",
    "Server": "replay_tf.server:Server",
    "ShardedClient": "replay_tf.sharded:ShardedClient",
    "TFClient": "replay_tf.tf_client:TFClient",
    "Table": "replay_tf.table:Table",
    "TimestepDataset": "replay_tf.timestep_dataset:TimestepDataset",
    "TrajectoryColumn": "replay_tf.trajectory_writer:TrajectoryColumn",
    "TrajectoryDataset": "replay_tf.trajectory_dataset:TrajectoryDataset",
    "TrajectoryWriter": "replay_tf.trajectory_writer:TrajectoryWriter",
    "Writer": "replay_tf.legacy_writer:Writer",
    "checkpointers": "replay_tf.checkpointers",
    "item_selectors": "replay_tf.item_selectors",
    "pattern_dataset": "replay_tf.pattern_dataset",
    "rate_limiters": "replay_tf.rate_limiters",
    "replay_sample": "replay_tf.replay_sample",
    "reverb_types": "replay_tf.reverb_types",
    "selectors": "replay_tf.selectors",
    "set_connection_options": "replay_tf.client:set_connection_options",
    "structured": "replay_tf.structured_writer",
    "structured_writer": "replay_tf.structured_writer",
    # --- dataset helpers ---
    "datasets": "replay_tf.datasets",
    "make_reverb_dataset": "replay_tf.datasets:make_reverb_dataset",
    "make_reverb_fifo_sampler_dataset": "replay_tf.datasets:make_reverb_fifo_sampler_dataset",
    "make_reverb_rnn_sequence_fifo_sampler_dataset": "replay_tf.datasets:make_reverb_rnn_sequence_fifo_sampler_dataset",
    # --- reverb alias ---
    "register_as_reverb": "replay_tf.reverb_alias:register_as_reverb",
}

__all__ = list(_PUBLIC_NAMES)

__getattr__, __dir__ = lazy_names.module_hooks(__name__, _PUBLIC_NAMES, globals())
