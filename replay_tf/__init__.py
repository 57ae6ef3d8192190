"""replay_tf: in-graph replay buffers and a Reverb-compatible replay server on current TensorFlow.

`import replay_tf as reverb` serves code written for dm-reverb; `replay_tf.TFUniformReplayBuffer` serves
code written for `tf_agents.replay_buffers`.
"""
# Each section re-exports one part of the package; keep one name per line and mirror it in __all__.

# --- in-graph buffers (replay_tf/buffers) ---

# --- replay server: tables, selectors, rate limiters, client, writers, datasets (replay_tf/core, ...) ---

__all__ = [
    # --- in-graph buffers ---
    # --- replay server ---
]
