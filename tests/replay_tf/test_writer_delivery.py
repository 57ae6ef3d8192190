"""Writer delivery: rate-limited items inserted in the background (in-process transport)."""
import threading
import time

import numpy as np
import pytest

import replay_tf as reverb
from replay_tf import errors


def _server(rate_limiter):
    return reverb.Server([reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100, rate_limiter)])


def _queue(max_size):
    return reverb.Server([reverb.Table.queue("t", max_size)])


def _write(writer, values):
    for i in values:
        writer.append({"a": np.int64(i)})
        writer.create_item("t", 1.0, writer.history["a"][-1:])


def _take(table, n, timeout_ms=10_000):
    """The values of the next `n` items sampled (one at a time) from the table."""
    return [int(table.sample(1, timeout_ms=timeout_ms)[0].item.column_arrays()[0][0]) for _ in range(n)]


def _wait_until(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_queue_items_blocked_by_the_limiter_arrive_without_writer_calls():
    server = _queue(1)
    table = server.table("t")
    writer = server.localhost_client().trajectory_writer(num_keep_alive_refs=1)
    _write(writer, range(6))  # the queue holds one: five items wait
    assert len(table) == 1
    got = []
    sampler = threading.Thread(target=lambda: got.extend(_take(table, 6)))
    sampler.start()
    sampler.join(30)
    # Every item came through, in order, with no writer call after create_item.
    assert got == [0, 1, 2, 3, 4, 5]
    writer.flush(timeout_ms=5000)  # nothing left
    writer.close()
    server.stop()


def test_sample_to_insert_ratio_admits_waiting_items_as_samples_come():
    # spi=1, min_size_to_sample=1, error_buffer=1: max_diff = 2, so two inserts pass before a sample
    # (hand-computed from Reverb's rule inserts * spi - samples + spi <= max_diff).
    server = _server(reverb.rate_limiters.SampleToInsertRatio(1.0, 1, 1.0))
    table = server.table("t")
    writer = server.localhost_client().trajectory_writer(num_keep_alive_refs=1)
    _write(writer, range(5))
    assert len(table) == 2
    with pytest.raises(errors.DeadlineExceededError):
        writer.flush(timeout_ms=50)
    assert writer.episode_steps == 5
    sampler = threading.Thread(target=_take, args=(table, 3))
    sampler.start()
    sampler.join(30)
    _wait_until(lambda: len(table) == 5)  # each sample let one more waiting item in
    writer.end_episode(timeout_ms=5000)
    writer.close()
    server.stop()


def test_flush_waits_for_the_background_inserts_in_order():
    server = _queue(2)
    table = server.table("t")
    writer = server.localhost_client().trajectory_writer(num_keep_alive_refs=1)
    _write(writer, range(4))
    with pytest.raises(errors.DeadlineExceededError, match="Flush call did not complete"):
        writer.flush(timeout_ms=50)
    with pytest.raises(errors.DeadlineExceededError, match="End episode call did not complete"):
        writer.end_episode(timeout_ms=50)
    flushed = threading.Event()

    def flush():
        writer.flush(1, timeout_ms=20_000)  # returns once at most one item waits
        flushed.set()

    flusher = threading.Thread(target=flush)
    flusher.start()
    assert _take(table, 1) == [0]
    flusher.join(30)
    assert flushed.is_set()
    _write(writer, [10])  # queued behind the waiting item 3
    assert _take(table, 4) == [1, 2, 3, 10]
    writer.flush(timeout_ms=5000)
    writer.close()
    server.stop()


def test_close_drops_the_waiting_items():
    server = _queue(1)
    table = server.table("t")
    writer = server.localhost_client().trajectory_writer(num_keep_alive_refs=1)
    _write(writer, range(3))
    writer.close()
    assert _take(table, 1) == [0]
    with pytest.raises(errors.DeadlineExceededError):
        table.sample(1, timeout_ms=600)  # items 1 and 2 were dropped by close
    assert len(table) == 0
    server.stop()


def test_server_stop_fails_the_waiting_items_and_flush_does_not_hang():
    server = _queue(1)
    writer = server.localhost_client().trajectory_writer(num_keep_alive_refs=1)
    _write(writer, range(3))
    server.stop()
    with pytest.raises(errors.CancelledError, match="has been closed"):
        writer.flush(timeout_ms=10_000)
    writer.close()


# --- remote writers: reconnect after the server restarts at the same address ---

@pytest.fixture
def remote(monkeypatch):
    """Clients of this test reach local servers through the gRPC transport."""
    from replay_tf.grpc.client import client_transport
    from replay_tf.transport import base as transport_lib
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)


def _table():
    return reverb.Table.queue("t", 1000)  # sampling takes the items in insertion order


def _write_three_step_items(writer, flush_every: int = 0) -> None:
    """Appends steps 0..1499 to column "a", with an item of the last 3 steps from step 2 on (a flush every
    `flush_every` steps if set), then flushes and closes the writer."""
    for i in range(1500):
        writer.append({"a": np.int64(i)})
        if i >= 2:
            writer.create_item("t", 1.0, writer.history["a"][-3:])
        if flush_every and i % flush_every == 0:
            writer.flush(timeout_ms=60_000)
    writer.flush(timeout_ms=60_000)
    writer.close()


def _three_step_values(table, n):
    return [table.sample(1, timeout_ms=10_000)[0].item.column_arrays()[0].tolist() for _ in range(n)]


def test_remote_writer_resends_after_the_server_restarts(remote):
    server = reverb.Server([_table()])
    port = server.port
    client = reverb.Client(f"localhost:{port}")
    writer = client.trajectory_writer(num_keep_alive_refs=3)
    for i in range(3):
        writer.append({"a": np.int64(i)})
    writer.create_item("t", 1.0, writer.history["a"][-2:])  # [1, 2]
    writer.flush(timeout_ms=10_000)
    assert len(server.table("t")) == 1
    server.stop()
    # The writer goes on while the server is away: these items wait for it.
    writer.append({"a": np.int64(3)})
    writer.create_item("t", 1.0, writer.history["a"][-3:])  # [1, 2, 3]: chunks sent to the old server
    writer.append({"a": np.int64(4)})
    writer.create_item("t", 2.0, writer.history["a"][-1])  # 4
    with pytest.raises(errors.DeadlineExceededError, match="reconnecting after"):
        writer.flush(timeout_ms=300)
    restarted = reverb.Server([_table()], port=port)  # e.g. restored from a checkpoint
    try:
        writer.flush(timeout_ms=60_000)
        writer.append({"a": np.int64(5)})
        writer.create_item("t", 1.0, writer.history["a"][-2:])  # [4, 5]
        writer.end_episode(timeout_ms=60_000)
        table = restarted.table("t")
        assert len(table) == 3  # nothing lost, nothing twice
        got = [table.sample(1, timeout_ms=0)[0] for _ in range(3)]
        assert [np.asarray(s.item.column_arrays()[0]).ravel().tolist() for s in got] == [[1, 2, 3], [4], [4, 5]]
        assert [s.priority for s in got] == [1.0, 2.0, 1.0]
        writer.close()
    finally:
        restarted.stop()


def test_remote_writer_resends_each_waiting_item_to_its_own_table(remote):
    def tables():
        return [reverb.Table.queue(name, 100) for name in ("even", "odd")]

    server = reverb.Server(tables())
    port = server.port
    writer = reverb.Client(f"localhost:{port}").trajectory_writer(num_keep_alive_refs=1)
    writer.append({"a": np.int64(0)})
    writer.create_item("even", 1.0, writer.history["a"][-1:])
    writer.flush(timeout_ms=10_000)
    server.stop()
    for i in range(1, 7):  # wait for the restarted server, then go to the table their parity names
        writer.append({"a": np.int64(i)})
        writer.create_item("odd" if i % 2 else "even", 1.0, writer.history["a"][-1:])
    restarted = reverb.Server(tables(), port=port)
    try:
        writer.flush(timeout_ms=60_000)
        writer.close()
        assert len(restarted.table("even")) == 3 and len(restarted.table("odd")) == 3
        assert _take(restarted.table("even"), 3) == [2, 4, 6]
        assert _take(restarted.table("odd"), 3) == [1, 3, 5]
    finally:
        restarted.stop()


def test_remote_flush_times_out_clearly_when_the_server_never_returns(remote):
    server = reverb.Server([_table()])
    client = reverb.Client(f"localhost:{server.port}")
    writer = client.trajectory_writer(num_keep_alive_refs=1)
    writer.append({"a": np.int64(0)})
    writer.create_item("t", 1.0, writer.history["a"][-1:])
    writer.flush(timeout_ms=10_000)
    server.stop()
    writer.append({"a": np.int64(1)})
    writer.create_item("t", 1.0, writer.history["a"][-1:])
    started = time.monotonic()
    with pytest.raises(errors.DeadlineExceededError,
                       match=r"timeout of 0:00:00.500000 \(1 items unconfirmed; the InsertStream lost its server"):
        writer.flush(timeout_ms=500)
    with pytest.raises(errors.DeadlineExceededError, match="End episode call did not complete"):
        writer.end_episode(timeout_ms=200)
    assert time.monotonic() - started < 30  # bounded by the timeouts, not a hang
    writer.close()  # drops the waiting item and stops reconnecting


_SERVE = """
import sys
import replay_tf as reverb
server = reverb.Server([reverb.Table.queue("t", 1000)], port=int(sys.argv[1]))
print("ready", flush=True)
sys.stdin.read()
"""


def _serve(port):
    """Our server in a subprocess at `port` (returns once it listens)."""
    import os
    import select
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    process = subprocess.Popen([sys.executable, "-c", _SERVE, str(port)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=root)
    ready, _, _ = select.select([process.stdout], [], [], 180)
    if not ready or process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError("the server process did not start")
    return process


@pytest.mark.slow  # a server process, killed and restarted
def test_remote_writer_survives_a_server_process_killed_and_restarted():
    import signal
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = _serve(port)
    restarted = None
    try:
        client = reverb.Client(f"localhost:{port}")
        writer = client.trajectory_writer(num_keep_alive_refs=2)
        for i in range(4):
            writer.append({"a": np.int64(i), "b": np.full([3], i, np.float32)})
            if i:
                writer.create_item("t", 1.0, {"a": writer.history["a"][-2:], "b": writer.history["b"][-1]})
        writer.flush(timeout_ms=60_000)  # items 1..3 confirmed by the first server
        process.send_signal(signal.SIGKILL)
        process.wait(60)
        for i in range(4, 7):
            writer.append({"a": np.int64(i), "b": np.full([3], i, np.float32)})
            writer.create_item("t", 1.0, {"a": writer.history["a"][-2:], "b": writer.history["b"][-1]})
        with pytest.raises(errors.DeadlineExceededError, match="reconnecting after UNAVAILABLE"):
            writer.flush(timeout_ms=500)
        restarted = _serve(port)
        writer.end_episode(timeout_ms=120_000)
        writer.close()
        # The new server holds exactly the unconfirmed items (item 4 refers to step 3, sent to the dead server
        # and sent again), intact and in order.
        assert client.server_info()["t"].current_size == 3
        got = [[np.asarray(column).tolist() for column in next(client.sample("t", emit_timesteps=False)).data]
               for _ in range(3)]
        assert got == [[[i - 1, i], [float(i)] * 3] for i in (4, 5, 6)]
    finally:
        for proc in (process, restarted):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(60)
            if proc is not None:
                proc.stdin.close()
                proc.stdout.close()


# --- remote writers: request sizes and a sending thread that falls behind ---

def test_remote_requests_stay_near_max_request_bytes(remote, monkeypatch):
    from replay_tf.grpc import common
    from replay_tf.grpc.server import statuses
    sizes = []
    parse = statuses.parse

    def recording_parse(message_class, raw):
        if message_class.__name__ == "InsertStreamRequest":
            sizes.append(len(raw))
        return parse(message_class, raw)

    monkeypatch.setattr(statuses, "parse", recording_parse)
    server = reverb.Server([reverb.Table.queue("t", 1000)])
    try:
        frames = np.random.default_rng(0).integers(0, 256, size=[8, 84, 84, 4], dtype=np.uint8)  # incompressible
        writer = reverb.Client(f"localhost:{server.port}").trajectory_writer(num_keep_alive_refs=1)
        for i in range(150):  # 150 one-frame items: ~4.2 MB of chunks
            writer.append({"frame": frames[i % 8]})
            writer.create_item("t", 1.0, writer.history["frame"][-1])
        writer.flush(timeout_ms=60_000)
        writer.close()
        assert len(server.table("t")) == 150
        # Requests end at the first item that takes them past MAX_REQUEST_BYTES: at most one more frame (plus
        # item and keep-key fields), so they stay below the 4 MiB up to which `malloc` keeps buffers in the heap.
        assert len(sizes) >= 4, sizes
        assert max(sizes) <= common.MAX_REQUEST_BYTES + frames[0].nbytes + 4096, sizes
        assert sum(sizes) > 150 * frames[0].nbytes
    finally:
        server.stop()


@pytest.mark.parametrize("linger_s", [0.0, 1e-5, 1e-4])
def test_remote_requests_arrive_in_order_when_writer_and_sending_thread_both_end_them(remote, monkeypatch, linger_s):
    # Requests of at most 2 items, lingering a few microseconds: the writer ends requests (full, or lingered
    # at the next item) while gRPC's sending thread ends lingering ones itself, racing for the same requests.
    # Items of 3 steps use chunks that earlier requests carried: a request sent out of order would name
    # chunks the server never received (keep_chunk_keys) and end the stream.
    from replay_tf.grpc import common
    monkeypatch.setattr(common, "MAX_REQUEST_ITEMS", 2)
    monkeypatch.setattr(common, "LINGER_S", linger_s)
    server = reverb.Server([reverb.Table.queue("t", 2000)])
    try:
        _write_three_step_items(reverb.Client(f"localhost:{server.port}").trajectory_writer(num_keep_alive_refs=3))
        assert _three_step_values(server.table("t"), 1498) == [[i - 2, i - 1, i] for i in range(2, 1500)]
    finally:
        server.stop()


def test_remote_send_yields_to_a_sending_thread_that_falls_behind_but_never_blocks(remote, monkeypatch):
    import types
    from replay_tf.grpc import common
    from replay_tf.grpc.client import insert_stream
    yields = []
    # A clock that stands still: requests end only when full (MAX_REQUEST_ITEMS items), never by lingering.
    monkeypatch.setattr(insert_stream, "time", types.SimpleNamespace(
        monotonic=lambda: 0.0, sleep=lambda s: yields.append(s)))
    server = reverb.Server([_table()])
    writer = reverb.Client(f"localhost:{server.port}").trajectory_writer(num_keep_alive_refs=1)
    server.stop()  # the writer's stream opens with the first item and waits for a server that is gone
    started = time.monotonic()
    num_items = 3 * common.MAX_REQUEST_ITEMS
    _write(writer, range(num_items))
    assert time.monotonic() - started < 30  # create_item queued every item without waiting for the server
    # Once more than one request waits for gRPC's sending thread, each create_item yields the GIL (sleep(0)):
    # never before the second request is queued, then once per item.
    assert yields and set(yields) == {0}
    assert len(yields) <= num_items - 2 * common.MAX_REQUEST_ITEMS + 1
    assert writer._stream.num_pending() == num_items
    writer.close()  # drops the waiting items


# --- remote writers: the chunks the server keeps for later items (keep_chunk_keys) ---

class _RecordingStream:
    """A remote-like stream (final chunks only) that records what writers send."""

    supports_open_chunks = False

    def __init__(self):
        self.sent = []  # (table, item, live)

    def send(self, table, item, live=None):
        self.sent.append((table, item, live))

    def flush(self, block_until_num_items=0, timeout_ms=None):
        pass

    def num_pending(self):
        return 0

    def close(self):
        pass


def _first_steps(chunks_by_key, keys):
    return sorted(chunks_by_key[k].sequence_range.start for k in keys)


def test_trajectory_writer_sends_each_item_with_the_chunks_its_history_can_still_use():
    from replay_tf.trajectory_writer import TrajectoryWriter
    stream = _RecordingStream()
    writer = TrajectoryWriter(stream, num_keep_alive_refs=3)
    chunks = {}  # key -> chunk, of every chunk the items use
    for i in range(8):
        writer.append({"a": np.int64(i)})
        if i >= 2:
            writer.create_item("t", 1.0, writer.history["a"][-3:])
    writer.flush()
    assert len(stream.sent) == 6
    for _, item, _ in stream.sent:
        chunks.update(item.chunks)
    # Small steps: chunks of 3 steps (0-2, 3-5, 6-8). The item of step i is sent with the chunks of steps
    # i-2..i, the history's steps when it was created (hand-computed first steps of those chunks).
    expected = {2: [0], 3: [0, 3], 4: [0, 3], 5: [3], 6: [3, 6], 7: [3, 6]}
    for i, (_, item, live) in zip(range(2, 8), stream.sent):
        assert _first_steps(chunks, live) == expected[i], i
    # A shorter history drops the older chunk; a new episode (clearing the buffers) leaves none.
    writer.configure(("a",), num_keep_alive_refs=1, max_chunk_length=None)
    assert len(writer._live_chunks) == 1
    writer.end_episode(clear_buffers=True)
    assert writer._live_chunks == {}
    writer.close()


def _recording_requests(monkeypatch):
    """The InsertStreamRequests our server parses, recorded."""
    from replay_tf.grpc.server import statuses
    requests = []
    parse = statuses.parse

    def recording_parse(message_class, raw):
        message = parse(message_class, raw)
        if message_class.__name__ == "InsertStreamRequest":
            requests.append(message)
        return message

    monkeypatch.setattr(statuses, "parse", recording_parse)
    return requests


def _check_steps_and_keep_lists(server, requests, max_keep: int) -> list:
    """Checks that the items of steps 2..1499 (3 steps each) arrived and that no request named more than
    `max_keep` chunks to keep; returns the keys of the chunks the requests carried, in order."""
    assert _three_step_values(server.table("t"), 1498) == [[i - 2, i - 1, i] for i in range(2, 1500)]
    assert len(requests) >= 2
    assert max(len(r.keep_chunk_keys) for r in requests) <= max_keep, [len(r.keep_chunk_keys) for r in requests]
    return [c.chunk_key for r in requests for c in r.chunks]


def test_remote_server_keeps_only_the_chunks_of_the_writers_history(remote, monkeypatch):
    requests = _recording_requests(monkeypatch)
    server = reverb.Server([reverb.Table.queue("t", 2000)])
    try:
        _write_three_step_items(reverb.Client(f"localhost:{server.port}").trajectory_writer(num_keep_alive_refs=3),
                                flush_every=500)
        # Chunks of 3 steps: the history's 3 steps span at most 2 of them, and the newest may still be open
        # (not sent): never more than 2 keys, whatever the number of unconfirmed items.
        keys = _check_steps_and_keep_lists(server, requests, max_keep=2)
        # Each chunk crossed the wire once: steps 0-998 in 333 chunks of 3, 999-1000 (finalized by the flush at
        # step 1000), 1001-1498 in 166, and 1499 (finalized by the last flush): 501 (hand-counted).
        assert len(keys) == len(set(keys)) == 501
    finally:
        server.stop()


def test_remote_writer_that_names_too_few_live_chunks_sends_them_again(remote, monkeypatch):
    # A writer that tells the stream no chunk stays useful: every request lets the server drop its chunks,
    # so a later item that still uses one must carry it again (the stream forgets what it dropped).
    requests = _recording_requests(monkeypatch)
    server = reverb.Server([reverb.Table.queue("t", 100)])
    try:
        writer = reverb.Client(f"localhost:{server.port}").trajectory_writer(num_keep_alive_refs=3)
        send = writer._stream.send
        monkeypatch.setattr(writer._stream, "send", lambda table, item, live=None: send(table, item, ()))
        for i in range(12):
            writer.append({"a": np.int64(i)})
            if i >= 2:
                writer.create_item("t", 1.0, writer.history["a"][-3:])
                writer.flush(timeout_ms=60_000)  # one request per item
        writer.close()
        assert _three_step_values(server.table("t"), 10) == [[i - 2, i - 1, i] for i in range(2, 12)]
        assert all(len(r.keep_chunk_keys) == 0 for r in requests)
        # Every request carried every chunk its item uses. Each flush finalizes the open chunk, so after the
        # first chunk (steps 0-2) every step is a chunk of its own: the item of step 2 uses one chunk, that of
        # step 3 two (0-2 and 3), every later one three (hand-counted): 26 chunks sent where 10 would do.
        assert [len(r.chunks) for r in requests if r.items] == [1, 2] + [3] * 8
    finally:
        server.stop()


def test_remote_structured_writer_keeps_only_the_chunks_its_configs_can_read(remote, monkeypatch):
    requests = _recording_requests(monkeypatch)
    sw = reverb.structured_writer
    ref = sw.create_reference_step({"a": np.int64(0)})
    server = reverb.Server([reverb.Table.queue("t", 2000)])
    try:
        writer = reverb.Client(f"localhost:{server.port}").structured_writer(
            [sw.create_config(ref["a"][-3:], table="t")])
        for i in range(1500):
            writer.append({"a": np.int64(i)})
        writer.flush(timeout_ms=60_000)
        writer.close()
        # The config reads 3 steps: the writer keeps 4 (with the one the next step completes), in at most
        # 4 chunks; the server is told to keep no more, however many items are unconfirmed.
        keys = _check_steps_and_keep_lists(server, requests, max_keep=4)
        assert len(keys) == len(set(keys))  # no chunk crossed the wire twice
    finally:
        server.stop()


def _chunk_and_items():
    """Chunks 11 (rows 0-1), 12 (rows 2-3) and 13 (row 4) of one float32 column (row i = [i, i]), and items
    1: rows 0-1, 2: rows 1-2 (chunks 11, 12), 3: rows 2-4 (chunks 12, 13)."""
    from replay_tf.core import chunk_store as cs
    rows = np.arange(10, dtype=np.float32).reshape(5, 2) // 2
    chunks = {key: cs.Chunk(key, [rows[start:stop]], cs.SequenceRange(7, start, stop - 1))
              for key, start, stop in [(11, 0, 2), (12, 2, 4), (13, 4, 5)]}
    slices = {1: [(11, 0, 2)], 2: [(11, 1, 1), (12, 0, 1)], 3: [(12, 0, 2), (13, 0, 1)]}
    items = [cs.Item(key, float(key), (cs.Column(tuple(cs.ChunkSlice(k, o, n, 0) for k, o, n in parts), False),),
                     [chunks[k] for k, _, _ in parts]) for key, parts in slices.items()]
    return chunks, items


def test_encoded_items_are_kept_as_untracked_bytes_and_resent_in_order(monkeypatch):
    # Once its request is encoded, an unconfirmed item is kept as bytes only (what re-sending it takes): the
    # item dies, and its record is not tracked by the garbage collector, so hundreds of items in flight
    # bring no full collection nearer. After a reconnect the records alone rebuild the requests.
    import gc
    import weakref

    from replay_tf.grpc import common
    from replay_tf.grpc.client import insert_stream
    from replay_tf.wire import chunk_codec
    from replay_tf.wire import reverb_service_pb2

    chunks, items = _chunk_and_items()
    connection, unconfirmed = insert_stream._Connection(), {}
    for item, live in zip(items, [(11, 12), (12,), (12, 13)]):
        unconfirmed[item.key] = item
        connection.add("t", item, live)
    request = reverb_service_pb2.InsertStreamRequest.FromString(connection.finish(unconfirmed))
    assert [c.chunk_key for c in request.chunks] == [11, 12, 13]  # each before its first item
    assert [(i.key, i.table, i.priority) for i in request.items] == [(1, "t", 1.0), (2, "t", 2.0), (3, "t", 3.0)]
    assert list(request.keep_chunk_keys) == [12, 13]  # the last item's live chunks
    assert sorted(connection.sent) == [12, 13]  # the server forgot 11, so do we
    expected_items = [i.SerializeToString() for i in request.items]

    item_refs = [weakref.ref(item) for item in items]
    del items, item
    assert [ref() for ref in item_refs] == [None] * 3  # the items died with their request's encoding
    gc.collect()  # untracks the chunk fields (a record's fields are traversed after it)
    gc.collect()  # and then the records
    # (each record still tracked, with the types of its tracked parts)
    tracked = {key: (type(r).__name__, [type(p).__name__ for p in r if gc.is_tracked(p)])
               for key, r in unconfirmed.items() if type(r) is not tuple or gc.is_tracked(r)}
    assert not tracked, (tracked, gc.get_freeze_count(), gc.isenabled())

    # Item 1 confirmed, then the connection broke: 2 and 3 are re-sent on a new call, one per request here.
    del unconfirmed[1]
    monkeypatch.setattr(common, "MAX_REQUEST_ITEMS", 1)
    resent = [reverb_service_pb2.InsertStreamRequest.FromString(r)
              for r in insert_stream._Connection().resend(unconfirmed)]
    assert [[c.chunk_key for c in r.chunks] for r in resent] == [[11, 12], [13]]
    assert [list(r.keep_chunk_keys) for r in resent] == [[12], []]  # what later records still use
    assert [i.SerializeToString() for r in resent for i in r.items] == expected_items[1:]
    for r in resent:
        for c in r.chunks:
            np.testing.assert_array_equal(chunk_codec.decode_chunk_tensors(c)[0], chunks[c.chunk_key].tensors[0])


def test_stream_without_live_chunks_prunes_the_sent_ones_to_the_unconfirmed_items():
    # Without the writer's live keys, the server keeps every chunk sent; once there are many, only those of
    # unconfirmed items (here 12 and 13, of item 3: items 1 and 2, which used 11, were confirmed).
    from replay_tf.grpc.client import insert_stream
    from replay_tf.wire import reverb_service_pb2

    _, items = _chunk_and_items()
    connection, unconfirmed = insert_stream._Connection(), {}
    connection._prune_above = 2
    for item in items[:2]:
        unconfirmed[item.key] = item
        connection.add("t", item)
    connection.finish(unconfirmed)
    assert sorted(connection.sent) == [11, 12]
    del unconfirmed[1], unconfirmed[2]
    unconfirmed[3] = items[2]
    connection.add("t", items[2])
    request = reverb_service_pb2.InsertStreamRequest.FromString(connection.finish(unconfirmed))
    assert sorted(request.keep_chunk_keys) == [12, 13]
    assert sorted(connection.sent) == [12, 13]
