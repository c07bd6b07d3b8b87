"""`lmsp.AsyncClient`: Client's API for asyncio, on the same calls, retry policy and resume
state (calls.py, retry.py); only the sending and the sleeping differ."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import Any

import httpx

from .calls import (
    API,
    Call,
    Resume,
    error_of,
    fold_stream,
    headers,
    model_segments,
    request_body,
    resolve_base_url,
    segment,
)
from .errors import APIConnectionError
from .retry import Attempts, Retry
from .sse import BoundedParser
from .sync import DEFAULT_TIMEOUT
from .types import Event, Model, Response, Task

__all__ = ["AsyncClient", "AsyncResponseStream"]

log = logging.getLogger("lmsp.client")


class AsyncClient:
    """`AsyncClient(base_url, token)`: as Client, with `await` (and `async for` on streams)."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retry: Retry | None = None,
    ) -> None:
        self.base_url = resolve_base_url(base_url)
        self.retry = retry or Retry()
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers(token), timeout=timeout)
        self.models = AsyncModels(self)
        self.responses = AsyncResponses(self)
        self.tasks = AsyncTasks(self)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: Call, *, stream: bool = False) -> httpx.Response:
        attempts = Attempts(self.retry)
        while True:
            request = self._http.build_request(
                call.method, call.path, json=call.json, params=call.params, headers=call.headers
            )
            try:
                answer = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = attempts.after_transport_error(exc)
                if delay is None:
                    raise APIConnectionError(f"{call.method} {call.path}: {exc!r}") from exc
                reason = repr(exc)
            else:
                if answer.is_success:
                    return answer
                await answer.aread()
                await answer.aclose()
                error = error_of(answer)
                delay = attempts.after_status(answer.status_code, error.retry_after)
                if delay is None:
                    raise error
                reason = str(error)
            log.info("retrying %s %s in %.2f s: %s", call.method, call.path, delay, reason)
            await asyncio.sleep(delay)

    async def _json(self, call: Call) -> Any:
        return (await self._send(call)).json()


class AsyncModels:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> list[Model]:
        return [Model.from_json(m) for m in (await self._c._json(Call("GET", f"{API}/models")))["data"]]

    async def get(self, model_id: str) -> Model:
        return Model.from_json(await self._c._json(Call("GET", f"{API}/models/{model_segments(model_id)}")))


class AsyncResponses:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self, *, model: str, input: str | list[dict[str, Any]], idempotency_key: str | None = None, **fields: Any
    ) -> Response:
        body = request_body(model, input, fields)
        return Response.from_json(await self._c._json(Call.post(f"{API}/responses", body, idempotency_key)))

    async def stream(
        self, *, model: str, input: str | list[dict[str, Any]], idempotency_key: str | None = None, **fields: Any
    ) -> AsyncResponseStream:
        body = request_body(model, input, {**fields, "stream": True})
        answer = await self._c._send(Call.post(f"{API}/responses", body, idempotency_key), stream=True)
        return AsyncResponseStream(answer, model)

    async def get(self, response_id: str) -> Response:
        return Response.from_json(await self._c._json(Call("GET", f"{API}/responses/{segment(response_id)}")))


class AsyncResponseStream:
    def __init__(self, answer: httpx.Response, model: str) -> None:
        self._answer = answer
        self._model = model
        self.events: list[Event] = []
        self._iter = self._read()

    async def _read(self) -> AsyncGenerator[Event, None]:
        parser = BoundedParser()
        try:
            async for chunk in self._answer.aiter_bytes():
                for parsed in parser.feed(chunk):
                    event = Event.from_sse(parsed.id, parsed.event, parsed.data)
                    self.events.append(event)
                    yield event
        except httpx.TransportError as exc:
            raise APIConnectionError(f"the stream was cut after event {len(self.events)}: {exc!r}") from exc
        finally:
            await self._answer.aclose()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._iter

    async def final(self) -> Response:
        async for _ in self._iter:
            pass
        return fold_stream(self.events, self._model)

    async def aclose(self) -> None:
        await self._iter.aclose()
        await self._answer.aclose()

    async def __aenter__(self) -> AsyncResponseStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AsyncTasks:
    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def create(
        self, *, model: str, input: str | list[dict[str, Any]], idempotency_key: str | None = None, **fields: Any
    ) -> Task:
        body = request_body(model, input, fields)
        return Task.from_json(await self._c._json(Call.post(f"{API}/tasks", body, idempotency_key)))

    async def get(self, task_id: str) -> Task:
        return Task.from_json(await self._c._json(Call("GET", f"{API}/tasks/{segment(task_id)}")))

    async def cancel(self, task_id: str) -> Task:
        return Task.from_json(await self._c._json(Call.post(f"{API}/tasks/{segment(task_id)}/cancel")))

    async def events(self, task_id: str, after: int | None = None) -> AsyncIterator[Event | Response]:
        """As Client.tasks.events: each event once, in order, across dropped connections; the
        final response instead when the events have expired (410)."""
        state = Resume(task_id, after, self._c.retry)
        while not state.done:
            cause: Exception | None = None
            try:
                async with self._c._http.stream("GET", state.path, params=state.params()) as answer:
                    if answer.status_code == 204:
                        return
                    if answer.status_code == 410:
                        yield await self._final(task_id)
                        return
                    if answer.status_code == 200:
                        parser = BoundedParser()
                        async for chunk in answer.aiter_bytes():
                            for event in state.take(parser.feed(chunk)):
                                yield event
                            if state.done:
                                return
                        delay = state.attempts.after_drop()
                    else:
                        await answer.aread()
                        error = error_of(answer)
                        delay = state.attempts.after_status(answer.status_code, error.retry_after)
                        if delay is None:
                            raise error
            except httpx.TransportError as exc:
                cause = exc
                delay = state.attempts.after_transport_error(exc)
            if delay is None:
                raise APIConnectionError(state.gave_up()) from cause
            log.info("resuming task %s after event %d in %.2f s", task_id, state.last, delay)
            await asyncio.sleep(delay)

    async def _final(self, task_id: str) -> Response:
        polls = 0
        while (task := await self.get(task_id)).response is None:
            polls += 1
            await asyncio.sleep(self._c.retry.delay(polls))
        return task.response
