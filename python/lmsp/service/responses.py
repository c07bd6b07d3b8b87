"""Creating responses: from a validated request to a generation whose events fill an EventLog.

Knows nothing of HTTP. Every view of a response (stream, sync, later tasks) reads the run's
log; `final_response` is the sync view. A run with `store: true` gets its final event only
once the response is kept durably, so no view can report a result that a crash could lose.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from lmsp._core import CompiledGrammar, EventLog

from ..engine.backends import Backend, ContextLengthExceeded
from ..engine.chat_template import TemplateRenderError
from ..engine.grammar import GrammarCompiler, UnsupportedGrammar
from ..engine.sequence import GenerationRequest, ModelUnavailable, Overloaded, Sequence
from ..engine.tools import CallFormat, custom_input_rules, parameters_of, tool_grammar
from ..protocol import events as ev
from ..protocol.errors import ProblemError, problem
from ..protocol.ids import new_id
from .builder import EventBuilder, EventTap, FinalHook
from .conversations import Conversations
from .logwait import wait_for_events
from .messages import chat_messages, template_tools, with_tool_prompt
from .models import Lease, ModelManager

__all__ = ["DEFAULT_TEMPERATURE", "LOCAL_OWNER", "BeforeFinal", "ResponseRun", "ResponsesService"]

log = logging.getLogger(__name__)

# The draft leaves the default open; 1.0 samples the model as trained (as the Responses API does).
DEFAULT_TEMPERATURE = 1.0
# Who owns what a request makes, until tokens exist (§10): every record is keyed by owner.
LOCAL_OWNER = "local"

# Awaited with the final response object before the final event goes out (a task keeps its
# record this way: no reader can see the end of a task that a crash would then forget).
BeforeFinal = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class ResponseRun:
    """One response being generated: its identity, its events, and how to stop it."""

    id: str
    model: str
    created_at: int
    log: EventLog
    builder: EventBuilder
    items: list[dict[str, Any]]  # the whole input it is generated from, history included
    keep: bool  # store: true
    sequence: Sequence | None = field(default=None)
    before_final: BeforeFinal | None = field(default=None)
    owner: str = field(default=LOCAL_OWNER)
    # Set by `cancel`, for a run whose generation is not submitted yet (its model is loading).
    cancelled: bool = field(default=False)

    def snapshot(self, final: tuple[str, bytes] | None = None) -> dict[str, Any]:
        """The response object as of now, from what the builder keeps (never from the log's
        ring, which may have dropped a long response's first items)."""
        return self.builder.response(created_at=self.created_at, model=self.model, final=final)

    def cancel(self) -> None:
        self.cancelled = True
        if self.sequence is not None:
            self.sequence.cancel()

    def abort(self, error: dict[str, Any]) -> bool:
        """Ends the run's events with an `error` event (a problem not tied to this response);
        False if it had ended, or was being stored to end, already."""
        if not self.builder.seal(ev.ERROR, orjson.dumps({"error": error})):
            return False
        self.cancel()
        return True


def _check_capabilities(request: dict[str, Any], capabilities: list[str]) -> None:
    needs = []
    if request.get("tools") or request.get("tool_choice") not in (None, "auto", "none"):
        needs.append(("tools", "tools"))
    if request.get("response_format", {}).get("type") == "json_schema":
        needs.append(("structured_output", "response_format"))
    if request.get("previous_response_id"):
        needs.append(("conversations", "previous_response_id"))
    for capability, param in needs:
        if capability not in capabilities:
            raise ProblemError(
                "unsupported_capability",
                f"this request needs the {capability!r} capability, which the model lacks",
                param=param,
            )


class ResponsesService:
    def __init__(self, models: ModelManager, conversations: Conversations | None = None) -> None:
        self.models = models
        self.conversations = conversations
        self._runs: dict[str, ResponseRun] = {}  # not yet final
        self._keeping: set[asyncio.Task[None]] = set()  # final responses being stored
        self._loading: set[asyncio.Task[None]] = set()  # runs whose model loads first
        self._closing = False

    async def create(
        self,
        request: dict[str, Any],
        owner: str = LOCAL_OWNER,
        *,
        log: EventLog | None = None,
        before_final: BeforeFinal | None = None,
        tap: EventTap | None = None,
    ) -> ResponseRun:
        """Starts generating. `log`: one with other bounds than the default (tasks); `tap`: a
        second view fed with every event (another face's own frames).

        Besides the LMSP fields, a request may carry what a face translates into: `instructions`
        (a system message before everything, history included, and never stored with the
        input), `top_p` and `stop` (free text only).

        A stream whose model is not loaded yet gets its `response.created` at once and the
        model loads behind it; what would then have been a 4xx problem ends the stream as
        `response.failed`."""
        if self._closing:
            raise ProblemError("service_unavailable", "the service is shutting down")
        if request.get("stream") and self.models.needs_load(request["model"]):
            _check_capabilities(request, self.models.capabilities(None))
            _check_output_shape(request)
            return self._start_while_loading(request, owner, log, tap)
        with await self.models.lease(request["model"]) as lease:
            return await self._start(lease, request, owner, log, before_final, tap)

    def _start_while_loading(
        self, request: dict[str, Any], owner: str, log: EventLog | None, tap: EventTap | None
    ) -> ResponseRun:
        response_id = new_id("resp")
        log = log if log is not None else EventLog()
        # Only for `response.created` and a failure: the model's own builder takes over.
        builder = EventBuilder(log, response_id, tap=tap)
        run = ResponseRun(
            response_id, request["model"], int(time.time()), log, builder, request["input"], False, owner=owner
        )
        if tap is not None:
            tap.started(run)
        builder.created()
        self._runs[response_id] = run  # a shutdown ends it too
        task = asyncio.ensure_future(self._load_then_start(run, request, tap))
        self._loading.add(task)
        task.add_done_callback(self._loading.discard)
        return run

    async def _load_then_start(self, run: ResponseRun, request: dict[str, Any], tap: EventTap | None) -> None:
        try:
            with await self.models.lease(request["model"]) as lease:
                if run.cancelled or run.log.closed:  # the client left while it loaded, or the service stops
                    run.builder.seal(ev.CANCELLED, orjson.dumps({"response_id": run.id, "status": "cancelled"}))
                    return
                await self._start(lease, request, run.owner, run.log, None, tap, early=run)
        except ProblemError as exc:
            error = exc.document()
        except Exception:  # nobody else would end this stream: it would hang
            log.exception("response %s failed to start", run.id)
            error = problem("internal_error", "the response could not be started")
        else:
            return
        run.builder.seal(ev.FAILED, orjson.dumps({"response_id": run.id, "status": "failed", "error": error}))

    async def _start(
        self,
        lease: Lease,
        request: dict[str, Any],
        owner: str,
        log: EventLog | None,
        before_final: BeforeFinal | None,
        tap: EventTap | None,
        early: ResponseRun | None = None,
    ) -> ResponseRun:
        """`early`: the run a stream already announced, whose model was loading."""
        backend = lease.backend
        _check_capabilities(request, self.models.capabilities(backend))
        _check_output_shape(request)
        items: list[dict[str, Any]] = request["input"]
        n_history = 0
        previous = request.get("previous_response_id")
        if previous and self.conversations is not None:
            history = await self.conversations.history(owner, previous)
            n_history = len(history)
            items = [*history, *items]
        tools = request.get("tools") or []
        choice = request.get("tool_choice", "auto")
        capabilities = self.models.capabilities(backend)
        calls = backend.calls
        messages = chat_messages(items, n_history, tools="tools" in capabilities, calls=calls)
        if request.get("instructions"):
            messages = [{"role": "system", "content": request["instructions"]}, *messages]
        # The tools are in the prompt whatever tool_choice says (R6.5-7): the grammar alone
        # forbids calls, so an agent loop's next turn starts from the same prefix (KV reuse).
        rendered_tools = None
        _check_custom_tools(tools, calls)
        if tools and calls.native:
            rendered_tools = template_tools(tools)
        elif tools:
            messages = with_tool_prompt(messages, tools)
        try:
            # Never on the event loop: a template at its time budget would stall every stream.
            prompt, prompt_text = await asyncio.to_thread(backend.prepare, messages, rendered_tools)
        except ContextLengthExceeded as exc:
            raise ProblemError("context_length_exceeded", str(exc), param="input") from None
        except TemplateRenderError as exc:
            raise ProblemError(
                "invalid_request", f"the model's chat template rejected the input: {exc}", param="input"
            ) from None

        grammar = await _grammar(backend, request, calls)
        top_p = request.get("top_p", 1.0)
        if grammar is not None and top_p < 1.0:
            # The grammar's sampler (lmsp-constrain) has temperature and min_p, no nucleus.
            raise ProblemError(
                "invalid_request", "top_p below 1 cannot be combined with structured output or tools", param="top_p"
            )

        response_id = early.id if early is not None else new_id("resp")
        keep = bool(request.get("store")) and self.conversations is not None
        log = log if log is not None else EventLog()
        run: ResponseRun  # the hook is called only once the run exists
        hook = self._keep_hook(lambda: run) if keep or before_final is not None else None
        # `none` can make no call, so its output is all text.
        builder = EventBuilder(log, response_id, hook, calls=calls if tools and choice != "none" else None, tap=tap)
        if early is not None:
            run = early
            run.builder, run.items, run.keep = builder, items, keep
        else:
            run = ResponseRun(
                response_id,
                request["model"],
                int(time.time()),
                log,
                builder,
                items,
                keep,
                before_final=before_final,
                owner=owner,
            )
            if tap is not None:
                tap.started(run)
            builder.created()
        generation = GenerationRequest(
            prompt=prompt,
            max_tokens=request.get("max_output_tokens"),
            temperature=request.get("temperature", DEFAULT_TEMPERATURE),
            seed=_seed(request),
            sink=run.builder,
            prompt_text=prompt_text,
            grammar=grammar,
            top_p=top_p,
            stop=tuple(request.get("stop", ())),
        )
        try:
            run.sequence = lease.submit(generation)
            if run.cancelled:  # its client left while the model loaded
                run.sequence.cancel()
        except Overloaded as exc:
            raise _overloaded(exc) from None
        except ModelUnavailable as exc:  # it stopped since `get`: the next request loads it again
            raise ProblemError("model_unavailable", str(exc)) from None
        self._runs = {rid: r for rid, r in self._runs.items() if not r.log.closed}
        self._runs[response_id] = run
        return run

    async def final_response(self, run: ResponseRun) -> dict[str, Any]:
        """The sync view: waits for the run's final event, then folds the log."""
        while not run.log.closed:
            await wait_for_events(run.log, run.log.last_id)
        return run.snapshot()

    async def get(self, response_id: str, owner: str = LOCAL_OWNER) -> dict[str, Any]:
        """A stored response (R6.2-6); one with `store: true` still running reads in_progress."""
        if self.conversations is None:
            raise ProblemError("response_not_found", "this service stores no responses")
        run = self._runs.get(response_id)
        if run is not None and run.keep and not run.log.closed and run.owner == owner:  # others': 404
            return run.snapshot()
        return await self.conversations.get(owner, response_id)

    async def delete(self, response_id: str, owner: str = LOCAL_OWNER) -> None:
        """Forgets a stored response; one still generating is kept once it ends, so it is
        refused (409) until then."""
        if self.conversations is None:
            raise ProblemError("response_not_found", "this service stores no responses")
        run = self._runs.get(response_id)
        if run is not None and run.keep and not run.log.closed and run.owner == owner:
            raise ProblemError(
                "idempotency_conflict", "the response is still being generated; cancel it or wait for it to end"
            )
        await self.conversations.delete(owner, response_id)

    async def input_items(self, response_id: str, owner: str = LOCAL_OWNER) -> list[dict[str, Any]]:
        """The input a stored response was generated from, history included, oldest first."""
        if self.conversations is None:
            raise ProblemError("response_not_found", "this service stores no responses")
        return await self.conversations.input_items(owner, response_id)

    def shutdown(self) -> None:
        """Ends every open run with an `error` event: the service is going away. What a run
        keeps (its stored response, its task's record) then says that error too, once
        written (`drain`): a restart must not read another end than its readers saw."""
        self._closing = True
        error = problem("service_unavailable", "the service is shutting down")
        for run in self._runs.values():
            if run.abort(error) and (run.keep or run.before_final is not None):
                self._track(self._keep_ended(run, run.snapshot()))

    async def drain(self) -> None:
        """Waits for the final responses being stored: before the store closes."""
        while self._keeping:
            await asyncio.gather(*self._keeping, return_exceptions=True)

    # --- keeping stored responses ---------------------------------------------------------

    def _keep_hook(self, get_run: Callable[[], ResponseRun]) -> FinalHook:
        loop = asyncio.get_running_loop()

        def on_final(event: str, data: bytes) -> None:  # on the backend's thread
            run = get_run()
            try:
                loop.call_soon_threadsafe(self._start_keeping, run, event, data)
            except RuntimeError:  # the loop is gone (shutdown): nobody is left to read it
                run.builder.seal(event, data)

        return on_final

    def _start_keeping(self, run: ResponseRun, event: str, data: bytes) -> None:
        # Claimed here, on the loop, so that a shutdown after this lets it end as generated.
        if run.builder.claim():
            self._track(self._keep_then_seal(run, event, data))

    def _track(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._keeping.add(task)
        task.add_done_callback(self._keeping.discard)

    async def _keep_then_seal(self, run: ResponseRun, event: str, data: bytes) -> None:
        try:
            await self._keep(run, run.snapshot((event, data)))
        except Exception:  # the disk, not the client: say so in the response, keep serving
            log.exception("could not store response %s", run.id)
            error = problem("storage_failed", "the response was generated but could not be stored")
            event, data = ev.FAILED, orjson.dumps({"response_id": run.id, "status": "failed", "error": error})
        run.builder.finish(event, data)

    async def _keep_ended(self, run: ResponseRun, final: dict[str, Any]) -> None:
        try:
            await self._keep(run, final)
        except Exception:  # the stream has its end already: nothing else to tell
            log.exception("could not store response %s as the service stopped", run.id)

    async def _keep(self, run: ResponseRun, final: dict[str, Any]) -> None:
        if run.keep:
            assert self.conversations is not None
            await self.conversations.keep(run.owner, final, run.items)
        if run.before_final is not None:
            await run.before_final(final)


def _check_output_shape(request: dict[str, Any]) -> None:
    """One grammar shapes the output: a JSON answer and tool calls cannot both be asked for."""
    wants_json = (request.get("response_format") or {}).get("type") == "json_schema"
    if wants_json and request.get("tools") and request.get("tool_choice", "auto") != "none":
        raise ProblemError(
            "invalid_request",
            "response_format json_schema needs tool_choice 'none' when tools are given",
            param="response_format",
        )


async def _grammar(backend: Backend, request: dict[str, Any], calls: CallFormat) -> CompiledGrammar | None:
    """The grammar the output must follow, compiled before any event is sent (R6.5-5, R6.5-6)."""
    grammars = backend.grammars
    response_format = request.get("response_format") or {}
    try:
        if grammars is not None and response_format.get("type") == "json_schema":
            return await _schema_grammar(grammars, response_format["json_schema"]["schema"])
        if grammars is not None and request.get("tools"):
            parallel = request.get("extensions", {}).get("parallel_tool_calls") is True
            return await _tools_grammar(grammars, request["tools"], request.get("tool_choice", "auto"), calls, parallel)
    except Overloaded as exc:
        raise _overloaded(exc, "too many schemas are being compiled for this model; retry later") from None
    return None


async def _schema_grammar(grammars: GrammarCompiler, schema: dict[str, Any]) -> CompiledGrammar:
    try:
        return await grammars.json_schema(schema)
    except UnsupportedGrammar as exc:
        raise ProblemError(
            "unsupported_schema", f"the schema cannot be enforced: {exc}", param="response_format.json_schema.schema"
        ) from None


async def _tools_grammar(
    grammars: GrammarCompiler, tools: list[dict[str, Any]], choice: Any, calls: CallFormat, parallel: bool
) -> CompiledGrammar:
    for i, tool in enumerate(tools):
        # Each schema on its own first, so that a refusal names its tool (profile R6.5-2).
        if tool.get("type") == "custom":
            await _custom_grammar(grammars, i, tool)
            continue
        try:
            await grammars.json_schema(parameters_of(tool))
        except UnsupportedGrammar as exc:
            raise ProblemError(
                "invalid_request",
                f"tool {tool['name']!r}: parameters cannot be enforced: {exc}",
                param=f"tools[{i}].parameters",
            ) from None
    try:
        return await grammars.lark(tool_grammar(tools, choice, calls, parallel=parallel))
    except UnsupportedGrammar as exc:
        raise ProblemError("invalid_request", f"the tools cannot be enforced together: {exc}", param="tools") from None


def _check_custom_tools(tools: list[dict[str, Any]], calls: CallFormat) -> None:
    """Custom tools are described and called in our own Hermes frame; a template that renders
    tools itself would describe them as functions without their grammar."""
    for i, tool in enumerate(tools):
        if tool.get("type") == "custom" and (calls.native or calls.name != "hermes"):
            raise ProblemError(
                "invalid_request",
                f"tool {tool['name']!r}: this model's chat template has no custom tools",
                param=f"tools[{i}].type",
            )


async def _custom_grammar(grammars: GrammarCompiler, i: int, tool: dict[str, Any]) -> None:
    """A custom tool's grammar compiled on its own, as it is nested, so that a refusal names
    it. A Lark grammar that compiles alone also has its braces balanced, so nesting it in
    `%lark { … }` cannot close the block early and add rules of its own to ours."""
    form = tool.get("format") or {"type": "text"}
    if form["type"] == "text":
        return
    alone = (
        form["definition"] if form["syntax"] == "lark" else "\n".join(["start: input_0", *custom_input_rules(0, tool)])
    )
    try:
        await grammars.lark(alone)
    except UnsupportedGrammar as exc:
        raise ProblemError(
            "invalid_request",
            f"tool {tool['name']!r}: its {form['syntax']} grammar cannot be enforced: {exc}",
            param=f"tools[{i}].format.definition",
        ) from None


def _overloaded(exc: Overloaded, detail: str = "the model's queue is full; retry later") -> ProblemError:
    return ProblemError("overloaded", detail, headers=[("retry-after", str(exc.retry_after))])


def _seed(request: dict[str, Any]) -> int:
    """`extensions.seed` makes sampling repeatable; anything else there is ignored (R6.1-8)."""
    seed = request.get("extensions", {}).get("seed")
    valid = isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32
    return seed if valid else -1
