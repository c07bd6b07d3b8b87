"""lmsp: a local model service speaking LMSP 1.0, and a client for it (`lmsp.Client`)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("lmsp-server")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

if TYPE_CHECKING:
    from .client import AsyncClient, Client

__all__ = ["AsyncClient", "Client", "__version__"]


def __getattr__(name: str) -> Any:
    # The client is imported when first asked for: `lmsp serve` and its workers never need httpx.
    if name in ("Client", "AsyncClient"):
        from . import client

        return getattr(client, name)
    raise AttributeError(f"module 'lmsp' has no attribute {name!r}")
