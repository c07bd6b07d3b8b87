"""A run's events as Ollama's answer: NDJSON lines as they come (`stream`, Ollama's default),
or one JSON object at the end, in `/api/chat`'s shape (`message`) or `/api/generate`'s
(`response`). Both views read the run's log the same way, so the timings Ollama reports
(`prompt_eval_duration` up to the first token, `eval_duration` after it) come from the same
place either way."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any, Literal

import orjson
from granian.rsgi import ProtocolClosed

from lmsp._core import EventHistoryExpired

from ...events.wait import wait_for_events
from ...http.outflow import ReaderStalled
from ...http.sse import PacedStream, watch_disconnect
from ...http.wire import LMSP_VERSION
from ...protocol import events as ev
from ...protocol.errors import ProblemError
from ...service.responses import ResponseRun

__all__ = ["Reply", "created_at", "ndjson_headers", "send_reply"]

Kind = Literal["chat", "generate"]
# How long a stream waits between events before checking that its client is still there.
_WAIT = 5.0


def created_at() -> str:
    """Ollama's timestamp: RFC 3339 in UTC."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def ndjson_headers() -> list[tuple[str, str]]:
    return [("content-type", "application/x-ndjson"), ("lmsp-version", LMSP_VERSION)]


def _is_thinking_delta(name: str) -> bool:
    # A thinking model's reasoning text, whichever reasoning event carries it.
    return name.startswith("response.reasoning") and name.endswith(".delta")


class Reply:
    """Turns one run's events, read in order, into Ollama's objects."""

    def __init__(self, kind: Kind, model: str, started: float, load_seconds: float) -> None:
        self.kind = kind
        self.model = model
        self._started = started
        self._load = load_seconds
        self._first: float | None = None  # when the first output came
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[dict[str, Any]] = []

    def _base(self) -> dict[str, Any]:
        return {"model": self.model, "created_at": created_at()}

    def _part(
        self, content: str = "", thinking: str | None = None, calls: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        if self.kind == "generate":
            out = {**self._base(), "response": content}
            if thinking is not None:
                out["thinking"] = thinking
            return out
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking is not None:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {**self._base(), "message": message}

    def _output(self) -> None:
        if self._first is None:
            self._first = time.perf_counter()

    def event(self, name: str, data: bytes) -> dict[str, Any] | None:
        """What this event adds, as a streamed line (None: nothing to say); also kept for the
        whole answer. Raises ProblemError when the run failed."""
        if name == ev.TEXT_DELTA:
            self._output()
            delta = orjson.loads(data)["delta"]
            self.text.append(delta)
            return {**self._part(delta), "done": False}
        if _is_thinking_delta(name):
            self._output()
            delta = orjson.loads(data).get("delta", "")
            self.thinking.append(delta)
            return {**self._part(thinking=delta), "done": False}
        if name == ev.ITEM_DONE:
            item = orjson.loads(data)["item"]
            if item["type"] != "function_call":
                return None
            self._output()
            try:
                arguments = orjson.loads(item["arguments"])
            except orjson.JSONDecodeError:  # cut short by the token limit: what was written
                arguments = {}
            call = {
                "id": item["call_id"],
                "function": {"index": len(self.calls), "name": item["name"], "arguments": arguments},
            }
            self.calls.append(call)
            return {**self._part(calls=[call]), "done": False} if self.kind == "chat" else None
        if name in (ev.COMPLETED, ev.INCOMPLETE):
            return self._final(orjson.loads(data))
        if name in (ev.FAILED, ev.ERROR):
            error = orjson.loads(data)["error"]
            raise ProblemError(error["code"], error["detail"])
        if name == ev.CANCELLED:
            raise ProblemError("generation_failed", "the generation was cancelled")
        return None

    def _final(self, body: dict[str, Any]) -> dict[str, Any]:
        end = time.perf_counter()
        first = self._first if self._first is not None else end
        usage = body.get("usage") or {}
        incomplete = body.get("status") == "incomplete"
        return {
            "done": True,
            "done_reason": "length" if incomplete else "stop",
            "total_duration": int((end - self._started) * 1e9),
            "load_duration": int(self._load * 1e9),
            "prompt_eval_count": usage.get("input_tokens", 0),
            "prompt_eval_duration": int(max(0.0, first - self._started - self._load) * 1e9),
            "eval_count": usage.get("output_tokens", 0),
            "eval_duration": int((end - first) * 1e9),
        }

    def last_line(self, final: dict[str, Any]) -> dict[str, Any]:
        """The stream's last line: nothing more to add, and the counts."""
        return {**self._part(), **final}

    def whole(self, final: dict[str, Any]) -> dict[str, Any]:
        """The non-streamed answer: everything at once."""
        thinking = "".join(self.thinking) if self.thinking else None
        return {**self._part("".join(self.text), thinking, self.calls), **final}


async def send_reply(proto: Any, run: ResponseRun, reply: Reply, stream: bool) -> None:
    """Follows the run's log to its end, streaming lines or answering once; a client that
    goes away cancels the run."""
    watcher = watch_disconnect(proto, run)
    transport = PacedStream(proto, ndjson_headers()) if stream else None
    log = run.log
    cursor = 0
    try:
        while True:
            if transport is not None:
                await transport.room(log, cursor)  # a reader past --max-stream-buffer: wait before reading more
            try:
                entries = log.entries_after(cursor)
            except EventHistoryExpired:  # read too slowly for the ring: nobody is left to read
                run.cancel()
                return
            if not entries:
                if log.closed:
                    return
                await wait_for_events(log, cursor, _WAIT)
                continue
            cursor = entries[-1][0]
            lines: list[bytes] = []
            for _, name, data in entries:
                try:
                    part = reply.event(name, data)
                except ProblemError as error:
                    if transport is None:
                        raise
                    # Mid-stream, as Ollama ends a stream that failed: one line with the error.
                    await transport.send(orjson.dumps({"error": error.detail}) + b"\n")
                    return
                if part is None:
                    continue
                if part.get("done"):
                    if transport is None:
                        body = orjson.dumps(reply.whole(part))
                        headers = [("content-type", "application/json; charset=utf-8"), ("lmsp-version", LMSP_VERSION)]
                        proto.response_bytes(200, headers, body)
                        return
                    lines.append(orjson.dumps(reply.last_line(part)) + b"\n")
                    await transport.send(b"".join(lines))
                    await transport.drained()  # the stream slot is held while its bytes are in flight
                    return
                if transport is not None:
                    lines.append(orjson.dumps(part) + b"\n")
            if lines and transport is not None:
                await transport.send(b"".join(lines))
    except ProtocolClosed:
        run.cancel()
    except ReaderStalled as exc:  # closed, and its generation cancelled as on a disconnect
        assert transport is not None
        transport.cut(exc)
        run.cancel()
    finally:
        watcher.cancel()
