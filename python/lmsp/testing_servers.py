"""Real Redis and PostgreSQL servers for the tests and the benchmarks, from the distribution's
packages (`redis-server`, `postgresql`): each on a free loopback port, in a temporary folder,
stopped after. Tests that need one skip, saying why, when its binaries are not installed
(`missing_servers()`). Beside `lmsp.testing` so that tests/ and bench/ share it without bench
importing from tests/."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .testing import free_port, stop_process

__all__ = [
    "RedisProcess",
    "missing_servers",
    "new_database",
    "postgres_pids",
    "postgres_server",
    "redis_process",
    "redis_server",
]


def _postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


def missing_servers() -> str | None:
    """Why the replica tests cannot run here, or None."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (apt-get install redis-server)"
    if _postgres_bin() is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root with no `postgres` user to run PostgreSQL as"
    return None


def _wait(ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        if ready():
            return
        time.sleep(0.1)
    stop_process(proc)
    raise RuntimeError(f"{what} did not start within {timeout} s:\n{log.read_text(errors='replace')}")


@contextmanager
def _serving(
    proc: subprocess.Popen[bytes], folder: Path, log: Path, what: str, ready: Callable[[], bool]
) -> Iterator[None]:
    """Once `ready()`, the server runs for the block; then it is stopped and its folder gone."""
    try:
        _wait(ready, proc, log, what)
        yield
    finally:
        stop_process(proc)
        shutil.rmtree(folder, ignore_errors=True)


class RedisProcess:
    """A redis-server this process started, for tests that inject faults into it: stop it
    with signals, shut it down and start it again on the same port (`restart`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log = folder / "redis.log"
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        cmd += ["--appendonly", "no", "--dir", str(self.folder)]
        with self.log.open("ab") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def ready(self) -> bool:
        import redis

        try:
            with redis.Redis.from_url(self.url, socket_timeout=2) as r:
                return bool(r.ping())
        except redis.RedisError:
            return False

    def restart(self) -> None:
        """Starts it again on the same port, empty (it keeps nothing on disk), once the
        previous process has exited (SHUTDOWN NOSAVE, or a signal)."""
        self.proc.wait(30)
        self.proc = self._start()
        _wait(self.ready, self.proc, self.log, "redis-server")


@contextmanager
def redis_process() -> Iterator[RedisProcess]:
    """A fresh Redis with nothing kept on disk, as a handle on its process."""
    folder = Path(tempfile.mkdtemp(prefix="lmsp-redis-"))
    server = RedisProcess(folder)
    try:
        _wait(server.ready, server.proc, server.log, "redis-server")
        yield server
    finally:
        stop_process(server.proc)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def redis_server() -> Iterator[str]:
    """A redis:// URL of a fresh Redis with nothing kept on disk."""
    with redis_process() as server:
        yield server.url


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: as the `postgres` user the Debian package made.
    # setpriv execs (no process in between), so the fixture's SIGTERM reaches postgres itself.
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres_server() -> Iterator[str]:
    """A postgresql:// URL of a fresh cluster (initdb in a temporary folder)."""
    import psycopg

    bin_dir = _postgres_bin()
    assert bin_dir is not None
    folder = Path(tempfile.mkdtemp(prefix="lmsp-pg-"))
    data = folder / "data"
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    init_log = folder / "initdb.log"
    with init_log.open("wb") as out:
        done = subprocess.run(
            _as_postgres(
                [str(bin_dir / "initdb"), "-D", str(data), "-U", user, "-A", "trust", "-E", "UTF8", "--no-sync"]
            ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed:\n{init_log.read_text(errors='replace')}")
    port = free_port()
    log = folder / "postgres.log"
    cmd = [
        str(bin_dir / "postgres"),
        "-D",
        str(data),
        "-p",
        str(port),
        "-k",
        str(folder),
        "-c",
        "listen_addresses=127.0.0.1",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(_as_postgres(cmd), stdout=out, stderr=subprocess.STDOUT)
    url = f"postgresql://{user}@127.0.0.1:{port}/postgres"

    def ready() -> bool:
        try:
            with psycopg.connect(url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    with _serving(proc, folder, log, "postgres", ready):
        yield url


def new_database(postgres_url: str, name: str) -> str:
    """The URL of a new, empty database `name` on the server at `postgres_url`."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return f"{postgres_url.rpartition('/')[0]}/{name}"


def postgres_pids(postgres_url: str) -> list[int]:
    """Every process of the PostgreSQL server at `postgres_url` that postgres_server started:
    its postmaster (found by its port) and all that descend from it (Linux /proc)."""
    port = postgres_url.rpartition(":")[2].partition("/")[0]
    parents: dict[int, int] = {}
    postmaster = None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(stat.rpartition(")")[2].split()[1])
        if cmdline and cmdline[0].endswith(b"/postgres") and b"-p" in cmdline:
            if cmdline[cmdline.index(b"-p") + 1 :][:1] == [port.encode()]:
                postmaster = pid
    if postmaster is None:
        return []
    found = {postmaster}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in found and pid not in found:
                found.add(pid)
                grew = True
    return sorted(found)
