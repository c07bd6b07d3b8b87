"""The Anthropic face (`/v1/messages`) through the real `anthropic` SDK against a real server on
the real model: messages, the stream helper, tool use and its round trip, count_tokens, typed
errors, and tokens sent as `x-api-key` or `Authorization: Bearer`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from helpers import MODEL, SCRIPTED, make_token
from lmsp.testing import RunningServer, start_server

anthropic = pytest.importorskip("anthropic")

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
    },
}
HELLO = [{"role": "user", "content": "Say hello."}]
# The newest SDK's signature has no sampling fields (Claude Code and older SDKs send them):
# they go in `extra_body`.
GREEDY = {"extra_body": {"temperature": 0}}


def sdk(url: str, **auth: str) -> anthropic.Anthropic:
    # A placeholder key, as people configure SDKs for local servers: ignored without tokens.
    auth = auth or {"api_key": "sk-ant-placeholder"}
    return anthropic.Anthropic(base_url=url, max_retries=0, timeout=120, **auth)


@pytest.fixture()
def client(server) -> Iterator[anthropic.Anthropic]:
    with sdk(server.url) as c:
        yield c


def test_create_plain(client):
    message = client.messages.create(model=MODEL, max_tokens=8, messages=HELLO, **GREEDY)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == MODEL
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 8
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0


def test_system_multi_turn_and_count_tokens(client):
    request = {
        "model": MODEL,
        "system": "Answer in one word.",
        "messages": [
            {"role": "user", "content": "What color is the sky?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
            {"role": "user", "content": [{"type": "text", "text": "And grass?"}]},
        ],
    }
    message = client.messages.create(**request, max_tokens=12, extra_body={"temperature": 0, "top_k": 40, "top_p": 0.9})
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    # The prompt the message was made from, counted without generating.
    counted = client.messages.count_tokens(**request)
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens
    with_tools = client.messages.count_tokens(**request, tools=[WEATHER])
    assert with_tools.input_tokens > counted.input_tokens


def test_stream_text_and_final_message(client):
    with client.messages.stream(model=MODEL, max_tokens=24, messages=HELLO, system="Be brief.", **GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0
    # On the wire: the events in Anthropic's order.
    raw = client.messages.create(model=MODEL, max_tokens=4, messages=HELLO, stream=True)
    kinds = [event.type for event in raw]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_forced_tool_use_validates_and_round_trips(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    message = client.messages.create(
        model=MODEL,
        max_tokens=100,
        messages=messages,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        **GREEDY,
    )
    [call] = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather" and message.stop_reason == "tool_use"
    schema = {**WEATHER["input_schema"], "additionalProperties": False}  # absent: closed for tools
    jsonschema.validate(call.input, schema)
    answer = client.messages.create(
        model=MODEL,
        max_tokens=24,
        messages=[
            *messages,
            {"role": "assistant", "content": message.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 24 degrees."}],
            },
        ],
        tools=[WEATHER],
        **GREEDY,
    )
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_streamed_tool_use_with_any(client):
    with client.messages.stream(
        model=MODEL,
        max_tokens=100,
        messages=[{"role": "user", "content": "Weather in Tokyo?"}],
        tools=[WEATHER],
        tool_choice={"type": "any"},
        **GREEDY,
    ) as stream:
        final = stream.get_final_message()
    calls = [block for block in final.content if block.type == "tool_use"]
    # One call: the same call made again ends the calls instead (docs/guides/tool-calls.md).
    assert len(calls) == 1 and final.stop_reason == "tool_use"
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])


def test_typed_errors(client, server):
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="no-such-model", max_tokens=4, messages=HELLO)
    assert missing.value.body["type"] == "error" and missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError) as unknown:
        client.messages.create(model=MODEL, max_tokens=4, messages=HELLO, extra_body={"frequency": 1})
    error = unknown.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "frequency"
    with pytest.raises(anthropic.BadRequestError) as out_of_range:
        client.messages.create(model=MODEL, max_tokens=4, messages=HELLO, extra_body={"temperature": 1.5})
    assert out_of_range.value.body["error"]["param"] == "temperature"
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    with pytest.raises(anthropic.BadRequestError) as media:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [image]}])
    assert media.value.body["error"]["param"] == "messages[0].content[0]"
    # Not JSON, and a route that is not there: Anthropic's shape all the same.
    raw = httpx.post(f"{server.url}/v1/messages", content=b"{", headers={"content-type": "application/json"})
    assert raw.status_code == 400 and raw.json()["type"] == "error"
    gone = httpx.get(f"{server.url}/v1/messages")
    assert gone.status_code == 405 and gone.json()["error"]["type"] == "invalid_request_error"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    work = tmp_path_factory.mktemp("anthropic-tokens")
    data_dir = work / "data"
    make_token(data_dir, "models:read")  # the service has tokens from the start
    server = start_server(work, "--data-dir", str(data_dir), "--scripted-model", SCRIPTED)
    yield server, data_dir
    server.stop()


def test_tokens_as_api_key_or_bearer(secured):
    server, data_dir = secured
    writer = make_token(data_dir, "responses:write")
    reader = make_token(data_dir, "models:read")
    body = {"model": SCRIPTED, "max_tokens": 4, "messages": [{"role": "user", "content": "a b"}]}
    for auth in ({"api_key": writer}, {"auth_token": writer}):
        with sdk(server.url, **auth) as c:
            assert c.messages.create(**body).type == "message"
    with sdk(server.url, api_key="lmsp_not-a-token") as c, pytest.raises(anthropic.AuthenticationError) as bad:
        c.messages.create(**body)
    assert bad.value.body["error"]["type"] == "authentication_error"
    with sdk(server.url, api_key=reader) as c, pytest.raises(anthropic.PermissionDeniedError) as scope:
        c.messages.create(**body)
    assert scope.value.body["error"]["type"] == "permission_error"
