"""Thinking models (issue 29) on the embedded model, rendered through the real published
templates: the thinking becomes a `reasoning` item before the answer, streamed, counted,
controlled, kept out of the answer's markup, and given back to the template as it expects.

The embedded model never thinks on its own. A template that opens the block in the prompt
(DeepSeek-R1's distills) and a grammar that bounds the block's length (the thinking budget,
`extensions.reasoning_budget`) take it through one: free text, then `</think>`, then the
answer in the request's own grammar (a JSON schema, a tool call).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest

from fixture_files import FIXTURES, real_template
from helpers import MODEL, checked_client, stream, user
from lmsp._core import EventLog
from lmsp.client import Client
from lmsp.engine.backends import LlamaBackend
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.sampling import Sampling
from lmsp.engine.scheduler import SchedulerConfig
from lmsp.engine.sequence import GenerationRequest
from lmsp.engine.thinking import opens_in_prompt, template_variables, thinking_grammar
from lmsp.engine.tools import tool_grammar
from lmsp.service.builder import EventBuilder
from lmsp.service.messages import chat_messages, template_tools
from lmsp.service.reasoning import ThinkingSink
from lmsp.testing import RunningServer, isolated_env, start_server, worker_threads

R1 = "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"
BUDGET = 6  # thinking tokens: enough to see, few enough to keep the tests quick
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Tokyo", "Lima"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
MARKUP = ("<think>", "</think>", "<|channel|>", "<｜")


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server whose model renders with the R1 distill's published template."""
    work = tmp_path_factory.mktemp("think")
    env = isolated_env(work / "user", LMSP_CHAT_TEMPLATE_FILE=str(FIXTURES / "templates" / f"{R1}.jinja"))
    srv = start_server(work, "--parallel", "1", "--keep-alive", "-1", "--preload", MODEL, env=env)
    yield srv
    srv.stop()


def _thinking(budget: int = BUDGET, **fields: Any) -> dict[str, Any]:
    extensions = {"reasoning_budget": budget, "seed": 0, **fields.pop("extensions", {})}
    return {"model": MODEL, "temperature": 0, "extensions": extensions, **fields}


JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}


def test_json_after_thinking_streams_a_reasoning_item_first(thinker):
    with checked_client(thinker.url) as c:
        _, events = stream(c, _thinking(input=user("What is 2+2?"), response_format=JSON_FORMAT))
    names = [name for _, name, _ in events]
    assert names[-1] == "response.completed", names
    added = [d for _, n, d in events if n == "response.output_item.added"]
    done = [d for _, n, d in events if n == "response.output_item.done"]
    assert [d["item"]["type"] for d in added] == ["reasoning", "message"]
    assert [(d["output_index"], d["item"]["type"]) for d in done] == [(0, "reasoning"), (1, "message")]
    reasoning, message = done[0]["item"], done[1]["item"]
    assert reasoning["id"].startswith("rs_")
    deltas = [d for _, n, d in events if n == "response.reasoning_summary_text.delta"]
    assert deltas and all(d["item_id"] == reasoning["id"] and d["output_index"] == 0 for d in deltas)
    [part] = reasoning["summary"]
    assert part["type"] == "summary_text" and part["text"] == "".join(d["delta"] for d in deltas)
    # Every reasoning delta comes before the message starts.
    assert names.index("response.output_text.delta") > max(
        i for i, n in enumerate(names) if n == "response.reasoning_summary_text.delta"
    )
    text = message["content"][0]["text"]
    assert not any(m in text or m in part["text"] for m in MARKUP), (part, text)
    jsonschema.validate(json.loads(text), ANSWER)
    usage = events[-1][2]["usage"]
    # The budget's tokens, and the closer's: `</think>` is several tokens in this vocabulary.
    assert 0 < usage["output_tokens_details"]["reasoning_tokens"] <= BUDGET + 10 < usage["output_tokens"] + 10


def test_a_tool_call_after_thinking(thinker):
    with checked_client(thinker.url) as c:
        answer = c.post(
            "/lmsp/v1/responses",
            json=_thinking(input=user("Weather in Lima?"), tools=[WEATHER], tool_choice="required"),
        ).json()
    assert answer["status"] == "completed"
    reasoning, call = answer["output"]
    assert reasoning["type"] == "reasoning" and call["type"] == "function_call"
    assert not any(m in call["arguments"] for m in MARKUP)
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])


def test_effort_none_thinks_not(thinker):
    with checked_client(thinker.url) as c:
        answer = c.post(
            "/lmsp/v1/responses",
            json=_thinking(
                input=user("What is 2+2?"), response_format=JSON_FORMAT, extensions={"reasoning_effort": "none"}
            ),
        ).json()
    assert answer["status"] == "completed"
    assert [item["type"] for item in answer["output"]] == ["message"]
    assert "output_tokens_details" not in answer["usage"]
    jsonschema.validate(json.loads(answer["output"][0]["content"][0]["text"]), ANSWER)


def test_cut_inside_thinking_ends_incomplete_with_the_item_closed(thinker):
    # No grammar: the embedded model never closes the block itself, max_output_tokens cuts it.
    with checked_client(thinker.url) as c:
        _, events = stream(c, _thinking(input=user("Tell me a story."), max_output_tokens=6))
    assert events[-1][1] == "response.incomplete"
    [done] = [d for _, n, d in events if n == "response.output_item.done"]
    assert done["item"]["type"] == "reasoning" and done["item"]["summary"][0]["text"]
    assert events[-1][2]["usage"]["output_tokens_details"]["reasoning_tokens"] == 6


def test_bad_controls_are_problems_naming_them(thinker):
    with checked_client(thinker.url) as c:
        for extensions, param in (
            ({"reasoning_effort": "huge"}, "extensions.reasoning_effort"),
            ({"reasoning_budget": 0}, "extensions.reasoning_budget"),
        ):
            answer = c.post("/lmsp/v1/responses", json=_thinking(input=user("x"), extensions=extensions))
            assert answer.status_code == 400 and answer.json()["param"] == param
        sdk = openai.OpenAI(base_url=f"{thinker.url}/v1", api_key="sk-placeholder", max_retries=0)
        with pytest.raises(openai.BadRequestError):
            sdk.responses.create(model=MODEL, input="x", reasoning={"effort": "enormous"})  # type: ignore[typeddict-item]


def test_models_say_which_model_thinks(thinker):
    with checked_client(thinker.url) as c:
        [model] = [m for m in c.get("/lmsp/v1/models").json()["data"] if m["id"] == MODEL]
    assert "reasoning" in model["capabilities"]


def test_openai_sdk_responses_and_chat(thinker):
    sdk = openai.OpenAI(base_url=f"{thinker.url}/v1", api_key="sk-placeholder", max_retries=0, timeout=120)
    extra = {"extensions": {"reasoning_budget": BUDGET, "seed": 0}}
    with sdk.responses.stream(
        model=MODEL,
        input="What is 2+2?",
        temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}},
        extra_body=extra,
    ) as events:
        seen = list(events)
        final = events.get_final_response()
    kinds = [e.type for e in seen]
    assert "response.reasoning_summary_part.added" in kinds and "response.reasoning_summary_text.done" in kinds
    reasoning, message = final.output
    assert reasoning.type == "reasoning" and message.type == "message"
    deltas = "".join(e.delta for e in seen if e.type == "response.reasoning_summary_text.delta")
    assert reasoning.summary[0].text == deltas and deltas
    jsonschema.validate(json.loads(final.output_text), ANSWER)
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens > 0

    chunks = list(
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is 2+2?"}],
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}},
            stream=True,
            extra_body={"seed": 0, "reasoning_effort": "low", "reasoning_budget": BUDGET},
        )
    )
    thinking = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert thinking and not any(m in content or m in thinking for m in MARKUP)
    jsonschema.validate(json.loads(content), ANSWER)


def test_lmsp_client_and_history_through_previous_response_id(thinker):
    with Client(thinker.url) as lm:
        controls = {"temperature": 0, "extensions": {"reasoning_budget": BUDGET, "seed": 0}}
        first = lm.responses.create(
            model=MODEL, input="What is 2+2?", response_format=JSON_FORMAT, store=True, **controls
        )
        assert first.reasoning and not any(m in first.text for m in MARKUP)
        # The stored reasoning item goes back through the template, which drops an earlier
        # turn's thinking: the next turn is answered as if it had been sent without it.
        second = lm.responses.create(
            model=MODEL,
            input="And 3+3?",
            previous_response_id=first.id,
            response_format=JSON_FORMAT,
            **controls,
        )
    assert second.status == "completed" and second.reasoning
    jsonschema.validate(json.loads(second.text), ANSWER)


# --- history, byte for byte, through each template that keeps or drops earlier thinking


class _Recording:
    def __init__(self, sink: ThinkingSink) -> None:
        self.sink = sink
        self.raw: list[str] = []
        self.ended = threading.Event()

    def on_text(self, text: str) -> bool | None:
        self.raw.append(text)
        return self.sink.on_text(text)

    def on_finish(self, *args: Any) -> None:
        self.sink.on_finish(*args)
        self.ended.set()

    def on_error(self, message: str) -> None:
        self.sink.on_error(message)
        self.ended.set()


@pytest.fixture(scope="module")
def qwen3() -> Iterator[LlamaBackend]:
    path = embedded_model_path()
    assert path is not None
    config = SchedulerConfig(n_parallel=1, ctx_per_sequence=2048, n_threads=worker_threads(), max_queue=4)
    llama = LlamaBackend(path, config, name="qwen3", chat_template=real_template("Qwen-Qwen3-0.6B"))
    yield llama
    llama.close()


def test_qwen3_keeps_thinking_within_a_tool_turn_and_drops_it_after(qwen3):
    fmt = qwen3.thinking
    assert fmt is not None and qwen3.calls.native
    question = user("What is the weather in Lima?")
    tools = template_tools([WEATHER])
    variables = template_variables(fmt, "medium")
    prompt, text = qwen3.prepare(chat_messages(question, 0, tools=True, calls=qwen3.calls), tools, variables=variables)
    opened = opens_in_prompt(fmt, text)
    assert not opened  # Qwen3 lets the model open the block
    answer = tool_grammar([WEATHER], "required", qwen3.calls)
    grammar = asyncio.run(qwen3.grammars.lark(thinking_grammar(fmt, opened=False, budget=BUDGET, answer=answer)))  # type: ignore[union-attr]
    builder = EventBuilder(EventLog(), "resp_01M8Q0SWQS3S71JS3EZEDT9Q3D", calls=qwen3.calls)
    sink = _Recording(ThinkingSink(builder, fmt, opened=opened))
    qwen3.submit(
        GenerationRequest(prompt=prompt, max_tokens=80, sink=sink, sampling=Sampling(temperature=0.0), grammar=grammar)
    )
    assert sink.ended.wait(60)
    response = builder.response(created_at=0, model="m")
    written = "".join(sink.raw)
    assert response["status"] == "completed", (response, written)
    reasoning, call = response["output"]
    assert reasoning["type"] == "reasoning" and call["type"] == "function_call"
    # Within the tool turn the template renders the thinking back as the model wrote it: the
    # next request's prompt starts with this one's and its whole output (the KV cache holds).
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temperature_c": 21}'}
    history = [*question, reasoning, call, result]
    _, next_text = qwen3.prepare(chat_messages(history, 0, tools=True, calls=qwen3.calls), tools, variables=variables)
    # (The grammar writes the block's frame as the template does; the model's own text inside
    # may begin with a newline, which the template strips, as Qwen3 itself never writes it.)
    thought = reasoning["summary"][0]["text"]
    assert written.startswith("<think>\n") and thought in written
    canonical = "<think>\n" + thought + written[written.index("\n</think>\n\n") :]
    assert next_text.startswith(text + canonical), (text + canonical, next_text)
    # Once a later user turn follows, the template drops the earlier thinking: the same bytes
    # as the conversation rendered without the reasoning item at all.
    later = [*history, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "21 C."}]}]
    later += user("Thanks!")
    with_item = qwen3.prepare(chat_messages(later, 0, tools=True, calls=qwen3.calls), tools, variables=variables)
    without = [item for item in later if item["type"] != "reasoning"]
    bare = qwen3.prepare(chat_messages(without, 0, tools=True, calls=qwen3.calls), tools, variables=variables)
    assert with_item[1] == bare[1] and reasoning["summary"][0]["text"] not in with_item[1]
