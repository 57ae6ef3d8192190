"""`batches`: a `tf.data.Dataset` of what a Python generator yields, at one `tf.numpy_function` call each.

`tf.data.Dataset.from_generator` with an `output_signature` runs every element through an eager Python
function that converts each value to an eager tensor and checks its spec in Python: several times the cost
of the generator's own work for the small batches of many interleaved datasets (TF-Agents' replay buffer
interleaves up to 32 of them, a few samples each). Here `from_generator` only opens and closes the
generator (it yields one key per iterator, so the generator is closed with its iterator), and each
element is one stateful `numpy_function` call that hands the generator's arrays to TensorFlow as they are,
or, for elements of small numeric rows, packed side by side into one array that the graph splits again
(`packed_layout`). The threads that call it keep their Python thread state between calls (`thread_states`).
A generator that can build that packed array more cheaply than from its columns (say, from rows it keeps
packed, see `packed_rows`) may yield it instead of the flat list (see `packed_row_bytes`).

Exceptions in the generator reach the iterator as `numpy_function` maps them (ValueError and TypeError as
InvalidArgumentError, others as UnknownError), which is also how `from_generator` maps them. TensorFlow
logs each of those with its Python traceback, also when tf.data's prefetching thread met it and nobody
reads the element: a server stopped under open iterators would print one traceback per iterator. So
`CancelledError` (its table closed: the server stopped) ends the generator's elements quietly instead, and
the next element fails in the graph (`end_of_elements`): InvalidArgumentError with the error's type and
message, seen only by whoever reads that element.

Each iterator's generator is opened and closed by `iterator_keys`, which differs from `from_generator` in
one respect: an iterator destroyed while the interpreter finalizes (one still open at exit) does not call
Python to close its generator, which TensorFlow cannot do any more and logs as an error.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Iterator, Optional

import numpy as np
import tensorflow as tf
import tree

try:
    # A per-iterator finalizer that can skip Python is not part of the public tf.data API: TensorFlow's own
    # building block of `from_generator` has one. Where a TensorFlow release lacks it, `iterator_keys` is
    # `from_generator` itself (the same keys; only the quiet exit is lost).
    from tensorflow.python.data.ops.from_generator_op import _GeneratorDataset
except ImportError:  # pragma: no cover  (every supported TensorFlow has it; tested by patching it away)
    _GeneratorDataset = None

from replay_tf.sampling import interpreter_exit
from replay_tf.sampling import thread_states
from replay_tf import errors

# The generators of live iterators, by key (each iterator's `iterator_keys` holds its key).
_SOURCES: dict = {}
_KEYS = itertools.count()
# Key -> "Type: message" of the quiet error that ended the generator's elements (see `end_of_elements`).
_ENDED_BY: dict = {}
QUIET_ERRORS = (errors.CancelledError,)


def batches(make_generator: Callable, args: tuple, element_spec: Any,
            wrap: Callable[[Any], Any] = lambda generator: generator) -> tf.data.Dataset:
    """The elements of `make_generator(*args)` (a new generator per iterator; `args` as `from_generator`
    passes them: bytes for strings), each a flat list of arrays matching `element_spec` (a nest of
    `tf.TensorSpec`s) flattened by `tree`, or the packed array of such a list (see `packed_row_bytes`).
    `wrap` wraps the generator that `from_generator` runs (the one that opens and closes
    `make_generator`'s), e.g. `interpreter_exit.ending_at_exit`."""
    flat_specs = tree.flatten(element_spec)
    dtypes = [spec.dtype for spec in flat_specs]
    packing = packed_layout(flat_specs)

    def start(*generator_args):
        generator = make_generator(*generator_args)
        key = next(_KEYS)
        _SOURCES[key] = generator
        try:
            yield np.int64(key)
        finally:
            _SOURCES.pop(key, None)
            _ENDED_BY.pop(key, None)
            generator.close()

    def next_element(key: np.ndarray) -> list:
        thread_states.keep()  # (the next call on this tf.data thread reuses its Python thread state)
        generator = _SOURCES.get(int(key))
        try:
            element = None if generator is None else next(generator, None)
        except QUIET_ERRORS as e:
            _ENDED_BY[int(key)] = f"{type(e).__name__}: {e}"
            element = None
        if element is None:
            raise StopIteration  # (OutOfRange: the end of the iteration, see `per_iterator`)
        if packing is None:
            return element
        if type(element) is np.ndarray:  # packed by the generator
            if element.dtype != np.uint8 or element.ndim != 2 or element.shape[1] != packing[0]:
                raise ValueError(f"a packed batch must be uint8 of shape [rows, {packing[0]}], got "
                                 f"{element.dtype} of shape {list(element.shape)}")
            return element
        return pack(element, packing)

    @tf.autograph.experimental.do_not_convert
    def read(key: tf.Tensor):
        if packing is not None:
            return tree.unflatten_as(element_spec, unpack(
                tf.numpy_function(next_element, [key], tf.uint8, stateful=True), flat_specs, packing))
        values = tf.numpy_function(next_element, [key], dtypes, stateful=True)
        for value, spec in zip(values, flat_specs):
            value.set_shape(spec.shape)
        return tree.unflatten_as(element_spec, values)

    def ended_by(key: np.ndarray) -> Optional[str]:
        return _ENDED_BY.pop(int(key), None)

    end = end_of_elements(ended_by, element_spec)

    @tf.autograph.experimental.do_not_convert
    def per_iterator(key: tf.Tensor) -> tf.data.Dataset:
        # The v1 `map` ends the iteration where its function raises OutOfRange (the v2 `map` keeps its
        # input's cardinality and raises instead), so no per-element predicate is needed.
        return (tf.compat.v1.data.Dataset.from_tensors(key).repeat().map(read)
                .concatenate(tf.compat.v1.data.Dataset.from_tensors(key).map(end)))  # (a quiet error, or none)

    keys = iterator_keys(lambda *generator_args: wrap(start(*generator_args)), args)
    return keys.flat_map(per_iterator)


def end_of_elements(ended_by: Callable[[np.ndarray], Optional[str]], element_spec: Any) -> Callable:
    """A graph function `key -> element` for after an iterator's last element: `ended_by(key)` (called in
    Python) returns None for a normal end (no element: the function raises OutOfRange), or the message of
    the error that ended the elements, raised as InvalidArgumentError by a failing assert. Unlike an
    exception raised in a `numpy_function`, which TensorFlow logs with its traceback wherever it happens
    (tf.data's prefetching threads too), a failed assert is only raised to whoever reads the element."""
    flat_specs = tree.flatten(element_spec)

    def message(key: np.ndarray) -> np.ndarray:
        text = ended_by(key)
        if text is None:
            raise StopIteration
        return np.array(text.encode("utf-8"), dtype=object)

    @tf.autograph.experimental.do_not_convert
    def end(key: tf.Tensor):
        text = tf.numpy_function(message, [key], tf.string, stateful=True)
        check = tf.debugging.Assert(tf.equal(text, ""), [text])  # (never true: fails with the message)
        with tf.control_dependencies([check]):  # (an element of the spec's structure, never returned)
            return tree.unflatten_as(element_spec, [
                tf.zeros([0] if spec.shape.rank is None else [d or 0 for d in spec.shape.as_list()], spec.dtype)
                for spec in flat_specs])

    return end


def iterator_keys(start: Callable[..., Iterator], args: tuple = ()) -> tf.data.Dataset:
    """The int64 scalars that `start(*args)` yields, a new generator for each iterator (closed with it), as
    `tf.data.Dataset.from_generator(start, args=args, ...)` gives them (`args` reach `start` as numpy
    values: bytes for strings).

    Unlike `from_generator`'s, an iterator destroyed while the interpreter finalizes does not call Python:
    TensorFlow cannot, and would log "Error occurred when finalizing GeneratorDataset iterator" for every
    iterator still open at exit. Once the generators of `interpreter_exit` have been ended at exit, a flag
    kept by TensorFlow (`_exit_flag`) tells the finalizer to skip the call. (Not in TF1 graphs, which cannot
    capture the flag: their iterators end with their session.)
    """
    if _GeneratorDataset is None:
        return tf.data.Dataset.from_generator(start, output_signature=tf.TensorSpec([], tf.int64), args=args)
    with tf.init_scope():
        exiting = _exit_flag() if tf.executing_eagerly() else None
    generators: dict = {}
    ids = itertools.count()

    def open_generator(*values) -> np.int64:
        iterator_id = next(ids)
        generators[iterator_id] = start(*values)
        return np.int64(iterator_id)

    def next_key(iterator_id: np.ndarray) -> np.int64:
        generator = generators.get(int(iterator_id))
        value = None if generator is None else next(generator, None)
        if value is None:
            raise StopIteration
        return np.int64(value)

    def close_generator(iterator_id: np.ndarray) -> np.int64:
        generator = generators.pop(int(iterator_id), None)
        if generator is not None:
            generator.close()
        return np.int64(0)

    @tf.autograph.experimental.do_not_convert
    def init_fn(*values):
        return tf.numpy_function(open_generator, list(values[1:]), tf.int64, stateful=True)

    @tf.autograph.experimental.do_not_convert
    def next_fn(iterator_id):
        key = tf.numpy_function(next_key, [iterator_id], tf.int64, stateful=True)
        key.set_shape([])
        return key

    @tf.autograph.experimental.do_not_convert
    def finalize_fn(iterator_id):
        def close():
            return tf.numpy_function(close_generator, [iterator_id], tf.int64, stateful=True)

        if exiting is None:
            return close()
        return tf.cond(tf.raw_ops.ReadVariableOp(resource=exiting, dtype=tf.bool),
                       lambda: tf.constant(0, tf.int64), close)

    @tf.autograph.experimental.do_not_convert
    def per_iterator(*values):
        # (a new generator dataset per iteration of the one-element dataset, as `from_generator` builds it)
        return _GeneratorDataset(values, init_fn, next_fn, finalize_fn, tf.TensorSpec([], tf.int64))

    init_args = (tf.constant(0, tf.int64),) + tuple(tf.convert_to_tensor(a) for a in args)
    return tf.data.Dataset.from_tensors(init_args).flat_map(per_iterator)


_EXIT_FLAG: list = []
_EXIT_FLAG_LOCK = threading.Lock()


def _exit_flag() -> tf.Tensor:
    """The handle of a bool variable, True once the interpreter exits (after `interpreter_exit` ended the
    generators); call it eagerly. Made as a named resource, not a `tf.Variable`: it stays while TensorFlow
    runs, whatever Python objects the interpreter has torn down, so finalizers can read it then."""
    with _EXIT_FLAG_LOCK:
        if _EXIT_FLAG:
            return _EXIT_FLAG[0]
        with tf.device("/cpu:0"):
            handle = tf.raw_ops.VarHandleOp(dtype=tf.bool, shape=[], container="",
                                            shared_name="replay_tf_batch_source_exiting")
            tf.raw_ops.AssignVariableOp(resource=handle, value=False)
        _EXIT_FLAG.append(handle)

        def mark_exiting():
            try:
                tf.raw_ops.AssignVariableOp(resource=handle, value=True)
            except Exception:  # noqa: BLE001  (TensorFlow already torn down: nothing to tell)
                pass

        interpreter_exit.register(mark_exiting, after_generators_end=True)
        return handle


# Elements of at most this many bytes per row travel as one packed array (see `packed_layout`).
_MAX_PACKED_ROW_BYTES = 1024  # (larger rows are copied once more than they save)


def packed_row_bytes(element_spec: Any) -> Optional[int]:
    """The bytes per row of the packed uint8 array `batches` hands over for elements of `element_spec`
    (each component's row bytes side by side, in `tree.flatten` order, see `packed_layout`), or None when such
    elements are handed over as they are. A generator may yield that packed array itself."""
    packing = packed_layout(tree.flatten(element_spec))
    return None if packing is None else packing[0]


def packed_layout(flat_specs: list):
    """`(row_bytes, widths, layouts)` (each spec's elements per row and `(numpy dtype, row shape)`) when every
    spec is numeric (or bool) of one unknown leading dimension and fully defined otherwise, with rows of at
    most `_MAX_PACKED_ROW_BYTES`: such elements are handed over as one uint8 array of `[rows, row_bytes]`
    (each component's row bytes side by side) and split in the graph. TensorFlow converts every array a
    `numpy_function` returns in Python (docs/benchmarks.md, tf_agents), so for the few-sample batches of
    many interleaved datasets one array costs several times less. None otherwise."""
    widths, layouts = [], []
    row_bytes = 0
    for spec in flat_specs:
        shape = spec.shape
        if (shape.rank is None or shape.rank < 1 or shape[0] is not None or not shape[1:].is_fully_defined()
                or not (spec.dtype.is_integer or spec.dtype.is_floating or spec.dtype == tf.bool)):
            return None
        count = shape[1:].num_elements()
        widths.append(count)
        layouts.append((np.dtype(spec.dtype.as_numpy_dtype), tuple(shape[1:].as_list())))
        row_bytes += count * spec.dtype.size
    if not flat_specs or row_bytes > _MAX_PACKED_ROW_BYTES:
        return None
    return row_bytes, widths, layouts


def pack(element: list, packing: tuple) -> np.ndarray:
    """A flat element's arrays as one packed uint8 array (see `packed_layout`).

    Raises:
      TypeError: a component of another dtype than its spec's.
      ValueError: a component of another shape.
    """
    _, widths, layouts = packing
    if len(element) != len(layouts):
        raise ValueError(f"a batch has {len(element)} components, expected {len(layouts)}")
    rows = len(element[0])
    parts = []
    for i, (array, width, (dtype, shape)) in enumerate(zip(element, widths, layouts)):
        if array.dtype != dtype:
            raise TypeError(f"component {i} of a batch has dtype {array.dtype}, expected {dtype} (its spec's)")
        if array.shape != (rows, *shape):
            raise ValueError(f"component {i} of a batch has shape {list(array.shape)}, expected "
                             f"{[rows, *shape]} ({rows} rows, as component 0)")
        parts.append(np.ascontiguousarray(array).reshape(rows, width).view(np.uint8))
    return np.concatenate(parts, axis=1)  # (`packed_layout` packs at least one component)


def unpack(packed: tf.Tensor, flat_specs: list, packing: tuple) -> list:
    """The components of a packed element (see `packed_layout`), in as few ops as the dtypes allow: every op of
    the traced function runs once per element, and TF-Agents' pipelines hand over a few samples per
    element. A multi-byte component is one reshape to `[rows, *shape, itemsize]` and one bitcast (only the
    bitcast for a scalar one, whose bytes are already `[rows, itemsize]`)."""
    row_bytes, widths, _ = packing
    packed.set_shape([None, row_bytes])
    parts = tf.split(packed, [w * spec.dtype.size for w, spec in zip(widths, flat_specs)], axis=1)
    values = []
    for part, width, spec in zip(parts, widths, flat_specs):
        shape = spec.shape[1:].as_list()
        if width == 0:  # (no bytes to infer the number of rows from)
            values.append(tf.zeros(tf.concat([tf.shape(packed)[:1], shape], 0), spec.dtype))
        elif spec.dtype.size == 1:  # (bool too): `part` is `[rows, width]` already
            if spec.dtype == tf.bool:
                value = tf.cast(part, tf.bool)
            else:
                value = part if spec.dtype == tf.uint8 else tf.bitcast(part, spec.dtype)
            values.append(value if len(shape) == 1 else tf.reshape(value, [-1, *shape]))
        else:
            if shape:
                part = tf.reshape(part, [-1, *shape, spec.dtype.size])
            values.append(tf.bitcast(part, spec.dtype))
    return values
