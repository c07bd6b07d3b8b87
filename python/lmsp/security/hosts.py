"""Loopback: where the service may run without tokens, and which `Host` names it then answers.

Without tokens, a service on 127.0.0.1 trusts whoever can reach it, which is every process on
the machine and, through DNS rebinding, every web page the user opens: a page on evil.example
makes its name resolve to 127.0.0.1 and talks to the service as same-origin. The browser still
sends `Host: evil.example`, so answering only loopback names closes that door.
"""

from __future__ import annotations

import ipaddress
import re

__all__ = ["client_address", "is_loopback_address", "is_loopback_host_header"]

# `name`, `name:port`, `[v6]`, `[v6]:port`.
_HOST = re.compile(r"(?P<name>\[[0-9A-Fa-f:.]+\]|[^:\[\]]+)(?::[0-9]{1,5})?")


def is_loopback_address(address: str) -> bool:
    """An address to bind to or a client's address: `localhost` or a loopback IP."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def is_loopback_host_header(value: str | None) -> bool:
    """`localhost`, `127.0.0.1`, `[::1]` (any loopback IP), with any port."""
    if value is None:
        return False
    match = _HOST.fullmatch(value.strip())
    if match is None:
        return False
    name = match.group("name")
    if name.startswith("["):
        return is_loopback_address(name)
    # A v4 literal or the one name that never leaves the machine; not `localhost.evil.example`.
    return name.lower() == "localhost" or (name[0].isdigit() and is_loopback_address(name))


def client_address(client: str) -> str:
    """granian's `127.0.0.1:5000` / `[::1]:5000` (or a unix socket path) → the address."""
    host, sep, port = client.rpartition(":")
    return host.strip("[]") if sep and port.isdigit() else client
