"""A model's chat template is untrusted input: it renders sandboxed, in a child process that is
killed when it runs past its time budget, and its failures are TemplateRenderError."""

from __future__ import annotations

import time

import pytest

from lmsp.engine.chat_template import CHATML, ChatTemplate, TemplateRenderError

MESSAGES = [{"role": "user", "content": "hi"}]


def test_renders_a_real_template():
    text = ChatTemplate(CHATML, bos_token="<s>", eos_token="</s>").render(MESSAGES)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


HOSTILE = [
    # (template, what the error says)
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "time budget"),
    ("{{ 9 ** (9 ** 9) }}", "time budget"),  # one C-level operation: no in-process deadline stops it
    ("{{ 'x' | center(10 ** 10) }}", "MemoryError"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("{{ messages.__init__.__globals__ }}", "unsafe"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "RecursionError"),
    ("{{ 1 + 'a' }}", "TypeError"),
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
]


@pytest.mark.parametrize(("source", "says"), HOSTILE)
def test_hostile_templates_fail_cleanly_within_the_budget(source, says):
    start = time.monotonic()
    with pytest.raises(TemplateRenderError, match=says):
        ChatTemplate(source, bos_token="", eos_token="", budget=0.5).render(MESSAGES)
    assert time.monotonic() - start < 0.5 + 1.0  # the budget, plus restarting the worker
    # The next template renders as if nothing happened.
    assert ChatTemplate(CHATML, bos_token="", eos_token="").render(MESSAGES).startswith("<|im_start|>user")


def test_a_template_that_cannot_compile_fails_at_load():
    with pytest.raises(TemplateRenderError, match="chat template failed"):
        ChatTemplate("{% for %}", bos_token="", eos_token="")


def test_constant_folding_while_compiling_is_inside_the_budget():
    # Jinja folds constant expressions when it compiles: the load itself is budgeted.
    start = time.monotonic()
    with pytest.raises(TemplateRenderError, match="time budget"):
        ChatTemplate("{{ 'a' if (9 ** (9 ** 9)) else 'b' }}", bos_token="", eos_token="", budget=0.5)
    assert time.monotonic() - start < 1.5
