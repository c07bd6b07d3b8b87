"""What a process on this machine costs, read from /proc: resident memory and CPU time (the
server's, from outside it), and the open-files limit raised for many sockets."""

from __future__ import annotations

import os
import resource

__all__ = ["cpu_seconds", "raise_open_files", "rss_kib"]

_TICK = os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def cpu_seconds(pid: int) -> float:
    """User + system time of every thread of `pid` so far (utime, stime of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name (2nd field) may hold spaces; the fields after it may not.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def raise_open_files() -> None:
    """Each stream is a socket here and one in the server (a child: it inherits the limit)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
