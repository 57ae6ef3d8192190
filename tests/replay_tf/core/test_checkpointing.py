"""DirectoryCheckpointer: what a checkpoint holds, restore at start, atomicity and rate-limiter restore."""
import os

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf import checkpointing


def _server(root, tables=None, **kwargs):
    tables = tables or [
        reverb.Table("fifo", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100, reverb.rate_limiters.MinSize(1)),
        reverb.Table("prio", reverb.selectors.Prioritized(0.8), reverb.selectors.Fifo(), 100,
                     reverb.rate_limiters.SampleToInsertRatio(2.0, 1, 100.0),
                     signature=tf.TensorSpec([3], tf.float32)),
    ]
    return reverb.Server(tables, checkpointer=checkpointing.DirectoryCheckpointer(str(root), **kwargs))


def _fill(server):
    client = reverb.Client(f"localhost:{server.port}")
    for t in range(5):
        client.insert(np.full([3], t, np.float32), priorities={"fifo": 1.0, "prio": float(t + 1)})
    list(client.sample("prio", 4))
    client.mutate_priorities("prio", updates={})
    return client


def _state(server):
    out = {}
    for name, table in sorted(server.tables.items()):
        items = [(it.key, it.priority, it.times_sampled, it.inserted_at, [c.tolist() for c in it.column_arrays()])
                 for it in table.items_snapshot()]
        out[name] = (items, table.state_snapshot())
    return out


def test_round_trip_restores_items_order_priorities_and_counters(tmp_path):
    server = _server(tmp_path / "a")
    _fill(server)
    before = _state(server)
    path = server.checkpoint()
    assert os.path.dirname(path) == str(tmp_path / "a")
    assert sorted(os.listdir(path)) == ["DONE", "chunks.records", "items.records", "tables.records"]
    server.stop()

    restored = _server(tmp_path / "a")
    assert _state(restored) == before
    # Chunks shared by the two tables' items are restored once and shared again.
    fifo = restored.tables["fifo"].items_snapshot()
    prio = {it.key: it for it in restored.tables["prio"].items_snapshot()}
    assert len({id(c) for it in fifo for c in it.chunks.values()}) == 5
    # FIFO order survives: the oldest inserted item is sampled first.
    client = reverb.Client(f"localhost:{restored.port}")
    [timestep] = next(client.sample("fifo"))
    assert timestep.data[0].tolist() == [0.0, 0.0, 0.0]
    assert prio
    restored.stop()


def test_newest_complete_checkpoint_is_restored_and_old_ones_deleted(tmp_path):
    server = _server(tmp_path, keep_latest=2)
    client = reverb.Client(f"localhost:{server.port}")
    paths = []
    for t in range(3):
        client.insert(np.zeros([3], np.float32), priorities={"fifo": 1.0})
        paths.append(server.checkpoint())
    server.stop()
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in paths[1:])
    restored = _server(tmp_path)
    assert restored.tables["fifo"].size() == 3
    restored.stop()


def test_crash_while_writing_keeps_previous_checkpoint(tmp_path, monkeypatch):
    server = _server(tmp_path)
    client = reverb.Client(f"localhost:{server.port}")
    client.insert(np.zeros([3], np.float32), priorities={"fifo": 1.0})
    first = server.checkpoint()
    client.insert(np.zeros([3], np.float32), priorities={"fifo": 1.0})

    real_write = checkpointing._write_records
    calls = []

    def crashing_write(path, records):
        calls.append(path)
        if len(calls) == 2:  # chunks written, then the "crash" while writing items
            raise KeyboardInterrupt("power cut")
        real_write(path, records)

    monkeypatch.setattr(checkpointing, "_write_records", crashing_write)
    with pytest.raises(KeyboardInterrupt):
        server.checkpoint()
    monkeypatch.setattr(checkpointing, "_write_records", real_write)
    # A leftover partial directory (as a killed process would leave) is ignored.
    os.makedirs(tmp_path / ".partial-99990101T000000.000000Z")
    assert server.checkpointer.latest_checkpoint() == first
    server.stop()
    restored = _server(tmp_path)
    assert restored.tables["fifo"].size() == 1
    restored.stop()


def test_corrupt_record_is_a_precise_error(tmp_path):
    server = _server(tmp_path)
    _fill(server)
    path = server.checkpoint()
    server.stop()
    with open(os.path.join(path, "items.records"), "r+b") as f:
        f.seek(20)
        f.write(b"\xff\xff\xff")
    with pytest.raises(checkpointing.CheckpointError, match=r"items.records: truncated or corrupt record"):
        _server(tmp_path)


def test_checkpointed_table_missing_from_server(tmp_path):
    server = _server(tmp_path)
    _fill(server)
    server.checkpoint()
    server.stop()
    with pytest.raises(ValueError, match=r"tables \['prio'\] that the server does not have"):
        _server(tmp_path, tables=[reverb.Table.queue("fifo", 10)])


def test_changed_rate_limiter_starts_balanced_instead_of_blocking(tmp_path):
    # reverb#103: a restored limiter with stale counters could block inserts forever.
    limiter = reverb.rate_limiters.SampleToInsertRatio(1.0, 1, 3.0)
    table = reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100, limiter)
    server = _server(tmp_path, tables=[table])
    client = reverb.Client(f"localhost:{server.port}")
    for _ in range(4):
        client.insert(np.zeros([1], np.float32), priorities={"t": 1.0})
    server.checkpoint()
    server.stop()
    # Same settings: counters exactly as saved.
    same = _server(tmp_path, tables=[table.replace()])
    assert same.tables["t"].state_snapshot()["inserts"] == 4
    assert not same.tables["t"].can_insert(1)  # error 4 + 1 > max_diff 4: as before the restart
    same.stop()
    # New settings (spi 0.5): the 4 restored items count as fresh inserts, so inserts are admitted.
    changed = _server(tmp_path, tables=[table.replace(
        rate_limiter=reverb.rate_limiters.SampleToInsertRatio(0.5, 1, 3.0))])
    state = changed.tables["t"].state_snapshot()
    assert (state["inserts"], state["samples"], state["deletes"]) == (4, 0, 0)
    assert changed.tables["t"].can_insert(1) and changed.tables["t"].can_sample(1)
    changed.stop()


def test_checkpointers_module_doctests():
    import doctest
    from replay_tf import checkpointers
    failures, _ = doctest.testmod(checkpointers, raise_on_error=False, verbose=False)
    assert failures == 0


def test_default_checkpointer_round_trip_through_client_checkpoint(tmp_path):
    def tables():
        return [reverb.Table.queue("q", 10, signature=tf.TensorSpec([1], tf.int32))]

    server = reverb.Server(tables(), checkpointer=reverb.checkpointers.DefaultCheckpointer(str(tmp_path)))
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(3):
        client.insert(np.int32(i), {"q": 1.0})
    [first] = next(client.sample("q"))
    assert int(first.data[0]) == 0
    path = client.checkpoint()
    assert os.path.dirname(path) == str(tmp_path)
    server.stop()

    restored = reverb.Server(tables(), checkpointer=reverb.checkpointers.DefaultCheckpointer(str(tmp_path)))
    try:
        info = restored.localhost_client().server_info()["q"]
        assert info.current_size == 2
        assert info.rate_limiter_info.insert_stats.completed == 3
        assert info.rate_limiter_info.sample_stats.completed == 1
        dataset = reverb.TrajectoryDataset.from_table_signature(restored.address, "q", 2, rate_limiter_timeout_ms=0)
        assert [int(s.data[0]) for s in dataset] == [1, 2]
    finally:
        restored.stop()


@pytest.mark.parametrize("make, error", [
    (lambda path: reverb.checkpointers.DefaultCheckpointer(path, group="g"), r"group \('g'\) must be empty"),
    (lambda path: reverb.checkpointers.default_checkpointer(group="g"), r"group \('g'\) must be None or empty"),
])
def test_checkpoint_groups_are_refused(tmp_path, make, error):
    with pytest.raises(ValueError, match=error):
        make(str(tmp_path))


def test_temp_dir_and_default_checkpointers(tmp_path):
    fallback = reverb.checkpointers.DefaultCheckpointer(str(tmp_path / "a"), fallback_checkpoint_path="/x")
    assert fallback.path == str(tmp_path / "a") and fallback.fallback_checkpoint_path == "/x"
    assert fallback.latest_checkpoint() == "/x"
    first, second = reverb.checkpointers.default_checkpointer(), reverb.checkpointers.TempDirCheckpointer()
    assert isinstance(first, reverb.checkpointers.TempDirCheckpointer)
    assert isinstance(first, reverb.checkpointers.DirectoryCheckpointer)
    assert first.path != second.path and os.path.isdir(first.path)
    assert first.latest_checkpoint() is None
    os.rmdir(first.path)
    os.rmdir(second.path)
