"""Embeddings on the real model through the clients RAG applications use: the openai SDK's
`embeddings.create` (base64 by default, floats on request) and LangChain's `OpenAIEmbeddings`
against `/v1/embeddings`, LMSP's own `/lmsp/v1/embeddings` extension, and the problems a bad
input gets (each naming its field)."""

from __future__ import annotations

import math

import httpx
import openai
import pytest
from langchain_openai import OpenAIEmbeddings

from helpers import MODEL, SCRIPTED, assert_problem, checked_client

DIMENSIONS = 576  # SmolLM2-135M's hidden size
CAT = "The cat sat on the mat."
KITTEN = "A kitten is sitting on a rug."
REVENUE = "Quarterly revenue grew by four percent."


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _check_vectors(vectors: list[list[float]]) -> None:
    for vector in vectors:
        assert len(vector) == DIMENSIONS
        assert math.isclose(math.sqrt(_dot(vector, vector)), 1.0, rel_tol=1e-4)  # unit length


@pytest.fixture()
def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_openai_sdk_embeds_a_batch_deterministically_and_similar_texts_are_closer(sdk):
    first = sdk.embeddings.create(model=MODEL, input=[CAT, KITTEN, REVENUE])  # the SDK asks for base64
    assert [d.index for d in first.data] == [0, 1, 2]
    assert first.model == MODEL
    assert first.usage.prompt_tokens == first.usage.total_tokens > 0
    cat, kitten, revenue = (d.embedding for d in first.data)
    _check_vectors([cat, kitten, revenue])
    assert _dot(cat, kitten) > _dot(cat, revenue)
    again = sdk.embeddings.create(model=MODEL, input=[CAT, KITTEN, REVENUE], encoding_format="float")
    for a, b in zip(first.data, again.data, strict=True):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)


def test_langchain_openai_embeddings(server):
    # Pointed at a server that is not OpenAI, LangChain must send text (not tiktoken's ids).
    embeddings = OpenAIEmbeddings(
        model=MODEL, base_url=f"{server.url}/v1", api_key="unused", check_embedding_ctx_length=False, max_retries=0
    )
    documents = embeddings.embed_documents([CAT, REVENUE])
    query = embeddings.embed_query(KITTEN)
    _check_vectors([*documents, query])
    assert _dot(query, documents[0]) > _dot(query, documents[1])
    assert embeddings.embed_query(KITTEN) == pytest.approx(query, abs=1e-6)


def test_lmsp_route_answers_in_its_own_shape(client):
    r = client.post("/lmsp/v1/embeddings", json={"model": MODEL, "input": [CAT, [1, 2, 3]]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "embeddings" and body["model"] == MODEL and body["dimensions"] == DIMENSIONS
    assert [d["index"] for d in body["data"]] == [0, 1]
    _check_vectors([d["embedding"] for d in body["data"]])
    assert body["usage"]["input_tokens"] > 3


def test_bad_inputs_are_problems_naming_their_field(client):
    cases = [
        ({"model": MODEL}, 400, "invalid_request", "input"),
        ({"model": MODEL, "input": []}, 400, "invalid_request", "input"),
        ({"model": MODEL, "input": [CAT, 7]}, 400, "invalid_request", "input[1]"),
        ({"model": MODEL, "input": [[10**9]]}, 400, "invalid_request", "input"),
        ({"model": MODEL, "input": ""}, 400, "invalid_request", "input"),
        ({"model": MODEL, "input": "word " * 2000}, 400, "context_length_exceeded", "input"),
        ({"model": MODEL, "input": CAT, "dims": 3}, 400, "invalid_request", "dims"),
        ({"model": "no-such:model", "input": CAT}, 404, "model_not_found", "model"),
        ({"model": SCRIPTED, "input": CAT}, 400, "unsupported_capability", "model"),
        ({"model": MODEL, "input": [CAT] * 257}, 400, "limit_exceeded", "input"),
    ]
    for payload, status, code, param in cases:
        assert_problem(client.post("/lmsp/v1/embeddings", json=payload), status, code, param)
    # A long input is cut to the window when asked.
    r = client.post("/lmsp/v1/embeddings", json={"model": MODEL, "input": "word " * 2000, "truncate": True})
    assert r.status_code == 200 and r.json()["usage"]["input_tokens"] == 512


def test_openai_errors_name_the_param(sdk, server):
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.embeddings.create(model=MODEL, input=CAT, dimensions=3)
    assert caught.value.body["param"] == "dimensions"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="no-such:model", input=CAT)
    with checked_client(server.url) as c:
        r = c.post("/v1/embeddings", json={"model": MODEL, "input": {"text": CAT}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"


def test_concurrent_requests_share_the_model_queue(server):
    """Embeddings run on the model's own thread between generation steps: many at once, each
    answered, each the same as alone."""
    import concurrent.futures

    with httpx.Client(base_url=server.url, timeout=120) as c:
        alone = c.post("/v1/embeddings", json={"model": MODEL, "input": CAT, "encoding_format": "float"}).json()

        def one(_: int) -> list[float]:
            r = c.post("/v1/embeddings", json={"model": MODEL, "input": CAT, "encoding_format": "float"})
            assert r.status_code == 200, r.text
            vector: list[float] = r.json()["data"][0]["embedding"]
            return vector

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for vector in pool.map(one, range(6)):
                assert vector == pytest.approx(alone["data"][0]["embedding"], abs=1e-5)
