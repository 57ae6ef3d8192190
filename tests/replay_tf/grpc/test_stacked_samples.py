"""Stacked sample streams: rl-data-tf's extension of `SampleStream`, where our server sends whole responses
of samples stacked per column (`StackedSamples`) to clients that ask (`TrajectoryDataset` does for servers
on this machine). Checked against values that name their own step, against the entries path on the same
table, against protobuf's own encoding, and for what must fall back to entries or fail with a precise error.
"""
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import message as protobuf_message

import replay_tf as reverb
from replay_tf.transport import addresses
from replay_tf.sampling import per_iterator
from replay_tf.sampling import stacking
from replay_tf.wire import stacked_samples
from replay_tf.transport import base as transport_lib
from replay_tf.core import chunk_store
from replay_tf.core import table as table_lib
from replay_tf.grpc.client import client_transport
from replay_tf.grpc.client import sample_stream
from replay_tf.wire import chunk_codec
from replay_tf.wire import tensor_codec
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

_FRAME = (24, 24)  # 2.3 KiB int32 steps: remote writers send one step per chunk; actions share chunks


@pytest.fixture
def remote_server(monkeypatch):
    """A server filled over gRPC (its chunks held as received), sampled over gRPC; step i holds i."""
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    signature = {"action": tf.TensorSpec([3, 2], tf.float32), "observation": tf.TensorSpec([3, *_FRAME], tf.int32),
                 "last": tf.TensorSpec([], tf.int64)}
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1), signature=signature)])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for i in range(30):
            writer.append({"action": np.array([i, -i], np.float32), "observation": np.full(_FRAME, i, np.int32),
                           "last": np.int64(i)})
            if i >= 2:
                writer.create_item("t", 1.0 + i, {"action": writer.history["action"][-3:],
                                                  "observation": writer.history["observation"][-3:],
                                                  "last": writer.history["last"][-1]})  # squeezed
    yield server
    server.stop()


def _count_stacked(monkeypatch) -> list:
    """Records the number of samples of every stacked response a client reads."""
    seen = []
    original = stacked_samples._checked

    def counted(info, columns):
        stacked = original(info, columns)
        seen.append(len(stacked))
        return stacked
    monkeypatch.setattr(stacked_samples, "_checked", counted)
    return seen


def _assert_named_steps(server, batch) -> None:
    last = batch.data["last"].numpy()
    np.testing.assert_array_equal(batch.data["action"].numpy()[:, :, 0], last[:, None] + np.arange(-2, 1))
    np.testing.assert_array_equal(batch.data["observation"].numpy(),
                                  np.broadcast_to((last[:, None] + np.arange(-2, 1))[:, :, None, None],
                                                  (len(last), 3, *_FRAME)))
    items = {item.key: item for item in server.table("t").items_snapshot()}
    for key, priority, last_step in zip(batch.info.key.numpy().tolist(), batch.info.priority.numpy(), last):
        assert priority == items[key].priority == 1.0 + last_step
    np.testing.assert_array_equal(batch.info.table_size.numpy(), 28)
    np.testing.assert_allclose(batch.info.probability.numpy(), 1 / 28)


@pytest.mark.parametrize("stacked", [True, False])
def test_dataset_batches_are_exact_with_and_without_stacking(remote_server, monkeypatch, stacked):
    seen = _count_stacked(monkeypatch)
    decoded_into = []  # frames decoded straight into their rows (server: from views of the stored bytes)
    original = tensor_codec.PendingTensor.decode_into
    monkeypatch.setattr(tensor_codec.PendingTensor, "decode_into",
                        lambda self, out: decoded_into.append(type(self.content)) or original(self, out))
    dataset = reverb.TrajectoryDataset.from_table_signature(f"localhost:{remote_server.port}", "t",
                                                            max_in_flight_samples_per_worker=20,
                                                            stacked_samples=stacked)
    for batch in dataset.batch(16).take(8):  # 16 of 20 per response: batches straddle responses
        assert batch.info.key.shape == (16,)
        _assert_named_steps(remote_server, batch)
    if stacked:
        assert seen and sum(seen) >= 8 * 16
        assert len(decoded_into) >= 3 * sum(seen) and set(decoded_into) == {memoryview}
    else:
        assert not seen and len(decoded_into) >= 3 * 8 * 16 and set(decoded_into) == {bytes}


def test_loopback_servers_are_asked_by_default_and_unbatched_samples_match(remote_server, monkeypatch):
    seen = _count_stacked(monkeypatch)
    dataset = reverb.TrajectoryDataset.from_table_signature(f"localhost:{remote_server.port}", "t",
                                                            max_in_flight_samples_per_worker=7, max_samples=10)
    samples = list(dataset)
    assert len(samples) == 10 and seen and sum(seen) == 10  # max_samples splits no more than it takes
    for sample in samples:
        last = int(sample.data["last"])
        assert sample.data["observation"].shape == (3, *_FRAME)
        assert (sample.data["observation"].numpy()[:, 0, 0] == [last - 2, last - 1, last]).all()


@pytest.mark.parametrize("address, expected", [
    ("localhost:1", True), ("127.0.0.1:80", True), ("[::1]:5", True), ("dns:///localhost:3", True),
    ("ipv4:127.0.0.1:4", True), ("unix:/tmp/socket", True), ("example.com:80", False), ("10.0.0.1:5", False),
    ("[2001:db8::1]:5", False), ("127.0.0.2:9", True), ("127.example.com:80", False)])
def test_only_loopback_addresses_get_stacked_samples_by_default(address, expected):
    assert addresses.is_loopback_target(address) is expected


def test_items_that_do_not_stack_fall_back_to_entries_and_name_the_column(monkeypatch):
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    server = reverb.Server([reverb.Table.queue("q", 10)])  # no signature: items may differ
    client = reverb.Client(f"localhost:{server.port}")
    client.insert(np.arange(2, dtype=np.int32), {"q": 1.0})
    client.insert(np.arange(3, dtype=np.int32), {"q": 1.0})
    seen = _count_stacked(monkeypatch)
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "q", dtypes=tf.int32,
                                       shapes=tf.TensorShape([1, 2]), max_in_flight_samples_per_worker=2,
                                       stacked_samples=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"shape=\[1, 3\], but the dataset expects"):
        list(dataset.batch(2))
    assert not seen  # the server could not stack [1, 2] with [1, 3]: it sent entries
    server.stop()


def test_stacked_columns_of_another_dtype_name_the_column(monkeypatch):
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    server = reverb.Server([reverb.Table.queue("q", 10)])  # no signature: the dataset's dtypes are not checked
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(2):
        client.insert({"a": np.full([2], i, np.int32)}, {"q": 1.0})
    seen = _count_stacked(monkeypatch)
    dataset = reverb.TrajectoryDataset(f"localhost:{server.port}", "q", dtypes={"a": tf.float32},
                                       shapes={"a": tf.TensorShape([1, 2])}, max_in_flight_samples_per_worker=2,
                                       stacked_samples=True)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"column 'a' has dtype=int32 shape=\[1, 2\], but the dataset expects dtype=float32"):
        list(dataset.batch(2))
    assert seen == [2]
    server.stop()


def _sampled(key: int, rows: np.ndarray, squeezed: np.ndarray) -> table_lib.SampledItem:
    chunk = chunk_store.Chunk(key, [rows, squeezed], chunk_store.SequenceRange(0, 0, len(rows) - 1))
    trajectory = (chunk_store.Column((chunk_store.ChunkSlice(key, 1, 2, 0),)),
                  chunk_store.Column((chunk_store.ChunkSlice(key, 2, 1, 1),), squeeze=True))
    item = chunk_store.Item(key, 0.5 * key, trajectory, [chunk])
    return table_lib.SampledItem(item, 0.5 * key, key % 3, 1.0 / key, 10 + key % 7, key % 2 == 0)


def test_stacked_response_is_protobufs_encoding_and_reads_back():
    rng = np.random.default_rng(0)
    sampled = [_sampled(k, rng.integers(0, 1000, (4, 2, 3)).astype(np.int64), rng.random(4).astype(np.float32))
               for k in (3, 4, 2 ** 64 - 1)]
    layouts = stacking.column_layouts(sampled[0].item, lambda chunk: chunk.tensors, chunk_codec.pending_tensors)
    assert layouts == [(np.dtype(np.int64), (2, 2, 3)), (np.dtype(np.float32), ())]
    columns = stacking.stack_items([s.item for s in sampled], layouts, lambda chunk: chunk.tensors,
                                    chunk_codec.pending_tensors)
    assert [c.shape for c in columns] == [(3, 2, 2, 3), (3,)]
    raw = stacked_samples.stacked_response(sampled, columns)

    expected = reverb_service_pb2.SampleStreamResponse()
    proto = expected.replay_tf_stacked
    proto.keys.extend([s.item.key for s in sampled])
    proto.priorities.extend([s.priority for s in sampled])
    proto.times_sampled.extend([s.times_sampled for s in sampled])
    proto.probabilities.extend([s.probability for s in sampled])
    proto.table_sizes.extend([s.table_size for s in sampled])
    proto.rate_limited.extend([s.rate_limited for s in sampled])
    for column in columns:
        tensor = proto.columns.add(dtype=tensor_codec.dtype_enum(column.dtype), tensor_content=column.tobytes())
        for size in column.shape:
            tensor.tensor_shape.dim.add(size=size)
    assert raw == expected.SerializeToString()

    read = stacked_samples.stacked_from_proto(reverb_service_pb2.SampleStreamResponse.FromString(raw).replay_tf_stacked)
    fast = stacked_samples.read_stacked_response(raw)  # the client's reader: views of the bytes, no protobuf
    for got, want in zip([*fast[:6], *fast.columns], [*read[:6], *read.columns]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert not fast.columns[0].flags.writeable and not read.columns[0].flags.writeable  # views, not copies
    assert len(read) == 3 and read.keys.dtype == np.uint64 and read.keys.tolist() == [3, 4, 2 ** 64 - 1]
    assert read.times_sampled.tolist() == [0, 1, 0] and read.rate_limited.tolist() == [False, True, False]
    assert read.table_sizes.tolist() == [13, 14, 11] and read.priorities.tolist() == [1.5, 2.0, 0.5 * (2 ** 64 - 1)]
    for got, s in zip(read.columns[0], sampled):
        np.testing.assert_array_equal(got, s.item.column_arrays()[0])
    np.testing.assert_array_equal(read.columns[1], [s.item.column_arrays()[1] for s in sampled])


def _stacked_proto(n=2, **changes):
    proto = reverb_service_pb2.StackedSamples(keys=range(1, n + 1), priorities=[1.0] * n, times_sampled=[1] * n,
                                              probabilities=[0.5] * n, table_sizes=[2] * n,
                                              rate_limited=[False] * n)
    tensor = proto.columns.add(dtype=tensor_codec.dtype_enum(np.dtype(np.float32)), tensor_content=bytes(4 * n * 3))
    tensor.tensor_shape.dim.add(size=n)
    tensor.tensor_shape.dim.add(size=3)
    for name, value in changes.items():
        if name == "content":
            tensor.tensor_content = value
        elif name == "shape":
            tensor.tensor_shape.ClearField("dim")
            for size in value:
                tensor.tensor_shape.dim.add(size=size)
        elif name == "dtype":
            tensor.dtype = value
        else:
            proto.ClearField(name)
            getattr(proto, name).extend(value)
    return proto


@pytest.mark.parametrize("changes, error", [
    ({}, None),
    ({"priorities": [1.0]}, r"priorities has 1 values, expected 2 \(one per key\)"),
    ({"rate_limited": [True, False, True]}, r"rate_limited has 3 values, expected 2"),
    ({"keys": []}, r"no keys"),
    ({"content": b"\0" * 20}, r"column 0 has 20 bytes of content, expected 24 for shape \[2, 3\] of float32"),
    ({"dtype": 7}, r"column 0 has dtype object and shape \[2, 3\], expected a numeric tensor of 2 rows"),
    ({"dtype": 21}, r"column 0 has an unsupported dtype"),
    ({"shape": (2, -3)}, r"column 0 has dtype float32 and shape \[2, -3\], expected a numeric tensor of 2 rows"),
    ({"shape": (2, 2 ** 32, 2 ** 32)},  # 2 ** 67 bytes: no int64 wrap-around to a size that fits
     r"column 0 has 24 bytes of content, expected 147573952589676412928 for shape"),
])
@pytest.mark.parametrize("reader", ["protobuf", "raw"])
def test_malformed_stacked_samples_name_the_field(changes, error, reader):
    proto = _stacked_proto(**changes)
    if reader == "protobuf":
        read = lambda: stacked_samples.stacked_from_proto(proto)  # noqa: E731
    else:
        raw = reverb_service_pb2.SampleStreamResponse(replay_tf_stacked=proto).SerializeToString()
        read = lambda: stacked_samples.read_stacked_response(raw)  # noqa: E731
    if error is None:
        stacked = read()
        assert len(stacked) == 2 and stacked.columns[0].shape == (2, 3)
        return
    with pytest.raises(reverb.errors.ReverbError, match=error):
        read()


def test_the_raw_reader_leaves_other_encodings_to_protobuf():
    proto = _stacked_proto()
    stacked_raw = reverb_service_pb2.SampleStreamResponse(replay_tf_stacked=proto).SerializeToString()
    entries_raw = reverb_service_pb2.SampleStreamResponse(entries=[{"end_of_sequence": True}]).SerializeToString()
    unpacked_keys = b"\x09" + (5).to_bytes(8, "little") + b"\x09" + (6).to_bytes(8, "little")  # keys one by one
    rest = reverb_service_pb2.StackedSamples.FromString(proto.SerializeToString())
    rest.ClearField("keys")
    body = unpacked_keys + rest.SerializeToString()
    unpacked_raw = b"\xc2\x3e" + bytes([len(body)]) + body
    assert reverb_service_pb2.SampleStreamResponse.FromString(unpacked_raw).replay_tf_stacked.keys == [5, 6]
    assert stacked_samples.read_stacked_response(stacked_raw).keys.tolist() == [1, 2]
    # A column whose content claims more bytes than its tensor holds (the outer lengths all agree).
    overrun = b"\x08\x01\x22\x10abc"
    body = (b"\x0a\x08" + (5).to_bytes(8, "little") + b"\x12\x08" + np.float64(1).tobytes()
            + b"\x1a\x04" + bytes(4) + b"\x22\x08" + np.float64(1).tobytes() + b"\x2a\x08" + bytes(8)
            + b"\x32\x01\x00" + b"\x3a" + bytes([len(overrun)]) + overrun)
    overrun_raw = b"\xc2\x3e" + bytes([len(body)]) + body
    with pytest.raises(protobuf_message.DecodeError):  # protobuf rejects it: the client reports an unreadable response
        reverb_service_pb2.SampleStreamResponse.FromString(overrun_raw)
    for raw in (entries_raw, unpacked_raw, stacked_raw + entries_raw, stacked_raw[:-1], overrun_raw):
        assert stacked_samples.read_stacked_response(raw) is None


def test_a_response_with_entries_and_stacked_samples_is_an_error():
    response = reverb_service_pb2.SampleStreamResponse()
    response.replay_tf_stacked.CopyFrom(_stacked_proto())
    response.entries.add(end_of_sequence=True)
    stream = sample_stream.SampleStream.__new__(sample_stream.SampleStream)
    stream._stacked = False
    with pytest.raises(reverb.errors.ReverbError, match="stacked samples, which this stream did not ask for"):
        stream._samples(response, [None], sample_stream._ChunkCache())
    stream._stacked = True
    with pytest.raises(reverb.errors.ReverbError, match="stacked samples with entries"):
        stream._samples(response, [None], sample_stream._ChunkCache())
    assert len(stream._samples(reverb_service_pb2.SampleStreamResponse(
        replay_tf_stacked=_stacked_proto(3)), [None], sample_stream._ChunkCache())[0]) == 3


def _stacked(keys) -> stacked_samples.StackedSamples:
    keys = np.asarray(keys, np.uint64)
    n = len(keys)
    return stacked_samples.StackedSamples(keys, keys.astype(np.float64), np.zeros(n, np.int32), np.ones(n), np.ones(n, np.int64),
                                    np.zeros(n, bool), [keys.astype(np.int64)[:, None] * [1, 1]])


def test_split_and_count_samples_over_stacked_and_single_samples():
    batch = ["a", _stacked([1, 2, 3]), "b", _stacked([4, 5])]
    assert stacked_samples.count_samples(batch) == 7
    first, rest = per_iterator.split_samples(batch, 3)
    assert first[0] == "a" and first[1].keys.tolist() == [1, 2] and stacked_samples.count_samples(first) == 3
    assert rest[0].keys.tolist() == [3] and rest[1:3] == ["b", rest[2]] and rest[2].keys.tolist() == [4, 5]
    assert rest[0].columns[0].tolist() == [[3, 3]]
    assert per_iterator.split_samples(batch, 4) == (batch[:2], batch[2:])
    assert per_iterator.split_samples(batch, 9) == (batch, [])
    assert per_iterator.split_samples(["a", "b", "c"], 2) == (["a", "b"], ["c"])


def test_a_batch_of_stacked_and_single_samples_stacks_in_order():
    dataset = reverb.TrajectoryDataset("localhost:1", "t", dtypes=tf.int64, shapes=tf.TensorShape([2]),
                                       max_in_flight_samples_per_worker=4)
    single = [table_lib.SampledItem(chunk_store.Item(10 + k, 1.0, (chunk_store.Column((chunk_store.ChunkSlice(
        10 + k, 0, 2, 0),)),), [chunk_store.Chunk(10 + k, [np.full((2,), 10 + k)], chunk_store.SequenceRange(0, 0, 1))]),
        1.0, 1, 0.25, 4, False) for k in range(2)]
    sample = dataset._stack([_stacked([1, 2]), *single, _stacked([3])])
    assert sample.info.key.tolist() == [1, 2, 10, 11, 3]
    assert sample.info.probability.tolist() == [1.0, 1.0, 0.25, 0.25, 1.0]
    np.testing.assert_array_equal(sample.data, [[1, 1], [2, 2], [10, 10], [11, 11], [3, 3]])


def test_server_keeps_decoded_multi_row_chunks_within_its_bound_and_never_one_row_ones():
    decoded_calls = []

    def chunk(key, rows):
        encoded = np.full((rows, 100), key, np.uint8).tobytes()  # 100 bytes a row, stored as bytes
        return chunk_store.Chunk(key, None, chunk_store.SequenceRange(0, 0, rows - 1), encoded=encoded,
                                 decoder=lambda b: decoded_calls.append(key) or [
                                     np.frombuffer(b, np.uint8).reshape(rows, 100).copy()])

    entry = 512 + 300 + 300  # objects, decoded rows, and the stored bytes the entry keeps alive
    cache = stacking.DecodedChunks(max_bytes=2 * entry)  # room for two three-row chunks
    chunks = [chunk(k, 3) for k in range(3)] + [chunk(9, 1)]
    tensors_of, _ = cache.readers()
    for c in chunks + chunks:  # multi-row chunks decoded once per gather, one-row ones at each read
        assert (tensors_of(c)[0] == c.key).all()
    assert decoded_calls == [0, 1, 2, 9, 9] and len(cache) == 2 and cache.nbytes == 2 * entry
    assert not any(c.is_decoded for c in chunks)  # nothing kept on the chunks
    tensors_of, _ = cache.readers()  # a later gather: chunks 1 and 2 kept, 0 evicted, 9 never kept
    for c in [chunks[2], chunks[1], chunks[0], chunks[3]]:
        tensors_of(c)
    assert decoded_calls[5:] == [0, 9]


def _serialized_chunk(tensors, delta=False, key=7):
    chunk = chunk_store.Chunk(key, tensors, chunk_store.SequenceRange(3, 10, 10 + len(tensors[0]) - 1),
                              delta_encoded=delta)
    return chunk_codec.chunk_to_proto(chunk).SerializeToString()


@pytest.mark.parametrize("delta", [False, True])
def test_stored_tensors_are_views_of_the_serialized_chunk_that_decode_as_protobuf_does(delta):
    rng = np.random.default_rng(1)
    tensors = [rng.integers(-50, 50, (1, 6, 5)).astype(np.int32), rng.random((1, 3)).astype(np.float64),
               np.array([True], bool)]
    serialized = _serialized_chunk(tensors, delta)
    chunk, _ = chunk_codec.chunk_from_proto(schema_pb2.ChunkData.FromString(serialized), serialized)
    stored = chunk_codec.stored_tensors(chunk)
    assert [type(t.content) for t in stored] == [memoryview] * 3 and stored[0].delta is delta
    for pending, proto_tensor, array in zip(stored, schema_pb2.ChunkData.FromString(serialized).data.tensors,
                                            tensors):
        assert bytes(pending.content) == proto_tensor.tensor_content
        np.testing.assert_array_equal(pending.decode(), array)
    assert not chunk.is_decoded and chunk_codec.stored_tensors(chunk) is stored  # found once
    decoded, _ = chunk_codec.chunk_from_proto(schema_pb2.ChunkData.FromString(serialized), serialized)
    decoded.tensors  # decoded before anything asked: read from its arrays instead
    assert chunk_codec.stored_tensors(decoded) is None


def test_stored_tensors_leave_what_the_walk_does_not_read_to_protobuf():
    strings = _serialized_chunk([np.array([b"a"], object)])
    proto = schema_pb2.ChunkData.FromString(_serialized_chunk([np.zeros((1, 2), np.int32)]))
    proto.deprecated_data.add().CopyFrom(proto.data.tensors[0])
    for serialized in (strings, proto.SerializeToString()):
        chunk = chunk_store.Chunk(7, None, chunk_store.SequenceRange(0, 0, 0), encoded=serialized,
                                  decoder=lambda _: [])
        assert chunk_codec.stored_tensors(chunk) is None


def test_zero_size_columns_stack_and_read_back():
    sampled = [_sampled(k, np.zeros((4, 2, 3), np.int64), np.zeros(4, np.float32)) for k in (3, 4)]
    columns = [np.empty((2, 0), np.float32), np.empty((2, 3, 0), np.bool_)]
    raw = stacked_samples.stacked_response(sampled, columns)
    proto = reverb_service_pb2.SampleStreamResponse.FromString(raw).replay_tf_stacked
    assert [[d.size for d in t.tensor_shape.dim] for t in proto.columns] == [[2, 0], [2, 3, 0]]
    for read in (stacked_samples.stacked_from_proto(proto), stacked_samples.read_stacked_response(raw)):
        assert [(c.shape, c.dtype) for c in read.columns] == [((2, 0), np.float32), ((2, 3, 0), np.bool_)]


def test_the_raw_reader_never_reads_on_past_a_varint_or_what_protobuf_reads_otherwise():
    endless = b"\xc2\x3e\x80\x80\x04" + b"\x0a" + b"\xff" * (1 << 16) + b"\x01"  # 64 KiB of one varint
    endless = endless[:2] + _raw_varint(len(endless) - 5) + endless[5:]
    assert stacked_samples.read_stacked_response(endless) is None
    proto = _stacked_proto()
    twice = reverb_service_pb2.SampleStreamResponse(replay_tf_stacked=proto).SerializeToString()
    shape = proto.columns[0].tensor_shape.SerializeToString()
    # The column's shape given twice (protobuf merges the dims): left to protobuf.
    tensor = proto.columns[0].SerializeToString()
    doubled = tensor.replace(b"\x12" + bytes([len(shape)]) + shape, (b"\x12" + bytes([len(shape)]) + shape) * 2)
    body = proto.SerializeToString().replace(b"\x3a" + bytes([len(tensor)]) + tensor,
                                             b"\x3a" + bytes([len(doubled)]) + doubled)
    raw = b"\xc2\x3e" + _raw_varint(len(body)) + body
    assert [d.size for d in reverb_service_pb2.SampleStreamResponse.FromString(raw).replay_tf_stacked.columns[0]
            .tensor_shape.dim] == [2, 3, 2, 3]
    assert stacked_samples.read_stacked_response(raw) is None and stacked_samples.read_stacked_response(twice) is not None


def _raw_varint(value: int) -> bytes:
    from replay_tf.wire import raw_fields
    return raw_fields.varint(value)


def test_samples_with_string_columns_go_as_entries_a_response_of_several(monkeypatch):
    from replay_tf.grpc.server import sample_stream as server_streams
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    sent_as_entries = []  # samples per call of the entries path
    original = server_streams.SampleStreams._responses

    def recorded(self, entry, batch):
        sent_as_entries.append(len(batch))
        return original(self, entry, batch)
    monkeypatch.setattr(server_streams.SampleStreams, "_responses", recorded)
    signature = {"n": tf.TensorSpec([1], tf.int64), "tag": tf.TensorSpec([1], tf.string)}
    server = reverb.Server([reverb.Table.queue("q", 100, signature=signature)])
    client = reverb.Client(f"localhost:{server.port}")
    for i in range(16):
        client.insert({"n": np.int64(i), "tag": np.array(f"t{i}".encode(), object)}, {"q": 1.0})
    dataset = reverb.TrajectoryDataset.from_table_signature(f"localhost:{server.port}", "q", 16,
                                                            stacked_samples=True, max_samples=16)
    batch = next(iter(dataset.batch(16)))
    assert batch.data["n"].numpy()[:, 0].tolist() == list(range(16))
    assert [t.decode() for t in batch.data["tag"].numpy()[:, 0]] == [f"t{i}" for i in range(16)]
    assert sum(sent_as_entries) == 16 and max(sent_as_entries) > 1  # not one response per sample
    server.stop()
