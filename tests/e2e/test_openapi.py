"""The OpenAPI 3.1 document (generated from the protocol schemas) and schemathesis against the
live server: no 5xx, and no answer that contradicts the document (§9: no 500 for anything a
client sent)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

import lmsp
from helpers import SCRIPTED, body, create_task, wait_final
from lmsp.engine.scheduler import SchedulerConfig
from lmsp.faces.anthropic import AnthropicFace
from lmsp.faces.lmsp.routes import LmspFace
from lmsp.faces.ollama.routes import OllamaFace
from lmsp.faces.openai.routes import OpenAIFace
from lmsp.http.app import App
from lmsp.http.face import Services
from lmsp.security.limits import Limits, StreamSlots
from lmsp.service.models import ModelManager
from lmsp.service.responses import ResponsesService
from lmsp.service.tasks import TasksService
from lmsp.store import SqliteStore, StoreWorker

CASES = {"tried": 0}
# Per operation; the whole run stays within a few seconds on two cores.
EXAMPLES = 40


def _document() -> dict[str, Any]:
    """The document the service serves: the protocol's, with every face's operations."""
    models = ModelManager([], SchedulerConfig())
    services = Services(ResponsesService(models), models, None, None, Limits(), StreamSlots(Limits()), 1024, 1.0)
    App(services, [AnthropicFace(services), OpenAIFace(services), OllamaFace(services), LmspFace(services)])
    return orjson.loads(services.openapi)


DOCUMENT = _document()
# Every documented operation, so that a route added to the document is fuzzed as well.
OPERATIONS = [(method.upper(), path) for path, ops in DOCUMENT["paths"].items() for method in ops]


def test_document_is_served_and_generated_from_the_protocol(client):  # covers: R6.1-1
    r = client.get("/lmsp/v1/openapi.json")
    assert r.status_code == 200
    assert r.headers["lmsp-version"] == "1.0"
    doc = r.json()
    assert doc == DOCUMENT
    assert doc["openapi"].startswith("3.1")
    request = doc["components"]["schemas"]["ResponseRequest"]
    assert request["additionalProperties"] is False
    assert set(request["properties"]) == {
        "model", "input", "stream", "max_output_tokens", "temperature", "response_format",
        "tools", "tool_choice", "store", "previous_response_id", "extensions",
    }  # fmt: skip
    assert set(request["required"]) == {"model", "input"}
    task_request = doc["components"]["schemas"]["TaskRequest"]
    assert set(task_request["properties"]) == set(request["properties"]) - {"stream"}


def test_every_route_served_is_documented_and_every_documented_route_is_served(tmp_path):
    models = ModelManager([], SchedulerConfig())
    responses = ResponsesService(models)
    store = StoreWorker(SqliteStore(tmp_path / "s.sqlite3"))
    limits = Limits()
    try:
        tasks = TasksService(responses, store)
        services = Services(responses, models, tasks, None, limits, StreamSlots(limits), max_body=1024, keepalive=1.0)
        app = App(services, [AnthropicFace(services), OpenAIFace(services), OllamaFace(services), LmspFace(services)])
        served = {(route.method, route.path) for route in app.routes}
    finally:
        store.close()
    assert set(OPERATIONS) == served


def _codes_raised() -> tuple[set[str], set[str]]:
    """The codes passed as literals to ProblemError(...) or problem(...) anywhere in the
    package, and the source of every first argument that is not a literal."""
    literal: set[str] = set()
    other: set[str] = set()
    for path in sorted(Path(lmsp.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name not in ("ProblemError", "problem"):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                literal.add(first.value)
            else:
                other.add(ast.unparse(first))
    return literal, other


def test_every_error_code_the_code_raises_is_documented_and_no_other():  # covers: R9-2
    documented = set(DOCUMENT["components"]["schemas"]["Problem"]["properties"]["code"]["enum"])
    literal, other = _codes_raised()
    # Only passed along, never made up: a problem re-raised (ProblemError.body), a failed
    # generation's own problem answered to a sync request, and a remembered failed load's
    # problem answered again with its Retry-After (service/models.py).
    assert other == {"self.code", "error['code']", "error.code"}
    assert literal - documented == set(), "raised but not in the document"
    assert documented - literal == set(), "documented but raised nowhere"


@pytest.fixture(scope="module")
def finished_task(server) -> dict[str, Any]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        return wait_final(c, create_task(c, body("a finished task", model=SCRIPTED))["id"])


@pytest.fixture(scope="module")
def api_schema(server, finished_task) -> Any:
    doc = httpx.get(f"{server.url}/lmsp/v1/openapi.json").json()
    # Generation runs on the scripted model: the real one would spend seconds per valid case.
    for name in (
        "ResponseRequest",
        "TaskRequest",
        "OpenAIResponseRequest",
        "OpenAIChatRequest",
        "AnthropicMessagesRequest",
        "AnthropicCountTokensRequest",
    ):
        doc["components"]["schemas"][name]["properties"]["model"]["enum"] = [SCRIPTED]
    # Task routes get a task that exists (its events replay and close: a bounded stream) and
    # one that does not; random ids would only ever meet a 404.
    for ops in doc["paths"].values():
        for op in ops.values():
            for param in op.get("parameters", []):
                if param["name"] == "task_id":
                    param["schema"] = {
                        "type": "string",
                        "enum": [finished_task["id"], "task_01J8M5T7Z2K4N6Q8S0V3X5B9DG"],
                    }
    config = SchemathesisConfig.from_dict(
        {
            "base-url": server.url,
            "generation": {"max-examples": EXAMPLES},
            "checks": {
                # A request can fit the schema and still be refused for what no schema says:
                # a capability the model lacks (400), an Idempotency-Key already bound to
                # another body (422), a task id that is not there (404). All come back as
                # documented problem documents.
                "positive_data_acceptance": {"expected-statuses": ["2xx", "400", "404", "409", "422"]},
            },
        }
    )
    return schemathesis.openapi.from_dict(doc, config=config)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_api_conforms_to_its_document(api_schema, server, method, path, mode):  # covers: R6.1-8, R6.1-9, R6.2-1, R7-1
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


def test_task_events_conform_to_their_document(api_schema, finished_task):  # covers: R7-3, R7-6
    operation = api_schema["/lmsp/v1/tasks/{task_id}/events"]["GET"]
    replay = operation.Case(path_parameters={"task_id": finished_task["id"]})
    response = replay.call(timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"] == ["text/event-stream"]
    replay.validate_response(response)
    last = response.text.rstrip().split("\n\n")[-1]
    last_id = int(last.split("\n")[0].removeprefix("id: "))
    done = operation.Case(path_parameters={"task_id": finished_task["id"]}, query={"after": str(last_id)})
    nothing = done.call(timeout=30)
    assert nothing.status_code == 204
    done.validate_response(nothing)
