"""Chunk tensor encoding (Snappy raw, delta, strings) and proto conversions, against hand-computed values
and against dm-reverb 0.14 in both directions (chunks encoded by Reverb decode here; ours decode there)."""
import base64
import collections

import cramjam
import numpy as np
import pytest
import tensorflow as tf

from replay_tf.core import chunk_store
from replay_tf.core import rate_limiters
from replay_tf.core import selectors
from replay_tf.core import table as table_lib
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import protos
from replay_tf.wire import table_info
from replay_tf.wire import tensor_codec
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

_RNG = np.random.default_rng(0)


def _random(dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return _RNG.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "b":
        return _RNG.integers(0, 2, size=shape).astype(bool)
    if dtype.kind == "c":
        return (_RNG.standard_normal(shape) + 1j * _RNG.standard_normal(shape)).astype(dtype)
    return _RNG.standard_normal(shape).astype(dtype)


_BFLOAT16 = tf.bfloat16.as_numpy_dtype

ROUND_TRIP = [
    # (dtype, shape)
    (np.float32, (5, 3)),
    (np.float64, (2,)),
    (np.float16, (3, 2, 2)),
    (_BFLOAT16, (4, 2)),
    (np.int8, (4, 3)),
    (np.int16, (3, 2, 2)),
    (np.int32, (6, 2)),
    (np.int64, (3, 1, 2)),
    (np.uint8, (4, 84, 84)),
    (np.uint16, (2, 3)),
    (np.uint32, (3, 3)),
    (np.uint64, (3, 2)),
    (np.int32, (7,)),        # rank 1: never delta-encoded
    (np.bool_, (4, 2)),
    (np.complex64, (3, 2)),
    (np.complex128, (2,)),
    (np.float32, (0, 3)),    # no rows
    (np.uint8, (2, 0)),      # no bytes
]


@pytest.mark.parametrize("delta_encoded", [False, True])
@pytest.mark.parametrize("dtype,shape", ROUND_TRIP)
def test_round_trip(dtype, shape, delta_encoded):
    array = _random(dtype, shape)
    proto = tensor_codec.encode_tensor(array, delta_encoded=delta_encoded)
    assert proto.dtype == tf.as_dtype(np.dtype(dtype)).as_datatype_enum
    assert [d.size for d in proto.tensor_shape.dim] == list(shape)
    out = tensor_codec.decode_tensor(tensor_codec.encode_tensor(array, delta_encoded=delta_encoded),
                                     delta_encoded=delta_encoded)
    assert out.dtype == array.dtype and out.shape == array.shape
    np.testing.assert_array_equal(out, array)


def test_strings_are_uncompressed_tf_string_lists():
    array = np.array([[b"a", b""], [b"\x00\xff", "é".encode() * 100]], dtype=object)
    proto = tensor_codec.encode_tensor(array, delta_encoded=True)
    assert proto.dtype == tf.string.as_datatype_enum
    # Varint lengths (1, 0, 2, 200 = 0xC8 0x01), then the bytes: what TF's AsProtoTensorContent writes.
    assert proto.tensor_content == b"\x01\x00\x02\xc8\x01" + b"a" + b"\x00\xff" + "é".encode() * 100
    out = tensor_codec.decode_tensor(proto, delta_encoded=True)
    assert out.dtype == object and out.tolist() == array.tolist()
    # TF's C++ Tensor::FromProto reads it back; TF's Python encoder writes string_val, which we read too.
    assert tf.io.parse_tensor(proto.SerializeToString(), tf.string).numpy().tolist() == array.tolist()
    legacy = tf.make_tensor_proto(array)
    assert tensor_codec.decode_tensor(legacy).tolist() == array.tolist()


@pytest.mark.parametrize("array,expected_rows", [
    # Consecutive differences along dim 0 on the unsigned reinterpretation, wrapping (hand-computed).
    (np.array([[1, 2], [3, 5], [3, 4]], np.uint8), [[1, 2], [2, 3], [0, 255]]),
    (np.array([[255], [0]], np.uint8), [[255], [1]]),
    (np.array([[-1], [1]], np.int8), [[255], [2]]),
    (np.array([[0], [2**63 - 1], [-(2**63)]], np.int64), [[0], [2**63 - 1], [1]]),
])
def test_delta_encoding_is_reverbs(array, expected_rows):
    proto = tensor_codec.encode_tensor(array, delta_encoded=True)
    raw = np.frombuffer(bytes(cramjam.snappy.decompress_raw(proto.tensor_content)),
                        dtype=array.dtype.str.replace("i", "u")).reshape(array.shape)
    np.testing.assert_array_equal(raw, np.array(expected_rows, dtype=raw.dtype))


def test_non_delta_content_is_snappy_of_raw_bytes():
    array = np.arange(24, dtype=np.float32).reshape(4, 6)
    proto = tensor_codec.encode_tensor(array, delta_encoded=True)  # floats ignore delta
    assert bytes(cramjam.snappy.decompress_raw(proto.tensor_content)) == array.tobytes()


def _proto(dtype_enum, shape, content=b"", strings=()):
    proto = tensor_codec._TensorProto(dtype=dtype_enum, tensor_content=content)
    for size in shape:
        proto.tensor_shape.dim.add().size = size
    proto.string_val.extend(strings)
    return proto


@pytest.mark.parametrize("proto,error", [
    (_proto(tf.float32.as_datatype_enum, [2], b"not snappy at all"), r"Snappy|needs 8 bytes"),
    (_proto(tf.float32.as_datatype_enum, [3], bytes(cramjam.snappy.compress_raw(b"\0" * 8))),
     r"dtype float32 and shape \[3\] needs 12 bytes, its content decompresses to 8"),
    (_proto(tf.variant.as_datatype_enum, [1]), r"dtype variant are not supported"),
    (_proto(tf.resource.as_datatype_enum, [1]), r"dtype resource are not supported"),
    (_proto(999, [1]), r"unknown tensor dtype enum 999"),
    (_proto(tf.int32.as_datatype_enum, [-1, 2]), r"negative dimension"),
    (_proto(tf.string.as_datatype_enum, [3], strings=[b"a"]), r"has 1 values, expected 3"),
    (_proto(tf.string.as_datatype_enum, [2], b"\x01"), r"ends inside the lengths of its 2 strings"),
    (_proto(tf.string.as_datatype_enum, [1], b"\x03ab"), r"has 2 bytes of data, its 1 lengths add up to 3"),
    (_proto(tf.float32.as_datatype_enum, [2], b"\x08\x01\x02"), r"Snappy"),
])
def test_decode_errors(proto, error):
    with pytest.raises(tensor_codec.ChunkDecodeError, match=error):
        tensor_codec.decode_tensor(proto)



@pytest.mark.parametrize("shape,content,error", [
    ([2], b"not snappy at all", r"needs 8 bytes, its content decompresses to 110"),  # 'n' reads as size 110
    ([2], b"\x08\x01\x02", r"not valid Snappy raw data"),  # announces the 8 bytes, then ends
    ([3], bytes(cramjam.snappy.compress_raw(b"\0" * 8)),
     r"dtype float32 and shape \[3\] needs 12 bytes, its content decompresses to 8"),
    ([3], bytes(cramjam.snappy.compress_raw(b"\0" * 16)),
     r"dtype float32 and shape \[3\] needs 12 bytes, its content decompresses to 16"),
])
def test_decode_errors_once_the_header_is_known(shape, content, error):
    # A valid tensor of the same dtype and shape first: its parsed header is reused for the next ones.
    valid = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    np.testing.assert_array_equal(tensor_codec.decode_tensor(tensor_codec.encode_tensor(valid)), valid)
    with pytest.raises(tensor_codec.ChunkDecodeError, match=error):
        tensor_codec.decode_tensor(_proto(tf.float32.as_datatype_enum, shape, content))
    np.testing.assert_array_equal(tensor_codec.decode_tensor(tensor_codec.encode_tensor(valid + 1)), valid + 1)


def test_decode_with_a_known_header_gives_fresh_arrays_and_undoes_deltas_only_when_asked():
    rows = np.array([[1, 2], [4, 8], [9, 16]], np.int64)
    proto = tensor_codec.encode_tensor(rows, delta_encoded=True)  # stored as [[1, 2], [3, 6], [5, 8]]
    first = tensor_codec.decode_tensor(proto, delta_encoded=True)
    second = tensor_codec.decode_tensor(proto, delta_encoded=True)
    raw = tensor_codec.decode_tensor(proto)
    assert first.tolist() == second.tolist() == rows.tolist()
    assert raw.tolist() == [[1, 2], [3, 6], [5, 8]]
    assert first.dtype == raw.dtype == np.int64 and raw.shape == (3, 2)
    first[0, 0] = 100  # arrays never share memory
    assert second[0, 0] == 1 and raw[0, 0] == 1
    # Same shape, other dtype.
    other = tensor_codec.decode_tensor(tensor_codec.encode_tensor(np.zeros([3, 2], np.uint8)))
    assert other.dtype == np.uint8 and other.tolist() == [[0, 0]] * 3


def test_tensor_headers_are_cached_for_valid_numeric_tensors_only():
    shape = (3, 17, 5)  # a header no other test uses
    proto = tensor_codec.encode_tensor(np.arange(255, dtype=np.int16).reshape(shape))
    key = (proto.dtype, proto.tensor_shape.SerializeToString())
    tensor_codec._HEADERS.pop(key, None)
    assert tensor_codec.tensor_header(proto) == (np.dtype(np.int16), shape)
    assert tensor_codec._HEADERS[key] == (np.dtype(np.int16), shape, 255 * 2, True)  # bytes; delta-decodable
    assert tensor_codec.tensor_header(proto) == (np.dtype(np.int16), shape)  # now read from the cache
    np.testing.assert_array_equal(tensor_codec.decode_tensor(proto), np.arange(255).reshape(shape))
    for bad, header in [(_proto(tf.float32.as_datatype_enum, [3, -2], b""), (np.float32, (3, -2))),
                        (_proto(tf.float32.as_datatype_enum, [-3, -2], b""), (np.float32, (-3, -2))),
                        (_proto(tf.float32.as_datatype_enum, [2, 0], b""), (np.float32, (2, 0))),
                        (tensor_codec.encode_tensor(np.array([b"ab"], dtype=object)), (object, (1,)))]:
        assert tensor_codec.tensor_header(bad) == (np.dtype(header[0]), header[1])
        assert (bad.dtype, bad.tensor_shape.SerializeToString()) not in tensor_codec._HEADERS


def _chunk_proto(key=5, rows=3, tensors=None, delta=False):
    chunk = chunk_store.Chunk(key, tensors or [np.arange(rows * 2, dtype=np.int32).reshape(rows, 2)],
                              chunk_store.SequenceRange(9, 10, 10 + rows - 1), delta_encoded=delta)
    return chunk_codec.chunk_to_proto(chunk)


def test_chunk_round_trip_is_lazy_and_keeps_serialized_form():
    tensors = [np.arange(6, dtype=np.int64).reshape(3, 2), np.array([b"x", b"y", b"z"], dtype=object),
               np.ones((3, 4, 4), np.uint8)]
    proto = _chunk_proto(tensors=tensors, delta=True)
    assert proto.data_tensors_len == 3
    assert proto.data_uncompressed_size == 48 + 3 + 48
    assert proto.sequence_range.episode_id == 9 and (proto.sequence_range.start, proto.sequence_range.end) == (10, 12)
    serialized = proto.SerializeToString()
    chunk, headers = chunk_codec.chunk_from_proto(proto, serialized)
    assert headers == [(np.dtype(np.int64), (3, 2)), (np.dtype(object), (3,)), (np.dtype(np.uint8), (3, 4, 4))]
    assert chunk.nbytes() == 0  # nothing decoded yet
    assert chunk_codec.serialized_chunk(chunk) is serialized
    for got, want in zip(chunk.tensors, tensors):
        np.testing.assert_array_equal(got, want)


def test_open_chunk_is_re_encoded_when_it_grows():
    buffer = np.zeros((4, 2), np.float32)
    chunk = chunk_store.Chunk(1, [buffer], chunk_store.SequenceRange(0, 0, 0))
    first = chunk_codec.serialized_chunk(chunk)
    assert chunk_codec.serialized_chunk(chunk) is first
    buffer[1] = 7
    chunk.sequence_range = chunk_store.SequenceRange(0, 0, 1)
    second = schema_pb2.ChunkData.FromString(chunk_codec.serialized_chunk(chunk))
    np.testing.assert_array_equal(chunk_codec.decode_chunk_tensors(second)[0], [[0, 0], [7, 7]])


@pytest.mark.parametrize("mutate,error", [
    (lambda p: p.data.ClearField("tensors"), r"chunk 5 has no tensors"),
    (lambda p: setattr(p.sequence_range, "end", 9), r"empty sequence range \[10, 9\]"),
    (lambda p: setattr(p.sequence_range, "end", 13), r"tensor 0 has shape \[3, 2\] but the sequence range "
                                                      r"\[10, 13\] has 4 rows"),
    (lambda p: setattr(p.data.tensors[0], "dtype", tf.variant.as_datatype_enum), r"variant"),
    (lambda p: setattr(p.data.tensors[0], "dtype", 121), r"unknown tensor dtype enum 121"),
    (lambda p: setattr(p.data.tensors[0], "dtype", 101), r"enum 101: reference dtypes"),
    (lambda p: setattr(p.data.tensors[0].tensor_shape.dim[1], "size", -2),
     r"chunk 5: tensor 0 has a negative dimension: shape \[3, -2\]"),
    (lambda p: setattr(p.data.tensors[0].tensor_shape.dim[1], "size", 1 << 40),
     r"chunk 5: tensor 0 of dtype \w+ and shape \[3, 1099511627776\] needs \d+ bytes, its content announces"),
    (lambda p: setattr(p.data.tensors[0], "tensor_content", b"\xff" * 10), r"tensor 0 content is not valid Snappy"),
])
@pytest.mark.parametrize("given_serialized", [False, True])
def test_chunk_header_errors(mutate, error, given_serialized):
    chunk_codec.chunk_from_proto(_chunk_proto())  # the valid header is known: received bytes take the fast path
    proto = _chunk_proto()
    mutate(proto)
    with pytest.raises(tensor_codec.ChunkDecodeError, match=error):
        chunk_codec.chunk_from_proto(proto, proto.SerializeToString() if given_serialized else None)


def test_received_chunk_with_known_headers_is_checked_without_copying_contents(monkeypatch):
    tensors = [np.arange(6, dtype=np.int64).reshape(3, 2), np.ones((3, 4, 4), np.uint8)]
    proto = _chunk_proto(tensors=tensors)
    want = chunk_codec.chunk_from_proto(proto)[1]  # (records the headers)
    serialized = proto.SerializeToString()

    def no_copy(*args):
        raise AssertionError("tensor contents were read through protobuf")

    monkeypatch.setattr(chunk_codec, "_check_content_size", no_copy)
    chunk, headers = chunk_codec.chunk_from_proto(proto, serialized)
    assert headers == want == [(np.dtype(np.int64), (3, 2)), (np.dtype(np.uint8), (3, 4, 4))]
    assert chunk_codec.serialized_chunk(chunk) is serialized
    np.testing.assert_array_equal(chunk.tensors[1], tensors[1])
    # A chunk this walk leaves to protobuf (a string tensor) is checked there, as before.
    monkeypatch.undo()
    strings = _chunk_proto(tensors=[np.array([b"x", b"y", b"z"], dtype=object)])
    assert chunk_codec.chunk_from_proto(strings, strings.SerializeToString())[1] == [(np.dtype(object), (3,))]


def test_message_field_ranges_finds_each_repeated_element_in_order():
    chunks = [_chunk_proto(key=k, rows=r) for k, r in [(5, 3), (6, 1), (1 << 63, 2)]]
    request = reverb_service_pb2.InsertStreamRequest(chunks=chunks, keep_chunk_keys=[5, 6])
    request.items.add(key=3, table="t", priority=0.5)
    # Fields the walk must step over: a packed list, varints, fixed64/fixed32 and an unknown
    # length-delimited field (number 20: a two-byte tag), between the chunks.
    serialized = (request.SerializeToString() + b"\xa2\x01\x03abc" + b"\xa8\x01\x96\x01" + b"\xb1\x01" + b"\0" * 8 + b"\xb5\x01" + b"\0" * 4)
    extra = reverb_service_pb2.InsertStreamRequest(chunks=[_chunk_proto(key=7)]).SerializeToString()
    serialized += extra
    parsed = reverb_service_pb2.InsertStreamRequest.FromString(serialized)
    ranges = raw_fields.message_field_ranges(serialized, 0x0A)
    assert [serialized[a:b] for a, b in ranges] == [c.SerializeToString() for c in parsed.chunks]
    assert len(ranges) == 4
    [(a, b)] = raw_fields.message_field_ranges(serialized, 0x12)
    assert serialized[a:b] == parsed.items[0].SerializeToString()
    # What the walk cannot read is left to protobuf: a group, a truncated field, an endless varint.
    assert raw_fields.message_field_ranges(b"\x0b\x0c", 0x0A) is None
    assert raw_fields.message_field_ranges(serialized[:-1], 0x0A) is None
    assert raw_fields.message_field_ranges(b"\x08" + b"\xff" * 11, 0x0A) is None
    assert raw_fields.message_field_ranges(b"", 0x0A) == []


def test_deprecated_data_is_read():
    proto = _chunk_proto()
    proto.deprecated_data.extend(proto.data.tensors)
    proto.ClearField("data")
    np.testing.assert_array_equal(chunk_codec.decode_chunk_tensors(proto)[0], np.arange(6).reshape(3, 2))


def test_item_and_trajectory_round_trip():
    chunk = chunk_store.Chunk(11, [np.zeros((4, 2))], chunk_store.SequenceRange(1, 0, 3))
    trajectory = (chunk_store.Column((chunk_store.ChunkSlice(11, 1, 3, 0),), False),
                  chunk_store.Column((chunk_store.ChunkSlice(11, 3, 1, 0),), True))
    item = chunk_store.Item(2**64 - 1, 0.5, trajectory, [chunk], times_sampled=2, inserted_at=1_500_000_000_123)
    proto = protos.item_to_proto(item, "table")
    assert (proto.key, proto.table, proto.priority, proto.times_sampled) == (2**64 - 1, "table", 0.5, 2)
    assert (proto.inserted_at.seconds, proto.inserted_at.nanos) == (1500, 123)
    assert protos.trajectory_from_proto(proto.flat_trajectory) == item.trajectory


SpecTuple = collections.namedtuple("SpecTuple", ["a", "b"])


@pytest.mark.parametrize("sampler,remover,limiter,signature", [
    (selectors.Uniform(), selectors.Fifo(), rate_limiters.MinSize(3), None),
    (selectors.Prioritized(0.6), selectors.MinHeap(), rate_limiters.SampleToInsertRatio(2.0, 10, 5.0),
     {"obs": tf.TensorSpec([None, 84], tf.uint8, name="obs"), "x": SpecTuple(tf.TensorSpec([], tf.string),
                                                                              [tf.TensorSpec([2], tf.float64)])}),
    (selectors.Lifo(), selectors.MaxHeap(), rate_limiters.Queue(7), tf.TensorSpec([3], tf.int32)),
])
def test_table_info_round_trip(sampler, remover, limiter, signature):
    table = table_lib.Table("t", sampler, remover, 100, limiter, max_times_sampled=3, signature=signature)
    info = table_info.TableInfo.from_status(table.status)
    proto = table_info.table_info_to_proto(info)
    assert proto.name == "t" and proto.max_size == 100 and proto.max_times_sampled == 3
    assert proto.HasField("signature") == (signature is not None)
    back = table_info.table_info_from_proto(schema_pb2.TableInfo.FromString(proto.SerializeToString()))
    assert back == info


def test_key_distribution_options_proto_fields():
    cases = [(selectors.Uniform(), "uniform: true"), (selectors.Fifo(), "fifo: true\nis_deterministic: true"),
             (selectors.Lifo(), "lifo: true\nis_deterministic: true"),
             (selectors.Prioritized(0.8), "prioritized {\n  priority_exponent: 0.8\n}"),
             (selectors.MinHeap(), "heap {\n  min_heap: true\n}\nis_deterministic: true"),
             (selectors.MaxHeap(), "heap {\n}\nis_deterministic: true")]
    for selector, text in cases:
        proto = protos.key_distribution_options_to_proto(selector.options())
        assert str(proto).strip() == text
        assert selectors.from_options(protos.key_distribution_options_from_proto(proto)) == selector


# --- differential: dm-reverb 0.14 ---

_T = 8
_COLUMNS = {  # name -> (dtype, element shape)
    "f32": (np.float32, (3,)), "f64": (np.float64, ()), "f16": (np.float16, (2,)), "i8": (np.int8, (2, 3)),
    "i16": (np.int16, (2, 2)), "i32": (np.int32, (2, 2)), "i64": (np.int64, (2,)), "u8": (np.uint8, (4, 4)),
    "u16": (np.uint16, (3, 2)), "u32": (np.uint32, (2, 2)), "u64": (np.uint64, (2, 2)), "b": (np.bool_, (2,)),
    "c64": (np.complex64, (2,)),
}
_STRINGS = [f"step-{t}-{'x' * t}" for t in range(_T)]

_PEER_DIFFERENTIAL = r'''
import base64, threading
import numpy as np
import grpc
import reverb

names = INPUTS["names"]
T = len(INPUTS["strings"])
steps = [dict({n: INPUTS["col_" + n][t] for n in names}, s=INPUTS["strings"][t].encode()) for t in range(T)]

def fifo(name):
    return reverb.Table(name, reverb.selectors.Fifo(), reverb.selectors.Fifo(), 1000, reverb.rate_limiters.MinSize(1),
                        max_times_sampled=1)
server = reverb.Server([fifo("tw"), fifo("lw"), fifo("ours")])
address = f"localhost:{server.port}"
client = reverb.Client(address)

with client.trajectory_writer(num_keep_alive_refs=4) as writer:
    for t in range(T):
        writer.append(steps[t])
        if t >= 2:
            trajectory = {n: writer.history[n][-3:] for n in names + ["s"]}
            trajectory["last"] = writer.history["f32"][-1]
            writer.create_item("tw", 1.0, trajectory)
    writer.flush()
with client.writer(max_sequence_length=3, delta_encoded=True, chunk_length=3) as writer:
    for t in range(T):
        writer.append(steps[t])
        if t >= 2:
            writer.create_item("lw", 3, 1.0)

def varint(value):
    out = b""
    while True:
        bits, value = value & 0x7F, value >> 7
        if value:
            out += bytes([bits | 0x80])
        else:
            return out + bytes([bits])

def fields(buf):
    pos = 0
    while pos < len(buf):
        tag, shift = 0, 0
        while True:
            c = buf[pos]; pos += 1; tag |= (c & 0x7F) << shift; shift += 7
            if not c & 0x80: break
        value, shift = 0, 0
        if tag & 7 == 0:
            while True:
                c = buf[pos]; pos += 1; value |= (c & 0x7F) << shift; shift += 7
                if not c & 0x80: break
            yield tag >> 3, value
        elif tag & 7 == 2:
            while True:
                c = buf[pos]; pos += 1; value |= (c & 0x7F) << shift; shift += 7
                if not c & 0x80: break
            yield tag >> 3, buf[pos:pos + value]; pos += value
        else:
            raise ValueError(tag)

channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1),
                                                  ("grpc.max_send_message_length", -1)])

def raw_call(method, request, done):
    finished = threading.Event()
    def requests():
        yield request
        finished.wait(60)
    call = channel.stream_stream("/deepmind.reverb.ReverbService/" + method)(requests(), timeout=60)
    responses = []
    for response in call:
        responses.append(response)
        if done(responses):
            break
    finished.set()
    call.cancel()
    return responses

def raw_sample(table, n):
    request = (b"\x0a" + varint(len(table)) + table.encode() + b"\x10" + varint(n)
               + b"\x1a" + varint(len(b"\x08" + varint(30000))) + b"\x08" + varint(30000))
    def done(responses):
        ends = 0
        for response in responses:
            for number, entry in fields(response):
                ends += any(f == 3 and v for f, v in fields(entry))
        return ends >= n
    return raw_call("SampleStream", request, done)

for table in ("tw", "lw"):
    emit("raw/" + table, [base64.b64encode(r).decode() for r in raw_sample(table, T - 2)])

# Our encoding, inserted through a raw InsertStream, read back by Reverb's own client (which decodes).
num_items = INPUTS["num_items"]
def confirmed(responses):
    # keys (field 1) arrive packed (bytes of varints: one byte without the high bit ends each) or unpacked.
    return sum(sum(1 for c in v if not c & 0x80) if isinstance(v, bytes) else 1
               for r in responses for f, v in fields(r)) >= num_items
keys = raw_call("InsertStream", base64.b64decode(INPUTS["insert_request"]), confirmed)
for i in range(num_items):
    sample = next(client.sample("ours", num_samples=1, emit_timesteps=False))
    emit(f"ours/{i}/key", int(sample.info.key))
    for j, column in enumerate(sample.data):
        column = np.asarray(column)
        if column.dtype == object:
            emit(f"ours/{i}/{j}", {"shape": list(column.shape), "values": [v.decode() for v in column.ravel()]})
        else:
            emit(f"ours/{i}/{j}", column)
server.stop()
'''


def _step_columns():
    return {name: _random(dtype, (_T, *shape)) for name, (dtype, shape) in _COLUMNS.items()}


def _samples_from_raw(responses):
    """Reassembles samples from raw SampleStreamResponse bytes: [(info, {chunk_key: ChunkData})]."""
    samples, info, chunks = [], None, {}
    for raw in responses:
        for entry in reverb_service_pb2.SampleStreamResponse.FromString(base64.b64decode(raw)).entries:
            if entry.HasField("info"):
                info = entry.info
            for chunk in entry.data:
                chunks[chunk.chunk_key] = chunk
            if entry.end_of_sequence:
                samples.append((info, chunks))
                info, chunks = None, {}
    return samples


def _unpack(info, chunks):
    """Columns of a sampled item, decoded by our codec (through the core's Item unpacking)."""
    core_chunks = [chunk_codec.chunk_from_proto(proto)[0] for proto in chunks.values()]
    trajectory = protos.trajectory_from_proto(info.item.flat_trajectory)
    return chunk_store.Item(info.item.key, info.item.priority, trajectory, core_chunks).column_arrays()


def _our_insert_request(columns):
    """Two delta-encoded multi-tensor chunks of one episode and items whose columns straddle them."""
    names = sorted(columns)
    strings = np.array([s.encode() for s in _STRINGS], dtype=object)
    chunks = []
    for key, (start, stop) in ((1001, (0, 5)), (1002, (5, _T))):
        tensors = [columns[n][start:stop] for n in names] + [strings[start:stop]]
        chunks.append(chunk_store.Chunk(key, tensors, chunk_store.SequenceRange(77, start, stop - 1),
                                        delta_encoded=True))
    request = reverb_service_pb2.InsertStreamRequest()
    for chunk in chunks:
        request.chunks.append(chunk_codec.chunk_to_proto(chunk))
    expected = []
    for i, start in enumerate(range(0, _T - 2)):
        stop = start + 3
        trajectory = []
        for index in range(len(names) + 1):
            slices = []
            for key, (lo, hi) in ((1001, (0, 5)), (1002, (5, _T))):
                a, b = max(start, lo), min(stop, hi)
                if a < b:
                    slices.append(chunk_store.ChunkSlice(key, a - lo, b - a, index))
            trajectory.append(chunk_store.Column(tuple(slices), False))
        squeezed = chunk_store.ChunkSlice(1001 if start < 5 else 1002, start if start < 5 else start - 5, 1, 0)
        trajectory.append(chunk_store.Column((squeezed,), True))
        item = request.items.add(key=500 + i, table="ours", priority=1.0)
        protos.trajectory_to_proto(trajectory, item.flat_trajectory)
        expected.append([columns[n][start:stop] for n in names] + [strings[start:stop], columns[names[0]][start]])
    return request.SerializeToString(), expected


@pytest.mark.peer
def test_differential_with_reverb(peer):
    columns = _step_columns()
    insert_request, expected_ours = _our_insert_request(columns)
    inputs = {f"col_{name}": value for name, value in columns.items()}
    inputs.update(names=sorted(columns), strings=_STRINGS, num_items=len(expected_ours),
                  insert_request=base64.b64encode(insert_request).decode())
    out = peer.run(_PEER_DIFFERENTIAL, inputs, timeout_s=240)
    names = sorted(columns)
    strings = np.array([s.encode() for s in _STRINGS], dtype=object)

    # Reverb -> ours: trajectory_writer chunks (one column each, not delta-encoded).
    samples = _samples_from_raw(out["raw/tw"])
    assert len(samples) == _T - 2
    for i, (info, chunks) in enumerate(samples):
        # Flattened item structure: sorted keys of {names..., "last", "s"}.
        got = dict(zip(sorted(names + ["last", "s"]), _unpack(info, chunks)))
        for name in names:
            np.testing.assert_array_equal(got[name], columns[name][i:i + 3], err_msg=f"tw item {i} {name}")
            assert got[name].dtype == columns[name].dtype
        np.testing.assert_array_equal(got["last"], columns["f32"][i + 2])
        assert got["s"].tolist() == strings[i:i + 3].tolist()

    # Reverb -> ours: legacy writer chunks (all leaves in one chunk, delta-encoded, items across chunks).
    samples = _samples_from_raw(out["raw/lw"])
    assert len(samples) == _T - 2
    assert any(chunk.delta_encoded for _, chunks in samples for chunk in chunks.values())
    for i, (info, chunks) in enumerate(samples):
        assert len(chunks) == (1 if i % 3 == 0 else 2)  # chunk_length=3: windows not aligned span two chunks
        got = dict(zip(sorted(names + ["s"]), _unpack(info, chunks)))
        for name in names:
            np.testing.assert_array_equal(got[name], columns[name][i:i + 3], err_msg=f"lw item {i} {name}")
        assert got["s"].tolist() == strings[i:i + 3].tolist()

    # Ours -> Reverb: decoded by Reverb's client.
    for i, expected in enumerate(expected_ours):
        assert out[f"ours/{i}/key"] == 500 + i
        for j, want in enumerate(expected):
            got = out[f"ours/{i}/{j}"]
            if isinstance(got, dict):
                assert got["shape"] == list(want.shape)
                assert [v.encode() for v in got["values"]] == want.tolist()
            else:
                assert got.dtype == want.dtype, (i, j)
                np.testing.assert_array_equal(got, want, err_msg=f"ours item {i} column {j}")
