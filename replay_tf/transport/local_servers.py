"""The `Server`s of this process by port, so that a client of `localhost:<port>` reaches its tables directly.

Servers register here when they start and leave when they stop; `find_local_server` is how the in-process
transport finds them. Weak references: a server nobody holds any more is not kept alive by the registry.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Optional

from replay_tf.transport import addresses

_registry_lock = threading.Lock()
_registry: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()  # port -> Server


def register(port: int, server: Any) -> None:
    """Makes `server` the one serving `port` in this process; ValueError while another running one does."""
    with _registry_lock:
        other = _registry.get(port)
        if other is not None and not other.stopped:
            raise ValueError(f"port {port} is already served by another Server in this process")
        _registry[port] = server


def unregister(port: int, server: Any) -> None:
    """Removes `server` from `port` (nothing when another server has taken the port since)."""
    with _registry_lock:
        if _registry.get(port) is server:
            del _registry[port]


def find_local_server(address: str) -> Optional[Any]:
    """The `Server` of this process that owns `address` (a host of this machine and its port), if any."""
    host, port = addresses.split_address(address)
    if not addresses.reaches_this_machine(host):
        return None
    with _registry_lock:
        return _registry.get(port)
