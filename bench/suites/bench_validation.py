"""Validation cost: a typical request body parsed (orjson) and validated (pydantic-core) the
way `POST /lmsp/v1/responses` does it. Target: ≤ 50 µs per request. Then the whole intake of
each face up to the plan the service runs (parse, validate, translate into a GenerationPlan,
the limits), for LMSP and Chat Completions: what a request costs before the service sees it.
Also the durable write of a stored response (SQLite WAL, synchronous=FULL), which sits before
a stored response's final event."""

from __future__ import annotations

import orjson

from figures import QUICK
from lmsp.faces.lmsp.translate import lmsp_plan
from lmsp.faces.openai.chat import translate_chat_request
from lmsp.protocol.events import fold
from lmsp.protocol.requests import parse_json_body, validate_response_request
from lmsp.security.limits import Limits, check_request
from lmsp.service.plan import GenerationPlan
from lmsp.store import SqliteStore, StoredResponse

# A multi-turn request with the optional fields a client typically sets.
TYPICAL = orjson.dumps(
    {
        "model": "smollm2:135m-instruct-q4_1",
        "input": [
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "You are terse."}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Describe a local model service in one sentence."}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "It runs models on your own machine."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "And why would I want one?"}],
            },
        ],
        "stream": True,
        "max_output_tokens": 512,
        "temperature": 0.7,
        "response_format": {"type": "text"},
        "store": True,
        "extensions": {"seed": 7},
    }
)
N = 2_000 if QUICK else 20_000


def _validate_many() -> None:
    for _ in range(N):
        validate_response_request(parse_json_body(TYPICAL))


def test_typical_request_is_valid():
    assert validate_response_request(parse_json_body(TYPICAL))["stream"] is True


def test_validation_per_request(benchmark, figures):
    benchmark.group = "validation"
    benchmark.pedantic(_validate_many, rounds=3 if QUICK else 5, iterations=1, warmup_rounds=1)
    # A figure, not a gate (a slow number never fails the run); the target is ≤ 50 µs.
    figures["validation.typical_request.us"] = benchmark.stats.stats.min / N * 1e6


# The same conversation as Chat Completions sends it.
TYPICAL_CHAT = orjson.dumps(
    {
        "model": "smollm2:135m-instruct-q4_1",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Describe a local model service in one sentence."},
            {"role": "assistant", "content": "It runs models on your own machine."},
            {"role": "user", "content": "And why would I want one?"},
        ],
        "stream": True,
        "max_tokens": 512,
        "temperature": 0.7,
        "seed": 7,
    }
)
LIMITS = Limits()


def _checked(plan: GenerationPlan) -> GenerationPlan:
    # What http/intake.check_plan checks (its scope check needs a request, and costs nothing).
    tools = plan.tools.tools if plan.tools is not None else ()
    schema = plan.output.schema if plan.output is not None else None
    check_request(LIMITS, plan.input, plan.instructions, plan.max_output_tokens, tools, schema)
    return plan


def _lmsp_intake() -> GenerationPlan:
    return _checked(lmsp_plan(validate_response_request(parse_json_body(TYPICAL)), "local"))


def _chat_intake() -> GenerationPlan:
    return _checked(translate_chat_request(parse_json_body(TYPICAL_CHAT), "local").plan)


def test_both_faces_make_the_same_plan():
    lmsp, chat = _lmsp_intake(), _chat_intake()
    assert lmsp.input == chat.input and lmsp.sampling == chat.sampling and lmsp.stream and chat.stream


def test_intake_per_request(benchmark, figures):
    def intake_many() -> None:
        for _ in range(N):
            _lmsp_intake()
            _chat_intake()

    benchmark.group = "validation"
    benchmark.pedantic(intake_many, rounds=3 if QUICK else 5, iterations=1, warmup_rounds=1)
    # Both faces, one request each, per round trip of the loop: a figure, not a gate.
    figures["validation.intake_lmsp_plus_chat.us"] = benchmark.stats.stats.min / N * 1e6


def test_stored_response_write(benchmark, figures, tmp_path):
    store = SqliteStore(tmp_path / "bench.sqlite3")
    request = orjson.loads(TYPICAL)
    entries = [
        (1, "response.created", b'{"response_id":"resp_X","status":"in_progress"}'),
        (
            2,
            "response.output_item.done",
            orjson.dumps(
                {
                    "response_id": "resp_X",
                    "output_index": 0,
                    "item": {
                        "id": "msg_X",
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": "word " * 200}],
                    },
                }
            ),
        ),
        (
            3,
            "response.completed",
            b'{"response_id":"resp_X","status":"completed","usage":{"input_tokens":60,"output_tokens":200,"total_tokens":260}}',
        ),
    ]
    counter = iter(range(10**9))

    def write() -> None:
        response = fold(entries, response_id=f"resp_{next(counter)}", created_at=1, model=request["model"])
        store.put_response("local", StoredResponse(response=response, input=request["input"]))

    benchmark.group = "store"
    benchmark.pedantic(write, rounds=50 if QUICK else 300, iterations=1, warmup_rounds=5)
    figures["store.put_response.median_ms"] = benchmark.stats.stats.median * 1e3
    figures["store.put_response.max_ms"] = benchmark.stats.stats.max * 1e3
    store.close()
