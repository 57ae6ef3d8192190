"""TFDS helpers for RLDS data (the `rlds.tfds` API): episode writer and config generation."""
from rlds_tf.tfds.config_generator import extract_feature_from_data
from rlds_tf.tfds.config_generator import generate_config_from_spec
from rlds_tf.tfds.episode_writer import EpisodeWriter

__all__ = [
    "EpisodeWriter",
    "extract_feature_from_data",
    "generate_config_from_spec",
]
