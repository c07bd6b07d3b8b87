"""The service's OpenAPI 3.1 document, generated from the protocol's pydantic-core schemas.

pydantic's JSON Schema generator turns each schema's `ref` into a component, so what the
document promises is exactly what the validators accept and what the tests check we send.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema as cs

from .errors import PROBLEM
from .events import EVENT_DATA
from .models import MODEL, MODEL_LIST
from .requests import REQUEST
from .responses import RESPONSE
from .tasks import TASK, TASK_REQUEST

__all__ = ["IDEMPOTENCY_KEY_PATTERN", "IDEMPOTENCY_PARAM", "LMSP_VERSION_PATTERN", "VERSION_PARAM", "openapi_document"]

# §9: `1` or `1.N`; any other major is refused with unsupported_version.
LMSP_VERSION_PATTERN = r"^1(\.[0-9]+)?$"
# §9 (profile): 1–255 printable ASCII characters, bare or as a quoted string.
IDEMPOTENCY_KEY_PATTERN = r'^(?:[!#-~]{1,255}|"[ !#-\[\]-~]{1,255}")$'

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(model=name)}


def _components(extra: Sequence[tuple[str, cs.CoreSchema]]) -> dict[str, Any]:
    inputs: list[tuple[str, Any, cs.CoreSchema]] = [
        (name, "validation", schema)
        for name, schema in [
            ("request", REQUEST),
            ("response", RESPONSE),
            ("problem", PROBLEM),
            ("models", MODEL_LIST),
            ("task", TASK),
            ("task_request", TASK_REQUEST),
        ]
    ]
    inputs += [(name, "validation", schema) for name, schema in EVENT_DATA.items()]
    inputs += [(name, "validation", schema) for name, schema in extra]
    inputs.append(("model", "validation", MODEL))
    _, definitions = GenerateJsonSchema(ref_template=_REF).generate_definitions(inputs)
    return dict(sorted(definitions.items()))


_VERSION_HEADER = {
    "description": "The LMSP version of the answer; every response carries it.",
    "required": True,
    "schema": {"type": "string", "const": "1.0"},
}


# Every route needs a scope (§10): a service with tokens answers 401 without one, 403 without the
# scope; a service without them refuses a non-loopback Host or an unlisted Origin with 403.
_GUARDED = (401, 403)


def _problems(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": "A problem document.",
            "headers": {"LMSP-Version": _VERSION_HEADER},
            "content": {"application/problem+json": {"schema": _ref("Problem")}},
        }
        for status in sorted({*statuses, *_GUARDED})
    }


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {"LMSP-Version": _VERSION_HEADER},
        "content": {"application/json": {"schema": schema}},
    }


VERSION_PARAM = {
    "name": "LMSP-Version",
    "in": "header",
    "required": False,
    "description": "The LMSP version the client speaks; a major other than 1 is refused.",
    "schema": {"type": "string", "pattern": LMSP_VERSION_PATTERN},
}

IDEMPOTENCY_PARAM = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": (
        "Retry safely: the same key and body within 24 h replays the first result (a stream's "
        "recorded events); another body: 422; the first still running: 409."
    ),
    "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
}

_EVENTS_DOC = (
    "Server-sent events, each with `id` (1, 2, …), `event` and a JSON `data` object: "
    + ", ".join(f"`{name}` ({schema['ref'].removeprefix('lmsp.')})" for name, schema in EVENT_DATA.items())
    + ". Exactly one final event (completed, incomplete, failed, cancelled or error) ends the stream; "
    "`: keep-alive` comments may come while nothing else does."
)

# One parsed event of the stream (tools such as schemathesis check each event against this).
_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": _EVENTS_DOC,
    "properties": {
        "id": {"type": "string", "pattern": "^[1-9][0-9]*$"},
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json"},
        "retry": {"type": "integer"},
    },
    "required": ["event", "data"],
}


_SSE = {"text/event-stream": {"schema": _SSE_EVENT}}


def _id_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


# §6.4: an event id, given as `?after=N` or (as EventSource sends it) `Last-Event-ID: N`.
_EVENT_ID_PATTERN = "^[0-9]{1,18}$"

_AFTER_PARAM = {
    "name": "after",
    "in": "query",
    "required": False,
    "description": "Send only the events after this id; wins over Last-Event-ID.",
    "schema": {"type": "string", "pattern": _EVENT_ID_PATTERN},
}

_LAST_EVENT_ID_PARAM = {
    "name": "Last-Event-ID",
    "in": "header",
    "required": False,
    "description": "The id of the last event the client has (what EventSource sends on reconnecting).",
    "schema": {"type": "string", "pattern": _EVENT_ID_PATTERN},
}


def _task_paths() -> dict[str, Any]:
    task = _id_param("task_id")
    return {
        "/lmsp/v1/tasks": {
            "post": {
                "operationId": "createTask",
                "parameters": [VERSION_PARAM, IDEMPOTENCY_PARAM],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("TaskRequest")}}},
                "responses": {
                    "202": {
                        "description": "The task, running whether or not anyone reads its events.",
                        "headers": {
                            "LMSP-Version": _VERSION_HEADER,
                            "Location": {
                                "description": "The task's URL.",
                                "required": True,
                                "schema": {"type": "string"},
                            },
                        },
                        "content": {"application/json": {"schema": _ref("Task")}},
                    },
                    **_problems(400, 404, 408, 409, 413, 415, 422, 429, 503),
                },
            }
        },
        "/lmsp/v1/tasks/{task_id}": {
            "get": {
                "operationId": "getTask",
                "parameters": [task, VERSION_PARAM],
                "responses": {
                    "200": _json("The task; `response` holds the final response once it has one.", _ref("Task")),
                    **_problems(400, 404),
                },
            }
        },
        "/lmsp/v1/tasks/{task_id}/events": {
            "get": {
                "operationId": "getTaskEvents",
                "parameters": [task, _AFTER_PARAM, _LAST_EVENT_ID_PARAM, VERSION_PARAM],
                "responses": {
                    "200": {
                        "description": (
                            "The task's events after the given id (from 1 by default), then the live ones; "
                            "closed after the final event."
                        ),
                        "headers": {"LMSP-Version": _VERSION_HEADER},
                        "content": _SSE,
                    },
                    "204": {
                        "description": (
                            "Nothing is left: the id given is the final event's (EventSource stops reconnecting)."
                        ),
                        "headers": {"LMSP-Version": _VERSION_HEADER},
                    },
                    **_problems(400, 404, 410, 429),
                },
            }
        },
        "/lmsp/v1/tasks/{task_id}/cancel": {
            "post": {
                "operationId": "cancelTask",
                "parameters": [task, VERSION_PARAM],
                "responses": {
                    "200": _json("The task, ended `cancelled`, or unchanged if it was already final.", _ref("Task")),
                    **_problems(400, 404),
                },
            }
        },
    }


def openapi_document(
    service_version: str,
    extra_paths: Mapping[str, Any] | None = None,
    extra_schemas: Sequence[tuple[str, cs.CoreSchema]] = (),
) -> dict[str, Any]:
    """The LMSP operations, plus what the other faces mounted beside them add."""
    get_common = [VERSION_PARAM]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "lmsp",
            "version": service_version,
            "summary": "A local model service speaking LMSP 1.0.",
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "paths": {
            "/lmsp/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "parameters": get_common,
                    "responses": {"200": _json("The models this service serves.", _ref("ModelList")), **_problems(400)},
                }
            },
            "/lmsp/v1/models/{model_id}": {
                "get": {
                    "operationId": "getModel",
                    "parameters": [_id_param("model_id"), *get_common],
                    "responses": {"200": _json("A model.", _ref("Model")), **_problems(400, 404)},
                }
            },
            "/lmsp/v1/responses": {
                "post": {
                    "operationId": "createResponse",
                    "parameters": [VERSION_PARAM, IDEMPOTENCY_PARAM],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("ResponseRequest")}},
                    },
                    "responses": {
                        "200": {
                            "description": (
                                "`stream: false`: the final response object. `stream: true`: an event stream."
                            ),
                            "headers": {"LMSP-Version": _VERSION_HEADER},
                            "content": {
                                "application/json": {"schema": _ref("Response")},
                                **_SSE,
                            },
                        },
                        **_problems(400, 404, 408, 409, 413, 415, 422, 429, 500, 503),
                    },
                }
            },
            "/lmsp/v1/responses/{response_id}": {
                "get": {
                    "operationId": "getResponse",
                    "parameters": [_id_param("response_id"), *get_common],
                    "responses": {"200": _json("A stored response.", _ref("Response")), **_problems(400, 404)},
                }
            },
            **_task_paths(),
            "/lmsp/v1/openapi.json": {
                "get": {
                    "operationId": "getOpenApi",
                    "parameters": get_common,
                    "responses": {"200": _json("This document.", {"type": "object"}), **_problems(400)},
                }
            },
            "/metrics": {
                "get": {
                    "operationId": "getMetrics",
                    "description": "Needs the `admin` scope (a loopback client of a service without tokens has it).",
                    "parameters": get_common,
                    "responses": {
                        "200": {
                            "description": "The service's metrics in the Prometheus text format.",
                            "headers": {"LMSP-Version": _VERSION_HEADER},
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        **_problems(400, 404),
                    },
                }
            },
            **(extra_paths or {}),
        },
        "components": {
            "schemas": _components(extra_schemas),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "`lmsp token create`"}},
        },
        # Without tokens configured, loopback clients need none (the empty alternative).
        "security": [{"bearer": []}, {}],
    }
