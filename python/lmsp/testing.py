"""A real `lmsp serve` in a child process, for tests and benchmarks (real granian, real socket)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from .local_service import answers, stop_process

__all__ = ["RunningServer", "free_port", "start_server", "stop_process"]


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


def start_server(workdir: Path, *args: str, timeout: float = 120) -> RunningServer:
    """Starts `python -m lmsp serve ARGS` on a free port with a fresh data folder; waits until
    it answers."""
    port = free_port()
    log_path = workdir / f"server-{port}.log"
    env = {**os.environ, "LMSP_HOME": str(workdir / f"home-{port}")}
    cmd = [sys.executable, "-m", "lmsp", "serve", "--port", str(port), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = RunningServer(proc, port, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"lmsp serve exited with {proc.returncode}:\n{log_path.read_text()}")
        if answers(server.url):
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"lmsp serve did not answer within {timeout} s:\n{log_path.read_text()}")
