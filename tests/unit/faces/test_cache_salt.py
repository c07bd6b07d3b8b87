"""Issue 38, the prompt-prefix oracle: the prompt cache's scope. The service gives the engine an
opaque key from the plan's owner (unless `serve --cache-scope shared`) and its `cache_salt`
(LMSP: `extensions.cache_salt`; Responses and Chat Completions: `cache_salt`, vLLM's name),
and only cells of the same key are reused. Faces check the salt: a string of 1 to 256."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lmsp.faces.lmsp.translate import lmsp_plan
from lmsp.faces.openai.chat import translate_chat_request
from lmsp.faces.openai.translate import translate_response_request
from lmsp.faces.sampling import CACHE_SALT_MAX
from lmsp.protocol.errors import ProblemError
from lmsp.protocol.requests import validate_response_request
from lmsp.service.plan import GenerationPlan
from lmsp.service.responses import cache_scope_key

M = "smollm2:135m-instruct-q4_1"
HI = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]


def _lmsp(salt: object) -> GenerationPlan:
    request = validate_response_request({"model": M, "input": HI, "extensions": {"cache_salt": salt}})
    return lmsp_plan(request, "token:a")


def _responses(salt: object) -> GenerationPlan:
    return translate_response_request({"model": M, "input": "hi", "cache_salt": salt}, "token:a").plan


def _chat(salt: object) -> GenerationPlan:
    body = {"model": M, "messages": [{"role": "user", "content": "hi"}], "cache_salt": salt}
    return translate_chat_request(body, "token:a").plan


FACES: dict[str, tuple[Callable[[object], GenerationPlan], str]] = {
    "lmsp": (_lmsp, "extensions.cache_salt"),
    "responses": (_responses, "cache_salt"),
    "chat": (_chat, "cache_salt"),
}


@pytest.mark.parametrize("face", FACES)
def test_cache_salt_reaches_the_plan_and_is_bounded(face):
    translate, param = FACES[face]
    assert translate("tenant-7").cache_salt == "tenant-7"
    assert translate(None).cache_salt is None
    for bad in ("", "x" * (CACHE_SALT_MAX + 1), 7):
        with pytest.raises(ProblemError) as refused:
            translate(bad)
        assert (refused.value.status, refused.value.param) == (400, param)


def test_the_cache_scope_is_the_owner_and_the_salt():
    def key(mode: str, owner: str, salt: str | None = None) -> str:
        return cache_scope_key(mode, GenerationPlan(model=M, input=(), owner=owner, cache_salt=salt))  # type: ignore[arg-type]

    assert key("owner", "token:a") == key("owner", "token:a") != key("owner", "token:b")
    assert key("owner", "token:a", "s") not in (key("owner", "token:a"), key("owner", "token:b", "s"))
    assert "token:a" not in key("owner", "token:a")  # the disk tier's files name no owner
    # Shared: every owner is one scope (the tokenless service's, too), a salt still apart.
    assert key("shared", "token:a") == key("shared", "token:b") == ""
    assert key("shared", "token:a", "s") == key("shared", "token:b", "s") != ""
