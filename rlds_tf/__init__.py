"""rlds_tf: RLDS episodes, recording, transformations and patterns on current TensorFlow.

`import rlds_tf as rlds` works for code written against `rlds`.
"""
# The public names load on first attribute access, each from the module named in `_PUBLIC_NAMES` (see
# rlds_tf.lazy_names), so that importing a submodule such as `rlds_tf.cli` does not import TensorFlow.
from rlds_tf import lazy_names

# Each public name -> where it is defined (`module:name`, or a module). Add a public name here.
_PUBLIC_NAMES = {
    "ACTION": "rlds_tf.rlds_types:ACTION",
    "ALIGNMENT": "rlds_tf.rlds_types:ALIGNMENT",
    "BatchedEpisode": "rlds_tf.rlds_types:BatchedEpisode",
    "BatchedStep": "rlds_tf.rlds_types:BatchedStep",
    "CORE_STEP_FIELDS": "rlds_tf.rlds_types:CORE_STEP_FIELDS",
    "DISCOUNT": "rlds_tf.rlds_types:DISCOUNT",
    "EnvLogger": "rlds_tf.recording:EnvLogger",
    "Episode": "rlds_tf.rlds_types:Episode",
    "EpisodeWriter": "rlds_tf.tfds:EpisodeWriter",
    "EpisodeFilterFn": "rlds_tf.rlds_types:EpisodeFilterFn",
    "IS_FIRST": "rlds_tf.rlds_types:IS_FIRST",
    "IS_LAST": "rlds_tf.rlds_types:IS_LAST",
    "IS_TERMINAL": "rlds_tf.rlds_types:IS_TERMINAL",
    "OBSERVATION": "rlds_tf.rlds_types:OBSERVATION",
    "REWARD": "rlds_tf.rlds_types:REWARD",
    "STEPS": "rlds_tf.rlds_types:STEPS",
    "Step": "rlds_tf.rlds_types:Step",
    "StepFilterFn": "rlds_tf.rlds_types:StepFilterFn",
    "StepMapFn": "rlds_tf.rlds_types:StepMapFn",
    "StepsToStepsFn": "rlds_tf.rlds_types:StepsToStepsFn",
    "TFDSBackendWriter": "rlds_tf.recording:TFDSBackendWriter",
    "build_episode": "rlds_tf.rlds_types:build_episode",
    "build_step": "rlds_tf.rlds_types:build_step",
    "is_valid_rlds_dataset": "rlds_tf.rlds_types:is_valid_rlds_dataset",
    "load": "rlds_tf.loading:load",
    "load_stacked": "rlds_tf.loading:load_stacked",
    "load_steps": "rlds_tf.loading:load_steps",
    "metadata": "rlds_tf.metadata",
    "patterns": "rlds_tf.patterns",
    "recording": "rlds_tf.recording",
    "tfds": "rlds_tf.tfds",
    "transformations": "rlds_tf.transformations",
}

__all__ = list(_PUBLIC_NAMES)

__getattr__, __dir__ = lazy_names.module_hooks(__name__, _PUBLIC_NAMES, globals())
