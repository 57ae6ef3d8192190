"""Checks of constructor arguments shared by the core's configs (tables, rate limiters)."""
from __future__ import annotations

import numbers
import operator
from typing import Any


def integer(name: str, value: Any) -> int:
    """`value` as an `int`, or TypeError as dm-reverb's pybind layer raises for its C++ `int` arguments.

    Integers (`int`, `bool`, numpy integers: anything with `__index__`) are taken. Python floats (and
    `np.float64`, a subclass) are refused, whole ones included, as pybind refuses them. Other numbers
    (`np.float32(3)`, a 0-d array) are taken when whole; pybind truncates them (`np.float32(2.5)` -> 2)
    where this refuses them.

    >>> integer('max_size', 3)
    3
    >>> integer('max_size', 10.0)
    Traceback (most recent call last):
    ...
    TypeError: max_size must be an integer, got 10.0 (float); convert it with int() first
    """
    if not isinstance(value, (float, str, bytes)):
        try:
            return operator.index(value)
        except TypeError:
            pass
        try:
            as_int = int(value)
            whole = bool(as_int == value)
        except (TypeError, ValueError, OverflowError):  # not a number, or NaN / infinity
            whole = False
        if whole:
            return as_int
    fix = "; convert it with int() first" if isinstance(value, numbers.Real) else ""
    raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__}){fix}")
