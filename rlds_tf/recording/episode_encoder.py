"""Turns RLDS episodes into the serialized `tf.train.Example` that TFDS writes for them.

TFDS's generic path (`FeaturesDict.encode_example` + `ExampleSerializer`) validates and converts every step
field through several Python layers; for the plain tensor features that recorded RL data uses (numeric and bool
tensors of static shape, optionally ZLIB/BYTES encoded) this module builds the identical `tf.train.Example`
straight from stacked numpy arrays. Any other feature (images, text, class labels, sequences, dynamic shapes)
makes the whole episode go through TFDS's own encoder, so the bytes on disk are always what TFDS would write.

Steps are checked as they arrive, so a field that changes shape or dtype mid-recording is reported with its
path, the expected and the received shape/dtype, before anything reaches the disk.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import tensorflow_datasets as tfds
from tensorflow.core.example import example_pb2
from tensorflow.core.example import feature_pb2
from tensorflow_datasets.core import example_serializer

from rlds_tf import rlds_types

_Encoding = tfds.features.Encoding


class _Leaf:
    """One tensor field: where it lives in a step/episode, what TFDS expects, and how it is written."""

    __slots__ = ("path", "key", "dtype", "shape", "encoding", "values")

    def __init__(self, path: tuple[str, ...], key: str, feature: tfds.features.Tensor):
        self.path = path
        self.key = key
        self.dtype = np.dtype(feature.np_dtype)
        self.shape = tuple(feature.shape)
        self.encoding = getattr(feature, "_encoding", _Encoding.NONE)  # pylint: disable=protected-access
        self.values: list[np.ndarray] = []

    def convert(self, value: Any, where: str) -> np.ndarray:
        """Validates one value the way `tfds.features.Tensor.encode_example` does, with a precise error."""
        if isinstance(value, np.ndarray):
            if value.dtype != self.dtype:
                raise ValueError(f"{where}{'/'.join(self.path)}: dtype changed: expected {self.dtype} with shape "
                                 f"{self.shape}, got {value.dtype} with shape {value.shape}")
            array = value
        else:
            if self.dtype == np.bool_ and isinstance(value, str):
                raise TypeError(f"{where}{'/'.join(self.path)}: expected a bool, got the string {value!r}")
            try:
                array = np.asarray(value, dtype=self.dtype)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}{'/'.join(self.path)}: cannot convert {value!r} to {self.dtype} "
                                 f"with shape {self.shape}") from e
        if array.shape != self.shape:
            raise ValueError(f"{where}{'/'.join(self.path)}: shape changed: expected {self.shape} with dtype "
                             f"{self.dtype}, got {array.shape} with dtype {array.dtype}")
        return array

    def feature(self, arrays: Sequence[np.ndarray] | np.ndarray, stacked: bool) -> feature_pb2.Feature:
        """The `tf.train.Feature` TFDS writes for these values (one per step when `stacked`)."""
        if self.encoding != _Encoding.NONE:
            items = arrays if stacked else [arrays]
            blobs = [np.ascontiguousarray(a).tobytes() for a in items]
            if self.encoding == _Encoding.ZLIB:
                blobs = [zlib.compress(b) for b in blobs]
            return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=blobs))
        if stacked:
            flat = np.stack(arrays) if len(arrays) else np.zeros((0,) + self.shape, self.dtype)
        else:
            flat = arrays
        flat = np.ravel(flat)
        if flat.dtype == np.bool_:
            flat = flat.astype(np.int64)
        elif flat.dtype == np.uint64:
            flat = flat.view(np.int64)
        if flat.dtype.kind in "iu":
            return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=flat))
        return feature_pb2.Feature(float_list=feature_pb2.FloatList(value=flat))


def _is_fast_tensor(feature: Any) -> bool:
    """A static-shape numeric/bool `Tensor` (incl. scalars) that the fast path writes exactly like TFDS."""
    if type(feature) not in (tfds.features.Tensor, tfds.features.Scalar):
        return False
    if any(d is None or d < 0 for d in feature.shape):
        return False
    dtype = np.dtype(feature.np_dtype)
    if dtype.kind not in "biuf":
        return False
    return True


def _collect_leaves(feature: Any, path: tuple[str, ...], out: list[_Leaf], prefix: str) -> bool:
    """Appends the leaves of a (nested) FeaturesDict; False if one of them needs TFDS's generic encoder."""
    if isinstance(feature, tfds.features.FeaturesDict):
        for name, sub in feature.items():
            if not _collect_leaves(sub, path + (name,), out, prefix):
                return False
        return True
    if _is_fast_tensor(feature):
        out.append(_Leaf(path, prefix + "/".join(path), feature))
        return True
    return False


def _collect_checkable(feature: Any, path: tuple[str, ...], out: list[_Leaf]) -> None:
    """Leaves with a static shape and a numeric dtype (Tensor, Image, ...): enough to validate steps early."""
    if isinstance(feature, tfds.features.FeaturesDict):
        for name, sub in feature.items():
            _collect_checkable(sub, path + (name,), out)
        return
    shape, dtype = getattr(feature, "shape", None), getattr(feature, "np_dtype", None)
    if (isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape) and dtype is not None
            and np.dtype(dtype).kind in "biuf"):
        out.append(_Leaf(path, "", feature))


def _getter(path: tuple[str, ...]) -> Callable[[Mapping[str, Any]], Any]:
    if len(path) == 1:
        key = path[0]
        return lambda d: d[key]

    def get(d):
        for key in path:
            d = d[key]
        return d
    return get


class EpisodeEncoder:
    """Accumulates the steps of one episode at a time and serializes it as TFDS would.

    Args:
      features: the episode `FeaturesDict` (`{'steps': Dataset(...), **episode_metadata}`).
    """

    def __init__(self, features: tfds.features.FeaturesDict):
        self._features = features
        self._serializer = example_serializer.ExampleSerializer(features.get_serialized_info())
        steps_feature = features[rlds_types.STEPS]
        self._step_leaves: list[_Leaf] = []
        self._episode_leaves: list[_Leaf] = []
        fast = isinstance(steps_feature, tfds.features.Dataset) and _collect_leaves(
            steps_feature.feature, (), self._step_leaves, f"{rlds_types.STEPS}/")
        for name, sub in features.items():
            if name != rlds_types.STEPS:
                fast = fast and _collect_leaves(sub, (name,), self._episode_leaves, "")
        self.fast = fast
        self._step_getters = [(leaf, _getter(leaf.path)) for leaf in self._step_leaves]
        # Features the fast path cannot write (images, text, ...) still get their shapes and dtypes checked
        # as steps arrive, so the error names the field; TFDS's encoder writes them at the end of the episode.
        self._check_getters = []
        if not fast and isinstance(steps_feature, tfds.features.Dataset):
            checkable: list[_Leaf] = []
            _collect_checkable(steps_feature.feature, (), checkable)
            self._check_getters = [(leaf, _getter(leaf.path)) for leaf in checkable]
        self._step_keys = self._top_keys(steps_feature.feature) if isinstance(
            steps_feature, tfds.features.Dataset) else set()
        self._raw_steps: list[Mapping[str, Any]] = []
        self.num_steps = 0

    @staticmethod
    def _top_keys(feature: Any) -> set[str]:
        return set(feature.keys()) if isinstance(feature, tfds.features.FeaturesDict) else set()

    def add_step(self, step: Mapping[str, Any]) -> None:
        """Validates and buffers one RLDS step of the open episode."""
        where = f"step {self.num_steps} of the episode: {rlds_types.STEPS}/"
        if set(step) != self._step_keys:
            missing, extra = sorted(self._step_keys - set(step)), sorted(set(step) - self._step_keys)
            raise ValueError(f"{where[:-len(rlds_types.STEPS) - 3]}: the step fields differ from the dataset "
                             f"config: missing {missing}, unexpected {extra}")
        if self.fast:
            converted = []
            for leaf, get in self._step_getters:
                try:
                    value = get(step)
                except (KeyError, TypeError) as e:
                    raise ValueError(f"{where}{'/'.join(leaf.path)}: missing from the step") from e
                converted.append(leaf.convert(value, where))
            for leaf, value in zip(self._step_leaves, converted):
                leaf.values.append(value)
        else:
            for leaf, get in self._check_getters:
                try:
                    value = get(step)
                except (KeyError, TypeError) as e:
                    raise ValueError(f"{where}{'/'.join(leaf.path)}: missing from the step") from e
                leaf.convert(value, where)
            self._raw_steps.append(step)
        self.num_steps += 1

    def discard(self) -> None:
        """Drops the open episode."""
        for leaf in self._step_leaves:
            leaf.values.clear()
        self._raw_steps = []
        self.num_steps = 0

    def serialize(self, episode_metadata: Mapping[str, Any] | None = None) -> bytes:
        """Serializes the open episode with its metadata and starts a new one."""
        episode_metadata = dict(episode_metadata or {})
        try:
            if not self.fast:
                example = rlds_types.build_episode(self._raw_steps, episode_metadata)
                try:
                    encoded = self._features.encode_example(example)
                except Exception as e:  # TFDS raises many types; rewrite in the user's terms.
                    raise ValueError(f"cannot encode the episode with the dataset features: {e}") from e
                return self._serializer.get_tf_example(encoded).SerializeToString(deterministic=True)
            expected = {name for name in self._features.keys() if name != rlds_types.STEPS}
            if set(episode_metadata) != expected:
                raise ValueError(f"episode metadata keys {sorted(episode_metadata)} differ from the dataset "
                                 f"config's episode_metadata_info {sorted(expected)}")
            feature_map = {}
            for leaf in self._step_leaves:
                feature_map[leaf.key] = leaf.feature(leaf.values, stacked=True)
            for leaf in self._episode_leaves:
                value = leaf.convert(_getter(leaf.path)(episode_metadata), "episode metadata: ")
                feature_map[leaf.key] = leaf.feature(value, stacked=False)
            # deterministic: map entries sorted by key. Otherwise their order follows the process's string
            # hashing, so the same episode would give different bytes in two processes (or two Beam workers).
            example = example_pb2.Example(features=feature_pb2.Features(feature=feature_map))
            return example.SerializeToString(deterministic=True)
        finally:
            self.discard()
