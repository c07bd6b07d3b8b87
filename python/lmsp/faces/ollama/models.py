"""`/api/tags`, `/api/show` and `/api/ps` bodies from the model manager's descriptions and each
file's GGUF header (read, not loaded)."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from typing import Any

from ...engine.gguf import FILE_TYPES, gguf_facts
from ...engine.registry import ModelEntry

__all__ = ["OLLAMA_VERSION", "model_details", "ps_entry", "show_body", "tags_entry"]

# The Ollama API this face speaks, as `/api/version` says it: clients (Open WebUI, editor
# plugins) turn features on by this number, and lmsp's own version would read as an old Ollama.
OLLAMA_VERSION = "0.12.6"
_BLOB = re.compile(r"sha256-([0-9a-f]{64})")


def _facts(entry: ModelEntry | None) -> dict[str, Any]:
    return gguf_facts(entry.path) if entry is not None else {}


def _digest(model_id: str, entry: ModelEntry | None) -> str:
    """Ollama's blob digest where the file is one of its blobs; else a digest of the file's
    identity (path, size, time), not of its bytes: hashing gigabytes to list models would not do."""
    if entry is None:
        return hashlib.sha256(model_id.encode()).hexdigest()
    if match := _BLOB.fullmatch(entry.path.name):
        return match[1]
    try:
        st = entry.path.stat()
        identity = f"{entry.path}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        identity = str(entry.path)
    return hashlib.sha256(identity.encode()).hexdigest()


def _size(entry: ModelEntry | None) -> int:
    try:
        return entry.path.stat().st_size if entry is not None else 0
    except OSError:
        return 0


def _modified(entry: ModelEntry | None) -> str:
    try:
        mtime = entry.path.stat().st_mtime if entry is not None else 0.0
    except OSError:
        mtime = 0.0
    return datetime.fromtimestamp(mtime, timezone.utc).isoformat().replace("+00:00", "Z")


def model_details(facts: dict[str, Any]) -> dict[str, Any]:
    arch = facts.get("general.architecture") or ""
    count = facts.get("general.parameter_count")
    size = facts.get("general.size_label") or (f"{count / 1e9:.1f}B" if isinstance(count, int) and count else "")
    file_type = facts.get("general.file_type")
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch] if arch else None,
        "parameter_size": size,
        "quantization_level": FILE_TYPES.get(file_type, "") if isinstance(file_type, int) else "",
    }


def tags_entry(model_id: str, entry: ModelEntry | None) -> dict[str, Any]:
    return {
        "name": model_id,
        "model": model_id,
        "modified_at": _modified(entry),
        "size": _size(entry),
        "digest": _digest(model_id, entry),
        "details": model_details(_facts(entry)),
    }


def ps_entry(model_id: str, entry: ModelEntry | None, context_window: int) -> dict[str, Any]:
    return {
        "name": model_id,
        "model": model_id,
        "size": _size(entry),
        "digest": _digest(model_id, entry),
        "details": model_details(_facts(entry)),
        # lmsp unloads a model once it has been idle --keep-alive seconds, counted from its
        # last request's end, which this list does not know: no time is promised.
        "expires_at": None,
        "size_vram": 0,
        "context_length": context_window,
    }


def _capabilities(described: dict[str, Any]) -> list[str]:
    own = set(described["capabilities"])
    capabilities = ["completion"]
    if "tools" in own:
        capabilities.append("tools")
    if described["backend"] == "llama.cpp":
        capabilities.append("embedding")
    return capabilities


def show_body(described: dict[str, Any], entry: ModelEntry | None) -> dict[str, Any]:
    facts = _facts(entry)
    info = {k: v for k, v in facts.items() if not k.startswith("tokenizer.")}
    template = facts.get("tokenizer.chat_template") or ""
    return {
        "license": facts.get("general.license") or "",
        # A Modelfile that builds on this model by its name (Ollama's `FROM <model>`). Ollama
        # writes its blob's absolute path here; lmsp names no path in any answer: a client may
        # be on another machine, and the folder layout (user name, home) is not its business.
        "modelfile": f"# served read-only by lmsp\nFROM {described['id']}\n",
        "parameters": "",
        "template": template,
        "details": model_details(facts),
        "model_info": info,
        "capabilities": _capabilities(described),
        "modified_at": _modified(entry),
    }
