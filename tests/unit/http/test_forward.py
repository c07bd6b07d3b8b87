"""Which sibling a replica sends a request to (http/forward.py `Forwarder.target`), from the
residency it read at its last beat: one that has the model loaded and is not busy; nobody for
a model loaded here, a model this replica does not serve, or only busy holders (counted as a
fallback, by reason). The real forwarding, through real replicas, is tests/e2e/test_routing.py."""

from __future__ import annotations

import asyncio

from lmsp.events.residency import Board, InProcessResidency, Residence
from lmsp.http.forward import Forwarder, model_of
from lmsp.observability.metrics import Metrics

SERVED = ["smol:a", "smol:b", "smol:c"]


def _forwarder(board: Board, loaded: list[str], metrics: Metrics) -> Forwarder:
    return Forwarder(
        InProcessResidency(board),
        "http://127.0.0.1:1",
        models=lambda: loaded,
        known=lambda model: model in SERVED,
        busy=lambda: False,
        metrics=metrics,
    )


def test_only_a_live_not_busy_holder_of_a_model_not_loaded_here_is_a_target() -> None:
    async def main() -> None:
        board, metrics = Board(), Metrics()
        here = _forwarder(board, ["smol:a"], metrics)
        await InProcessResidency(board).announce(Residence("idle", "http://10.0.0.2:8750", ("smol:a", "smol:b")))
        await InProcessResidency(board).announce(Residence("full", "http://10.0.0.3:8750", ("smol:c",), busy=True))
        await here.beat()
        target = here.target("smol:b")
        assert target is not None and target.replica == "idle"
        assert here.target("smol:a") is None  # loaded here: served here
        assert here.target("smol:z") is None  # not served by this replica: its 404 is local
        assert here.target("smol:c") is None  # its only holder is busy
        assert metrics.forward_fallbacks.labels("busy")._value.get() == 1
        # Its own entry is never a target, whatever it holds.
        assert all(e.replica != here.replica for e in here._view)
        await here.aclose()
        assert here.replica not in board.entries  # withdrawn at once

    asyncio.run(main())


def test_a_view_that_cannot_be_refreshed_routes_nothing() -> None:
    class Broken(InProcessResidency):
        async def entries(self) -> list[Residence]:
            raise ConnectionError("redis is away")

    async def main() -> None:
        board = Board()
        here = _forwarder(board, [], Metrics())
        await InProcessResidency(board).announce(Residence("idle", "http://10.0.0.2:8750", ("smol:b",)))
        await here.beat()
        assert here.target("smol:b") is not None
        here._residency = Broken(board)
        await here.beat()
        assert here.target("smol:b") is None
        await here.aclose()

    asyncio.run(main())


def test_the_model_is_read_from_any_faces_body() -> None:
    assert model_of(b'{"model": "smol:a", "input": "hi"}') == "smol:a"
    assert model_of(b'{"model": 3}') is None
    assert model_of(b"[1]") is None
    assert model_of(b"{not json") is None
