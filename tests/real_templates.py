"""Real chat templates of models that render tools themselves, as test fixtures.

They are not copied into this repository: llama.cpp keeps the published templates of many
models under `models/templates/`, and the llama-cpp-python sdist we already install from
carries that folder. The sdist is downloaded once (pip, the same registry as every install)
and kept in a cache folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

__all__ = ["real_template"]

CACHE = Path(os.environ.get("LMSP_TEST_CACHE", Path.home() / ".cache" / "lmsp-tests"))


def _templates_dir() -> Path:
    ver = version("llama-cpp-python")
    folder = CACHE / f"llama-cpp-python-{ver}-templates"
    if folder.is_dir():
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                "llama-cpp-python",
                f"llama-cpp-python=={ver}",
                "-d",
                tmp,
            ],
            check=True,
        )
        [sdist] = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=CACHE))
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if "/models/templates/" in m.name and m.name.endswith(".jinja")]
            for member in members:
                member.name = Path(member.name).name
            tar.extractall(staging, members=members, filter="data")
    staging.rename(folder)  # whole or not at all: a cut download leaves no half folder behind
    return folder


def real_template(name: str) -> str:
    """The text of `models/templates/<name>.jinja` as llama.cpp ships it."""
    return (_templates_dir() / f"{name}.jinja").read_text()
