"""Renders a model's own chat template (the GGUF's `tokenizer.chat_template`, a Jinja text).

llama.cpp's `llama_chat_apply_template` is not a Jinja renderer (it guesses a format and drops
e.g. SmolLM2's default system prompt), so we render the template itself, in a sandbox: a
template is untrusted input that came with a downloaded file.
"""

from __future__ import annotations

from datetime import datetime

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "TemplateRenderError", "CHATML"]

# Used when a GGUF carries no template at all.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


class TemplateRenderError(ValueError):
    """The template failed on these messages (it may call raise_exception on purpose)."""


def _raise_exception(message: str) -> None:
    raise TemplateRenderError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self._template = env.from_string(source)
        self._bos = bos_token
        self._eos = eos_token

    def render(self, messages: list[dict[str, str]]) -> str:
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except TemplateRenderError:
            raise
        except TemplateError as exc:
            raise TemplateRenderError(f"chat template failed: {exc}") from exc
