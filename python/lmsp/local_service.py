"""Finding a service at a URL, and starting one on this machine when none answers (what
`lmsp run` does, as `ollama run` does)."""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["LocalService", "ServiceError", "answers", "stop_process"]


class ServiceError(Exception):
    """No service answers, and none could be started."""


def answers(url: str, timeout: float = 2) -> bool:
    """Whether an LMSP service answers at `url` (its root); 401 is an answer too (tokens)."""
    try:
        with urllib.request.urlopen(f"{url}/lmsp/v1/models", timeout=timeout) as r:
            return bool(r.status == 200)
    except urllib.error.HTTPError as error:
        return error.code == 401
    except OSError:
        return False


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LocalService:
    """`lmsp serve` as a child process on the URL's host and port, for as long as this object
    is open. Stopped at close: nothing outlives the command that started it unasked (there is
    no `lmsp stop`), and the embedded model loads again in a second or two."""

    def __init__(self, url: str, model_dirs: list[str], timeout: float = 120) -> None:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.scheme != "http" or not _loopback(host):
            raise ServiceError(
                f"no service answers at {url}, and only one on this machine (http://127.0.0.1:…) can be started"
            )
        self._log = tempfile.NamedTemporaryFile(prefix="lmsp-serve-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "lmsp", "serve", "--host", host, "--port", str(parts.port or 80)]
        cmd += ["--drain-timeout", "0"]  # no balancer to hand work to: its stop is the command's end
        for folder in model_dirs:
            cmd += ["--model-dir", folder]
        # A session of its own: the Ctrl-C that stops a generation in the terminal must not
        # reach the service too.
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not answers(url, timeout=1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise ServiceError(
                    f"`lmsp serve` did not start:\n{Path(self._log.name).read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.1)

    def close(self) -> None:
        if self.proc.poll() is None:
            stop_process(self.proc)
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
