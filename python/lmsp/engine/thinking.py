"""Whether and how a model thinks before it answers, read from its chat template.

Two families write their thinking in the output, each in a frame of its own:

- `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1 and its distills): the thinking, then the
  answer. Some templates open the block in the prompt themselves (the R1 distills, QwQ), so
  the output starts inside it; Qwen3's and llama.cpp's copies of the others read
  `enable_thinking` (false: the prompt holds an empty block and the model answers at once).
- gpt-oss's harmony channels: `<|channel|>analysis<|message|>…<|end|>`, then
  `<|start|>assistant<|channel|>final<|message|>` and the answer; the template reads
  `reasoning_effort` (low, medium, high).

Any other template: the model does not think, and nothing here applies to it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import orjson

__all__ = [
    "BUDGETS",
    "HARMONY",
    "TAGS",
    "ThinkFormat",
    "closing_suffix",
    "opens_in_prompt",
    "template_variables",
    "think_format_of",
    "thinking_grammar",
]

Effort = Literal["none", "low", "medium", "high"]

# Thinking tokens at most, by effort, when a grammar bounds the thinking (a constraint or an
# asked-for effort). They count toward max_output_tokens like any output token.
BUDGETS: dict[str, int] = {"low": 256, "medium": 1024, "high": 4096}


@dataclass(frozen=True)
class ThinkFormat:
    style: Literal["tags", "harmony"]
    opener: str  # what opens the thinking block
    closer: str  # what closes it
    # What comes between the closer and the answer (harmony's final channel's head; the
    # whitespace the model writes after `</think>` is dropped as it comes).
    answer_head: str
    # Heads that open the answer straight away, with no thinking before them.
    direct_heads: tuple[str, ...] = ()
    switch: bool = False  # the template reads `enable_thinking`
    efforts: bool = False  # the template reads `reasoning_effort`

    @property
    def name(self) -> str:
        return "think_tags" if self.style == "tags" else "harmony"


TAGS = ThinkFormat("tags", "<think>", "</think>", "")
HARMONY = ThinkFormat(
    "harmony",
    "<|channel|>analysis<|message|>",
    "<|end|>",
    "<|start|>assistant<|channel|>final<|message|>",
    direct_heads=("<|channel|>final<|message|>",),
    efforts=True,
)


def think_format_of(source: str) -> ThinkFormat | None:
    """The thinking frame a template renders, or None: the model does not think."""
    if "<|channel|>" in source and "analysis" in source:
        return HARMONY
    if "<think>" in source or "</think>" in source:
        return ThinkFormat("tags", TAGS.opener, TAGS.closer, "", switch="enable_thinking" in source)
    return None


def template_variables(fmt: ThinkFormat, effort: Effort) -> dict[str, object]:
    """What the template is told: thinking on or off, and harmony's effort (it has no `none`:
    its lowest, and the prompt then skips the analysis channel, `closing_suffix`)."""
    variables: dict[str, object] = {}
    if fmt.switch:
        # Always said: llama.cpp's copies of the R1 and QwQ templates close the block when it
        # is left undefined, so a model would never think by default.
        variables["enable_thinking"] = effort != "none"
    if fmt.efforts:
        variables["reasoning_effort"] = "low" if effort == "none" else effort
    return variables


def opens_in_prompt(fmt: ThinkFormat, prompt: str) -> bool:
    """The prompt ends inside an open thinking block: the output starts with thinking."""
    at = prompt.rfind(fmt.opener)
    return at >= 0 and fmt.closer not in prompt[at:]


def closing_suffix(fmt: ThinkFormat, prompt: str) -> str:
    """What to append to a prompt so that the model answers without thinking, where the
    template has no switch of its own ("" where nothing is needed)."""
    if fmt.style == "harmony":
        return fmt.direct_heads[0]
    if opens_in_prompt(fmt, prompt):
        return "\n" + fmt.closer + "\n\n"
    return ""


def _lark_string(text: str) -> str:
    return orjson.dumps(text).decode()


def _lark_regex_literal(text: str) -> str:
    return re.escape(text).replace("/", "\\/")


def thinking_grammar(fmt: ThinkFormat, *, opened: bool, budget: int, answer: str | None) -> str:
    """A Lark grammar (llguidance's dialect): a thinking block of at most `budget` tokens,
    free text that never closes it early, then the answer. `answer`: a grammar whose start
    rule is `start` (a JSON schema's, the tools'), or None for free text. `opened`: the prompt
    opened the block already."""
    never = _lark_regex_literal(fmt.closer)
    lines = [
        "start: "
        + " ".join(
            part
            for part in (
                # `<think>\n…\n</think>\n\n`, as Qwen3's template renders a turn's thinking back:
                # the next turn's prompt then starts with this one's whole output (KV reuse).
                "" if opened else _lark_string(fmt.opener + ("\n" if fmt.style == "tags" else "")),
                "think",
                _lark_string(fmt.closer + fmt.answer_head if fmt.answer_head else "\n" + fmt.closer + "\n\n"),
                "answer",
            )
            if part
        ),
        # The regex in the rule itself: llguidance bounds a rule's own lexeme by max_tokens
        # (a named token inside the rule is not cut, and the generation stalls there).
        f"think[max_tokens={max(1, budget)}]: /(?s:.*)/ & ~/(?s:.*{never}.*)/",
    ]
    if answer is None:
        lines.append("answer: ANSWER_TEXT?")
        lines.append("ANSWER_TEXT: /(?s:.+)/")
    else:
        for line in answer.splitlines():
            lines.append("answer:" + line[len("start:") :] if line.startswith("start:") else line)
    return "\n".join(lines) + "\n"
