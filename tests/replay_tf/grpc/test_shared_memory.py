"""Shared-memory sample slots (`replay_tf.grpc.shared_memory`): rl-data-tf's extension by which a server on the
client's machine gathers stacked responses straight into the client's memory. Checked: samples through the
slots equal those sent inline (values that name their own step), nothing is left in /dev/shm, the server
refuses every segment it must not write into and then sends inline, a full ring makes the server wait,
and a client refuses slot messages it cannot trust, with precise errors.
"""
import os
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.sampling import stacking
from replay_tf.wire import stacked_samples
from replay_tf.transport import base as transport_lib
from replay_tf import errors
from replay_tf.core import chunk_store
from replay_tf.core import table as table_lib
from replay_tf.grpc.client import client_transport
from replay_tf.grpc import shared_memory
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import reverb_service_pb2

pytestmark = pytest.mark.skipif(not shared_memory.enabled(), reason="needs Linux with /dev/shm")

_FRAME = (32, 32)  # 4 KiB int32 steps, one per chunk


def _segments() -> set:
    return {name for name in os.listdir(shared_memory.DIRECTORY) if name.startswith("replay_tf-")}


@pytest.fixture
def taken(monkeypatch) -> list:
    """Records the size of every stacked response a client takes out of shared memory."""
    taken = []
    original = shared_memory.Ring.take

    def take(self, slot, size):
        content = original(self, slot, size)
        assert content[:2] == raw_fields.TAG_RESPONSE_STACKED
        taken.append(size)
        return content
    monkeypatch.setattr(shared_memory.Ring, "take", take)
    return taken


@pytest.fixture
def server(monkeypatch, taken):
    """A server filled over gRPC; step i holds i."""
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    signature = {"observation": tf.TensorSpec([3, *_FRAME], tf.int32), "last": tf.TensorSpec([], tf.int64)}
    server = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                                         reverb.rate_limiters.MinSize(1), signature=signature)])
    client = reverb.Client(f"localhost:{server.port}")
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for i in range(40):
            writer.append({"observation": np.full(_FRAME, i, np.int32), "last": np.int64(i)})
            if i >= 2:
                writer.create_item("t", 1.0, {"observation": writer.history["observation"][-3:],
                                              "last": writer.history["last"][-1]})
    yield server
    server.stop()


def _sample_batches(server, num_batches=6):
    dataset = reverb.TrajectoryDataset.from_table_signature(f"localhost:{server.port}", "t",
                                                            max_in_flight_samples_per_worker=24)
    batches = list(dataset.batch(16).take(num_batches))
    for batch in batches:
        last = batch.data["last"].numpy()
        assert batch.data["observation"].shape == (16, 3, *_FRAME)
        np.testing.assert_array_equal(batch.data["observation"].numpy(),
                                      np.broadcast_to((last[:, None] + np.arange(-2, 1))[:, :, None, None],
                                                      (16, 3, *_FRAME)))
        np.testing.assert_array_equal(batch.info.table_size.numpy(), 38)
    return batches


def test_loopback_samples_come_through_slots_and_leave_nothing_behind(server, taken):
    before = _segments()
    _sample_batches(server)
    assert len(taken) >= 4 and all(size > 16 * 3 * 4096 for size in taken)  # whole stacked responses
    assert _segments() == before  # the server unlinked the segment when it mapped it


def test_turned_off_or_too_small_slots_send_the_same_samples_inline(server, monkeypatch, taken):
    monkeypatch.setenv(shared_memory.ENV, "0")
    _sample_batches(server)
    monkeypatch.delenv(shared_memory.ENV)
    monkeypatch.setattr(shared_memory, "SLOT_BYTES", 4096)  # no response fits: every one comes inline
    before = _segments()
    _sample_batches(server)
    assert not taken and _segments() == before


def test_slots_are_the_inline_response_byte_for_byte():
    rng = np.random.default_rng(0)
    items, rows = [], []
    for key in (1, 2, 3):
        frames, actions = rng.integers(0, 99, (3, 4, 5)).astype(np.uint8), rng.random((3, 2)).astype(np.float32)
        chunk = chunk_store.Chunk(10 + key, [frames, actions], chunk_store.SequenceRange(1, 0, 2))
        trajectory = (chunk_store.Column((chunk_store.ChunkSlice(chunk.key, 0, 3, 0),)),
                      chunk_store.Column((chunk_store.ChunkSlice(chunk.key, 1, 1, 1),), squeeze=True))
        items.append(table_lib.SampledItem(chunk_store.Item(key, 0.5, trajectory, [chunk]), 0.5, key, 0.25, 7,
                                           key == 2))
        rows.append((frames, actions[1]))
    tensors_of = lambda chunk: chunk.tensors  # noqa: E731
    layouts = stacking.column_layouts(items[0].item, tensors_of, chunk_codec.pending_tensors)
    layout = stacked_samples.StackedLayout(items, layouts)
    columns = stacking.stack_items([s.item for s in items], layouts, tensors_of, chunk_codec.pending_tensors)
    inline = layout.join(columns)
    assert inline == stacked_samples.stacked_response(items, columns) and len(inline) == layout.size
    buffer = memoryview(bytearray(layout.size + 10))
    assert stacking.gather_into(layout, buffer, [s.item for s in items], tensors_of, chunk_codec.pending_tensors)
    assert bytes(buffer[:layout.size]) == inline
    read = stacked_samples.read_stacked_response(inline)
    np.testing.assert_array_equal(read.columns[0], [frames for frames, _ in rows])
    np.testing.assert_array_equal(read.columns[1], [action for _, action in rows])
    assert read.keys.tolist() == [1, 2, 3] and read.rate_limited.tolist() == [False, True, False]


def _offer(ring, **changes):
    offer = ring.offer()
    for name, value in changes.items():
        setattr(offer, name, value)
    return offer


@pytest.mark.parametrize("changes", [
    {"name": "../../etc/passwd"}, {"name": "replay_tf-" + "0" * 31}, {"name": "replay_tf-" + "G" * 32},
    {"name": "replay_tf-" + "0" * 32 + "/x"}, {"num_slots": 0}, {"num_slots": 65}, {"slot_bytes": 8},
    {"slot_bytes": (64 << 20) + 1}, {"num_slots": 3}, {"slot_bytes": 8192}])  # (the last two: not its size)
def test_server_refuses_offers_it_must_not_write_into(changes):
    ring = shared_memory.Ring.create(num_slots=2, slot_bytes=4096)
    try:
        assert shared_memory.Ring.attach(_offer(ring, **changes)) is None
        assert ring.name in _segments()  # (a refused offer leaves the client's segment alone)
    finally:
        ring.close()
    assert ring.name not in _segments()


def test_server_refuses_sparse_files_symlinks_and_missing_segments(tmp_path):
    ring = shared_memory.Ring.create(num_slots=2, slot_bytes=4096)
    size = shared_memory.HEADER_BYTES + 2 * 4096
    path = os.path.join(shared_memory.DIRECTORY, ring.name)
    try:
        os.unlink(path)
        with open(path, "wb") as f:  # right name and size, nothing allocated: writing could SIGBUS
            f.truncate(size)
        assert shared_memory.Ring.attach(ring.offer()) is None
        os.unlink(path)
        target = tmp_path / "target"
        target.write_bytes(bytes(size))
        os.symlink(target, path)
        assert shared_memory.Ring.attach(ring.offer()) is None
        os.unlink(path)
        assert shared_memory.Ring.attach(ring.offer()) is None  # (a client on another machine)
        assert target.read_bytes() == bytes(size)
    finally:
        if os.path.lexists(path):
            os.unlink(path)
        ring.close()


def test_a_full_ring_makes_the_server_wait_until_the_client_takes_a_slot():
    ring = shared_memory.Ring.create(num_slots=2, slot_bytes=4096)
    server_ring = shared_memory.Ring.attach(ring.offer())
    assert server_ring is not None and ring.name not in _segments()
    cancelled = threading.Event()
    messages = []
    for payload in (b"first", b"second"):
        slot, buffer = server_ring.acquire(cancelled.is_set)
        buffer[:len(payload)] = payload
        server_ring.publish(slot)
        messages.append(reverb_service_pb2.SharedSlot(slot=slot, size=len(payload)))
    assert sorted(m.slot for m in messages) == [0, 1]
    got = []
    waiter = threading.Thread(target=lambda: got.append(server_ring.acquire(cancelled.is_set)))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive()  # both slots hold responses the client has not read
    assert ring.take(messages[1].slot, messages[1].size) == b"second"
    waiter.join(5)
    assert got and got[0][0] == messages[1].slot  # the slot the client freed
    server_ring.publish(messages[1].slot)
    waiter = threading.Thread(target=lambda: got.append(server_ring.acquire(cancelled.is_set)))
    waiter.start()
    cancelled.set()  # the call ended: the server stops waiting
    waiter.join(5)
    assert not waiter.is_alive() and got[1] is None
    assert ring.take(messages[0].slot, messages[0].size) == b"first"
    del got
    server_ring.close()
    ring.close()


@pytest.mark.parametrize("slot, size, error", [
    (2, 10, r"slot 2 of 10 bytes named, expected a slot below 2 of 1 to 4096 bytes"),
    (0, 4097, r"slot 0 of 4097 bytes named, expected a slot below 2"), (0, 0, r"slot 0 of 0 bytes"),
    (1, 10, r"slot 1 named, which the writer did not mark as filled")])
def test_client_refuses_slots_it_cannot_trust(slot, size, error):
    ring = shared_memory.Ring.create(num_slots=2, slot_bytes=4096)
    try:
        with pytest.raises(errors.ReverbError, match=error):
            ring.take(slot, size)
    finally:
        ring.close()
    with pytest.raises(errors.ReverbError, match="after the stream closed"):
        ring.take(0, 10)


def test_a_slot_message_on_a_stream_that_offered_none_is_an_error():
    from replay_tf.grpc.client import sample_stream  # noqa: PLC0415
    stream = sample_stream.SampleStream.__new__(sample_stream.SampleStream)
    stream._stacked = True
    response = reverb_service_pb2.SampleStreamResponse(
        replay_tf_shared_slot=reverb_service_pb2.SharedSlot(slot=0, size=10))
    with pytest.raises(errors.ReverbError, match="shared-memory slot, which this stream did not offer"):
        stream._samples(response, [None], None)


def test_an_offer_the_server_cannot_open_gets_inline_responses(server):
    """What a client on another machine sees: its offer names nothing here, so responses come inline."""
    request = reverb_service_pb2.SampleStreamRequest(table="t", num_samples=5, replay_tf_stacked=True)
    request.rate_limiter_timeout.milliseconds = -1
    request.replay_tf_shared_memory.name = "replay_tf-" + "ab" * 16
    request.replay_tf_shared_memory.num_slots = 4
    request.replay_tf_shared_memory.slot_bytes = 1 << 20
    with grpc.insecure_channel(f"localhost:{server.port}") as channel:
        call = channel.stream_stream("/deepmind.reverb.ReverbService/SampleStream")(iter([request.SerializeToString()]))
        received = 0
        for raw in call:
            response = reverb_service_pb2.SampleStreamResponse.FromString(raw)
            assert not response.HasField("replay_tf_shared_slot") and response.HasField("replay_tf_stacked")
            received += len(response.replay_tf_stacked.keys)
            if received == 5:
                break
        call.cancel()
