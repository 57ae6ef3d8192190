"""`sampling.sources`: the source of a dataset's batches, picked once when the dataset is built (shared where
nothing a user can tell changes, per iterator otherwise), and the rows `packed_rows` keeps for items."""
import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.sampling import packed_rows
from replay_tf.sampling.per_iterator import PerIteratorBatches
from replay_tf.sampling.shared_samples import SharedBatches
from replay_tf.timestep_dataset import _Items

_DTYPES = {"obs": tf.float32, "step": tf.int64}
_SHAPES = {"obs": tf.TensorShape([2, 3]), "step": tf.TensorShape([2])}


def _server(max_times_sampled: int = 0):
    table = reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                         reverb.rate_limiters.MinSize(1), max_times_sampled=max_times_sampled)
    server = reverb.Server([table])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for i in range(6):
            writer.append({"obs": np.full([3], i, np.float32), "step": np.int64(i)})
            if i:
                writer.create_item("t", 1.0, {k: v[-2:] for k, v in writer.history.items()})
    return server, client


class _Subclass(reverb.TrajectoryDataset):
    pass


class _NotShared(reverb.TrajectoryDataset):
    _MAY_SHARE_SAMPLES = False


@pytest.mark.parametrize("kind, kwargs, env, max_times_sampled, expected", [
    (reverb.TrajectoryDataset, {}, "1", 0, SharedBatches),
    (_Subclass, {}, "1", 0, SharedBatches),
    (reverb.TrajectoryDataset, {}, "0", 0, PerIteratorBatches),               # turned off
    (reverb.TrajectoryDataset, {}, "1", 1, PerIteratorBatches),               # sampling deletes items
    (reverb.TrajectoryDataset, {"num_workers_per_iterator": 2}, "1", 0, PerIteratorBatches),
    (reverb.TrajectoryDataset, {"max_samples": 5}, "1", 0, PerIteratorBatches),
    (reverb.TrajectoryDataset, {"rate_limiter_timeout_ms": 100}, "1", 0, PerIteratorBatches),
    (_NotShared, {}, "1", 0, PerIteratorBatches),                             # the subclass's choice
])
def test_the_source_is_picked_when_the_dataset_is_built(monkeypatch, kind, kwargs, env, max_times_sampled,
                                                        expected):
    monkeypatch.setenv("REPLAY_TF_SHARED_SAMPLES", env)
    server, _ = _server(max_times_sampled)
    try:
        dataset = kind(f"localhost:{server.port}", "t", _DTYPES, _SHAPES, max_in_flight_samples_per_worker=3,
                       **kwargs)
        assert type(dataset._batches) is expected
        keys = {item.key for item in server.table("t")._items.values()}
        got = [int(s.info.key) for s in dataset.take(4)]
        assert len(got) == 4 and set(got) <= keys
    finally:
        server.stop()


def test_variable_shapes_and_timestep_items_are_read_per_iterator():
    server, _ = _server()
    try:
        address = f"localhost:{server.port}"
        variable = reverb.TrajectoryDataset(address, "t", _DTYPES,
                                            {"obs": tf.TensorShape([None, 3]), "step": tf.TensorShape([None])},
                                            max_in_flight_samples_per_worker=3)
        assert type(variable._batches) is PerIteratorBatches
        timesteps = reverb.TimestepDataset(address, "t", _DTYPES,
                                           {"obs": tf.TensorShape([3]), "step": tf.TensorShape([])},
                                           max_in_flight_samples_per_worker=3)
        assert isinstance(timesteps._items, _Items) and type(timesteps._items._batches) is PerIteratorBatches
        steps = [int(s.data["step"]) for s in timesteps.take(2)]  # (the two timesteps of one item)
        assert steps[1] == steps[0] + 1
    finally:
        server.stop()


def test_a_kept_row_goes_with_its_item():
    server, client = _server()
    try:
        packer = packed_rows.PackedRows([np.uint64, np.float64, np.int64, np.float64, np.int32],
                                        [(np.float32, (2, 3)), (np.int64, (2,))])
        samples = server.table("t").sample(20)
        assert packer.pack(samples) is not None
        items = {s.item.key: weakref.ref(s.item) for s in samples}
        ids = {key: id(ref()) for key, ref in items.items()}
        assert all(packer.kept_row(ref()) is not None for ref in items.values())
        del samples
        client.reset("t")
        gc.collect()
        assert all(ref() is None for ref in items.values())
        assert not set(ids.values()) & set(packer._kept.rows)
    finally:
        server.stop()
