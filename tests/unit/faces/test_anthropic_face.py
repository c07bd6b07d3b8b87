"""The Anthropic face's translation and stream projection on their own (faces/anthropic): a
request's blocks as LMSP items and its choices as the plan's; the stream's events read back by
the anthropic SDK's own accumulator into the message the sync route would answer."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lmsp.engine.tools import NamedChoice
from lmsp.faces.anthropic.messages import MessageEvents, message_object
from lmsp.faces.anthropic.translate import translate_count_tokens, translate_messages
from lmsp.protocol import events as ev
from lmsp.protocol.errors import ProblemError

M = "smollm2:135m-instruct-q4_1"
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def _request(**fields: Any) -> dict[str, Any]:
    return {"model": M, "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}], **fields}


def test_blocks_become_items_and_choices_the_plans():
    body = _request(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Rome?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hm", "signature": "x"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "down", "is_error": True}],
            },
        ],
        tools=[TOOL],
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        temperature=0.0,
        top_k=20,
    )
    plan = translate_messages(body, "local").plan
    assert plan.instructions == "Be brief." and plan.max_output_tokens == 50 and plan.stop == ("END",)
    assert [i["type"] for i in plan.input] == ["message", "message", "function_call", "function_call_output"]
    assert plan.input[0]["content"][0]["text"] == "Weather in Rome?"
    assert plan.input[2]["arguments"] == '{"city":"Rome"}' and plan.input[3]["output"] == "Error: down"
    assert plan.tools is not None and plan.tools.choice == NamedChoice("get_weather") and not plan.tools.parallel
    assert plan.sampling.temperature == 0.0 and plan.sampling.top_k == 20
    assert plan.reasoning is not None and plan.reasoning.effort == "none"  # no `thinking`: none, as on Anthropic
    any_choice = translate_messages(_request(tools=[TOOL], tool_choice={"type": "any"}), "local").plan
    assert any_choice.tools is not None and any_choice.tools.choice == "required" and any_choice.tools.parallel
    thinking = translate_messages(_request(thinking={"type": "enabled", "budget_tokens": 20}), "local")
    assert thinking.thinking and thinking.plan.reasoning is not None and thinking.plan.reasoning.budget_tokens == 20
    assert translate_count_tokens({"model": M, "messages": [{"role": "user", "content": "hi"}]}, "local").model == M


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"temprature": 1}, "temprature"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "messages"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"thinking": {"type": "enabled", "budget_tokens": 50}}, "thinking.budget_tokens"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
    ],
)
def test_refusals_name_the_field(fields, param):
    with pytest.raises(ProblemError) as refused:
        translate_messages(_request(**fields), "local")
    assert refused.value.status == 400 and refused.value.param == param


def _events() -> list[tuple[str, dict[str, Any]]]:
    """A run that thinks, writes text, then calls a tool, as the builder logs it."""
    rs = {"id": "rs_1", "type": "reasoning", "summary": []}
    msg = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "status": "in_progress"}
    fc = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": ""}
    done_rs = {**rs, "summary": [{"type": "summary_text", "text": "Rome, so: call."}]}
    done_msg = {**msg, "content": [{"type": "output_text", "text": "Let me look."}], "status": "completed"}
    done_fc = {**fc, "arguments": '{"city": "Rome"}', "status": "completed"}
    usage = {"input_tokens": 30, "input_tokens_details": {"cached_tokens": 10}, "output_tokens": 12}
    return (
        [
            (ev.CREATED, {"response_id": "resp_1", "status": "in_progress"}),
            (ev.ITEM_ADDED, {"output_index": 0, "item": rs}),
            (ev.REASONING_DELTA, {"item_id": "rs_1", "delta": "Rome, "}),
            (ev.REASONING_DELTA, {"item_id": "rs_1", "delta": "so: call."}),
            (ev.ITEM_DONE, {"output_index": 0, "item": done_rs}),
            (ev.ITEM_ADDED, {"output_index": 1, "item": msg}),
            (ev.TEXT_DELTA, {"item_id": "msg_1", "delta": "Let me "}),
            (ev.TEXT_DELTA, {"item_id": "msg_1", "delta": "look."}),
            (ev.ITEM_DONE, {"output_index": 1, "item": done_msg}),
            (ev.ITEM_ADDED, {"output_index": 2, "item": fc}),
            (ev.ARGUMENTS_DELTA, {"item_id": "fc_1", "delta": '{"city": '}),
            (ev.ARGUMENTS_DELTA, {"item_id": "fc_1", "delta": '"Rome"}'}),
            (ev.ITEM_DONE, {"output_index": 2, "item": done_fc}),
            (ev.COMPLETED, {"response_id": "resp_1", "status": "completed", "usage": usage}),
        ],
        [done_rs, done_msg, done_fc],
        usage,
    )


def test_the_stream_reads_back_as_the_message():
    anthropic_streaming = pytest.importorskip("anthropic.lib.streaming._messages")
    events, output, usage = _events()
    projected = MessageEvents("resp_1", M, thinking=True)
    raw = b"".join(projected.frames(name, orjson.dumps(data)) for name, data in events)
    frames = [f for f in raw.decode().split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    snapshot = None
    bufs: dict[int, bytes] = {}  # the accumulator's partial tool inputs, kept across events
    for frame in frames:
        name, data = frame.split("\n", 1)
        if name == "event: ping":
            continue
        snapshot = anthropic_streaming.accumulate_event(
            event=orjson.loads(data.removeprefix("data: ")), current_snapshot=snapshot, json_bufs=bufs
        )
    assert snapshot is not None
    final = {"id": "resp_1", "model": M, "status": "completed", "output": output, "usage": usage}
    expected = message_object(final, thinking=True)
    assert snapshot.to_dict(exclude_none=True) == {k: v for k, v in expected.items() if v is not None} | {
        "content": [{k: v for k, v in block.items() if v is not None} for block in expected["content"]]
    }
    assert expected["stop_reason"] == "tool_use"
    assert [b["type"] for b in expected["content"]] == ["thinking", "text", "tool_use"]
    assert expected["usage"]["input_tokens"] == 20 and expected["usage"]["cache_read_input_tokens"] == 10
