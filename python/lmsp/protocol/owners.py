"""Who owns what a request makes (§10): every stored record is keyed by its owner."""

from __future__ import annotations

__all__ = ["LOCAL_OWNER"]

# The owner of everything while the service has no tokens: the machine's one user.
LOCAL_OWNER = "local"
