"""The writer's hand-assembled InsertStream bytes (`wire.raw_fields`, `chunk_codec.serialized_chunk`) equal what the generated
protobuf classes serialize for the same chunks and items, field for field and byte for byte."""
import numpy as np
import pytest

from replay_tf.core import chunk_store as cs
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import protos
from replay_tf.wire import reverb_service_pb2


def _chunks(key, tensors, sequence_range, delta):
    return [cs.Chunk(key, list(tensors), sequence_range, delta_encoded=delta) for _ in range(2)]


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64, np.bool_,
                                   np.complex64])
@pytest.mark.parametrize("shape", [(1,), (3,), (3, 2), (3, 10, 10), (2, 0, 5)])
@pytest.mark.parametrize("delta", [False, True])
def test_numeric_chunks_serialize_as_protobuf_does(dtype, shape, delta):
    rng = np.random.default_rng(sum(shape))
    array = (rng.random(shape) * 200).astype(dtype)
    second = array[..., :1] if array.ndim > 1 else array
    for key, sequence_range in [(1, cs.SequenceRange(0, 0, shape[0] - 1)),
                                (2**64 - 1, cs.SequenceRange(2**63 + 5, 7, 6 + shape[0], True))]:
        fast, reference = _chunks(key, [array, second], sequence_range, delta)
        expected = chunk_codec.chunk_to_proto(reference).SerializeToString()
        # The insert stream's form: parts that join to the same bytes, nothing cached (a chunk is sent once).
        assert b"".join(chunk_codec.serialized_chunk_parts(fast)) == expected
        assert fast.encoded is None
        assert chunk_codec.serialized_chunk(fast) == expected
        assert fast.encoded == (sequence_range.end, expected)  # cached for the next send
        assert chunk_codec.serialized_chunk_parts(fast) == [expected]  # a cached form is used as it is
        np.testing.assert_array_equal(chunk_codec._decode_serialized(expected)[0], array)


def test_fields_cached_across_chunks_do_not_leak_between_them():
    # The episode id's field is cached for consecutive chunks and a tensor head's dtype and shape fields per
    # (dtype, shape): chunks alternating episodes, with contents of one shape compressing to different sizes
    # (zeros, noise), serialize exactly, whether the sender passes the chunk key's field or not.
    rng = np.random.default_rng(7)
    for i in range(8):
        episode = [0, 2**63 + 1, 12345][i % 3]
        array = np.zeros((2, 8, 8), np.uint8) if i % 2 else rng.integers(0, 256, (2, 8, 8), dtype=np.uint8)
        key = [0, 1000 + i][i % 2] if i < 4 else 2**64 - i
        fast, reference = _chunks(key, [array], cs.SequenceRange(episode, i, i + 1), False)
        expected = chunk_codec.chunk_to_proto(reference).SerializeToString()
        key_field = raw_fields.key_field(key) if i % 3 else None
        assert b"".join(chunk_codec.serialized_chunk_parts(fast, key_field)) == expected, i


@pytest.mark.parametrize("strings", [np.array([b"t0", b""], dtype=object), np.array([b"ab", b"c"])])
def test_string_chunks_take_the_general_path(strings):
    fast, reference = _chunks(3, [np.zeros((2, 2), np.float32), strings], cs.SequenceRange(1, 0, 1), False)
    expected = chunk_codec.chunk_to_proto(reference).SerializeToString()
    assert chunk_codec.serialized_chunk_parts(fast) == [expected]
    assert chunk_codec.serialized_chunk(fast) == expected


def test_request_items_and_keep_keys_serialize_as_protobuf_does():
    c1 = cs.Chunk(5, [np.zeros((3, 2), np.float32)], cs.SequenceRange(1, 0, 2))
    c2 = cs.Chunk(2**64 - 1, [np.zeros((4, 2), np.float32), np.zeros((4,), np.int32)], cs.SequenceRange(1, 3, 6))
    trajectories = [
        ((cs.Column((cs.ChunkSlice(5, 1, 2, 0), cs.ChunkSlice(2**64 - 1, 0, 3, 1)), False),
          cs.Column((cs.ChunkSlice(5, 0, 1, 0),), True)), [c1, c2]),
        ((cs.Column((cs.ChunkSlice(5, 0, 3, 0),), False),), [c1]),
    ]
    for trajectory, chunks in trajectories:
        for priority in [0.0, -0.0, 1.5, float("inf")]:
            for key, inserted_at in [(0, 0), (77, 1), (78, 10**18 + 7)]:
                for table in ["", "t", "täble" * 40]:
                    item = cs.Item(key, priority, trajectory, chunks, inserted_at=inserted_at)
                    request = reverb_service_pb2.InsertStreamRequest()
                    proto = request.items.add(key=key, table=table, priority=priority)
                    if inserted_at:
                        proto.inserted_at.seconds, proto.inserted_at.nanos = divmod(inserted_at, 10**9)
                    protos.trajectory_to_proto(item.trajectory, proto.flat_trajectory)
                    request.keep_chunk_keys.extend([5, 2**64 - 1, 0])
                    got = (raw_fields.request_item(key, raw_fields.table_field(table) if table else b"", item.priority,
                                             inserted_at, raw_fields.flat_trajectory(item.trajectory))
                           + raw_fields.keep_chunk_keys([5, 2**64 - 1, 0]))
                    assert got == request.SerializeToString(), (trajectory, priority, key, table)
    assert raw_fields.keep_chunk_keys([]) == b""
    assert raw_fields.request_chunk_head(3) + b"xyz" == b"\x0a\x03xyz"


@pytest.mark.parametrize("keys, cached", [
    ([5, 2**64 - 1, 0, 300], [5, 2**64 - 1, 0, 300]),  # every key's ChunkSlice field cached (key 0: empty)
    ([5, 2**64 - 1, 0, 300], [300]),                    # some cached
    ([5, 2**64 - 1, 0, 300], []),                       # none (the cache was cleared)
])
def test_keep_chunk_keys_from_cached_key_fields(keys, cached):
    key_fields: dict = {}
    columns = ((False, *(v for k in cached for v in (cs.Chunk(k, [np.zeros((1,), np.int8)], cs.SequenceRange(1, 0, 0)),
                                                    0, 0, 1))),) if cached else ()
    raw_fields.resolved_trajectory(columns, key_fields)
    assert sorted(key_fields) == sorted(cached)
    expected = reverb_service_pb2.InsertStreamRequest(keep_chunk_keys=keys).SerializeToString()
    assert raw_fields.keep_chunk_keys(keys, key_fields) == expected


def test_resolved_trajectories_serialize_as_the_flat_trajectory():
    c0 = cs.Chunk(0, [np.zeros((2, 2), np.float32)], cs.SequenceRange(1, 0, 1))
    c1 = cs.Chunk(5, [np.zeros((300, 2), np.float32)], cs.SequenceRange(1, 0, 299))
    c2 = cs.Chunk(2**64 - 1, [np.zeros((4, 2), np.float32), np.zeros((4,), np.int32)], cs.SequenceRange(1, 300, 303))
    trajectories = [
        ((cs.Column((cs.ChunkSlice(5, 1, 2, 0), cs.ChunkSlice(2**64 - 1, 0, 3, 1)), False),
          cs.Column((cs.ChunkSlice(5, 0, 1, 0),), True)), [c1, c2]),
        ((cs.Column((cs.ChunkSlice(5, 0, 300, 0),), False), cs.Column((cs.ChunkSlice(5, 299, 1, 0),), True)), [c1]),
        ((cs.Column((cs.ChunkSlice(0, 0, 2, 0), cs.ChunkSlice(5, 200, 100, 0)), False),
          cs.Column((cs.ChunkSlice(2**64 - 1, 3, 1, 1),), False)), [c0, c1, c2]),
        # A column of 40 slices: its serialized body is longer than 127 bytes (a 2-byte length).
        ((cs.Column(tuple(cs.ChunkSlice(5, 7 * i, 1 + i % 3, 0) for i in range(40)), False),), [c1]),
    ]
    key_fields = {}  # shared across items, as the writer's encoder shares it
    for trajectory, chunks in trajectories * 2:
        item = cs.Item(7, 1.0, trajectory, chunks)
        proto = reverb_service_pb2.InsertStreamRequest().items.add()
        protos.trajectory_to_proto(item.trajectory, proto.flat_trajectory)
        expected = proto.flat_trajectory.SerializeToString()
        assert raw_fields.resolved_trajectory(item.resolved_columns, key_fields) == expected, trajectory
        assert raw_fields.flat_trajectory(item.trajectory) == expected
    assert set(key_fields) == {0, 5, 2**64 - 1}
