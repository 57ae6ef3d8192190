"""`LazyDatasetV1`: a `tf.compat.v1.data.Dataset` whose pipeline is built where it is first used in a TF1 graph.

Reverb's datasets are `tf.compat.v1.data.Dataset`s made of one op each: TF1 code calls
`dataset.make_one_shot_iterator()` or `make_initializable_iterator()` on them (also after `.batch()` and the
other v1 methods, which return v1 datasets), and building one in a graph creates no function, so the TF
runtime stays uninitialized (a later `tf.config.set_logical_device_configuration` still works). Ours run
Python through `tf.data` functions, and tracing a function initializes the runtime. So in a TF1 graph
(not eagerly, not inside a `tf.function`) the pipeline is built when its variant tensor is first needed
(an iterator, or a transformation taking the dataset as input), in the graph the dataset was made in;
eagerly and inside a `tf.function` it is built at once. `batch` (with a Python int size) and `prefetch`
return lazy datasets too; other transformations applied in the graph (`map`, `repeat`, ...) take the
variant tensor, so they build the pipeline, and start the runtime, when applied.
"""
from __future__ import annotations

import abc
from typing import Any

import numpy as np
import tensorflow as tf


def in_tf1_graph() -> bool:
    """Whether ops are being added to a TF1 graph (not run eagerly, not traced into a `tf.function`)."""
    return not tf.executing_eagerly() and not tf.inside_function()


class LazyDatasetV1(tf.compat.v1.data.Dataset):
    """A v1 dataset whose pipeline (`_build_dataset`) is built lazily in TF1 graphs (see the module doc).

    Subclasses set everything `_build_dataset` and `element_spec` need, then call `super().__init__()`.
    """

    def __init__(self):
        self._built = None
        super().__init__()

    @abc.abstractmethod
    def _build_dataset(self) -> tf.data.Dataset:
        """The pipeline this dataset stands for (a `tf.data.Dataset` with this `element_spec`)."""

    def _as_variant_tensor(self):
        return None if in_tf1_graph() else self._built_dataset()._variant_tensor

    def _built_dataset(self) -> tf.data.Dataset:
        # (kept: its Python functions are registered with TensorFlow by weak reference)
        if self._built is None:
            self._built = self._build_dataset()
        return self._built

    @property
    def _variant_tensor(self):
        if self._variant_tensor_attr is None:
            with self._graph_attr.as_default():
                self._variant_tensor_attr = self._built_dataset()._variant_tensor
        return self._variant_tensor_attr

    def _inputs(self) -> list:
        return []

    def batch(self, batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        """`tf.compat.v1.data.Dataset.batch`; lazy in a TF1 graph when `batch_size` is a Python int."""
        def build():
            return tf.compat.v1.data.Dataset.batch(self, batch_size, drop_remainder=drop_remainder,
                                                   num_parallel_calls=num_parallel_calls,
                                                   deterministic=deterministic, name=name)

        if not in_tf1_graph() or not isinstance(batch_size, (int, np.integer)) or not isinstance(
                drop_remainder, bool):
            return build()
        size = int(batch_size) if drop_remainder else None
        return DatasetV1(build, tf.nest.map_structure(
            lambda spec: tf.TensorSpec(tf.TensorShape([size]).concatenate(spec.shape), spec.dtype),
            self.element_spec))

    def prefetch(self, buffer_size, name=None):
        """`tf.compat.v1.data.Dataset.prefetch`; lazy in a TF1 graph."""
        def build():
            return tf.compat.v1.data.Dataset.prefetch(self, buffer_size, name=name)

        return DatasetV1(build, self.element_spec) if in_tf1_graph() else build()

    @property
    @abc.abstractmethod
    def element_spec(self) -> Any:
        """The spec of one element (known without building the pipeline)."""


class DatasetV1(LazyDatasetV1):
    """`LazyDatasetV1` over a pipeline that `build` returns, with elements of `element_spec`."""

    def __init__(self, build, element_spec: Any):
        self._build = build
        self._element_spec = element_spec
        super().__init__()

    def _build_dataset(self) -> tf.data.Dataset:
        return self._build()

    @property
    def element_spec(self) -> Any:
        return self._element_spec
