"""Decodes an episode's steps as stacked `[T, ...]` tensors instead of a nested `tf.data.Dataset`.

TFDS decodes `steps` (a `tfds.features.Dataset`) with `from_tensor_slices(...).map(decode_step)`: one nested
dataset and one decode call per step. The serialized steps are already stacked per field, so each field can be
decoded for all steps at once: plain tensors by a reshape/cast, BYTES tensors by one `decode_raw` over the whole
`[T]` string vector, ZLIB tensors by one bounded inflate per episode (see `_inflate_steps`). Other features
(images, text, ...) use the feature's own `decode_batch_example`, i.e. exactly what TFDS does for a
`tfds.features.Sequence`. Images whose frames may differ in size cannot be stacked: `load_steps` keeps them
encoded here and decodes them step by step after unbatching.
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

_Encoding = tfds.features.Encoding


def _inflate_steps(blobs: np.ndarray, dtype: np.dtype, shape: tuple, field: str) -> np.ndarray:
    """Inflates each step's ZLIB blob into a `[T, *shape]` array, never past the declared size.

    `tf.io.decode_compressed` inflates a blob whole before its size can be checked, so a few MiB of hostile
    data (a zlib bomb) would take GiB of memory. Here each blob may produce at most the bytes of one step of
    the declared shape and dtype, plus one byte to tell "too big" from "exact".
    """
    step_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    out = np.empty((len(blobs),) + shape, dtype=dtype)
    flat = out.reshape(len(blobs), -1).view(np.uint8) if out.size else None
    for i, blob in enumerate(blobs):
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(blob, step_bytes + 1)
        except zlib.error as e:
            raise ValueError(f"steps/{field}: step {i} is not a valid ZLIB stream ({e})") from e
        if len(data) > step_bytes:
            raise ValueError(f"steps/{field}: step {i} inflates to more than the {step_bytes} bytes its declared "
                             f"shape {list(shape)} and dtype {dtype.name} hold; the record is corrupt or hostile "
                             f"(inflating stopped there)")
        if not inflater.eof or inflater.unused_data or len(data) < step_bytes:
            raise ValueError(f"steps/{field}: step {i} inflates to {len(data)} bytes"
                             f"{'' if inflater.eof else ' (the ZLIB stream is cut short)'}"
                             f"{' followed by extra data' if inflater.unused_data else ''}; its declared shape "
                             f"{list(shape)} and dtype {dtype.name} hold {step_bytes} bytes")
        if flat is not None:
            flat[i] = np.frombuffer(data, dtype=np.uint8)
    return out


def variable_size_images(feature: Any, field: str = "") -> list[str]:
    """Paths ('observation/image') of the `tfds.features.Image`s in `feature` whose height or width is not fixed.

    Their frames may differ in size from step to step, so they cannot be stacked into `[T, H, W, C]`.
    """
    if isinstance(feature, tfds.features.FeaturesDict):
        return [path for name, sub in feature.items()
                for path in variable_size_images(sub, f"{field}/{name}" if field else name)]
    if isinstance(feature, tfds.features.Image) and None in tuple(feature.shape)[:2]:
        return [field]
    return []


def decode_step_fields(feature: Any, step: Any, paths: Sequence[str]) -> Any:
    """`step` with the fields at `paths` (kept encoded by `StackedSteps(keep_encoded=paths)`) decoded."""
    step = dict(step)
    for path in paths:
        names = path.split("/")
        parent, sub_feature = step, feature
        for name in names[:-1]:
            parent[name] = dict(parent[name])  # copies: the caller's nest is left as it is
            parent, sub_feature = parent[name], sub_feature[name]
        parent[names[-1]] = sub_feature[names[-1]].decode_example(parent[names[-1]])
    return step


def _decode_field(feature: Any, serialized: Any, field: str, keep_encoded: frozenset = frozenset()) -> Any:
    if field in keep_encoded:
        return serialized
    if isinstance(feature, tfds.features.FeaturesDict):
        return {name: _decode_field(sub, serialized[name], f"{field}/{name}" if field else name, keep_encoded)
                for name, sub in feature.items()}
    if type(feature) in (tfds.features.Tensor, tfds.features.Scalar):
        shape = tuple(feature.shape)
        encoding = feature._encoding  # pylint: disable=protected-access
        if encoding != _Encoding.NONE and all(d is not None and d >= 0 for d in shape):
            if encoding == _Encoding.ZLIB:
                # Stored little endian (what `decode_raw` reads by default and TFDS writes).
                dtype = np.dtype(feature.np_dtype).newbyteorder("<")
                values = tf.numpy_function(lambda blobs: _inflate_steps(blobs, dtype, shape, field),
                                           [serialized], feature.tf_dtype, stateful=False)
                values.set_shape((None,) + shape)
                return values
            values = tf.io.decode_raw(serialized, feature.tf_dtype, fixed_length=None)
            return tf.reshape(values, (-1,) + shape)
    return feature.decode_batch_example(serialized)


class StackedSteps(tfds.decode.Decoder):
    """A TFDS decoder for the `steps` feature that yields a dict of `[T, ...]` tensors.

    Args:
      keep_encoded: paths of step fields (`'observation/image'`) left as their serialized `[T]` strings, for
        fields that cannot be stacked (see `variable_size_images`) and are decoded per step later.
    """

    def __init__(self, keep_encoded: Sequence[str] = ()):
        super().__init__()
        self._keep_encoded = frozenset(keep_encoded)

    @property
    def dtype(self):
        # `tf_dtype` where TFDS has it (>= 4.9.5 deprecates `TensorInfo.dtype`, which logs a notice).
        dtypes = tf.nest.map_structure(lambda info: getattr(info, "tf_dtype", None) or info.dtype,
                                       self.feature.feature.get_tensor_info())
        for path in self._keep_encoded:
            *parents, name = path.split("/")
            nest = dtypes
            for parent in parents:
                nest = nest[parent]
            nest[name] = tf.string
        return dtypes

    def decode_example(self, serialized_example):
        return _decode_field(self.feature.feature, serialized_example, "", self._keep_encoded)
