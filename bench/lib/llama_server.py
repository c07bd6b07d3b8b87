"""llama.cpp built natively (for this CPU, `CMAKE_ARGS` added) from the sources inside
llama-cpp-python's sdist (the same llama.cpp our service runs): its own `llama-server`, the
baseline the concurrency bench measures against in the same run, and its shared libraries,
which lmsp loads instead of the portable wheel's (`LLAMA_CPP_LIB_PATH`) for the portable ÷
native figure. Built once per version and flags, then cached."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

from lmsp.testing import stop_process

__all__ = ["LlamaServer", "ensure_llama_server", "ensure_native_libs"]

CACHE = Path(os.environ.get("LMSP_BENCH_CACHE", Path.home() / ".cache" / "lmsp-bench"))


def ensure_llama_server() -> Path:
    """The llama-server binary for the installed llama-cpp-python version (built if missing)."""
    return _native_build() / "llama-server"


def ensure_native_libs() -> Path:
    """The folder of the native build's libllama and libggml, for `LLAMA_CPP_LIB_PATH`."""
    return _native_build()


def _native_build() -> Path:
    """The cached native build: llama-server and the shared libraries it runs on, side by side
    (their RPATH is $ORIGIN, so the folder can move)."""
    ver = version("llama-cpp-python")
    flags = os.environ.get("CMAKE_ARGS", "")
    key = hashlib.sha256(flags.encode()).hexdigest()[:12]
    out = CACHE / f"llama.cpp-{ver}-native-{key}"
    if (out / "llama-server").is_file():
        return out
    cmake = _cmake()
    with tempfile.TemporaryDirectory() as tmp:
        _run(
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
            f"downloading the llama-cpp-python {ver} sources",
        )
        [sdist] = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        src = Path(tmp) / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp"
        build = src / "build"
        _run(
            [
                cmake,
                "-S",
                str(src),
                "-B",
                str(build),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_CURL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                # Shared, as llama-cpp-python's own build: the same libraries serve lmsp too.
                "-DBUILD_SHARED_LIBS=ON",
                "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
                "-DCMAKE_INSTALL_RPATH=$ORIGIN",
                # This CPU's kernels (GGML_NATIVE is llama.cpp's default), less what CMAKE_ARGS
                # turns off (.ci/run: AMX, which these VMs report without granting it).
                *shlex.split(flags),
            ],
            "configuring llama.cpp",
        )
        _run(
            [cmake, "--build", str(build), "--target", "llama-server", "llama", f"-j{os.cpu_count() or 1}"],
            "building llama-server",
        )
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for built in [build / "bin" / "llama-server", *(build / "bin").glob("*.so*")]:
            shutil.copy2(built, partial / built.name, follow_symlinks=False)
        partial.rename(out)  # whole or not at all: a build cut short is not taken for a cache
    return out


def _cmake() -> str:
    """cmake from the test extras (PyPI's `cmake` puts it beside this Python), else the PATH's."""
    scripts = sysconfig.get_path("scripts")
    found = shutil.which("cmake", path=os.pathsep.join([scripts, os.environ.get("PATH", "")]))
    if found is None:
        raise RuntimeError("building llama-server needs cmake: pip install -r locks/test.txt brings it")
    return found


def _run(cmd: list[str], what: str) -> None:
    """Quiet unless it fails (a compiler's warnings would bury the benchmark's figures); the
    error leads with what failed, then the output's tail."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed: {(done.stdout + done.stderr)[-3000:]}")


class LlamaServer:
    """`llama-server -np N` on the embedded model, with the thread count our service uses."""

    def __init__(
        self, binary: Path, model: Path, port: int, parallel: int, ctx_per_seq: int = 4096, extra: tuple[str, ...] = ()
    ) -> None:
        """`extra`: more llama-server arguments (its n-gram speculation, bench_drafts.py)."""
        threads = str(os.cpu_count() or 1)
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [
                str(binary),
                "-m",
                str(model),
                "--port",
                str(port),
                "-t",
                threads,
                "-tb",
                threads,
                "-np",
                str(parallel),
                "-c",
                str(ctx_per_seq * parallel),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("llama-server did not come up")

    def stop(self) -> None:
        stop_process(self.proc)
