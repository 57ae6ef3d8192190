"""Makes `import reverb` give `replay_tf`, for code that imports Reverb itself and cannot be edited.

Code you write changes its import (`import replay_tf as reverb`). Libraries written for dm-reverb import
`reverb` on their own: TF-Agents' `reverb_replay_buffer`, `reverb_utils` and `rlds_to_reverb` (through a
lazy loader, on first use), and rlds 0.1.8 (`rlds.transformations.pattern`, at import time). Calling
`register_as_reverb()` before their first use of `reverb` makes those imports resolve to this package:

>>> import sys, replay_tf
>>> saved = {k: v for k, v in sys.modules.items() if k == 'reverb' or k.startswith('reverb.')}
>>> reverb_module = replay_tf.register_as_reverb()
>>> import reverb
>>> reverb is replay_tf, reverb.Server is replay_tf.Server
(True, True)
>>> from reverb import trajectory_writer
>>> trajectory_writer is replay_tf.trajectory_writer
True
>>> for k in [k for k in sys.modules if k == 'reverb' or k.startswith('reverb.')]:
...     del sys.modules[k]
>>> sys.modules.update(saved)

What is registered (entries in `sys.modules`, nothing written to disk, no top-level package installed):
  - `reverb` -> `replay_tf`;
  - `reverb.<name>` -> `replay_tf.<name>` for each module of Reverb's Python layer that replay_tf has:
    `client`, `errors`, `item_selectors`, `pattern_dataset`, `rate_limiters`, `replay_sample`,
    `reverb_types`, `server`, `structured_writer`, `tf_client`, `timestep_dataset`, `trajectory_dataset`,
    `trajectory_writer`, and `selectors` (an attribute in Reverb, a module here);
  - `reverb.platform`, `reverb.platform.checkpointers_lib`, `reverb.platform.default` and
    `reverb.platform.default.checkpointers`: the checkpointer namespaces (TF-Agents' SAC example uses
    `reverb.platform.checkpointers_lib.DefaultCheckpointer`), all giving `replay_tf.checkpointers`;
    `replay_tf.platform` is set to that `reverb.platform` namespace, as Reverb's `__init__` imports it.

Limits:
  - It is process-wide and lasts until the process ends: every later `import reverb` in the process gets
    replay_tf. Call it once at start-up (a `conftest.py`, a program's `main`), before anything imports
    `reverb`.
  - It refuses (RuntimeError) when another module is already registered as `reverb` or as one of the
    names above, e.g. dm-reverb imported earlier in the process: objects of the two packages would mix.
    An installed dm-reverb that the process has not imported yet is shadowed, not refused (on TF >= 2.16
    its compiled ops cannot load anyway).
  - Only what replay_tf implements resolves: Reverb's C++ bindings (`reverb.pybind`), its server binary
    and the `reverb.platform` loaders (`ensure_tf_install`, `load_op_library`) do not exist here, and the
    documented differences of replay_tf (README, "Name map") apply to code that goes through this alias.
"""
from __future__ import annotations

import importlib
import sys
import types

__all__ = ["register_as_reverb"]

# Modules of Reverb's Python layer that replay_tf has under the same name.
_SUBMODULES = (
    "client",
    "errors",
    "item_selectors",
    "pattern_dataset",
    "rate_limiters",
    "replay_sample",
    "reverb_types",
    "selectors",
    "server",
    "structured_writer",
    "tf_client",
    "timestep_dataset",
    "trajectory_dataset",
    "trajectory_writer",
)

# `reverb.platform` namespaces, built once so that repeated registration installs the same objects.
_platform_modules: dict[str, types.ModuleType] = {}


def _platform_aliases(checkpointers: types.ModuleType) -> dict[str, types.ModuleType]:
    """`reverb.platform` and `reverb.platform.default`, each exposing replay_tf's checkpointers."""
    if not _platform_modules:
        default = types.ModuleType("reverb.platform.default",
                                   "Reverb's `reverb.platform.default`, as registered by replay_tf.")
        default.checkpointers = checkpointers
        platform = types.ModuleType("reverb.platform", "Reverb's `reverb.platform`, as registered by replay_tf.")
        platform.checkpointers_lib = checkpointers
        platform.default = default
        _platform_modules.update({
            "reverb.platform": platform,
            "reverb.platform.checkpointers_lib": checkpointers,
            "reverb.platform.default": default,
            "reverb.platform.default.checkpointers": checkpointers,
        })
    return dict(_platform_modules)


def _aliases() -> dict[str, types.ModuleType]:
    """The `sys.modules` entries that make `reverb` resolve to replay_tf."""
    package = importlib.import_module("replay_tf")
    entries = {"reverb": package}
    for name in _SUBMODULES:
        entries[f"reverb.{name}"] = importlib.import_module(f"replay_tf.{name}")
    entries.update(_platform_aliases(importlib.import_module("replay_tf.checkpointers")))
    return entries


def _describe(module: object) -> str:
    """A module's name and file, for error messages."""
    name = getattr(module, "__name__", type(module).__name__)
    where = getattr(module, "__file__", None)
    return f"{name!r} from {where}" if where else repr(name)


def register_as_reverb() -> types.ModuleType:
    """Registers replay_tf as the `reverb` module (and its submodules) of this process.

    Idempotent: calling it again changes nothing. See the module docstring for what is registered and the
    limits.

    Returns:
      The `replay_tf` package, which `import reverb` now gives.

    Raises:
      RuntimeError: another module is already in `sys.modules` as `reverb` or as one of its submodules
        (e.g. dm-reverb was imported first).
    """
    entries = _aliases()
    foreign = {
        key: module for key, module in sys.modules.items()
        if (key == "reverb" or key.startswith("reverb.")) and module is not entries.get(key)
    }
    if foreign:
        listed = ", ".join(f"{key}={_describe(module)}" for key, module in sorted(foreign.items()))
        raise RuntimeError(
            f"register_as_reverb: sys.modules already holds a different `reverb` ({listed}); registering "
            f"replay_tf would mix the two packages' objects. Call replay_tf.register_as_reverb() before "
            f"anything imports reverb, in a process that does not import dm-reverb.")
    sys.modules.update(entries)
    package = entries["reverb"]
    # `import reverb.platform...` finds the entries above but, unlike a real import, sets no attribute on
    # the parent; Reverb's `__init__` imports `reverb.platform`, so code reads `reverb.platform.<name>`.
    package.platform = entries["reverb.platform"]
    return package
