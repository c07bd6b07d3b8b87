"""The GGUF files a user already has: Ollama's store, the Hugging Face hub cache, LM Studio's
models folder, and folders named with `--model-dir`.

Each store is read in its own layout and nothing outside its folder is opened: a link that
leads out of a store (or to anything but a regular file) is skipped. A model split into
`-00001-of-0000N.gguf` shards is one model, found by its first shard (llama.cpp loads the
others from beside it).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = ["Found", "Moved", "Store", "confirm", "scan", "shards", "split_stem", "stores"]

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
# Ollama's own name rules: what a part of a name may hold. A part outside them (a folder
# someone made by hand) is no model of Ollama's, and never becomes part of an id.
_OLLAMA_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
# A manifest is a few hundred bytes; anything much larger is not one.
_MAX_MANIFEST = 1 << 20
_QUANT = re.compile(r"(?:^|[-._])(I?Q\d[A-Za-z0-9_]*|BF16|F16|F32)$", re.IGNORECASE)
_SPLIT = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)


@dataclass(frozen=True)
class Store:
    source: str
    root: Path


@dataclass(frozen=True)
class Found:
    """A model file and, when its store names it (Ollama), the id it goes by there."""

    path: Path
    source: str
    name: str | None = None
    # The folder its file must still lie in when it loads (None: a `--model-dir`'s, whose links
    # the user made: its file must then be the very one found).
    root: Path | None = None


def stores(env: Mapping[str, str] | None = None, home: Path | None = None) -> list[Store]:
    """The stores of this user, where each tool keeps them (the tools' own variables first)."""
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    ollama = Path(env["OLLAMA_MODELS"]) if env.get("OLLAMA_MODELS") else home / ".ollama" / "models"
    # huggingface_hub's own order: HF_HUB_CACHE, else HF_HOME/hub, else the XDG cache.
    if env.get("HF_HUB_CACHE"):
        hub = Path(env["HF_HUB_CACHE"])
    elif env.get("HF_HOME"):
        hub = Path(env["HF_HOME"]) / "hub"
    else:
        hub = Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "huggingface" / "hub"
    return [
        Store("ollama", ollama.expanduser()),
        Store("huggingface", hub.expanduser()),
        Store("lmstudio", home / ".lmstudio" / "models"),
    ]


def scan(store: Store) -> list[Found]:
    """The models in one store, in a stable order; a store that is not there holds none."""
    if not store.root.is_dir():
        return []
    if store.source == "ollama":
        return list(_ollama(store.root))
    if store.source == "huggingface":
        return list(_huggingface(store.root))
    if store.source == "lmstudio":
        return [Found(p, store.source, root=store.root) for p in _lmstudio(store.root)]
    return [Found(p, store.source) for p in _models_in(_walk(store.root), confine=None)]


def _inside(path: Path, root: Path) -> Path | None:
    """The regular file `path` leads to, when that file lies inside `root`."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # a dangling link or a loop
        return None
    if not real.is_relative_to(root.resolve()) or not real.is_file():
        return None
    return path


def _is_gguf(path: Path) -> bool:
    """A store may hold a download cut short or a file of another kind: such a file is not
    served (a `--model-dir` file that is no GGUF stops `serve` instead, naming it)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _dirs(folder: Path) -> list[Path]:
    """Sub-folders, sorted; links to folders are not followed (they may lead anywhere)."""
    try:
        return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def _ollama(root: Path) -> Iterator[Found]:
    """`manifests/<registry>/<namespace>/<name>/<tag>`: JSON naming the model layer, whose
    blob `blobs/sha256-<hex>` is the GGUF. The id is Ollama's: `name:tag`, with the namespace
    when it is not `library` and the registry when it is not Ollama's."""
    for registry in _dirs(root / "manifests"):
        for namespace in _dirs(registry):
            for name in _dirs(namespace):
                try:
                    tags = sorted(p for p in name.iterdir() if not p.is_dir())
                except OSError:
                    continue
                for tag in tags:
                    parts = (registry.name, namespace.name, name.name, tag.name)
                    if not all(_OLLAMA_PART.fullmatch(p) for p in parts):
                        continue
                    blob = _ollama_blob(root, tag)
                    if blob is not None:
                        yield Found(blob, "ollama", _ollama_name(*parts), root)


def _ollama_name(registry: str, namespace: str, name: str, tag: str) -> str:
    if registry != OLLAMA_REGISTRY:
        return f"{registry}/{namespace}/{name}:{tag}"
    return f"{name}:{tag}" if namespace == "library" else f"{namespace}/{name}:{tag}"


def _ollama_blob(root: Path, manifest: Path) -> Path | None:
    if _inside(manifest, root) is None:
        return None
    try:
        with manifest.open("rb") as f:
            data = orjson.loads(f.read(_MAX_MANIFEST + 1))
    except (OSError, orjson.JSONDecodeError):
        return None
    layers = data.get("layers") if isinstance(data, dict) else None
    for layer in layers if isinstance(layers, list) else []:
        if isinstance(layer, dict) and layer.get("mediaType") == OLLAMA_MODEL_LAYER:
            digest = _DIGEST.fullmatch(str(layer.get("digest", "")))
            blob = root / "blobs" / f"sha256-{digest[1]}" if digest is not None else None
            return blob if blob is not None and _inside(blob, root) and _is_gguf(blob) else None
    return None


def _huggingface(root: Path) -> Iterator[Found]:
    """`models--<org>--<name>/snapshots/<rev>/**/*.gguf`, each a link into the repo's blobs.
    A repo with several revisions: the one `refs/main` names, else every one. The id is the
    one Ollama gives a model pulled from the hub: `hf.co/<org>/<name>:<quantization>`."""
    for repo in _dirs(root):
        org, _, name = repo.name.removeprefix("models--").partition("--")
        if not repo.name.startswith("models--") or not (_OLLAMA_PART.fullmatch(org) and _OLLAMA_PART.fullmatch(name)):
            continue
        revisions = _dirs(repo / "snapshots")
        main = _read_small(repo / "refs" / "main", root)
        current = [r for r in revisions if r.name == main]
        for revision in current or revisions:
            for path in _models_in(_walk(revision), confine=root):
                yield Found(path, "huggingface", f"hf.co/{org}/{name}:{_hub_tag(split_stem(path))}", root)


def _hub_tag(stem: str) -> str:
    """The quantization a file name ends with (`…-Q4_K_M`, `….IQ3_XXS`, `-bf16`), else the
    name itself, in the characters a tag may hold."""
    quant = _QUANT.search(stem)
    tag = quant[1] if quant is not None else re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip("-.")
    return tag[:80] or "latest"


def _lmstudio(root: Path) -> Iterator[Path]:
    """`<publisher>/<model>/*.gguf`."""
    for publisher in _dirs(root):
        for model in _dirs(publisher):
            try:
                files = sorted(model.iterdir())
            except OSError:
                continue
            yield from _models_in(files, confine=root)


def _read_small(path: Path, root: Path) -> str | None:
    if _inside(path, root) is None:
        return None
    try:
        with path.open("rb") as f:
            return f.read(256).decode("ascii", "replace").strip()
    except OSError:
        return None


def _walk(folder: Path) -> list[Path]:
    """Every file under `folder`, sorted, without following links to folders."""
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        found.extend(Path(dirpath) / f for f in sorted(filenames))
    return found


def _models_in(files: list[Path], *, confine: Path | None) -> Iterator[Path]:
    """The GGUF models among `files`: single files, and the first shard of each split whose
    shards are all there. `confine`: the folder every file must lie in (None: `--model-dir`,
    whose links the user made)."""
    shards: dict[tuple[Path, str, int], dict[int, Path]] = {}
    for path in files:
        if not path.name.lower().endswith(".gguf") or path.name.lower().startswith("mmproj"):
            continue  # a vision projector is no model of its own
        if confine is not None and (_inside(path, confine) is None or not _is_gguf(path)):
            continue
        if confine is None and not path.is_file():  # no FIFOs, devices or links to them
            continue
        split = _SPLIT.fullmatch(path.name)
        if split is None:
            yield path
            continue
        shards.setdefault((path.parent, split["stem"], int(split["count"])), {})[int(split["no"])] = path
    for (_, _, count), numbered in sorted(shards.items()):
        if set(numbered) == set(range(1, count + 1)):  # a download still under way is not a model yet
            yield numbered[1]


def shards(path: Path) -> list[Path]:
    """The files of the model whose first shard is `path`: all of a split's, else `path`."""
    split = _SPLIT.fullmatch(path.name)
    if split is None:
        return [path]
    count = int(split["count"])
    return [path.with_name(f"{split['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


class Moved(Exception):
    """A model's file is no longer the one discovery found, or no longer where it may be: it
    is not loaded. The message names no path (clients read it)."""


def confirm(path: Path, real: Path, identity: tuple[int, int], root: Path | None) -> None:
    """Before a load: `path` still leads to `real`, the file found (same device and inode), a
    regular file inside `root`. `real` is opened without following a link, and the opened
    file is checked, so a link swapped in since discovery (to a file outside the store, a
    device, a FIFO) is refused rather than read."""
    try:
        now = Path(os.path.realpath(path, strict=True))
    except (OSError, RuntimeError):
        raise Moved("its file is gone or its link leads nowhere since it was found") from None
    if now != real:
        raise Moved("its file's link leads elsewhere than when it was found")
    if root is not None and not real.is_relative_to(root.resolve()):
        raise Moved("its file is outside its store")
    try:
        # O_NONBLOCK: a FIFO swapped in is not waited on; O_NOFOLLOW: a link swapped in is refused.
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise Moved(f"its file cannot be opened ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Moved("its file is no longer a regular file")
    if (st.st_dev, st.st_ino) != identity:
        raise Moved("its file was replaced since it was found")


def split_stem(path: Path) -> str:
    """The file name without `.gguf` and without a split's `-0000k-of-0000N`."""
    split = _SPLIT.fullmatch(path.name)
    return split["stem"] if split is not None else path.stem
