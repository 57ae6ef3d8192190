"""Pattern nodes and the reference step that builds them.

A pattern is any nest (dicts, lists, tuples, namedtuples) whose leaves are `PatternNode`s. A node names one
column of the flattened step (`flat_source_index`) and what to take from that column's history, counted
back from the most recent step, with Python's indexing rules restricted to what Reverb accepts:

  ref['x'][-1]       the most recent value            PatternNode(i, stop=-1)        shape [...]
  ref['x'][-2]       the value one step before        PatternNode(i, stop=-2)        shape [...]
  ref['x'][-3:]      the last three values, stacked   PatternNode(i, start=-3)       shape [3, ...]
  ref['x'][-3:-1]    two values, the newest left out  PatternNode(i, start=-3, stop=-1)
  ref['x'][-5::2]    every other one of the last five PatternNode(i, start=-5, step=2) shape [3, ...]

>>> ref = create_reference_step({'obs': None, 'act': None})
>>> ref['obs'][-2:]
PatternNode(flat_source_index=1, start=-2, stop=None, step=None)
>>> node_offsets(ref['obs'][-5::2])
(-5, -3, -1)
"""
from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, Optional

import tree

from rlds_tf.nests import format_path


@dataclasses.dataclass(frozen=True)
class PatternNode:
    """One leaf of a pattern (the plain-Python twin of `deepmind.reverb.PatternNode`)."""

    flat_source_index: int
    start: Optional[int] = None
    stop: Optional[int] = None
    step: Optional[int] = None

    @property
    def squeeze(self) -> bool:
        """True for a single index (`x[-2]`): the value keeps the column's shape, no leading dim."""
        return self.start is None


def validate_node(node: PatternNode, where: str = "") -> None:
    """Raises ValueError unless `node` is one Reverb accepts (the rules of Reverb's ValidatePatternNode)."""
    at = f" at {where}" if where else ""
    if node.flat_source_index < 0:
        raise ValueError(f"flat_source_index{at} must be >= 0, got {node.flat_source_index}")
    if node.start is None and node.stop is None:
        raise ValueError(f"pattern node{at} needs `start` or `stop`; got neither")
    if node.start is not None and node.start >= 0:
        raise ValueError(f"slice start{at} must be < 0 (counted back from the most recent step, -1 is the "
                         f"newest), got {node.start}; write e.g. x[-3:] for the last three steps")
    if node.stop is not None and node.stop > 0:
        raise ValueError(f"slice stop{at} must be <= 0 (counted back from the most recent step), got {node.stop}")
    if node.start is not None and node.stop is not None and node.start >= node.stop:
        raise ValueError(f"slice stop{at} ({node.stop}) must be > start ({node.start})")
    if node.start is None and node.stop == 0:
        raise ValueError(f"index{at} must be < 0 (-1 is the most recent step), got 0")
    if node.step is not None and node.start is None:
        raise ValueError(f"slice step{at} needs a start; write e.g. x[-4::2]")
    if node.step is not None and node.step <= 0:
        raise ValueError(f"slice step{at} must be > 0, got {node.step}")


def max_age(node: PatternNode) -> int:
    """How many steps of history the node reaches back (Reverb's MaxAge: |start| or |stop|)."""
    return abs(node.start if node.start is not None else node.stop)


def node_offsets(node: PatternNode) -> tuple[int, ...]:
    """Offsets from the most recent step (-1 is the newest) of every value the node selects, oldest first.

    A slice takes `start, start+step, ...` while below `stop` (0 when unset): ceil((stop-start)/step)
    values. (Reverb declares floor((stop-start)/step) in its signature, which is wrong for x[-5::2].)
    """
    if node.start is None:
        return (node.stop,)
    stop = 0 if node.stop is None else node.stop
    return tuple(range(node.start, stop, node.step or 1))


def slice_length(node: PatternNode) -> Optional[int]:
    """Leading dimension the node adds (None for a single index, which adds none)."""
    return None if node.squeeze else len(node_offsets(node))


def _is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


class _RefDict(dict):
    """A dict of reference nodes whose missing keys raise a KeyError naming the path and the known keys."""

    _path: tuple = ()

    def __missing__(self, key):
        known = ", ".join(repr(k) for k in sorted(self, key=str))
        raise KeyError(f"the pattern names field {format_path(self._path + (key,))!r}, which the step does not "
                       f"have; fields at {format_path(self._path)}: {known}")


def build_reference(step_structure: Any, make_leaf: Callable[[int, tuple, Any], Any]) -> Any:
    """Mirrors `step_structure`, replacing leaf i (in `tree.flatten` order) by `make_leaf(i, path, leaf)`."""
    index = {path: i for i, (path, _) in enumerate(tree.flatten_with_path(step_structure))}

    def build(x: Any, path: tuple) -> Any:
        if isinstance(x, dict):
            out = _RefDict({k: build(v, path + (k,)) for k, v in x.items()})
            out._path = path
            return out
        if _is_namedtuple(x):
            return type(x)(*(build(v, path + (f,)) for f, v in zip(x._fields, x)))
        if isinstance(x, (list, tuple)):
            return type(x)(build(v, path + (i,)) for i, v in enumerate(x))
        return make_leaf(index[path], path, x)

    return build(step_structure, ())


class ReferenceNode:
    """Stands for one column of the step; indexing it with a negative int or slice makes a `PatternNode`."""

    def __init__(self, flat_source_index: int, path: tuple = ()):
        self._idx = flat_source_index
        self._path = path

    def __repr__(self) -> str:
        return f"ReferenceNode({self._idx}, path={format_path(self._path)!r})"

    def __getitem__(self, key) -> PatternNode:
        where = format_path(self._path)
        if isinstance(key, numbers.Integral) and not isinstance(key, bool):
            node = PatternNode(self._idx, stop=int(key))
        elif isinstance(key, slice):
            for name in ("start", "stop", "step"):
                value = getattr(key, name)
                if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool)):
                    raise TypeError(f"slice {name} at {where} must be an int or None, got {value!r}")
            if key.start is None:
                raise ValueError(f"slice at {where} needs a negative start (slices without start such as "
                                 f"x[:-1] are not supported); write e.g. x[-3:] for the last three steps")
            node = PatternNode(self._idx, start=int(key.start),
                               stop=None if key.stop is None else int(key.stop),
                               step=None if key.step is None else int(key.step))
        else:
            raise TypeError(f"pattern index at {where} must be a negative int or a slice, got {key!r} "
                            f"({type(key).__name__})")
        validate_node(node, where)
        return node


ReferenceStep = Any
Pattern = Any


def create_reference_step(step_structure: Any) -> ReferenceStep:
    """A nest shaped like `step_structure` whose leaves build `PatternNode`s when indexed.

    Args:
      step_structure: the structure of the steps (values, specs or Nones at the leaves).

    Returns:
      The same structure with a `ReferenceNode` at every leaf. Dicts raise a KeyError naming the path and
      the fields that exist when a pattern asks for a missing one.

    >>> ref = create_reference_step({'a': None, 'b': {'c': None}})
    >>> ref['b']['c'][-1]
    PatternNode(flat_source_index=1, start=None, stop=-1, step=None)
    """
    return build_reference(step_structure, lambda i, path, _: ReferenceNode(i, path))


def pattern_from_transform(step_structure: Any, transform: Callable[[ReferenceStep], Pattern]) -> Pattern:
    """`transform(create_reference_step(step_structure))`: a pattern written as a function of a step.

    >>> pattern_from_transform({'x': None}, lambda s: {'pair': s['x'][-2:]})
    {'pair': PatternNode(flat_source_index=0, start=-2, stop=None, step=None)}
    """
    return transform(create_reference_step(step_structure))


def normalize_structure(pattern: Any) -> Any:
    """Copies a pattern nest, turning reference dicts back into plain dicts (the caller's nest is untouched)."""
    if isinstance(pattern, dict):
        return {k: normalize_structure(v) for k, v in pattern.items()}
    if _is_namedtuple(pattern):
        return type(pattern)(*(normalize_structure(v) for v in pattern))
    if isinstance(pattern, (list, tuple)):
        return type(pattern)(normalize_structure(v) for v in pattern)
    return pattern
