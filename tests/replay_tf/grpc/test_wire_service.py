"""Our ReverbService with raw gRPC calls: statuses for bad input, freed chunks, and a server that survives."""
import gc
import os
import re
import threading
import time

import cramjam
import grpc
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf import errors
from replay_tf.core import chunk_store
from replay_tf.grpc import common
from replay_tf.grpc.server import service
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

_PREFIX = "/deepmind.reverb.ReverbService/"


@pytest.fixture(scope="module")
def server():
    server = reverb.Server([
        reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100, reverb.rate_limiters.MinSize(1)),
        reverb.Table("sig", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100, reverb.rate_limiters.MinSize(1),
                     signature={"x": tf.TensorSpec([None, 2], tf.float32)}),
        reverb.Table("empty", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                     reverb.rate_limiters.MinSize(1)),
        reverb.Table.queue("q", 2),
    ])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(f"localhost:{server.port}") as channel:
        yield channel


def _stream(channel, method, requests, timeout=20):
    call = channel.stream_stream(_PREFIX + method, request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)(iter(requests), timeout=timeout)
    return list(call)


def _chunk(key, rows=3, dtype=np.float32, width=2):
    return chunk_store.Chunk(key, [np.arange(rows * width, dtype=dtype).reshape(rows, width)],
                             chunk_store.SequenceRange(1, 0, rows - 1))


def _request(chunks=(), items=(), keep=()):
    request = reverb_service_pb2.InsertStreamRequest(keep_chunk_keys=list(keep))
    for chunk in chunks:
        request.chunks.append(chunk_codec.chunk_to_proto(chunk))
    for key, table, slices, squeeze in items:
        item = request.items.add(key=key, table=table, priority=1.0)
        column = item.flat_trajectory.columns.add(squeeze=squeeze)
        for chunk_key, offset, length in slices:
            column.chunk_slices.add(chunk_key=chunk_key, offset=offset, length=length)
    return request.SerializeToString()


def _status(fn):
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value.code(), info.value.details()


INSERT_ERRORS = [
    # (requests, code, details regex)
    ([b"\xff\xff\xff"], grpc.StatusCode.INVALID_ARGUMENT, r"malformed InsertStreamRequest \(3 bytes\)"),
    ([_request()], grpc.StatusCode.INVALID_ARGUMENT, r"at least one chunk or item"),
    ([_request([_chunk(1)], [(10, "nope", [(1, 0, 1)], False)])], grpc.StatusCode.NOT_FOUND,
     r"Priority table nope was not found. The server has tables: \['empty', 'q', 'sig', 't'\]"),
    ([_request([], [(10, "t", [(99, 0, 1)], False)])], grpc.StatusCode.FAILED_PRECONDITION,
     r"Could not find sequence chunk 99"),
    ([_request([_chunk(1)], [(10, "t", [(1, 0, 1)], False)]), _request([], [(11, "t", [(1, 0, 1)], False)])],
     grpc.StatusCode.FAILED_PRECONDITION, r"Could not find sequence chunk 1\. .*keep_chunk_keys"),
    ([_request([_chunk(1)], [(10, "t", [(1, 0, 1)], False)], keep=[1, 5])], grpc.StatusCode.FAILED_PRECONDITION,
     r"Kept less chunks than expected.*\[5\]"),
    ([_request([_chunk(1)], [(10, "t", [(1, 2, 5)], False)])], grpc.StatusCode.INVALID_ARGUMENT,
     r"slice \(1, 2, 5, 0\) of column 0 is out of chunk 1's rows \[0, 3\)"),
    ([_request([_chunk(4, dtype=np.int32)], [(10, "sig", [(4, 0, 2)], False)])], grpc.StatusCode.INVALID_ARGUMENT,
     r"does not match the table signature at column 'x'.*got dtype=int32 shape=\[2, 2\]"),
    ([_request([_chunk(5, width=3)], [(10, "sig", [(5, 0, 2)], False)])], grpc.StatusCode.INVALID_ARGUMENT,
     r"column 'x'.*got dtype=float32 shape=\[2, 3\]"),
    ([_request([_chunk(6), _chunk(7, width=3)], [(10, "t", [(6, 0, 1), (7, 0, 1)], False)])],
     grpc.StatusCode.INVALID_ARGUMENT, r"column 0 joins slices of different dtypes or shapes"),
]


@pytest.mark.parametrize("requests,code,details", INSERT_ERRORS)
def test_insert_stream_errors(channel, server, requests, code, details):
    got_code, got_details = _status(lambda: _stream(channel, "InsertStream", requests))
    assert got_code == code
    assert __import__("re").search(details, got_details), got_details
    assert server.tables["t"].get_item(11) is None


def test_corrupt_chunk_content_is_rejected_when_read_and_header_errors_at_once(channel):
    proto = chunk_codec.chunk_to_proto(_chunk(7))
    proto.data.tensors[0].dtype = tf.variant.as_datatype_enum
    request = reverb_service_pb2.InsertStreamRequest(chunks=[proto]).SerializeToString()
    code, details = _status(lambda: _stream(channel, "InsertStream", [request]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "variant are not supported" in details


def test_insert_confirms_keys_and_data_round_trips(channel, server):
    responses = _stream(channel, "InsertStream", [
        _request([_chunk(21)], [(30, "t", [(21, 0, 2)], False)], keep=[21]),
        _request([], [(31, "t", [(21, 2, 1)], True)])])
    keys = [k for r in responses for k in reverb_service_pb2.InsertStreamResponse.FromString(r).keys]
    assert keys == [30, 31]
    np.testing.assert_array_equal(server.tables["t"].get_item(31).column_arrays()[0], [4.0, 5.0])
    server.tables["t"].mutate_items(deletes=[30, 31])


def test_items_of_one_request_are_confirmed_in_one_response(channel, server):
    # A request's items inserted at once are confirmed together (one response per request, not per item).
    items = [(60 + i, "t", [(22, i, 1)], True) for i in range(4)]
    responses = _stream(channel, "InsertStream", [_request([_chunk(22, rows=4)], items)])
    assert [list(reverb_service_pb2.InsertStreamResponse.FromString(r).keys) for r in responses] == [[60, 61, 62, 63]]
    server.tables["t"].mutate_items(deletes=[60, 61, 62, 63])


def test_each_column_layout_of_a_stream_is_checked_against_the_signature(channel, server):
    # The service checks a layout once per stream: a later item with another layout is still refused.
    requests = [_request([_chunk(23, rows=3)], [(70, "sig", [(23, 0, 2)], False), (71, "sig", [(23, 1, 2)], False)],
                         keep=[23]),
                _request([_chunk(24, rows=3, width=3)], [(72, "sig", [(24, 0, 2)], False)])]
    call = channel.stream_stream(_PREFIX + "InsertStream", request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)(iter(requests), timeout=20)
    keys = []
    with pytest.raises(grpc.RpcError) as info:
        for raw in call:
            keys += reverb_service_pb2.InsertStreamResponse.FromString(raw).keys
    assert keys == [70, 71]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(r"item 72 for table 'sig' does not match the table signature at column 'x'.*shape=\[2, 3\]",
                     info.value.details())
    server.tables["sig"].mutate_items(deletes=[70, 71])


def test_chunks_of_failed_and_cancelled_streams_are_freed(channel, server):
    gc.collect()
    before = len(server.chunk_store)
    _status(lambda: _stream(channel, "InsertStream", [_request([_chunk(40), _chunk(41)], [(50, "t", [(99, 0, 1)], False)])]))
    # A client that disconnects mid-stream, with chunks held for later items.
    stop = threading.Event()

    def requests():
        yield _request([_chunk(42)])
        stop.wait(10)

    call = channel.stream_stream(_PREFIX + "InsertStream", request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)(requests(), timeout=20)
    time.sleep(0.5)
    call.cancel()
    stop.set()
    for _ in range(50):
        gc.collect()
        if len(server.chunk_store) == before:
            break
        time.sleep(0.1)
    assert len(server.chunk_store) == before


def test_sample_stream_statuses(channel):
    def sample(table, num_samples, timeout_ms=0):
        request = reverb_service_pb2.SampleStreamRequest(table=table, num_samples=num_samples)
        request.rate_limiter_timeout.milliseconds = timeout_ms
        return _stream(channel, "SampleStream", [request.SerializeToString()])

    assert _status(lambda: sample("t", 0))[0] == grpc.StatusCode.INVALID_ARGUMENT
    assert _status(lambda: sample("nope", 1))[0] == grpc.StatusCode.NOT_FOUND
    code, details = _status(lambda: sample("empty", 1, timeout_ms=50))
    assert (code, details) == (grpc.StatusCode.DEADLINE_EXCEEDED, errors.RATE_LIMITER_TIMEOUT_MESSAGE)
    assert _status(lambda: _stream(channel, "SampleStream", [b"\x10"]))[0] == grpc.StatusCode.INVALID_ARGUMENT


def test_sample_entries_info_and_end_of_sequence(channel, server):
    _stream(channel, "InsertStream", [_request([_chunk(60)], [(61, "q", [(60, 0, 3)], False)])])
    request = reverb_service_pb2.SampleStreamRequest(table="q", num_samples=1).SerializeToString()
    [raw] = _stream(channel, "SampleStream", [request])
    [entry] = reverb_service_pb2.SampleStreamResponse.FromString(raw).entries
    assert entry.end_of_sequence and entry.info.item.key == 61 and entry.info.item.table == "q"
    assert entry.info.probability == 1.0 and entry.info.table_size == 1 and entry.info.item.times_sampled == 1
    assert entry.info.item.inserted_at.seconds > 0
    [chunk] = entry.data
    np.testing.assert_array_equal(chunk_codec.decode_chunk_tensors(chunk)[0], _chunk(60).tensors[0])


def test_large_sample_is_split_over_responses(channel, server):
    big = chunk_store.Chunk(70, [np.random.default_rng(0).integers(0, 255, (3, 1 << 20), dtype=np.uint8)],
                            chunk_store.SequenceRange(2, 0, 2))
    small = [chunk_store.Chunk(71 + i, [np.random.default_rng(i).integers(0, 255, (1, 1 << 20), dtype=np.uint8)],
                               chunk_store.SequenceRange(3 + i, 0, 0)) for i in range(3)]
    request = reverb_service_pb2.InsertStreamRequest()
    for chunk in [big] + small:
        request.chunks.append(chunk_codec.chunk_to_proto(chunk))
    item = request.items.add(key=80, table="q", priority=1.0)
    for chunk in [big] + small:
        item.flat_trajectory.columns.add().chunk_slices.add(chunk_key=chunk.key, offset=0, length=1)
    _stream(channel, "InsertStream", [request.SerializeToString()])
    sample = reverb_service_pb2.SampleStreamRequest(table="q", num_samples=1).SerializeToString()
    responses = [reverb_service_pb2.SampleStreamResponse.FromString(r) for r in _stream(channel, "SampleStream", [sample])]
    entries = [e for r in responses for e in r.entries]
    assert len(responses) > 1 and entries[0].HasField("info") and not any(e.HasField("info") for e in entries[1:])
    assert [e.end_of_sequence for e in entries] == [False] * (len(entries) - 1) + [True]
    assert sorted(c.chunk_key for e in entries for c in e.data) == [70, 71, 72, 73]


def test_initialize_connection_never_returns_a_pointer(channel):
    request = reverb_service_pb2.InitializeConnectionRequest(pid=os.getpid(), table_name="t").SerializeToString()
    [raw] = _stream(channel, "InitializeConnection", [request])
    assert reverb_service_pb2.InitializeConnectionResponse.FromString(raw).address == 0


def test_unary_errors(channel):
    def unary(method, request):
        return channel.unary_unary(_PREFIX + method, request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)(request, timeout=20)

    assert _status(lambda: unary("Reset", reverb_service_pb2.ResetRequest(table="x").SerializeToString()))[0] \
        == grpc.StatusCode.NOT_FOUND
    bad = reverb_service_pb2.MutatePrioritiesRequest(table="t", updates=[schema_pb2.KeyWithPriority(
        key=1, priority=float("nan"))]).SerializeToString()
    code, details = _status(lambda: unary("MutatePriorities", bad))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "NaN" in details
    code, details = _status(lambda: unary("Checkpoint", b""))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "no Checkpointer" in details
    assert _status(lambda: unary("ServerInfo", b"\x0a\x05ab"))[0] == grpc.StatusCode.INVALID_ARGUMENT
    info = reverb_service_pb2.ServerInfoResponse.FromString(unary("ServerInfo", b""))
    assert sorted(t.name for t in info.table_info) == ["empty", "q", "sig", "t"]
    assert (info.tables_state_id.high, info.tables_state_id.low) != (0, 0)


def test_binds_localhost_and_refuses_a_taken_port(server):
    with pytest.raises(ValueError, match=r"could not bind the replay service to localhost:\d+"):
        service.start(server)


def test_insert_back_pressure_and_confirmations_while_blocked(server):
    # Queue of 2: the third insert blocks on the rate limiter; the first two are confirmed meanwhile, and
    # sampling releases the rest.
    channel = grpc.insecure_channel(f"localhost:{server.port}")
    chunk = _chunk(100, rows=5)
    requests = [_request([chunk], [(110 + i, "q", [(100, i, 1)], False) for i in range(5)])]
    call = channel.stream_stream(_PREFIX + "InsertStream", request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)(iter(requests), timeout=30)
    first = reverb_service_pb2.InsertStreamResponse.FromString(next(call)).keys
    assert list(first) == [110, 111]
    client = reverb.Client(f"localhost:{server.port}")
    got = [int(ts[0].data[0][0]) for ts in client.sample("q", 5)]
    assert got == [0, 2, 4, 6, 8]
    rest = [k for raw in call for k in reverb_service_pb2.InsertStreamResponse.FromString(raw).keys]
    assert rest == [112, 113, 114]
    channel.close()


def test_remote_writer_reports_items_it_cannot_encode(server):
    from replay_tf.grpc.client import client_transport  # noqa: PLC0415
    transport = client_transport.Transport(f"localhost:{server.port}")
    stream = transport.open_insert_stream()
    chunk = chunk_store.Chunk(200, [np.array([1, 2], dtype=object)], chunk_store.SequenceRange(1, 0, 1))
    trajectory = (chunk_store.Column((chunk_store.ChunkSlice(200, 0, 2, 0),), False),)
    stream.send("t", chunk_store.Item(201, 1.0, trajectory, [chunk]))
    with pytest.raises(ValueError, match=r"could not encode an item for the InsertStream: TypeError: string "
                                         r"tensors hold bytes or str, got int"):
        stream.flush(0, 10_000)
    stream.close()
    transport.close()


def test_a_reused_chunk_key_is_checked_against_the_stored_chunk(channel, server):
    # Stream 1 stores chunk 300 (int32 [3, 2]) for a live item. Stream 2 sends another chunk 300 (float32
    # [3, 2], as the signature wants) and an item on it: a different chunk under a live key is refused before
    # any item can refer to either copy.
    _stream(channel, "InsertStream", [_request([_chunk(300, dtype=np.int32)], [(301, "t", [(300, 0, 3)], False)])])
    code, details = _status(lambda: _stream(channel, "InsertStream", [
        _request([_chunk(300)], [(302, "sig", [(300, 0, 2)], False)])]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "chunk key 300 is already used by a different chunk" in details, details
    assert server.tables["sig"].get_item(302) is None
    server.tables["t"].mutate_items(deletes=[301])


def test_a_chunk_is_kept_as_the_bytes_it_arrived_as(channel, server):
    # A chunk whose fields come in another order than protobuf writes them (valid: they merge) is stored as
    # received, not serialized again, and reads back the same; a later chunk with the same header whose
    # content contradicts it is still refused.
    proto = chunk_codec.chunk_to_proto(_chunk(320))
    reordered = (schema_pb2.ChunkData(data=proto.data).SerializeToString()
                 + schema_pb2.ChunkData(chunk_key=320, sequence_range=proto.sequence_range).SerializeToString())
    assert reordered != proto.SerializeToString()
    request = (b"\x0a" + raw_fields.varint(len(reordered)) + reordered
               + _request([], [(321, "t", [(320, 1, 2)], False)]))
    _stream(channel, "InsertStream", [request])
    [stored] = server.chunk_store.get([320])
    assert chunk_codec.serialized_chunk(stored) == reordered
    np.testing.assert_array_equal(server.tables["t"].get_item(321).column_arrays()[0], [[2, 3], [4, 5]])
    server.tables["t"].mutate_items(deletes=[321])
    bad = chunk_codec.chunk_to_proto(_chunk(322))
    bad.data.tensors[0].tensor_content = bytes(cramjam.snappy.compress_raw(b"\0" * 20))
    code, details = _status(lambda: _stream(channel, "InsertStream", [
        reverb_service_pb2.InsertStreamRequest(chunks=[bad]).SerializeToString()]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "needs 24 bytes, its content announces 20" in details, details


def test_the_service_uses_the_servers_chunk_store(channel, server):
    gc.collect()
    before = len(server.chunk_store)
    _stream(channel, "InsertStream", [_request([_chunk(310)], [(311, "t", [(310, 0, 3)], False)])])
    assert len(server.chunk_store) == before + 1
    server.tables["t"].mutate_items(deletes=[311])
    gc.collect()
    assert len(server.chunk_store) == before


def test_a_cancelled_sampler_stops_waiting_and_takes_no_item(monkeypatch):
    # Waiting slices longer than the test: only the cancellation callback can end the wait.
    monkeypatch.setattr(common, "WAIT_SLICE_MS", 600_000)
    server = reverb.Server([reverb.Table.queue("cq", 10)])
    table = server.tables["cq"]
    channel = grpc.insecure_channel(f"localhost:{server.port}")
    try:
        request = reverb_service_pb2.SampleStreamRequest(table="cq", num_samples=1).SerializeToString()
        call = channel.stream_stream(_PREFIX + "SampleStream", request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)(iter([request]), timeout=60)

        def wait_until(predicate, what):
            for _ in range(200):
                if predicate():
                    return
                time.sleep(0.05)
            raise AssertionError(f"timed out waiting until {what}")

        wait_until(lambda: table._num_waiting == 1, "the sampler waits on the empty queue")
        call.cancel()
        wait_until(lambda: table._num_waiting == 0, "the cancelled sampler stops waiting")
        # An item inserted now is not consumed by the cancelled stream: the next client gets it.
        reverb.Client(f"localhost:{server.port}").insert(np.float32(3), priorities={"cq": 1.0})
        assert table.size() == 1
        [sample] = next(reverb.Client(f"localhost:{server.port}").sample("cq"))
        assert float(sample.data[0]) == 3.0
        assert table.info.num_unique_samples == 1
    finally:
        channel.close()
        server.stop()


def test_pending_insert_queue_limit_and_order():
    # Table.queue(.., 20): the rate limiter admits 20 items; Reverb's queue limit is max(1, min(0.1 * 20,
    # 1000)) = 2 more items; the stream's other items stay unread until the queue has room.
    server = reverb.Server([reverb.Table.queue("bp", 20)])
    channel = grpc.insecure_channel(f"localhost:{server.port}")
    try:
        requests = [_request([_chunk(1000 + i, rows=1)], [(2000 + i, "bp", [(1000 + i, 0, 1)], False)])
                    for i in range(30)]
        call = channel.stream_stream(_PREFIX + "InsertStream", request_serializer=lambda b: b,
                                     response_deserializer=lambda b: b)(iter(requests), timeout=60)
        confirmed = []
        while len(confirmed) < 20:
            confirmed += reverb_service_pb2.InsertStreamResponse.FromString(next(call)).keys
        assert confirmed == [2000 + i for i in range(20)]
        servicer = server._service.servicer
        for _ in range(200):
            if servicer.pending_inserts("bp")[0] == 2:
                break
            time.sleep(0.05)
        assert servicer.pending_inserts("bp") == (2, 2)
        assert server.tables["bp"].size() == 20
        # Sampling makes room: the queued items go in first, then the rest of the stream, in order.
        client = reverb.Client(f"localhost:{server.port}")
        assert [ts[0].info.key for ts in client.sample("bp", 30)] == [2000 + i for i in range(30)]
        confirmed += [k for raw in call for k in reverb_service_pb2.InsertStreamResponse.FromString(raw).keys]
        assert confirmed == [2000 + i for i in range(30)]
    finally:
        channel.close()
        server.stop()
