"""The playground: a page to try the service, served from files shipped in the package.

The page holds no secret (it asks for a token when the service has tokens), so it is served
without one; without tokens the loopback Host and client rules hold for it as for every
request. It talks to the service same-origin, and its Content-Security-Policy lets it load and
reach nothing but this origin: no inline script or style, no other site, no frames.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from .wire import LMSP_VERSION

__all__ = ["CONTENT_SECURITY_POLICY", "Playground"]

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}
_INDEX = ("/", "/lmsp/")
ASSETS = "/lmsp/playground/"


class Playground:
    def __init__(self) -> None:
        # Read once: a handful of small files, and a page that cannot change under a running service.
        folder = files("lmsp") / "playground"
        self._files: dict[str, tuple[str, bytes]] = {}
        for entry in folder.iterdir():
            kind = _TYPES.get("." + entry.name.rpartition(".")[2])
            if kind is not None and entry.is_file():
                self._files[ASSETS + entry.name] = (kind, entry.read_bytes())
        index = self._files[ASSETS + "index.html"]
        for path in _INDEX:
            self._files[path] = index

    def serves(self, method: str, path: str) -> bool:
        return method == "GET" and path in self._files

    def send(self, proto: Any, path: str) -> None:
        kind, content = self._files[path]
        proto.response_bytes(
            200,
            [
                ("content-type", kind),
                ("content-security-policy", CONTENT_SECURITY_POLICY),
                ("x-content-type-options", "nosniff"),
                ("referrer-policy", "no-referrer"),
                # A new version of the package serves a new page: always ask.
                ("cache-control", "no-cache"),
                ("lmsp-version", LMSP_VERSION),
            ],
            content,
        )
