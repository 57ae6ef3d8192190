"""Writers to a server that never answers: the signature fetch of their constructors is bounded.

Nothing listens on the port of these tests (a loopback port bound once and released), so a call that waits
for the server waits until its timeout, which must raise `DeadlineExceededError` naming the address.
"""
import pickle
import socket
import time

import numpy as np
import pytest

import replay_tf as reverb
from replay_tf.transport import base as transport_lib

pytestmark = pytest.mark.timeout(120)  # a call that ignores its timeout waits for ever


@pytest.fixture(name="dead_address")
def dead_address_fixture():
    # Imported before any timing: the first use of these names imports TensorFlow and gRPC.
    from replay_tf.grpc.client import client_transport  # noqa: F401
    assert reverb.Client and reverb.ShardedClient and reverb.TrajectoryDataset
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    address = f"localhost:{port}"
    yield address
    reverb.set_connection_options(address)  # (cleared whatever a test set)


def _deadline_error(call) -> tuple:
    start = time.monotonic()
    with pytest.raises(reverb.DeadlineExceededError) as raised:
        call()
    return str(raised.value), time.monotonic() - start


def test_get_signature_timeout_ms_bounds_trajectory_writer(dead_address):
    message, elapsed = _deadline_error(
        lambda: reverb.Client(dead_address).trajectory_writer(num_keep_alive_refs=1, get_signature_timeout_ms=500))
    assert elapsed < 2.5
    assert message.startswith(f"trajectory_writer could not fetch the table signatures from the replay server at "
                              f"{dead_address} within get_signature_timeout_ms=500 ms: ")


def test_connection_options_timeout_bounds_writer_and_server_info(dead_address):
    reverb.set_connection_options(dead_address, timeout_ms=400)
    client = reverb.Client(dead_address)
    message, elapsed = _deadline_error(lambda: client.trajectory_writer(1))
    assert elapsed < 2.5
    assert f"at {dead_address} within timeout_ms=400 ms" in message
    message, elapsed = _deadline_error(client.server_info)
    assert elapsed < 2.5 and dead_address in message
    message, elapsed = _deadline_error(
        lambda: reverb.TrajectoryDataset.from_table_signature(dead_address, "t", 1))
    assert elapsed < 2.5 and dead_address in message


def test_client_timeout_ms_and_the_argument_that_overrides_it(dead_address):
    reverb.set_connection_options(dead_address, timeout_ms=60_000)
    message, elapsed = _deadline_error(lambda: reverb.Client(dead_address, timeout_ms=300).trajectory_writer(1))
    assert elapsed < 2.5 and f"within timeout_ms=300 ms" in message
    # The writer's own argument wins over the client's and the connection options' timeouts.
    client = reverb.Client(dead_address, timeout_ms=60_000)
    message, elapsed = _deadline_error(lambda: client.trajectory_writer(1, get_signature_timeout_ms=300))
    assert elapsed < 2.5 and "within get_signature_timeout_ms=300 ms" in message
    # A pickled client keeps its timeout (it is not a secret).
    message, elapsed = _deadline_error(
        lambda: pickle.loads(pickle.dumps(reverb.Client(dead_address, timeout_ms=300))).trajectory_writer(1))
    assert elapsed < 2.5 and "within timeout_ms=300 ms" in message


def test_sharded_client_passes_the_timeout_on(dead_address):
    client = reverb.ShardedClient([dead_address])
    message, elapsed = _deadline_error(lambda: client.trajectory_writer(1, get_signature_timeout_ms=300))
    assert elapsed < 2.5 and dead_address in message


def test_writers_that_fetch_nothing_construct_at_once(dead_address):
    client = reverb.Client(dead_address)
    start = time.monotonic()
    writers = [client.trajectory_writer(1, validate_items=False), client.writer(1),
               client.structured_writer([reverb.structured.create_config(
                   reverb.structured.pattern_from_transform({"x": None}, lambda step: step["x"][-1]), "t")])]
    assert time.monotonic() - start < 2.0
    writers[0].append({"x": np.float32(1)})
    writers[0].create_item("t", 1.0, writers[0].history["x"][-1:])
    with pytest.raises(reverb.DeadlineExceededError):
        writers[0].flush(timeout_ms=200)


@pytest.mark.parametrize("timeout_ms, error, match", [
    (0, ValueError, r"get_signature_timeout_ms \(0\) must be > 0, or None to wait for the server"),
    (-1, ValueError, r"get_signature_timeout_ms \(-1\) must be > 0"),
    ("500", TypeError, r"get_signature_timeout_ms must be a number of milliseconds or None, got '500'"),
])
def test_invalid_timeouts_are_refused(dead_address, timeout_ms, error, match):
    with pytest.raises(error, match=match):
        reverb.Client(dead_address).trajectory_writer(1, get_signature_timeout_ms=timeout_ms)
    with pytest.raises(error, match=match.replace("get_signature_timeout_ms", "timeout_ms")):
        reverb.set_connection_options(dead_address, timeout_ms=timeout_ms)
    assert transport_lib.connection_timeout_ms(dead_address) is None


def test_a_timeout_alone_leaves_credentials_to_the_environment(dead_address, monkeypatch):
    monkeypatch.setenv(transport_lib.AUTH_TOKEN_ENV, "from-env")
    reverb.set_connection_options(dead_address, timeout_ms=1000)
    assert transport_lib._resolve_connection_options(dead_address, None, None) == (None, "from-env")
    reverb.set_connection_options(dead_address, auth_token="set", timeout_ms=1000)
    assert transport_lib._resolve_connection_options(dead_address, None, None) == (None, "set")
    reverb.set_connection_options(dead_address)
    assert transport_lib.connection_timeout_ms(dead_address) is None


def test_a_running_server_answers_within_the_timeout():
    import tensorflow as tf

    server = reverb.Server([reverb.Table.queue("t", 10, signature={"x": tf.TensorSpec([], tf.float32)})])
    try:
        from proc_testlib import remote_client  # the gRPC path, not the in-process one

        for client in (reverb.Client(server.address), remote_client(server.address)):
            with client.trajectory_writer(1, get_signature_timeout_ms=5_000) as writer:
                writer.append({"x": np.float32(1)})
                with pytest.raises(ValueError, match="inconsistent with the table signature"):
                    writer.create_item("t", 1.0, {"x": writer.history["x"][-1:]})  # [1] against []
                writer.create_item("t", 1.0, {"x": writer.history["x"][-1]})
        assert server.table("t").size() == 2
    finally:
        server.stop()
