"""Dataset configs inferred from environment specs (dm_env specs or gymnasium spaces) and metadata samples.

>>> from rlds_tf.recording.catch_env import Catch
>>> config = config_from_env(Catch(), name='catch')
>>> config.observation_info.shape, config.action_info, config.reward_info, config.discount_info
((10, 5), tf.int64, tf.float64, tf.float64)
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
import tensorflow_datasets as tfds

from rlds_tf.tfds import config_generator

DatasetConfig = tfds.rlds.rlds_base.DatasetConfig


def _spec_to_feature(spec: Any, field_name: str, use_images: bool, image_encoding: str) -> Any:
    """A dm_env spec nest, a gymnasium space, or sample data -> TFDS feature."""
    spec = _space_to_spec(spec)
    return config_generator.extract_feature_from_data(spec, use_images, image_encoding, field_name,
                                                      squeeze_scalars=False)


class _Spec:
    """shape + dtype, enough for `extract_feature_from_data`."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)


def _space_to_spec(space: Any) -> Any:
    """Turns gymnasium spaces into `_Spec` nests; everything else passes through."""
    try:
        import gymnasium
    except ImportError:  # gymnasium is optional
        return space
    spaces = gymnasium.spaces
    if isinstance(space, spaces.Dict):
        return {k: _space_to_spec(v) for k, v in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        raise ValueError(f"gymnasium Tuple spaces cannot be stored in TFDS ({space}); wrap the env so it uses a "
                         f"Dict space, or pass ds_config explicitly")
    if isinstance(space, spaces.Discrete):
        return _Spec((), np.int64)
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        return _Spec(space.shape, space.dtype)
    if isinstance(space, spaces.Space):
        raise ValueError(f"cannot infer a TFDS feature from the gymnasium space {space}; pass ds_config")
    return space


def config_from_specs(*, name: str, observation_spec: Any, action_spec: Any, reward_spec: Any,
                      discount_spec: Any, step_metadata_sample: Optional[Mapping[str, Any]] = None,
                      episode_metadata_sample: Optional[Mapping[str, Any]] = None, use_images: bool = True,
                      image_encoding: str = "png") -> DatasetConfig:
    """Builds a `DatasetConfig` from the four specs and one sample of step/episode metadata (or None)."""
    def feature(spec, field):
        return _spec_to_feature(spec, field, use_images, image_encoding)

    return DatasetConfig(
        name=name,
        observation_info=feature(observation_spec, "observation"),
        action_info=feature(action_spec, "action"),
        reward_info=feature(reward_spec, "reward"),
        discount_info=feature(discount_spec, "discount"),
        step_metadata_info={k: feature(sample_spec(v), k) for k, v in (step_metadata_sample or {}).items()},
        episode_metadata_info={k: feature(sample_spec(v), k)
                               for k, v in (episode_metadata_sample or {}).items()},
    )


def sample_spec(value: Any) -> Any:
    """The spec of one sample value (a step field, a metadata value): a nest of shapes and dtypes, strings kept
    as they are; Python ints/floats/bools map to int64/float64/bool like numpy does."""
    if isinstance(value, dict):
        return {k: sample_spec(v) for k, v in value.items()}
    if isinstance(value, (str, bytes)):
        return value
    array = np.asarray(value)
    return _Spec(array.shape, array.dtype)


def config_from_env(env: Any, *, name: str = "default_config", step_metadata_sample=None,
                    episode_metadata_sample=None, use_images: bool = True,
                    image_encoding: str = "png") -> DatasetConfig:
    """`config_from_specs` for a `dm_env.Environment` or a `gymnasium.Env`.

    gymnasium envs have no reward/discount specs: both are float64 scalars (discount 0 on termination).
    """
    if hasattr(env, "observation_spec"):
        return config_from_specs(
            name=name, observation_spec=env.observation_spec(), action_spec=env.action_spec(),
            reward_spec=env.reward_spec(), discount_spec=env.discount_spec(),
            step_metadata_sample=step_metadata_sample, episode_metadata_sample=episode_metadata_sample,
            use_images=use_images, image_encoding=image_encoding)
    if hasattr(env, "observation_space"):
        scalar = _Spec((), np.float64)
        return config_from_specs(
            name=name, observation_spec=env.observation_space, action_spec=env.action_space,
            reward_spec=scalar, discount_spec=scalar, step_metadata_sample=step_metadata_sample,
            episode_metadata_sample=episode_metadata_sample, use_images=use_images,
            image_encoding=image_encoding)
    raise TypeError(f"cannot infer a dataset config from {type(env).__name__}: expected a dm_env.Environment "
                    f"or a gymnasium.Env; pass ds_config explicitly")


