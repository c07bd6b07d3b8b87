"""`GET /metrics`: the service's metrics in the Prometheus text format (scope `admin`)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST

from ..observability.metrics import Metrics
from ..protocol.errors import ProblemError
from ..security.scopes import ADMIN
from .face import Route
from .request import Request
from .wire import LMSP_VERSION

__all__ = ["MetricsRoutes"]


class MetricsRoutes:
    def __init__(self, metrics: Metrics | None) -> None:
        self.metrics = metrics

    def routes(self) -> list[Route]:
        return [Route("GET", "/metrics", self.get_metrics, ADMIN)]

    async def get_metrics(self, req: Request) -> None:
        if self.metrics is None:
            raise ProblemError("not_found", "this service keeps no metrics (it was started with --no-metrics)")
        headers = [("content-type", CONTENT_TYPE_LATEST), ("lmsp-version", LMSP_VERSION)]
        req.proto.response_bytes(200, headers, self.metrics.exposition())
