"""A package's public names loaded on first attribute access (PEP 562), all at once from its `_exports` module.

Importing the package, or one of its submodules (the CLIs, whose --help must not wait for TensorFlow), then
imports no TensorFlow. `from pkg import X`, `pkg.X`, `import *` and `dir()` work as if the names were
imported in the package's `__init__`. Shared by `rlds_tf` and `replay_tf`.
"""
from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, MutableMapping, Sequence


def module_hooks(package: str, public_names: Sequence[str], namespace: MutableMapping[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list]]:
    """`(__getattr__, __dir__)` for the package `package` whose globals are `namespace`."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        # A submodule loads alone: `from pkg import <submodule>` inside the package reaches here too, and
        # loading every public name from there would re-enter modules that are still initializing.
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        if name in public_names:
            exports = importlib.import_module(f"{package}._exports")  # imports TensorFlow
            for public in public_names:
                if public not in namespace and hasattr(exports, public):
                    namespace[public] = getattr(exports, public)
            if name in namespace:
                return namespace[name]
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(namespace) | set(public_names))

    return __getattr__, __dir__
