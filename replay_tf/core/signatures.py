"""A table signature as the columns an item must have: what the table checks on insert, and the writers
check before they send an item.

A signature is a nest of `tf.TensorSpec`; its entries are its leaves in `tree.flatten` order, one per column
of an item, each with the column's name (its path with slashes), numpy dtype and shape (None dimensions
match any size).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from rlds_tf.nests import format_path


def signature_entries(signature: Any) -> list:
    """`(path, numpy dtype, shape, spec)` per flattened leaf; ValueError for leaves that are not TensorSpecs."""
    import tensorflow as tf  # noqa: PLC0415  (only tables with a signature need TF)
    import tree  # noqa: PLC0415

    entries = []
    for path, spec in tree.flatten_with_path(signature):
        if not isinstance(spec, tf.TensorSpec):
            raise ValueError(f"Unsupported signature spec: {spec}")
        dtype = np.dtype(object) if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
        shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
        entries.append((format_path(path), dtype, shape, spec))
    return entries


def shape_compatible(expected: Optional[tuple], got: tuple) -> bool:
    """Whether a column of shape `got` fits an entry's shape `expected` (None: any shape or dimension)."""
    if expected is None or expected == got:
        return True
    return len(expected) == len(got) and all(e is None or e == g for e, g in zip(expected, got))
