"""TLS and token auth of the replay server (additions: Reverb has neither).

A self-signed certificate is made with the `openssl` CLI. Remote access is forced for clients of this
process by hiding the server from `find_local_server` (otherwise they would reach it in-process).
"""
import logging
import shutil
import subprocess

import grpc
import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.transport import local_servers
from replay_tf.transport import base as transport_lib
from replay_tf import errors
from replay_tf.wire import reverb_service_pb2

_PREFIX = "/deepmind.reverb.ReverbService/"
_TOKEN = "s3cret-token-for-tests"
_SIGNATURE = {"x": tf.TensorSpec([None, 2], tf.float32)}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make a self-signed certificate")
    directory = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out",
                    "cert.pem", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   cwd=directory, check=True, capture_output=True)
    return directory / "key.pem", directory / "cert.pem"


def _tables():
    return [reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 100, reverb.rate_limiters.MinSize(1),
                         signature=_SIGNATURE)]


@pytest.fixture(scope="module")
def tls_server(certificate):
    key, cert = certificate
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    server = reverb.Server(_tables(), server_credentials=credentials, auth_token=_TOKEN)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def token_server():
    server = reverb.Server(_tables(), auth_token=_TOKEN)
    yield server
    server.stop()


@pytest.fixture
def remote(monkeypatch):
    """Clients of this process connect over gRPC, as from another machine."""
    monkeypatch.setattr(local_servers, "find_local_server", lambda address: None)


def _channel_credentials(certificate):
    return grpc.ssl_channel_credentials(root_certificates=certificate[1].read_bytes())


@pytest.mark.parametrize("tls,token,error,message", [
    (False, None, errors.DeadlineExceededError, r"no connection to localhost:\d+: is the server up\? A server "
                                                r"started with TLS needs channel_credentials"),
    (False, _TOKEN, errors.DeadlineExceededError, r"A server started with TLS needs channel_credentials"),
    (True, None, errors.ReverbError, r"requires an auth token: send 'authorization: Bearer <token>' metadata.*"
                                     r"gRPC status UNAUTHENTICATED"),
    (True, "wrong", errors.ReverbError, r"not this replay server's token \(gRPC status UNAUTHENTICATED\)"),
    (True, _TOKEN[:-1], errors.ReverbError, r"not this replay server's token"),
])
def test_clients_without_tls_or_the_token_are_refused(tls_server, certificate, remote, tls, token, error, message):
    client = reverb.Client(f"localhost:{tls_server.port}",
                           channel_credentials=_channel_credentials(certificate) if tls else None, auth_token=token)
    with pytest.raises(error, match=message):
        client.server_info(timeout=2)
    if tls:  # streams are refused too, before any item reaches the table
        with pytest.raises(error, match=message):
            client.insert({"x": np.zeros((1, 2), np.float32)}, priorities={"t": 1.0})
    assert tls_server.tables["t"].size() == 0


def test_tls_and_token_serve_every_client_api(tls_server, certificate, remote):
    address = f"localhost:{tls_server.port}"
    client = reverb.Client(address, channel_credentials=_channel_credentials(certificate), auth_token=_TOKEN)
    assert type(client.transport).__name__ == "Transport"  # the remote transport, not in-process
    info = client.server_info()
    assert list(info) == ["t"] and info["t"].signature == _SIGNATURE
    client.insert({"x": np.array([1.0, 2.0], np.float32)}, priorities={"t": 1.0})
    with client.trajectory_writer(1) as writer:
        writer.append({"x": np.array([3.0, 4.0], np.float32)})
        writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})
    [first] = next(client.sample("t"))
    np.testing.assert_array_equal(first.data[0], [1.0, 2.0])
    assert client.server_info()["t"].current_size == 2
    # Datasets connect by address: they find the options set for it.
    reverb.set_connection_options(address, channel_credentials=_channel_credentials(certificate), auth_token=_TOKEN)
    try:
        dataset = reverb.TrajectoryDataset.from_table_signature(address, "t", max_in_flight_samples_per_worker=1)
        sample = next(iter(dataset))
        np.testing.assert_array_equal(sample.data["x"], [[1.0, 2.0]])  # Fifo sampler: the oldest item
        assert sorted(reverb.Client(address).server_info()) == ["t"]
    finally:
        reverb.set_connection_options(address)
    with pytest.raises(errors.DeadlineExceededError):  # the options are cleared again
        reverb.Client(address).server_info(timeout=1)


def test_token_is_checked_on_every_rpc(token_server):
    channel = grpc.insecure_channel(f"localhost:{token_server.port}")
    requests = {
        "Checkpoint": reverb_service_pb2.CheckpointRequest(),
        "MutatePriorities": reverb_service_pb2.MutatePrioritiesRequest(table="t"),
        "Reset": reverb_service_pb2.ResetRequest(table="t"),
        "ServerInfo": reverb_service_pb2.ServerInfoRequest(),
    }
    streams = {
        "InsertStream": reverb_service_pb2.InsertStreamRequest(keep_chunk_keys=[1]),
        "SampleStream": reverb_service_pb2.SampleStreamRequest(table="t", num_samples=1),
        "InitializeConnection": reverb_service_pb2.InitializeConnectionRequest(table_name="t"),
    }
    for metadata, details in ((None, "requires an auth token"), ([("authorization", f"Bearer {_TOKEN}x")], "not this"),
                              ([("authorization", _TOKEN)], "not this")):
        for method, request in requests.items():
            call = channel.unary_unary(_PREFIX + method, request_serializer=lambda m: m.SerializeToString())
            with pytest.raises(grpc.RpcError) as info:
                call(request, metadata=metadata, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and details in info.value.details(), method
        for method, request in streams.items():
            call = channel.stream_stream(_PREFIX + method, request_serializer=lambda m: m.SerializeToString())
            with pytest.raises(grpc.RpcError) as info:
                list(call(iter([request]), metadata=metadata, timeout=10))
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and details in info.value.details(), method
    # With the token: served.
    call = channel.unary_unary(_PREFIX + "ServerInfo", request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=reverb_service_pb2.ServerInfoResponse.FromString)
    assert [t.name for t in call(requests["ServerInfo"], metadata=[("authorization", f"Bearer {_TOKEN}")],
                                 timeout=10).table_info] == ["t"]
    channel.close()


def test_token_from_the_environment_reaches_remote_clients(token_server, remote, monkeypatch):
    address = f"localhost:{token_server.port}"
    with pytest.raises(errors.ReverbError, match="UNAUTHENTICATED"):
        reverb.Client(address).server_info(timeout=5)
    monkeypatch.setenv(transport_lib.AUTH_TOKEN_ENV, _TOKEN)
    client = reverb.Client(address)
    client.insert({"x": np.array([5.0, 6.0], np.float32)}, priorities={"t": 1.0})
    dataset = reverb.make_reverb_dataset(address, table="t", num_parallel_calls=1)
    np.testing.assert_array_equal(next(iter(dataset)).data["x"], [[5.0, 6.0]])


def test_local_clients_of_a_protected_server_are_in_process(token_server):
    client = reverb.Client(f"localhost:{token_server.port}")  # no token: this process is trusted
    assert type(client.transport).__name__ == "InProcessTransport"
    assert sorted(client.server_info()) == ["t"]


@pytest.mark.parametrize("host,kwargs,warned", [
    ("0.0.0.0", {}, True),
    ("0.0.0.0", {"auth_token": _TOKEN}, False),
    ("127.0.0.1", {}, False),
    ("LOCALHOST", {}, False),
    ("::1", {}, False),
])
def test_a_network_bind_without_protection_is_logged(caplog, host, kwargs, warned):
    with caplog.at_level(logging.WARNING, logger="replay_tf.grpc.server.service"):
        server = reverb.Server(_tables(), host=host, **kwargs)
        server.stop()
    assert any("without TLS or auth token" in r.getMessage() for r in caplog.records) == warned


@pytest.mark.parametrize("token", ["", "   ", b"bytes"])
def test_bad_tokens_are_refused(token):
    with pytest.raises(ValueError, match="auth_token must be a non-empty str"):
        reverb.Server(_tables(), auth_token=token)
    if isinstance(token, str) and not token:
        with pytest.raises(ValueError, match="auth_token must be a non-empty str"):
            reverb.set_connection_options("localhost:1", auth_token=token)


# --- no pickle: crafted checkpoints cannot execute code, and the runtime code never unpickles ---

class _Exploit:
    """Unpickling this creates `marker` (a stand-in for arbitrary code)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _record(payload: bytes) -> bytes:
    """`payload` framed as one record of the checkpoint files (length, CRC32, bytes)."""
    import struct  # noqa: PLC0415
    import zlib  # noqa: PLC0415
    return struct.pack("<QI", len(payload), zlib.crc32(payload)) + payload


def _write_checkpoint(directory, payload: bytes, framed: bool, *, valid_tables: bool = False):
    """A checkpoint directory whose every file holds `payload` (raw, or framed as a record)."""
    from replay_tf.wire import checkpoint_pb2  # noqa: PLC0415

    directory.mkdir(parents=True)
    content = _record(payload) if framed else payload
    for name in ("tables.records", "chunks.records", "items.records", "checkpoint.pkl"):
        (directory / name).write_bytes(content)
    # An empty DONE file (a checkpoint without a sequence number), so the loader goes on to the record files;
    # a DONE file that does not hold one sequence-number record marks a folder the loader never reads.
    (directory / "DONE").write_bytes(b"")
    if valid_tables:  # the tables file is sound, so the loader goes on to read the chunks and items files
        table = checkpoint_pb2.PriorityTableCheckpoint(table_name="t").SerializeToString()
        (directory / "tables.records").write_bytes(_record(table))


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize("framed,valid_tables", [(False, False), (True, False), (True, True)])
def test_a_crafted_checkpoint_cannot_execute_code(tmp_path, protocol, framed, valid_tables):
    import pickle  # noqa: PLC0415  (the test crafts the attack; the package never imports pickle)
    from google.protobuf import message  # noqa: PLC0415

    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(marker), protocol=protocol)
    pickle.loads(payload).close()  # the payload does run when unpickled...
    assert marker.exists()
    marker.unlink()
    root = tmp_path / "checkpoints"
    _write_checkpoint(root / "20990101T000000.000000Z", payload, framed, valid_tables=valid_tables)
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(root))
    try:
        server = reverb.Server([reverb.Table.queue("t", 10)], checkpointer=checkpointer)
    except (ValueError, message.DecodeError):
        pass  # refused: a corrupt record, or bytes that are no checkpoint message
    else:  # ...or read as (garbage) protobuf fields, which restores nothing executable
        server.stop()
    assert not marker.exists()  # ...but never when a checkpoint is loaded


_UNPICKLING_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib"}


def _unsafe_calls(tree) -> list:
    import ast  # noqa: PLC0415

    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"import {n}" for n in names if n and n.split(".")[0] in _UNPICKLING_MODULES]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if isinstance(func, ast.Name) and name in ("eval", "exec", "__import__"):
                found.append(f"{name}(")
            if name in ("unsafe_load", "full_load") or (
                    name == "load" and isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "yaml"):
                found.append(f"yaml.{name}(")
            for keyword in node.keywords:
                if keyword.arg == "allow_pickle" and not (
                        isinstance(keyword.value, ast.Constant) and keyword.value.value is False):
                    found.append("allow_pickle=<not False>")
    return found


def test_runtime_code_never_unpickles_or_evaluates():
    """No pickle/marshal/shelve, eval/exec or unsafe YAML in replay_tf/ and rlds_tf/ (tests excluded).

    `Client.__reduce__` is allowed: it lets multiprocessing pickle a client *out* of this process as its
    address only; nothing in the packages ever unpickles.
    """
    import ast  # noqa: PLC0415
    import pathlib  # noqa: PLC0415

    root = pathlib.Path(reverb.__file__).parent.parent
    offenders, scanned = {}, 0
    for package in ("replay_tf", "rlds_tf"):
        for path in sorted((root / package).rglob("*.py")):
            scanned += 1
            found = _unsafe_calls(ast.parse(path.read_text(), str(path)))
            if found:
                offenders[str(path.relative_to(root))] = found
    assert scanned > 40
    assert offenders == {}
    # The scan itself finds what it looks for.
    assert sorted(_unsafe_calls(ast.parse("import pickle\nfrom marshal import loads\neval('1')\nyaml.load(s)\n"
                                          "np.load(f, allow_pickle=True)\nnp.load(f, allow_pickle=False)\n"))) == [
        "allow_pickle=<not False>", "eval(", "import marshal", "import pickle", "yaml.load("]


_REVERB_CLIENT_WITHOUT_TOKEN = r'''
import reverb
client = reverb.Client(INPUTS["address"])
for name, call in (("server_info", lambda: client.server_info(timeout=30)),
                   ("insert", lambda: client.insert([np.zeros((1, 2), np.float32)], priorities={"t": 1.0}))):
    try:
        call()
        emit(name, "served")
    except Exception as e:  # dm-reverb raises RuntimeError with the server's status message
        emit(name, f"{type(e).__name__}: {e}")
'''


@pytest.mark.peer
def test_a_dm_reverb_client_is_refused_by_a_token_server(peer, token_server):
    out = peer.run(_REVERB_CLIENT_WITHOUT_TOKEN, {"address": f"localhost:{token_server.port}"}, timeout_s=300)
    for name in ("server_info", "insert"):
        assert out[name].startswith("RuntimeError: this replay server requires an auth token"), out[name]
