"""Configs: a pattern, its conditions, its priority and its table, plus the rules both executors share.

`create_config` builds a `StructuredWriterConfig`: a frozen, plain-Python value that converts to and from
the wire-compatible `deepmind.reverb.StructuredWriterConfig` protobuf (`to_proto` / `from_proto`); every
function here also accepts those protos. The shared rules (history lengths, the implicit buffer-length
condition, validation against a step spec, the signature) are defined once here and used by the dataset
compiler (`compile.py`) and the online evaluator (`evaluator.py`).

>>> ref = create_reference_step({'x': tf.TensorSpec([], tf.int32)})
>>> config = create_config({'pair': ref['x'][-2:]}, table='pairs')
>>> infer_signature([config], {'x': tf.TensorSpec([], tf.int32)})
{'pair': TensorSpec(shape=(2,), dtype=tf.int32, name='pair')}
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import tensorflow as tf
import tree

from rlds_tf import structure_coder
from rlds_tf.nests import format_path
from rlds_tf.patterns import conditions as conditions_lib
from rlds_tf.patterns import nodes
from rlds_tf.patterns import patterns_pb2
from rlds_tf.patterns import priorities


@dataclasses.dataclass(frozen=True)
class StructuredWriterConfig:
    """A pattern applied to a stream of steps, with conditions, a priority and a target table."""

    flat: tuple
    pattern_structure: Any
    table: str
    priority: priorities.Priority = priorities.ConstantPriority(1.0)
    conditions: tuple = ()

    @property
    def pattern(self) -> Any:
        """The pattern nest (PatternNodes at the leaves)."""
        return unpack_pattern(self)

    def to_proto(self) -> patterns_pb2.StructuredWriterConfig:
        """The wire-compatible `deepmind.reverb.StructuredWriterConfig`."""
        proto = patterns_pb2.StructuredWriterConfig(table=self.table)
        for node in self.flat:
            p = proto.flat.add(flat_source_index=node.flat_source_index)
            if node.start is not None:
                p.start = node.start
            if node.stop is not None:
                p.stop = node.stop
            if node.step is not None:
                p.step = node.step
        proto.pattern_structure.CopyFrom(structure_coder.encode_structure(self.pattern_structure))
        if isinstance(self.priority, priorities.TDErrorPriority):
            proto.priority.td_error.max_priority_weight = self.priority.max_priority_weight
            proto.priority.td_error.flat_source_index = self.priority.flat_source_index
        else:
            proto.priority.constant_fn.value = self.priority.value
        for c in self.conditions:
            p = proto.conditions.add(inverse=c.inverse)
            if c.left == "flat_source_index":
                p.flat_source_index = c.flat_source_index
            else:
                setattr(p, c.left, True)
            if c.cmp == "mod_eq":
                p.mod_eq.mod, p.mod_eq.eq = c.mod, c.value
            else:
                setattr(p, c.cmp, c.value)
        return proto

    @classmethod
    def from_proto(cls, proto: Any) -> "StructuredWriterConfig":
        """Reads a `deepmind.reverb.StructuredWriterConfig` (ours, Reverb's, or serialized bytes)."""
        if isinstance(proto, bytes):
            proto = patterns_pb2.StructuredWriterConfig.FromString(proto)
        flat = tuple(nodes.PatternNode(
            n.flat_source_index,
            start=n.start if n.HasField("start") else None,
            stop=n.stop if n.HasField("stop") else None,
            step=n.step if n.HasField("step") else None) for n in proto.flat)
        if proto.HasField("pattern_structure"):
            # Also reads a StructuredValue from another descriptor pool (e.g. Reverb's).
            structure = structure_coder.decode_structure(proto.pattern_structure)
        else:
            structure = [None] * len(flat)
        if proto.HasField("priority") and proto.priority.WhichOneof("priority_fn") == "td_error":
            priority = priorities.TDErrorPriority(proto.priority.td_error.max_priority_weight,
                                                  proto.priority.td_error.flat_source_index)
        elif proto.HasField("priority"):
            priority = priorities.ConstantPriority(proto.priority.constant_fn.value)
        else:
            priority = priorities.ConstantPriority(1.0)
        conds = []
        for c in proto.conditions:
            left = c.WhichOneof("left")
            cmp = c.WhichOneof("cmp")
            if left is None or cmp is None:
                raise ValueError(f"condition {c} must set both a left side and a comparison")
            if cmp == "mod_eq":
                value, mod = c.mod_eq.eq, c.mod_eq.mod
            else:
                value, mod = getattr(c, cmp), None
            conds.append(conditions_lib.ConditionNode(
                left, cmp, value, mod, c.inverse, c.flat_source_index if left == "flat_source_index" else None))
        return cls(flat, structure, proto.table, priority, tuple(conds))


Config = StructuredWriterConfig
ConditionProto = conditions_lib.ConditionNode


def as_config(config: Any) -> StructuredWriterConfig:
    """A `StructuredWriterConfig` from one, or from a `deepmind.reverb.StructuredWriterConfig` proto."""
    if isinstance(config, StructuredWriterConfig):
        return config
    if hasattr(config, "SerializeToString") or isinstance(config, bytes):
        return StructuredWriterConfig.from_proto(config)
    raise TypeError(f"expected a StructuredWriterConfig (create_config) or its proto, got {type(config).__name__}")


def _as_condition(condition: Any) -> conditions_lib.ConditionNode:
    if isinstance(condition, conditions_lib.ConditionNode):
        return condition
    if hasattr(condition, "WhichOneof"):
        proto = patterns_pb2.StructuredWriterConfig()
        proto.conditions.add().ParseFromString(condition.SerializeToString())
        return StructuredWriterConfig.from_proto(proto).conditions[0]
    raise TypeError(f"conditions must be built with Condition (e.g. Condition.step_index() >= 2), got "
                    f"{condition!r}; did you forget the comparison?")


def _as_node(leaf: Any) -> Any:
    """A PatternNode from one or from a `deepmind.reverb.PatternNode` proto (other values unchanged)."""
    if hasattr(leaf, "flat_source_index") and hasattr(leaf, "HasField"):
        return nodes.PatternNode(leaf.flat_source_index,
                                 leaf.start if leaf.HasField("start") else None,
                                 leaf.stop if leaf.HasField("stop") else None,
                                 leaf.step if leaf.HasField("step") else None)
    return leaf


def create_config(pattern: Any, table: str, conditions: Sequence[Any] = (),
                  priority: Optional[Any] = None) -> StructuredWriterConfig:
    """A config applying `pattern` to `table` when all `conditions` hold.

    Args:
      pattern: a nest of PatternNodes (from `create_reference_step` / `pattern_from_transform`).
      table: the table items go to (unused by `pattern_map`, required by writers).
      conditions: `Condition` comparisons, all of which must hold.
      priority: `constant_priority_fn(...)` or `td_error(...)`; defaults to a constant 1.0.

    Raises:
      ValueError/TypeError: for an empty pattern, leaves that are not PatternNodes, invalid nodes or
        conditions.
    """
    structure = nodes.normalize_structure(pattern)
    if not tree.flatten(structure):
        raise ValueError("the pattern must select at least one value (it has no leaves)")
    flat = []
    for path, leaf in tree.flatten_with_path(structure):
        if isinstance(leaf, nodes.ReferenceNode):
            raise TypeError(f"pattern leaf at {format_path(path)} is a whole column; index it with a negative "
                            f"step, e.g. step[...][-1] or step[...][-2:]")
        leaf = _as_node(leaf)
        if not isinstance(leaf, nodes.PatternNode):
            raise TypeError(f"pattern leaf at {format_path(path)} must be a PatternNode, got {leaf!r}")
        nodes.validate_node(leaf, format_path(path))
        flat.append(leaf)
    if not isinstance(table, str) or not table:
        raise ValueError(f"table must be a non-empty string, got {table!r}")
    if priority is None:
        priority = priorities.ConstantPriority(1.0)
    elif hasattr(priority, "WhichOneof"):
        proto = patterns_pb2.StructuredWriterConfig()
        proto.priority.ParseFromString(priority.SerializeToString())
        priority = StructuredWriterConfig.from_proto(proto).priority
    conds = tuple(_as_condition(c) for c in conditions)
    for c in conds:
        conditions_lib.validate_condition(c)
    return StructuredWriterConfig(tuple(flat), tree.map_structure(lambda _: None, structure), table, priority,
                                  conds)


def unpack_pattern(config: Any) -> Any:
    """The pattern nest of a config (a flat list when it has no structure)."""
    config = as_config(config)
    return tree.unflatten_as(config.pattern_structure, list(config.flat))


# ---------------------------------------------------------------------------------------------------------
# Rules shared by both executors.


def config_history_length(config: StructuredWriterConfig) -> int:
    """Steps of history the config's pattern reaches back (max over its nodes)."""
    return max(nodes.max_age(node) for node in config.flat)


def column_histories(configs: Sequence[StructuredWriterConfig]) -> dict[int, int]:
    """{column: steps of history kept for it}: the deepest node on it, 1 for data-condition columns."""
    out: dict[int, int] = {}
    for config in configs:
        for node in config.flat:
            out[node.flat_source_index] = max(out.get(node.flat_source_index, 0), nodes.max_age(node))
        for c in config.conditions:
            if c.left == "flat_source_index":
                out[c.flat_source_index] = max(out.get(c.flat_source_index, 0), 1)
    return out


def buffer_capacity(configs: Sequence[StructuredWriterConfig]) -> int:
    """The most steps `buffer_length` can report: the longest history kept for any column."""
    return max(column_histories(configs).values())


def with_buffer_length_conditions(configs: Sequence[StructuredWriterConfig], *,
                                  cumulative: bool) -> list[StructuredWriterConfig]:
    """Copies of `configs`, each with a `buffer_length >= history` condition unless it already has one.

    A config must never apply before its history is in the buffer. With `cumulative=False` (Reverb's
    online writer) `history` is the config's own; with `cumulative=True` it is the maximum over this config
    and every config before it, which is what Reverb's `PatternDataset` (and so rlds' `pattern_map`) does:
    with configs [x[-3:], x[-1:]] the second also waits for three steps. The inputs are never modified.
    """
    out, running = [], 0
    for config in configs:
        need = config_history_length(config)
        if cumulative:
            running = max(running, need)
            need = running
        if not any(c.left == "buffer_length" and c.cmp == "ge" and not c.inverse and c.value >= need
                   for c in config.conditions):
            config = dataclasses.replace(
                config, conditions=config.conditions + (conditions_lib.ConditionNode("buffer_length", "ge", need),))
        out.append(config)
    return out


def validate_configs(configs: Sequence[Any], step_spec: Any) -> list[StructuredWriterConfig]:
    """Checks configs against a step spec and returns them as `StructuredWriterConfig`s.

    A data condition on a column that is not one integer/bool value per step is accepted, as in Reverb:
    it is false at every step (see `conditions.Condition.data`).

    Raises:
      ValueError: no configs; an invalid node or condition; a column index outside the step.
    """
    if not configs:
        raise ValueError("At least one config must be provided.")
    configs = [as_config(c) for c in configs]
    flat_spec = tree.flatten_with_path(step_spec)
    for k, config in enumerate(configs):
        for path, node in tree.flatten_with_path(unpack_pattern(config)):
            where = f"config {k}, pattern leaf {format_path(path)}"
            nodes.validate_node(node, where)
            if node.flat_source_index >= len(flat_spec):
                raise ValueError(f"{where} reads column {node.flat_source_index}, but the step has only "
                                 f"{len(flat_spec)} columns: {[format_path(p) for p, _ in flat_spec]}")
        for c in config.conditions:
            conditions_lib.validate_condition(c, f"config {k}")
            if c.left == "flat_source_index":
                if c.flat_source_index >= len(flat_spec):
                    raise ValueError(f"data condition in config {k} reads column {c.flat_source_index}, but the "
                                     f"step has only {len(flat_spec)} columns")
    return configs


def _reverb_error(message: str, hint: str) -> ValueError:
    """A ValueError whose text is Reverb's `message` (Reverb's tests compare it exactly), with `hint` attached
    as a note that tracebacks show after it (Python 3.10 has no notes: the hint is dropped there)."""
    error = ValueError(message)
    if hasattr(error, "add_note"):
        error.add_note(hint)
    return error


def infer_signature(configs: Sequence[Any], step_spec: Any) -> Any:
    """The `tf.TensorSpec` nest of the items the configs produce from steps shaped like `step_spec`.

    All configs must share one pattern structure, one table and one dtype per leaf; leaf shapes may
    differ only in the leading (slice) dimension, which then becomes None. A slice of n values adds a
    leading dimension n = ceil((stop - start) / step).

    Raises:
      ValueError: no configs, or configs that cannot feed one table (structure, table, dtype or shape).
    """
    if not configs:
        raise ValueError("At least one config must be provided.")
    configs = [as_config(c) for c in configs]
    structure0 = configs[0].pattern_structure
    for k, config in enumerate(configs[1:], 1):
        if config.pattern_structure != structure0 or (
                tree.flatten_with_path(config.pattern_structure) != tree.flatten_with_path(structure0)):
            raise _reverb_error("All configs must have exactly the same pattern_structure.",
                                f"Config 0 has {structure0!r} but config {k} has {config.pattern_structure!r}.")
    tables = sorted({c.table for c in configs})
    if len(tables) > 1:
        raise _reverb_error(f"All configs must target the same table but provided configs included "
                            f"{', '.join(tables)}.", "Give each table its own infer_signature call.")
    validate_configs(configs, step_spec)
    flat_spec = tree.flatten(step_spec)

    def leaf_spec(path, *leaf_nodes):
        specs = [flat_spec[node.flat_source_index] for node in leaf_nodes]
        dtypes = [tf.as_dtype(s.dtype) for s in specs]
        if any(d != dtypes[0] for d in dtypes):
            # (Reverb lists the dtypes as the step spec holds them: numpy's for arrays, TF's for TensorSpecs)
            raise _reverb_error(f"Configs produce trajectories with multiple dtypes at {path}. Got "
                                f"{[s.dtype for s in specs]}.",
                                f"Every config must read columns of one dtype for the pattern leaf "
                                f"{format_path(path)}.")
        shapes = []
        for node, spec in zip(leaf_nodes, specs):
            shape = tf.TensorShape(spec.shape)
            if not node.squeeze:
                shape = tf.TensorShape([nodes.slice_length(node)]).concatenate(shape)
            shapes.append(shape)
        if any(s.rank != shapes[0].rank for s in shapes) or (
                shapes[0].rank and any(s[1:] != shapes[0][1:] for s in shapes)):
            raise _reverb_error(f"Configs produce trajectories with incompatible shapes at {path}. Got {shapes}.",
                                f"The pattern leaf {format_path(path)} may differ between configs only in the "
                                f"length of a slice.")
        if all(s == shapes[0] for s in shapes):
            merged = shapes[0]
        else:
            merged = tf.TensorShape([None]).concatenate(shapes[0][1:])
        return tf.TensorSpec(merged, dtypes[0], name="/".join(str(p) for p in path))

    patterns = [unpack_pattern(c) for c in configs]
    return tree.map_structure_with_path(leaf_spec, *patterns)


create_reference_step = nodes.create_reference_step
