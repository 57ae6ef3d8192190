"""What one client can make a replay server, or a sampling client, hold in memory (`replay_tf.wire.limits`).

`max_message_bytes` bounds one message, not what it turns into. Each limit is tested twice: its rule on hand-built
bytes in this process, and the memory it saves in a server process (`_memory_server.py`), whose RSS (live memory
after a garbage collection and `malloc_trim`) or peak RSS (`VmHWM`) is read around a hostile request. Sizes are
chosen so that the memory without the limit is several times the tolerance.
"""
import json
import os
import subprocess
import sys
import threading
import tracemalloc

import grpc
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf import errors
from replay_tf.grpc.client import sample_stream
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import tensor_codec
from replay_tf.wire import limits
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

from proc_testlib import ROOT, remote_client

_SERVER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_memory_server.py")
_PREFIX = "/deepmind.reverb.ReverbService/"
_TOKEN = "memory-bounds-token"
_MIB = 1 << 20
#: How far a server's live memory may stay above its level before a refused request: freed blocks of a few MiB
#: may keep heap pages for small objects (see docs/reliability.md, "Known limits").
_NOISE = 24 * _MIB
#: The same for a stream refused while its client still sends: besides the 8 MiB of held chunks, the
#: requests gRPC had already received for the ended call stay until it frees them (up to ~30 MiB seen).
_HELD_NOISE = 48 * _MIB


# --- building requests as bytes ---

def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + raw_fields.varint(len(payload)) + payload


def _chunk(key: int, array: np.ndarray) -> bytes:
    """A serialized `ChunkData` of one tensor (rows on dim 0), episode 1, steps from 0."""
    proto = schema_pb2.ChunkData(chunk_key=key)
    proto.sequence_range.episode_id, proto.sequence_range.end = 1, array.shape[0] - 1
    proto.data.tensors.append(tensor_codec.encode_tensor(array))
    return proto.SerializeToString()


def _item(key: int, table: str, slices: list) -> bytes:
    """A serialized `PrioritizedItem` of one column made of `slices` ((chunk key, offset, length) each)."""
    one = {s: schema_pb2.FlatTrajectory.ChunkSlice(chunk_key=s[0], offset=s[1], length=s[2]).SerializeToString()
           for s in set(slices)}
    column = b"".join([_field(0x0A, one[s]) for s in slices])
    head = schema_pb2.PrioritizedItem(key=key, table=table, priority=1.0).SerializeToString()
    return head + _field(0x42, _field(0x0A, column))


def _request(chunks=(), items=(), keep=()) -> bytes:
    request = b"".join([_field(0x0A, c) for c in chunks] + [_field(0x12, i) for i in items])
    if keep:
        request += reverb_service_pb2.InsertStreamRequest(keep_chunk_keys=list(keep)).SerializeToString()
    return request


# --- rules, in this process ---

@pytest.mark.parametrize("num_chunks, slices_per_item, num_items, error", [
    (8, 1, 1, None),
    (9, 1, 1, r"carries 9 or more chunks, over replay_tf.wire.limits.MAX_CHUNKS_PER_REQUEST \(8\)"),
    (1, 16, 1, None),
    (1, 17, 1, r"carries 17 or more chunk slices .*, over replay_tf.wire.limits.MAX_SLICES_PER_REQUEST \(16\)"),
    (1, 8, 2, None),
    (1, 6, 3, r"carries 18 or more chunk slices .*MAX_SLICES_PER_REQUEST \(16\)"),  # over every item
])
def test_insert_request_counts(monkeypatch, num_chunks, slices_per_item, num_items, error):
    monkeypatch.setattr(limits, "MAX_CHUNKS_PER_REQUEST", 8)
    monkeypatch.setattr(limits, "MAX_SLICES_PER_REQUEST", 16)
    tiny = _chunk(1, np.zeros([1], np.int32))
    chunks = [_chunk(k + 1, np.zeros([1], np.int32)) for k in range(num_chunks)]
    items = [_item(100 + i, "t", [(1, 0, 1)] * slices_per_item) for i in range(num_items)]
    raw = _request(chunks, items)
    parsed = reverb_service_pb2.InsertStreamRequest.FromString(raw)  # (the bytes are a valid request)
    assert len(parsed.chunks) == num_chunks and sum(len(i.flat_trajectory.columns[0].chunk_slices)
                                                    for i in parsed.items) == slices_per_item * num_items
    assert len(tiny) < 32
    if error is None:
        limits.check_insert_request(raw)
    else:
        with pytest.raises(limits.LimitExceededError, match=error):
            limits.check_insert_request(raw)


def test_insert_request_counts_leave_malformed_bytes_to_the_parser():
    for raw in (b"\x0a\xff", b"\x12\x05\x42", b"\x0f\x00", b"\xff" * 11, b"\x80", b"\x08\x80", b"\x80\x80\x01"):
        limits.check_insert_request(raw)  # no error here: parsing refuses them with INVALID_ARGUMENT


def test_insert_request_counts_end_and_agree_with_protobuf_on_mangled_requests(monkeypatch):
    # Truncations, bit flips and random bytes: the walk always ends, and where protobuf parses the bytes, the
    # chunks counted are protobuf's (refused at exactly one more than the limit).
    rng = np.random.default_rng(7)
    valid = _request([_chunk(k, np.arange(3, dtype=np.int32)[None]) for k in (1, 2, 3)],
                     [_item(9, "t", [(1, 0, 1), (2, 0, 1)])], keep=[1, 2])
    for case in range(3000):
        raw = bytearray(valid[:rng.integers(0, len(valid) + 1)])
        for _ in range(rng.integers(0, 4)):
            if raw:
                raw[rng.integers(len(raw))] ^= 1 << int(rng.integers(8))
        if case % 5 == 0:
            raw = bytearray(rng.integers(0, 256, rng.integers(0, 40), np.uint8).tobytes())
        raw = bytes(raw)
        try:
            parsed = len(reverb_service_pb2.InsertStreamRequest.FromString(raw).chunks)
        except Exception:  # noqa: BLE001  (protobuf's DecodeError: the walk only has to end)
            parsed = None
        monkeypatch.setattr(limits, "MAX_SLICES_PER_REQUEST", 1 << 20)
        monkeypatch.setattr(limits, "MAX_CHUNKS_PER_REQUEST", 1 << 20)
        limits.check_insert_request(raw)
        if parsed:
            monkeypatch.setattr(limits, "MAX_CHUNKS_PER_REQUEST", parsed - 1)
            with pytest.raises(limits.LimitExceededError):
                limits.check_insert_request(raw)


def test_held_chunks_counts_what_a_stream_keeps(monkeypatch):
    monkeypatch.setattr(limits, "MAX_HELD_CHUNK_BYTES_PER_STREAM", 10_000)
    monkeypatch.setattr(limits, "HELD_CHUNK_OVERHEAD_BYTES", 1000)
    held = limits.HeldChunks()
    held.add(1, 4000)
    held.add(2, 4000)
    held.add(2, 4000)  # the same chunk again: counted once
    assert held.nbytes == 10_000
    held.check()
    held.add(3, 1)
    with pytest.raises(limits.LimitExceededError,
                       match=r"holds 11001 bytes in 3 chunks .*\.MAX_HELD_CHUNK_BYTES_PER_STREAM \(10000\)"):
        held.check()
    held.drop(1)
    held.drop(7)  # (never held)
    assert held.nbytes == 6001
    held.check()


_ATARI = {"obs": tf.TensorSpec([None, 84, 84, 4], tf.uint8), "action": tf.TensorSpec([], tf.int32),
          "reward": tf.TensorSpec([None], tf.float32)}


@pytest.mark.parametrize("dtype, shape, allowed", [
    (np.uint8, (300, 84, 84, 4), True),     # steps of a column of several steps
    (np.uint8, (1, 84, 84, 4), True),
    (np.int32, (5,), True),                 # a squeezed column of scalars
    (np.float32, (7,), True),
    (np.float32, (7, 1), True),             # steps of [1] fit the squeezed column "reward" ([None])
    (np.float32, (7, 2, 2), False),
    (np.uint8, (1, 1 << 26), False),        # declares 64 MiB of steps no column has
    (np.float32, (1, 84, 84, 4), False),    # a column's shape with another dtype
    (np.int64, (3,), False),
])
def test_step_check_against_signatures(dtype, shape, allowed):
    check = limits.StepCheck.for_signatures([_ATARI, {"x": tf.TensorSpec([2, 3], tf.float32)}])
    if allowed:
        check(9, 0, np.dtype(dtype), shape)
    else:
        with pytest.raises(ValueError, match=rf"chunk 9: tensor 0 holds steps of dtype {np.dtype(dtype).name} "
                                             rf"and shape \[.*\], which fit no column of the tables' signatures"):
            check(9, 0, np.dtype(dtype), shape)


def test_step_check_needs_every_table_signed():
    assert limits.StepCheck.for_signatures([_ATARI, None]) is None
    assert limits.StepCheck.for_signatures([]) is None
    unknown_rank = limits.StepCheck.for_signatures([{"x": tf.TensorSpec(None, tf.float32)}])
    unknown_rank(1, 0, np.dtype(np.float32), (2, 5, 5))


def _zeros_tensor(shape, dtype=np.uint8):
    return tensor_codec.encode_tensor(np.zeros(shape, dtype))


@pytest.mark.parametrize("rows", [1, 2])
def test_client_refuses_a_sampled_chunk_over_the_limit_before_allocating(monkeypatch, rows):
    # The path of every chunk a sample stream receives; a one-row chunk first looks for a known header.
    monkeypatch.setattr(limits, "MAX_CHUNK_TENSOR_BYTES", _MIB)
    step = 4 * _MIB + 2 * rows + 3  # (a shape whose header no other test has made known)
    proto = schema_pb2.ChunkData(chunk_key=5)
    proto.sequence_range.episode_id, proto.sequence_range.end = 1, rows - 1
    proto.data.tensors.append(_zeros_tensor([rows, step]))
    tracemalloc.start()
    try:
        with pytest.raises(tensor_codec.ChunkTooLargeError,
                           match=rf"chunk tensor of dtype uint8 and shape \[{rows}, {step}\] decompresses to "
                                 rf"{rows * step} bytes, over replay_tf.wire.limits.MAX_CHUNK_TENSOR_BYTES "
                                 rf"\({_MIB}\)"):
            sample_stream.SampleStream._chunk(proto, sample_stream._ChunkCache())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < _MIB, f"decoding a refused chunk allocated {peak} bytes"


def test_client_refuses_a_known_header_over_the_limit(monkeypatch):
    # A header seen (and cached) while it was within the limit is checked again when the limit is lower.
    proto = _zeros_tensor([1, 3 * _MIB + 11])
    assert tensor_codec.decode_tensor(proto).shape == (1, 3 * _MIB + 11)
    monkeypatch.setattr(limits, "MAX_CHUNK_TENSOR_BYTES", _MIB)
    assert tensor_codec.pending_tensor(proto) is None
    with pytest.raises(tensor_codec.ChunkTooLargeError, match=r"MAX_CHUNK_TENSOR_BYTES \(1048576\)"):
        tensor_codec.decode_tensor(proto)


def test_sampling_client_reports_a_chunk_over_the_limit(monkeypatch):
    table = reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10, reverb.rate_limiters.MinSize(1))
    server = reverb.Server([table])
    try:
        client = remote_client(f"localhost:{server.port}")
        data = np.arange(2 * _MIB + 7, dtype=np.uint8)
        client.insert([data], {"t": 1.0})
        monkeypatch.setattr(limits, "MAX_CHUNK_TENSOR_BYTES", _MIB)  # the client's limit: lower than the data
        with pytest.raises(errors.ReverbError, match=r"MAX_CHUNK_TENSOR_BYTES \(1048576\)"):
            next(client.sample("t"))
        monkeypatch.setattr(limits, "MAX_CHUNK_TENSOR_BYTES", 4 * _MIB)
        [step] = next(client.sample("t"))
        np.testing.assert_array_equal(step.data[0], data)
    finally:
        server.stop()


def test_default_limits_leave_room_for_atari():
    # 1,000 steps of 84x84x4 uint8 frames in one chunk; an item of 1,000 steps over 50 columns, a chunk a step.
    assert 1000 * 84 * 84 * 4 * 4 < limits.MAX_CHUNK_TENSOR_BYTES
    assert 1000 * 50 * 4 < limits.MAX_SLICES_PER_REQUEST
    assert 256 * 50 * 4 < limits.MAX_CHUNKS_PER_REQUEST  # 256 items a request, 50 new one-step chunks each, x4
    assert 4 * 40 * _MIB < limits.MAX_HELD_CHUNK_BYTES_PER_STREAM + 1  # dm-reverb's 40 MiB requests ahead of an item


# --- memory, in a server process ---

class _ServerProcess:
    """`_memory_server.py` with `config`; `rss()` is `(live kB, peak kB)`."""

    def __init__(self, config: dict):
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
        self._popen = subprocess.Popen([sys.executable, _SERVER_SCRIPT, json.dumps(config)], env=env, cwd=ROOT,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                       text=True)
        line = self._popen.stdout.readline().split()
        assert line[:1] == ["READY"], f"the server process did not start: {line}"
        self.address = f"localhost:{line[1]}"
        metadata = (("authorization", f"Bearer {config['auth_token']}"),) if config.get("auth_token") else None
        self.channel = grpc.insecure_channel(self.address, options=[("grpc.max_send_message_length", -1),
                                                                    ("grpc.max_receive_message_length", -1)])
        self.metadata = metadata

    def _ask(self, word: str) -> list:
        self._popen.stdin.write(word + "\n")
        self._popen.stdin.flush()
        return self._popen.stdout.readline().split()

    def reset_peak(self) -> None:
        assert self._ask("RESET") == ["RESET"]

    def rss(self) -> tuple:
        answer = self._ask("RSS")
        return int(answer[1]) * 1024, int(answer[2]) * 1024

    def insert_stream(self, requests, metadata=None):
        method = self.channel.stream_stream(_PREFIX + "InsertStream")
        return method(iter(requests), metadata=self.metadata if metadata is None else metadata, timeout=60)

    def close(self) -> None:
        self.channel.close()
        try:
            self._ask("STOP")
            self._popen.wait(30)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self._popen.kill()
            self._popen.wait()
        for stream in (self._popen.stdin, self._popen.stdout):
            try:
                stream.close()
            except OSError:
                pass


@pytest.fixture(scope="module")
def plain_server():
    """A table without signature; held chunks limited to 8 MiB a stream, chunk tensors to 32 MiB."""
    server = _ServerProcess({"limits": {"MAX_HELD_CHUNK_BYTES_PER_STREAM": 8 * _MIB,
                                        "MAX_CHUNK_TENSOR_BYTES": 32 * _MIB}})
    yield server
    server.close()


@pytest.fixture(scope="module")
def signed_server():
    """The table 'signed' (uint8 [84, 84, 4] steps), default limits, a token, 64 MiB messages."""
    server = _ServerProcess({"signature": True, "auth_token": _TOKEN, "max_message_bytes": 64 * _MIB})
    yield server
    server.close()


class _Ended:
    """The status of a call that ended without error (its `code()` is OK)."""

    @staticmethod
    def code():
        return grpc.StatusCode.OK

    @staticmethod
    def details():
        return "the call ended without error"


def _insert_measured(server, raw: bytes) -> tuple:
    """`(status of one InsertStream of request raw, RSS before, RSS after, peak RSS during)` of `server`."""
    server.reset_peak()
    before, _ = server.rss()
    error = _status(server.insert_stream([raw]))
    after, peak = server.rss()
    return error, before, after, peak


def _status(call):
    """The error that ended `call` (a `grpc.RpcError`), or `_Ended` if it ended without one."""
    try:
        list(call)
    except grpc.RpcError as e:
        return e
    return _Ended


def _warm(server: _ServerProcess, table: str, shape) -> None:
    """One valid insert, so that the first real one's imports and caches are not measured."""
    key = 1 + int.from_bytes(os.urandom(6), "little")
    keys = [reverb_service_pb2.InsertStreamResponse.FromString(r).keys for r in server.insert_stream(
        [_request([_chunk(key, np.ones([1, *shape], np.uint8))], [_item(key + 1, table, [(key, 0, 1)])])])]
    assert [list(k) for k in keys] == [[key + 1]]


@pytest.mark.slow
def test_many_tiny_chunks_in_one_request_are_refused_before_parsing(plain_server):
    _warm(plain_server, "plain", [4])
    chunks = [_chunk(1000 + k, np.zeros([1], np.int8)) for k in range(limits.MAX_CHUNKS_PER_REQUEST + 30_000)]
    raw = _request(chunks)  # ~3 MiB: each chunk would cost ~1 KiB of objects held for the stream
    error, before, after, peak = _insert_measured(plain_server, raw)
    assert peak - before < 24 * _MIB, (before, after, peak)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert f"MAX_CHUNKS_PER_REQUEST ({limits.MAX_CHUNKS_PER_REQUEST})" in error.details()


@pytest.mark.slow
def test_an_item_with_too_many_slices_is_refused_before_parsing(plain_server):
    _warm(plain_server, "plain", [4])
    slices = [(77, 0, 1)] * (limits.MAX_SLICES_PER_REQUEST + 200_000)
    raw = _request([_chunk(77, np.zeros([1, 4], np.uint8))], [_item(78, "plain", slices)])  # ~9 MiB
    error, before, after, peak = _insert_measured(plain_server, raw)
    # (the item would hold ~40 bytes a slice; the message itself passes through gRPC's buffers)
    assert after - before < _NOISE and peak - before < 48 * _MIB, (before, after, peak)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert f"MAX_SLICES_PER_REQUEST ({limits.MAX_SLICES_PER_REQUEST})" in error.details()


def _settled_rss(server, target: int, stop: threading.Event, seconds: float = 4.0) -> int:
    """The least live memory `server` shows in `seconds`, read every 0.25 s until it falls below `target`."""
    least = server.rss()[0]
    for _ in range(int(seconds / 0.25)):
        if least < target or stop.wait(0.25):
            break
        least = min(least, server.rss()[0])
    return least


@pytest.mark.slow
def test_chunks_held_for_later_items_are_bounded_per_stream(plain_server):
    _warm(plain_server, "plain", [4])
    rng = np.random.default_rng(0)
    first = 5000 + int.from_bytes(os.urandom(4), "little")
    # Incompressible 2 MiB chunks sent ahead of any item, then one item that keeps them all: 192 MiB held
    # without the limit, four times `_HELD_NOISE`.
    chunks = [_chunk(first + k, rng.integers(0, 256, [1, 2 * _MIB], np.uint8)) for k in range(96)]
    requests = [_request([c]) for c in chunks]
    requests.append(_request([], [_item(first - 1, "plain", [(first, 0, 1)])], keep=range(first, first + 96)))
    release = threading.Event()

    def send():
        yield from requests
        release.wait(30)  # the stream stays open while its memory is measured

    plain_server.reset_peak()
    before, _ = plain_server.rss()
    call = plain_server.insert_stream(send())
    try:
        try:
            response = next(call)
        except grpc.RpcError as e:
            response = e
        # (the least of readings over up to 4 s: gRPC frees the buffers of an ended call in its own time, while
        # without the limit the open stream would hold all its chunks for as long as it stays open)
        after = _settled_rss(plain_server, before + _HELD_NOISE, release)
    finally:
        release.set()
        call.cancel()
    assert after - before < _HELD_NOISE, (before, after)
    assert isinstance(response, grpc.RpcError), f"the stream was not refused: {response}"
    assert response.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, response.details()
    assert "MAX_HELD_CHUNK_BYTES_PER_STREAM (8388608)" in response.details()


@pytest.mark.slow
def test_a_chunk_over_the_tensor_limit_is_refused_before_decompressing(plain_server):
    _warm(plain_server, "plain", [4])
    raw = _request([_chunk(31, np.zeros([1, 96 * _MIB], np.uint8))])  # ~4.5 MiB of Snappy declaring 96 MiB
    error, before, _, peak = _insert_measured(plain_server, raw)
    assert peak - before < 32 * _MIB, (before, peak)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert (f"chunk 31: tensor 0 of dtype uint8 and shape [1, {96 * _MIB}] decompresses to {96 * _MIB} bytes, "
            f"over replay_tf.wire.limits.MAX_CHUNK_TENSOR_BYTES ({32 * _MIB})") in error.details()


@pytest.mark.slow
def test_a_chunk_no_signature_allows_is_refused_before_decompressing(signed_server):
    _warm(signed_server, "signed", [84, 84, 4])
    raw = _request([_chunk(41, np.zeros([1, 64 * _MIB], np.uint8))])  # within the default tensor limit
    error, before, _, peak = _insert_measured(signed_server, raw)
    assert peak - before < 32 * _MIB, (before, peak)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert (f"chunk 41: tensor 0 holds steps of dtype uint8 and shape [{64 * _MIB}], which fit no column of the "
            f"tables' signatures") in error.details()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ServerInfo", "MutatePriorities", "InsertStream"])
def test_a_call_without_token_is_refused_before_its_body_is_read(signed_server, method):
    body = os.urandom(48 * _MIB)
    signed_server.reset_peak()
    before, _ = signed_server.rss()
    with pytest.raises(grpc.RpcError) as raised:
        if method == "InsertStream":
            list(signed_server.channel.stream_stream(_PREFIX + method)(iter([body]), timeout=60))
        else:
            signed_server.channel.unary_unary(_PREFIX + method)(body, timeout=60)
    _, peak = signed_server.rss()
    assert peak - before < 16 * _MIB, (before, peak)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED, raised.value.details()
    assert "requires an auth token" in raised.value.details()


@pytest.mark.slow
@pytest.mark.parametrize("max_chunk_length", [1, 300])
def test_large_atari_items_are_accepted(signed_server, max_chunk_length):
    # 300 steps of 84x84x4 frames (8.5 MB) in one item, one chunk a step or one chunk for all of them.
    client = reverb.Client(signed_server.address, auth_token=_TOKEN)
    client.reset("signed")  # (the other tests' warm-up items)
    rng = np.random.default_rng(max_chunk_length)
    frames = rng.integers(0, 256, [300, 84, 84, 4], np.uint8)
    with client.trajectory_writer(num_keep_alive_refs=300) as writer:
        writer.configure(("obs",), num_keep_alive_refs=300, max_chunk_length=max_chunk_length)
        for frame in frames:
            writer.append({"obs": frame})
        writer.create_item("signed", 1.0, {"obs": writer.history["obs"][:]})
        writer.flush()
    sample = next(client.sample("signed", emit_timesteps=False))
    np.testing.assert_array_equal(sample.data[0], frames)
    client.reset("signed")


def test_checking_chunk_contents_in_many_threads_keeps_a_few_buffers_not_one_per_thread():
    # A server runs one thread per open stream; each checks the chunks it receives.
    from replay_tf.core import chunk_store
    values = np.arange(256 * 1024, dtype=np.float32)  # 1 MiB of content, the most a kept buffer holds
    chunk = chunk_store.Chunk(7, [values], chunk_store.SequenceRange(1, 0, len(values) - 1))
    serialized = chunk_codec.chunk_to_proto(chunk).SerializeToString()
    num_threads = 48
    checked, done = threading.Barrier(num_threads + 1), threading.Barrier(num_threads + 1)
    errors_seen = []

    def check():
        try:
            chunk_codec.chunk_from_proto(schema_pb2.ChunkData.FromString(serialized), serialized, check_content=True)
        except Exception as e:  # noqa: BLE001
            errors_seen.append(e)
        checked.wait()
        done.wait()  # the thread stays alive, as a stream's thread does

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        threads = [threading.Thread(target=check) for _ in range(num_threads)]
        for thread in threads:
            thread.start()
        checked.wait()
        held = tracemalloc.get_traced_memory()[0] - before
        done.wait()
        for thread in threads:
            thread.join()
    finally:
        tracemalloc.stop()
    assert not errors_seen, errors_seen
    assert held < 16 << 20, held  # a buffer per thread would hold ~48 MiB


@pytest.mark.slow
def test_keep_chunk_keys_are_bounded_before_parsing(plain_server):
    _warm(plain_server, "plain", [4])
    keys = list(range(1 << 60, (1 << 60) + 1_500_000))  # 9 bytes each on the wire: ~13 MiB
    raw = _request([_chunk(51, np.zeros([1, 4], np.uint8))], [_item(52, "plain", [(51, 0, 1)])], keep=keys)
    error, before, _, peak = _insert_measured(plain_server, raw)
    # The request's bytes in gRPC's buffers and in Python; nothing is parsed. (As Python ints in a set, the
    # keys would cost ~100 bytes each, their listing in an error ~20 more.)
    assert peak - before < 3 * len(raw) + _NOISE, (len(raw), before, peak)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert (f"names {len(keys)} or more chunks in keep_chunk_keys, over "
            f"replay_tf.wire.limits.MAX_KEPT_CHUNKS_PER_REQUEST ({limits.MAX_KEPT_CHUNKS_PER_REQUEST})"
            ) in error.details()
    assert len(error.details()) < 1000


def _empty_strings_chunk(key: int, count: int) -> bytes:
    """A serialized `ChunkData` of one row of `count` empty strings: one byte each on the wire."""
    proto = schema_pb2.ChunkData(chunk_key=key)
    proto.sequence_range.episode_id = 1
    tensor = proto.data.tensors.add(dtype=tf.string.as_datatype_enum, tensor_content=bytes(count))
    tensor.tensor_shape.dim.add(size=1)
    tensor.tensor_shape.dim.add(size=count)
    return proto.SerializeToString()


@pytest.mark.slow
def test_a_string_tensor_counts_its_elements_before_decoding(plain_server):
    _warm(plain_server, "plain", [4])
    count = 16 * _MIB
    chunk = _empty_strings_chunk(61, count)  # its size bounds the bytes of its strings
    raw = _request([chunk], [_item(62, "plain", [(61, 0, 1)])])  # ~16 MiB
    error, before, _, peak = _insert_measured(plain_server, raw)
    # The request's bytes in gRPC's buffers and in Python, the parsed message and the chunk's bytes: ~5 copies.
    # (Decoded as Python lists, each empty string, one byte of the request, would cost 16 bytes at least.)
    assert peak - before < 6 * len(raw) + _NOISE, (len(raw), before, peak)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert (f"chunk 61: tensor 0 of dtype string and shape [1, {count}] decodes to about {count * 64 + len(chunk)} "
            f"bytes ({count} strings, each counted as replay_tf.wire.limits.STRING_ELEMENT_BYTES (64) plus its "
            f"bytes), over replay_tf.wire.limits.MAX_CHUNK_TENSOR_BYTES ({32 * _MIB})") in error.details()
