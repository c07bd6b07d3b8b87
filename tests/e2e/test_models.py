"""`GET /lmsp/v1/models` (§5)."""

from __future__ import annotations

from helpers import MODEL, SCRIPTED, assert_problem, body


def test_list_models(client):
    # `loaded` is true while it is: a request makes sure (it stays loaded for minutes after).
    assert client.post("/lmsp/v1/responses", json=body("Hi", max_output_tokens=1)).status_code == 200
    r = client.get("/lmsp/v1/models")
    assert r.status_code == 200
    assert r.headers["lmsp-version"] == "1.0"
    listing = r.json()
    assert listing["object"] == "list"
    by_id = {m["id"]: m for m in listing["data"]}
    model = dict(by_id[MODEL])
    assert model.pop("device") in ("cpu", "cuda", "metal")
    assert model == {
        "id": MODEL,
        "object": "model",
        "capabilities": ["streaming", "structured_output", "tools", "conversations"],
        "context_window": 4096,
        "backend": "llama.cpp",
        "loaded": True,
        "source": "embedded",
    }
    assert by_id[SCRIPTED]["backend"] == "scripted"


def test_get_model(client):
    r = client.get(f"/lmsp/v1/models/{MODEL}")
    assert r.status_code == 200
    assert r.json()["id"] == MODEL
    assert_problem(client.get("/lmsp/v1/models/none:0b"), 404, "model_not_found")
