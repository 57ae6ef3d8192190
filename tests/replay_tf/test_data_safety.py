"""Confirmed data is never lost or mixed up: unique keys, refused collisions, poisoned chunks, checkpoints that
fail, run at once or are crafted, and a server stopped while writers insert."""
import errno
import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf import cli
from replay_tf import checkpointing
from replay_tf.core import chunk_store
from replay_tf.wire import chunk_codec
from replay_tf.wire import tensor_codec
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

import proc_testlib

_PREFIX = "/deepmind.reverb.ReverbService/"


def _uniform_table(name="t", max_size=1000, **kwargs):
    return reverb.Table(name, reverb.selectors.Uniform(), reverb.selectors.Fifo(), max_size,
                        reverb.rate_limiters.MinSize(1), **kwargs)


def _chunk(key, values, episode=1):
    values = np.asarray(values, np.float32)
    return chunk_store.Chunk(key, [values], chunk_store.SequenceRange(episode, 0, len(values) - 1))


def _item(key, chunk, priority=1.0):
    column = chunk_store.Column((chunk_store.ChunkSlice(chunk.key, 0, chunk.num_rows, 0),))
    return chunk_store.Item(key, priority, (column,), [chunk])


def _insert_request(chunks=(), items=(), keep=()):
    """An InsertStreamRequest: `items` are `(key, table, chunk, priority)`, each over all rows of `chunk`."""
    request = reverb_service_pb2.InsertStreamRequest(keep_chunk_keys=list(keep))
    for chunk in chunks:
        request.chunks.append(chunk_codec.chunk_to_proto(chunk))
    for key, table, chunk, priority in items:
        item = request.items.add(key=key, table=table, priority=priority)
        item.flat_trajectory.columns.add().chunk_slices.add(chunk_key=chunk.key, offset=0, length=chunk.num_rows)
    return request.SerializeToString()


def _insert_stream(channel, requests, timeout=20):
    """The confirmed keys of one InsertStream call."""
    call = channel.stream_stream(_PREFIX + "InsertStream", request_serializer=lambda b: b,
                                 response_deserializer=reverb_service_pb2.InsertStreamResponse.FromString)
    return [key for response in call(iter(requests), timeout=timeout) for key in response.keys]


# --- 1. keys ---

def _write_seeded_items(client, count):
    random.seed(0)  # what actor code often does; the writer's keys must not follow it
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for step in range(count):
            writer.append({"x": np.float32(step)})
            writer.create_item("t", 1.0, {"x": writer.history["x"][-1]})
        writer.flush()


def test_two_writers_after_the_same_random_seed_keep_all_their_items():
    server = reverb.Server([_uniform_table()])
    try:
        client = server.localhost_client()
        _write_seeded_items(client, 100)
        _write_seeded_items(client, 100)
        table = server.tables["t"]
        assert table.size() == 200
        values = sorted(float(item.column_arrays()[0]) for item in table.items_snapshot())
        assert values == sorted([float(v) for v in range(100)] * 2)
    finally:
        server.stop()


def test_keys_ignore_the_global_random_state():
    random.seed(0)
    first = [chunk_store.new_key() for _ in range(3)]
    random.seed(0)
    assert [chunk_store.new_key() for _ in range(3)] != first
    servers = []
    for _ in range(2):
        random.seed(0)
        servers.append(reverb.Server([_uniform_table()]))
    for server in servers:
        server.stop()
    assert servers[0].tables_state_id != servers[1].tables_state_id


@pytest.mark.slow
def test_a_forked_child_draws_other_keys_than_its_parent():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next key, then exit without running the parent's cleanup
        os.close(read_end)
        os.write(write_end, chunk_store.new_key().to_bytes(8, "little"))
        os._exit(0)
    os.close(write_end)
    parent_key = chunk_store.new_key()
    with os.fdopen(read_end, "rb") as pipe:
        child_key = int.from_bytes(pipe.read(), "little")
    os.waitpid(pid, 0)
    assert child_key != parent_key


def test_table_refuses_a_different_item_under_a_used_key():
    table = _uniform_table()
    assert table.insert_or_assign(_item(5, _chunk(50, [1.0, 2.0])))
    with pytest.raises(ValueError, match=r"item key 5 is already used in table 't' by an item with other data"):
        table.insert_or_assign(_item(5, _chunk(51, [1.0, 2.0])))
    with pytest.raises(ValueError, match=r"item key 5 is already used"):
        table.insert_or_assign(_item(5, _chunk(50, [1.0, 3.0])))
    # The same item sent again (a distinct but equal copy, as a re-send after a reconnect) is not an error.
    assert not table.insert_or_assign(_item(5, _chunk(50, [1.0, 2.0]), priority=3.0))
    [entry] = table.items_snapshot()
    assert table.size() == 1 and entry.priority == 3.0 and entry.column_arrays()[0].tolist() == [1.0, 2.0]


def test_chunk_store_refuses_a_different_chunk_under_a_used_key():
    store = chunk_store.ChunkStore()
    first = _chunk(9, [1.0, 2.0])
    assert store.insert(first) is first
    assert store.insert(_chunk(9, [1.0, 2.0])) is first  # the same chunk again: stored once
    with pytest.raises(ValueError, match=r"chunk key 9 is already used by a different chunk"):
        store.insert(_chunk(9, [1.0, 5.0]))
    with pytest.raises(ValueError, match=r"chunk key 9 is already used by a different chunk"):
        store.insert(_chunk(9, [1.0, 2.0], episode=2))


@pytest.fixture(scope="module")
def grpc_server():
    server = reverb.Server([_uniform_table()])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def channel(grpc_server):
    with grpc.insecure_channel(f"localhost:{grpc_server.port}") as channel:
        yield channel


def test_insert_stream_refuses_colliding_items_and_chunks(grpc_server, channel):
    table = grpc_server.tables["t"]
    table.reset()
    chunk = _chunk(1001, [1.0, 2.0])
    assert _insert_stream(channel, [_insert_request([chunk], [(77, "t", chunk, 1.0)])]) == [77]
    # The same item again on a new stream (a writer re-sending after a reconnect): confirmed, stored once.
    assert _insert_stream(channel, [_insert_request([chunk], [(77, "t", chunk, 1.0)])]) == [77]
    assert table.size() == 1
    # Another writer's item under the same key, over its own chunk: refused, the first item stays.
    other = _chunk(1002, [7.0, 8.0])
    with pytest.raises(grpc.RpcError) as info:
        _insert_stream(channel, [_insert_request([other], [(77, "t", other, 1.0)])])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "item key 77 is already used in table 't'" in info.value.details()
    # Another chunk under a used chunk key: refused before any item can refer to it.
    clash = _chunk(1001, [1.0, 9.0])
    with pytest.raises(grpc.RpcError) as info:
        _insert_stream(channel, [_insert_request([clash], [(78, "t", clash, 1.0)])])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "chunk key 1001 is already used by a different chunk" in info.value.details()
    [stored] = table.items_snapshot()
    assert stored.key == 77 and stored.column_arrays()[0].tolist() == [1.0, 2.0]


# --- 4. poisoned chunks ---

def _truncated_body_chunk(key, values):
    """A chunk proto whose Snappy header announces the right size but whose body ends early."""
    proto = chunk_codec.chunk_to_proto(_chunk(key, values))
    content = proto.data.tensors[0].tensor_content
    proto.data.tensors[0].tensor_content = content[:len(content) - 3]
    return proto


@pytest.mark.parametrize("dtype", [np.float64, np.int16])
def test_chunk_content_check_catches_a_truncated_body_with_a_new_or_a_seen_header(dtype):
    values = np.arange(40).astype(dtype)

    def make(key):
        return chunk_store.Chunk(key, [values], chunk_store.SequenceRange(1, 0, 39))

    for attempt in range(2):  # the second time, the header is known and the fast path reads the bytes in place
        proto = chunk_codec.chunk_to_proto(make(3000 + attempt))
        content = proto.data.tensors[0].tensor_content
        proto.data.tensors[0].tensor_content = content[:-1]
        serialized = proto.SerializeToString()
        chunk_codec.chunk_from_proto(proto, serialized)  # only the Snappy header is read: it announces the right size
        with pytest.raises(tensor_codec.ChunkDecodeError, match=rf"chunk {3000 + attempt}: tensor 0 content is not valid"):
            chunk_codec.chunk_from_proto(proto, serialized, check_content=True)
        sound = chunk_codec.chunk_to_proto(make(3100 + attempt))
        chunk, headers = chunk_codec.chunk_from_proto(sound, sound.SerializeToString(), check_content=True)
        assert headers == [(np.dtype(dtype), (40,))] and chunk.tensors[0].tolist() == values.tolist()


def test_insert_stream_refuses_a_chunk_with_a_truncated_snappy_body(grpc_server, channel):
    table = grpc_server.tables["t"]
    table.reset()
    values = np.arange(64, dtype=np.float32)  # incompressible enough that the body is mostly literals
    proto = _truncated_body_chunk(2001, values)
    request = reverb_service_pb2.InsertStreamRequest(chunks=[proto])
    item = request.items.add(key=2002, table="t", priority=1.0)
    item.flat_trajectory.columns.add().chunk_slices.add(chunk_key=2001, offset=0, length=64)
    with pytest.raises(grpc.RpcError) as info:
        _insert_stream(channel, [request.SerializeToString()])
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "chunk 2001: tensor 0 content is not valid Snappy raw data" in info.value.details()
    assert table.size() == 0
    # A sound chunk right after it is stored and readable.
    chunk = _chunk(2003, values)
    assert _insert_stream(channel, [_insert_request([chunk], [(2004, "t", chunk, 1.0)])]) == [2004]
    assert table.get_item(2004).column_arrays()[0].tolist() == values.tolist()


def _checkpoint_tables(signature=None):
    return [_uniform_table("u", signature=signature),
            reverb.Table("p", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 100,
                         reverb.rate_limiters.MinSize(1))]


def _write_checkpoint(root, count=3):
    """A checkpoint under `root` of `count` steps `[i, i]` (float32) inserted into tables 'u' and 'p'."""
    server = reverb.Server(_checkpoint_tables({"x": tf.TensorSpec([2], tf.float32)}),
                           checkpointer=checkpointing.DirectoryCheckpointer(root))
    client = server.localhost_client()
    for i in range(count):
        client.insert({"x": np.float32([i, i])}, priorities={"u": 1.0, "p": 1.0})
    path = server.checkpoint()
    server.stop()
    return path


def _rewrite_records(path, file_name, change):
    """Replaces the records of `file_name` in checkpoint `path` by `change(records)` (valid CRCs: crafted)."""
    records = list(checkpointing._read_records(os.path.join(path, file_name)))
    checkpointing._write_records(os.path.join(path, file_name), iter(change(records)))


def _restore(root, signature=None):
    checkpointer = checkpointing.DirectoryCheckpointer(root)
    return reverb.Server(_checkpoint_tables(signature), checkpointer=checkpointer), checkpointer


def _values(table):
    return sorted(float(item.column_arrays()[0].reshape(-1)[0]) for item in table.items_snapshot())


def test_restore_leaves_out_the_items_of_a_chunk_that_cannot_be_decoded(tmp_path, caplog):
    path = _write_checkpoint(str(tmp_path))
    poisoned = []

    def truncate_one(records):
        proto = schema_pb2.ChunkData.FromString(records[1])
        content = proto.data.tensors[0].tensor_content
        proto.data.tensors[0].tensor_content = content[:-2]
        poisoned.append(proto.chunk_key)
        return [records[0], proto.SerializeToString(), *records[2:]]

    _rewrite_records(path, checkpointing._CHUNKS_FILE, truncate_one)
    with caplog.at_level(logging.ERROR, logger=checkpointing.__name__):
        server, checkpointer = _restore(str(tmp_path))
    try:
        # The step [1, 1] was in the bad chunk, for both tables; everything else is restored and readable.
        assert _values(server.tables["u"]) == [0.0, 2.0] and _values(server.tables["p"]) == [0.0, 2.0]
        dropped = checkpointer.dropped_items
        assert sorted(d.table for d in dropped) == ["p", "u"]
        assert all(f"chunk {poisoned[0]}" in d.reason for d in dropped)
        assert f"item {dropped[0].key}" in caplog.text and "left out of the restore" in caplog.text
    finally:
        server.stop()


def _item_records_change(index, change):
    def apply(records):
        proto = schema_pb2.PrioritizedItem.FromString(records[index])
        change(proto)
        return [*records[:index], proto.SerializeToString(), *records[index + 1:]]
    return apply


def _set(field, value):
    return lambda proto: setattr(proto, field, value)


def _shift_slice(proto):
    proto.flat_trajectory.columns[0].chunk_slices[0].offset = 5


CRAFTED = [
    # (change of the item records, signature of the restoring server, error regex)
    (lambda records: [*records, records[0]], None,
     r"items.records record 6 \(item \d+ of table '[pu]'\) repeats a key"),
    (_item_records_change(0, _set("priority", math.nan)), None, r"items.records record 0 .*is NaN"),
    (_item_records_change(1, _set("priority", -1.0)), None, r"items.records record 1 .*must be >= 0"),
    (_item_records_change(2, _set("priority", math.inf)), None, r"items.records record 2 .*must be finite"),
    (_item_records_change(1, _set("table", "nope")), None,
     r"items.records record 1 \(item \d+ of table 'nope'\) names a table the checkpoint does not describe"),
    (_item_records_change(2, _shift_slice), None, r"items.records record 2 .*out of chunk"),
    (_item_records_change(2, _set("times_sampled", -4)), None, r"items.records record 2 .*times_sampled \(-4\)"),
    (lambda records: records, {"x": tf.TensorSpec([3], tf.float32)},
     r"items.records record 3 .*does not match the table signature at column 'x'"),
]


@pytest.mark.parametrize("change, signature, error", CRAFTED)
def test_a_crafted_checkpoint_is_refused_naming_the_record(tmp_path, change, signature, error):
    path = _write_checkpoint(str(tmp_path))
    if signature is None:
        signature = {"x": tf.TensorSpec([2], tf.float32)}
    # Items are written table by table, three each: records 0-2 of 'p' (Prioritized), 3-5 of 'u' (signed).
    _rewrite_records(path, checkpointing._ITEMS_FILE, change)
    with pytest.raises(checkpointing.CheckpointError, match=error):
        _restore(str(tmp_path), signature)


def test_an_untouched_checkpoint_restores_under_the_checks(tmp_path):
    _write_checkpoint(str(tmp_path))
    server, checkpointer = _restore(str(tmp_path), {"x": tf.TensorSpec([2], tf.float32)})
    try:
        assert _values(server.tables["u"]) == [0.0, 1.0, 2.0] and checkpointer.dropped_items == []
        sample = next(server.localhost_client().sample("u", emit_timesteps=False))
        assert sample.data[0].shape == (1, 2)
    finally:
        server.stop()


# --- 3. checkpoints that fail or run at once ---

def _complete_checkpoints(root):
    return sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "DONE")))


def test_two_checkpoints_at_once_both_complete(tmp_path, monkeypatch):
    root = str(tmp_path)
    server = reverb.Server([_uniform_table()], checkpointer=checkpointing.DirectoryCheckpointer(root, keep_latest=5))
    server.localhost_client().insert(np.float32([1.0]), priorities={"t": 1.0})
    real_write = checkpointing._write_records
    first_writing = threading.Event()

    def slow_first_write(path, records):
        if not first_writing.is_set():  # the first save lingers in its .partial folder
            first_writing.set()
            time.sleep(0.5)
        real_write(path, records)

    monkeypatch.setattr(checkpointing, "_write_records", slow_first_write)
    outcomes = {}

    def save(name):
        try:
            outcomes[name] = server.checkpoint()
        except Exception as e:  # noqa: BLE001  (reported by the assertion below)
            outcomes[name] = e

    first = threading.Thread(target=save, args=("periodic",))
    first.start()
    assert first_writing.wait(30)
    save("client")  # e.g. a client's Checkpoint call while the periodic checkpoint is being written
    first.join(30)
    server.stop()
    assert all(isinstance(path, str) for path in outcomes.values()), outcomes
    assert _complete_checkpoints(root) == sorted(os.path.basename(p) for p in outcomes.values())
    assert not [n for n in os.listdir(root) if n.startswith(".partial-")]


def test_a_save_leaves_the_partial_folders_of_running_processes(tmp_path):
    root = str(tmp_path)
    with open("/proc/sys/kernel/pid_max") as f:
        no_such_pid = int(f.read()) + 1
    running = os.path.join(root, f".partial-{os.getppid()}-20990101T000000.000000Z")
    dead = os.path.join(root, f".partial-{no_such_pid}-20990101T000000.000000Z")
    old_style = os.path.join(root, ".partial-20990101T000000.000000Z")
    for path in (running, dead, old_style):
        os.makedirs(path)
    server = reverb.Server([_uniform_table()], checkpointer=checkpointing.DirectoryCheckpointer(root))
    server.checkpoint()
    server.stop()
    assert os.path.isdir(running) and not os.path.exists(dead) and not os.path.exists(old_style)


def test_serve_survives_a_failing_periodic_checkpoint_and_retries(tmp_path, monkeypatch, capsys):
    """`replay-tf serve` in this process: the first periodic checkpoint hits ENOSPC, the server keeps serving
    with the previous checkpoint in place, the next period's checkpoint succeeds; SIGTERM then stops it with
    an exit checkpoint."""
    root = tmp_path / "checkpoints"
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "t", "sampler": "uniform", "remover": "fifo",
                                              "max_size": 100, "rate_limiter": {"min_size": 1}}]}))
    seed = reverb.Server([_uniform_table()], checkpointer=checkpointing.DirectoryCheckpointer(str(root)))
    seed.localhost_client().insert(np.float32([1.0]), priorities={"t": 1.0})
    previous = os.path.basename(seed.checkpoint())
    seed.stop()
    real_write = checkpointing._write_records
    calls = []
    retried = threading.Event()

    def full_disk_once(path, records):
        calls.append(path)
        if len(calls) == 1:
            assert _complete_checkpoints(str(root)) == [previous]
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real_write(path, records)
        if path.endswith(checkpointing._DONE_FILE):
            retried.set()

    monkeypatch.setattr(checkpointing, "_write_records", full_disk_once)

    default_handler = signal.getsignal(signal.SIGTERM)

    def stop_when_retried():
        if retried.wait(60):
            time.sleep(0.2)
        if signal.getsignal(signal.SIGTERM) is not default_handler:  # serve's handler sets its stop event
            os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_when_retried)
    stopper.start()
    status = cli.main(["serve", "--config", str(config), "--checkpoint-dir", str(root),
                       "--checkpoint-interval", "0.3", "--stats-interval", "0.1"])
    stopper.join()
    err = capsys.readouterr().err
    assert status == 0 and retried.is_set()
    assert "checkpoint failed, the previous checkpoint stays: OSError: [Errno 28] No space left on device" in err
    complete = _complete_checkpoints(str(root))
    assert complete[-1] > previous and not [n for n in os.listdir(root) if n.startswith(".partial-")]
    restored, _ = _restore_one_table(str(root))
    assert restored.tables["t"].size() == 1
    restored.stop()


def _restore_one_table(root):
    checkpointer = checkpointing.DirectoryCheckpointer(root)
    return reverb.Server([_uniform_table()], checkpointer=checkpointer), checkpointer


# --- 2. stopping the server while writers insert ---

_start_serve = proc_testlib.start_serve


class _KeyedWriter:
    """Inserts one single-step item per request on one InsertStream, until the stream fails; `confirmed` holds
    the keys the server confirmed (the only items a writer may consider delivered)."""

    def __init__(self, channel):
        self.confirmed = []
        self.code = None
        self._stop = threading.Event()
        self._call = channel.stream_stream(_PREFIX + "InsertStream", request_serializer=lambda b: b,
                                           response_deserializer=reverb_service_pb2.InsertStreamResponse.FromString)
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _requests(self):
        step = 0
        while not self._stop.is_set():
            chunk = _chunk(chunk_store.new_key(), [float(step)])
            yield _insert_request([chunk], [(chunk_store.new_key(), "t", chunk, 1.0)])
            step += 1
            time.sleep(0.001)

    def _run(self):
        try:
            for response in self._call(self._requests(), timeout=120):
                self.confirmed.extend(response.keys)
        except grpc.RpcError as e:
            self.code = e.code()

    def join(self):
        self._stop.set()
        self._thread.join(60)


@pytest.mark.parametrize("remote", [False, True], ids=["in_process", "grpc"])
def test_a_draining_server_refuses_priority_updates_deletes_and_resets(remote, monkeypatch):
    # After refuse_inserts (the first step of serve's exit) the exit checkpoint must hold every confirmed
    # change, so changes other than inserts are refused too; sampling goes on.
    if remote:
        from replay_tf.grpc.client import client_transport
        from replay_tf.transport import base as transport_lib
        monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    server = reverb.Server([_uniform_table()])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        assert type(client._transport).__module__.endswith("client_transport" if remote else "transport.inprocess")
        client.insert([np.float32(1.0)], {"t": 1.0})
        [key] = [s[0].info.key for s in client.sample("t", 1)]
        server.refuse_inserts()
        for call in (lambda: client.mutate_priorities("t", updates={key: 5.0}),
                     lambda: client.mutate_priorities("t", deletes=[key]),
                     lambda: client.reset("t")):
            with pytest.raises(reverb.errors.UnavailableError if not remote else reverb.errors.ReverbError,
                               match="accepts no (priority updates or deletes|resets): its server is shutting down"):
                call()
        table = server.tables["t"]
        assert table.size() == 1 and table.get_item(key).priority == 1.0
        assert len(list(client.sample("t", 1))) == 1
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", ["SIGTERM", "SIGHUP"])
def test_serve_stopped_while_a_writer_inserts_checkpoints_every_confirmed_item(tmp_path, stop_signal):
    root = str(tmp_path / "checkpoints")
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "t", "sampler": "uniform", "remover": "fifo",
                                              "max_size": 100_000, "rate_limiter": {"min_size": 1}}]}))
    proc, port = _start_serve("--config", str(config), "--checkpoint-dir", root, "--stats-interval", "60")
    try:
        client = reverb.Client(f"localhost:{port}")
        rng = np.random.default_rng(0)
        for _ in range(24):  # ~24 MiB of incompressible steps: the exit checkpoint takes a while to write
            client.insert(rng.standard_normal([256 * 1024]).astype(np.float32), priorities={"t": 1.0})
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            writer = _KeyedWriter(channel)
            deadline = time.monotonic() + 60
            while len(writer.confirmed) < 200 and writer.code is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(writer.confirmed) >= 200, writer.code
            proc.send_signal(getattr(signal, stop_signal))  # the writer goes on inserting meanwhile
            rc = proc.wait(60)
            writer.join()
        output = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
    assert rc == 0 and "checkpoint: " in output, output
    assert writer.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), writer.code
    restored, _ = _restore_one_table(root)
    try:
        table = restored.tables["t"]
        missing = [key for key in writer.confirmed if table.get_item(key) is None]
        assert not missing, f"{len(missing)} of {len(writer.confirmed)} confirmed items are not in the checkpoint"
        assert table.size() >= 24 + len(writer.confirmed)
    finally:
        restored.stop()


def test_serve_exits_1_when_its_exit_checkpoint_cannot_be_written(tmp_path, monkeypatch, capsys):
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "t", "queue": 10}]}))

    def full_disk(path, records):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(checkpointing, "_write_records", full_disk)
    default_handler = signal.getsignal(signal.SIGTERM)

    def stop_once_serving():
        deadline = time.monotonic() + 60
        while signal.getsignal(signal.SIGTERM) is default_handler and time.monotonic() < deadline:
            time.sleep(0.05)
        if signal.getsignal(signal.SIGTERM) is not default_handler:
            os.kill(os.getpid(), signal.SIGTERM)

    stopper = threading.Thread(target=stop_once_serving)
    stopper.start()
    status = cli.main(["serve", "--config", str(config), "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--stats-interval", "0.1"])
    stopper.join()
    captured = capsys.readouterr()
    assert status == 1 and "replay-tf: stopped" in captured.out
    assert "checkpoint failed, the previous checkpoint stays: OSError: [Errno 28]" in captured.err
