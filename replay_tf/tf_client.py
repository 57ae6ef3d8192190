"""`TFClient`: Reverb's client calls as TensorFlow ops, for code that samples, inserts or updates priorities
from a `tf.function` (e.g. a learner updating priorities after each step).

dm-reverb implements them as custom kernels; here each call is a `tf.numpy_function` around `Client` (no
compiled op). They run wherever TensorFlow runs Python functions: eagerly and in `tf.function`, not under
XLA (`jit_compile=True`) nor in a graph that is serialized and run without this Python process. The
in-graph replay buffers (`TFUniformReplayBuffer`, `PrioritizedReplayBuffer`) are the choice for work that
must stay inside the graph.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tree

from replay_tf import errors
from replay_tf.sampling.signature_checks import type_name
from replay_tf.client import Client
from replay_tf.replay_sample import ReplaySample
from replay_tf.replay_sample import SampleInfo


class _InvalidArgument(tf.errors.InvalidArgumentError, ValueError):
    """Raised by the ops' Python functions: run eagerly, the op raises it as is (an InvalidArgumentError, as
    dm-reverb's kernels); in a graph TensorFlow turns a ValueError into an InvalidArgumentError."""

    def __init__(self, message: str):
        super().__init__(None, None, message)


class _TypeMismatch(tf.errors.InvalidArgumentError, tf.errors.InternalError, ValueError):
    """A sampled column whose dtype is not the requested one, run eagerly. dm-reverb's op raises
    InvalidArgumentError when run eagerly and InternalError in a graph (the executor's output type check);
    this is both, so either `except` catches it. In a graph see `_type_mismatch_check`."""

    def __init__(self, message: str):
        tf.errors.OpError.__init__(self, None, None, message, tf.errors.INVALID_ARGUMENT)


class _NotFound(tf.errors.NotFoundError, errors.TableNotFoundError):
    """An unknown table, raised by the ops' Python functions: a NotFoundError run eagerly (as dm-reverb's);
    in a graph TensorFlow turns it (a ValueError) into an InvalidArgumentError."""

    def __init__(self, message: str):
        super().__init__(None, None, message)


class _DeadlineExceeded(tf.errors.DeadlineExceededError, errors.DeadlineExceededError):
    def __init__(self, message: str):
        super().__init__(None, None, message)


@contextlib.contextmanager
def _as_op_errors(unknown_table=_NotFound):
    """Client errors as TensorFlow op errors (an unknown table as `unknown_table`)."""
    try:
        yield
    except errors.TableNotFoundError as e:
        raise unknown_table(str(e)) from None
    except errors.DeadlineExceededError as e:
        raise _DeadlineExceeded(str(e)) from None


def _decode(table_name) -> str:
    """A table name as a `tf.numpy_function` hands it over (bytes, or a 0-d array of bytes) as a str."""
    if isinstance(table_name, np.ndarray):
        table_name = table_name.item()
    return table_name.decode() if isinstance(table_name, bytes) else str(table_name)


# The dtypes a sampled column may have, as `_type_mismatch_check` indexes them.
_COLUMN_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int8, tf.int16, tf.int32, tf.int64,
                  tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.bool, tf.string, tf.complex64, tf.complex128)


def _type_mismatch_check(column: tf.Tensor, actual: tf.Tensor, expected: tf.DType) -> tf.Tensor:
    """In a graph: fails, as dm-reverb's op does, with an InternalError ("Output 0 of type <actual> does not
    match declared output type <expected>") when `column` (an int32 scalar) is 0, `actual` being the index
    in `_COLUMN_DTYPES` of the sampled column's dtype; a Python function cannot raise an InternalError.

    The error is TensorFlow's own output type check, reached by pushing a value of the sampled dtype on a
    stack and popping it as `expected` (run eagerly the same pop raises "Type mismatch: actual ... vs.
    expect ...", dm-reverb's eager text)."""
    def pop_as_expected(dtype: tf.DType):
        def pop():
            stack = tf.raw_ops.StackV2(max_size=1, elem_type=dtype)
            push = tf.raw_ops.StackPushV2(handle=stack, elem=tf.zeros([], dtype))
            with tf.control_dependencies([push]):
                return tf.raw_ops.StackPopV2(handle=stack, elem_type=expected)
        return pop

    return tf.cond(tf.equal(column, 0), lambda: tf.switch_case(actual, [pop_as_expected(d) for d in _COLUMN_DTYPES]),
                   lambda: tf.zeros([], expected))


class TFClient:
    """Client calls as TensorFlow ops: `sample`, `insert`, `update_priorities`.

    Args:
      server_address: address of the server.
      shared_name: accepted for Reverb's signature (its kernels share a client resource by this name);
        every `TFClient` here holds its own `Client`.
      name: prefix of the ops' name scopes.
    """

    def __init__(self, server_address: str, shared_name: Optional[str] = None, name: str = "reverb"):
        del shared_name
        self._name = name
        self._server_address = server_address
        self._client = Client(server_address)

    @property
    def server_address(self) -> str:
        return self._server_address

    def sample(self, table: str, data_dtypes: Any, name: Optional[str] = None) -> ReplaySample:
        """Samples one item of `table` (blocking on its rate limiter) and returns its first timestep, nested
        as `data_dtypes` (as dm-reverb's op: the rest of the item is dropped); an item whose columns are all
        squeezed is one timestep, returned whole.

        Raises (when run):
          InvalidArgumentError: an item whose columns are neither all squeezed nor of one length, or whose
            columns are not as many as `data_dtypes` (Reverb's "Number of tensors in the replay sample did
            not match the expected count").
          InternalError (in a graph) / InvalidArgumentError that is also an InternalError (eagerly): a
            column whose dtype is not in `data_dtypes` (Reverb's "Output N of type ... does not match
            declared output type ..." and "Type mismatch: actual ... vs. expect ...").
          NotFoundError: no such table (InvalidArgumentError in a graph).
        """
        flat_dtypes = [tf.as_dtype(d) for d in tree.flatten(data_dtypes)]
        numpy_dtypes = [d.as_numpy_dtype for d in flat_dtypes]
        # In a graph a dtype mismatch is reported by an op after the Python function (see
        # _type_mismatch_check): it returns (mismatched column or -1, index of its dtype) and placeholders.
        in_graph = not tf.executing_eagerly()

        @tf.autograph.experimental.do_not_convert  # (a Python function, not a graph)
        def sample(table_name) -> list:
            table_name = _decode(table_name)
            with _as_op_errors():
                stream = self._client.transport.open_sample_stream(table_name, 1, None, max_samples=1)
                try:
                    [sampled] = stream.next_batch()
                finally:
                    stream.close()
            item = sampled.item
            columns = [np.asarray(column) for column in item.column_arrays()]
            squeezed = [column.squeeze for column in item.trajectory]
            if len(columns) != len(flat_dtypes):  # (Reverb counts the 5 info tensors too)
                raise _InvalidArgument(f"Number of tensors in the replay sample did not match the expected count. "
                                       f"Got {5 + len(columns)} but wanted {5 + len(flat_dtypes)}. (Sampled item of "
                                       f"table '{table_name}' has {len(columns)} columns, but data_dtypes has "
                                       f"{len(flat_dtypes)}: {[d.name for d in flat_dtypes]}.)")
            if not all(squeezed):  # (an item of squeezed columns is one timestep: returned whole)
                if any(squeezed) or len({len(column) for column in columns}) != 1:
                    raise _InvalidArgument(f"Sampled trajectory cannot be decomposed into timesteps: item "
                                           f"{item.key} of table '{table_name}' has columns of lengths "
                                           f"{[None if s else len(c) for s, c in zip(squeezed, columns)]} "
                                           f"(None: squeezed)")
                columns = [column[0] for column in columns]  # the first timestep
            mismatch = [np.int32(-1), np.int32(0)]
            for i, (column, dtype) in enumerate(zip(columns, numpy_dtypes)):
                if column.dtype != dtype and in_graph and tf.as_dtype(column.dtype) in _COLUMN_DTYPES:
                    mismatch = [np.int32(i), np.int32(_COLUMN_DTYPES.index(tf.as_dtype(column.dtype)))]
                    columns = [np.array(b"", object) if d is object else np.zeros([], d) for d in numpy_dtypes]
                    break
                if column.dtype != dtype:
                    raise _TypeMismatch(f"Type mismatch: actual {type_name(column.dtype)} vs. expect "
                                        f"{type_name(dtype)}. (Sampled item of table '{table_name}' has column {i} "
                                        f"of dtype {column.dtype.name}, but data_dtypes expects "
                                        f"{np.dtype(dtype).name}.)")
            info = [np.uint64(item.key), np.float64(sampled.probability), np.int64(sampled.table_size),
                    np.float64(sampled.priority), np.int32(sampled.times_sampled)]
            return info + mismatch + columns if in_graph else info + columns

        info_dtypes = [tf.uint64, tf.float64, tf.int64, tf.float64, tf.int32]
        with tf.name_scope(name or f"{self._name}_sample"):
            out = tf.numpy_function(sample, [table], info_dtypes + [tf.int32, tf.int32] * in_graph + flat_dtypes,
                                    stateful=True)
            if in_graph:
                (column, actual), data = out[5:7], out[7:]
                checks = [_type_mismatch_check(column - i, actual, d) for i, d in enumerate(flat_dtypes)]
                with tf.control_dependencies(checks):
                    data = [tf.identity(x) for x in data]
            else:
                data = out[5:]
        for tensor in out[:5]:
            tensor.set_shape([])
        return ReplaySample(info=SampleInfo(*out[:5]), data=tree.unflatten_as(data_dtypes, list(data)))

    def insert(self, data: Sequence[tf.Tensor], tables: tf.Tensor, priorities: tf.Tensor,
               name: Optional[str] = None):
        """Inserts `data` (one timestep, stored once) as an item of priority `priorities[i]` in `tables[i]`
        for every i; returns an op (None when run eagerly).

        Raises:
          ValueError: `tables` is not a rank-1 string tensor, `priorities` not a rank-1 float64 tensor, or
            their shapes differ.
        """
        if tables.dtype != tf.string or tables.shape.rank != 1:
            raise ValueError("tables must be a string tensor of rank 1")
        if priorities.dtype != tf.float64 or priorities.shape.rank != 1:
            raise ValueError("priorities must be a float64 tensor of rank 1")
        if not tables.shape.is_compatible_with(priorities.shape):
            raise ValueError("priorities and tables must have the same shape")
        leaves = tree.flatten(data)

        @tf.autograph.experimental.do_not_convert  # (a Python function, not a graph)
        def insert(table_names, item_priorities, *values) -> np.bool_:
            if len(table_names) != len(item_priorities):
                raise _InvalidArgument(f"tables ({len(table_names)}) and priorities ({len(item_priorities)}) must "
                                       f"have the same length")
            with _as_op_errors(unknown_table=_InvalidArgument):  # (dm-reverb's insert op: InvalidArgument)
                with self._client.writer(1) as writer:  # as Reverb's op: one timestep, one item per table
                    writer.append(list(values))
                    for table_name, priority in zip(table_names, item_priorities):
                        writer.create_item(_decode(table_name), 1, float(priority))
            return np.bool_(True)

        with tf.name_scope(name or f"{self._name}_insert"):
            done = tf.numpy_function(insert, [tables, priorities, *leaves], tf.bool, stateful=True)
            with tf.control_dependencies([done]):
                return tf.no_op()

    def update_priorities(self, table: str, keys: tf.Tensor, priorities: tf.Tensor, name: Optional[str] = None):
        """Sets the priorities of the items `keys` of `table` (unknown keys are ignored); returns an op
        (None when run eagerly)."""

        @tf.autograph.experimental.do_not_convert  # (a Python function, not a graph)
        def update(table_name, item_keys, item_priorities) -> np.bool_:
            if np.shape(item_keys) != np.shape(item_priorities):
                raise _InvalidArgument(f"keys (shape {list(np.shape(item_keys))}) and priorities (shape "
                                       f"{list(np.shape(item_priorities))}) must have the same shape")
            item_keys, item_priorities = np.reshape(item_keys, [-1]), np.reshape(item_priorities, [-1])
            with _as_op_errors():
                self._client.mutate_priorities(_decode(table_name),
                                               dict(zip(item_keys.tolist(), item_priorities.tolist())))
            return np.bool_(True)

        with tf.name_scope(name or f"{self._name}_update_priorities"):
            keys = tf.convert_to_tensor(keys, tf.uint64)
            priorities = tf.convert_to_tensor(priorities, tf.float64)
            done = tf.numpy_function(update, [table, keys, priorities], tf.bool, stateful=True)
            with tf.control_dependencies([done]):
                return tf.no_op()
