"""`--advertise-url` (server.py `advertised`): what siblings are given to reach a replica, a
port filled in from `--port`, anything else refused at start with a message; and refused
without an event log the replicas share, through which they would learn of each other."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmsp.server import ServeError, Settings, advertised, build_app


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("http://10.0.0.11:8750", "http://10.0.0.11:8750"),
        ("http://10.0.0.11", "http://10.0.0.11:9000"),
        ("http://10.0.0.11/", "http://10.0.0.11:9000"),
        ("https://a.internal:443", "https://a.internal:443"),
        ("http://[fd00::1]", "http://[fd00::1]:9000"),
    ],
)
def test_an_address_is_taken_with_its_port_or_the_listening_one(given: str, used: str) -> None:
    assert advertised(given, 9000) == used


@pytest.mark.parametrize(
    "given",
    ["10.0.0.11:8750", "ftp://a:1", "http://", "http://a:1/lmsp", "http://a:1?x=1", "http://u:p@a:1", "http://a:99999"],
)
def test_anything_else_is_refused(given: str) -> None:
    with pytest.raises(ServeError, match="--advertise-url"):
        advertised(given, 9000)


def test_it_needs_an_event_log_the_replicas_share(tmp_path: Path) -> None:
    settings = Settings(advertise_url="http://127.0.0.1", data_dir=tmp_path, events_url="memory:")
    with pytest.raises(ServeError, match="--events redis://"):
        build_app(settings)
