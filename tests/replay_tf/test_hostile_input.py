"""Hostile or careless input to buffers, tables, servers and clients: refused clearly, never left broken."""
import logging
import re
import sys

import numpy as np
import pytest
import tensorflow as tf

import replay_tf as reverb
from replay_tf.transport import base as transport_lib
from replay_tf import errors
from replay_tf.core import selectors

FLOAT32_MAX = float(np.finfo(np.float32).max)


# --- priorities whose sums would overflow ---

def _buffer(alpha=1.0, batch_size=1, max_length=4, adds=2):
    rb = reverb.PrioritizedReplayBuffer(tf.TensorSpec([], tf.float32), batch_size, max_length, alpha=alpha)
    for t in range(adds):
        rb.add_batch(tf.fill([batch_size], float(t)))
    return rb


@pytest.mark.parametrize("alpha, priority, graph", [
    (1.0, 3e38, False),                            # finite in float32, but two of them sum to inf
    (1.0, 3e38, True),
    (2.0, 1e20, False),                            # finite priority, its power overflows float32
    (1.0, FLOAT32_MAX / (2 * 4) * 1.01, False),    # just above the bound for capacity 4
])
def test_buffer_refuses_priorities_that_could_overflow_the_tree(alpha, priority, graph):
    rb = _buffer(alpha=alpha)
    update = rb.update_priorities
    if graph:  # the graph path asserts inside the function (the eager path runs one XLA program)
        update = tf.function(lambda ids, priorities: [rb.update_priorities(ids, priorities)] and None)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"priority\*\*alpha <= 4\.25353e\+37 \(float32 max "
                                                             r"/ \(2 \* capacity\)"):
        update(tf.constant([0], tf.int64), tf.constant([priority], tf.float32))
    # Nothing was written: new items still get priority 1 and sampling keeps working.
    rb.add_batch(tf.constant([2.0]))
    rb.add_batch(tf.constant([3.0]))
    _, info = rb.get_next(sample_batch_size=8)
    np.testing.assert_allclose(info.probabilities.numpy(), 0.25)


def test_buffer_at_the_bound_keeps_sampling_for_ever():
    # capacity 4: the bound is float32 max / 8; four items at the bound sum to half of float32's max.
    bound = FLOAT32_MAX / 8
    rb = _buffer(adds=2)
    rb.update_priorities(tf.constant([0, 1], tf.int64), tf.constant([bound, bound], tf.float32))
    rb.add_batch(tf.constant([2.0]))   # new items inherit the max priority
    rb.add_batch(tf.constant([3.0]))
    _, info = rb.get_next(sample_batch_size=16)
    np.testing.assert_allclose(info.probabilities.numpy(), 0.25, rtol=1e-5)
    assert np.all(np.isfinite(info.importance_weights.numpy()))


def _table(max_size=100, exponent=1.0, remover=None):
    return reverb.Table("t", reverb.selectors.Prioritized(exponent), remover or reverb.selectors.Fifo(), max_size,
                        reverb.rate_limiters.MinSize(1))


@pytest.mark.parametrize("exponent, priority, max_size", [
    (1.0, 1e308, 100),
    (1.0, sys.float_info.max / (2 * 3) * 1.001, 2),   # just above the bound for 2 + 1 items
    (2.0, 1e200, 100),                                # the power overflows float64
    (-1.0, 1e-320, 100),                              # a negative exponent makes a tiny priority huge
])
def test_server_refuses_priorities_that_could_overflow_the_total(exponent, priority, max_size):
    server = reverb.Server([_table(max_size=max_size, exponent=exponent)])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert(np.float32(0), {"t": 1.0})
        client.insert(np.float32(1), {"t": 1.0})
        keys = sorted({s[0].info.key for s in client.sample("t", num_samples=20)})
        message = (rf"priority \({re.escape(str(priority))}\) of item {keys[0]} is too large for table 't': its "
                   rf"weight priority \*\* {exponent} must be <= ")
        with pytest.raises(ValueError, match=message):
            client.mutate_priorities("t", {keys[0]: priority})
        with pytest.raises(ValueError, match="is too large"):
            client.insert(np.float32(2), {"t": priority})
        # The table is unchanged: two items, equal probabilities.
        samples = [s[0].info for s in client.sample("t", num_samples=20)]
        assert {s.key for s in samples} == set(keys) and {s.probability for s in samples} == {0.5}
        assert {s.priority for s in samples} == {1.0}
    finally:
        server.stop()


def test_server_at_the_bound_reports_finite_probabilities():
    table = _table(max_size=2)
    bound = selectors.max_weight(3)
    assert bound == sys.float_info.max / 6
    server = reverb.Server([table])
    try:
        client = reverb.Client(f"localhost:{server.port}")
        client.insert(np.float32(0), {"t": bound})
        client.insert(np.float32(1), {"t": bound})
        client.insert(np.float32(2), {"t": bound})   # three items for a moment, then Fifo removes one
        samples = [s[0].info for s in client.sample("t", num_samples=50)]
        assert len({s.key for s in samples}) == 2
        np.testing.assert_allclose([s.probability for s in samples], 0.5)
    finally:
        server.stop()


# --- tokens never travel in plaintext beyond loopback unless the user opts in ---

_TOKEN = "hostile-input-token"


@pytest.fixture
def channels(monkeypatch):
    """Records the gRPC channels the transport creates; each is a real channel to a loopback port, so
    nothing ever connects to the addresses under test."""
    import grpc
    from replay_tf.grpc.client import client_transport
    created = []
    insecure_channel = grpc.insecure_channel

    def record(kind):
        def make(target, *args, **kwargs):
            created.append((kind, target))
            return insecure_channel("localhost:1")
        return make

    monkeypatch.setattr(client_transport.grpc, "insecure_channel", record("insecure"))
    monkeypatch.setattr(client_transport.grpc, "secure_channel", record("secure"))
    monkeypatch.delenv("REPLAY_TF_ALLOW_PLAINTEXT_TOKEN", raising=False)   # the documented opt-in
    monkeypatch.delenv(transport_lib.AUTH_TOKEN_ENV, raising=False)
    return created


@pytest.mark.parametrize("address", ["10.0.0.1:1", "replay.example.com:8000", "[2001:db8::1]:1", "0.0.0.0:1"])
def test_a_token_is_not_sent_in_plaintext_beyond_loopback(channels, monkeypatch, address):
    message = (rf"refusing to send the auth token to {re.escape(address)} in plaintext: .*"
               rf"REPLAY_TF_ALLOW_PLAINTEXT_TOKEN=1")
    with pytest.raises(ValueError, match=message):
        reverb.Client(address, auth_token=_TOKEN)
    reverb.set_connection_options(address, auth_token=_TOKEN)
    try:
        with pytest.raises(ValueError, match=message):
            reverb.Client(address)
    finally:
        reverb.set_connection_options(address)
    monkeypatch.setenv(transport_lib.AUTH_TOKEN_ENV, _TOKEN)
    with pytest.raises(ValueError, match=message):
        reverb.Client(address)
    assert channels == []   # refused before any channel existed


def test_a_token_travels_over_tls_loopback_or_with_the_opt_in(channels, monkeypatch):
    import grpc
    from replay_tf.grpc.client import client_transport
    credentials = grpc.ssl_channel_credentials()
    reverb.Client("10.0.0.1:1", auth_token=_TOKEN, channel_credentials=credentials).transport.close()
    reverb.Client("127.0.0.1:1", auth_token=_TOKEN).transport.close()
    reverb.Client("localhost:1", auth_token=_TOKEN).transport.close()
    client_transport.Transport("10.0.0.1:1", auth_token=_TOKEN, allow_plaintext_token=True).close()
    monkeypatch.setenv(client_transport.ALLOW_PLAINTEXT_TOKEN_ENV, "1")
    reverb.Client("10.0.0.1:1", auth_token=_TOKEN).transport.close()
    reverb.Client("10.0.0.1:1").transport.close()   # no token: nothing to protect
    monkeypatch.delenv(client_transport.ALLOW_PLAINTEXT_TOKEN_ENV)
    reverb.Client("10.0.0.1:1").transport.close()
    assert channels == [("secure", "10.0.0.1:1"), ("insecure", "127.0.0.1:1"), ("insecure", "localhost:1"),
                        ("insecure", "10.0.0.1:1"), ("insecure", "10.0.0.1:1"), ("insecure", "10.0.0.1:1"),
                        ("insecure", "10.0.0.1:1")]


@pytest.fixture(scope="module")
def token_server():
    server = reverb.Server([reverb.Table.queue("q", 10)], auth_token=_TOKEN)
    yield server
    server.stop()


@pytest.mark.parametrize("source", ["argument", "environment"])
def test_token_whitespace_is_stripped_on_the_client(token_server, monkeypatch, source):
    from replay_tf.transport import local_servers
    monkeypatch.setattr(local_servers, "find_local_server", lambda address: None)   # over gRPC, as remotely
    padded = f"  {_TOKEN}\n"                       # as read from a file or an environment variable
    if source == "environment":
        monkeypatch.setenv(transport_lib.AUTH_TOKEN_ENV, padded)
        client = reverb.Client(f"localhost:{token_server.port}")
    else:
        client = reverb.Client(f"localhost:{token_server.port}", auth_token=padded)
    assert sorted(client.server_info(timeout=10)) == ["q"]
    client.transport.close()


@pytest.mark.parametrize("host, tls, warned", [
    ("0.0.0.0", False, True),
    ("0.0.0.0", True, False),
    ("localhost", False, False),
    ("127.0.0.1", False, False),
])
def test_a_token_served_without_tls_beyond_loopback_is_logged(caplog, host, tls, warned):
    import grpc
    credentials = None
    if tls:  # any server credentials do: the warning is decided before binding
        credentials = grpc.local_server_credentials()
    with caplog.at_level(logging.WARNING, logger="replay_tf.grpc.server.service"):
        server = reverb.Server([reverb.Table.queue("q", 10)], host=host, auth_token=_TOKEN,
                               server_credentials=credentials)
        server.stop()
    logged = [r.getMessage() for r in caplog.records if "with an auth token but without TLS" in r.getMessage()]
    assert len(logged) == int(warned)
    if warned:
        assert f"binds {host}:{server.port} with an auth token but without TLS: clients send the token in " \
               f"plaintext" in logged[0]


# --- a Server that fails to bind leaves no trace; a client of a silent address says it waits ---

def test_a_server_that_fails_to_bind_is_not_reachable_in_process():
    import concurrent.futures
    import grpc
    from replay_tf.transport import local_servers
    other = grpc.server(concurrent.futures.ThreadPoolExecutor(1), options=[("grpc.so_reuseport", 0)])
    port = other.add_insecure_port("localhost:0")
    other.start()
    try:
        table = reverb.Table.queue("q", 10)
        with pytest.raises(ValueError, match=rf"could not bind the replay service to localhost:{port}") as info:
            reverb.Server([table], port=port)
        assert info.value is not None   # the traceback (and the failed Server in it) is still alive here
        assert local_servers.find_local_server(f"localhost:{port}") is None
        client = reverb.Client(f"localhost:{port}")
        assert type(client.transport).__name__ == "Transport"   # the gRPC transport, not in-process
        client.transport.close()
        # The table is not closed: it can serve from another port.
        server = reverb.Server([table])
        reverb.Client(f"localhost:{server.port}").insert(np.float32(1), {"q": 1.0})
        assert table.size() == 1
        server.stop()
    finally:
        other.stop(None)


def test_a_client_of_a_silent_address_logs_that_it_waits(caplog, monkeypatch):
    import socket
    from replay_tf.grpc.client import client_transport
    monkeypatch.setattr(client_transport, "WAIT_LOG_AFTER_S", 0.3)
    with socket.socket() as sock:   # a loopback port where nothing listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="replay_tf.grpc.client.client_transport"):
        client = reverb.Client(f"127.0.0.1:{port}")
        with pytest.raises(errors.DeadlineExceededError):
            client.server_info(timeout=1.5)
        client.transport.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "replay_tf.grpc.client.client_transport"]
    assert logged == [f"replay_tf: still waiting for the replay server at 127.0.0.1:{port} after 0.3 s: nothing "
                      f"accepts the connection yet (a server started with TLS needs channel_credentials); calls "
                      f"wait until it does. Check the address and that the server runs."]


def test_a_reachable_server_logs_no_wait(caplog, monkeypatch):
    from replay_tf.grpc.client import client_transport
    from replay_tf.transport import local_servers
    monkeypatch.setattr(client_transport, "WAIT_LOG_AFTER_S", 0.3)
    server = reverb.Server([reverb.Table.queue("q", 10)])
    try:
        monkeypatch.setattr(local_servers, "find_local_server", lambda address: None)
        with caplog.at_level(logging.WARNING, logger="replay_tf.grpc.client.client_transport"):
            client = reverb.Client(f"localhost:{server.port}")
            assert sorted(client.server_info(timeout=10)) == ["q"]
            import time
            time.sleep(0.6)
            client.transport.close()
        assert [r for r in caplog.records if r.name == "replay_tf.grpc.client.client_transport"] == []
    finally:
        server.stop()
