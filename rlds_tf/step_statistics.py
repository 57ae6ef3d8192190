"""Count, mean, std, min and max of every numeric step field, accumulated episode by episode and mergeable.

One pass over the data: each episode's stacked steps are reduced to a partial summary (count, mean, sum of
squared deviations from that mean, min, max per element), and partial summaries merge exactly with Chan et al.'s
pairwise update, so summaries built on different machines combine into the summary of the whole dataset in any
order. `rlds-tf stats` uses this in one process; `rlds_tf.beam.DatasetStatistics` wraps it as a Beam
`CombineFn`. The standard deviation is the sample one (divided by count - 1), as in
`rlds_tf.transformations.mean_and_std`.

>>> import numpy as np
>>> a = StepStatistics().add_episode({'steps': {'x': np.array([1., 3.])}})
>>> b = StepStatistics().add_episode({'steps': {'x': np.array([5.])}})
>>> summary = a.merge(b).result()['x']
>>> summary['count'], summary['mean'].tolist(), summary['std'].tolist(), summary['max'].tolist()
(3, 3.0, 2.0, 5.0)
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import numpy as np

from rlds_tf import rlds_types

# Numeric kinds summarized: signed and unsigned integers, floats and bools (as 0/1). Strings, bytes and
# objects (encoded images, text) are left out.
_NUMERIC_KINDS = "biuf"


def _flatten(prefix: str, value: Any, out: Dict[str, np.ndarray]) -> None:
    if isinstance(value, Mapping):
        for key in sorted(value):
            _flatten(f"{prefix}/{key}" if prefix else str(key), value[key], out)
        return
    array = np.asarray(value)
    if array.dtype.kind in _NUMERIC_KINDS and array.ndim >= 1:
        out[prefix] = array


def numeric_step_fields(steps: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """`{'observation/camera': [T, ...] array, ...}`: the numeric fields of stacked steps, by '/'-joined path."""
    out: Dict[str, np.ndarray] = {}
    _flatten("", steps, out)
    return out


class _FieldSummary:
    """count, mean, m2 (sum of squared deviations from the mean), min, max of one field, per element."""

    __slots__ = ("count", "mean", "m2", "min", "max")

    def __init__(self, values: np.ndarray):
        as_float = values.astype(np.float64)
        self.count = int(values.shape[0])
        self.mean = as_float.mean(axis=0)
        self.m2 = np.square(as_float - self.mean).sum(axis=0)
        self.min = values.min(axis=0)
        self.max = values.max(axis=0)

    def merge(self, other: "_FieldSummary") -> None:
        if self.mean.shape != other.mean.shape:
            raise ValueError(f"cannot merge statistics of shapes {self.mean.shape} and {other.mean.shape}")
        total = self.count + other.count
        delta = other.mean - self.mean
        # Chan et al.: the merged mean moves towards the other part by its share of the count; the squared
        # deviations gain the between-part term delta^2 * n_a * n_b / n.
        self.m2 = self.m2 + other.m2 + np.square(delta) * (self.count * other.count / total)
        self.mean = self.mean + delta * (other.count / total)
        self.count = total
        self.min = np.minimum(self.min, other.min)
        self.max = np.maximum(self.max, other.max)

    def copy(self) -> "_FieldSummary":
        # Every merge rebinds the attributes to new arrays, so sharing the other's arrays would be safe; the
        # summary object itself must not be shared, or a later merge would change the other accumulator.
        out = _FieldSummary.__new__(_FieldSummary)
        for name in self.__slots__:
            setattr(out, name, getattr(self, name))
        return out


class StepStatistics:
    """A mergeable summary of the numeric step fields of the episodes added to it (see the module docstring)."""

    def __init__(self):
        self.num_episodes = 0
        self._fields: Dict[str, _FieldSummary] = {}

    def add_episode(self, episode: Mapping[str, Any]) -> "StepStatistics":
        """Adds one episode: `{'steps': {field: [T, ...] array}, ...}` (what `load_stacked` gives, as numpy)."""
        if rlds_types.STEPS not in episode:
            raise ValueError(f"an episode needs a {rlds_types.STEPS!r} field; got keys {sorted(episode)}")
        self.num_episodes += 1
        for path, values in numeric_step_fields(episode[rlds_types.STEPS]).items():
            if values.shape[0] == 0:
                continue
            part = _FieldSummary(values)
            if path in self._fields:
                self._fields[path].merge(part)
            else:
                self._fields[path] = part
        return self

    def merge(self, other: "StepStatistics") -> "StepStatistics":
        """Adds `other`'s episodes to this summary (in place) and returns it; `other` is left unchanged."""
        self.num_episodes += other.num_episodes
        for path, part in other._fields.items():
            if path in self._fields:
                self._fields[path].merge(part)
            else:
                self._fields[path] = part.copy()
        return self

    def result(self) -> Dict[str, Dict[str, Any]]:
        """`{field path: {'count', 'mean', 'std', 'min', 'max'}}`; std divides by count - 1 (NaN for one step)."""
        out = {}
        for path in sorted(self._fields):
            part = self._fields[path]
            with np.errstate(divide="ignore", invalid="ignore"):
                std = np.sqrt(part.m2 / (part.count - 1)) if part.count > 1 else np.full_like(part.m2, np.nan)
            out[path] = {"count": part.count, "mean": part.mean, "std": std, "min": part.min, "max": part.max}
        return out


def _json_value(value: Any) -> Any:
    """An array or number as JSON values: nested lists, with NaN and infinities as None (strict JSON: null)."""
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def to_json(num_episodes: int, fields: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    """`{'episodes': n, 'fields': ...}` with `StepStatistics.result()`'s arrays as lists (strict JSON values).

    Figures that are not finite, such as the std of a field seen in one step only, become None (JSON null):
    `json.dumps(..., allow_nan=False)` accepts the result.
    """
    return {"episodes": int(num_episodes),
            "fields": {path: {k: _json_value(v) for k, v in s.items()} for path, s in fields.items()}}
