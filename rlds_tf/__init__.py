"""rlds_tf: RLDS episodes, recording, transformations and patterns on current TensorFlow.

`import rlds_tf as rlds` works for code written against `rlds`.
"""
from rlds_tf import metadata
from rlds_tf import patterns
from rlds_tf import recording
from rlds_tf import tfds
from rlds_tf import transformations
from rlds_tf.loading import load
from rlds_tf.loading import load_stacked
from rlds_tf.loading import load_steps
from rlds_tf.recording import EnvLogger
from rlds_tf.recording import TFDSBackendWriter
from rlds_tf.tfds import EpisodeWriter
from rlds_tf.rlds_types import ACTION
from rlds_tf.rlds_types import ALIGNMENT
from rlds_tf.rlds_types import BatchedEpisode
from rlds_tf.rlds_types import BatchedStep
from rlds_tf.rlds_types import CORE_STEP_FIELDS
from rlds_tf.rlds_types import DISCOUNT
from rlds_tf.rlds_types import Episode
from rlds_tf.rlds_types import EpisodeFilterFn
from rlds_tf.rlds_types import IS_FIRST
from rlds_tf.rlds_types import IS_LAST
from rlds_tf.rlds_types import IS_TERMINAL
from rlds_tf.rlds_types import OBSERVATION
from rlds_tf.rlds_types import REWARD
from rlds_tf.rlds_types import STEPS
from rlds_tf.rlds_types import Step
from rlds_tf.rlds_types import StepFilterFn
from rlds_tf.rlds_types import StepMapFn
from rlds_tf.rlds_types import StepsToStepsFn
from rlds_tf.rlds_types import build_episode
from rlds_tf.rlds_types import build_step
from rlds_tf.rlds_types import is_valid_rlds_dataset

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
