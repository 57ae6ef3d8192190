"""Which leaves of written data can be tensors: the check dm-reverb's writers get from pybind.

dm-reverb converts every leaf of an appended step (`TrajectoryWriter.append`, `StructuredWriter.append`,
`Client.insert`) to a `tensorflow::Tensor` and raises TypeError for a leaf that does not convert: None (where
`None` is not "column not set in this step"), arbitrary objects, sets, `Decimal`s, ragged tensors, object
arrays holding anything but str/bytes, datetimes, structured arrays. The writers convert each leaf with
`leaf_array`, which calls `check_leaf` only when the leaf's numpy dtype kind is not in `TENSOR_KINDS`, so
numbers, arrays and tensors pay one `dtype.kind` lookup.

>>> import numpy as np
>>> check_leaf(np.asarray({1, 2}), {1, 2}, ('obs', 0), 'the appended step')  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
TypeError: Field ['obs'][0] of the appended step must be a tensor, numpy array, ..., got set ({1, 2})
"""
from __future__ import annotations

import collections.abc
import reprlib
from typing import Any, Dict, Optional

import numpy as np

from rlds_tf.nests import format_path

#: numpy dtype kinds that are tensors as they are: bool, signed, unsigned, float, complex, str, bytes.
TENSOR_KINDS = frozenset("biufcUS")

_EXPECTED = "a tensor, numpy array, Python number, bool, str or bytes"
_repr = reprlib.Repr()
_repr.maxother = _repr.maxstring = 80


def to_array(value: Any) -> np.ndarray:
    """A leaf as a numpy array (tensors converted; str/bytes as object arrays of bytes, as TF strings)."""
    array = np.asarray(value)
    if array.dtype.kind in "US":
        # Taken from the values themselves: numpy's fixed-width strings drop trailing NULs (b"c\0" reads
        # back as b"c"). str is UTF-8 encoded, as TF does.
        strings = np.array(value, dtype=object) if not isinstance(value, np.ndarray) else array.astype(object)
        if strings.ndim == 0:
            return np.array(_utf8(strings.item()), dtype=object)
        array = _utf8_all(strings).astype(object, copy=False)
    return array


def _utf8(value: Any) -> Any:
    return value.encode() if isinstance(value, str) else value


_utf8_all = np.frompyfunc(_utf8, 1, 1)


def leaf_array(value: Any, path: tuple, context: str, *, none_ok: bool = False) -> np.ndarray:
    """`to_array(value)`, checked by `check_leaf` (see there for the arguments) unless its kind is a tensor's."""
    array = to_array(value)
    if array.dtype.kind not in TENSOR_KINDS:
        check_leaf(array, value, path, context, none_ok=none_ok)
    return array


_leaf_type_cache: Dict[type, bool] = {}


def _is_leaf_type(kind: type) -> bool:
    """Whether dm-tree treats values of this type as leaves (memoized per type)."""
    leaf = _leaf_type_cache.get(kind)
    if leaf is None:
        leaf = not (issubclass(kind, (list, tuple, collections.abc.Mapping)) or hasattr(kind, "__attrs_attrs__"))
        _leaf_type_cache[kind] = leaf
    return leaf


def flat_dict_keys(data: Any) -> Optional[tuple]:
    """The sorted keys of a flat dict of leaves (tree.flatten's order), or None for any other structure: the
    writers' fast path past `tree.flatten_with_path` for the usual step, a dict of arrays."""
    if type(data) is not dict:
        return None
    for value in data.values():
        if not _is_leaf_type(type(value)):
            return None
    return tuple(sorted(data))


def check_leaf(array: np.ndarray, value: Any, path: tuple, context: str, *, none_ok: bool = False) -> None:
    """Raises TypeError unless `array` (`np.asarray(value)`) can be a tensor.

    Args:
      array: The leaf as numpy converted it.
      value: The leaf as given (named in the error).
      path: The leaf's path in the written structure.
      context: What the structure is, for the error ("the appended step").
      none_ok: Whether the caller takes None as a column not set in this step (said in the error).

    Raises:
      TypeError: Naming the field, what it must be, and the type (and element type) it has.
    """
    kind = array.dtype.kind
    if kind in TENSOR_KINDS:
        return
    if kind == "O":
        if type(value) is str or type(value) is bytes:
            return
        for element in array.flat:
            if not isinstance(element, (str, bytes)):
                break
        else:
            return  # only strings: TF's tf.string
        if array.ndim == 0 and not isinstance(value, np.ndarray):  # an object numpy wrapped as it is
            got = f"{type(value).__name__} ({_repr.repr(value)})"
        else:
            got = f"{type(value).__name__} of dtype object holding {type(element).__name__} " \
                  f"({_repr.repr(element)})"
    elif kind == "V" and not issubclass(array.dtype.type, np.void):
        return  # ml_dtypes (bfloat16, float8_*): TF dtypes that numpy only knows as opaque ones
    else:
        got = f"{type(value).__name__} of dtype {array.dtype}"
    expected = f"{_EXPECTED}, or None to leave the column unset" if none_ok else _EXPECTED
    where = format_path(path, notation="subscripts")
    raise TypeError(f"Field {where} of {context} must be {expected}, got {got}")
