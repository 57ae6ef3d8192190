"""The pattern language of Reverb's structured writer, as plain Python objects.

Build: `create_reference_step` / `pattern_from_transform`, `Condition`, `constant_priority_fn` / `td_error`,
`create_config` (a frozen `StructuredWriterConfig`; `.to_proto()` / `StructuredWriterConfig.from_proto` for
the wire-compatible `deepmind.reverb.StructuredWriterConfig` in `patterns_pb2`), `infer_signature`.

Run, with one set of rules (`configs.py`) and two executors:
  - offline: `rlds_tf.transformations.pattern_map` -> `compile.compile_blocks` (a plain tf.data graph);
  - online: `PatternEvaluator(configs, step_spec).append(flat_step)` / `.end_episode(clear_buffers)`,
    returning `Item`s (config index, table, priority, per-leaf `NodeSelection`s of absolute step numbers,
    and the selected data) for a structured writer to turn into trajectory items.
"""
from rlds_tf.patterns import patterns_pb2
from rlds_tf.patterns.conditions import Condition
from rlds_tf.patterns.conditions import ConditionNode
from rlds_tf.patterns.configs import ConditionProto
from rlds_tf.patterns.configs import Config
from rlds_tf.patterns.configs import StructuredWriterConfig
from rlds_tf.patterns.configs import as_config
from rlds_tf.patterns.configs import create_config
from rlds_tf.patterns.configs import infer_signature
from rlds_tf.patterns.configs import unpack_pattern
from rlds_tf.patterns.evaluator import Item
from rlds_tf.patterns.evaluator import NodeSelection
from rlds_tf.patterns.evaluator import PatternEvaluator
from rlds_tf.patterns.nodes import Pattern
from rlds_tf.patterns.nodes import PatternNode
from rlds_tf.patterns.nodes import ReferenceStep
from rlds_tf.patterns.nodes import create_reference_step
from rlds_tf.patterns.nodes import pattern_from_transform
from rlds_tf.patterns.priorities import ConstantPriority
from rlds_tf.patterns.priorities import TDErrorPriority
from rlds_tf.patterns.priorities import constant_priority_fn
from rlds_tf.patterns.priorities import td_error

__all__ = [
    "Condition",
    "ConditionNode",
    "ConditionProto",
    "Config",
    "ConstantPriority",
    "Item",
    "NodeSelection",
    "Pattern",
    "PatternEvaluator",
    "PatternNode",
    "ReferenceStep",
    "StructuredWriterConfig",
    "TDErrorPriority",
    "as_config",
    "constant_priority_fn",
    "create_config",
    "create_reference_step",
    "infer_signature",
    "pattern_from_transform",
    "patterns_pb2",
    "td_error",
    "unpack_pattern",
]
