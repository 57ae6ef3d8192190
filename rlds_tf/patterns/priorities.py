"""Priority functions of configs (the plain-Python twin of `deepmind.reverb.Priority`).

>>> constant_priority_fn(2.0)
ConstantPriority(value=2.0)
>>> td_error(0.9, {'obs': None, 'td': None}, lambda step: step['td'])
TDErrorPriority(max_priority_weight=0.9, flat_source_index=1)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Union

import numpy as np
import tree


@dataclasses.dataclass(frozen=True)
class ConstantPriority:
    """Every item gets `value`."""

    value: float

    def compute(self, trajectory_by_source: dict) -> float:
        del trajectory_by_source
        return float(self.value)


@dataclasses.dataclass(frozen=True)
class TDErrorPriority:
    """`w * max|td| + (1 - w) * mean|td|` over the TD errors (column `flat_source_index`) in the item."""

    max_priority_weight: float
    flat_source_index: int

    def compute(self, trajectory_by_source: dict) -> float:
        """Priority from `{flat_source_index: values selected by the item's first node on that column}`."""
        if self.flat_source_index not in trajectory_by_source:
            raise ValueError(f"td_error priority reads column {self.flat_source_index}, which the pattern does "
                             f"not select; add it to the pattern")
        abs_td = np.abs(np.asarray(trajectory_by_source[self.flat_source_index], dtype=np.float64))
        w = self.max_priority_weight
        return float(w * abs_td.max() + (1.0 - w) * abs_td.mean())


Priority = Union[ConstantPriority, TDErrorPriority]


def constant_priority_fn(value: float) -> ConstantPriority:
    """A priority function that always returns `value`."""
    return ConstantPriority(float(value))


def td_error(max_priority_weight: float, step_structure: Any,
             get_field_from_step_fn: Callable[[Any], Any]) -> TDErrorPriority:
    """A TD-error priority (https://openreview.net/pdf?id=r1lyTjAqYX) over a per-step TD-error field.

    Args:
      max_priority_weight: weight of the max; the mean gets `1 - max_priority_weight`.
      step_structure: the structure of the steps.
      get_field_from_step_fn: picks the TD-error field from a step, e.g. `lambda step: step['td']`.
    """
    flat_indices = tree.unflatten_as(step_structure, list(range(len(tree.flatten(step_structure)))))
    index = get_field_from_step_fn(flat_indices)
    if not isinstance(index, int):
        raise ValueError(f"get_field_from_step_fn must pick one leaf of the step, got {index!r}")
    return TDErrorPriority(float(max_priority_weight), index)
