"""Real Redis and PostgreSQL servers for the tests and the benchmarks, from the distribution's
packages (`redis-server`, `postgresql`), and nginx as the balancer in front of replicas
(`nginx`): each on a free loopback port, in a temporary folder, stopped after. Tests that need
one skip, saying why, when its binaries are not installed (`missing_servers()`,
`missing_nginx()`). Beside `lmsp.testing` so that tests/ and bench/ share it without bench
importing from tests/."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .testing import free_port, stop_process

__all__ = [
    "NginxBalancer",
    "RedisProcess",
    "missing_nginx",
    "missing_servers",
    "new_database",
    "nginx_balancer",
    "nginx_config",
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


NGINX = Path("/usr/sbin/nginx")


def missing_nginx() -> str | None:
    """Why the balancer tests cannot run here, or None."""
    return None if NGINX.exists() else "nginx is not installed (apt-get install nginx)"


def nginx_config(upstreams: list[str], listen: str, folder: Path | None = None) -> str:
    """The `http`-level config of a round-robin balancer over lmsp replicas (`host:port` each),
    the one the docs show. With `folder`, the temp paths and logs go there (the fixture's own
    nginx, which must not touch /var); without it, nginx's packaged defaults stay."""
    paths = ""
    if folder is not None:
        paths = "".join(
            f"    {name}_temp_path {folder / name};\n" for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        paths += f"    access_log {folder / 'access.log'} balancer;\n"
    servers = "".join(f"        server {address} max_fails=0;\n" for address in upstreams)
    return f"""\
    log_format balancer '$remote_addr "$request" $status -> $upstream_addr $upstream_status';
{paths}\
    upstream lmsp {{
        # max_fails=0: each request tries the replicas in turn and never marks one down for a
        # while; nginx OSS has no active probe, and a passive mark-down of the replica that just
        # came back, taken while its sibling drains, would leave none ("no live upstreams").
{servers}\
        keepalive 32;
    }}
    server {{
        listen {listen};
        client_max_body_size 0;          # lmsp enforces its own request limits
        location / {{
            proxy_pass http://lmsp;
            proxy_http_version 1.1;      # keep-alive to the replicas, chunked streams
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;   # the name the client asked for (lmsp's Host rules)
            proxy_buffering off;         # SSE: every event out as it comes, not when a buffer fills
            proxy_read_timeout 1h;       # a task's reader may wait long for the next event
            proxy_connect_timeout 5s;
            # A draining replica answers new work with 503 + Retry-After: send it to the next one,
            # POSTs included (nothing was started on the replica that refused it). A refused or
            # reset connection (a replica gone) goes to the next one too.
            proxy_next_upstream error timeout http_503 non_idempotent;
        }}
    }}
"""


class NginxBalancer:
    """An nginx this process started in front of `upstreams` (`http://host:port` each), on a free
    loopback port. `set_upstreams` rewrites the list and reloads (SIGHUP): running streams stay
    with the old workers to their end, new connections take the new list."""

    def __init__(self, folder: Path, upstreams: list[str]) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.control_port = free_port()
        self.conf = folder / "nginx.conf"
        self.log = folder / "error.log"
        self.access_log = folder / "access.log"
        self.generation = 0
        self._write(upstreams)
        cmd = [str(NGINX), "-p", str(folder), "-c", str(self.conf), "-e", str(self.log)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def _write(self, upstreams: list[str]) -> None:
        addresses = [url.removeprefix("http://").rstrip("/") for url in upstreams]
        # As root, nginx's workers would switch to `nobody`, who cannot use this 0700 folder.
        user = "user root root;\n" if os.geteuid() == 0 else ""
        self.conf.write_text(
            f"""daemon off;
master_process on;
worker_processes 1;
{user}pid {self.folder / "nginx.pid"};
error_log {self.log} notice;
events {{ worker_connections 1024; }}
http {{
{nginx_config(addresses, f"127.0.0.1:{self.port}", self.folder)}
    # The fixture's own: which config generation the workers run (tells a reload took effect).
    server {{
        listen 127.0.0.1:{self.control_port};
        location = /generation {{ return 200 "{self.generation}"; }}
    }}
}}
"""
        )

    def running_generation(self) -> int | None:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.control_port}/generation", timeout=2) as r:
                return int(r.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def ready(self) -> bool:
        return self.running_generation() == self.generation

    def _old_workers_quit(self) -> int:
        # Logged by each old worker as it closes its listening socket on a reload; until then it
        # may still accept a new connection with the old list.
        return self.log.read_text(errors="replace").count("gracefully shutting down")

    def set_upstreams(self, upstreams: list[str]) -> None:
        """Balances over `upstreams` from now on: the config is checked (`nginx -t`), then
        nginx reloads; returns once new connections get the new list."""
        self.generation += 1
        self._write(upstreams)
        check = subprocess.run(
            [str(NGINX), "-t", "-q", "-p", str(self.folder), "-c", str(self.conf), "-e", str(self.log)],
            capture_output=True,
            text=True,
        )
        if check.returncode != 0:
            raise RuntimeError(f"nginx refused the config:\n{check.stderr}")
        quit_before = self._old_workers_quit()
        self.proc.send_signal(signal.SIGHUP)
        _wait(lambda: self._old_workers_quit() > quit_before and self.ready(), self.proc, self.log, "nginx reload", 30)
        time.sleep(0.1)  # the old worker closes its socket just after it logs so


@contextmanager
def nginx_balancer(upstreams: list[str]) -> Iterator[NginxBalancer]:
    """nginx from the distribution, round-robin over `upstreams`, on its own folder and port."""
    folder = Path(tempfile.mkdtemp(prefix="lmsp-nginx-"))
    balancer = NginxBalancer(folder, upstreams)
    with _serving(balancer.proc, folder, balancer.log, "nginx", balancer.ready):
        yield balancer
