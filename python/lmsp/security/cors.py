"""Cross-origin requests: none unless `--cors-origin` names the origin.

A browser attaches `Origin` to every cross-origin request, so a request carrying an `Origin`
other than the service's own comes from some other web page. One from an origin not on the
list is refused outright: without this a page could still make the service run a "simple"
request (one the browser sends without asking first) even though it could not read the answer.
The service's own origin is its playground page (browsers send `Origin` on its POSTs too); a
page on another name resolved to this address (DNS rebinding) matches its own `Host` as well,
and is stopped by the Host rules of a service without tokens, or by its lack of a token.
"""

from __future__ import annotations

from ..protocol.errors import ProblemError

__all__ = ["Cors", "parse_origins"]

_ALLOW_HEADERS = "authorization, content-type, idempotency-key, last-event-id, lmsp-version"
_EXPOSE_HEADERS = "location, lmsp-version, retry-after, idempotent-replayed, www-authenticate"
_MAX_AGE = "600"


def parse_origins(values: list[str]) -> frozenset[str]:
    """`--cors-origin` values, each one origin or a comma-separated list; `scheme://host[:port]`."""
    origins = {o.strip().rstrip("/") for v in values for o in v.split(",") if o.strip()}
    for origin in origins:
        scheme, sep, rest = origin.partition("://")
        if scheme not in ("http", "https") or not sep or not rest or "/" in rest:
            raise ValueError(f"--cors-origin {origin!r} is not an origin (scheme://host[:port])")
    return frozenset(origins)


class Cors:
    def __init__(self, origins: frozenset[str]) -> None:
        self.origins = origins

    def allow(self, origin: str | None) -> str:
        """The origin, when it is on the list; else 403."""
        if origin is None or origin not in self.origins:
            raise ProblemError(
                "origin_not_allowed",
                f"requests from origin {origin!r} are not allowed (`lmsp serve --cors-origin` lists those that are)",
                param="Origin",
            )
        return origin

    def check(self, origin: str | None, own: str | None = None) -> list[tuple[str, str]]:
        """The headers an answer to a request from `origin` carries; 403 for an origin not
        on the list. `own` (`scheme://host`) is the service's origin: no CORS is involved."""
        if origin is None or (own is not None and origin.lower() == own.lower()):
            return []
        self.allow(origin)
        return [
            ("access-control-allow-origin", origin),
            ("access-control-expose-headers", _EXPOSE_HEADERS),
            ("vary", "Origin"),
        ]

    def preflight(self, origin: str, allowed_methods: list[str]) -> list[tuple[str, str]]:
        """The headers of a `204` answering a preflight (`OPTIONS` with
        `Access-Control-Request-Method`) from an allowed origin, for a route that allows
        `allowed_methods`."""
        return [
            ("access-control-allow-origin", origin),
            ("access-control-allow-methods", ", ".join(allowed_methods)),
            ("access-control-allow-headers", _ALLOW_HEADERS),
            ("access-control-max-age", _MAX_AGE),
            ("vary", "Origin"),
        ]
