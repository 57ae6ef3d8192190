"""rlds_tf.transformations: the names of `rlds.transformations`, in plain tf.data."""
from rlds_tf.transformations import batched_helpers
from rlds_tf.transformations.alignment import AlignmentType
from rlds_tf.transformations.alignment import add_alignment_to_step
from rlds_tf.transformations.alignment import shift_keys
from rlds_tf.transformations.dataset_concat import concat_if_terminal
from rlds_tf.transformations.dataset_concat import concatenate
from rlds_tf.transformations.dataset_stats import mean_and_std
from rlds_tf.transformations.dataset_stats import sar_fields_mask
from rlds_tf.transformations.dataset_truncate import truncate_after_condition
from rlds_tf.transformations.flexible_batch import BATCH_AUTO_TUNE
from rlds_tf.transformations.flexible_batch import batch
from rlds_tf.transformations.nested_ops import apply_nested_steps
from rlds_tf.transformations.nested_ops import episode_length
from rlds_tf.transformations.nested_ops import final_step
from rlds_tf.transformations.nested_ops import map_nested_steps
from rlds_tf.transformations.nested_ops import map_steps
from rlds_tf.transformations.nested_ops import sum_dataset
from rlds_tf.transformations.nested_ops import sum_nested_steps
from rlds_tf.transformations.pattern import pattern_map
from rlds_tf.transformations.pattern import pattern_map_from_transform
from rlds_tf.transformations.pattern import step_spec
from rlds_tf.transformations.shape_ops import uniform_from_spec
from rlds_tf.transformations.shape_ops import zero_dataset_like
from rlds_tf.transformations.shape_ops import zeros_from_spec

__all__ = [
    "AlignmentType",
    "BATCH_AUTO_TUNE",
    "add_alignment_to_step",
    "apply_nested_steps",
    "batch",
    "concat_if_terminal",
    "concatenate",
    "episode_length",
    "final_step",
    "map_nested_steps",
    "map_steps",
    "mean_and_std",
    "pattern_map",
    "pattern_map_from_transform",
    "sar_fields_mask",
    "shift_keys",
    "step_spec",
    "sum_dataset",
    "sum_nested_steps",
    "truncate_after_condition",
    "uniform_from_spec",
    "zero_dataset_like",
    "zeros_from_spec",
]
