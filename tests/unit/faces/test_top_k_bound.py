"""`top_k` has one upper bound on every face (faces/sampling.py `TOP_K_MAX`): past it a 400
naming the field as that face spells it, where Chat Completions and Anthropic had none and the
free-text sampler cut the value to an int32 (4294967301 became 5)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lmsp.faces.anthropic.translate import translate_messages
from lmsp.faces.lmsp.translate import lmsp_plan
from lmsp.faces.ollama.translate import chat_request
from lmsp.faces.openai.chat import translate_chat_request
from lmsp.faces.openai.translate import translate_response_request
from lmsp.faces.sampling import TOP_K_MAX
from lmsp.protocol.errors import ProblemError
from lmsp.protocol.requests import validate_response_request

M = "smollm2:135m-instruct-q4_1"
HI = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def _lmsp(top_k: int) -> int:
    request = validate_response_request({"model": M, "input": HI, "extensions": {"top_k": top_k}})
    return lmsp_plan(request, "local").sampling.top_k


def _responses(top_k: int) -> int:
    body = {"model": M, "input": "hi", "extensions": {"top_k": top_k}}
    return translate_response_request(body, "local").plan.sampling.top_k


def _chat(top_k: int) -> int:
    body = {"model": M, "messages": [{"role": "user", "content": "hi"}], "top_k": top_k}
    return translate_chat_request(body, "local").plan.sampling.top_k


def _anthropic(top_k: int) -> int:
    body = {"model": M, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "top_k": top_k}
    return translate_messages(body, "local").plan.sampling.top_k


def _ollama(top_k: int) -> int:
    body = {"model": M, "messages": [{"role": "user", "content": "hi"}], "options": {"top_k": top_k}}
    plan = chat_request(body, "local").plan
    assert plan is not None
    return plan.sampling.top_k


FACES: dict[str, tuple[Callable[[int], Any], str]] = {
    "lmsp": (_lmsp, "extensions.top_k"),
    "responses": (_responses, "extensions.top_k"),
    "chat": (_chat, "top_k"),
    "anthropic": (_anthropic, "top_k"),
    "ollama": (_ollama, "options.top_k"),
}


@pytest.mark.parametrize("face", FACES)
def test_top_k_past_the_bound_is_400_naming_it_on_every_face(face):  # covers: R6.1-8
    translate, param = FACES[face]
    assert translate(TOP_K_MAX) == TOP_K_MAX
    for value in (TOP_K_MAX + 1, 2**32 + 5):
        with pytest.raises(ProblemError) as refused:
            translate(value)
        assert (refused.value.status, refused.value.code, refused.value.param) == (400, "invalid_request", param)
