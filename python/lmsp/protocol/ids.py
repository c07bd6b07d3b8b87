"""Object ids: a type prefix and a 26-character ULID (profile §6.2)."""

from __future__ import annotations

from ulid import ULID

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{ULID()}"
