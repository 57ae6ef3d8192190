"""Reverb's structured writer (`reverb.structured_writer`): pattern configs applied online to steps.

The pattern language (reference steps, `create_config`, conditions, priorities, `infer_signature`) is
`rlds_tf.patterns`, re-exported here under Reverb's names; `StructuredWriter` feeds each appended step to
`rlds_tf.patterns.evaluator.PatternEvaluator`, which decides which items the configs produce, and turns
each item's selected steps into references to the writer's column chunks, as `TrajectoryWriter` does.
The items are therefore exactly what `rlds_tf.transformations.pattern_map` computes from the same steps.

>>> import replay_tf as reverb, tensorflow as tf, numpy as np
>>> server = reverb.Server([reverb.Table.queue('pairs', 10)])
>>> client = reverb.Client(f'localhost:{server.port}')
>>> ref = reverb.structured_writer.create_reference_step({'x': tf.TensorSpec([], tf.int32)})
>>> config = reverb.structured_writer.create_config({'pair': ref['x'][-2:]}, table='pairs')
>>> writer = client.structured_writer([config])
>>> for i in range(3):
...   writer.append({'x': np.int32(i)})
>>> writer.flush()
>>> [next(client.sample('pairs', emit_timesteps=False)).data[0].tolist() for _ in range(2)]
[[0, 1], [1, 2]]
>>> server.stop()
"""
from __future__ import annotations

import collections
import datetime
from typing import Any, Callable, Dict, Optional, Sequence

import tree

from replay_tf import errors
from replay_tf import reverb_types  # noqa: F401  (Reverb's `structured_writer.reverb_types`)
from replay_tf.writing.context import FlushOnExitCloseOnDelete
from replay_tf.core.chunk_store import Item, new_key
from replay_tf.writing.column_chunker import ColumnChunker, with_hint
from replay_tf.writing.leaves import flat_dict_keys, leaf_array
from rlds_tf.nests import format_path
from rlds_tf.patterns import Condition
from rlds_tf.patterns import ConditionProto
from rlds_tf.patterns import Config
from rlds_tf.patterns import Pattern
from rlds_tf.patterns import ReferenceStep
from rlds_tf.patterns import constant_priority_fn
from rlds_tf.patterns import create_config
from rlds_tf.patterns import create_reference_step
from rlds_tf.patterns import infer_signature
from rlds_tf.patterns import pattern_from_transform
from rlds_tf.patterns import td_error
from rlds_tf.patterns import unpack_pattern
from rlds_tf.patterns import patterns_pb2  # noqa: F401  (Reverb's `structured_writer.patterns_pb2`)
from rlds_tf.patterns import configs as configs_lib
from rlds_tf.patterns.evaluator import PatternEvaluator

# A function from a reference step to a pattern (the argument of `pattern_from_transform`).
PatternTransform = Callable[[ReferenceStep], Pattern]

__all__ = [
    "Condition",
    "ConditionProto",
    "Config",
    "Pattern",
    "PatternTransform",
    "ReferenceStep",
    "StructuredWriter",
    "constant_priority_fn",
    "create_config",
    "create_reference_step",
    "infer_signature",
    "pattern_from_transform",
    "td_error",
    "unpack_pattern",
]


class StructuredWriter(FlushOnExitCloseOnDelete):
    """Applies pattern `configs` to every appended step and inserts the items they produce.

    Create it with `Client.structured_writer(configs)`. Only the columns some config reads are stored, and
    only as many steps of each as the configs look back.
    """

    def __init__(self, stream, configs: Sequence[Any]):
        if not configs:
            raise ValueError("At least one config must be provided.")
        self._stream = stream
        self._open_chunks = bool(getattr(stream, "supports_open_chunks", False))
        self._evaluator = PatternEvaluator(configs, with_data=False)  # (items as references, not values)
        # Column -> how many recent steps the configs read; other columns are never stored.
        self._histories: Dict[int, int] = configs_lib.column_histories(self._evaluator.configs)
        self._chunkers: Dict[int, ColumnChunker] = {}
        self._refs: Dict[int, collections.OrderedDict] = {c: collections.OrderedDict() for c in self._histories}
        self._paths: Optional[list] = None
        self._labels: Optional[list] = None  # per column, its name in Reverb's errors
        self._keys: Optional[tuple] = None  # the first step's keys, when it was a flat dict of leaves
        self._next_step = 0          # absolute number of the next (or open) step, as the evaluator counts
        self._step_in_episode = 0
        self._step_open = False
        self._episode_id = new_key()

    @property
    def step_is_open(self) -> bool:
        """Whether the last `append` was partial."""
        return self._step_open

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Appends a step (or part of one: unset fields are None) and inserts the items it completes."""
        if self._closed:
            self._raise_closed()
        keys = flat_dict_keys(data)
        if keys is not None and keys == self._keys:  # fast path: a flat dict with the first step's keys
            with_path = [((key,), data[key]) for key in keys]
        else:
            with_path = tree.flatten_with_path(data)
            if self._paths is None:
                self._paths = [format_path(path, notation="subscripts") for path, _ in with_path]
                self._labels = [f"{column} (path={tuple(path)!r})" for column, (path, _) in enumerate(with_path)]
                self._keys = keys
            elif len(with_path) != len(self._paths):
                raise with_hint(ValueError(f"Flattened data has an unexpected length, got {len(with_path)} but "
                                           f"wanted {len(self._paths)}."),
                                f"Every step must have the first step's structure, whose leaves are {self._paths} "
                                f"(None for a field a step lacks).")
        # Every column is checked, read or not (as Reverb).
        flat = [None if value is None else leaf_array(value, path, "the appended step", none_ok=True)
                for path, value in with_path]
        step = self._next_step
        for column, history in self._histories.items():
            value = flat[column] if column < len(flat) else None
            if value is None:
                continue
            refs = self._refs[column]
            if step in refs:
                # RuntimeError and the text as dm-reverb's C++ writer reports it.
                raise RuntimeError(f"A value for column {column} was provided by multiple Append/AppendPartial "
                                   f"calls in the same step. Field {self._paths[column]} has already been set in "
                                   f"the active step by a previous (partial) append call: omit it or set it to "
                                   f"None.")
            chunker = self._chunkers.get(column)
            if chunker is None:
                chunker = ColumnChunker(self._paths[column], value, history + 1, None, self._open_chunks,
                                         label=self._labels[column])  # Reverb's `column 1 (path=('b', 'c'))`
                self._chunkers[column] = chunker
            else:
                chunker.check(value)
            refs[step] = chunker.append(value, self._episode_id, self._step_in_episode)
            while len(refs) > history + 1:  # keep the steps the configs can still read
                refs.popitem(last=False)
        for item in self._evaluator.append(flat, partial_step=partial_step):
            self._insert(item)
        self._step_open = partial_step
        if not partial_step:
            self._next_step += 1
            self._step_in_episode += 1

    def _insert(self, pattern_item) -> None:
        columns = []
        episode_ids = set()
        for node in pattern_item.nodes:
            refs = self._refs[node.flat_source_index]
            parts: list = []
            for step in node.steps:
                ref = refs[step]
                chunk = ref.chunk
                episode_ids.add(chunk.sequence_range.episode_id)
                if parts and parts[-4] is chunk and parts[-1] == ref.row:
                    parts[-1] += 1  # the next row of the same chunk extends the slice
                else:
                    parts.extend((chunk, 0, ref.row, ref.row + 1))
            columns.append((node.squeeze, *parts))
        item = Item.from_resolved(new_key(), float(pattern_item.priority), tuple(columns), frozenset(episode_ids))
        live = None
        if not self._open_chunks:
            # Remote servers only take final chunks: close the ones this item reads.
            used = {c.key for c in item.chunks.values()}
            for chunker in self._chunkers.values():
                if chunker.chunk is not None and chunker.chunk.key in used:
                    chunker.finalize()
            # The chunks later items can use: those of the steps the configs can still read.
            live = tuple({ref.chunk.key for refs in self._refs.values() for ref in refs.values()})
        self._stream.send(pattern_item.table, item, live)

    def flush(self, block_until_num_items: int = 0, timeout_ms: Optional[int] = None) -> None:
        """Blocks until at most `block_until_num_items` items are unconfirmed; `DeadlineExceededError` on
        timeout."""
        if self._closed:
            self._raise_closed()
        if block_until_num_items < 0:
            raise ValueError(f"block_until_num_items must be >= 0, got {block_until_num_items}")
        self._stream.flush(block_until_num_items, timeout_ms)

    def end_episode(self, clear_buffers: bool = True, timeout_ms: Optional[int] = None) -> None:
        """Applies the end-of-episode configs, flushes, and starts a new episode."""
        if self._closed:
            self._raise_closed()
        for item in self._evaluator.end_episode(clear_buffers=clear_buffers):
            self._insert(item)
        if self._step_open:
            self._next_step += 1
        for chunker in self._chunkers.values():
            chunker.finalize()
        self._step_open = False
        self._step_in_episode = 0
        self._episode_id = new_key()
        if clear_buffers:
            for refs in self._refs.values():
                refs.clear()
        try:
            self._stream.flush(0, timeout_ms)
        except errors.DeadlineExceededError:
            raise errors.DeadlineExceededError(
                f"End episode call did not complete within provided timeout of "
                f"{datetime.timedelta(milliseconds=timeout_ms)}") from None

    def close(self) -> None:
        """Releases the writer's stream (flush first to wait for the items); later calls raise RuntimeError."""
        if not self._closed:
            self._closed = True
            self._stream.close()
