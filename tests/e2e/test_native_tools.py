"""Templates that render tools themselves (Qwen 2.5/3, Hermes 2 Pro, Llama 3.1+, Mistral):
the tools and earlier calls go through the template, and the grammar writes calls in the
frame that template renders them in.

Each published template (real text, in tests/fixtures/templates/) runs on the embedded model: its
tokenizer, its vocabulary for the grammar, and a real constrained generation through the
scheduler. The call the model writes is then sent back as history, and the template must
render it byte for byte as it was written, so the next turn starts from the same prefix.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from fixture_files import real_template
from lmsp._core import EventLog
from lmsp.engine.backends import LlamaBackend
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.sampling import Sampling
from lmsp.engine.scheduler import SchedulerConfig
from lmsp.engine.sequence import FinishReason, GenerationRequest
from lmsp.engine.tools import HERMES, LLAMA3, MISTRAL, CallFormat, NamedChoice, tool_grammar
from lmsp.service.builder import EventBuilder
from lmsp.service.messages import chat_messages, template_tools
from lmsp.testing import worker_threads

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
TOOLS = [WEATHER, {"type": "function", "name": "get_time", "description": "The current time."}]
QUESTION = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is the weather in Lima?"}]}
]

# name → (frame, whether turn 2's prompt starts with turn 1's prompt and call: Mistral's
# template moves the tool list to the last user turn, so nothing can keep its prefix).
TEMPLATES = {
    "Qwen-Qwen2.5-7B-Instruct": (HERMES, True),
    "Qwen-Qwen3-0.6B": (HERMES, True),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": (HERMES, True),
    "meta-llama-Llama-3.1-8B-Instruct": (LLAMA3, True),
    "meta-llama-Llama-3.2-3B-Instruct": (LLAMA3, True),
    "meta-llama-Llama-3.3-70B-Instruct": (LLAMA3, True),
    "mistralai-Mistral-Nemo-Instruct-2407": (MISTRAL, False),
}


class _Recording:
    """The builder as sink, plus the raw text the model wrote."""

    def __init__(self, builder: EventBuilder) -> None:
        self.builder = builder
        self.raw: list[str] = []
        self.ended = threading.Event()

    def on_text(self, text: str) -> None:
        self.raw.append(text)
        self.builder.on_text(text)

    def on_finish(self, reason: FinishReason, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        self.builder.on_finish(reason, input_tokens, output_tokens, cached_tokens)
        self.ended.set()

    def on_error(self, message: str) -> None:
        self.builder.on_error(message)
        self.ended.set()


@pytest.fixture(scope="module", params=list(TEMPLATES))
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[str, LlamaBackend]]:
    path = embedded_model_path()
    assert path is not None
    config = SchedulerConfig(n_parallel=1, ctx_per_sequence=2048, n_threads=worker_threads(), max_queue=4)
    llama = LlamaBackend(path, config, name=request.param, chat_template=real_template(request.param))
    yield request.param, llama
    llama.close()


def _same_call_format(a: CallFormat, b: CallFormat) -> bool:
    return (a.opener, a.args_key, a.closer, a.sep, a.prefix, a.suffix) == (
        b.opener,
        b.args_key,
        b.closer,
        b.sep,
        b.prefix,
        b.suffix,
    )


def _generate(llama: LlamaBackend, prompt: list[int], choice: Any) -> tuple[dict[str, Any], str]:
    grammar = asyncio.run(llama.grammars.lark(tool_grammar(TOOLS, choice, llama.calls)))  # type: ignore[union-attr]
    sink = _Recording(EventBuilder(EventLog(), "resp_01M8Q0SWQS3S71JS3EZEDT9Q3D", calls=llama.calls))
    llama.submit(
        GenerationRequest(
            prompt=prompt, max_tokens=64, sink=sink, sampling=Sampling(temperature=0.0, seed=0), grammar=grammar
        )
    )
    assert sink.ended.wait(60)
    return sink.builder.response(created_at=0, model="m"), "".join(sink.raw)


def test_the_template_names_its_frame_and_renders_the_tools(backend):
    name, llama = backend
    frame, _ = TEMPLATES[name]
    assert llama.calls.native and _same_call_format(llama.calls, frame)
    messages = chat_messages(QUESTION, 0, tools=True, calls=llama.calls)
    _, text = llama.prepare(messages, template_tools(TOOLS))
    # The template's own tool section, not ours: the schema is in it, our wording is not.
    assert "get_weather" in text and "Current weather for a city." in text and '"Lima"' in text
    assert "You may call functions to help" not in text


@pytest.mark.parametrize("choice", ["required", NamedChoice("get_weather")], ids=["required", "named"])
def test_a_call_in_the_templates_frame_goes_back_in_as_it_was_written(backend, choice):  # covers: R6.5-4, R6.5-5
    name, llama = backend
    _, keeps_prefix = TEMPLATES[name]
    tools = template_tools(TOOLS)
    prompt, text = llama.prepare(chat_messages(QUESTION, 0, tools=True, calls=llama.calls), tools)
    response, written = _generate(llama, prompt, choice)
    assert response["status"] == "completed", (response, written)
    [call] = response["output"]
    assert call["type"] == "function_call" and call["name"] == "get_weather" and call["status"] == "completed"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER["parameters"])
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temperature_c": 21}'}
    history = [*QUESTION, call, result]
    _, next_text = llama.prepare(chat_messages(history, 0, tools=True, calls=llama.calls), tools)
    if keeps_prefix:
        assert next_text.startswith(text + written), (text + written, next_text)
    else:  # the call is still rendered as the model wrote it, its id being the template's own
        head = written[: written.index(', "id": ')]
        assert head in next_text and '{"temperature_c": 21}' in next_text
