"""Issue 38: distinct JSON schemas in a row, each new to the server, keep nothing past their
requests beyond what the bounded caches hold: the compiled-grammar cache (64 per model) and
the prompt cache's memory tier (`--cache-ram`), whose bytes /metrics reports.

The issue's 1,043 MB for 1,000 schemas was the prompt cache filling its default 2 GiB with each
request's slot state (prompt and output, 23 kB a token): `bench/scripts/schema_memory.py`
measures the full 1,000, with and without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from helpers import MODEL, body
from lmsp.testing import RunningServer, start_server

# More than the 64 compiled grammars the engine caches, so that the cache is full before the
# measured run: from then on each new schema evicts one.
WARM_UP = 80
SCHEMAS = 300
PER_SCHEMA = 150 * 1024  # bytes of RSS a schema may leave behind, on average
CACHE_RAM_MIB = 8


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        tmp_path_factory.mktemp("schemas"), "--parallel", "1", "--keep-alive", "-1", "--cache-ram", str(CACHE_RAM_MIB)
    )
    yield srv
    srv.stop()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def cache_ram(client: httpx.Client) -> int:
    found = re.search(r'^lmsp_prompt_cache_bytes\{[^}]*tier="ram"\} (\S+)$', client.get("/metrics").text, re.M)
    assert found, "no lmsp_prompt_cache_bytes for the memory tier"
    return int(float(found.group(1)))


def schema(i: int) -> dict[str, Any]:
    # A property name no other request had: a new compile, and a different output.
    return {
        "type": "object",
        "properties": {f"field_{i}": {"type": "integer"}, "name": {"type": "string", "maxLength": 20}},
        "required": [f"field_{i}"],
    }


def post(client: httpx.Client, i: int) -> None:
    payload = body(
        "Write the record as JSON.",
        response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": schema(i)}},
        max_output_tokens=4,
        temperature=0,
    )
    r = client.post("/lmsp/v1/responses", json=payload)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == MODEL


def test_distinct_schemas_keep_no_memory_past_the_caches(service: RunningServer) -> None:
    with httpx.Client(base_url=service.url, timeout=120) as client:
        for i in range(WARM_UP):
            post(client, i)
        before, cached_before = rss(service.proc.pid), cache_ram(client)
        for i in range(WARM_UP, WARM_UP + SCHEMAS):
            post(client, i)
        after, cached_after = rss(service.proc.pid), cache_ram(client)
    assert cached_after <= CACHE_RAM_MIB * 2**20
    kept = (after - before) - (cached_after - cached_before)
    print(
        f"\n{SCHEMAS} distinct schemas: RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB, "
        f"{kept / SCHEMAS / 1024:.0f} KiB each outside the prompt cache"
    )
    assert kept / SCHEMAS < PER_SCHEMA, f"{kept / SCHEMAS / 1024:.0f} KiB kept per schema"
