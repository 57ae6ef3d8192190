"""rlds_tf: RLDS episodes, recording, transformations and patterns on current TensorFlow.

`import rlds_tf as rlds` works for code written against `rlds`.
"""
# The public names load on first attribute access, all at once from rlds_tf/_exports.py (see
# rlds_tf.lazy_names), so that importing a submodule such as `rlds_tf.cli` does not import TensorFlow.
import typing as _typing

from rlds_tf import lazy_names

if _typing.TYPE_CHECKING:
    from rlds_tf._exports import *  # noqa: F401,F403

__all__ = [
    "ACTION",
    "ALIGNMENT",
    "BatchedEpisode",
    "BatchedStep",
    "CORE_STEP_FIELDS",
    "DISCOUNT",
    "EnvLogger",
    "Episode",
    "EpisodeWriter",
    "EpisodeFilterFn",
    "IS_FIRST",
    "IS_LAST",
    "IS_TERMINAL",
    "OBSERVATION",
    "REWARD",
    "STEPS",
    "Step",
    "StepFilterFn",
    "StepMapFn",
    "StepsToStepsFn",
    "TFDSBackendWriter",
    "build_episode",
    "build_step",
    "is_valid_rlds_dataset",
    "load",
    "load_stacked",
    "load_steps",
    "metadata",
    "patterns",
    "recording",
    "tfds",
    "transformations",
]

__getattr__, __dir__ = lazy_names.module_hooks(__name__, __all__, globals())
