"""A seeded fuzz of every `deepmind.reverb.ReverbService` RPC over loopback (raw channels, raw bytes).

More than 10,000 request messages: random bytes; bit flips, truncations and splices of valid requests;
valid protos with hostile values (unknown chunk keys, items on chunks not kept, dtypes and shapes that
contradict the signature, huge and negative offsets, lengths and dims, NaN/inf/negative priorities, unknown
tables, empty trajectories, absurd `num_samples`, garbage Snappy payloads, delta flags on floats and
strings); streams that carry many requests, valid ones first and then bad ones; requests over the server's
message limit; and clients that cancel mid-stream (holding chunks, or waiting to sample). Afterwards:
  - every reply was OK or a precise status: never UNKNOWN or INTERNAL (an unhandled exception);
  - a normal remote client inserts and samples correctly;
  - the chunk store holds exactly the chunks that live items refer to (nothing leaked by failed streams);
  - the process RSS is back near its level after a warm-up round (see `_RSS_TOLERANCE_BYTES`).
"""
import collections
import concurrent.futures
import ctypes
import gc
import random
import threading
import time

import grpc
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.transport import base as transport_lib
from replay_tf.core import chunk_store
from replay_tf.wire import raw_fields
from replay_tf.wire import chunk_codec
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2

_PREFIX = "/deepmind.reverb.ReverbService/"
_SEED = 8_2026
_MAX_MESSAGE_BYTES = 1 << 20
_NUM_ROUNDS = 760          # each round sends ~14 messages over every RPC: > 10,000 in all
_WARMUP_ROUNDS = 200       # fills the allocator's and gRPC's arenas before memory is measured
# Streams left open by the client until its deadline, or sampling forever: few and short.
_CALL_TIMEOUT_S = 10.0
#: RSS may grow this much between the end of the warm-up and the end of the fuzz (after gc and
#: malloc_trim, tables emptied). After the warm-up, RSS measured every 200 rounds moved within +-8 MiB with
#: no trend; the measured rounds send ~80 requests of ~1-2 MiB (over or just under the limit) and ~6,000
#: refused requests: keeping a tenth of that would exceed the tolerance.
_RSS_TOLERANCE_BYTES = 24 << 20
#: Python objects may differ this much in number (caches of sampled items are weak; nothing else grows).
_OBJECT_TOLERANCE = 2_000

_ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED,
            grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED}
_TABLES = ["t", "sig", "prio", "q", "empty"]
_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.int8, np.uint16, np.bool_, object]


@pytest.fixture(scope="module")
def server():
    server = reverb.Server([
        reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 200, reverb.rate_limiters.MinSize(1)),
        reverb.Table("sig", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 200, reverb.rate_limiters.MinSize(1),
                     signature={"x": tf.TensorSpec([None, 2], tf.float32)}),
        reverb.Table("prio", reverb.selectors.Prioritized(0.8), reverb.selectors.Fifo(), 200,
                     reverb.rate_limiters.MinSize(1)),
        reverb.Table.queue("q", 20),
        reverb.Table("empty", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                     reverb.rate_limiters.MinSize(10 ** 6)),
    ], max_message_bytes=_MAX_MESSAGE_BYTES)
    yield server
    server.stop()


# --- valid requests ---

def _array(rng: random.Random, rows: int, dtype) -> np.ndarray:
    shape = (rows,) + tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 2)))
    if dtype is object:
        return np.array([bytes(rng.randrange(256) for _ in range(rng.randint(0, 5)))
                         for _ in range(int(np.prod(shape)))], dtype=object).reshape(shape)
    return np.asarray(np.random.default_rng(rng.randrange(1 << 30)).integers(0, 100, shape)).astype(dtype)


def _chunk_proto(rng: random.Random, key: int, rows: int = 3, tensors=None) -> schema_pb2.ChunkData:
    tensors = tensors or [_array(rng, rows, rng.choice(_DTYPES)) for _ in range(rng.randint(1, 3))]
    chunk = chunk_store.Chunk(key, tensors, chunk_store.SequenceRange(rng.randrange(1 << 63), 0, rows - 1))
    return chunk_codec.chunk_to_proto(chunk, delta_encoded=rng.random() < 0.3)


def _add_item(request, key, table, slices, priority=1.0, squeeze=False, columns=1):
    item = request.items.add(key=key, table=table, priority=priority)
    for _ in range(columns):
        column = item.flat_trajectory.columns.add(squeeze=squeeze)
        for chunk_key, offset, length, index in slices:
            column.chunk_slices.add(chunk_key=chunk_key, offset=offset, length=length, index=index)
    return item


def _valid_insert(rng: random.Random) -> reverb_service_pb2.InsertStreamRequest:
    """A valid request: one chunk and 1-3 items on it, for a table without signature (or `sig`)."""
    key = rng.randrange(1, 1 << 64)
    request = reverb_service_pb2.InsertStreamRequest()
    if rng.random() < 0.3:
        request.chunks.append(_chunk_proto(rng, key, 3, [np.ones((3, 2), np.float32) * rng.random()]))
        table = "sig"
    else:
        request.chunks.append(_chunk_proto(rng, key, 3))
        table = rng.choice(["t", "prio", "q"])
    for _ in range(rng.randint(1, 3)):
        offset = rng.randrange(3)
        _add_item(request, rng.randrange(1 << 64), table, [(key, offset, rng.randint(1, 3 - offset), 0)],
                  priority=rng.random())
    return request


def _flexible_batch_size(value: int) -> bytes:
    """Field 4 of `SampleStreamRequest` (Reverb's `flexible_batch_size`, reserved in our proto), serialized."""
    return b"\x20" + raw_fields.varint(value)


def _valid_sample(rng: random.Random) -> bytes:
    request = reverb_service_pb2.SampleStreamRequest(table=rng.choice(["t", "prio", "sig"]),
                                                     num_samples=rng.randint(1, 4))
    request.rate_limiter_timeout.milliseconds = 50
    return request.SerializeToString() + _flexible_batch_size(rng.choice([-1, 1, 4]))


# --- hostile but well-formed requests ---

def _hostile_inserts(rng: random.Random) -> list:
    """A stream of InsertStream requests whose last one is hostile (valid protobuf, bad values)."""
    key = rng.randrange(1, 1 << 64)
    request = reverb_service_pb2.InsertStreamRequest()
    chunk = _chunk_proto(rng, key, 3, [np.arange(6, dtype=np.float32).reshape(3, 2)])
    request.chunks.append(chunk)
    kind = rng.randrange(22)
    table = rng.choice(_TABLES)
    prefix = []
    if kind == 0:    # unknown chunk key
        _add_item(request, 1, table, [(key + 1, 0, 1, 0)])
    elif kind == 1:  # an item on a chunk that the previous request did not keep
        first = reverb_service_pb2.InsertStreamRequest()
        first.CopyFrom(request)
        _add_item(first, rng.randrange(1 << 64), "t", [(key, 0, 1, 0)])
        prefix = [first]
        request = reverb_service_pb2.InsertStreamRequest()
        _add_item(request, 2, "t", [(key, 0, 1, 0)])
    elif kind == 2:  # dtype contradicting the signature
        request.chunks[0].CopyFrom(_chunk_proto(rng, key, 3, [np.zeros((3, 2), np.int32)]))
        _add_item(request, 3, "sig", [(key, 0, 2, 0)])
    elif kind == 3:  # shape contradicting the signature
        request.chunks[0].CopyFrom(_chunk_proto(rng, key, 3, [np.zeros((3, 5), np.float32)]))
        _add_item(request, 4, "sig", [(key, 0, 2, 0)])
    elif kind == 4:  # huge / negative offsets, lengths and tensor indices
        value = rng.choice([-(1 << 31), -1, 0, 3, 1 << 30, (1 << 31) - 1])
        field = rng.randrange(3)
        slices = [[key, 0, 1, 0]]
        slices[0][1 + field] = value
        _add_item(request, 5, table, [tuple(slices[0])])
    elif kind == 5:  # NaN, inf, negative priorities
        _add_item(request, 6, rng.choice(["prio", "t"]), [(key, 0, 1, 0)],
                  priority=rng.choice([float("nan"), float("inf"), -float("inf"), -1.0, 1e308, -0.0]))
    elif kind == 6:  # unknown tables
        _add_item(request, 7, rng.choice(["", "T", "nope", "t\x00", "x" * 1000]), [(key, 0, 1, 0)])
    elif kind == 7:  # empty trajectory, or a column without slices
        item = request.items.add(key=8, table=table, priority=1.0)
        if rng.random() < 0.5:
            item.flat_trajectory.columns.add()
    elif kind == 8:  # garbage Snappy content
        tensor = request.chunks[0].data.tensors[0]
        tensor.tensor_content = rng.choice([b"", b"\x00", b"\xff" * 10, tensor.tensor_content[:-3],
                                            bytes(rng.randrange(256) for _ in range(40))])
        _add_item(request, 9, rng.choice(["t", "sig"]), [(key, 0, 1, 0)])
    elif kind == 9:  # delta flag on floats and strings
        request.chunks[0].CopyFrom(_chunk_proto(rng, key, 3, [rng.choice([
            np.ones((3, 2), np.float32), np.array([[b"a"], [b"b"], [b"c"]], dtype=object)])]))
        request.chunks[0].delta_encoded = True
        _add_item(request, 10, "t", [(key, 0, 3, 0)])
    elif kind == 10:  # sequence ranges that contradict the tensors
        start, end = rng.choice([(5, 1), (0, (1 << 31) - 1), (-(1 << 31), (1 << 31) - 1), (0, 0), (3, 5)])
        request.chunks[0].sequence_range.start = start
        request.chunks[0].sequence_range.end = end
        _add_item(request, 11, "t", [(key, 0, 1, 0)])
    elif kind == 11:  # negative, zero and huge dims
        dims = request.chunks[0].data.tensors[0].tensor_shape.dim
        dims[rng.randrange(2)].size = rng.choice([-1, -3, 0, 1 << 40, (1 << 63) - 1, -(1 << 63)])
        if rng.random() < 0.5:
            dims.add().size = rng.choice([-2, 1 << 33])
        _add_item(request, 12, rng.choice(["t", "sig"]), [(key, 0, 1, 0)])
    elif kind == 12:  # unsupported dtype enums
        request.chunks[0].data.tensors[0].dtype = rng.choice([0, -1, 20, 21, 101, 121, 999, (1 << 31) - 1])
        _add_item(request, 13, "t", [(key, 0, 1, 0)])
    elif kind == 13:  # a chunk without tensors
        del request.chunks[0].data.tensors[:]
        _add_item(request, 14, "t", [(key, 0, 1, 0)])
    elif kind == 14:  # squeezed columns that are not one row
        _add_item(request, 15, "t", [(key, 0, rng.choice([0, 2, 3]), 0)], squeeze=True)
    elif kind == 15:  # keep_chunk_keys naming chunks never sent
        _add_item(request, 16, "t", [(key, 0, 1, 0)])
        request.keep_chunk_keys.extend([key, key + 7])
    elif kind == 16:  # the same chunk key twice with different content, then an item on the second shape
        other = _chunk_proto(rng, key, 3, [np.zeros((3, 7), np.int64)])
        request.chunks.append(other)
        _add_item(request, 17, "sig", [(key, 0, 1, 0)])
    elif kind == 17:  # string tensors whose content is not a valid string list
        request.chunks[0].CopyFrom(_chunk_proto(rng, key, 3, [np.array([b"a", b"bb", b"c"], dtype=object)]))
        request.chunks[0].data.tensors[0].tensor_content = rng.choice([b"\xff\xff\xff", b"\x05ab", b""])
        _add_item(request, 18, "t", [(key, 0, 3, 0)])
    elif kind == 18:  # columns that join different dtypes, and many columns
        request.chunks.append(_chunk_proto(rng, key + 1, 3, [np.zeros((3, 2), np.int8)]))
        _add_item(request, 19, "t", [(key, 0, 1, 0), (key + 1, 0, 1, 0)], columns=rng.choice([1, 300]))
    elif kind == 19:  # no chunk and no item, or only an unknown field
        request = reverb_service_pb2.InsertStreamRequest()
    elif kind == 20:  # many valid requests, then one bad request in the same stream
        prefix = [_valid_insert(rng) for _ in range(rng.randint(2, 6))]
        _add_item(request, 20, "t", [(key + 99, 0, 1, 0)])
    else:            # more columns than the signature
        request.chunks[0].CopyFrom(_chunk_proto(rng, key, 3, [np.zeros((3, 2), np.float32)] * 2))
        _add_item(request, 21, "sig", [(key, 0, 1, 0), (key, 0, 1, 1)][:1], columns=2)
    return [r.SerializeToString() for r in prefix + [request]]


def _hostile_sample(rng: random.Random) -> list:
    requests = [_valid_sample(rng) for _ in range(rng.randint(0, 2))]
    request = reverb_service_pb2.SampleStreamRequest(
        table=rng.choice(_TABLES + ["", "nope"]),
        num_samples=rng.choice([0, -1, -(1 << 63), 1, 3, 1 << 62]))
    timeout = rng.choice([-1, 0, 1, 20, (1 << 63) - 1])
    if request.num_samples > 3 or timeout <= 0 or timeout > 1000:
        # Would sample (or wait) until the client's deadline: only on tables that stop it at once.
        request.table = rng.choice(["empty", "nope", "q"])
        timeout = 20
    request.rate_limiter_timeout.milliseconds = timeout
    return requests + [request.SerializeToString() + _flexible_batch_size(rng.choice([0, -5, (1 << 31) - 1]))]


def _hostile_mutate(rng: random.Random) -> bytes:
    request = reverb_service_pb2.MutatePrioritiesRequest(table=rng.choice(_TABLES + ["nope"]))
    for _ in range(rng.randint(0, 4)):
        request.updates.add(key=rng.randrange(1 << 64),
                            priority=rng.choice([float("nan"), float("inf"), -1.0, 0.0, 5.0, 1e300]))
    request.delete_keys.extend(rng.randrange(1 << 64) for _ in range(rng.randint(0, 3)))
    return request.SerializeToString()


# --- corruption of valid bytes ---

def _corrupt(rng: random.Random, blob: bytes, other: bytes) -> bytes:
    kind = rng.randrange(6)
    if kind == 0 or not blob:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    if kind == 1:
        return blob[:rng.randrange(len(blob))]
    if kind == 2:
        data = bytearray(blob)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data)
    if kind == 3:
        return blob[:rng.randrange(len(blob) + 1)] + other[rng.randrange(len(other) + 1):]
    if kind == 4:
        position = rng.randrange(len(blob) + 1)
        return blob[:position] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + blob[position:]
    return blob + blob[:rng.randrange(len(blob) + 1)]


# --- the fuzz ---

class _Fuzzer:
    def __init__(self, channel: grpc.Channel, seed: int):
        self._channel = channel
        self._seed = seed
        self.statuses = collections.Counter()
        self.bad = []
        self.num_messages = 0

    def _call(self, method: str, requests, *, stream: bool, timeout: float = _CALL_TIMEOUT_S) -> None:
        try:
            if stream:
                call = self._channel.stream_stream(_PREFIX + method, request_serializer=lambda b: b,
                                                   response_deserializer=lambda b: b)
                list(call(iter(requests), timeout=timeout))
            else:
                self._channel.unary_unary(_PREFIX + method, request_serializer=lambda b: b,
                                          response_deserializer=lambda b: b)(requests[0], timeout=timeout)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
        self.statuses[(method, code)] += 1
        if code not in _ALLOWED or (code == grpc.StatusCode.INVALID_ARGUMENT and not details):
            self.bad.append((method, code, details, [r[:200] for r in requests]))

    def _cancelled(self, method: str, request: bytes) -> None:
        """A stream whose client sends `request`, then cancels while the server still reads or waits."""
        release = threading.Event()

        def requests():
            yield request
            release.wait(_CALL_TIMEOUT_S)

        call = self._channel.stream_stream(_PREFIX + method, request_serializer=lambda b: b,
                                           response_deserializer=lambda b: b)(requests(), timeout=_CALL_TIMEOUT_S)
        time.sleep(0.01)
        call.cancel()
        release.set()
        code = call.code()
        self.statuses[(method, code)] += 1
        if code not in _ALLOWED:
            self.bad.append((method, code, call.details(), [request[:200]]))

    def round(self, index: int) -> int:
        """One round: a message (or stream) for every RPC; returns the number of request messages."""
        rng = random.Random(self._seed * 1_000_003 + index)
        valid_insert = _valid_insert(rng).SerializeToString()
        valid_sample = _valid_sample(rng)
        sent = 0

        def call(method, requests, **kwargs):
            nonlocal sent
            sent += len(requests)
            self._call(method, requests, **kwargs)

        # InsertStream: hostile values, corrupted bytes, valid requests.
        call("InsertStream", _hostile_inserts(rng), stream=True)
        call("InsertStream", [valid_insert] * rng.randint(0, 2) + [_corrupt(rng, valid_insert, valid_sample)],
             stream=True)
        if index % 10 == 0:  # a burst of corrupted requests in one stream
            call("InsertStream", [_corrupt(rng, valid_insert, valid_insert) for _ in range(20)], stream=True)
        if index % 7 == 0:   # over the server's message limit (RESOURCE_EXHAUSTED), or just under it
            size = _MAX_MESSAGE_BYTES + rng.choice([-4096, 1, 1 << 20])
            big = _chunk_proto(rng, 1, 1, [np.zeros((1, size // 4), np.float32)])
            big.data.tensors[0].tensor_content = bytes(size - 200)
            call("InsertStream", [reverb_service_pb2.InsertStreamRequest(chunks=[big]).SerializeToString()],
                 stream=True)
        if index % 20 == 0:  # clients that go away mid-stream: chunks held, a sampler waiting
            held = reverb_service_pb2.InsertStreamRequest(chunks=[_chunk_proto(rng, rng.randrange(1, 1 << 64))])
            waiting = reverb_service_pb2.SampleStreamRequest(table="empty", num_samples=1)
            for method, request in (("InsertStream", held), ("SampleStream", waiting)):
                sent += 1
                self._cancelled(method, request.SerializeToString())
        # SampleStream.
        call("SampleStream", _hostile_sample(rng), stream=True)
        call("SampleStream", [_corrupt(rng, valid_sample, valid_insert)], stream=True)
        # Unary methods and InitializeConnection.
        call("MutatePriorities", [rng.choice([_hostile_mutate(rng),
                                              _corrupt(rng, _hostile_mutate(rng), valid_sample)])], stream=False)
        reset = reverb_service_pb2.ResetRequest(table=rng.choice(_TABLES + ["nope", ""])).SerializeToString()
        call("Reset", [rng.choice([reset, _corrupt(rng, reset, valid_insert)])], stream=False)
        info = reverb_service_pb2.ServerInfoRequest().SerializeToString()
        call("ServerInfo", [rng.choice([info, _corrupt(rng, info, valid_sample)])], stream=False)
        call("Checkpoint", [_corrupt(rng, b"", valid_insert)], stream=False)
        init = reverb_service_pb2.InitializeConnectionRequest(pid=rng.randrange(1 << 31),
                                                              table_name=rng.choice(_TABLES)).SerializeToString()
        call("InitializeConnection", [rng.choice([init, _corrupt(rng, init, valid_sample)])
                                      for _ in range(rng.randint(1, 3))], stream=True)
        return sent

    def run(self, rounds: range, workers: int = 4) -> int:
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            sent = sum(pool.map(self.round, rounds))
        self.num_messages += sent
        return sent


def _rss_bytes() -> int:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed heap pages back, so RSS measures live memory
    except (OSError, AttributeError):
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _live_chunk_keys(server) -> set:
    return {key for table in server.tables.values() for item in table.items_snapshot() for key in item.chunks}


@pytest.mark.slow  # >10,000 hostile messages
def test_fuzz_every_rpc_then_the_server_is_intact(server, monkeypatch):
    address = f"localhost:{server.port}"
    with grpc.insecure_channel(address) as channel:
        fuzzer = _Fuzzer(channel, _SEED)
        fuzzer.run(range(_WARMUP_ROUNDS))
        for name in _TABLES:
            server.tables[name].reset()
        rss_before = _rss_bytes()
        objects_before = len(gc.get_objects())
        fuzzer.run(range(_WARMUP_ROUNDS, _NUM_ROUNDS))

    assert fuzzer.num_messages >= 10_000
    assert not fuzzer.bad, fuzzer.bad[:5]
    codes = collections.Counter()
    for (method, code), count in fuzzer.statuses.items():
        codes[code] += count
    # The mix reached every kind of check, and every RPC saw both answers and refusals.
    for code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                 grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        assert codes[code] > 0, (code, codes)
    for method in ("InsertStream", "SampleStream", "MutatePriorities", "Reset", "ServerInfo", "Checkpoint",
                   "InitializeConnection"):
        refused = sum(n for (m, code), n in fuzzer.statuses.items() if m == method and code != grpc.StatusCode.OK)
        assert refused > 0, method

    # No chunk outlives the items that refer to it.
    gc.collect()
    assert len(server.chunk_store) == len(_live_chunk_keys(server))
    # Memory back near its level after the warm-up, with the tables emptied again.
    for name in _TABLES:
        server.tables[name].reset()
    rss_after = _rss_bytes()
    assert rss_after - rss_before < _RSS_TOLERANCE_BYTES, (rss_before, rss_after)
    assert abs(len(gc.get_objects()) - objects_before) < _OBJECT_TOLERANCE
    assert len(server.chunk_store) == 0

    # A normal remote client inserts and samples correctly.
    from replay_tf.grpc.client import client_transport  # noqa: PLC0415
    monkeypatch.setattr(transport_lib, "make_transport", client_transport.Transport)
    client = reverb.Client(address)
    assert sorted(client.server_info()) == sorted(_TABLES)
    client.insert(np.array([1.5, 2.5], np.float32), priorities={"q": 1.0, "sig": 1.0})
    with client.trajectory_writer(3) as writer:
        for step in range(3):
            writer.append({"x": np.array([step, step + 0.5], np.float32)})
        writer.create_item("q", 1.0, {"x": writer.history["x"][-2:]})
        writer.create_item("sig", 1.0, {"x": writer.history["x"][:]})
    first, second = client.sample("q", 2, emit_timesteps=False)
    np.testing.assert_array_equal(first.data[0], [[1.5, 2.5]])
    np.testing.assert_array_equal(second.data[0], [[1.0, 1.5], [2.0, 2.5]])
    info = client.server_info()
    assert (info["q"].current_size, info["sig"].current_size) == (0, 2)
    sample = next(client.sample("sig", 1, emit_timesteps=False, unpack_as_table_signature=True))
    assert sample.data["x"].tolist() in ([[1.5, 2.5]], [[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]])
