"""The scopes a token may hold (§10)."""

from __future__ import annotations

__all__ = [
    "ADMIN",
    "EMBEDDINGS_CREATE",
    "MODELS_READ",
    "RESPONSES_READ",
    "RESPONSES_WRITE",
    "SCOPES",
    "TOOLS_EXECUTE",
    "parse_scopes",
]

MODELS_READ = "models:read"
RESPONSES_WRITE = "responses:write"  # create responses and tasks, cancel tasks
RESPONSES_READ = "responses:read"  # stored responses, tasks, their events, continuations
ADMIN = "admin"  # GET /metrics, unloading a model (Ollama's keep_alive 0); later: manage tokens
TOOLS_EXECUTE = "tools:execute"  # reserved: the service runs no tools itself
# Compute embeddings (every face's embeddings route): model time, but nothing stored or generated.
EMBEDDINGS_CREATE = "embeddings:create"

SCOPES = (MODELS_READ, RESPONSES_WRITE, RESPONSES_READ, ADMIN, TOOLS_EXECUTE, EMBEDDINGS_CREATE)


def parse_scopes(text: str) -> frozenset[str]:
    """`a,b` → {a, b}; raises ValueError naming what is not a scope."""
    scopes = frozenset(s.strip() for s in text.split(",") if s.strip())
    if not scopes:
        raise ValueError(f"name at least one scope: {', '.join(SCOPES)}")
    unknown = sorted(scopes - set(SCOPES))
    if unknown:
        raise ValueError(f"not a scope: {', '.join(unknown)} (the scopes are {', '.join(SCOPES)})")
    return scopes
