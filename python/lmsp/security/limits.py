"""Limits against resource exhaustion: what one request may ask for, and how many streams may be
open at once. Each is a `serve` flag; past one, a problem document names the field and the flag.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from ..protocol.errors import ProblemError
from .guard import Principal

__all__ = [
    "Limits",
    "StreamSlots",
    "check_body_depth",
    "check_embedding_inputs",
    "check_embedding_tokens",
    "check_request",
]


@dataclass(frozen=True)
class Limits:
    input_items: int = 1024
    input_chars: int = 1_000_000
    max_output_tokens: int = 32768
    tools: int = 128
    # Stop sequences: the engine looks for each of them after every token, on the model's thread.
    stops: int = 16
    stop_chars: int = 4096  # all of a request's stop sequences together
    # Embeddings: each input is decoded on the model's thread, between generation steps, so one
    # request's inputs, and their tokens all together, are bounded as a generation's output is.
    embedding_inputs: int = 256
    embedding_tokens: int = 65536  # 128 inputs of a whole 512-token window
    # JSONSchemaBench's schemas up to 256 KB (Kubernetes, JSON Schema Store) compile in under 0.1 s
    # here; the compile budget (engine.grammar) still bounds a larger or costlier one.
    schema_bytes: int = 256 * 1024
    schema_depth: int = 32
    # Any body: deeper than this is no real request, and orjson cannot write past 255 levels.
    json_depth: int = 64
    streams: int = 2048  # open SSE streams, all clients together
    streams_per_token: int = 32
    # Streams of a token that start far back in a log (a resume, a whole task's events read
    # again): each first copies up to a whole ring, so one token may run only this many.
    replays_per_token: int = 4
    # Seconds: a request's headers must arrive within header_timeout (granian enforces it);
    # its body may pause at most body_timeout between chunks, and must be whole within
    # body_deadline (a client trickling a byte every few seconds holds a request no longer).
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    body_deadline: float = 120.0
    # A stream's bytes handed to the server beyond what its socket took (http/outflow.py): past
    # stream_buffer the writer waits, and a reader not back under half of it within
    # write_timeout seconds is closed (a POST stream's generation is then cancelled); 0: no bound.
    stream_buffer: int = 1024 * 1024
    write_timeout: float = 30.0


def _exceeded(detail: str, param: str, flag: str) -> ProblemError:
    return ProblemError("limit_exceeded", f"{detail} (`lmsp serve {flag}`)", param=param)


def _depth_over(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit`; iterative, so no input can make it
    recurse, and it stops at the first branch too deep."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _chars(value: Any) -> int:
    """Characters in every string of a JSON value (keys included)."""
    total = 0
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            total += len(node)
        elif isinstance(node, dict):
            total += sum(len(k) for k in node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return total


def _schemas(body: Any) -> Iterator[tuple[str, Any]]:
    """The schemas a body carries, by the field that names them. Read before validation, so
    any part may be of any type."""
    if not isinstance(body, dict):
        return
    # LMSP's and Chat's `response_format.json_schema.schema`, the Responses API's `text.format.schema`.
    response_format = body.get("response_format")
    json_schema = response_format.get("json_schema") if isinstance(response_format, dict) else None
    if isinstance(json_schema, dict) and "schema" in json_schema:
        yield "response_format.json_schema.schema", json_schema["schema"]
    text = body.get("text")
    text_format = text.get("format") if isinstance(text, dict) else None
    if isinstance(text_format, dict) and "schema" in text_format:
        yield "text.format.schema", text_format["schema"]
    # Flat tools (LMSP, Responses) name `parameters` or a custom tool's `format`; Chat nests
    # them under `function`.
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict):
            continue
        for name in ("parameters", "format"):
            if name in tool:
                yield f"tools[{i}].{name}", tool[name]
        function = tool.get("function")
        if isinstance(function, dict) and "parameters" in function:
            yield f"tools[{i}].function.parameters", function["parameters"]


def check_body_depth(body: Any, limits: Limits) -> None:
    """The parsed body's nesting, before validation walks it: each schema against the schema
    depth (a deep schema is the usual deep body, and its own limit is the one to name), then
    each top-level field against the body's."""
    for param, schema in _schemas(body):
        if _depth_over(schema, limits.schema_depth):
            raise _exceeded(f"the schema nests deeper than {limits.schema_depth} levels", param, "--max-schema-depth")
    fields = body.items() if isinstance(body, dict) else [("", body)]
    for name, value in fields:
        if _depth_over(value, limits.json_depth - (1 if name else 0)):
            raise _exceeded(f"the body nests deeper than {limits.json_depth} levels", name, "--max-json-depth")


def _check_schema(schema: Any, param: str, limits: Limits) -> None:
    # Its depth was checked on the parsed body under the face's own field name (orjson cannot
    # write past 255 levels); checked again here, so that no face's field can be missed.
    if _depth_over(schema, limits.schema_depth):
        raise _exceeded(f"the schema nests deeper than {limits.schema_depth} levels", param, "--max-schema-depth")
    if len(orjson.dumps(schema)) > limits.schema_bytes:
        raise _exceeded(f"the schema is larger than {limits.schema_bytes} bytes", param, "--max-schema-bytes")


def _check_stops(stop: Sequence[str], param: str, limits: Limits) -> None:
    if len(stop) > limits.stops:
        raise _exceeded(f"{len(stop)} stop sequences; at most {limits.stops}", param, "--max-stops")
    if sum(len(s) for s in stop) > limits.stop_chars:
        raise _exceeded(f"the stop sequences have more than {limits.stop_chars} characters", param, "--max-stop-chars")


def check_request(
    limits: Limits,
    items: Sequence[Mapping[str, Any]],
    instructions: str | None,
    max_tokens: int | None,
    tools: Sequence[Mapping[str, Any]],
    schema: Mapping[str, Any] | None,
    stop: Sequence[str] = (),
    stop_param: str = "stop",
) -> None:
    """What a request asks for, against the limits (its body already passed
    `check_body_depth`): the input (instructions included: the model reads them too), the
    output budget, the stop sequences (named `stop_param`, as the face spells them), the
    tools and the output schema."""
    if len(items) > limits.input_items:
        raise _exceeded(f"{len(items)} input items; at most {limits.input_items}", "input", "--max-input-items")
    if _chars(list(items)) + len(instructions or "") > limits.input_chars:
        raise _exceeded(f"the input has more than {limits.input_chars} characters", "input", "--max-input-chars")
    if max_tokens is not None and max_tokens > limits.max_output_tokens:
        raise _exceeded(
            f"max_output_tokens is at most {limits.max_output_tokens}", "max_output_tokens", "--max-output-tokens"
        )
    _check_stops(stop, stop_param, limits)
    if len(tools) > limits.tools:
        raise _exceeded(f"{len(tools)} tools; at most {limits.tools}", "tools", "--max-tools")
    for i, tool in enumerate(tools):
        if "parameters" in tool:
            _check_schema(tool["parameters"], f"tools[{i}].parameters", limits)
        elif "format" in tool:  # a custom tool's grammar costs what a schema does to compile
            _check_schema(tool["format"], f"tools[{i}].format", limits)
    if schema is not None:
        _check_schema(schema, "response_format.json_schema.schema", limits)


def check_embedding_inputs(count: int, param: str, limits: Limits) -> None:
    """The inputs of one embeddings request, counted before any is tokenized."""
    if count > limits.embedding_inputs:
        raise _exceeded(f"{count} inputs; at most {limits.embedding_inputs}", param, "--max-embedding-inputs")


def check_embedding_tokens(tokens: int, param: str, limits: Limits) -> None:
    """The tokens of one embeddings request's inputs together, as they would be decoded (after
    any truncation to the window)."""
    if tokens > limits.embedding_tokens:
        raise _exceeded(
            f"the inputs are {tokens} tokens together; at most {limits.embedding_tokens}",
            param,
            "--max-embedding-tokens",
        )


class StreamSlots:
    """Open SSE streams: all of them, and each token's (a service without tokens has one
    client, the machine, bounded by the total only)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open = 0
        self._per_token: dict[str, int] = {}
        self._replays: dict[str, int] = {}

    @contextmanager
    def hold(self, principal: Principal, replay: bool = False) -> Iterator[None]:
        """A stream slot for as long as the block runs; `replay`: the stream starts far back
        in its log (http/sse.py `replays`), and takes one of its token's replays too."""
        token = principal.token_id
        if replay and token is not None:
            with self._replay(token), self.hold(principal):
                yield
            return
        if self.open >= self.limits.streams:
            raise _too_many(f"{self.open} streams are open; the service allows {self.limits.streams}", "--max-streams")
        if token is not None and self._per_token.get(token, 0) >= self.limits.streams_per_token:
            raise _too_many(
                f"this token has {self.limits.streams_per_token} streams open, its limit", "--max-streams-per-token"
            )
        self.open += 1
        if token is not None:
            self._per_token[token] = self._per_token.get(token, 0) + 1
        try:
            yield
        finally:
            self.open -= 1
            if token is not None:
                left = self._per_token[token] - 1
                if left:
                    self._per_token[token] = left
                else:
                    del self._per_token[token]

    @contextmanager
    def _replay(self, token: str) -> Iterator[None]:
        held = self._replays.get(token, 0)
        if held >= self.limits.replays_per_token:
            raise _too_many(
                f"this token has {held} streams open that replay a log from far back, its limit; "
                "resume from a later event id, or retry when one ends",
                "--max-replays-per-token",
            )
        self._replays[token] = held + 1
        try:
            yield
        finally:
            left = self._replays[token] - 1
            if left:
                self._replays[token] = left
            else:
                del self._replays[token]


def _too_many(detail: str, flag: str) -> ProblemError:
    return ProblemError("too_many_streams", f"{detail} (`lmsp serve {flag}`)", headers=[("retry-after", "1")])
