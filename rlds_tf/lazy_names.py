"""A package's public names loaded on first attribute access (PEP 562), each from the module its table names.

Importing the package, or one of its submodules (the CLIs, whose --help must not wait for TensorFlow), then
imports no TensorFlow. `from pkg import X`, `pkg.X`, `import *` and `dir()` work as if the names were
imported in the package's `__init__`. Shared by `rlds_tf` and `replay_tf`.
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import Any, Callable, Mapping, MutableMapping


def module_hooks(package: str, public_names: Mapping[str, str], namespace: MutableMapping[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """`(__getattr__, __dir__)` for the package `package` whose globals are `namespace`.

    Args:
      package: The package's name (its `__name__`).
      public_names: Each public name -> where it is defined, as `pkgutil.resolve_name` reads it:
        `"pkg.module:Name"` for a name inside a module, `"pkg.module"` for a module.
      namespace: The package's globals, where a loaded name is kept.
    """

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # A submodule loads as a module: `from pkg import <submodule>` inside the package reaches here too.
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        if name in public_names:
            value = namespace[name] = pkgutil.resolve_name(public_names[name])  # may import TensorFlow
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(public_names))

    return __getattr__, __dir__
