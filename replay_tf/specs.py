"""Nest and `tf.TensorSpec` plumbing shared by every part of replay_tf.

One place for: flattening a nest with readable paths, checking that a nest of values matches a nest of
specs (structure, dtype, shape, outer dimensions) with errors that name the nested path, the expected
and the received value, and small spec helpers (adding outer dimensions, bytes per item).

Paths are written the way a user would index the nest: `items[1]['camera']`, `items.observation`.

>>> import tensorflow as tf
>>> spec = {'obs': tf.TensorSpec([2], tf.float32), 'act': tf.TensorSpec([], tf.int32)}
>>> [p for p, _ in flatten_with_paths(spec, root='items')]
["items['act']", "items['obs']"]
>>> flat = validate({'obs': tf.zeros([4, 2]), 'act': tf.zeros([4], tf.int32)}, spec, outer_dims=[4])
>>> [t.shape.as_list() for t in flat]
[[4], [4, 2]]
>>> validate({'obs': tf.zeros([4, 3]), 'act': tf.zeros([4], tf.int32)}, spec, outer_dims=[4])
Traceback (most recent call last):
...
ValueError: items['obs']: expected shape [4, 2] (outer dims [4] + spec shape [2]), got [4, 3]
"""
from __future__ import annotations

import collections.abc
from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from rlds_tf.nests import FieldName, format_path

__all__ = [
    "add_outer_dims",
    "assert_same_structure",
    "describe",
    "flatten",
    "flatten_with_paths",
    "has_lists",
    "is_namedtuple",
    "nbytes",
    "outer_shape",
    "pack_sequence_as",
    "validate",
]


def is_namedtuple(value: Any) -> bool:
    """True for instances of `collections.namedtuple` / `typing.NamedTuple` classes."""
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def has_lists(nest: Any) -> bool:
    """Whether `nest` holds a list anywhere (TF-Agents' check: tf.data would read it as one tensor)."""
    if isinstance(nest, list):
        return True
    if isinstance(nest, collections.abc.Mapping):
        return any(map(has_lists, nest.values()))
    return isinstance(nest, tuple) and any(map(has_lists, nest))


def _is_mapping(value: Any) -> bool:
    return isinstance(value, collections.abc.Mapping)


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def _children(node: Any) -> list[tuple[Any, Any]]:
    """(key, child) pairs in `tf.nest` flattening order: sorted keys for mappings, positions otherwise."""
    if _is_mapping(node):
        return [(key, node[key]) for key in sorted(node)]
    if is_namedtuple(node):
        return [(name, getattr(node, name)) for name in node._fields]
    return list(enumerate(node))


def _walk(node: Any, path: tuple) -> list[tuple[tuple, Any]]:
    if _is_mapping(node) or _is_sequence(node):
        out = []
        named = is_namedtuple(node)
        for key, child in _children(node):
            out.extend(_walk(child, path + ((FieldName(key) if named else key),)))
        return out
    return [(path, node)]


def flatten_with_paths(nest: Any, root: str = "") -> list[tuple[str, Any]]:
    """`[(path_string, leaf)]` in `tf.nest.flatten` order (dict keys sorted), paths as subscripts."""
    return [(format_path(path, notation="subscripts", root=root), leaf) for path, leaf in _walk(nest, ())]


def flatten(nest: Any) -> list[Any]:
    """The leaves of `nest` in `tf.nest.flatten` order."""
    return tf.nest.flatten(nest)


def pack_sequence_as(structure: Any, flat: Sequence[Any]) -> Any:
    """Inverse of `flatten` for `structure`'s shape."""
    return tf.nest.pack_sequence_as(structure, list(flat))


def _kind(node: Any) -> str:
    if _is_mapping(node):
        return f"a mapping with keys {sorted(node)}"
    if is_namedtuple(node):
        return f"a {type(node).__name__} with fields {list(node._fields)}"
    if _is_sequence(node):
        return f"a {type(node).__name__} of length {len(node)}"
    return f"a leaf ({_short(node)})"


def _short(value: Any) -> str:
    if isinstance(value, tf.TensorSpec):
        return f"TensorSpec(shape={value.shape.as_list() if value.shape.rank is not None else None}, " \
               f"dtype={value.dtype.name})"
    if isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        shape = list(value.shape) if not isinstance(value, (tf.Tensor, tf.Variable)) else (
            value.shape.as_list() if value.shape.rank is not None else None)
        return f"{type(value).__name__} shape={shape} dtype={tf.as_dtype(value.dtype).name}"
    return type(value).__name__


def _structure_mismatch(expected: Any, got: Any, path: tuple, root: str) -> str | None:
    """A message for the first place where `got` does not have `expected`'s structure, else None."""
    where = format_path(path, notation="subscripts", root=root)
    exp_nested = _is_mapping(expected) or _is_sequence(expected)
    got_nested = _is_mapping(got) or _is_sequence(got)
    if not exp_nested:
        if got_nested:
            return f"{where}: expected {_kind(expected)}, got {_kind(got)}"
        return None
    if not got_nested or _is_mapping(expected) != _is_mapping(got):
        return f"{where}: expected {_kind(expected)}, got {_kind(got)}"
    if _is_mapping(expected):
        if set(expected) != set(got):
            missing = sorted(set(expected) - set(got), key=str)
            extra = sorted(set(got) - set(expected), key=str)
            return (f"{where}: expected keys {sorted(expected, key=str)}, got {sorted(got, key=str)} "
                    f"(missing {missing}, unexpected {extra})")
    elif len(expected) != len(got):
        return f"{where}: expected {_kind(expected)}, got {_kind(got)}"
    named = is_namedtuple(expected)
    for (key, exp_child), (_, got_child) in zip(_children(expected), _children(got)):
        piece = FieldName(key) if named else key
        message = _structure_mismatch(exp_child, got_child, path + (piece,), root)
        if message:
            return message
    return None


def assert_same_structure(value: Any, spec: Any, *, root: str = "items") -> None:
    """Raises `TypeError` naming the first nested path where `value`'s structure differs from `spec`'s.

    Mappings must have the same keys; sequences (tuple, list, namedtuple) the same length. A list where
    the spec has a tuple is accepted (both flatten the same way).
    """
    message = _structure_mismatch(spec, value, (), root)
    if message:
        raise TypeError(f"structure mismatch at {message}")


def _dims(shape: tf.TensorShape) -> list | None:
    return None if shape.rank is None else shape.as_list()


def validate(values: Any, spec: Any, *, outer_dims: Sequence[int | None] = (), root: str = "items",
             convert: bool = True, cast: bool = False) -> list[tf.Tensor]:
    """Checks `values` against `spec` and returns the flat list of tensors, in `flatten(spec)` order.

    Every leaf must have dtype `spec.dtype` (no silent casts: numpy/Python leaves are converted with the
    spec's dtype as a hint, then checked; with `cast`, they are cast to it instead) and shape
    `outer_dims + spec.shape`. An `outer_dims` entry of None accepts any size, but every leaf must then
    agree on it. Checks use static shapes, so they run at
    trace time inside `tf.function`; unknown static dimensions are left for the caller to check at run
    time (see `outer_shape`).

    Args:
      values: a nest of tensors, arrays or Python values.
      spec: the matching nest of `tf.TensorSpec` (for one item, without outer dimensions).
      outer_dims: the expected leading dimensions, e.g. `[batch_size]`.
      root: the name of `values` used in error messages.
      convert: convert leaves to tensors (True) or keep them as given (False; they must have `.dtype`
        and `.shape`).
      cast: cast numpy arrays and Python values to the spec's dtype as numpy casts (`astype`: 1.7 -> 1 for
        an int spec), as TF-Agents' buffers store them; tensors of another dtype are still an error.

    Raises:
      TypeError: wrong structure or dtype (the message names the nested path, expected and got).
      ValueError: wrong rank or shape.
    """
    assert_same_structure(values, spec, root=root)
    outer_dims = list(outer_dims)
    spec_leaves = flatten_with_paths(spec, root)
    value_leaves = flatten(values)
    out = []
    seen_outer: list[tuple[str, int] | None] = [None] * len(outer_dims)
    for (where, leaf_spec), value in zip(spec_leaves, value_leaves):
        if not isinstance(leaf_spec, tf.TensorSpec):
            raise TypeError(f"spec at {where} must be a tf.TensorSpec, got {type(leaf_spec).__name__}")
        if convert and not isinstance(value, (tf.Tensor, tf.Variable)):
            if cast:
                value = _cast(value, leaf_spec.dtype, where)
            elif hasattr(value, "dtype") and tf.as_dtype(value.dtype) != leaf_spec.dtype:
                # numpy arrays keep their dtype: a float64 array for a float32 spec is an error, not a cast.
                raise TypeError(f"{where}: expected dtype {leaf_spec.dtype.name}, got "
                                f"{tf.as_dtype(value.dtype).name} (cast it before adding)")
            else:
                value = _as_tensor(value, leaf_spec.dtype, where)
        if tf.as_dtype(value.dtype) != leaf_spec.dtype:
            raise TypeError(f"{where}: expected dtype {leaf_spec.dtype.name}, got "
                            f"{tf.as_dtype(value.dtype).name} (cast it before adding)")
        shape = tf.TensorShape(value.shape)
        spec_dims = _dims(leaf_spec.shape)
        expected_rank = len(outer_dims) + (leaf_spec.shape.rank or 0)
        expected_text = (f"{[d for d in outer_dims] + (spec_dims or [])} (outer dims {list(outer_dims)} "
                         f"+ spec shape {spec_dims})")
        if shape.rank is not None:
            if leaf_spec.shape.rank is not None and shape.rank != expected_rank:
                raise ValueError(f"{where}: expected shape {expected_text}, got {shape.as_list()} "
                                 f"(rank {shape.rank}, expected rank {expected_rank})")
            got = shape.as_list()
            for i, want in enumerate(outer_dims):
                if i >= len(got) or got[i] is None:
                    continue
                if want is not None and got[i] != want:
                    raise ValueError(f"{where}: expected shape {expected_text}, got {got} "
                                     f"(outer dimension {i} is {got[i]}, expected {want})")
                if want is None:
                    if seen_outer[i] is not None and seen_outer[i][1] != got[i]:
                        raise ValueError(f"{where}: outer dimension {i} is {got[i]}, but "
                                         f"{seen_outer[i][0]} has {seen_outer[i][1]}; all leaves must "
                                         f"agree")
                    seen_outer[i] = (where, got[i])
            if not tf.TensorShape(got[len(outer_dims):]).is_compatible_with(leaf_spec.shape):
                raise ValueError(f"{where}: expected shape {expected_text}, got {got}")
        out.append(value)
    return out


def _as_tensor(value: Any, dtype: tf.DType, where: str) -> tf.Tensor:
    """`value` converted to a tensor with `dtype` as a hint; TypeError naming `where` if it cannot be."""
    try:
        return tf.convert_to_tensor(value, dtype_hint=dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}: cannot convert {_short(value)} to a tensor of dtype {dtype.name}: {e}") from e


def _cast(value: Any, dtype: tf.DType, where: str) -> tf.Tensor:
    """A numpy array or Python value as a tensor of `dtype`, cast as numpy casts (`astype`); TypeError
    naming `where` if it cannot be."""
    if not dtype.is_numpy_compatible:
        return _as_tensor(value, dtype, where)
    array = np.asarray(value)
    try:
        return tf.convert_to_tensor(array.astype(dtype.as_numpy_dtype, copy=False), dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"{where}: cannot convert {type(value).__name__} of numpy dtype {array.dtype} to the "
                        f"spec's dtype {dtype.name}: {e}") from e


def outer_shape(flat_values: Sequence[tf.Tensor], num_outer_dims: int) -> tf.Tensor:
    """The leading `num_outer_dims` dimensions of the first leaf, as an int32 tensor (static if known)."""
    return tf.shape(flat_values[0])[:num_outer_dims]


def add_outer_dims(spec: Any, outer_dims: Sequence[int | None]) -> Any:
    """`spec` with `outer_dims` prepended to every leaf's shape (names kept)."""
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec(list(outer_dims) + s.shape.as_list(), s.dtype, s.name), spec)


def nbytes(spec: Any) -> int:
    """Bytes of one item of `spec` (all leaves, fully defined shapes)."""
    total = 0
    for where, leaf in flatten_with_paths(spec, "spec"):
        if not leaf.shape.is_fully_defined():
            raise ValueError(f"{where}: shape {_dims(leaf.shape)} must be fully defined to size storage")
        total += int(np.prod(leaf.shape.as_list(), dtype=np.int64)) * leaf.dtype.size
    return total


def describe(spec: Any, root: str = "") -> str:
    """One line per leaf: `path: dtype[shape]`, for error messages and reprs."""
    return "\n".join(f"{where}: {leaf.dtype.name}{_dims(leaf.shape)}"
                     for where, leaf in flatten_with_paths(spec, root))
