"""The thinking splitter (service/reasoning.py) and the thinking frames (engine/thinking.py):
the thinking and the answer come apart at every chunking, with no markup on either side."""

from __future__ import annotations

import pytest

from fixture_files import real_template
from lmsp.engine.thinking import (
    HARMONY,
    closing_suffix,
    opens_in_prompt,
    template_variables,
    think_format_of,
    thinking_grammar,
)
from lmsp.service.reasoning import ThinkSplitter


class _Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def reasoning_started(self) -> None:
        self.log.append(("started", ""))

    def reasoning(self, delta: str) -> None:
        self.log.append(("reasoning", delta))

    def reasoning_done(self) -> None:
        self.log.append(("done", ""))

    def answer(self, text: str) -> None:
        self.log.append(("answer", text))

    def parts(self) -> tuple[str | None, str]:
        kinds = [k for k, _ in self.log]
        thinking = "".join(t for k, t in self.log if k == "reasoning") if "started" in kinds else None
        if "started" in kinds:
            assert kinds.count("started") == kinds.count("done") == 1
            assert kinds.index("started") < kinds.index("done")
            assert all(kinds.index("done") < i for i, k in enumerate(kinds) if k == "answer")
        return thinking, "".join(t for k, t in self.log if k == "answer")


def _split(text: str, size: int, *, opened: bool, fmt=None) -> tuple[str | None, str]:
    events = _Events()
    splitter = ThinkSplitter(events, fmt or think_format_of("<think></think>"), opened=opened)
    for i in range(0, len(text), size):
        splitter.feed(text[i : i + size])
    splitter.flush()
    return events.parts()


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_think_tags_split_at_any_chunking(size):
    raw = "<think>\nLet me see: 2 < 3, so </thin is not a close.\n</think>\n\nThe answer is 4."
    assert _split(raw, size, opened=False) == ("Let me see: 2 < 3, so </thin is not a close.", "The answer is 4.")
    # The template opened the block: the output starts inside it.
    assert _split(raw.removeprefix("<think>"), size, opened=True) == (
        "Let me see: 2 < 3, so </thin is not a close.",
        "The answer is 4.",
    )


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_no_thinking_is_all_answer_and_a_cut_block_closes(size):
    assert _split("  Hello <thinking> world", size, opened=False) == (None, "  Hello <thinking> world")
    assert _split("<think>\nhalf a thou", size, opened=False) == ("half a thou", "")


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_harmony_channels(size):
    raw = "<|channel|>analysis<|message|>User wants hi.<|end|><|start|>assistant<|channel|>final<|message|>Hi!"
    assert _split(raw, size, opened=False, fmt=HARMONY) == ("User wants hi.", "Hi!")
    assert _split("<|channel|>final<|message|>Hi!", size, opened=False, fmt=HARMONY) == (None, "Hi!")


def test_each_family_is_detected_from_its_published_template():
    qwen3 = think_format_of(real_template("Qwen-Qwen3-0.6B"))
    r1 = think_format_of(real_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"))
    qwq = think_format_of(real_template("Qwen-QwQ-32B"))
    oss = think_format_of(real_template("openai-gpt-oss-120b"))
    assert qwen3 is not None and qwen3.style == "tags" and qwen3.switch
    assert r1 is not None and r1.style == "tags" and qwq is not None and qwq.style == "tags"
    assert oss is HARMONY and template_variables(oss, "high") == {"reasoning_effort": "high"}
    assert template_variables(qwen3, "none") == {"enable_thinking": False}
    for plain in (
        "Qwen-Qwen2.5-7B-Instruct",
        "meta-llama-Llama-3.1-8B-Instruct",
        "mistralai-Mistral-Nemo-Instruct-2407",
    ):
        assert think_format_of(real_template(plain)) is None
    assert opens_in_prompt(r1, "<｜Assistant｜><think>\n") and not opens_in_prompt(r1, "<think>\n</think>")
    assert closing_suffix(r1, "<｜Assistant｜><think>\n") == "\n</think>\n\n"
    assert closing_suffix(oss, "<|start|>assistant") == "<|channel|>final<|message|>"


def test_the_grammar_thinks_then_answers_in_the_answers_own_grammar():
    fmt = think_format_of("<think>")
    assert fmt is not None
    grammar = thinking_grammar(fmt, opened=False, budget=32, answer='start: %json {"type": "integer"}')
    assert grammar.splitlines()[0] == 'start: "<think>\\n" think "\\n</think>\\n\\n" answer'
    assert "think[max_tokens=32]" in grammar and 'answer: %json {"type": "integer"}' in grammar
    assert thinking_grammar(fmt, opened=True, budget=8, answer=None).startswith('start: think "\\n</think>')
