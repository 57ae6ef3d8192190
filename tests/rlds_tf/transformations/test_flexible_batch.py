"""transformations.batch's blocked path: windows across block boundaries, partial tails, checkpoints.

`test_transformations.py` compares `batch` with rlds 0.1.8; here the expected windows are
computed by hand (and checked against `Dataset.window`), with blocks shrunk to a few rows so that windows
and gaps straddle block boundaries.
"""
import doctest
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from dataset_testlib import assert_iterator_checkpoint_roundtrip
from rlds_tf.transformations import flexible_batch

_PARAMS = [(2, 1, 1, False), (2, 1, 1, True), (3, 1, 2, False), (3, 1, 2, True), (3, 2, 1, False),
           (4, 3, 2, False), (5, 2, 3, True), (2, 3, 1, False), (2, 5, 1, True), (3, 7, 2, False),
           (1, 3, 1, False), (1, 1, 3, True), (4, 4, 2, False), (3, 3, 1, True)]


def _pairs(n):
    return tf.data.Dataset.range(n).map(lambda x: {"x": x, "y": tf.stack([x, -x])})


def _listed(ds):
    return [tf.nest.map_structure(lambda v: v.numpy().tolist(), e) for e in ds]


def _expected(n, size, shift, stride, drop):
    """Hand-computed windows of range(n): starts 0, shift, ...; rows start + k * stride that exist."""
    windows = [[r for r in range(start, start + size * stride, stride) if r < n] for start in range(0, n, shift)]
    return [w for w in windows if len(w) == size or not drop]


@pytest.mark.parametrize("size,shift,stride,drop", _PARAMS)
def test_windows_straddling_blocks(monkeypatch, size, shift, stride, drop):
    for block_rows in (1, 5):  # rounded up to a multiple of `shift`
        monkeypatch.setattr(flexible_batch, "_MAX_BLOCK_ELEMENTS", block_rows)
        for n in (0, 2, 17):
            want = _expected(n, size, shift, stride, drop)
            got = _listed(flexible_batch.batch(_pairs(n), size, shift, stride, drop))
            assert [w["x"] for w in got] == want, (block_rows, n)
            assert [w["y"] for w in got] == [[[r, -r] for r in w] for w in want], (block_rows, n)


def test_hand_computed_windows_match_window_path():
    # The oracle above against tf.data's own windows.
    for size, shift, stride, drop in _PARAMS:
        got = _listed(flexible_batch._windows_by_dataset(tf.data.Dataset.range(9), size, shift, stride, drop))
        assert got == _expected(9, size, shift, stride, drop), (size, shift, stride, drop)


@pytest.mark.parametrize("drop,leading", [(False, None), (True, 3)])
def test_element_spec(drop, leading):
    ds = flexible_batch.batch(_pairs(5), size=3, shift=1, drop_remainder=drop)
    assert ds.element_spec == {"x": tf.TensorSpec([leading], tf.int64), "y": tf.TensorSpec([leading, 2], tf.int64)}


@pytest.mark.parametrize("size,shift,stride,drop", [(3, 1, 2, False), (2, 3, 1, False), (4, 2, 1, True)])
def test_iterator_restores_at_every_position(tmp_path, monkeypatch, size, shift, stride, drop):
    monkeypatch.setattr(flexible_batch, "_MAX_BLOCK_ELEMENTS", 4)  # saves fall mid-block and in the tail
    ds = flexible_batch.batch(_pairs(11), size, shift, stride, drop)
    full = _listed(ds)
    for position in sorted({0, 1, len(full) // 2, len(full) - 2, len(full) - 1, len(full)}):
        assert_iterator_checkpoint_roundtrip(ds, tmp_path, num_before=position)


def test_cardinality_is_the_number_of_batches_made():
    # Counted by iterating: rlds' sliding window reports unknown (or, with drop_remainder, too many).
    for size, shift, stride, drop in _PARAMS:
        for n in (0, 1, 2, 9):
            for ds in (_pairs(n), tf.data.Dataset.range(n).map(lambda x: tf.fill([x - x + 2], x))):  # [None]: window path
                batched = flexible_batch.batch(ds, size, shift, stride, drop)
                assert int(batched.cardinality()) == len(_expected(n, size, shift, stride, drop)) == sum(
                    1 for _ in batched), (size, shift, stride, drop, n)
    assert flexible_batch.batch(_pairs(3).repeat(), 2, 1).cardinality() == tf.data.INFINITE_CARDINALITY
    assert flexible_batch.batch(_pairs(3).filter(lambda e: True), 2, 1).cardinality() == tf.data.UNKNOWN_CARDINALITY


def test_sizes_may_be_numpy_integers_or_static_integer_tensors():
    # As in rlds (int64 tensors; numpy ints from configs).
    want = [[0, 1], [1, 2], [2, 3], [3]]
    for size, shift in [(np.int64(2), np.int32(1)), (tf.constant(2, tf.int64), tf.constant(1, tf.int32))]:
        assert _listed(flexible_batch.batch(tf.data.Dataset.range(4), size, shift)) == want
    assert _listed(flexible_batch.batch(tf.data.Dataset.range(5), np.int64(2))) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("name,kwargs", [("size", {"size": 0}), ("size", {"size": 1.5}), ("size", {"size": True}),
                                          ("shift", {"shift": -2}), ("stride", {"stride": 0}),
                                          ("size", {"size": tf.constant([2, 3])}), ("stride", {"stride": "2"})])
def test_bad_sizes_name_the_argument(name, kwargs):
    with pytest.raises(ValueError, match=rf"{name} must be a positive integer .*got"):
        flexible_batch.batch(tf.data.Dataset.range(4), **{"size": 2, "shift": 1, **kwargs})


def test_large_rows_get_small_blocks():
    # Blocks are sized in bytes: 1 MB rows give one-row blocks, not 4096 MB ones.
    ds = tf.data.Dataset.range(4).map(lambda x: tf.fill([256 * 1024], tf.cast(x, tf.float32)))
    out = [w[:, 0].numpy().tolist() for w in flexible_batch.batch(ds, size=2, shift=1)]
    assert out == [[0, 1], [1, 2], [2, 3], [3]]


def test_rlds_tf_uses_no_private_tensorflow_modules():
    # Principle 1: public TF APIs only (TF's generated `tensorflow.core.*_pb2` protos are public).
    root = pathlib.Path(flexible_batch.__file__).resolve().parents[1]
    private = re.compile(r"^\s*(from|import)\s+tensorflow\.python\b", re.M)
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if private.search(p.read_text())]
    assert offenders == []


def test_doctests():
    result = doctest.testmod(flexible_batch)
    assert result.attempted > 0 and result.failed == 0
