"""Loopback: where the service may run without tokens, and which `Host` names it then answers.

Without tokens, a service on 127.0.0.1 trusts whoever can reach it, which is every process on
the machine and, through DNS rebinding, every web page the user opens: a page on evil.example
makes its name resolve to 127.0.0.1 and talks to the service as same-origin. The browser still
sends `Host: evil.example`, so answering only loopback names closes that door, provided the
name checked is the one the request is for: the target's own authority, when it has one, and
never one `Host` line of several.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from ..protocol.errors import ProblemError

__all__ = ["client_address", "is_loopback_address", "is_loopback_host_header", "request_host"]

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


def request_host(scope: Any) -> str | None:
    """The host a request is for (RFC 9112 §3.2): an absolute-form target's authority wins over
    `Host` (§3.2.2); two `Host` lines are a 400, tokens or not, and end the connection, since
    whatever sits in front of the service may have read the other one."""
    hosts = [v for k, v in scope.headers.items() if k == "host"]
    if len(hosts) > 1:
        raise ProblemError(
            "invalid_request", "send one Host header (RFC 9112 §3.2)", param="Host", headers=[("connection", "close")]
        )
    host: str | None = scope.authority or scope.headers.get("host")
    return host
