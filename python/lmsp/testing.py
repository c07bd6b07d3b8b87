"""A real `lmsp serve` in a child process, for tests and benchmarks (real granian, real socket)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from .local_service import answers, stop_process

__all__ = ["RunningServer", "free_port", "isolated_env", "start_server", "stop_process"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningServer:
    def __init__(self, proc: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path

    def stop(self) -> None:
        stop_process(self.proc)


# Where a user's own models are found (engine.discovery): never read by a test's server.
STORE_VARIABLES = ("OLLAMA_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME")


def isolated_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment with HOME at `home` and none of the model stores' or lmsp's variables
    but `LMSP_CPU_VARIANT` (then `extra`): a child started with it sees no model of the user's,
    and runs the CPU variant its parent does."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in STORE_VARIABLES and (not k.startswith("LMSP_") or k == "LMSP_CPU_VARIANT")
    }
    return {**env, "HOME": str(home), **extra}


def worker_threads() -> int:
    """This test worker's share of the cores, for its servers (`--threads`) and for the
    engines a test builds in its own process: llama.cpp's threads wait for each other by
    spinning, and two engines of two threads each on two cores spend their time waiting for a
    thread the other one holds (a 64-token generation took over a minute so)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def _threads_for_workers() -> dict[str, str]:
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1:
        return {}
    return {"LMSP_THREADS": str(worker_threads())}


def _loading(url: str) -> bool:
    """Whether the service at `url` is still loading the models it preloads (`GET /ready`)."""
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=2):
            return False
    except urllib.error.HTTPError as error:
        return "loading" in json.loads(error.read()).get("reasons", [])
    except OSError:  # not answering (yet, or any more): the caller looks at the process
        return True


def start_server(
    workdir: Path,
    *args: str,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    loaded: bool = True,
    launcher: tuple[str, ...] = (),
) -> RunningServer:
    """Starts `python -m lmsp serve ARGS` on a free port with a fresh data folder; waits until
    it answers and, with `loaded`, until the models it preloads have loaded (it serves before
    that). `env`: the child's environment (default: `isolated_env` under `workdir`);
    `launcher`: what runs the Python, e.g. `("qemu-x86_64", "-cpu", "Nehalem")`."""
    port = free_port()
    log_path = workdir / f"server-{port}.log"
    env = {
        # SIGTERM stops a test's server at once, as before drains existed (the drain tests
        # pass --drain-timeout): a teardown never waits out a task a test left running.
        "LMSP_DRAIN_TIMEOUT": "0",
        **_threads_for_workers(),
        **(env if env is not None else isolated_env(workdir / f"user-{port}")),
        "LMSP_HOME": str(workdir / f"home-{port}"),
    }
    cmd = [*launcher, sys.executable, "-m", "lmsp", "serve", "--port", str(port), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = RunningServer(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lmsp serve exited with {proc.returncode}:\n{log_path.read_text()}")
        # /ready first: the one request that needs a token (a 401 where tokens exist) is made once.
        if not (loaded and _loading(server.url)) and answers(server.url):
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"lmsp serve did not answer within {timeout} s:\n{log_path.read_text()}")
