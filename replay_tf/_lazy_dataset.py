"""`LazyDatasetV1`: a `tf.compat.v1.data.Dataset` whose pipeline is built where it is first used in a TF1 graph.

Reverb's datasets are `tf.compat.v1.data.Dataset`s made of one op each: TF1 code calls
`dataset.make_one_shot_iterator()` or `make_initializable_iterator()` on them (also after `.batch()` and the
other v1 methods, which return v1 datasets), and building one in a graph creates no function, so the TF
runtime stays uninitialized (a later `tf.config.set_logical_device_configuration` still works). Ours run
Python through `tf.data` functions, and tracing a function initializes the runtime. So in a TF1 graph
(not eagerly, not inside a `tf.function`) the pipeline is built when its variant tensor is first needed
(an iterator, or a transformation taking the dataset as input), in the graph the dataset was made in;
eagerly and inside a `tf.function` it is built at once. A transformation applied in the graph (`map`,
`TimestepDataset(...).batch`, ...) takes the variant tensor, so it builds the pipeline, and starts the
runtime, then; `TrajectoryDataset.batch` returns a lazy dataset of its own.
"""
from __future__ import annotations

import abc
from typing import Any

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
