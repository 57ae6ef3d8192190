"""rlds_tf: RLDS episodes, recording, transformations and patterns on current TensorFlow.

`import rlds_tf as rlds` works for code written against `rlds`.
"""
# The public names load on first attribute access (PEP 562), all at once from rlds_tf/_exports.py, so that
# importing the package or one of its submodules (e.g. `rlds_tf.cli`, whose --help must not wait for
# TensorFlow) does not import TensorFlow. `from rlds_tf import X`, `rlds_tf.X`, `import *` and dir() work as if
# the names were imported here.
import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

if _typing.TYPE_CHECKING:
    from rlds_tf._exports import *  # noqa: F401,F403

__all__ = [
    "ACTION",
    "ALIGNMENT",
    "BatchedEpisode",
    "BatchedStep",
    "CORE_STEP_FIELDS",
    "DISCOUNT",
    "EnvLogger",
    "Episode",
    "EpisodeWriter",
    "EpisodeFilterFn",
    "IS_FIRST",
    "IS_LAST",
    "IS_TERMINAL",
    "OBSERVATION",
    "REWARD",
    "STEPS",
    "Step",
    "StepFilterFn",
    "StepMapFn",
    "StepsToStepsFn",
    "TFDSBackendWriter",
    "build_episode",
    "build_step",
    "is_valid_rlds_dataset",
    "load",
    "load_stacked",
    "load_steps",
    "metadata",
    "patterns",
    "recording",
    "tfds",
    "transformations",
]



def __getattr__(name: str):
    """Imports the submodule `name`, or loads every public name from rlds_tf/_exports.py and returns one."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # A submodule loads alone: `from rlds_tf import <submodule>` inside the package reaches here too, and
    # loading every public name from there would re-enter modules that are still initializing.
    if _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        return _importlib.import_module(f"{__name__}.{name}")
    if name in __all__:
        exports = _importlib.import_module(f"{__name__}._exports")  # imports TensorFlow
        namespace = globals()
        for public in __all__:
            if public not in namespace and hasattr(exports, public):
                namespace[public] = getattr(exports, public)
        if name in namespace:
            return namespace[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
