"""Function tools (§6.5) with the real model: calls shaped by the grammar, so every one
parses and validates; tool_choice honoured; streamed calls; full round trips."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from helpers import MODEL, assert_problem, body, create_task, stream, user, wait_final
from lmsp.engine.tools import MAX_CALLS

URL = "/lmsp/v1/responses"


def _tool(name: str, description: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    tool = {"type": "function", "name": name, "description": description}
    if parameters is not None:
        tool["parameters"] = parameters
    return tool


def _obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        "additionalProperties": False,
    }


TOOLS = [
    _tool(
        "get_weather",
        "Current weather for a city.",
        _obj({"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}}),
    ),
    _tool(
        "search_web",
        "Search the web.",
        _obj(
            {
                "query": {"type": "string", "maxLength": 80},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
            },
            ["query"],
        ),
    ),
    _tool(
        "create_event",
        "Add an event to the calendar.",
        _obj(
            {
                "title": {"type": "string", "maxLength": 60},
                "date": {"type": "string", "format": "date"},
                "attendees": {
                    "type": "array",
                    "items": {"type": "string", "format": "email", "maxLength": 40},
                    "maxItems": 3,
                },
            }
        ),
    ),
    _tool(
        "set_thermostat",
        "Set the heating.",
        _obj(
            {"temperature": {"type": "number", "minimum": 10, "maximum": 30}, "mode": {"enum": ["heat", "cool", "off"]}}
        ),
    ),
    _tool(
        "send_email",
        "Send an email.",
        _obj(
            {
                "to": {"type": "string", "format": "email", "maxLength": 40},
                "subject": {"type": "string", "maxLength": 60},
                "body": {"type": "string", "maxLength": 120},
            }
        ),
    ),
    _tool("get_time", "The current time."),
]
BY_NAME = {t["name"]: t for t in TOOLS}
PROMPTS = [
    "What is the weather like in Paris right now?",
    "Find me recent news about solar power.",
    "Put a team lunch on my calendar for Friday with anna@example.com.",
    "It is cold in here, warm it up to 22 degrees.",
    "Email bob@example.com that the report is late.",
    "What time is it?",
]


def _check_call(item: dict[str, Any], response: dict[str, Any]) -> bool:
    """A completed call parses and validates; True for those. A call cut by max_output_tokens
    is `incomplete` (R6.3-7), in a response that is incomplete too, and proves nothing more."""
    assert item["type"] == "function_call"
    assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
    if item["status"] == "incomplete":
        assert response["status"] == "incomplete" and item is response["output"][-1]
        return False
    assert item["status"] == "completed"
    tool = BY_NAME[item["name"]]
    schema = tool.get("parameters", {"type": "object", "properties": {}, "additionalProperties": False})
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    validator.validate(json.loads(item["arguments"]))
    return True


def _ask(
    client: httpx.Client, prompt: str, *, choice: Any, temperature: float, seed: int = 0, **fields: Any
) -> dict[str, Any]:
    fields.setdefault("max_output_tokens", 300)
    r = client.post(
        URL,
        json=body(
            prompt, tools=TOOLS, tool_choice=choice, temperature=temperature, extensions={"seed": seed}, **fields
        ),
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_model_advertises_tools(client):  # covers: R6.5-2
    assert "tools" in client.get(f"/lmsp/v1/models/{MODEL}").json()["capabilities"]


# Completed calls the sweep below needs: 500 by default (about five minutes on two cores),
# fewer where CI sets it smaller.
SWEEP_CALLS = int(os.environ.get("LMSP_TOOL_CALL_SWEEP", "500"))


@pytest.mark.timeout(1200)
def test_required_and_named_calls_always_parse_and_validate(client):  # covers: R6.5-2, R6.5-3, R6.5-5
    choices: list[Any] = ["required", *({"type": "function", "name": t["name"]} for t in TOOLS)]
    # Every prompt with every choice greedily, then new samples at temperature 1 until at
    # least SWEEP_CALLS calls were completed: every one must parse and validate.
    batches = [[(p, c, 0.0, 0) for p in PROMPTS for c in choices]]
    batches += [[(p, c, 1.0, seed) for p, c in zip(PROMPTS * 4, choices * 4, strict=False)] for seed in range(1, 60)]
    calls = responses_seen = 0
    with ThreadPoolExecutor(4) as pool:
        for batch in batches:
            responses = pool.map(lambda r: _ask(client, r[0], choice=r[1], temperature=r[2], seed=r[3]), batch)
            for (_prompt, choice, _t, _s), response in zip(batch, responses, strict=True):
                responses_seen += 1
                assert response["status"] in ("completed", "incomplete")
                items = response["output"]
                assert items and all(item["type"] == "function_call" for item in items), items
                if isinstance(choice, dict):
                    assert len(items) == 1 and items[0]["name"] == choice["name"]
                assert len(items) <= MAX_CALLS
                calls += sum(_check_call(item, response) for item in items)
            if calls >= SWEEP_CALLS:
                break
    print(f"\n{calls} completed calls in {responses_seen} responses, all valid")
    assert calls >= SWEEP_CALLS


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_none_never_calls_and_auto_keeps_calls_out_of_text(client, temperature):  # covers: R6.5-2, R6.5-5
    for choice in ("none", "auto"):
        for seed, prompt in enumerate(PROMPTS):
            # Long enough for a call or a few sentences; a longer text proves nothing more.
            response = _ask(client, prompt, choice=choice, temperature=temperature, seed=seed, max_output_tokens=100)
            for item in response["output"]:
                if item["type"] == "message":
                    text = "".join(part["text"] for part in item["content"])
                    assert "<tool_call>" not in text, text
                else:
                    assert choice == "auto", item
                    _check_call(item, response)


def test_streamed_and_sync_outputs_agree_item_for_item(client):  # covers: R6.5-3
    for choice in ("required", {"type": "function", "name": "create_event"}, "auto"):
        # Asked once before, so that both reads below reuse the cached prompt alike: a prompt
        # decoded afresh and one whose cache is reused differ in the last bits of their
        # logits, which can tip a greedy near-tie (llama.cpp, with or without a grammar).
        _ask(client, PROMPTS[2], choice=choice, temperature=0.0)
        sync = _ask(client, PROMPTS[2], choice=choice, temperature=0.0)["output"]
        payload = body(
            PROMPTS[2],
            tools=TOOLS,
            tool_choice=choice,
            temperature=0.0,
            max_output_tokens=300,
            extensions={"seed": 0},
            stream=True,
        )
        r, events = stream(client, payload)
        assert r.status_code == 200
        done = [data["item"] for _, name, data in events if name == "response.output_item.done"]
        strip = lambda item: {k: v for k, v in item.items() if k not in ("id", "call_id")}  # noqa: E731
        assert [strip(i) for i in done] == [strip(i) for i in sync]
        # Each call: added with empty arguments, then its deltas, then done with all of them.
        for item in done:
            if item["type"] != "function_call":
                continue
            added = [
                d["item"] for _, n, d in events if n == "response.output_item.added" and d["item"]["id"] == item["id"]
            ]
            assert added == [{**item, "arguments": "", "status": "in_progress"}]
            deltas = "".join(
                d["delta"]
                for _, n, d in events
                if n == "response.function_call_arguments.delta" and d["item_id"] == item["id"]
            )
            assert deltas == item["arguments"]


def _round_trip_input(call: dict[str, Any]) -> list[dict[str, Any]]:
    result = {
        "type": "function_call_output",
        "call_id": call["call_id"],
        "output": json.dumps({"temperature_c": 18, "sky": "clear"}),
    }
    return [*user(PROMPTS[0]), call, result]


def test_a_weather_round_trip_ends_in_a_message(client):  # covers: R6.5-1, R6.5-4
    first = _ask(client, PROMPTS[0], choice={"type": "function", "name": "get_weather"}, temperature=0.0)
    [call] = first["output"]
    r = client.post(
        URL,
        json={
            "model": MODEL,
            "input": _round_trip_input(call),
            "tools": TOOLS,
            "tool_choice": "none",
            "temperature": 0.0,
            "max_output_tokens": 80,
        },
    )
    assert r.status_code == 200, r.text
    [message] = r.json()["output"]
    assert message["type"] == "message" and message["content"][0]["text"]


def test_a_round_trip_through_previous_response_id(client):  # covers: R6.5-4, R6.1-6
    first = _ask(client, PROMPTS[0], choice="required", temperature=0.0, store=True)
    call = first["output"][0]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temperature_c": 18}'}
    r = client.post(
        URL,
        json={
            "model": MODEL,
            "previous_response_id": first["id"],
            "input": [result],
            "tools": TOOLS,
            "tool_choice": "none",
            "temperature": 0.0,
            "max_output_tokens": 40,
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["output"][0]["type"] == "message"


def test_an_output_without_its_call_is_refused(client):  # covers: R6.5-4
    items = [*user("hi"), {"type": "function_call_output", "call_id": "call_nowhere", "output": "{}"}]
    r = client.post(URL, json={"model": MODEL, "input": items, "tools": TOOLS})
    assert_problem(r, 400, "invalid_request", param="input[1].call_id")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "tools": [
                    _tool("t", "x", {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}})
                ]
            },
            "tools[0].parameters",
        ),
        ({"tools": [_tool("t", "x"), _tool("u", "y", {"type": "string", "pattern": "(?=x)"})]}, "tools[1].parameters"),
        (
            {
                "tools": [
                    _tool("t", "x", {"type": "object", "properties": {"a": {"type": "string", "pattern": "foo**"}}})
                ]
            },
            "tools[0].parameters",
        ),
        ({"tools": [], "tool_choice": "required"}, "tool_choice"),
        (
            {
                "tools": TOOLS,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
            },
            "response_format",
        ),
    ],
    ids=[
        "remote-ref",
        "unenforceable-pattern",
        "not-ecma-262-pattern",
        "required-without-tools",
        "json-and-tools",
    ],
)
def test_tool_definitions_we_cannot_honour_are_refused(client, fields, param):  # covers: R6.5-2
    assert_problem(client.post(URL, json=body("hi", **fields)), 400, "invalid_request", param=param)


# --- a client's agent loop (R6.5-7, R6.3-7) ---------------------------------------------

# The two enum-argument tools of a black-box check: a small budget must be enough for a call.
ENUM_TOOLS = [
    _tool("get_weather", "Current weather for a city.", _obj({"city": {"enum": ["Paris", "Tokyo", "Lima"]}})),
    _tool("get_time", "The current time in a time zone.", _obj({"zone": {"enum": ["UTC", "CET", "JST"]}})),
]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_time"}], ids=["required", "named"])
def test_a_64_token_call_completes_with_one_valid_call(client, choice):  # covers: R6.5-7, R6.5-5
    for prompt in ("What is the weather in Paris?", "What time is it in Tokyo?"):
        r = client.post(
            URL, json=body(prompt, tools=ENUM_TOOLS, tool_choice=choice, temperature=0.0, max_output_tokens=64)
        )
        response = r.json()
        assert response["status"] == "completed", response
        [call] = response["output"]
        assert call["type"] == "function_call" and call["status"] == "completed"
        schema = next(t["parameters"] for t in ENUM_TOOLS if t["name"] == call["name"])
        jsonschema.validate(json.loads(call["arguments"]), schema)


def test_parallel_tool_calls_is_asked_for_in_extensions(client):  # covers: R6.5-7
    # Asked for, calls may follow one another up to the cap (this model, greedy, repeats its
    # call); not asked for, the grammar ends the output after one.
    sizes = {}
    for parallel in (True, False):
        extensions = {"seed": 0, "parallel_tool_calls": True} if parallel else {"seed": 0}
        r = client.post(
            URL,
            json=body(
                PROMPTS[0],
                tools=TOOLS,
                tool_choice="required",
                temperature=0.0,
                max_output_tokens=300,
                extensions=extensions,
            ),
        )
        output = r.json()["output"]
        assert all(item["type"] == "function_call" for item in output)
        sizes[parallel] = len(output)
    assert sizes[False] == 1
    assert 1 < sizes[True] <= MAX_CALLS


def _assert_every_added_item_is_done(events: list[tuple[int, str, Any]]) -> list[dict[str, Any]]:
    added = {d["item"]["id"]: d["output_index"] for _, n, d in events if n == "response.output_item.added"}
    done = [d for _, n, d in events if n == "response.output_item.done"]
    assert {d["item"]["id"]: d["output_index"] for d in done} == added
    for d in done:
        item = d["item"]
        if item["type"] == "function_call":
            deltas = "".join(
                e["delta"]
                for _, n, e in events
                if n == "response.function_call_arguments.delta" and e["item_id"] == item["id"]
            )
            assert deltas == item["arguments"]
    return [d["item"] for d in done]


def test_a_call_cut_by_max_output_tokens_is_closed_incomplete_everywhere(client):  # covers: R6.3-7, R6.3-4
    # 22 tokens: enough to open the call (its head is about 15), not to finish its arguments.
    fields = dict(
        tools=TOOLS, tool_choice={"type": "function", "name": "send_email"}, temperature=0.0, max_output_tokens=22
    )
    r, events = stream(
        client, body("Email bob@example.com that the report is late.", stream=True, store=True, **fields)
    )
    assert r.status_code == 200
    [item] = _assert_every_added_item_is_done(events)
    assert item["type"] == "function_call" and item["status"] == "incomplete"
    with pytest.raises(json.JSONDecodeError):
        json.loads(item["arguments"])
    final = events[-1]
    assert final[1] == "response.incomplete"
    stored = client.get(f"{URL}/{final[2]['response_id']}").json()
    assert stored["output"] == [item]
    sync = client.post(URL, json=body("Email bob@example.com that the report is late.", **fields)).json()
    strip = lambda i: {k: v for k, v in i.items() if k not in ("id", "call_id")}  # noqa: E731
    assert sync["status"] == "incomplete" and [strip(i) for i in sync["output"]] == [strip(item)]
    task = create_task(client, body("Email bob@example.com that the report is late.", **fields))
    done = wait_final(client, task["id"])["response"]
    assert [strip(i) for i in done["output"]] == [strip(item)]
    # A client sends the cut call back as it got it: it is history, not an error.
    r = client.post(
        URL,
        json={
            "model": MODEL,
            "input": [*user("Email bob."), item, *user("Never mind.")],
            "tools": TOOLS,
            "tool_choice": "none",
            "temperature": 0.0,
            "max_output_tokens": 8,
        },
    )
    assert r.status_code == 200, r.text


def test_message_items_carry_their_status(client):  # covers: R6.3-7
    whole = client.post(URL, json=body("Say hi.", temperature=0.0, max_output_tokens=200)).json()
    cut = client.post(URL, json=body("Write a long story about a cat.", temperature=0.0, max_output_tokens=3)).json()
    assert whole["status"] == "completed" and [i["status"] for i in whole["output"]] == ["completed"]
    assert cut["status"] == "incomplete" and [i["status"] for i in cut["output"]] == ["incomplete"]


def test_an_agent_loop_keeps_its_prompt_cache(client):  # covers: R6.5-7
    # Turn 1 calls a tool; turn 2 sends its result with tool_choice none to get the answer.
    # The tools stay in the prompt either way, so turn 2 reads turn 1's prompt and call from
    # the cache and decodes only what is new.
    first = client.post(
        URL,
        json=body(
            "What is the weather in Lima?",
            tools=ENUM_TOOLS,
            tool_choice="required",
            temperature=0.0,
            max_output_tokens=64,
            store=True,
        ),
    ).json()
    [call] = first["output"]
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temperature_c": 21}'}
    second = client.post(
        URL,
        json={
            "model": MODEL,
            "previous_response_id": first["id"],
            "input": [result],
            "tools": ENUM_TOOLS,
            "tool_choice": "none",
            "temperature": 0.0,
            "max_output_tokens": 40,
        },
    ).json()
    before, after = first["usage"], second["usage"]
    assert after["input_tokens"] > before["input_tokens"] + before["output_tokens"] - 1
    reused = after["input_tokens_details"]["cached_tokens"]
    decoded = after["input_tokens"] - reused
    assert reused >= before["input_tokens"], (before, after)
    assert decoded < after["input_tokens"] // 2, (before, after)
