"""Reverb's legacy `Client.writer` / `Writer`: the same scenarios run by dm-reverb 0.14 and by replay_tf (items
sampled back value by value), and what ours adds (errors at `append`, in-flight limit)."""
import subprocess
import sys

import numpy as np
import pytest

import replay_tf as reverb
import reverb_testlib

_SETUP = """
server = reverb.Server([reverb.Table.queue("q", 100),
                        reverb.Table("p", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 100,
                                     reverb.rate_limiters.MinSize(1))])
client = reverb.Client(f"localhost:{server.port}")
def step(i):
    return {"a": np.int32(i), "b": np.array([i, -i], np.float32), "c": (np.int64(10 * i),)}
def settled_size(table, count, timeout_s=10.0):
    # dm-reverb's writer may return from close before its server shows every item: wait (bounded) for them.
    import time
    deadline = time.monotonic() + timeout_s
    while client.server_info()[table].current_size < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return client.server_info()[table].current_size
def drain(table, count):
    out = []
    for sample in client.sample(table, count, emit_timesteps=False):
        out.append([[x.dtype.name, x.tolist()] for x in sample.data])
    return out
"""

SCENARIOS = {
    # Items of 1, 3 and 2 timesteps over chunks of 2 (a writer keeping 3), then append_sequence.
    "items_across_chunks": _SETUP + """
with client.writer(3, chunk_length=2) as writer:
    writer.append(step(0))
    writer.append(step(1))
    writer.create_item("q", 1, 1.0)
    writer.append(step(2))
    writer.create_item("q", 3, 1.0)
    writer.append(step(3))
    writer.append(step(4))
    writer.create_item("q", 2, 1.0)
    writer.append_sequence({"a": np.array([5, 6], np.int32), "b": np.zeros([2, 2], np.float32),
                            "c": (np.array([50, 60], np.int64),)})
    writer.create_item("q", 3, 1.0)
emit("size", settled_size("q", 4))
emit("items", drain("q", 4))
""",
    "default_chunk_length_and_flush": _SETUP + """
writer = client.writer(12)  # chunks of min(10, 12)
for i in range(11):
    writer.append(step(i))
writer.create_item("q", 12 - 1, 1.0)
writer.flush()  # (dm-reverb's may return before the server holds the item: see test_flush_waits_...)
writer.append(step(11))
writer.create_item("q", 12, 1.0)
writer.close()
emit("items", drain("q", 2))
""",
    "timesteps_and_priorities": _SETUP + """
with client.writer(2) as writer:
    writer.append(step(7))
    writer.append(step(8))
    writer.create_item("p", 2, 2.5)
[samples] = list(client.sample("p", 1))
emit("steps", [[s.data[0].tolist(), s.data[1].tolist(), s.data[2].tolist()] for s in samples])
emit("priority", float(samples[0].info.priority))
""",
    "delta_encoded": _SETUP + """
frames = np.arange(24, dtype=np.int32).reshape(3, 2, 4) * 1000
with client.writer(3, delta_encoded=True) as writer:
    for frame in frames:
        writer.append(frame)
    writer.create_item("q", 3, 1.0)
emit("items", drain("q", 1))
""",
    "insert_is_a_legacy_item": _SETUP + """
client.insert(step(3), {"q": 1.0})
emit("items", drain("q", 1))
""",
    "argument_errors": _SETUP + """
for kwargs in [dict(max_sequence_length=0), dict(max_sequence_length=2, chunk_length=3),
               dict(max_sequence_length=2, chunk_length=0), dict(max_sequence_length=2, max_in_flight_items=0)]:
    try:
        client.writer(**kwargs)
    except ValueError as e:
        emit(str(sorted(kwargs.items())), str(e))
""",
    # The messages differ (ours name the values): the exception types are compared.
    "usage_errors": _SETUP + """
writer = client.writer(3)
writer.append(step(0))
for name, call in [("more_than_buffered", lambda: writer.create_item("q", 2, 1.0)),
                   ("zero_timesteps", lambda: writer.create_item("q", 0, 1.0))]:
    try:
        call()
        emit(name, "no error")
    except Exception as e:
        emit(name, type(e).__name__)
for i in range(1, 4):
    writer.append(step(i))
for name, call in [("more_than_max", lambda: writer.create_item("q", 4, 1.0)),
                   ("fewer_leaves", lambda: writer.append({"a": np.int32(5)}))]:
    try:
        call()
        emit(name, "no error")
    except Exception as e:
        emit(name, type(e).__name__)
writer.create_item("q", 3, 1.0)
writer.close()
for name, call in [("close_twice", writer.close), ("enter_closed", writer.__enter__)]:
    try:
        call()
    except ValueError as e:
        emit(name, str(e))
emit("items", drain("q", 1))
""",
}

peer_results, local_results, test_matches_reverb = reverb_testlib.differential_tests(SCENARIOS)


def test_local_scenarios_ran_without_errors(local_results):
    # (compared with dm-reverb by test_matches_reverb; this keeps them meaningful without the peer)
    assert not [k for k in local_results if k.endswith(".error")], local_results
    assert local_results["items_across_chunks.items"][1] == [
        ["int32", [0, 1, 2]], ["float32", [[0, 0], [1, -1], [2, -2]]], ["int64", [0, 10, 20]]]


@pytest.fixture
def client():
    server = reverb.Server([reverb.Table.queue("q", 1000)])
    yield reverb.Client(f"localhost:{server.port}")
    server.stop()


def test_a_leaf_changing_dtype_or_shape_is_refused_at_append(client):
    # dm-reverb accepts the step and fails at flush/close, about concatenating tensors.
    with client.writer(2) as writer:
        writer.append({"a": np.zeros([2], np.float32)})
        with pytest.raises(ValueError, match=r"column \(0,\)\. Got \[3\] which is incompatible with \[2\]\.\nThe column \[0\]"):
            writer.append({"a": np.zeros([3], np.float32)})
        with pytest.raises(ValueError, match=r"column \(0,\)\. Got int32 but expected float\.\nThe column \[0\] holds numpy float32"):
            writer.append({"a": np.zeros([2], np.int32)})
        writer.append({"a": np.ones([2], np.float32)})
        writer.create_item("q", 2, 1.0)
    [sample] = list(client.sample("q", 1, emit_timesteps=False))
    assert sample.data[0].tolist() == [[0, 0], [1, 1]]


def test_in_flight_limit_and_a_closed_writer(client):
    writer = client.writer(1, max_in_flight_items=1)
    for i in range(50):
        writer.append(np.int64(i))
        writer.create_item("q", 1, 1.0)
    writer.close()
    assert client.server_info()["q"].current_size == 50
    assert [int(s.data[0][0]) for s in client.sample("q", 50, emit_timesteps=False)] == list(range(50))
    with pytest.raises(RuntimeError, match="Close has been called"):
        writer.append(np.int64(0))
    with pytest.raises(ValueError, match=r"same leading dimension.*\[\[3\], \[2\]\]"):
        client.writer(3).append_sequence([np.zeros(3), np.zeros(2)])


def test_delta_encoded_chunks_travel_delta_encoded(monkeypatch):
    from replay_tf.grpc.client import client_transport  # noqa: PLC0415
    from replay_tf.transport import base as transport_lib  # noqa: PLC0415

    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)  # over gRPC, not in-process
    server = reverb.Server([reverb.Table.queue("q", 10)])
    client = reverb.Client(f"localhost:{server.port}")
    frames = np.cumsum(np.arange(3 * 8, dtype=np.int32).reshape(3, 2, 4), axis=0)
    for delta in (True, False):
        with client.writer(3, delta_encoded=delta) as writer:
            for frame in frames:
                writer.append(frame)
            writer.create_item("q", 3, 1.0)
        [item] = server.table("q")._items.values()
        assert [chunk.delta_encoded for chunk in item.chunks.values()] == [delta]
        [sample] = list(client.sample("q", 1, emit_timesteps=False))
        np.testing.assert_array_equal(sample.data[0], frames)
    server.stop()


def test_a_writer_collected_unclosed_still_sends_its_items(client, caplog):
    import gc  # noqa: PLC0415

    writer = client.writer(2, chunk_length=2)
    writer.append(np.int32(5))
    writer.create_item("q", 1, 1.0)  # waits for its chunk (2 steps), so nothing is sent yet
    del writer
    gc.collect()
    assert "deleted without calling .close" in caplog.text
    assert client.server_info()["q"].current_size == 1  # (before sampling, which would wait for it)
    assert [s.data[0].tolist() for s in client.sample("q", 1, emit_timesteps=False)] == [[5]]


@pytest.mark.parametrize("remote", [False, True])
def test_flush_waits_until_the_server_holds_the_items(remote, monkeypatch):
    # dm-reverb's legacy flush may return before its server has inserted the item (0 or 1 in one scenario).
    from replay_tf.grpc.client import client_transport  # noqa: PLC0415
    from replay_tf.transport import base as transport_lib  # noqa: PLC0415

    if remote:
        monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    server = reverb.Server([reverb.Table.queue("q", 10)])
    client = reverb.Client(f"localhost:{server.port}")
    writer = client.writer(12)  # chunks of 10: the item waits for its chunk until flush
    for i in range(11):
        writer.append(np.int32(i))
    writer.create_item("q", 11, 1.0)
    if remote:  # (in-process, items refer to open chunks and are inserted at once)
        assert server.table("q").info.current_size == 0
    writer.flush()
    assert server.table("q").info.current_size == 1
    writer.close()
    server.stop()


def test_closing_inside_the_with_block_and_a_failing_constructor(client):
    from replay_tf.legacy_writer import Writer  # noqa: PLC0415

    # dm-reverb: leaving the block flushes a closed writer, RuntimeError ("Calling method Flush after Close").
    with pytest.raises(RuntimeError, match="Close has been called"):
        with client.writer(2) as writer:
            writer.append(np.int32(1))
            writer.create_item("q", 1, 1.0)
            writer.close()
    assert client.server_info()["q"].current_size == 1

    class Stream:
        closed = False

        def close(self):
            self.closed = True

    stream = Stream()
    with pytest.raises(ValueError, match="num_keep_alive_refs"):
        Writer(stream, 0, False, 1, None)  # (Client.writer checks first; the writer cleans up anyway)
    assert stream.closed


@pytest.mark.slow
def test_a_writer_alive_at_interpreter_exit_reports_nothing(tmp_path):
    # A writer still referenced by a module global is collected while the interpreter tears modules down.
    code = ("import numpy as np, replay_tf as reverb\n"
            "server = reverb.Server([reverb.Table.queue('q', 10)])\n"
            "client = reverb.Client(f'localhost:{server.port}')\n"
            "writer = client.writer(2)\n"
            "writer.append({'a': np.zeros([2], np.float32)})\n"
            "writer.create_item('q', 1, 1.0)\n"
            "writer.flush()\n"
            "print('written')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "written"
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]
