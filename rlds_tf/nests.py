"""Nests as both packages name and normalize them: a leaf's path in messages, lists read as tuples.

`replay_tf` uses these too (it may import `rlds_tf`, never the reverse), so a path reads the same in every
error either package raises. Two notations, each where its readers meet it:

- `"slashes"` (the default): the form of column names in table signatures and of RLDS feature paths
  (`observation/pos`); the pattern language, the structure coder and signature checks.
- `"subscripts"`: the way a user indexes the nest (`items[1]['camera']`, `.name` for namedtuple fields);
  the nest plumbing's errors (`replay_tf.specs`) and the writers' leaf errors.

>>> format_path(('observation', 'pos'))
'observation/pos'
>>> format_path(('obs', 0), notation='subscripts')
"['obs'][0]"
>>> format_path([1, FieldName('camera')], notation='subscripts', root='items')
'items[1].camera'
>>> format_path(())
'<root>'
>>> lists_to_tuples({'a': [1, (2, [3])]})
{'a': (1, (2, (3,)))}
"""
from __future__ import annotations

import collections

from typing import Any, Sequence

__all__ = [
    "FieldName",
    "format_path",
    "lists_to_tuples",
]

_ROOT = "<root>"


class FieldName(str):
    """A path piece that names a namedtuple's field: `.name` in subscripts (a plain str is a mapping key)."""


def format_path(path: Sequence[Any], *, notation: str = "slashes", root: str = "") -> str:
    """A leaf's path for a message; `<root>` for the empty path of a nest that is one leaf.

    Args:
      path: The keys from the nest's top to the leaf (mapping keys, positions, `FieldName`s), as
        `tree.flatten_with_path` gives them.
      notation: `"slashes"` (`k/0/field`) or `"subscripts"` (`root['k'][0].field`).
      root: What the nest is called, written before its subscripts (`items`); `"subscripts"` only.

    Returns:
      The path as text.

    Raises:
      ValueError: For an unknown notation, or a `root` with `"slashes"`.
    """
    if notation == "slashes":
        if root:
            raise ValueError(f"root ({root!r}) is written only with notation='subscripts', got notation='slashes'")
        return "/".join(str(key) for key in path) if path else _ROOT
    if notation == "subscripts":
        out = root + "".join(f".{key}" if isinstance(key, FieldName) else f"[{key!r}]" for key in path)
        return out or _ROOT
    raise ValueError(f"notation must be 'slashes' or 'subscripts', got {notation!r}")


def lists_to_tuples(nest: Any) -> Any:
    """`nest` with every list (at any depth) as a tuple; mappings and namedtuples keep their types.

    tf.data reads a Python list as one tensor rather than as a structure, so nests that users may write with
    lists (dataset dtypes and shapes, pattern structures) are read as tuples.
    """
    if isinstance(nest, collections.defaultdict):  # (its constructor takes the default factory first)
        return type(nest)(nest.default_factory, ((key, lists_to_tuples(value)) for key, value in nest.items()))
    if isinstance(nest, dict):
        return type(nest)((key, lists_to_tuples(value)) for key, value in nest.items())
    if isinstance(nest, tuple) and hasattr(nest, "_fields"):
        return type(nest)(*(lists_to_tuples(value) for value in nest))
    if isinstance(nest, (list, tuple)):
        return tuple(lists_to_tuples(value) for value in nest)
    return nest
