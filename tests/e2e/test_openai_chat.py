"""The OpenAI-compatible face, Chat Completions, through the real `openai` SDK against a real
server on the real model: sync, the SDK's stream helper, tools, structured output, stop."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import jsonschema
import openai
import orjson
import pytest

from helpers import MODEL
from test_openai import WEATHER as RESPONSES_WEATHER
from test_openai import sdk

# The same tool as the Responses tests, in the Chat Completions shape.
WEATHER = {"type": "function", "function": {k: v for k, v in RESPONSES_WEATHER.items() if k != "type"}}
HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


@pytest.fixture()
def client(server) -> Iterator[openai.OpenAI]:
    with sdk(server.url) as c:
        yield c


def test_sync_completion_and_usage(client):
    completion = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6, temperature=0, seed=1)
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    [choice] = completion.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert completion.usage.completion_tokens == 6
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 6


def test_stream_helper_chunks_and_done(client, server):
    with client.chat.completions.stream(
        model=MODEL, messages=HELLO, max_completion_tokens=200, temperature=0, stream_options={"include_usage": True}
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role] == ["assistant"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert final.choices[0].message.content == text != ""
    assert final.choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    # On the wire: data-only frames, ending with [DONE].
    payload = {"model": "scripted:test", "messages": [{"role": "user", "content": "a b"}], "stream": True}
    raw = httpx.post(f"{server.url}/v1/chat/completions", json=payload).text
    frames = [f for f in raw.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames) and frames[-1] == "data: [DONE]"


def test_tool_call_streamed_and_round_trip(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    with client.chat.completions.stream(
        model=MODEL, messages=messages, tools=[WEATHER], tool_choice=choice, temperature=0
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    deltas = [call for c in chunks for call in (c.choices[0].delta.tool_calls or [])]
    assert {d.index for d in deltas} == {0}
    assert [d.id for d in deltas if d.id] == [deltas[0].id] and [
        d.function.name for d in deltas if d.function.name
    ] == ["get_weather"]
    [call] = final.choices[0].message.tool_calls
    assert call.id == deltas[0].id and final.choices[0].finish_reason == "tool_calls"
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert "city" in orjson.loads(call.function.arguments)
    answer = client.chat.completions.create(
        model=MODEL,
        messages=[
            *messages,
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.function.name, "arguments": call.function.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18}'},
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=12,
        temperature=0,
    )
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls


def test_response_format_json_schema(client):
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "age"],
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
    }
    completion = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a fictional person: name and age."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}},
        temperature=0,
        max_tokens=60,
    )
    jsonschema.validate(orjson.loads(completion.choices[0].message.content), schema)


def test_stop_sequence_ends_the_text_before_it(client):
    free = (
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0)
        .choices[0]
        .message.content
    )
    word = free.split()[2]
    stopped = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12, temperature=0, stop=[word])
    assert stopped.choices[0].message.content == free[: free.index(word)]
    assert stopped.choices[0].finish_reason == "stop"


def test_refusals_name_the_field(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=HELLO, n=2)
    assert (raised.value.code, raised.value.param) == ("invalid_request", "n")
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=MODEL, messages=HELLO, logprobs=True)
    assert raised.value.param == "logprobs"
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="no-such:model", messages=HELLO)
    assert raised.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        )
    assert raised.value.code == "unsupported_content_type"
