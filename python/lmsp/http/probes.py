"""`GET /health` and `GET /ready`: what a balancer or an orchestrator probes.

`/health` (liveness) answers 200 for as long as the process serves HTTP; `/ready` (readiness)
answers 200, or 503 with the reasons (service/readiness.py) while this replica should get no
new work. Neither needs a token, as a probe carries none, and neither says anything private:
no model path, no owner, no address of the store or Redis. Without tokens the loopback Host and
client rules hold for them as for every request (security/hosts.py): a probe on the machine
sends a loopback `Host`, and a service with no token listens on loopback only.
"""

from __future__ import annotations

from typing import Any

from ..protocol.errors import ProblemError
from ..service.readiness import Readiness
from .wire import send_json

__all__ = ["HEALTH", "READY", "Probes"]

HEALTH = "/health"
READY = "/ready"
_NO_CACHE = [("cache-control", "no-store")]


class Probes:
    def __init__(self, readiness: Readiness) -> None:
        self.readiness = readiness

    def serves(self, path: str) -> bool:
        return path in (HEALTH, READY)

    def send(self, proto: Any, method: str, path: str) -> None:
        if method != "GET":
            raise ProblemError("method_not_allowed", f"{method} is not allowed on {path}", headers=[("allow", "GET")])
        if path == HEALTH:
            send_json(proto, 200, {"status": "ok"}, _NO_CACHE)
            return
        reasons = self.readiness.reasons()
        if reasons:
            send_json(proto, 503, {"status": "not_ready", "reasons": reasons}, _NO_CACHE)
        else:
            send_json(proto, 200, {"status": "ready"}, _NO_CACHE)
