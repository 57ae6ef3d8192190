"""replay_tf: in-graph replay buffers and a Reverb-compatible replay server on current TensorFlow.

`import replay_tf as reverb` serves code written for dm-reverb; `replay_tf.TFUniformReplayBuffer` serves
code written for `tf_agents.replay_buffers`.
"""
# The public names load on first attribute access (PEP 562), all at once from replay_tf/_exports.py, so that
# importing the package or one of its submodules (e.g. `replay_tf.cli`, whose --help must not wait for
# TensorFlow) does not import TensorFlow. `from replay_tf import X`, `replay_tf.X`, `import *` and dir() work as if
# the names were imported here.
import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

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



def __getattr__(name: str):
    """Imports the submodule `name`, or loads every public name from replay_tf/_exports.py and returns one."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # A submodule loads alone: `from replay_tf import <submodule>` inside the package reaches here too, and
    # loading every public name from there would re-enter modules that are still initializing.
    if _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        return _importlib.import_module(f"{__name__}.{name}")
    if name in __all__:
        exports = _importlib.import_module(f"{__name__}._exports")  # imports TensorFlow
        namespace = globals()
        for public in __all__:
            if public not in namespace and hasattr(exports, public):
                namespace[public] = getattr(exports, public)
        if name in namespace:
            return namespace[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
