"""lmsp.Client and lmsp.AsyncClient against a real server: every method, typed results, one
exception class per problem code, and retries that never run a generation twice."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Iterator

import httpx
import pytest

import lmsp
import lmsp.client
from helpers import MODEL, SCRIPTED, check_event, user, wait_final
from lmsp.client import APIConnectionError, AsyncClient, Client, Event, Response, Retry, Task
from lmsp.testing import RunningServer, start_server
from proxy import DropAfterRequest, Proxy

RING = 8
FAST = Retry(attempts=8, backoff=0.01, max_backoff=0.05)


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A ring of 8 events per task (history expires at once) and a queue of one (429 on demand)."""
    srv = start_server(
        tmp_path_factory.mktemp("tight"),
        "--scripted-model",
        SCRIPTED,
        "--task-events-max",
        str(RING),
        "--max-queue",
        "1",
    )
    yield srv
    srv.stop()


@pytest.fixture()
def lm(server: RunningServer) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


def _final_task(c: Client, task_id: str) -> Task:
    """Waits for the task's state to be final (no events to wait on here: they are the test)."""
    for event in c.tasks.events(task_id):
        if isinstance(event, Response) or event.final:
            break
    return c.tasks.get(task_id)


# --- the API, method by method


def test_models_list_and_get(lm):
    models = {m.id: m for m in lm.models.list()}
    assert {MODEL, SCRIPTED} <= set(models)
    assert lm.models.get(MODEL) == models[MODEL]
    assert "structured_output" in models[MODEL].capabilities and models[MODEL].context_window == 4096


def test_base_url_and_token_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("LMSP_BASE_URL", f"{server.url}/lmsp/v1/")  # with the API prefix, and a slash
    monkeypatch.setenv("LMSP_TOKEN", "not-needed-on-loopback")
    with Client() as c:
        assert c.base_url == server.url
        assert c._http.headers["authorization"] == "Bearer not-needed-on-loopback"
        assert SCRIPTED in {m.id for m in c.models.list()}


def test_create_returns_a_typed_response_its_text_one_property_away(lm):  # covers: R6.2-1
    r = lm.responses.create(model=SCRIPTED, input="one two three", store=True)
    assert isinstance(r, Response) and r.status == "completed" and r.text == "one two three"
    assert r.usage is not None and r.usage["output_tokens"] == 3
    assert lm.responses.get(r.id) == r


def test_create_takes_items_and_any_request_field(lm):
    r = lm.responses.create(model=SCRIPTED, input=user("a b c d"), max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details == {"reason": "max_output_tokens"} and r.text == "a b "


def test_stream_yields_typed_events_then_the_final_response(lm):  # covers: R6.3-4
    with lm.responses.stream(model=SCRIPTED, input="x y z", store=True) as s:
        events = list(s)
        final = s.final()
    assert [e.id for e in events] == list(range(1, len(events) + 1))
    assert all(isinstance(e, Event) for e in events) and events[-1].final
    for e in events:
        check_event(e.type, e.data)
    assert "".join(e.delta for e in events) == final.text == "x y z"
    stored = lm.responses.get(final.id)
    assert final.created_at is None  # events carry no timestamp; the stored one has it
    assert dataclasses.replace(final, created_at=stored.created_at) == stored


def test_final_reads_a_stream_not_yet_read(lm):
    assert lm.responses.stream(model=SCRIPTED, input="just final").final().text == "just final"


def test_a_failed_stream_ends_in_a_failed_response(lm):
    final = lm.responses.stream(model=SCRIPTED, input="!fail 2").final()
    assert final.status == "failed" and final.error is not None and final.error["code"] == "generation_failed"


def test_tasks_create_get_events_cancel(lm):  # covers: R7-1, R7-2, R7-3, R7-4
    task = lm.tasks.create(model=SCRIPTED, input="!slow 20 one two three")
    assert task.status == "in_progress" and task.response is None
    events = list(lm.tasks.events(task.id))
    assert all(isinstance(e, Event) for e in events) and events[-1].type == "response.completed"
    done = lm.tasks.get(task.id)
    assert done.status == "completed" and done.response is not None and done.response.text == "one two three"
    # resuming in the middle gives the rest; after the last event, nothing (204)
    assert list(lm.tasks.events(task.id, after=3)) == events[3:]
    assert list(lm.tasks.events(task.id, after=events[-1].id)) == []
    assert lm.tasks.cancel(task.id) == done  # a final task is returned unchanged

    running = lm.tasks.create(model=SCRIPTED, input="!slow 50 " + "w " * 200)
    cancelled = lm.tasks.cancel(running.id)
    assert cancelled.status == "cancelled" and cancelled.response is not None
    assert [e for e in lm.tasks.events(running.id) if isinstance(e, Event)][-1].type == "response.cancelled"


# --- the async client: the same calls


def test_async_client_every_method(server):  # covers: R7-1, R7-2, R7-3, R7-4
    async def main() -> None:
        async with AsyncClient(server.url) as c:
            assert SCRIPTED in {m.id for m in await c.models.list()}
            assert (await c.models.get(SCRIPTED)).backend == "scripted"
            r = await c.responses.create(model=SCRIPTED, input="async one", store=True)
            assert r.text == "async one" and await c.responses.get(r.id) == r
            s = await c.responses.stream(model=SCRIPTED, input="async two")
            async with s:
                deltas = [e.delta async for e in s]
                assert "".join(deltas) == (await s.final()).text == "async two"
            task = await c.tasks.create(model=SCRIPTED, input="!slow 10 async three")
            events = [e async for e in c.tasks.events(task.id)]
            assert isinstance(events[-1], Event) and events[-1].type == "response.completed"
            assert [e async for e in c.tasks.events(task.id, after=2)] == events[2:]
            done = await c.tasks.get(task.id)
            assert done.response is not None and done.response.text == "async three"
            assert await c.tasks.cancel(task.id) == done
            with pytest.raises(lmsp.client.TaskNotFound):
                await c.tasks.get("task_01M8Q0SJ282TY8E8XFPPV2754K")

    asyncio.run(main())


# --- errors: one class per code


def test_the_service_s_errors_raise_their_classes(server, lm):  # covers: R9-2
    with pytest.raises(lmsp.client.ModelNotFound) as e:
        lm.responses.create(model="no-such:model", input="x")
    assert e.value.status == 404 and e.value.param == "model"
    with pytest.raises(lmsp.client.ContextLengthExceeded) as e:
        lm.responses.create(model=SCRIPTED, input="w " * 5000)
    assert e.value.status == 400 and e.value.param == "input"
    with pytest.raises(lmsp.client.UnsupportedSchema) as e:
        schema = {"type": "array", "items": {"$ref": "https://example.com/item.json"}}  # a remote $ref
        lm.responses.create(
            model=MODEL,
            input="x",
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
    assert "$ref" in e.value.detail
    with pytest.raises(lmsp.client.InvalidRequest) as e:
        lm.responses.create(model=SCRIPTED, input="x", temperature=7)
    assert e.value.param == "temperature"
    with pytest.raises(lmsp.client.ResponseNotFound):
        lm.responses.get("resp_01M8Q0SJ282TY8E8XFPPV2754K")
    key = str(uuid.uuid4())
    lm.responses.create(model=SCRIPTED, input="first body", idempotency_key=key)
    with pytest.raises(lmsp.client.IdempotencyKeyReused) as e:
        lm.responses.create(model=SCRIPTED, input="another body", idempotency_key=key)
    assert e.value.status == 422 and e.value.param == "Idempotency-Key"


def test_no_service_is_a_connection_error_after_the_retries():
    from lmsp.testing import free_port

    with Client(f"http://127.0.0.1:{free_port()}", retry=Retry(attempts=2, backoff=0.01)) as c:
        with pytest.raises(APIConnectionError) as e:
            c.models.list()
    assert isinstance(e.value.__cause__, httpx.ConnectError)


# --- retries: the same Idempotency-Key, so a generation runs once


def _answers_of(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The HTTP answers (Content-Length framed) the server sent on one connection."""
    found = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        size = int(headers["content-length"])
        found.append((int(lines[0].split()[1]), headers, raw[:size]))
        raw = raw[size:]
    return found


def _all_answers(proxy: Proxy) -> list[tuple[int, dict[str, str], bytes]]:
    return [a for raw in proxy.answers for a in _answers_of(bytes(raw))]


def test_a_task_post_cut_after_the_request_is_one_task(server, lm, caplog):  # covers: R9-3
    with (
        Proxy(server.port, lambda n: DropAfterRequest() if n == 0 else None) as proxy,
        Client(proxy.url, retry=FAST) as c,
    ):
        with caplog.at_level(logging.INFO, logger="lmsp.client"):
            task = c.tasks.create(model=SCRIPTED, input="!slow 20 one two three")
        # The server answered the first POST (to no one) and created the task then...
        proxy.wait_answer(0, b'"task_')
        answers = _all_answers(proxy)
        first_status, first_headers, first_body = answers[0]
        assert first_status == 202 and "idempotent-replayed" not in first_headers
        assert Task.from_json(httpx.Response(202, content=first_body).json()).id == task.id
        # ...and answered the retry from its record: no second task, no second generation.
        status, headers, _ = answers[-1]
        assert status == 202 and headers["idempotent-replayed"] == "true"
        assert {Task.from_json(httpx.Response(s, content=b).json()).id for s, _, b in answers if s == 202} == {task.id}
    assert any("retrying POST /lmsp/v1/tasks" in r.getMessage() for r in caplog.records)
    final = _final_task(lm, task.id)
    assert final.response is not None and final.response.text == "one two three"


def test_a_sync_post_cut_after_the_request_runs_once(server, caplog):  # covers: R9-3, R6.1-7
    # The first request is still generating when its retries come: 409 (Retry-After) until
    # it ends, then the replay of its answer.
    with (
        Proxy(server.port, lambda n: DropAfterRequest() if n == 0 else None) as proxy,
        Client(proxy.url, retry=Retry(attempts=20)) as c,
    ):
        with caplog.at_level(logging.INFO, logger="lmsp.client"):
            r = c.responses.create(model=SCRIPTED, input="!slow 100 a b c d e f g h i j")
        proxy.wait_answer(0, b'"resp_')
        answers = _all_answers(proxy)
    ran = [a for a in answers if a[0] == 200 and "idempotent-replayed" not in a[1]]
    assert len(ran) == 1 and Response.from_json(httpx.Response(200, content=ran[0][2]).json()).id == r.id
    assert [s for s, _, _ in answers[1:-1]] == [409] * (len(answers) - 2) and answers[1:-1]
    assert answers[-1][0] == 200 and answers[-1][1]["idempotent-replayed"] == "true"
    assert r.text == "a b c d e f g h i j"
    assert any("409 idempotency_conflict" in rec.getMessage() for rec in caplog.records)


def test_429_is_retried_after_its_retry_after(tight, caplog):  # covers: R9-3
    with Client(tight.url, retry=Retry(attempts=20)) as c:
        playing = c.tasks.create(model=SCRIPTED, input="!slow 60 " + "w " * 20)
        # The scripted model plays one request at a time: once `playing` sends text, the next
        # one waits in the queue of one, and a third is refused (429) until the queue moves.
        next(e for e in c.tasks.events(playing.id) if isinstance(e, Event) and e.delta)
        c.tasks.create(model=SCRIPTED, input="queued")
        with caplog.at_level(logging.INFO, logger="lmsp.client"):
            third = c.tasks.create(model=SCRIPTED, input="third")
        retries = [r.getMessage() for r in caplog.records if "429 overloaded" in r.getMessage()]
        assert retries and all(" in 1.00 s" in m for m in retries)  # the service's Retry-After: 1
        assert (_final_task(c, third.id).response or pytest.fail("no response")).text == "third"


# --- history that has expired (410): the final response instead


def test_expired_history_yields_the_final_response(tight):  # covers: R6.4-3, R7-5
    with Client(tight.url) as c:
        task = c.tasks.create(model=SCRIPTED, input=" ".join(f"w{i}" for i in range(20)))
        with httpx.Client(base_url=tight.url) as raw:
            wait_final(raw, task.id)
        [only] = list(c.tasks.events(task.id))
        assert isinstance(only, Response) and only == c.tasks.get(task.id).response
        assert only.text.startswith("w0 w1") and only.status == "completed"
        [again] = list(c.tasks.events(task.id, after=3))
        assert again == only


def test_history_expired_while_running_yields_the_final_response_when_it_ends(tight):  # covers: R6.4-3
    words = [f"w{i}" for i in range(40)]
    with Client(tight.url, retry=FAST) as c:
        task = c.tasks.create(model=SCRIPTED, input="!slow 30 " + " ".join(words))
        # Read until the ring has dropped event 1, then hang up: the task runs on.
        seen = next(e for e in c.tasks.events(task.id) if isinstance(e, Event) and e.id > RING + 2)
        assert c.tasks.get(task.id).status == "in_progress", seen
        [only] = list(c.tasks.events(task.id))
        assert isinstance(only, Response) and only.status == "completed" and only.text == " ".join(words)


def test_async_expired_history_yields_the_final_response(tight):  # covers: R6.4-3
    async def main() -> list[Event | Response]:
        async with AsyncClient(tight.url) as c:
            task = await c.tasks.create(model=SCRIPTED, input=" ".join(f"a{i}" for i in range(20)))
            async for event in c.tasks.events(task.id):
                if isinstance(event, Response) or event.final:
                    break
            return [e async for e in c.tasks.events(task.id)]

    [only] = asyncio.run(main())
    assert isinstance(only, Response) and only.text.startswith("a0 a1")
