"""Every field a client sends with an item meets one set of rules (`replay_tf.core.item_records`), on every path
into a table: an InsertStream refuses what a checkpoint's restore would refuse, so one item can never make a
checkpoint unloadable. Requests are crafted as raw InsertStream messages over a loopback channel."""
import json
import math
import signal
import tracemalloc

import grpc
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.transport import inprocess
from replay_tf import checkpointing
from replay_tf import errors
from replay_tf.core import chunk_store
from replay_tf.core import item_records
from replay_tf.wire import chunk_codec
from replay_tf.wire import limits
from replay_tf.wire import reverb_service_pb2
from replay_tf.wire import schema_pb2
from replay_tf.wire import tensor_codec

import proc_testlib

_PREFIX = "/deepmind.reverb.ReverbService/"
_ROW = np.arange(6, dtype=np.float32).reshape(3, 2)  # a chunk of 3 rows of float32 [2]: 8 bytes a row


def _tables(signature=None):
    return [reverb.Table("u", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100, reverb.rate_limiters.MinSize(1),
                         signature=signature),
            reverb.Table("p", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 100,
                         reverb.rate_limiters.MinSize(1))]


def _chunk_proto(key: int, array: np.ndarray = _ROW) -> schema_pb2.ChunkData:
    chunk = chunk_store.Chunk(key, [array], chunk_store.SequenceRange(1, 0, len(array) - 1))
    return chunk_codec.chunk_to_proto(chunk)


def _item_proto(key: int, table: str, chunk_key: int, slices=((0, 3),)) -> schema_pb2.PrioritizedItem:
    """An item of one column made of `slices` ((offset, length) each) of tensor 0 of chunk `chunk_key`."""
    item = schema_pb2.PrioritizedItem(key=key, table=table, priority=1.0)
    column = item.flat_trajectory.columns.add()
    for offset, length in slices:
        column.chunk_slices.add(chunk_key=chunk_key, offset=offset, length=length)
    return item


def _request(chunks=(), items=(), keep=()) -> bytes:
    return reverb_service_pb2.InsertStreamRequest(chunks=list(chunks), items=list(items),
                                                  keep_chunk_keys=list(keep)).SerializeToString()


def _insert(channel, requests, timeout=30) -> list:
    """The confirmed keys of one InsertStream call of raw `requests`."""
    call = channel.stream_stream(_PREFIX + "InsertStream", request_serializer=lambda b: b,
                                 response_deserializer=reverb_service_pb2.InsertStreamResponse.FromString)
    return [key for response in call(iter(requests), timeout=timeout) for key in response.keys]


def _refusal(channel, requests) -> tuple:
    with pytest.raises(grpc.RpcError) as info:
        _insert(channel, requests)
    return info.value.code(), info.value.details()


# --- one rule for insert and restore, field by field ---

def _set(field, value):
    return lambda item: setattr(item, field, value)


def _set_slice(field, value):
    return lambda item: setattr(item.flat_trajectory.columns[0].chunk_slices[0], field, value)


def _squeeze(item):
    item.flat_trajectory.columns[0].squeeze = True


def _no_columns(item):
    item.ClearField("flat_trajectory")


def _empty_column(item):
    item.flat_trajectory.columns.add()


def _repeat_row(times):
    def change(item):
        column = item.flat_trajectory.columns[0]
        column.ClearField("chunk_slices")
        for _ in range(times):
            column.chunk_slices.add(chunk_key=_CHUNK_KEY, offset=1, length=1)
    return change


_CHUNK_KEY = 7

FIELD_RULES = [
    # (table, change of the item, status on insert, error regex shared by the insert and the restore)
    ("u", _set("times_sampled", -1), grpc.StatusCode.INVALID_ARGUMENT, r"times_sampled \(-1\) of item 11 must be >= 0"),
    ("u", _set("priority", math.nan), grpc.StatusCode.INVALID_ARGUMENT, r"priority of item 11 .* is NaN"),
    ("p", _set("priority", -1.0), grpc.StatusCode.INVALID_ARGUMENT, r"priority \(-1.0\) of item 11 must be >= 0"),
    ("p", _set("priority", math.inf), grpc.StatusCode.INVALID_ARGUMENT, r"priority \(inf\) of item 11 must be finite"),
    ("u", _set_slice("offset", 2), grpc.StatusCode.INVALID_ARGUMENT,
     r"item 11: slice \(7, 2, 3, 0\) of column 0 is out of chunk 7's rows \[0, 3\)"),
    ("u", _set_slice("offset", -1), grpc.StatusCode.INVALID_ARGUMENT, r"slice \(7, -1, 3, 0\) .* out of chunk"),
    ("u", _set_slice("length", 0), grpc.StatusCode.INVALID_ARGUMENT, r"slice \(7, 0, 0, 0\) .* out of chunk"),
    ("u", _set_slice("index", 3), grpc.StatusCode.INVALID_ARGUMENT,
     r"item 11: column 0 refers to tensor 3 of chunk 7, which has 1 tensors"),
    ("u", _squeeze, grpc.StatusCode.INVALID_ARGUMENT,
     r"item 11: column 0 is squeezed, so it must be exactly one slice"),
    ("u", _no_columns, grpc.StatusCode.INVALID_ARGUMENT, r"item 11 for table 'u': the trajectory must not be empty"),
    ("u", _empty_column, grpc.StatusCode.INVALID_ARGUMENT, r"item 11: column 1 has no chunk slices"),
    # 40 copies of one 8-byte row: 320 bytes, over the test's MAX_ITEM_BYTES of 256
    ("u", _repeat_row(40), grpc.StatusCode.RESOURCE_EXHAUSTED,
     r"item 11 for table 'u' decodes to 320 bytes .* over replay_tf.wire.limits.MAX_ITEM_BYTES \(256\)"),
]


@pytest.fixture
def small_items(monkeypatch):
    monkeypatch.setattr(limits, "MAX_ITEM_BYTES", 256, raising=False)


@pytest.mark.parametrize("table, change, code, error", FIELD_RULES)
def test_insert_and_restore_refuse_the_same_fields(tmp_path, small_items, table, change, code, error):
    checkpointer = checkpointing.DirectoryCheckpointer(str(tmp_path))
    server = reverb.Server(_tables(), checkpointer=checkpointer)
    try:
        with grpc.insecure_channel(f"localhost:{server.port}") as channel:
            bad = _item_proto(11, table, _CHUNK_KEY)
            change(bad)
            got_code, details = _refusal(channel, [_request([_chunk_proto(_CHUNK_KEY)], [bad])])
            assert (got_code, server.tables[table].get_item(11)) == (code, None), details
            assert __import__("re").search(error, details), details
            # The same record in a checkpoint: a good item is saved, then its record is replaced by the bad one.
            good = _request([_chunk_proto(_CHUNK_KEY)], [_item_proto(11, table, _CHUNK_KEY)])
            assert _insert(channel, [good]) == [11]
        path = server.checkpoint()
    finally:
        server.stop()
    records = list(checkpointing._read_records(f"{path}/{checkpointing._ITEMS_FILE}"))
    assert len(records) == 1
    checkpointing._write_records(f"{path}/{checkpointing._ITEMS_FILE}", iter([bad.SerializeToString()]))
    with pytest.raises(checkpointing.CheckpointError, match=rf"items.records record 0 \(item 11 of table '{table}'\): "
                                                           rf".*{error}"):
        reverb.Server(_tables(), checkpointer=checkpointing.DirectoryCheckpointer(str(tmp_path))).stop()


def test_signature_rule_is_shared_too(tmp_path):
    signature = {"x": tf.TensorSpec([None, 3], tf.float32)}  # steps of [3]; the chunk's are [2]
    server = reverb.Server(_tables(signature))
    try:
        with grpc.insecure_channel(f"localhost:{server.port}") as channel:
            request = _request([_chunk_proto(_CHUNK_KEY)], [_item_proto(11, "u", _CHUNK_KEY)])
            code, details = _refusal(channel, [request])
    finally:
        server.stop()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not match the table signature at column 'x'" in details, details


def test_a_bad_item_next_to_good_ones_leaves_the_checkpoint_loadable_by_serve(tmp_path):
    # The server as a user runs it: items inserted, the process stopped (exit checkpoint) and started again.
    config = tmp_path / "tables.json"
    config.write_text(json.dumps({"tables": [{"name": "u", "sampler": "fifo", "remover": "fifo", "max_size": 1000,
                                              "max_times_sampled": 1, "rate_limiter": {"min_size": 1}}]}))
    args = ("--config", str(config), "--checkpoint-dir", str(tmp_path / "checkpoints"), "--stats-interval", "60")
    good = list(range(100, 200))
    proc, port = proc_testlib.start_serve(*args)
    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            assert _insert(channel, [_request([_chunk_proto(key)], [_item_proto(key, "u", key)])
                                     for key in good[:50]]) == good[:50]
            bad = _item_proto(99, "u", 99)
            bad.times_sampled = -1
            code, details = _refusal(channel, [_request([_chunk_proto(99)], [bad])])
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert "times_sampled (-1) of item 99 must be >= 0" in details, details
            assert _insert(channel, [_request([_chunk_proto(key)], [_item_proto(key, "u", key)])
                                     for key in good[50:]]) == good[50:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        output = proc.stdout.read()
        assert "checkpoint: " in output, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
    proc, port = proc_testlib.start_serve(*args)  # refused before: the restore met times_sampled -1
    try:
        client = proc_testlib.remote_client(f"localhost:{port}")
        assert client.server_info()["u"].current_size == len(good)
        keys = [sample[0].info.key for sample in client.sample("u", num_samples=len(good))]
        assert keys == good  # each once (max_times_sampled 1), in insertion order
    finally:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


# --- in-process inserts ---

def _core_item(key, chunk, slices, times_sampled=0):
    column = chunk_store.Column(tuple(chunk_store.ChunkSlice(chunk.key, offset, length, 0)
                                      for offset, length in slices))
    return chunk_store.Item(key, 1.0, (column,), [chunk], times_sampled=times_sampled)


@pytest.mark.parametrize("times_sampled, slices, error", [
    (0, [(0, 3)] * 10, None),                               # 240 bytes
    (-1, [(0, 3)], r"times_sampled \(-1\) of item 5 must be >= 0"),
    (0, [(1, 1)] * 33, r"item 5 for table 'u' decodes to 264 bytes .*MAX_ITEM_BYTES \(256\)"),
])
def test_in_process_inserts_follow_the_same_rules(small_items, times_sampled, slices, error):
    server = reverb.Server(_tables())
    try:
        stream = inprocess.InProcessTransport(server).open_insert_stream()
        chunk = chunk_store.Chunk(3, [_ROW], chunk_store.SequenceRange(1, 0, 2))
        item = _core_item(5, chunk, slices, times_sampled)
        if error is None:
            stream.send("u", item)
            assert server.tables["u"].get_item(5) is item
        else:
            with pytest.raises(ValueError, match=error):
                stream.send("u", item)
            assert server.tables["u"].get_item(5) is None
        stream.close()
    finally:
        server.stop()


def test_in_process_strings_count_their_bytes_as_a_checkpoint_does(small_items):
    # A row of one 100-byte string: 64 (STRING_ELEMENT_BYTES) + 100 bytes each time the item names it.
    strings = np.array([[b"x" * 100], [b""]], dtype=object)
    chunk = chunk_store.Chunk(3, [strings], chunk_store.SequenceRange(1, 0, 1))
    table = _tables()[0]
    item_records.check_item(table, _core_item(5, chunk, [(0, 1)]), max_item_bytes=164, string_element_bytes=64)
    with pytest.raises(item_records.ItemTooLargeError, match=r"decodes to 328 bytes"):
        item_records.check_item(table, _core_item(5, chunk, [(0, 1)] * 2), max_item_bytes=327,
                                string_element_bytes=64)
    # The same item's record over the chunk as a server holds it (headers, and the strings' lengths on demand).
    proto = chunk_codec.chunk_to_proto(chunk)
    held, headers = chunk_codec.chunk_from_proto(proto, check_content=True)
    layout = item_records.ChunkLayout(held, headers, 64, chunk_codec.string_lengths)
    column = [(False, [chunk_store.ChunkSlice(3, 0, 1, 0)] * 2)]
    item_records.item_from_record(table, 5, 1.0, 0, column, {3: layout}.get, max_item_bytes=328)
    with pytest.raises(item_records.ItemTooLargeError, match=r"decodes to 328 bytes"):
        item_records.item_from_record(table, 5, 1.0, 0, column, {3: layout}.get, max_item_bytes=327)


# --- string tensors ---

@pytest.mark.parametrize("strings", [
    [b"", b"", b""],
    [b"a", b"", b"bc"],
    [b"x" * 127, b"y" * 128, b"", b"z" * 20_000],     # lengths of 1, 2 and 3 varint bytes
])
def test_string_lengths_are_read_without_a_python_object_per_string(strings):
    proto = tensor_codec.encode_tensor(np.array(strings, dtype=object).reshape(-1, 1))
    np.testing.assert_array_equal(tensor_codec.string_lengths(proto, len(strings)), [len(v) for v in strings])
    with pytest.raises(tensor_codec.ChunkDecodeError, match=r"content ends inside the lengths of its"):
        tensor_codec.string_lengths(proto, len(strings) + 1 + sum(map(len, strings)))
    proto.tensor_content += b"!"
    with pytest.raises(tensor_codec.ChunkDecodeError, match=r"its \d+ lengths add up to"):
        tensor_codec.string_lengths(proto, len(strings))


def test_string_elements_count_against_the_tensor_limit_on_both_sides(monkeypatch):
    monkeypatch.setattr(limits, "MAX_CHUNK_TENSOR_BYTES", 64 * 100 + 200)
    for count, refused in [(100, False), (104, True)]:
        proto = _chunk_proto(_CHUNK_KEY, np.array([[b""] * count], dtype=object))
        serialized = proto.SerializeToString()
        error = rf"chunk 7: tensor 0 of dtype string and shape \[1, {count}\] decodes to about " \
                rf"{count * 64 + len(serialized)} bytes \({count} strings"
        if refused:
            with pytest.raises(tensor_codec.ChunkTooLargeError, match=error):
                chunk_codec.chunk_from_proto(proto, serialized, check_content=True)
            with pytest.raises(tensor_codec.ChunkTooLargeError, match=r"STRING_ELEMENT_BYTES \(64\)"):
                tensor_codec.decode_tensor(proto.data.tensors[0])  # a sampling client's decode
        else:
            chunk_codec.chunk_from_proto(proto, serialized, check_content=True)
            assert tensor_codec.decode_tensor(proto.data.tensors[0]).shape == (1, count)


# --- keep_chunk_keys and error messages ---

@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("count, refused", [(8, False), (9, True)])
def test_keep_chunk_keys_are_counted_before_parsing(monkeypatch, packed, count, refused):
    monkeypatch.setattr(limits, "MAX_KEPT_CHUNKS_PER_REQUEST", 8)
    keys = [(1 << 60) + i for i in range(count)]  # 9-byte varints: each key's bytes hold several high bytes
    if packed:
        raw = _request(keep=keys)
    else:  # one varint field per key (tag 0x18), which parsers accept as well
        raw = b"".join(b"\x18" + reverb_service_pb2.InsertStreamRequest(keep_chunk_keys=[k]).SerializeToString()[2:]
                       for k in keys)
        assert list(reverb_service_pb2.InsertStreamRequest.FromString(raw).keep_chunk_keys) == keys
    if refused:
        with pytest.raises(limits.LimitExceededError,
                           match=r"names 9 or more chunks in keep_chunk_keys, over "
                                 r"replay_tf.wire.limits.MAX_KEPT_CHUNKS_PER_REQUEST \(8\)"):
            limits.check_insert_request(raw)
    else:
        limits.check_insert_request(raw)


def test_missing_kept_chunks_are_listed_in_a_short_message():
    server = reverb.Server(_tables())
    try:
        with grpc.insecure_channel(f"localhost:{server.port}") as channel:
            keep = [_CHUNK_KEY, *range(1000, 4000)]
            code, details = _refusal(channel, [_request([_chunk_proto(_CHUNK_KEY)], [_item_proto(11, "u", _CHUNK_KEY)],
                                                        keep=keep)])
    finally:
        server.stop()
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    listed = list(range(1000, 1000 + limits.MAX_LISTED_KEYS))
    assert f"keep_chunk_keys names 3000 chunks {listed} and {3000 - len(listed)} more" in details, details
    assert len(details) < 400, len(details)


# --- sampling an item of repeated rows ---

def test_a_sampling_client_checks_an_item_size_before_assembling_it(monkeypatch):
    server = reverb.Server(_tables())
    try:
        row = np.arange(1 << 18, dtype=np.float32)[None]  # one row of 1 MiB
        with grpc.insecure_channel(f"localhost:{server.port}") as channel:
            item = _item_proto(11, "u", _CHUNK_KEY, [(0, 1)] * 64)  # 64 MiB decoded
            assert _insert(channel, [_request([_chunk_proto(_CHUNK_KEY, row)], [item])]) == [11]
        client = proc_testlib.remote_client(f"localhost:{server.port}")
        monkeypatch.setattr(limits, "MAX_ITEM_BYTES", 32 << 20)  # the sampling client's limit
        tracemalloc.start()
        try:
            with pytest.raises(errors.ReverbError, match=r"sampled item 11 decodes to 67108864 bytes .* over "
                                                         r"replay_tf.wire.limits.MAX_ITEM_BYTES \(33554432\)"):
                next(client.sample("u", num_samples=1))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 16 << 20, f"a refused sample allocated {peak} bytes"
        monkeypatch.setattr(limits, "MAX_ITEM_BYTES", 64 << 20)
        steps = next(client.sample("u", num_samples=1))  # (one ReplaySample per row)
        np.testing.assert_array_equal(np.stack([step.data[0] for step in steps]), np.repeat(row, 64, axis=0))
    finally:
        server.stop()
