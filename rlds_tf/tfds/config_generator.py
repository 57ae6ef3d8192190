"""TFDS features and `DatasetConfig`s from data or specs (the `rlds.tfds` helpers).

Same rules as rlds 0.1.8 except where rlds has a known gap, each noted below:
  * RGB/RGBA images: rlds only turned `(H, W, 1)` uint8 fields into `Image`; here any `(H, W, C)` that
    `tfds.features.Image` accepts for the chosen encoding (C in 1, 3 for png/jpeg; 4 for png) becomes one.
  * `tensor_encoding` reaches nested dicts too (rlds dropped it below the first level).
  * String scalars become `tfds.features.Text()` (rlds HEAD does this; 0.1.8 used `tf.string`).

>>> import numpy as np
>>> extract_feature_from_data({'image': np.zeros((8, 8, 3), np.uint8), 'x': np.float32(0)},
...                           use_images=True, image_encoding='png')['image'].shape
(8, 8, 3)
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from rlds_tf import rlds_types

_CORE_KEYS = rlds_types.CORE_STEP_FIELDS


def _shape_and_dtype(data: Any) -> tuple[tuple, tf.DType]:
    """(shape, dtype) of a tensor, array, spec (TensorSpec, dm_env.specs.Array) or Python scalar."""
    if hasattr(data, "shape") and hasattr(data, "dtype"):
        shape = tuple(tf.TensorShape(data.shape).as_list()) if data.shape is not None else ()
        return shape, tf.as_dtype(data.dtype)
    if isinstance(data, (str, bytes)):
        return (), tf.string
    array = np.asarray(data)
    return tuple(array.shape), tf.as_dtype(array.dtype)


def _is_image(shape: tuple, dtype: tf.DType, field_name: Optional[str], image_encoding: str) -> bool:
    if not field_name or ("image" not in field_name and "Image" not in field_name):
        return False
    if image_encoding not in ("png", "jpeg"):
        return False
    if shape == ():
        return dtype == tf.string  # an already encoded image
    if len(shape) != 3 or dtype != tf.uint8:
        return False
    channels = (1, 3, 4) if image_encoding == "png" else (1, 3)
    return shape[-1] in channels


def extract_feature_from_data(data: Any, use_images: bool, image_encoding: Optional[str],
                              field_name: Optional[str] = None, squeeze_scalars: bool = True,
                              convert_tuple_to_list: bool = False,
                              tensor_encoding: tfds.features.Encoding = tfds.features.Encoding.ZLIB) -> Any:
    """Maps a nest of tensors, arrays or specs to TFDS features.

    Args:
      data: nested dicts/lists of tensors, arrays, scalars or specs (anything with `shape` and `dtype`).
      use_images: encode uint8 `(H, W, C)` fields whose name contains `image`/`Image` as `tfds.features.Image`.
      image_encoding: `'png'` or `'jpeg'`, for the detected images.
      field_name: the field's name (used for image detection).
      squeeze_scalars: treat shape `(1,)` as a scalar.
      convert_tuple_to_list: accept tuples (stored as `Sequence`); otherwise tuples raise.
      tensor_encoding: encoding of non-scalar `tfds.features.Tensor`s.

    Returns:
      A `FeaturesDict`, `Sequence`, `Image`, `Text`, `Tensor` or a `tf.DType` (scalars), mirroring `data`.

    Raises:
      ValueError: tuples without `convert_tuple_to_list`, or empty lists.
    """
    recurse = dict(use_images=use_images, image_encoding=image_encoding, squeeze_scalars=squeeze_scalars,
                   convert_tuple_to_list=convert_tuple_to_list, tensor_encoding=tensor_encoding)
    if isinstance(data, dict):
        return tfds.features.FeaturesDict({k: extract_feature_from_data(v, field_name=k, **recurse)
                                           for k, v in data.items()})
    if isinstance(data, tuple) and not hasattr(data, "shape"):
        if not convert_tuple_to_list:
            raise ValueError(f"field {field_name!r}: tuples are not supported in TFDS; use dicts or lists, "
                             f"or pass convert_tuple_to_list=True")
        data = list(data)
    if isinstance(data, list):
        if not data:
            raise ValueError(f"field {field_name!r}: cannot infer a feature from an empty list")
        return tfds.features.Sequence(feature=extract_feature_from_data(data[0], field_name=field_name, **recurse))
    shape, dtype = _shape_and_dtype(data)
    if use_images and _is_image(shape, dtype, field_name, image_encoding or ""):
        if shape == ():
            return tfds.features.Image(encoding_format=image_encoding)
        return tfds.features.Image(shape=shape, dtype=np.uint8, encoding_format=image_encoding)
    if shape == () or (squeeze_scalars and shape == (1,)):
        if dtype == tf.string:
            return tfds.features.Text()
        return dtype
    return tfds.features.Tensor(shape=shape, dtype=dtype, encoding=tensor_encoding)


def generate_config_from_spec(episode_spec: Any, name: str = "default_config", use_images: bool = True,
                              image_encoding: str = "png") -> tfds.rlds.rlds_base.DatasetConfig:
    """Builds a `DatasetConfig` from an RLDS episode spec (e.g. `episodes.element_spec`).

    Top-level keys other than `steps` become episode metadata; step keys other than the core RLDS fields become
    step metadata.

    >>> steps = tf.data.DatasetSpec({'observation': tf.TensorSpec((3,), tf.float32),
    ...     'action': tf.TensorSpec((), tf.int64), 'reward': tf.TensorSpec((), tf.float32),
    ...     'discount': tf.TensorSpec((), tf.float32), 'is_first': tf.TensorSpec((), tf.bool),
    ...     'is_last': tf.TensorSpec((), tf.bool), 'is_terminal': tf.TensorSpec((), tf.bool),
    ...     't': tf.TensorSpec((), tf.int64)})
    >>> config = generate_config_from_spec({'steps': steps, 'episode_id': tf.TensorSpec((), tf.int64)})
    >>> sorted(config.step_metadata_info), sorted(config.episode_metadata_info)
    (['t'], ['episode_id'])
    """
    def extract(value, key=None):
        return extract_feature_from_data(value, use_images, image_encoding, key)

    steps = episode_spec[rlds_types.STEPS]
    step_spec = steps.element_spec if hasattr(steps, "element_spec") else steps
    return tfds.rlds.rlds_base.DatasetConfig(
        name=name,
        observation_info=extract(step_spec[rlds_types.OBSERVATION], rlds_types.OBSERVATION),
        action_info=extract(step_spec[rlds_types.ACTION], rlds_types.ACTION),
        reward_info=extract(step_spec[rlds_types.REWARD], rlds_types.REWARD),
        discount_info=(extract(step_spec[rlds_types.DISCOUNT], rlds_types.DISCOUNT)
                       if rlds_types.DISCOUNT in step_spec else None),
        step_metadata_info={k: extract(v, k) for k, v in step_spec.items() if k not in _CORE_KEYS},
        episode_metadata_info={k: extract(v, k) for k, v in episode_spec.items() if k != rlds_types.STEPS},
    )
