"""Faults: writers and servers killed with `kill -9` (also in the middle of a checkpoint), and samplers blocked
on a rate limiter when their server goes away. Nothing may hang; what was confirmed or checkpointed survives.

The processes are `_replay_procs.py` roles (see there); a server restored in this test's process from the dead
server's checkpoint directory plays "the restarted server" so that every item can be inspected directly.
"""
import gc
import os
import random
import signal
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf import checkpointing

from proc_testlib import Proc, remote_client

pytestmark = pytest.mark.slow  # server and writer processes, killed and restarted

_HANG_S = 60  # a blocked call that has not ended after this long is a hang


def _tables_module():
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_replay_procs.py")
    spec = importlib.util.spec_from_file_location("_replay_procs_for_tests", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


procs_lib = _tables_module()


def _in_thread(fn):
    """Runs `fn` in a daemon thread; returns (thread, outcome dict with 'error' or 'result')."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
        except BaseException as e:  # noqa: BLE001
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _blocked_samplers(address: str, table: str):
    """A `client.sample` and a `TrajectoryDataset` iteration of `table`, each in a thread, both blocked."""
    client = reverb.Client(address)
    dataset = reverb.TrajectoryDataset(address, table, dtypes=(tf.float32,), shapes=(tf.TensorShape([]),),
                                       max_in_flight_samples_per_worker=4)
    calls = [_in_thread(lambda: next(client.sample(table))), _in_thread(lambda: next(iter(dataset)))]
    time.sleep(1.0)
    for thread, outcome in calls:
        assert thread.is_alive(), f"the sampler should be blocked on the rate limiter, got {outcome}"
    return calls


def _join(calls):
    errors = []
    for thread, outcome in calls:
        thread.join(_HANG_S)
        assert not thread.is_alive(), "a sampler blocked on a rate limiter hung after its server went away"
        assert "error" in outcome, f"the blocked sample returned {outcome} instead of failing"
        errors.append(outcome["error"])
    return errors


# --- samplers blocked on a rate limiter ---

@pytest.mark.parametrize("transport", ["in_process", "grpc"])
def test_server_stop_releases_blocked_samplers_with_a_clear_error(transport):
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                                         reverb.rate_limiters.MinSize(2)),
                            reverb.Table.queue("full", 1)])
    # "ipv4:127.0.0.1:<port>" is a gRPC target that is not this process's server address: gRPC is used.
    address = f"localhost:{server.port}" if transport == "in_process" else f"ipv4:127.0.0.1:{server.port}"
    client = reverb.Client(address)
    client.insert(np.float32(1.0), priorities={"t": 1.0})  # below min_size_to_sample
    client.insert(np.float32(1.0), priorities={"full": 1.0})
    calls = _blocked_samplers(address, "t")
    if transport == "in_process":
        # An in-process writer blocked on the other side of a rate limiter is released the same way. (Remote
        # writers reconnect after CANCELLED and UNAVAILABLE, as Reverb's do: their flush takes a timeout.)
        calls.append(_in_thread(lambda: client.insert(np.float32(2.0), priorities={"full": 1.0})))
        time.sleep(0.5)
        assert calls[-1][0].is_alive(), calls[-1][1]
    server.stop()
    sample_error, dataset_error, *insert_error = _join(calls)
    assert isinstance(sample_error, reverb.errors.CancelledError), repr(sample_error)
    assert "Table 't' has been closed (its server was stopped)" in str(sample_error)
    # (a dataset raises it through a failed assert, which escapes the quotes)
    assert "Table 't' has been closed (its server was stopped)" in str(dataset_error).replace("\\'", "'"), \
        repr(dataset_error)
    for error in insert_error:
        assert isinstance(error, reverb.errors.CancelledError), repr(error)
        assert "Table 'full' has been closed (its server was stopped)" in str(error)


def test_server_process_killed_releases_blocked_remote_samplers(tmp_path):
    server = Proc("serve", {"tables": "checkpoint"}, str(tmp_path), "server")
    try:
        address = f"localhost:{server.expect('READY', 120)}"
        calls = _blocked_samplers(address, "empty")
        os.kill(server.pid, signal.SIGKILL)
        sample_error, dataset_error = _join(calls)
    finally:
        server.close()
    assert isinstance(sample_error, reverb.errors.ReverbError), repr(sample_error)
    assert "Sampling table 'empty' failed" in str(sample_error)
    assert "Sampling table 'empty' failed" in str(dataset_error), repr(dataset_error)


# --- a writer killed mid-stream ---

def _live_chunk_keys(server) -> set:
    return {key for table in server.tables.values() for item in table.items_snapshot() for key in item.chunks}


def _wait_for(condition, what: str, timeout_s: float = _HANG_S):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_writer_killed_mid_stream_frees_its_chunks_and_others_go_on(tmp_path):
    server = reverb.Server(procs_lib._tables("faults"))
    address = f"localhost:{server.port}"
    victim = Proc("fault_writer", {"index": 1, "address": address, "items": 30, "block": True},
                  str(tmp_path), "victim")
    survivor = Proc("fault_writer", {"index": 2, "address": address, "items": 40, "pause": True},
                    str(tmp_path), "survivor")
    try:
        victim.expect("STUCK", 180)
        survivor.expect("HALF", 180)
        q, full = server.tables["q"], server.tables["full"]
        # The victim's second 'full' item waits on the queue's rate limiter: its chunk is held by its stream
        # only (no table item refers to it).
        _wait_for(lambda: len(server.chunk_store) > len(_live_chunk_keys(server)),
                  f"the blocked item's chunks are not held: {len(server.chunk_store)} chunks for "
                  f"{len(_live_chunk_keys(server))} live ones")
        os.kill(victim.pid, signal.SIGKILL)
        # Freed at once (no garbage collection needed: nothing of the dead stream lingers in reference cycles).
        _wait_for(lambda: len(server.chunk_store) == len(_live_chunk_keys(server)),
                  "the killed writer's chunks were not freed")
        assert full.size() == 1 and q.size() == 70
        survivor.send("GO")  # the survivor's stream, open across the kill, goes on
        assert survivor.report(120) == {"items": 80}
        assert survivor.wait(60) == 0
        writers = [int(item.column_arrays()[0][0]) for item in q.items_snapshot()]
        assert writers.count(1) == 30 and writers.count(2) == 80
        survivor_values = sorted(float(item.column_arrays()[1][0, 0]) for item in q.items_snapshot()
                                 if int(item.column_arrays()[0][0]) == 2)
        assert survivor_values == [float(i) for i in range(80)]
        gc.collect()
        assert len(server.chunk_store) == len(_live_chunk_keys(server))
        # The server still serves: a new writer's item arrives.
        reverb.Client(address).insert({"w": np.int32(3), "x": np.zeros([64], np.float32)}, priorities={"q": 1.0})
        assert q.size() == 111
    finally:
        victim.close()
        survivor.close()
        server.stop()


# --- a server killed after, or during, a checkpoint ---

def _restore(root):
    return reverb.Server(procs_lib.checkpoint_tables(), checkpointer=reverb.checkpointers.DefaultCheckpointer(root))


def _counters(info) -> dict:
    return {name: (t.current_size, t.num_episodes, t.num_deleted_episodes, t.num_unique_samples,
                   t.rate_limiter_info.insert_stats.completed, t.rate_limiter_info.sample_stats.completed)
            for name, t in info.items()}


def test_server_killed_after_checkpoint_restarts_with_everything(tmp_path):
    root = str(tmp_path / "ckpt")
    server = Proc("serve", {"tables": "checkpoint", "checkpoint_dir": root}, str(tmp_path), "server")
    try:
        address = f"localhost:{server.expect('READY', 120)}"
        client = reverb.Client(address)
        rng = np.random.default_rng(0)
        priorities = {}
        for i in range(30):
            priorities[i] = float(rng.uniform(0.5, 4.0))
            tables = {"prio": priorities[i], "uniform": 1.0} if i < 20 else {"prio": priorities[i]}
            client.insert({"id": np.int64(i), "x": np.full([8], i, np.float32)}, priorities=tables)
        times = {"prio": {}, "uniform": {}}
        key_of = {"prio": {}, "uniform": {}}
        for table, count in (("prio", 60), ("uniform", 25)):
            for sample in client.sample(table, count, emit_timesteps=False):
                i = int(sample.data[0][0])
                key_of[table][i] = int(sample.info.key)
                times[table][i] = times[table].get(i, 0) + 1
                assert int(sample.info.times_sampled) == times[table][i]
        sampled = sorted(key_of["prio"])
        deleted, updated = sampled[:3], sampled[3:8]
        for i in updated:
            priorities[i] = float(rng.uniform(5.0, 9.0))
        client.mutate_priorities("prio", updates={key_of["prio"][i]: priorities[i] for i in updated},
                                 deletes=[key_of["prio"][i] for i in deleted])
        before = _counters(client.server_info())
        path = client.checkpoint()
        # What happens after the checkpoint is lost with the process.
        client.insert({"id": np.int64(99), "x": np.zeros([8], np.float32)}, priorities={"prio": 1.0})
        list(client.sample("prio", 5))
        os.kill(server.pid, signal.SIGKILL)
        assert server.wait(30) == -signal.SIGKILL
    finally:
        server.close()

    restored = _restore(root)  # the restarted server: another process, the same directory
    try:
        assert restored.checkpointer.latest_checkpoint() == path
        assert _counters(remote_client(f"localhost:{restored.port}").server_info()) == before
        for table in ("prio", "uniform"):
            got = {}
            for item in restored.tables[table].items_snapshot():
                ids, x = item.column_arrays()
                i = int(ids[0])
                np.testing.assert_array_equal(x, np.full([1, 8], i, np.float32))
                got[i] = (item.priority, item.times_sampled, item.key)
            live = [i for i in range(30) if not (table == "prio" and i in deleted)]
            if table == "uniform":
                live = list(range(20))
            assert sorted(got) == live
            for i in live:
                expected_priority = priorities[i] if table == "prio" else 1.0
                assert got[i][0] == pytest.approx(expected_priority, rel=1e-6), (table, i)
                assert got[i][1] == times[table].get(i, 0), (table, i)
                if i in key_of[table]:
                    assert got[i][2] == key_of[table][i]
        # Sampling goes on from the restored state (prioritized probabilities over the restored priorities).
        live_priorities = {i: p for i, p in priorities.items() if i not in deleted}
        total = sum(p ** 0.6 for p in live_priorities.values())
        for sample in restored.localhost_client().sample("prio", 20, emit_timesteps=False):
            i = int(sample.data[0][0])
            assert sample.info.probability == pytest.approx(live_priorities[i] ** 0.6 / total, rel=1e-5)
            assert sample.info.table_size == 27
    finally:
        restored.stop()


def _fill_large(client, count: int, start: int) -> None:
    rng = np.random.default_rng(start)
    for i in range(start, start + count):  # incompressible: the checkpoint write takes a while
        client.insert({"id": np.int64(i), "x": rng.standard_normal([256 * 1024]).astype(np.float32)},
                      priorities={"uniform": 1.0})


def _kill_mid_write(pid: int, root: str, threshold: int) -> None:
    """SIGKILLs `pid` once the checkpoint being written under `root` has `threshold` bytes of chunk records
    (of ~48 MiB, written record by record): somewhere in the write, never after it (polled every 0.5 ms; a
    timed sleep could outlast a fast write)."""
    deadline = time.monotonic() + _HANG_S
    seen = None
    while True:
        partial = [n for n in os.listdir(root) if n.startswith(".partial-")]
        if partial:
            seen = partial[0]
            try:
                if os.path.getsize(os.path.join(root, seen, checkpointing._CHUNKS_FILE)) >= threshold:
                    break
            except FileNotFoundError:
                pass
        assert not (seen and not partial), "the checkpoint completed before reaching the kill threshold"
        assert time.monotonic() < deadline, "the checkpoint never started"
        time.sleep(0.0005)
    os.kill(pid, signal.SIGKILL)


def test_server_killed_while_writing_a_checkpoint_restores_the_previous_one(tmp_path):
    root = str(tmp_path / "ckpt")
    server = Proc("serve", {"tables": "checkpoint", "checkpoint_dir": root}, str(tmp_path), "server")
    try:
        address = f"localhost:{server.expect('READY', 120)}"
        client = reverb.Client(address)
        for i in range(3):
            client.insert({"id": np.int64(i), "x": np.full([8], i, np.float32)}, priorities={"prio": 1.0})
        list(client.sample("prio", 4))
        before = _counters(client.server_info())
        first = client.checkpoint()
        _fill_large(client, 48, start=100)  # ~48 MiB to write
        writing, outcome = _in_thread(client.checkpoint)
        _kill_mid_write(server.pid, root, threshold=int(random.uniform(1, 24) * (1 << 20)))
        writing.join(_HANG_S)
        assert not writing.is_alive() and "error" in outcome, outcome
    finally:
        server.close()
    partial = [n for n in os.listdir(root) if n.startswith(".partial-")]
    assert len(partial) == 1, f"the kill came after the checkpoint completed ({os.listdir(root)}): make it larger"
    interrupted = os.path.join(root, partial[0])
    assert not os.path.exists(os.path.join(interrupted, "DONE"))
    assert sorted(n for n in os.listdir(root) if not n.startswith(".")) == [os.path.basename(first)]
    restored = _restore(root)
    try:
        assert _counters(remote_client(f"localhost:{restored.port}").server_info()) == before
        assert sorted(int(item.column_arrays()[0][0]) for item in restored.tables["prio"].items_snapshot()) == [0, 1, 2]
        # The next checkpoint clears the interrupted one's leftovers.
        restored.checkpoint()
        assert not os.path.exists(interrupted)
    finally:
        restored.stop()


@pytest.mark.parametrize("crash_point", ["no_done_file", "truncated_records", "empty_directory"])
def test_newer_incomplete_checkpoint_directory_is_never_loaded(tmp_path, crash_point):
    """What a crash can leave next to a complete checkpoint, built by hand; the loader takes the complete one.

    A crash before the rename leaves `.partial-<name>`; these cases also cover a directory under a final-looking
    (newer) name, as a copy or a file system without atomic rename could leave it."""
    root = str(tmp_path)
    server = reverb.Server(procs_lib.checkpoint_tables(),
                           checkpointer=checkpointing.DirectoryCheckpointer(root, keep_latest=2))
    client = server.localhost_client()
    client.insert({"id": np.int64(7), "x": np.zeros([8], np.float32)}, priorities={"prio": 2.0})
    complete = server.checkpoint()
    client.insert({"id": np.int64(8), "x": np.zeros([8], np.float32)}, priorities={"prio": 2.0})
    newer = server.checkpoint()
    server.stop()
    for name in os.listdir(newer):
        path = os.path.join(newer, name)
        if crash_point == "no_done_file" and name == "DONE":
            os.unlink(path)
        elif crash_point == "truncated_records" and name != "DONE":
            with open(path, "r+b") as f:
                f.truncate(max(0, os.path.getsize(path) // 2))
            if name == "items.records":
                os.unlink(os.path.join(newer, "DONE"))
        elif crash_point == "empty_directory":
            os.unlink(path)
    os.rename(newer, os.path.join(root, "99991231T235959.999999Z"))
    checkpointer = reverb.checkpointers.DefaultCheckpointer(root)
    assert checkpointer.latest_checkpoint() == complete
    restored = _restore(root)
    try:
        assert [int(item.column_arrays()[0][0]) for item in restored.tables["prio"].items_snapshot()] == [7]
    finally:
        restored.stop()


def test_checkpoint_taken_while_clients_insert_and_sample_is_consistent(tmp_path):
    """Items, their times_sampled and the counters are read at one instant: restored counters are exact."""
    root = str(tmp_path)
    server = reverb.Server(procs_lib.checkpoint_tables(),
                           checkpointer=checkpointing.DirectoryCheckpointer(root, keep_latest=10))
    client = server.localhost_client()
    stop = threading.Event()

    def insert():
        i = 0
        while not stop.is_set():
            client.insert({"id": np.int64(i), "x": np.zeros([8], np.float32)}, priorities={"uniform": 1.0})
            i += 1

    def sample():
        while not stop.is_set():
            list(client.sample("uniform", 8))

    threads = [threading.Thread(target=insert), threading.Thread(target=sample)]
    for t in threads:
        t.start()
    paths = []
    try:
        _wait_for(lambda: server.tables["uniform"].size() > 20, "no inserts")
        for _ in range(5):
            paths.append(server.checkpoint())
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
        server.stop()
    for path in paths:
        fresh = reverb.Server(procs_lib.checkpoint_tables())
        try:
            checkpointing.DirectoryCheckpointer(root).load(path, fresh)
            table = fresh.tables["uniform"]
            state = table.state_snapshot()
            items = table.items_snapshot()
            # Nothing is deleted in this table: every insert is an item, every sample a times_sampled.
            assert state["inserts"] == len(items) and state["deletes"] == 0
            assert state["samples"] == sum(item.times_sampled for item in items)
            assert state["num_unique_samples"] == sum(item.times_sampled > 0 for item in items)
        finally:
            fresh.stop()
