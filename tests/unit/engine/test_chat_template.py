"""A model's chat template is untrusted input: it renders sandboxed, in a child process that is
killed when it runs past its time budget, and its failures are TemplateRenderError."""

from __future__ import annotations

import threading
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


SLOW = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# Slow for one input only: renders of the same template that overlap a slow one.
SLOW_FOR_ONE = "{% if messages[0]['content'] == 'slow' %}" + SLOW + "{% endif %}" + CHATML


def _fast_renders_while(slow: ChatTemplate, slow_messages: list[dict[str, str]], fast: ChatTemplate) -> float:
    """Renders `fast` over and over while `slow` runs to its budget in another thread; the
    slowest of those renders, in seconds."""
    failed = threading.Event()

    def run_slow() -> None:
        with pytest.raises(TemplateRenderError, match="time budget"):
            slow.render(slow_messages)
        failed.set()

    thread = threading.Thread(target=run_slow)
    thread.start()
    slowest = 0.0
    while not failed.is_set():
        start = time.monotonic()
        assert fast.render(MESSAGES).startswith("<|im_start|>user")
        slowest = max(slowest, time.monotonic() - start)
    thread.join()
    return slowest


def test_a_slow_template_holds_up_no_other_models_renders():
    slow = ChatTemplate(SLOW, bos_token="", eos_token="", budget=2.0)
    fast = ChatTemplate(CHATML, bos_token="", eos_token="")
    assert _fast_renders_while(slow, MESSAGES, fast) < 0.5


def test_a_slow_render_holds_up_no_other_render_of_the_same_template():
    template = ChatTemplate(SLOW_FOR_ONE, bos_token="", eos_token="", budget=2.0)
    # The first fast render starts a second child (tens of ms): still well under the budget.
    assert _fast_renders_while(template, [{"role": "user", "content": "slow"}], template) < 1.0


def test_tools_reach_the_template_only_when_given():
    template = ChatTemplate(
        "{% if tools is defined %}{{ tools | map(attribute='name') | join(',') }}{% else %}none{% endif %}",
        bos_token="",
        eos_token="",
    )
    assert template.render(MESSAGES) == "none"
    assert template.render(MESSAGES, tools=[{"name": "get_weather"}, {"name": "get_time"}]) == "get_weather,get_time"


def test_closing_a_template_ends_its_children():
    template = ChatTemplate(CHATML, bos_token="", eos_token="")
    worker = template._pool._idle[0]
    template.close()
    assert not worker.alive
