"""Nest-aware equality for tensors, numpy values and (nested) tf.data datasets; the ops of their graphs."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
import tree


def to_numpy(value: Any) -> Any:
    """Materializes a value: datasets (also nested ones, e.g. RLDS `steps`) become lists of elements."""
    if isinstance(value, tf.data.Dataset):
        return [to_numpy(element) for element in value]
    if isinstance(value, dict):
        return {key: to_numpy(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(to_numpy(v) for v in value)
    if hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(to_numpy(v) for v in value))
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value.numpy()
    return value


def assert_nested_equal(actual: Any, expected: Any, *, rtol: float = 0.0, atol: float = 0.0,
                        check_dtype: bool = True, path: str = "") -> None:
    """Asserts two nests (of arrays, tensors or datasets) are equal leaf by leaf; the error names the path."""
    actual, expected = to_numpy(actual), to_numpy(expected)
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"at {path or '<root>'}: expected a dict, got {type(actual).__name__}"
        assert sorted(actual) == sorted(expected), (
            f"at {path or '<root>'}: keys differ: got {sorted(actual)}, expected {sorted(expected)}")
        for key in expected:
            assert_nested_equal(actual[key], expected[key], rtol=rtol, atol=atol, check_dtype=check_dtype,
                                path=f"{path}/{key}")
        return
    if isinstance(expected, (list, tuple)) and not isinstance(expected, np.ndarray):
        assert isinstance(actual, (list, tuple)), (
            f"at {path or '<root>'}: expected a sequence, got {type(actual).__name__}")
        assert len(actual) == len(expected), (
            f"at {path or '<root>'}: lengths differ: got {len(actual)}, expected {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_nested_equal(a, e, rtol=rtol, atol=atol, check_dtype=check_dtype, path=f"{path}[{i}]")
        return
    a, e = np.asarray(actual), np.asarray(expected)
    where = path or "<root>"
    if check_dtype:
        assert a.dtype == e.dtype, f"at {where}: dtype {a.dtype} != expected {e.dtype}"
    assert a.shape == e.shape, f"at {where}: shape {a.shape} != expected {e.shape}"
    if a.dtype.kind in "fc" and (rtol or atol):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"at {where}")
    else:
        np.testing.assert_array_equal(a, e, err_msg=f"at {where}")


def flatten_with_paths(nest: Any) -> dict[str, Any]:
    """`{'a/b': leaf}` for every leaf of a nest: the same keys `emit_tree` uses in the peer."""
    return {"/".join(str(p) for p in path): leaf for path, leaf in tree.flatten_with_path(nest)}


def assert_iterator_checkpoint_roundtrip(dataset: tf.data.Dataset, directory, num_before: int) -> None:
    """Saves an iterator of `dataset` after `num_before` elements with `tf.train.Checkpoint`, then asserts that
    the elements before and after the save make up the whole dataset, and that restoring the save replays
    exactly the elements after it."""
    def listed(elements):
        return [tf.nest.map_structure(lambda v: v.numpy().tolist(), element) for element in elements]

    full = listed(dataset)
    iterator = iter(dataset)
    head = listed(next(iterator) for _ in range(num_before))
    checkpoint = tf.train.Checkpoint(it=iterator)
    path = checkpoint.save(str(directory / f"ckpt-{num_before}"))
    rest = listed(iterator)
    assert head + rest == full, f"saving after {num_before} elements changed what the iterator yields"
    checkpoint.restore(path)
    assert listed(iterator) == rest, f"restoring the save made after {num_before} elements did not replay the rest"


def graph_nodes(graph_def) -> list:
    """The nodes of a `GraphDef` and of every function in its library."""
    return list(graph_def.node) + [node for function in graph_def.library.function for node in function.node_def]


def dataset_graph(dataset: tf.data.Dataset):
    """The `GraphDef` of a dataset's pipeline (its functions in the library)."""
    return tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
