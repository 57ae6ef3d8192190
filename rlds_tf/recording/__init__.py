"""Recording RLDS datasets: an EnvLogger-compatible wrapper, its TFDS backend, crash recovery, Catch."""
from rlds_tf.recording import catch_env
from rlds_tf.recording import rlds_utils
from rlds_tf.recording.backend import StepData
from rlds_tf.recording.backend import TFDSBackendWriter
from rlds_tf.recording.catch_env import Catch
from rlds_tf.recording.config import config_from_env
from rlds_tf.recording.config import config_from_specs
from rlds_tf.recording.crash_recovery import needs_recovery
from rlds_tf.recording.crash_recovery import recover
from rlds_tf.recording.env_logger import EnvLogger
from rlds_tf.recording.tfds_writer import DatasetConfig
from rlds_tf.recording.tfds_writer import DatasetWriter

__all__ = [
    "Catch",
    "DatasetConfig",
    "DatasetWriter",
    "EnvLogger",
    "StepData",
    "TFDSBackendWriter",
    "catch_env",
    "config_from_env",
    "config_from_specs",
    "needs_recovery",
    "recover",
    "rlds_utils",
]
