"""Sampling controls through every face, on the real model: `top_k`, `min_p`, `repeat_penalty`,
`presence_penalty`, `frequency_penalty` and `seed` (Chat Completions' own names; LMSP and
`/v1/responses` through `extensions`), each changing the output as llama.cpp's samplers do,
and the grammar holding under each."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import jsonschema
import orjson
import pytest

from helpers import MODEL, assert_problem, body

LMSP = "/lmsp/v1/responses"
CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
PROMPT = "Write a short story about a cat who finds a box."
# A prompt the small model answers by repeating itself: the penalties have something to remove.
# A prompt this model answers at T=0 by looping (24 apples in 48 tokens on the portable wheel;
# the former "Repeat the word 'apple' many times" looped only on the native build's kernels).
LOOPING = "Write 'apple' over and over again."
SCHEMA = {
    "type": "object",
    # Bounded, so that every answer ends well within its token budget, whatever the sampler draws.
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def _lmsp(client: httpx.Client, prompt: str = PROMPT, **fields: Any) -> str:
    r = client.post(LMSP, json=body(prompt, max_output_tokens=fields.pop("max_output_tokens", 40), **fields))
    assert r.status_code == 200, r.text
    return "".join(p["text"] for item in r.json()["output"] if item["type"] == "message" for p in item["content"])


def _chat(client: httpx.Client, prompt: str = PROMPT, **fields: Any) -> str:
    payload = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 40, **fields}
    r = client.post(CHAT, json=payload)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"] or "")


def _responses(client: httpx.Client, prompt: str = PROMPT, **fields: Any) -> str:
    r = client.post(
        RESPONSES, json={"model": MODEL, "input": prompt, "max_output_tokens": 40, "store": False, **fields}
    )
    assert r.status_code == 200, r.text
    return str(r.json()["output"][0]["content"][0]["text"])


@pytest.mark.model
def test_top_k_1_is_greedy_at_temperature_1_on_every_face(client):
    greedy = _lmsp(client, temperature=0.0)
    for seed in (1, 2, 3):
        assert _lmsp(client, temperature=1.0, extensions={"top_k": 1, "seed": seed}) == greedy
        assert _chat(client, temperature=1.0, top_k=1, seed=seed) == greedy
        assert _responses(client, temperature=1.0, extensions={"top_k": 1, "seed": seed}) == greedy


@pytest.mark.model
def test_min_p_1_is_greedy_and_seeds_repeat(client):
    greedy = _chat(client, temperature=0.0)
    assert _chat(client, temperature=1.0, min_p=1.0, seed=5) == greedy
    first = [_chat(client, temperature=1.2, seed=s) for s in (11, 12, 13)]
    assert [_chat(client, temperature=1.2, seed=s) for s in (11, 12, 13)] == first
    assert len(set(first)) > 1  # different seeds, different stories


def _count(text: str, word: str) -> int:
    return Counter(w.strip(".,!'\"").lower() for w in text.split())[word]


@pytest.mark.model
def test_penalties_remove_a_repeated_word(client):
    plain = _chat(client, LOOPING, temperature=0.0, max_tokens=48)
    assert _count(plain, "apple") >= 5, plain  # the prompt does make it loop
    for control in ({"repeat_penalty": 2.0}, {"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        penalized = _chat(client, LOOPING, temperature=0.0, max_tokens=48, **control)
        assert _count(penalized, "apple") < _count(plain, "apple"), (control, penalized)
        same = _lmsp(client, LOOPING, temperature=0.0, max_output_tokens=48, extensions=control)
        assert same == penalized  # the same control, the same samplers, through LMSP


@pytest.mark.model
@pytest.mark.parametrize(
    "control",
    [
        {"top_k": 3},
        {"min_p": 0.3},
        {"repeat_penalty": 1.8},
        {"presence_penalty": 1.5},
        {"frequency_penalty": 1.5},
        {"seed": 9},
    ],
    ids=lambda c: next(iter(c)),
)
def test_the_grammar_holds_under_each_control(client, control):  # covers: R6.5-5
    form = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    for seed in (1, 2):
        extensions = {"seed": seed, **control}
        fields = {"temperature": 1.0, "response_format": form, "max_output_tokens": 80}
        text = _lmsp(client, "Invent a person.", extensions=extensions, **fields)
        jsonschema.validate(orjson.loads(text), SCHEMA)
        # Chat Completions takes the same controls as top-level fields, `seed` among them.
        chat = _chat(client, "Invent a person.", temperature=1.0, response_format=form, max_tokens=80, **extensions)
        jsonschema.validate(orjson.loads(chat), SCHEMA)


@pytest.mark.parametrize(
    ("name", "value"),
    [("top_k", -1), ("top_k", 1.5), ("min_p", 2.0), ("repeat_penalty", "x"), ("presence_penalty", 3.0)],
)
def test_a_control_out_of_range_is_named(client, name, value):  # covers: R6.1-8
    r = client.post(LMSP, json=body("hi", max_output_tokens=2, extensions={name: value}))
    assert_problem(r, 400, "invalid_request", f"extensions.{name}")
    r = client.post(RESPONSES, json={"model": MODEL, "input": "hi", "extensions": {name: value}})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == f"extensions.{name}"
