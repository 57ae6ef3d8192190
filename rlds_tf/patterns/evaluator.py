"""The online executor of patterns: feed steps one at a time, get the items the configs produce.

This is what a structured writer (replay_tf/structured_writer.py) calls; `compile.py` is its vectorized
tf.data twin and both take their rules from `configs.py` and `conditions.py`. The evaluator only decides
and selects; it does not chunk, send or insert anything.

API:
  evaluator = PatternEvaluator(configs, step_spec=None, with_data=True)
  items = evaluator.append(flat_step, partial_step=False)   # flat_step: tree.flatten(step); None = missing
  items = evaluator.end_episode(clear_buffers=True)          # is_end_episode configs, then a new episode
Each item is an `Item(config_index, table, priority, nodes, data)`:
  nodes  one `NodeSelection(flat_source_index, steps, squeeze)` per pattern leaf (tree.flatten order):
         the absolute step numbers (0 = the first step ever appended, never reset) whose values of that
         column the leaf takes, oldest first; a writer maps them to its own cell references.
  data   the pattern nest with the selected values (numpy arrays; slices stacked on a new leading axis);
         None with `with_data=False` (a structured writer reads the values from its own chunks).

Semantics (Reverb's StructuredWriter): after every append each config not yet applied at this step is
tried in order; `steps_since_applied` grows once per step and is reset when the config applies; a config
whose selection touches a missing value is skipped as if a condition failed; every config waits for its
history (`buffer_length >= history`, added here per config, like Reverb's client).

>>> ref = create_reference_step({'x': None})
>>> evaluator = PatternEvaluator([create_config({'pair': ref['x'][-2:]}, table='t')])
>>> evaluator.append([1])
[]
>>> [item.data['pair'].tolist() for item in evaluator.append([2])]
[[1, 2]]
>>> evaluator.append([3])[0].nodes
(NodeSelection(flat_source_index=0, steps=(1, 2), squeeze=False),)
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Any, Optional, Sequence

import numpy as np
import tree

from rlds_tf.patterns import conditions as conditions_lib
from rlds_tf.patterns import configs as configs_lib
from rlds_tf.patterns import nodes
from rlds_tf.patterns import priorities
from rlds_tf.patterns.configs import create_config  # noqa: F401  (doctest)
from rlds_tf.patterns.nodes import create_reference_step  # noqa: F401  (doctest)

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class NodeSelection:
    """What one pattern leaf selects: a column and the absolute step numbers of its values."""

    flat_source_index: int
    steps: tuple
    squeeze: bool


@dataclasses.dataclass(frozen=True)
class Item:
    """One item a config produced."""

    config_index: int
    table: str
    priority: float
    nodes: tuple
    data: Any


@dataclasses.dataclass
class _ConfigState:
    steps_since_applied: int = 0
    last_applied: Optional[tuple] = None  # (episode, step index) it last applied at
    last_checked: Optional[tuple] = None


def _stacked(node, cells: list) -> np.ndarray:
    """A leaf's selected values: the one value when squeezed, else stacked on a new leading axis."""
    return np.asarray(cells[0][1]) if node.squeeze else np.stack([np.asarray(v) for _, v in cells])


class PatternEvaluator:
    """Applies configs to steps appended one at a time (see the module docstring)."""

    def __init__(self, configs: Sequence[Any], step_spec: Any = None, *, with_data: bool = True):
        if step_spec is not None:
            configs = configs_lib.validate_configs(configs, step_spec)
        else:
            if not configs:
                raise ValueError("At least one config must be provided.")
            configs = [configs_lib.as_config(c) for c in configs]
            for k, config in enumerate(configs):
                for node in config.flat:
                    nodes.validate_node(node, f"config {k}")
        self._configs = configs_lib.with_buffer_length_conditions(configs, cumulative=False)
        self._patterns = [configs_lib.unpack_pattern(c) for c in self._configs]
        # Per config, per pattern leaf (tree.flatten order): (node, its step offsets), worked out once.
        self._leaves = [[(node, nodes.node_offsets(node)) for node in tree.flatten(pattern)]
                        for pattern in self._patterns]
        self._with_data = with_data
        self._histories = configs_lib.column_histories(self._configs)
        # Per used column: (absolute step, value) of its newest `history` steps; value None when missing.
        self._columns = {c: collections.deque(maxlen=h) for c, h in self._histories.items() if h > 0}
        self._states = [_ConfigState() for _ in self._configs]
        self._episode = 0
        self._step_index = 0  # index within the episode of the next (or open) step
        self._next_step = 0  # absolute number of the next step
        self._step_open = False
        self._num_columns: Optional[int] = None
        self._logged_columns: set = set()  # data-condition columns whose problem has been logged

    @property
    def configs(self) -> list:
        """The configs as evaluated (with their implicit buffer-length conditions)."""
        return list(self._configs)

    @property
    def step_is_open(self) -> bool:
        """True after `append(..., partial_step=True)` until the step is completed."""
        return self._step_open

    def append(self, flat_step: Sequence[Any], *, partial_step: bool = False) -> list:
        """Adds (part of) a step and returns the items the configs produce at it."""
        if type(flat_step) is not list:
            flat_step = list(flat_step)
        if self._num_columns is None:
            self._num_columns = len(flat_step)
        elif len(flat_step) != self._num_columns:
            raise ValueError(f"flattened step has {len(flat_step)} columns but earlier steps had "
                             f"{self._num_columns}")
        for c, column in self._columns.items():
            value = flat_step[c] if c < len(flat_step) else None
            if not self._step_open:
                column.append([self._next_step, value])
            elif value is not None:
                if column and column[-1][1] is not None:
                    raise ValueError(f"column {c} was already given in this step (partial steps may not set a "
                                     f"column twice)")
                column[-1][1] = value
        current = (self._episode, self._step_index)
        self._step_open = partial_step
        items = self._apply(is_end_episode=False, current=current)
        if not partial_step:
            self._step_index += 1
            self._next_step += 1
        return items

    def end_episode(self, clear_buffers: bool = True) -> list:
        """Applies the configs waiting for the end of the episode, then starts a new episode."""
        items = []
        if self._step_index > 0 or self._step_open:
            last_index = self._step_index - (0 if self._step_open else 1)
            items = self._apply(is_end_episode=True, current=(self._episode, last_index))
        if self._step_open:
            self._next_step += 1
        self._episode += 1
        self._step_index = 0
        self._step_open = False
        if clear_buffers:
            for column in self._columns.values():
                column.clear()
        return items

    def _buffer_length(self) -> int:
        return max(map(len, self._columns.values()), default=0)

    def _left(self, condition, current, state, is_end_episode):
        if condition.left == "step_index":
            return current[1]
        if condition.left == "steps_since_applied":
            return state.steps_since_applied
        if condition.left == "buffer_length":
            return self._buffer_length()
        if condition.left == "is_end_episode":
            return int(is_end_episode)
        column = self._columns.get(condition.flat_source_index)
        value = column[-1][1] if column else None
        if value is None:
            return None
        value = np.asarray(value)
        if value.size != 1 or value.dtype.kind not in "biu":
            # Reverb: the condition is not met (its writer logs an error at every such step).
            if condition.flat_source_index not in self._logged_columns:
                self._logged_columns.add(condition.flat_source_index)
                _log.error(conditions_lib.data_column_problem(condition.flat_source_index, value.dtype,
                                                              value.size))
            return None
        value = value.reshape(())
        return int(value) if value.dtype == bool else int(np.int32(value.astype(np.int64)))

    def _select(self, config_index: int) -> Optional[Item]:
        selections, selected = [], []
        for node, offsets in self._leaves[config_index]:
            column = self._columns[node.flat_source_index]
            size = len(column)
            if -offsets[0] > size:
                return None
            cells = [column[size + o] for o in offsets]
            for _, value in cells:
                if value is None:
                    return None  # Reverb skips a config whose selection has missing values
            selections.append(NodeSelection(node.flat_source_index, tuple([s for s, _ in cells]), node.squeeze))
            selected.append(cells)
        config = self._configs[config_index]
        priority = config.priority
        values = None  # the selected values, stacked: built only for the data or a priority that reads them
        if self._with_data or type(priority) is not priorities.ConstantPriority:
            values = [_stacked(node, cells) for (node, _), cells in zip(self._leaves[config_index], selected)]
        if type(priority) is priorities.ConstantPriority:
            priority = float(priority.value)
        else:
            by_source = {}
            for selection, value in zip(selections, values):
                by_source.setdefault(selection.flat_source_index, value)
            priority = priority.compute(by_source)
        data = tree.unflatten_as(self._patterns[config_index], values) if self._with_data else None
        return Item(config_index, config.table, priority, tuple(selections), data)

    def _apply(self, *, is_end_episode: bool, current: tuple) -> list:
        for column in self._columns.values():
            if column and column[-1][1] is not None:
                break
        else:
            return []  # (no column read by a config has a value at this step)
        items = []
        for k, (config, state) in enumerate(zip(self._configs, self._states)):
            if state.last_applied == current:
                continue  # never twice at one step
            if state.last_checked != current:
                state.steps_since_applied += 1
                state.last_checked = current
            ok = True
            for condition in config.conditions:
                left = self._left(condition, current, state, is_end_episode)
                if left is None or not condition.evaluate(left):
                    ok = False
                    break
            if not ok:
                continue
            item = self._select(k)
            if item is None:
                continue
            items.append(item)
            state.last_applied = current
            state.steps_since_applied = 0
        return items
