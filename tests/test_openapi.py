"""The OpenAPI 3.1 document (generated from the protocol schemas) and schemathesis against the
live server: no 5xx, and no answer that contradicts the document (§9: no 500 for anything a
client sent)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from lmsp import __version__
from lmsp.protocol.errors import CODES
from lmsp.protocol.openapi import openapi_document

from helpers import SCRIPTED

CASES = {"tried": 0}
# Per operation; the whole run stays within a few seconds on two cores.
EXAMPLES = 40


def test_document_is_served_and_generated_from_the_protocol(client):  # covers: R6.1-1
    r = client.get("/lmsp/v1/openapi.json")
    assert r.status_code == 200
    assert r.headers["lmsp-version"] == "1.0"
    doc = r.json()
    assert doc == openapi_document(__version__)
    assert doc["openapi"].startswith("3.1")
    request = doc["components"]["schemas"]["ResponseRequest"]
    assert request["additionalProperties"] is False
    assert set(request["properties"]) == {
        "model", "input", "stream", "max_output_tokens", "temperature", "response_format",
        "tools", "tool_choice", "store", "previous_response_id", "extensions",
    }  # fmt: skip
    assert set(request["required"]) == {"model", "input"}
    problem = doc["components"]["schemas"]["Problem"]
    assert set(problem["properties"]["code"]["enum"]) == set(CODES)


@pytest.fixture(scope="module")
def api_schema(server) -> Any:
    doc = httpx.get(f"{server.url}/lmsp/v1/openapi.json").json()
    # Generation runs on the scripted model: the real one would spend seconds per valid case.
    doc["components"]["schemas"]["ResponseRequest"]["properties"]["model"]["enum"] = [SCRIPTED]
    config = SchemathesisConfig.from_dict(
        {
            "base-url": server.url,
            "generation": {"max-examples": EXAMPLES},
            "checks": {
                # A request can fit the schema and still be refused for what no schema says:
                # a capability the model lacks (400), an Idempotency-Key already bound to
                # another body (422). Both come back as documented problem documents.
                "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "409", "422"]},
            },
        }
    )
    return schemathesis.openapi.from_dict(doc, config=config)


# One test per operation and generation mode, driven by hypothesis directly: schemathesis's
# pytest plugin (`from_fixture`) does not run on pytest 9.
OPERATIONS = [
    ("GET", "/lmsp/v1/models"),
    ("GET", "/lmsp/v1/models/{model_id}"),
    ("POST", "/lmsp/v1/responses"),
    ("GET", "/lmsp/v1/responses/{response_id}"),
    ("GET", "/lmsp/v1/openapi.json"),
]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_api_conforms_to_its_document(api_schema, server, method, path, mode):  # covers: R6.1-8, R6.1-9, R6.2-1
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=EXAMPLES, database=None)
    def run(case: Any) -> None:
        CASES["tried"] += 1
        response = case.call_and_validate(base_url=server.url, timeout=30)
        assert response.status_code < 500, response.text

    run()


def test_cases_were_tried(capsys):
    # Reported in the note; fails if schemathesis silently generated nothing.
    with capsys.disabled():
        print(f"\nschemathesis: {CASES['tried']} cases against the live server")
    assert CASES["tried"] >= len(OPERATIONS) * 2 * 10


def test_a_stream_conforms_to_its_document(api_schema):  # covers: R6.3-1
    # Hypothesis does not always draw `stream: true`; this case always checks the event schema.
    operation = api_schema["/lmsp/v1/responses"]["POST"]
    payload = {
        "model": SCRIPTED,
        "stream": True,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a b c"}]}],
    }
    case = operation.Case(body=payload, media_type="application/json")
    response = case.call()
    assert response.headers["content-type"] == ["text/event-stream"]
    case.validate_response(response)
