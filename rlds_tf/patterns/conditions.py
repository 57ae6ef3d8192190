"""Conditions: when a config applies (the plain-Python twin of `deepmind.reverb.Condition`).

A condition compares one integer `left` value with a constant: `left == k`, `left >= k`, `left % m == k`,
each optionally inverted (`!=`, `<`, `<=` are built from those, as in Reverb). The left values are:

  step_index           index of the most recent step within its episode (0 for the first step)
  steps_since_applied  steps appended since the config last applied, the current one included; it is
                       not reset at the end of an episode
  buffer_length        steps held in the history buffer (capped at the longest history any config needs)
  is_end_episode       1 while the episode is being ended (after its last step), else 0; only `== 1`
  data                 the value of a scalar integer or bool column in the most recent step, cast to int32;
                       as in Reverb, a data condition on a column of another dtype (float, string) or with
                       more than one element is false at every step (logged once), never a build error

>>> Condition.step_index() % 2 == 0
ConditionNode(left='step_index', cmp='mod_eq', value=0, mod=2, inverse=False, flat_source_index=None)
>>> Condition.data({'a': None, 'b': None})['b'] < 3
ConditionNode(left='flat_source_index', cmp='ge', value=3, mod=None, inverse=True, flat_source_index=1)

The constant is an integer or a bool, as in Reverb (`== False` is `eq: 0`, as RLDS's notebooks write it):

>>> Condition.data({'is_terminal': None})['is_terminal'] == False
ConditionNode(left='flat_source_index', cmp='eq', value=0, mod=None, inverse=False, flat_source_index=0)
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Optional

import numpy as np

from rlds_tf.nests import format_path
from rlds_tf.patterns import nodes

LEFT_KINDS = ("step_index", "steps_since_applied", "buffer_length", "is_end_episode", "flat_source_index")
CMP_KINDS = ("eq", "ge", "mod_eq")


_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _operand(value: Any, what: str = "the value a condition compares with") -> int:
    """`value` as the int a condition stores, taking what Reverb's builder takes: Python and numpy integers
    and bools (`Condition.data(spec)[IS_TERMINAL] == False` is `eq: 0`, `== True` is `eq: 1`).

    Raises:
      TypeError: `value` is not an integer or a bool (a float, None, a string ...).
    """
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an integer or a bool, got {value!r} ({type(value).__name__})") from None


@dataclasses.dataclass(frozen=True)
class ConditionNode:
    """`left <cmp> value`, inverted when `inverse`; `flat_source_index` names the column for data conditions."""

    left: str
    cmp: str
    value: int
    mod: Optional[int] = None
    inverse: bool = False
    flat_source_index: Optional[int] = None

    def evaluate(self, left: Any, truncmod: Callable[[Any, int], Any] = None) -> Any:
        """The condition on `left` (a Python int, a numpy array or a tf.Tensor: elementwise).

        `truncmod` is the C-style remainder (sign of the dividend) for arrays/tensors: `np.fmod` or
        `tf.truncatemod`. Python ints use `math.fmod` semantics when it is omitted.
        """
        if self.cmp == "eq":
            result = left == self.value
        elif self.cmp == "ge":
            result = left >= self.value
        else:
            if truncmod is None:
                remainder = abs(left) % self.mod * (1 if left >= 0 else -1)
            else:
                remainder = truncmod(left, self.mod)
            result = remainder == self.value
        if self.inverse:
            return ~result if not isinstance(result, bool) else not result
        return result


def validate_condition(condition: ConditionNode, where: str = "") -> None:
    """Raises ValueError for conditions Reverb rejects (its ValidateCondition rules)."""
    at = f" in {where}" if where else ""
    if condition.left not in LEFT_KINDS:
        raise ValueError(f"condition{at} has unknown left side {condition.left!r}; known: {', '.join(LEFT_KINDS)}")
    if condition.cmp not in CMP_KINDS:
        raise ValueError(f"condition{at} has unknown comparison {condition.cmp!r}; known: {', '.join(CMP_KINDS)}")
    if condition.left == "flat_source_index" and (condition.flat_source_index is None
                                                  or condition.flat_source_index < 0):
        raise ValueError(f"data condition{at} needs flat_source_index >= 0, got {condition.flat_source_index}")
    if condition.cmp == "mod_eq":
        if condition.mod is None or condition.mod <= 0:
            raise ValueError(f"condition{at}: the modulus must be > 0, got {condition.mod}")
        if condition.value < 0:
            raise ValueError(f"condition{at}: `% m == k` needs k >= 0, got {condition.value}")
    if condition.left == "is_end_episode" and (condition.cmp != "eq" or condition.value != 1
                                               or condition.inverse):
        raise ValueError(f"condition{at}: is_end_episode only supports `== 1` (Condition.is_end_episode())")


class _ConditionBuilder:
    """Turns comparison operators into `ConditionNode`s (`builder % m == k`, `builder >= k`, ...)."""

    def __init__(self, left: str, flat_source_index: Optional[int] = None, mod: Optional[int] = None,
                 path: tuple = ()):
        self._left, self._index, self._mod, self._path = left, flat_source_index, mod, path

    def __repr__(self) -> str:
        return f"Condition.{self._left}()"

    def _make(self, cmp: str, value: int, inverse: bool = False) -> ConditionNode:
        # The proto's fields are int32 (Reverb's builder fails on setting them).
        for name, number in (("the value a condition compares with", value), ("a condition's modulus", self._mod)):
            if number is not None and not _INT32_MIN <= number <= _INT32_MAX:
                raise ValueError(f"{name} must fit in int32 ([{_INT32_MIN}, {_INT32_MAX}]), got {number}")
        condition = ConditionNode(self._left, cmp, value, self._mod, inverse, self._index)
        validate_condition(condition, format_path(self._path) if self._path else "")
        return condition

    def __mod__(self, mod: int) -> "_ConditionBuilder":
        if self._mod is not None:
            raise ValueError("a condition takes one modulus: write `x % m == k`")
        mod = _operand(mod, "a condition's modulus")
        return _ConditionBuilder(self._left, self._index, mod, self._path)

    def __eq__(self, value: int) -> ConditionNode:  # type: ignore[override]
        return self._make("mod_eq" if self._mod is not None else "eq", _operand(value))

    def __ne__(self, value: int) -> ConditionNode:  # type: ignore[override]
        return dataclasses.replace(self == value, inverse=True)

    def _no_mod(self, op: str) -> None:
        if self._mod is not None:
            raise ValueError(f"`% m` only combines with == and != (Reverb's mod_eq), not {op}")

    def __ge__(self, value: int) -> ConditionNode:
        self._no_mod(">=")
        value = _operand(value)
        return self._make("ge", value)

    def __gt__(self, value: int) -> ConditionNode:
        self._no_mod(">")
        value = _operand(value)
        return self._make("ge", value + 1)

    def __lt__(self, value: int) -> ConditionNode:
        self._no_mod("<")
        value = _operand(value)
        return self._make("ge", value, inverse=True)

    def __le__(self, value: int) -> ConditionNode:
        self._no_mod("<=")
        value = _operand(value)
        return self._make("ge", value + 1, inverse=True)

    __hash__ = None  # comparisons build conditions, so builders are not hashable


class Condition:
    """Building blocks for conditions (Reverb's `structured_writer.Condition`)."""

    @staticmethod
    def step_index() -> _ConditionBuilder:
        """Index of the most recent step within its episode (0 for the first step)."""
        return _ConditionBuilder("step_index")

    @staticmethod
    def steps_since_applied() -> _ConditionBuilder:
        """Steps appended since the config last applied (counting the current one)."""
        return _ConditionBuilder("steps_since_applied")

    @staticmethod
    def buffer_length() -> _ConditionBuilder:
        """Steps held in the history buffer."""
        return _ConditionBuilder("buffer_length")

    @staticmethod
    def is_end_episode() -> ConditionNode:
        """True only while the episode is ended (evaluated against its last step)."""
        return ConditionNode("is_end_episode", "eq", 1)

    @staticmethod
    def data(step_structure: Any) -> Any:
        """A nest like `step_structure` whose leaves compare the column's value in the most recent step.

        `step_structure` only locates the columns (its leaves are not read), as in Reverb. A condition is
        met only on a column holding one integer or bool value per step; on any other column (e.g.
        float32) it is false at every step, whatever the comparison (`!=` included), as Reverb's writer
        and `PatternDataset` treat it (they log an error per step; this logs once per evaluator).
        """
        def leaf(i: int, path: tuple, spec: Any) -> _ConditionBuilder:
            del spec  # only the position in the structure matters
            return _ConditionBuilder("flat_source_index", i, path=path)

        return nodes.build_reference(step_structure, leaf)


def data_column_problem(index: int, dtype: Any, num_elements: Optional[int]) -> Optional[str]:
    """Why column `index` (of numpy or TF `dtype`, `num_elements` values per step) cannot satisfy a data
    condition, or None when it can: it must hold one integer or bool value per step. The text starts with
    Reverb's log message for the same case."""
    kind = np.dtype(getattr(dtype, "as_numpy_dtype", dtype)).kind
    if kind not in "biu":
        name = getattr(dtype, "name", None) or np.dtype(dtype).name
        return (f"Config specified data condition on column {index} has invalid data type {name}: the "
                f"condition is false at every step; condition on an integer or bool column")
    if num_elements != 1:
        return (f"Config specified data condition on column {index} which does not contain scalar tensors "
                f"({num_elements} elements per step): the condition is false at every step; condition on a "
                f"scalar field (e.g. is_first, a step counter)")
    return None
