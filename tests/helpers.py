"""Shared by the test modules: request bodies and reading event streams."""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson

from lmsp.client import iter_events

MODEL = "smollm2:135m-instruct-q4_1"
SCRIPTED = "scripted:test"
ULID = r"[0-9A-HJKMNP-TV-Z]{26}"


def user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


def body(text: str, model: str = MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "input": user(text), **fields}


def has_id(value: str, prefix: str) -> bool:
    return re.fullmatch(f"{prefix}_{ULID}", value) is not None


def stream(client: httpx.Client, payload: dict[str, Any]) -> tuple[httpx.Response, list[tuple[int, str, Any]]]:
    """POSTs a streaming request; returns the response and its events as (id, name, data)."""
    with client.stream("POST", "/lmsp/v1/responses", json={**payload, "stream": True}) as response:
        if response.status_code != 200:
            response.read()
            return response, []
        events = [(int(e.id), e.event, orjson.loads(e.data)) for e in iter_events(response.iter_bytes())]
    return response, events


def assert_problem(response: httpx.Response, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["lmsp-version"] == "1.0"
    doc: dict[str, Any] = response.json()
    assert doc["type"] == f"urn:lmsp:error:{code}"
    assert doc["code"] == code
    assert doc["status"] == status
    assert doc["title"] and doc["detail"]
    if param is not None:
        assert doc["param"] == param
    assert "Traceback" not in response.text
    return doc
