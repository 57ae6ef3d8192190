"""Confirmed data is never lost or mixed up: unique keys, refused collisions, poisoned chunks, checkpoints that
fail, run at once or are crafted, and a server stopped while writers insert."""
import os
import random

import grpc
import numpy as np
import pytest

import replay_tf as reverb
from replay_tf.core import chunk_store
from replay_tf.wire import codec
from replay_tf.wire import reverb_service_pb2

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
        request.chunks.append(codec.chunk_to_proto(chunk))
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
    random.seed(0)
    state_ids = {reverb.Server([_uniform_table()]).tables_state_id for _ in range(2)}
    assert len(state_ids) == 2


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
