"""The two rules every face's tool calls follow (docs/guides/tool-calls.md), on the real model:
a call made again ends the calls, and a tool's parameters take only the keys they list."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import orjson
import pytest
from pydantic import BaseModel

from helpers import MODEL
from test_openai import sdk
from test_openai_chat import WEATHER

TOKYO = [{"role": "user", "content": "What is the weather in Tokyo?"}]


@pytest.fixture()
def client(server) -> Iterator[openai.OpenAI]:
    with sdk(server.url) as c:
        yield c


def test_required_choice_makes_one_call_not_four(client):
    # parallel_tool_calls is on by default: the model may call up to four times, and under a
    # forced choice it repeated {"city": "Tokyo"} until 160 tokens ran out.
    completion = client.chat.completions.create(
        model=MODEL, messages=TOKYO, tools=[WEATHER], tool_choice="required", max_tokens=160, temperature=0
    )
    [choice] = completion.choices
    calls = choice.message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert "city" in orjson.loads(calls[0].function.arguments)
    assert choice.finish_reason == "tool_calls"
    assert completion.usage.completion_tokens < 160


def test_stream_helper_with_tools_ends_on_the_call(client):
    with client.chat.completions.stream(
        model=MODEL, messages=TOKYO, tools=[WEATHER], tool_choice="required", max_tokens=96, temperature=0
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert len(final.choices[0].message.tool_calls) == 1


class Forecast(BaseModel):
    """A city's forecast."""

    city: str
    temperature_c: int
    sunny: bool


def test_langchain_structured_output_by_function_calling(server):
    chat_openai = pytest.importorskip("langchain_openai").ChatOpenAI
    # LangChain's tool schema for a pydantic model lists its properties and says nothing of
    # additionalProperties: the arguments hold exactly those keys, so 64 tokens are plenty.
    llm = chat_openai(
        model=MODEL, base_url=f"{server.url}/v1", api_key="sk-placeholder", max_tokens=64, temperature=0, max_retries=0
    )
    structured = llm.with_structured_output(Forecast, method="function_calling")
    forecast = structured.invoke("Tomorrow in Lisbon: 24 degrees and sunny. Give the forecast.")
    assert isinstance(forecast, Forecast) and forecast.city
