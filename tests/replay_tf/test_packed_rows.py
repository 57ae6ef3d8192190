"""`packed_rows.PackedRows`: batches packed from the rows in-process items keep, and datasets that use them."""
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.sampling import packed_rows
from replay_tf.transport import base as transport_lib
from replay_tf.grpc.client import client_transport
from replay_tf.sampling.signature_checks import numpy_dtype
from replay_tf.wire import stacked_samples
from replay_tf.replay_sample import SampleInfo

_INFO_DTYPES = [numpy_dtype(d) for d in SampleInfo.tf_dtypes()]
# (column, dtype, per-step shape); the columns of an item are 2 steps of each, "flag" squeezed to its last step
_STEP_SPECS = [("a", np.int8, [2]), ("b", np.float64, []), ("c", np.uint16, [2, 2]), ("flag", bool, [3])]
_LAYOUTS = [(np.dtype(np.int8), (2, 2)), (np.dtype(np.float64), (2,)), (np.dtype(np.uint16), (2, 2, 2)),
            (np.dtype(bool), (3,))]


def _step(t: int) -> dict:
    rng = np.random.default_rng(t)
    return {"a": rng.integers(-128, 128, [2]).astype(np.int8), "b": np.float64(rng.normal()),
            "c": rng.integers(0, 1 << 16, [2, 2]).astype(np.uint16), "flag": rng.integers(0, 2, [3]).astype(bool)}


def _expected_columns(t: int) -> list:
    """The columns of the item whose last step is `t` (written below)."""
    steps = [_step(t - 1), _step(t)]
    return [np.stack([s["a"] for s in steps]), np.array([s["b"] for s in steps]),
            np.stack([s["c"] for s in steps]), steps[1]["flag"]]


@pytest.fixture
def server():
    """A uniform table of 7 items, the item of priority t made of steps t - 1 and t (so its data follows
    from its priority), in chunks of 3 steps (so some items span two chunks)."""
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1))])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(8):
            writer.append(_step(t))
            if t >= 1:
                history = writer.history
                writer.create_item("t", float(t), {"a": history["a"][-2:], "b": history["b"][-2:],
                                                   "c": history["c"][-2:], "flag": history["flag"][-1]})
    yield server
    server.stop()


def _expected_rows(samples: list) -> np.ndarray:
    """Packed rows worked out from the written steps: info bytes, then each column's bytes."""
    rows = []
    for s in samples:
        info = [np.array(v, d).tobytes() for v, d in zip(
            (s.item.key, s.probability, s.table_size, s.priority, s.times_sampled), _INFO_DTYPES)]
        t = int(round(s.priority))
        rows.append(b"".join(info + [np.ascontiguousarray(c).tobytes() for c in _expected_columns(t)]))
    return np.frombuffer(b"".join(rows), np.uint8).reshape(len(samples), -1)


def test_a_batch_is_packed_as_info_then_each_columns_bytes(server):
    packer = packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS)
    assert packer.row_bytes == 36 + 4 + 16 + 16 + 3
    samples = server.table("t").sample(5)
    assert len(samples) == 5
    packed = packer.pack(samples)
    assert packed.dtype == np.uint8 and packed.shape == (5, packer.row_bytes)
    np.testing.assert_array_equal(packed, _expected_rows(samples))
    assert packer.pack([]).shape == (0, packer.row_bytes)


def test_items_keep_their_row_and_packers_of_the_same_layout_share_it(server):
    packer = packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS)
    samples = list({s.item.key: s for s in server.table("t").sample(30)}.values())[:3]  # (3 distinct items)
    assert all(packer.kept_row(s.item) is None for s in samples)
    first = packer.pack(samples)
    assert all(packer.kept_row(s.item) is not None for s in samples)
    # A second packer of an equal layout reads the kept rows (marked here) instead of the columns.
    marked = bytes(range(39))
    packer.keep_row(samples[1].item, marked)
    again = packed_rows.PackedRows(list(_INFO_DTYPES), [(d.str, list(s)) for d, s in _LAYOUTS]).pack(samples)
    np.testing.assert_array_equal(again[[0, 2]], first[[0, 2]])
    assert again[1, 36:].tobytes() == marked


def test_rows_are_kept_only_while_the_table_is_within_the_bound(server, monkeypatch):
    row_cost = 39 + packed_rows._ROW_OVERHEAD
    monkeypatch.setattr(packed_rows, "MAX_CACHED_BYTES", 6 * row_cost)  # 6 rows; the table holds 7 items
    samples = server.table("t").sample(2)
    assert packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS).pack(samples) is None  # (stacked by column instead)
    assert all(packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS).kept_row(s.item) is None for s in samples)
    monkeypatch.setattr(packed_rows, "MAX_CACHED_BYTES", 7 * row_cost)
    np.testing.assert_array_equal(packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS).pack(samples),
                                  _expected_rows(samples))
    assert all(packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS).kept_row(s.item) is not None for s in samples)
    monkeypatch.setattr(packed_rows, "MAX_CACHED_BYTES", 6 * row_cost)  # rows kept before are still read
    np.testing.assert_array_equal(packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS).pack(samples),
                                  _expected_rows(samples))


@pytest.mark.parametrize("layouts", [
    [(np.dtype(np.uint8), (2, 2))] + _LAYOUTS[1:],           # another dtype
    _LAYOUTS[:1] + [(np.dtype(np.float64), (3,))] + _LAYOUTS[2:],  # another shape
    _LAYOUTS[:3],                                             # fewer columns
])
def test_items_of_another_layout_are_not_packed(server, layouts):
    samples = server.table("t").sample(2)
    packer = packed_rows.PackedRows(_INFO_DTYPES, layouts)
    assert packer.pack(samples) is None
    assert all(packer.kept_row(s.item) is None for s in samples)


def test_stacked_samples_are_not_packed(server):
    stacked = stacked_samples.StackedSamples(*(np.zeros([1], d) for d in _INFO_DTYPES), columns=[], rate_limited=False)
    assert packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS).pack([stacked]) is None


@pytest.mark.parametrize("batch_size", [None, 3])
def test_in_process_datasets_use_kept_rows_and_yield_what_remote_ones_yield(server, monkeypatch, batch_size):
    address = f"localhost:{server.port}"

    def read(transport):
        monkeypatch.setattr(transport_lib, "make_transport", transport)
        dataset = reverb.TrajectoryDataset(
            address, "t", dtypes={k: tf.as_dtype(d) for k, d, _ in _STEP_SPECS},
            shapes={"a": tf.TensorShape([2, 2]), "b": tf.TensorShape([2]), "c": tf.TensorShape([2, 2, 2]),
                    "flag": tf.TensorShape([3])}, max_in_flight_samples_per_worker=2,
            max_samples=7)
        if batch_size is not None:
            dataset = dataset.batch(batch_size)
        return [tf.nest.map_structure(lambda t: t.numpy(), element) for element in dataset]

    def samples(elements):
        if batch_size is None:
            return elements
        assert [len(e.info.key) for e in elements] == [3, 3, 1]
        return [tf.nest.map_structure(lambda a: a[i], e) for e in elements for i in range(len(e.info.key))]

    items = {item.key: item for item in server.table("t")._items.values()}
    in_process = transport_lib.make_transport
    for transport in (client_transport.Transport, in_process):
        got = samples(read(transport))
        assert len(got) == 7
        for sample in got:
            item = items[int(sample.info.key)]
            assert (sample.info.priority, sample.info.table_size) == (item.priority, 7)
            assert sample.info.probability == pytest.approx(1 / 7) and sample.info.times_sampled >= 1
            for (name, _, _), column in zip(_STEP_SPECS, _expected_columns(int(item.priority))):
                assert sample.data[name].dtype == column.dtype
                np.testing.assert_array_equal(sample.data[name], column)
        packer = packed_rows.PackedRows(_INFO_DTYPES, _LAYOUTS)
        kept = [packer.kept_row(items[int(s.info.key)]) is not None for s in got]
        assert all(kept) if transport is in_process else not any(kept)


def test_an_item_of_another_dtype_after_kept_rows_is_named_as_without_them():
    server = reverb.Server([reverb.Table.queue("q", 10)])  # (no signature: any item is accepted)
    try:
        client = reverb.Client(f"localhost:{server.port}")
        for i in range(3):
            client.insert(np.array([i, -i], np.int32), {"q": 1.0})
        client.insert(np.array([0.5, 1.5], np.float32), {"q": 1.0})
        dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "q", tf.int32, tf.TensorShape([1, 2]),
                                           max_in_flight_samples_per_worker=1)  # (insert: items of one step)
        iterator = iter(dataset)
        assert [next(iterator).data.numpy().tolist() for _ in range(3)] == [[[0, 0]], [[1, -1]], [[2, -2]]]
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"Received incompatible tensor at flattened index 0 from table 'q'"):
            next(iterator)
    finally:
        server.stop()
