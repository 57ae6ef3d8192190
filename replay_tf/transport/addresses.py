"""Server addresses: `host:port` parsing and which hosts are this machine's loopback (one definition for
the in-process registry, the server's bind warning and the dataset's stacked-samples default)."""
from __future__ import annotations

import ipaddress

_WILDCARD_HOSTS = ("0.0.0.0", "[::]", "::", "")  # bind-all addresses, which clients also reach this machine at
_TARGET_SCHEMES = ("dns:///", "dns:", "ipv4:", "ipv6:")  # gRPC target forms that name a host and port


def split_address(address: str) -> tuple:
    """`(lower-cased host, port)` of `host:port` (IPv6 hosts in brackets); ValueError for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"server_address ({address!r}) must look like 'host:port', e.g. 'localhost:8000'")
    return host.lower(), int(port)


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name or an IP address, brackets allowed) is a loopback interface: `localhost`,
    127.0.0.0/8 or ::1."""
    host = host.lower().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost
        return False


def reaches_this_machine(host: str) -> bool:
    """Whether a client connecting to `host` reaches this machine: a loopback host or a bind-all address."""
    return host in _WILDCARD_HOSTS or is_loopback_host(host)


def is_loopback_target(target: str) -> bool:
    """Whether a gRPC target (`host:port`, or gRPC's `dns:`, `ipv4:`, `ipv6:` and `unix:` forms) names this
    machine's loopback (Unix sockets count as loopback)."""
    target = target.lower()
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    for scheme in _TARGET_SCHEMES:
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    # `host:port` or `[v6]:port`; a bare IPv6 address (several colons, no brackets) has no port.
    host = target.rsplit(":", 1)[0] if target.count(":") == 1 or target.startswith("[") else target
    return is_loopback_host(host)
