"""The model's context window: refused up front when the input does not fit (R6.1-4), and
`incomplete` with reason `context_length` when generation fills it (R6.2-4, profile)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers import assert_problem, body, checked_client, stream
from lmsp.testing import RunningServer, start_server

URL = "/lmsp/v1/responses"
WINDOW = 64


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("small"), "--ctx-size", str(WINDOW))
    yield srv
    srv.stop()


def test_window_is_advertised(small):
    with checked_client(small.url) as c:
        assert c.get("/lmsp/v1/models").json()["data"][0]["context_window"] == WINDOW


def test_filling_the_window_is_incomplete_context_length(small):  # covers: R6.2-4
    with checked_client(small.url) as c:
        resp = c.post(URL, json=body("Write a long story about a dragon.", temperature=0)).json()
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"] == {"reason": "context_length"}
    # The last token is sampled from the window's last cell and never needs one of its own.
    assert WINDOW <= resp["usage"]["total_tokens"] <= WINDOW + 1
    assert resp["output"][0]["content"][0]["text"]


def test_stream_ends_incomplete_context_length(small):  # covers: R6.2-4, R6.3-2
    with checked_client(small.url) as c:
        _, events = stream(c, body("Write a long story about a dragon.", temperature=0))
    name, data = events[-1][1], events[-1][2]
    assert name == "response.incomplete"
    assert data["incomplete_details"] == {"reason": "context_length"}
    assert WINDOW <= data["usage"]["total_tokens"] <= WINDOW + 1


def test_window_counts_the_chat_template(small):  # covers: R6.1-4
    # 40 short words are ~40 tokens: they would fit in 64 on their own, but not with the chat
    # template's system prompt and markers around them.
    words = " ".join(["one"] * 40)
    with checked_client(small.url) as c:
        doc = assert_problem(c.post(URL, json=body(words)), 400, "context_length_exceeded", param="input")
        fits = c.post(URL, json=body("Hi", max_output_tokens=1))
    counted = int(doc["detail"].split("the input is ")[1].split(" tokens")[0])
    assert counted > 40 + 10  # the template's tokens are in the count
    assert str(WINDOW) in doc["detail"]
    assert fits.status_code == 200
    assert fits.json()["usage"]["input_tokens"] > 10
