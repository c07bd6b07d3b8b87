"""`lmsp.Client`: the LMSP API over one httpx connection pool, with safe retries and task
event streams that resume by themselves."""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Iterator
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
from .types import Event, Model, Response, Task

__all__ = ["Client", "ResponseStream"]

log = logging.getLogger("lmsp.client")
DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


class Client:
    """`Client(base_url, token)`; both default to $LMSP_BASE_URL and $LMSP_TOKEN, the URL then
    to http://127.0.0.1:8750. Use it as a context manager, or call `close()`."""

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
        self._http = httpx.Client(base_url=self.base_url, headers=headers(token), timeout=timeout)
        self.models = Models(self)
        self.responses = Responses(self)
        self.tasks = Tasks(self)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: Call, *, stream: bool = False) -> httpx.Response:
        """The first successful answer, trying again (same request, same Idempotency-Key) after
        a transport error or a 409/429/503, as the retry policy allows."""
        attempts = Attempts(self.retry)
        while True:
            request = self._http.build_request(
                call.method, call.path, json=call.json, params=call.params, headers=call.headers
            )
            try:
                answer = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = attempts.after_transport_error(exc)
                if delay is None:
                    raise APIConnectionError(f"{call.method} {call.path}: {exc!r}") from exc
                reason = repr(exc)
            else:
                if answer.is_success:
                    return answer
                answer.read()
                answer.close()
                error = error_of(answer)
                delay = attempts.after_status(answer.status_code, error.retry_after)
                if delay is None:
                    raise error
                reason = str(error)
            log.info("retrying %s %s in %.2f s: %s", call.method, call.path, delay, reason)
            time.sleep(delay)

    def _json(self, call: Call) -> Any:
        return self._send(call).json()


class Models:
    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> list[Model]:
        return [Model.from_json(m) for m in self._c._json(Call("GET", f"{API}/models"))["data"]]

    def get(self, model_id: str) -> Model:
        return Model.from_json(self._c._json(Call("GET", f"{API}/models/{model_segments(model_id)}")))


class Responses:
    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
        self, *, model: str, input: str | list[dict[str, Any]], idempotency_key: str | None = None, **fields: Any
    ) -> Response:
        """A response once generation has ended. `fields`: any of the request's other fields
        (max_output_tokens, temperature, response_format, tools, store, previous_response_id…)."""
        body = request_body(model, input, fields)
        return Response.from_json(self._c._json(Call.post(f"{API}/responses", body, idempotency_key)))

    def stream(
        self, *, model: str, input: str | list[dict[str, Any]], idempotency_key: str | None = None, **fields: Any
    ) -> ResponseStream:
        """The response's events as they come (`for event in stream`), then `stream.final()`.
        Such a stream belongs to its connection (R6.4-4): one cut mid-way raises
        APIConnectionError; a response that must survive that is a task."""
        body = request_body(model, input, {**fields, "stream": True})
        return ResponseStream(self._c._send(Call.post(f"{API}/responses", body, idempotency_key), stream=True), model)

    def get(self, response_id: str) -> Response:
        return Response.from_json(self._c._json(Call("GET", f"{API}/responses/{segment(response_id)}")))


class ResponseStream:
    def __init__(self, answer: httpx.Response, model: str) -> None:
        self._answer = answer
        self._model = model
        self.events: list[Event] = []
        self._iter = self._read()

    def _read(self) -> Generator[Event, None, None]:
        parser = BoundedParser()
        try:
            for chunk in self._answer.iter_bytes():
                for parsed in parser.feed(chunk):
                    event = Event.from_sse(parsed.id, parsed.event, parsed.data)
                    self.events.append(event)
                    yield event
        except httpx.TransportError as exc:
            raise APIConnectionError(f"the stream was cut after event {len(self.events)}: {exc!r}") from exc
        finally:
            self._answer.close()

    def __iter__(self) -> Iterator[Event]:
        return self._iter

    def final(self) -> Response:
        """Reads what is left and returns the response the events add up to."""
        for _ in self._iter:
            pass
        return fold_stream(self.events, self._model)

    def close(self) -> None:
        """Hangs up; the service stops generating (R6.3-6)."""
        self._iter.close()
        self._answer.close()

    def __enter__(self) -> ResponseStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Tasks:
    def __init__(self, client: Client) -> None:
        self._c = client

    def create(
        self, *, model: str, input: str | list[dict[str, Any]], idempotency_key: str | None = None, **fields: Any
    ) -> Task:
        """Starts a response that is generated whether or not anyone listens (202)."""
        body = request_body(model, input, fields)
        return Task.from_json(self._c._json(Call.post(f"{API}/tasks", body, idempotency_key)))

    def get(self, task_id: str) -> Task:
        return Task.from_json(self._c._json(Call("GET", f"{API}/tasks/{segment(task_id)}")))

    def cancel(self, task_id: str) -> Task:
        return Task.from_json(self._c._json(Call.post(f"{API}/tasks/{segment(task_id)}/cancel")))

    def events(self, task_id: str, after: int | None = None) -> Iterator[Event | Response]:
        """Every event after `after`, each once and in order, however often the connection
        drops: it reconnects from the last event it saw (with backoff, `retry.attempts` times
        in a row without a new event). Ends after the final event. When the service no longer
        keeps the events asked for (410), yields the task's final response instead, and ends."""
        state = Resume(task_id, after, self._c.retry)
        while not state.done:
            cause: Exception | None = None
            try:
                with self._c._http.stream("GET", state.path, params=state.params()) as answer:
                    if answer.status_code == 204:  # nothing after `after`: the task had ended there
                        return
                    if answer.status_code == 410:
                        yield self._final(task_id)
                        return
                    if answer.status_code == 200:
                        parser = BoundedParser()
                        for chunk in answer.iter_bytes():
                            yield from state.take(parser.feed(chunk))
                            if state.done:
                                return
                        delay = state.attempts.after_drop()
                    else:
                        answer.read()
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
            time.sleep(delay)

    def _final(self, task_id: str) -> Response:
        """The final response of a task whose events are gone: at once if it has ended, else
        when it does (no events to wait on, so its state is polled, backing off)."""
        polls = 0
        while (task := self.get(task_id)).response is None:
            polls += 1
            time.sleep(self._c.retry.delay(polls))
        return task.response
