"""What a sample dataset asks for against what a table holds, with errors in Reverb's words.

`check_requested` compares the requested dtypes and shapes with the signature of a table in this process
when the dataset is made (remote tables are checked batch by batch instead); `check_received` compares them
with the columns of each sampled item. `table_signature` is what `from_table_signature` builds datasets of.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
import tree

from replay_tf.transport import base as transport_lib
from replay_tf.transport.inprocess import InProcessTransport


def table_signature(server_address: str, table: str, timeout_secs: Optional[int]) -> Any:
    """The signature of `table` at `server_address` (what `from_table_signature` builds datasets of).

    Raises:
      ValueError: The server has no such table, or the table no signature.
      DeadlineExceededError: `timeout_secs` (None or 0: the `timeout_ms` of `set_connection_options`, else
        no limit) ran out.
    """
    if not timeout_secs:
        timeout_ms = transport_lib.connection_timeout_ms(server_address)
        timeout_secs = None if timeout_ms is None else timeout_ms / 1000.0
    info = transport_lib.make_transport(server_address).server_info(timeout_secs)
    if table not in info:
        raise ValueError(f"Server at {server_address} does not contain any table named {table}. Found: "
                         f"{', '.join(sorted(info.keys()))}.")
    if not info[table].signature:
        raise ValueError(f"Table {table} at {server_address} does not have a signature.")
    return info[table].signature


def check_requested(server_address: str, table: str, paths: list, dtypes: list, shapes: list) -> None:
    """ValueError when `table` of a `Server` of this process has a signature that the requested columns
    (`paths`, `dtypes`, `shapes`, flat) contradict, or no such table exists; nothing for remote servers."""
    transport = transport_lib.make_transport(server_address)
    if not isinstance(transport, InProcessTransport):
        return  # remote servers are checked batch by batch while sampling
    info = transport.server_info(None)
    if table not in info:
        raise ValueError(f"Server at {server_address} does not contain any table named {table}. "
                         f"Found: {', '.join(sorted(info))}.")
    signature = info[table].signature
    if signature is None:
        return
    flat = tree.flatten(signature)
    if len(flat) != len(dtypes):
        raise ValueError(f"Inconsistent number of tensors requested from table '{table}'. Requested "
                         f"{len(dtypes)} tensors ({paths}), but table signature shows "
                         f"{len(flat)} tensors: {signature}")
    for path, dtype, shape, spec in zip(paths, dtypes, shapes, flat):
        if dtype != spec.dtype or not shape.is_compatible_with(spec.shape):
            raise ValueError(f"Requested incompatible tensor at '{path}' from table '{table}': "
                             f"requested dtype={dtype.name} shape={shape}, but the table signature has "
                             f"{spec}")


def check_received(columns: list, table: str, paths: list, dtypes: list, shapes: list,
                   reported_shapes: Callable[[int, tuple], tuple]) -> None:
    """InvalidArgument (a ValueError in the generator) for columns of `table` that the requested columns
    (`paths`, `dtypes`, `shapes`, flat) do not admit, with Reverb's text ("Received incompatible tensor ...
    Specification has (dtype, shape): ...") followed by the column's path. `reported_shapes(index,
    column_shape)`: the (requested shape, item's shape) of a mismatching column as the message names them."""
    if len(columns) != len(dtypes):
        raise ValueError(f"Inconsistent number of tensors received from table '{table}'.  Specification has "
                         f"{len(dtypes)} tensors, but data coming from the table shows "
                         f"{len(columns)} tensors.  Table '{table}' returned an item with {len(columns)} "
                         f"columns but the dataset expects {len(dtypes)} ({paths})")
    for i, (path, dtype, shape, column) in enumerate(zip(paths, dtypes, shapes, columns)):
        if column.dtype != numpy_dtype(dtype) or not shape.is_compatible_with(column.shape):
            spec_shape, tensor_shape = reported_shapes(i, column.shape)
            raise ValueError(f"Received incompatible tensor at flattened index {i} from table '{table}'.  "
                             f"Specification has (dtype, shape): ({type_name(dtype)}, "
                             f"{shape_string(spec_shape)}).  Tensor has (dtype, shape): "
                             f"({type_name(column.dtype)}, {shape_string(tensor_shape)}).  "
                             f"Table '{table}' returned an item whose column '{path}' has "
                             f"dtype={column.dtype.name} shape={list(column.shape)}, but the dataset expects "
                             f"dtype={dtype.name} shape={shape}: pass dtypes and shapes that match the "
                             f"table's items (or build the dataset with from_table_signature).")


def numpy_dtype(dtype: tf.DType) -> np.dtype:
    """The numpy dtype of a column of `dtype` (object for strings)."""
    return np.dtype(object) if dtype == tf.string else np.dtype(dtype.as_numpy_dtype)


def type_name(dtype) -> str:
    """A dtype as TensorFlow's C++ names it in messages (`float`, `double`, `string`, `int64`, ...)."""
    if not isinstance(dtype, tf.DType):
        dtype = tf.string if np.dtype(dtype) == np.dtype(object) else tf.as_dtype(dtype)
    return _CC_TYPE_NAMES.get(dtype, dtype.name)


_CC_TYPE_NAMES = {tf.float16: "half", tf.float32: "float", tf.float64: "double"}


def shape_string(shape: tf.TensorShape) -> str:
    """A shape as TensorFlow's C++ writes it in messages: `[1,2]`, `[?,3]`, `[]`, `<unknown>`."""
    if shape.rank is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(d) for d in shape.as_list()) + "]"
