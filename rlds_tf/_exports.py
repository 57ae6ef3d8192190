"""The public names of `rlds_tf`, imported all at once by `rlds_tf.__getattr__` on first access.

Add a public name here and to `rlds_tf.__all__`.
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
