"""Discovery of the models a user already has: Ollama's store, the Hugging Face hub cache and
LM Studio's folder, in their real layouts under a temporary HOME (the real user folders are
never read), each holding the embedded GGUF."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from lmsp.engine.discovery import Store, scan, stores
from lmsp.engine.registry import ModelEntry, discover
from lmsp.testing import isolated_env
from model_stores import OLLAMA_MODEL, embedded, hub_repo, lmstudio_model, ollama_model

MODEL = "smollm2:135m-instruct-q4_1"
HUB = "hf.co/HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1"  # the id Ollama gives it


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the embedded GGUF: another file (inode) holding the same model."""
    path = tmp_path_factory.mktemp("copy") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    path.write_bytes(embedded().read_bytes())
    return path


def _home(tmp_path: Path, copy: Path) -> Path:
    """A HOME with one model in each store, at the places the tools use by default."""
    home = tmp_path / "home"
    ollama_model(home / ".ollama" / "models", "tinyllama", "1b", copy)
    hub_repo(
        home / ".cache" / "huggingface" / "hub",
        "HuggingFaceTB",
        "SmolLM2-135M-Instruct-GGUF",
        {"Smol-Hub.Q4_1.gguf": copy},
    )
    lmstudio_model(home / ".lmstudio" / "models", "lmstudio-community", "Smol-GGUF", {"Smol-Studio.Q4_1.gguf": copy})
    return home


def _found(entries: list[ModelEntry]) -> dict[str, str]:
    return {e.id: e.source for e in entries}


def test_each_store_in_its_default_place(tmp_path, copy):
    home = _home(tmp_path, copy)  # each store holds a copy of its own: three files
    entries = discover([], include_embedded=False, env={}, home=home)
    assert _found(entries) == {"tinyllama:1b": "ollama", HUB: "huggingface", "smol:studio-q4_1": "lmstudio"}
    by_id = {e.id: e for e in entries}
    # The hub's model is read through its snapshot link, which names it; the blob is a hash.
    assert by_id[HUB].path.is_symlink()
    assert by_id[HUB].path.parent.parent.name == "snapshots"


def test_the_tools_own_variables_move_the_stores(tmp_path, copy):
    ollama_model(tmp_path / "ollama", "smol", "latest", copy)
    hub_repo(tmp_path / "hf-home" / "hub", "org", "Repo", {"Home-Hub.gguf": copy})
    hub_repo(tmp_path / "hub-cache", "org", "Repo", {"Cache-Hub.gguf": copy})
    env = {"OLLAMA_MODELS": str(tmp_path / "ollama"), "HF_HOME": str(tmp_path / "hf-home")}
    assert [s.root for s in stores(env, tmp_path / "nobody")][:2] == [tmp_path / "ollama", tmp_path / "hf-home" / "hub"]
    assert set(_found(discover([], include_embedded=False, env=env, home=tmp_path))) == {
        "smol:latest",
        "hf.co/org/Repo:Home-Hub",
    }
    env["HF_HUB_CACHE"] = str(tmp_path / "hub-cache")  # wins over HF_HOME, as in huggingface_hub
    assert set(_found(discover([], include_embedded=False, env=env, home=tmp_path))) == {
        "smol:latest",
        "hf.co/org/Repo:Cache-Hub",
    }


def test_ollama_ids_are_ollama_s_own(tmp_path):
    root = tmp_path / "ollama"
    for i, (registry, namespace, name, tag) in enumerate(
        [
            ("registry.ollama.ai", "library", "llama3.2", "3b"),
            ("registry.ollama.ai", "someone", "coder", "7b-q4_K_M"),
            ("hf.co", "bartowski", "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"),
        ]
    ):
        blob = tmp_path / f"model-{i}.gguf"
        blob.write_bytes(b"GGUF" + bytes([i]) * 64)  # discovery reads the magic, nothing more
        ollama_model(root, name, tag, blob, namespace=namespace, registry=registry)
    found = scan(Store("ollama", root))
    assert [f.name for f in found] == [
        "hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
        "llama3.2:3b",
        "someone/coder:7b-q4_K_M",
    ]
    assert all(f.path.parent == root / "blobs" and f.path.name.startswith("sha256-") for f in found)


def test_the_same_file_in_several_places_is_one_model(tmp_path, copy):
    home = tmp_path / "home"
    ollama = home / ".ollama" / "models"
    blob = ollama_model(ollama, "smol", "latest", copy)
    ollama_model(ollama, "smol", "135m", copy)  # a second tag of the same blob
    studio = home / ".lmstudio" / "models" / "pub" / "smol"
    studio.mkdir(parents=True)
    os.link(blob, studio / "Smol-Linked.gguf")  # a hard link of Ollama's blob
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    (model_dir / "Smol-Symlink.gguf").symlink_to(embedded())
    (model_dir / "Other.gguf").symlink_to(copy)
    entries = discover([model_dir], env={}, home=home)
    # The embedded model and the link to it are one; Ollama's blob, its two tags and the hard
    # link to it in LM Studio's folder, another (the first tag, in order, names it).
    assert _found(entries) == {MODEL: "embedded", "other:latest": "model-dir", "smol:135m": "ollama"}


def test_split_ggufs_are_one_model_when_every_shard_is_there(tmp_path):
    snapshot_files = {}
    for stem, present in (("Big-Model-Q4_K_M", (1, 2, 3)), ("Half-Downloaded-Q8_0", (1, 3))):
        for k in present:
            shard = tmp_path / f"{stem}-{k:05d}-of-00003.gguf"
            shard.write_bytes(b"GGUF" + stem.encode() + bytes([k]))
            snapshot_files[f"Q4/{shard.name}"] = shard
    hub = tmp_path / "hub"
    hub_repo(hub, "org", "Big-GGUF", snapshot_files)
    [found] = scan(Store("huggingface", hub))
    assert found.path.name == "Big-Model-Q4_K_M-00001-of-00003.gguf"
    entries = discover([], include_embedded=False, env={"HF_HUB_CACHE": str(hub)}, home=tmp_path)
    assert _found(entries) == {"hf.co/org/Big-GGUF:Q4_K_M": "huggingface"}


def test_nothing_outside_a_store_is_opened(tmp_path, copy):
    home = tmp_path / "home"
    outside = tmp_path / "outside.gguf"
    outside.write_bytes(copy.read_bytes()[:4096])
    studio = home / ".lmstudio" / "models" / "pub" / "model"
    studio.mkdir(parents=True)
    (studio / "Escape.gguf").symlink_to(outside)  # a link out of the store
    (studio / "Device.gguf").symlink_to("/dev/zero")
    (studio / "Not-A-Model.gguf").write_bytes(b"<html>rate limited</html>")
    (studio / "mmproj-Vision-F16.gguf").write_bytes(b"GGUF projector")  # no model of its own
    os.mkfifo(studio / "Fifo.gguf")  # opening it would block for ever
    (home / ".lmstudio" / "models" / "pub" / "linked").symlink_to(tmp_path, target_is_directory=True)
    ollama = home / ".ollama" / "models"
    (ollama / "blobs").mkdir(parents=True)
    manifests = ollama / "manifests" / "registry.ollama.ai" / "library"
    for name, digest in (("escape", "sha256:../../../outside"), ("short", "sha256:abc"), ("odd", 7)):
        (manifests / name).mkdir(parents=True)
        (manifests / name / "latest").write_bytes(
            orjson.dumps({"layers": [{"mediaType": OLLAMA_MODEL, "digest": digest}]})
        )
    (manifests / "broken").mkdir()
    (manifests / "broken" / "latest").write_text("{not json")
    (manifests / "..hidden").mkdir()  # not a name Ollama makes: no id may come from it
    (manifests / "..hidden" / "latest").symlink_to(outside)
    hub = home / ".cache" / "huggingface" / "hub" / "models--org--repo" / "snapshots" / "rev"
    hub.mkdir(parents=True)
    (hub / "Escape.gguf").symlink_to(outside)
    (hub / "Dangling.gguf").symlink_to(hub / "nowhere")
    # Beside all that, one good model in each store: the only ones found.
    good = tmp_path / "good.gguf"
    good.write_bytes(b"GGUF good")
    ollama_model(ollama, "good", "latest", good)
    lmstudio_model(home / ".lmstudio" / "models", "pub", "model", {"Good-Studio.gguf": good})
    hub_repo(home / ".cache" / "huggingface" / "hub", "org", "repo", {"Good-Hub.gguf": good}, revision="rev")
    found = _found(discover([], include_embedded=False, env={}, home=home))
    assert found == {"good:latest": "ollama", "hf.co/org/repo:Good-Hub": "huggingface", "good:studio": "lmstudio"}


def _lmsp_models(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # No service at that URL: `lmsp models` lists what `serve` would offer.
    return subprocess.run(
        [sys.executable, "-m", "lmsp", "models", "--url", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=isolated_env(home),
    )


def test_lmsp_models_says_where_each_came_from(tmp_path, copy):
    home = _home(tmp_path, copy)
    result = _lmsp_models(home)
    assert result.returncode == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [(r[0], r[1]) for r in rows] == [
        (MODEL, "embedded"),
        ("tinyllama:1b", "ollama"),
        (HUB, "huggingface"),
        ("smol:studio-q4_1", "lmstudio"),
    ]
    assert all(Path(r[2]).is_file() for r in rows)
    result = _lmsp_models(home, "--no-discover")
    assert [line.split("\t")[:2] for line in result.stdout.splitlines()] == [[MODEL, "embedded"]]
