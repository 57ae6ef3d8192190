"""Server addresses: parsing and which hosts are this machine (`replay_tf.transport.addresses`)."""
import pytest

import replay_tf as reverb
from replay_tf.transport import addresses
from replay_tf.transport import local_servers


@pytest.mark.parametrize("address, expected", [
    ("localhost:8000", ("localhost", 8000)), ("Example.COM:1", ("example.com", 1)), ("[::1]:5", ("[::1]", 5)),
    (":7", ("", 7))])
def test_addresses_split_into_lower_cased_host_and_port(address, expected):
    assert addresses.split_address(address) == expected


@pytest.mark.parametrize("address", ["localhost", "localhost:", "localhost:http", "host:-1"])
def test_malformed_addresses_are_refused_with_an_example(address):
    with pytest.raises(ValueError, match=r"must look like 'host:port', e.g. 'localhost:8000'"):
        addresses.split_address(address)


@pytest.mark.parametrize("host, loopback, this_machine", [
    ("localhost", True, True), ("LocalHost", True, True), ("127.0.0.1", True, True), ("127.8.9.10", True, True),
    ("::1", True, True), ("[::1]", True, True), ("0.0.0.0", False, True), ("[::]", False, True), ("", False, True),
    ("10.0.0.1", False, False), ("example.com", False, False), ("127.example.com", False, False),
    ("[2001:db8::1]", False, False)])
def test_loopback_hosts_and_hosts_that_reach_this_machine(host, loopback, this_machine):
    assert addresses.is_loopback_host(host) is loopback
    assert addresses.reaches_this_machine(host) is this_machine


def test_clients_find_this_process_server_at_any_loopback_or_bind_all_host():
    server = reverb.Server([reverb.Table.queue("q", 2)])
    try:
        for host in ("localhost", "127.0.0.1", "127.0.0.2", "[::1]", "0.0.0.0"):
            assert local_servers.find_local_server(f"{host}:{server.port}") is server, host
        assert local_servers.find_local_server(f"example.com:{server.port}") is None
        assert local_servers.find_local_server(f"localhost:{server.port + 1 if server.port < 65535 else 1}") is None
    finally:
        server.stop()
