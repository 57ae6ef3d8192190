"""Decodes an episode's steps as stacked `[T, ...]` tensors instead of a nested `tf.data.Dataset`.

TFDS decodes `steps` (a `tfds.features.Dataset`) with `from_tensor_slices(...).map(decode_step)`: one nested
dataset and one decode call per step. The serialized steps are already stacked per field, so each field can be
decoded for all steps at once: plain tensors by a reshape/cast, ZLIB/BYTES tensors by one `decode_compressed` +
`decode_raw` over the whole `[T]` string vector. Other features (images, text, ...) use the feature's own
`decode_batch_example`, i.e. exactly what TFDS does for a `tfds.features.Sequence`.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_datasets as tfds

_Encoding = tfds.features.Encoding


def _decode_field(feature: Any, serialized: Any) -> Any:
    if isinstance(feature, tfds.features.FeaturesDict):
        return {name: _decode_field(sub, serialized[name]) for name, sub in feature.items()}
    if type(feature) in (tfds.features.Tensor, tfds.features.Scalar):
        shape = tuple(feature.shape)
        encoding = feature._encoding  # pylint: disable=protected-access
        if encoding != _Encoding.NONE and all(d is not None and d >= 0 for d in shape):
            blobs = serialized
            if encoding == _Encoding.ZLIB:
                blobs = tf.io.decode_compressed(blobs, compression_type="ZLIB")
            values = tf.io.decode_raw(blobs, feature.tf_dtype, fixed_length=None)
            return tf.reshape(values, (-1,) + shape)
    return feature.decode_batch_example(serialized)


class StackedSteps(tfds.decode.Decoder):
    """A TFDS decoder for the `steps` feature that yields a dict of `[T, ...]` tensors."""

    @property
    def dtype(self):
        # `tf_dtype` where TFDS has it (>= 4.9.5 deprecates `TensorInfo.dtype`, which logs a notice).
        return tf.nest.map_structure(lambda info: getattr(info, "tf_dtype", None) or info.dtype,
                                     self.feature.feature.get_tensor_info())

    def decode_example(self, serialized_example):
        return _decode_field(self.feature.feature, serialized_example)
