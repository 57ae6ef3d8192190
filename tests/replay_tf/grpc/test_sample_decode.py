"""Remote samples keep one-row chunks encoded until `TrajectoryDataset` decodes them into its batch.

Big steps travel one per chunk (Reverb's writers and ours): such a chunk is always used whole, so the
sample stream keeps its Snappy content and the dataset decompresses it straight into the batch row.
Checked against values that name their own step, beside multi-row chunks decoded the usual way.
"""
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.grpc.client import client_transport
from replay_tf.transport import base as transport_lib
from replay_tf.wire import tensor_codec

_FRAME = (64, 64)  # 4 KiB per step: remote writers send one step per chunk (test_remote_chunking.py)


@pytest.fixture
def remote_server(monkeypatch):
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    signature = {"action": tf.TensorSpec([3, 2], tf.float32), "observation": tf.TensorSpec([3, *_FRAME], tf.int32)}
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1), signature=signature)])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for i in range(12):  # every value names its step
            writer.append({"action": np.array([i, -i], np.float32), "observation": np.full(_FRAME, i, np.int32)})
            if i >= 2:
                writer.create_item("t", 1.0, {"action": writer.history["action"][-3:],
                                              "observation": writer.history["observation"][-3:]})
    yield server, client
    server.stop()


def _count_decodes_into(monkeypatch) -> list:
    calls = []
    original = tensor_codec.PendingTensor.decode_into

    def counted(self, out):
        calls.append(out.shape)
        return original(self, out)
    monkeypatch.setattr(tensor_codec.PendingTensor, "decode_into", counted)
    return calls


def _assert_consecutive_steps(observation: np.ndarray, action: np.ndarray) -> None:
    for obs, act in zip(observation, action):
        first = int(obs[0, 0, 0])
        steps = np.arange(first, first + 3)
        np.testing.assert_array_equal(obs, np.broadcast_to(steps[:, None, None], (3, *_FRAME)))
        np.testing.assert_array_equal(act, np.stack([steps, -steps], axis=1).astype(np.float32))


def test_dataset_decodes_single_row_chunks_into_its_batches(remote_server, monkeypatch):
    server, _ = remote_server
    tensor_codec.decode_tensor(tensor_codec.encode_tensor(np.zeros((1, *_FRAME), np.int32)))  # the frames' header is known
    calls = _count_decodes_into(monkeypatch)
    dataset = reverb.TrajectoryDataset.from_table_signature(f"localhost:{server.port}", "t",
                                                            max_in_flight_samples_per_worker=16,
                                                            stacked_samples=False)  # (entries, as Reverb sends)
    batches = list(dataset.batch(8).take(6))
    for batch in batches:
        _assert_consecutive_steps(batch.data["observation"].numpy(), batch.data["action"].numpy())
    # Every frame row of every batch was decoded in place (batches made ahead of `take` add more).
    assert len(calls) >= 6 * 8 * 3 and set(calls) == {(1, *_FRAME)}


def test_client_sample_decodes_pending_chunks_on_access(remote_server):
    _, client = remote_server
    samples = list(client.sample("t", num_samples=20, emit_timesteps=False, unpack_as_table_signature=True))
    assert len(samples) == 20
    for sample in samples:
        _assert_consecutive_steps(sample.data["observation"][None], sample.data["action"][None])


@pytest.mark.parametrize("rows", [1, 3])
def test_pending_tensor_undoes_delta_encoding_into_a_view(rows):
    array = np.random.default_rng(0).integers(-1000, 1000, (rows, 5, 7), dtype=np.int64)
    tensor_codec.decode_tensor(tensor_codec.encode_tensor(array, delta_encoded=True), delta_encoded=True)  # learns the header
    pending = tensor_codec.pending_tensor(tensor_codec.encode_tensor(array, delta_encoded=True), delta_encoded=True)
    assert pending.delta and pending.shape == array.shape and pending.nbytes == array.nbytes
    batch = np.zeros((rows + 2, 5, 7), np.int64)
    pending.decode_into(batch[1:rows + 1])
    np.testing.assert_array_equal(batch[1:rows + 1], array)
    assert not batch[0].any() and not batch[-1].any()
    np.testing.assert_array_equal(pending.decode(), array)


def test_pending_tensor_with_corrupt_content_names_the_sizes():
    array = np.arange(24, dtype=np.float32).reshape(1, 4, 6)
    proto = tensor_codec.encode_tensor(array)
    tensor_codec.decode_tensor(proto)
    pending = tensor_codec.pending_tensor(proto)._replace(content=b"\x05\x10abcde")  # Snappy for 5 bytes
    with pytest.raises(tensor_codec.ChunkDecodeError, match=r"shape \[1, 4, 6\] needs 96 bytes, its content "
                                                     r"decompresses to 5"):
        pending.decode_into(np.empty((1, 4, 6), np.float32))
    with pytest.raises(tensor_codec.ChunkDecodeError, match="not valid Snappy"):
        pending._replace(content=b"\xff\xff\xff\xff\xff").decode()


def test_unseen_headers_are_decoded_the_usual_way():
    proto = tensor_codec.encode_tensor(np.zeros((1, 3, 11, 13), np.uint16))
    assert tensor_codec.pending_tensor(proto) is None  # decode_tensor checks a header before it is trusted
    tensor_codec.decode_tensor(proto)
    assert tensor_codec.pending_tensor(proto) is not None


@pytest.mark.parametrize("with_info, end_of_sequence", [(True, True), (True, False), (False, True)])
def test_sample_entry_parts_serialize_as_protobuf_does(with_info, end_of_sequence):
    from replay_tf.wire import raw_fields, reverb_service_pb2, schema_pb2  # noqa: PLC0415

    chunks = [schema_pb2.ChunkData(chunk_key=k, delta_encoded=bool(k % 2)) for k in (7, 300)]
    chunks[1].data.tensors.add().tensor_content = bytes(range(200))  # a length that takes a 2-byte varint
    info = schema_pb2.SampleInfo(probability=0.25, table_size=3)
    info.item.key = 11
    expected = reverb_service_pb2.SampleStreamResponse()
    entry = expected.entries.add(data=chunks, end_of_sequence=end_of_sequence)
    if with_info:
        entry.info.CopyFrom(info)
    fields = [raw_fields.chunk_field(c.SerializeToString()) for c in chunks]
    parts = raw_fields.entry_parts(info.SerializeToString() if with_info else None, fields, end_of_sequence)
    assert b"".join(parts) == expected.SerializeToString()
