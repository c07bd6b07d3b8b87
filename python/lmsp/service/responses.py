"""Creating responses: from a validated request to a generation whose events fill an EventLog.

Knows nothing of HTTP. Every view of a response (stream, sync, later tasks) reads the run's
log; `final_response` is the sync view. A run with `store: true` gets its final event only
once the response is kept durably, so no view can report a result that a crash could lose.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from lmsp._core import CompiledGrammar, EventLog, prepared_json_schema

from ..engine.backends import Backend, ContextLengthExceeded
from ..engine.chat_template import TemplateRenderError
from ..engine.grammar import GrammarCompiler, UnsupportedGrammar
from ..engine.prompt_disk import join_scope
from ..engine.schema_check import RECURSIVE_REF, OutputCheck, Relaxed, relax, schema_text
from ..engine.sequence import GenerationRequest, ModelUnavailable, Overloaded
from ..engine.sequence import Sequence as Generation
from ..engine.thinking import (
    BUDGETS,
    ThinkFormat,
    closing_suffix,
    opens_in_prompt,
    template_variables,
    thinking_grammar,
)
from ..engine.tools import (
    CallFormat,
    ToolChoice,
    custom_input_rules,
    enforced_parameters,
    promised_parameters,
    tool_grammar,
)
from ..events.wait import wait_closed
from ..protocol import events as ev
from ..protocol.errors import ProblemError, draining, problem
from ..protocol.ids import new_id
from ..protocol.owners import LOCAL_OWNER
from ..security import quota
from .builder import EventBuilder, EventTap, FinalHook
from .conversations import Conversations
from .messages import chat_messages, template_tools, with_tool_prompt
from .models import Lease, ModelManager
from .plan import GenerationPlan, Item, Tool
from .reasoning import ThinkingSink

__all__ = [
    "CACHE_SCOPES",
    "BeforeFinal",
    "CacheScope",
    "ResponseRun",
    "ResponsesService",
    "cache_owner_key",
    "cache_scope_key",
]

log = logging.getLogger(__name__)


# `serve --cache-scope`: `owner` (the default) matches cached prompt cells only within the
# request's owner (its token's; every tokenless request is the one local owner); `shared`
# lets every owner's requests reuse every other's (one deployment's tenants sharing a long
# system prompt, who may then learn each other's prompts from cached_tokens and timing).
CacheScope = Literal["owner", "shared"]
CACHE_SCOPES: tuple[CacheScope, ...] = ("owner", "shared")


def _key(kind: str, value: str) -> str:
    return hashlib.sha256(orjson.dumps([kind, value])).hexdigest()[:32]


def cache_owner_key(owner: str) -> str:
    """An owner's part of its cache scopes, an opaque hash (it is written in the disk tier's
    files): what a DELETE by that owner hands the engine to forget its cached prompts."""
    return _key("owner", owner)


def cache_scope_key(mode: CacheScope, plan: GenerationPlan) -> str:
    """The engine's cache scope for a plan: its owner's key (none when the operator shares the
    cache: a DELETE then cannot tell whose a state was) and its `cache_salt`'s, each hashed."""
    owner = cache_owner_key(plan.owner) if mode == "owner" else ""
    salt = _key("salt", plan.cache_salt) if plan.cache_salt is not None else ""
    return join_scope(owner, salt)


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
    items: list[Item]  # the whole input it is generated from, history included
    keep: bool  # store: true
    sequence: Generation | None = field(default=None)
    before_final: BeforeFinal | None = field(default=None)
    owner: str = field(default=LOCAL_OWNER)
    # Set by `cancel`, for a run whose generation is not submitted yet (its model is loading).
    cancelled: bool = field(default=False)
    # What waits for its model to load (a stream's): cancelled with the run, so that a client
    # gone before its model loaded makes no load and no room for it.
    loader: asyncio.Future[None] | None = field(default=None)
    # Each face's own view of the events (its frames, its echo), by face, for as long as the
    # run is kept: the run owns them, so no face keeps state of its own.
    views: dict[str, object] = field(default_factory=dict)
    # Output tokens set aside on its token's `--tpm` bucket as it started (security/quota.py).
    reserved_output: int = field(default=0)

    def snapshot(self, final: tuple[str, bytes] | None = None) -> dict[str, Any]:
        """The response object as of now, from what the builder keeps (never from the log's
        ring, which may have dropped a long response's first items)."""
        return self.builder.response(created_at=self.created_at, model=self.model, final=final)

    def cancel(self) -> None:
        self.cancelled = True
        if self.sequence is not None:
            self.sequence.cancel()
        elif self.loader is not None:  # from any thread: a task is cancelled on its loop
            self.loader.get_loop().call_soon_threadsafe(self.loader.cancel)

    async def cancel_and_wait(self) -> None:
        """Cancels it and returns once its final event is written (`cancelled`, or the end it
        reached first)."""
        self.cancel()
        await wait_closed(self.log)

    def abort(self, error: dict[str, Any]) -> bool:
        """Ends the run's events with an `error` event (a problem not tied to this response);
        False if it had ended, or was being stored to end, already."""
        if not self.builder.seal(ev.ERROR, orjson.dumps({"error": error})):
            return False
        self.cancel()
        return True


def _check_capabilities(plan: GenerationPlan, capabilities: list[str]) -> None:
    needs = []
    if plan.tools is not None and (plan.tools.tools or plan.tools.choice not in ("auto", "none")):
        needs.append(("tools", "tools"))
    if plan.output is not None:
        needs.append(("structured_output", "response_format"))
    if plan.previous_response_id:
        needs.append(("conversations", "previous_response_id"))
    for capability, param in needs:
        if capability not in capabilities:
            raise ProblemError(
                "unsupported_capability",
                f"this request needs the {capability!r} capability, which the model lacks",
                param=param,
            )


def _check_output_shape(plan: GenerationPlan) -> None:
    """One grammar shapes the output: a JSON answer and tool calls cannot both be asked for."""
    if plan.output is not None and plan.calls_possible:
        raise ProblemError(
            "invalid_request",
            "response_format json_schema needs tool_choice 'none' when tools are given",
            param="response_format",
        )


def _check_plan(plan: GenerationPlan, capabilities: list[str]) -> None:
    _check_capabilities(plan, capabilities)
    _check_output_shape(plan)


class ResponsesService:
    def __init__(
        self,
        models: ModelManager,
        conversations: Conversations | None = None,
        cache_scope: CacheScope = "owner",
        schema_narrowing: bool = True,
    ) -> None:
        self.models = models
        self.conversations = conversations
        # `serve --cache-scope`: whose cached prompts a request may reuse (cache_scope_key).
        self.cache_scope: CacheScope = cache_scope
        # `serve --schema-narrowing`: whether a response format's schema is narrowed (`relax`).
        self.schema_narrowing = schema_narrowing
        self._runs: dict[str, ResponseRun] = {}  # not yet final
        self._keeping: set[asyncio.Task[None]] = set()  # final responses being stored
        self._loading: set[asyncio.Task[None]] = set()  # runs whose model loads first
        self._metering: set[asyncio.Task[None]] = set()  # runs charged to a token's quota when they end
        self._closing = False
        self._draining = False
        self._admitting = 0  # in `create`: not yet a run that `idle` would see
        # Told (owner, id) of each stored response generated here, once it is submitted: its
        # continuation is best served here, where its prompt state is (http/forward.py).
        self.on_stored: Callable[[str, str], None] | None = None

    async def create(
        self,
        plan: GenerationPlan,
        *,
        log: EventLog | None = None,
        before_final: BeforeFinal | None = None,
        tap: EventTap | None = None,
    ) -> ResponseRun:
        """Starts generating. `log`: one with other bounds than the default (tasks); `tap`: a
        second view fed with every event (another face's own frames).

        A stream whose model is not loaded yet gets its `response.created` at once and the
        model loads behind it; what would then have been a 4xx problem ends the stream as
        `response.failed`."""
        if self._closing:
            raise ProblemError("service_unavailable", "the service is shutting down")
        if self._draining:
            raise draining()
        self._admitting += 1
        try:
            return await self._create(plan, log, before_final, tap)
        finally:
            self._admitting -= 1

    async def _create(
        self, plan: GenerationPlan, log: EventLog | None, before_final: BeforeFinal | None, tap: EventTap | None
    ) -> ResponseRun:
        if plan.stream and self.models.needs_load(plan.model):
            _check_plan(plan, self.models.capabilities(None))
            run = self._start_while_loading(plan, log, tap)
        else:
            with await self.models.lease(plan.model) as lease:
                run = await self._start(lease, plan, log, before_final, tap)
        meter = quota.current()
        if meter is not None:
            self._meter(run, meter)
        return run

    def _meter(self, run: ResponseRun, meter: quota.Meter) -> None:
        """The run keeps its request's place among the token's `streams` until it ends (a
        background task's too), then gives back what it set aside and did not write (its input
        and the most it may write were charged as it started)."""
        meter.hold()

        async def charge_at_end() -> None:
            try:
                await wait_closed(run.log)
            finally:
                meter.settle(run.reserved_output, run.builder.output_tokens)
                meter.release()

        task = asyncio.ensure_future(charge_at_end())
        self._metering.add(task)
        task.add_done_callback(self._metering.discard)

    def _start_while_loading(self, plan: GenerationPlan, log: EventLog | None, tap: EventTap | None) -> ResponseRun:
        response_id = new_id("resp")
        log = log if log is not None else EventLog()
        # Only for `response.created` and a failure: the model's own builder takes over.
        builder = EventBuilder(log, response_id, tap=tap)
        run = ResponseRun(
            response_id, plan.model, int(time.time()), log, builder, list(plan.input), False, owner=plan.owner
        )
        if tap is not None:
            tap.started(run)
        builder.created()
        self._runs[response_id] = run  # a shutdown ends it too
        task = asyncio.ensure_future(self._load_then_start(run, plan, tap))
        run.loader = task
        self._loading.add(task)
        task.add_done_callback(self._loading.discard)
        return run

    async def _load_then_start(self, run: ResponseRun, plan: GenerationPlan, tap: EventTap | None) -> None:
        try:
            with await self.models.lease(plan.model) as lease:
                if run.cancelled or run.log.closed:  # the client left while it loaded, or the service stops
                    run.builder.seal(ev.CANCELLED, orjson.dumps({"response_id": run.id, "status": "cancelled"}))
                    return
                await self._start(lease, plan, run.log, None, tap, early=run)
        except asyncio.CancelledError:  # its client left while it waited for the model
            run.builder.seal(ev.CANCELLED, orjson.dumps({"response_id": run.id, "status": "cancelled"}))
            return
        except ProblemError as exc:
            error = exc.document()
        except Overloaded as exc:
            error = problem("overloaded", exc.detail)
        except Exception:  # nobody else would end this stream: it would hang
            log.exception("response %s failed to start", run.id)
            error = problem("internal_error", "the response could not be started")
        else:
            return
        run.builder.seal(ev.FAILED, orjson.dumps({"response_id": run.id, "status": "failed", "error": error}))

    async def _start(
        self,
        lease: Lease,
        plan: GenerationPlan,
        log: EventLog | None,
        before_final: BeforeFinal | None,
        tap: EventTap | None,
        early: ResponseRun | None = None,
    ) -> ResponseRun:
        """The plan's steps: history → prompt → constraint → submit. `early`: the run a stream
        already announced, whose model was loading."""
        backend = lease.backend
        _check_plan(plan, self.models.capabilities(backend))
        items, n_history = await self._history(plan)
        prompt, prompt_text = await self._prompt(backend, plan, items, n_history)
        think = _thinking(backend, plan)
        opened = think is not None and opens_in_prompt(think, prompt_text)
        # The schema as the grammar enforces it, and the check of what it cannot (engine.schema_check).
        output = plan.output
        relaxed = relax(output.schema, narrowing=output.narrowing and self.schema_narrowing) if output else None
        # The grammar first: its refusal names the keyword and where it is; the check's, only
        # that the schema is not one it can validate.
        grammar, enforced = await _constraint(backend, plan, relaxed, think, opened)
        output_check, call_checks = _checks(plan, enforced)
        # `none` can make no call, so its output is all text.
        calls = backend.calls if plan.calls_possible else None
        if self._closing:  # the shutdown came while its prompt was prepared: it would find no run to end
            raise ProblemError("service_unavailable", "the service is shutting down")
        run = self._run(plan, items, calls, log, before_final, tap, early)
        run.builder.output_check, run.builder.call_checks = output_check, call_checks
        generation = GenerationRequest(
            prompt=prompt,
            max_tokens=plan.max_output_tokens,
            sampling=plan.sampling,
            sink=ThinkingSink(run.builder, think, opened=opened) if think is not None else run.builder,
            prompt_text=prompt_text,
            grammar=grammar,
            stop=plan.stop,
            cache_scope=cache_scope_key(self.cache_scope, plan),
        )
        meter = quota.current()
        if meter is not None:  # its input and the most it may write, before it starts: 429 beyond
            most = plan.max_output_tokens
            most = max(0, backend.context_window - len(prompt)) if most is None else most
            meter.reserve(len(prompt), most)
            run.reserved_output = most  # not before: a refused run gives nothing back at its end
        try:
            run.sequence = lease.submit(generation)
        except ModelUnavailable as exc:  # it stopped since `get`: the next request loads it again
            if meter is not None:
                meter.give_back(len(prompt), run.reserved_output)
                run.reserved_output = 0
            raise ProblemError("model_unavailable", str(exc)) from None
        if run.cancelled:  # its client left while the model loaded
            run.sequence.cancel()
        elif run.keep and self.on_stored is not None:
            self.on_stored(plan.owner, run.id)
        self._runs = {rid: r for rid, r in self._runs.items() if not r.log.closed}
        self._runs[run.id] = run
        return run

    async def _history(self, plan: GenerationPlan) -> tuple[list[Item], int]:
        """The whole input: a continuation's stored items, then the plan's own."""
        items: list[Item] = list(plan.input)
        if plan.previous_response_id and self.conversations is not None:
            history = await self.conversations.history(plan.owner, plan.previous_response_id)
            return [*history, *items], len(history)
        return items, 0

    async def _prompt(
        self, backend: Backend, plan: GenerationPlan, items: list[Item], n_history: int
    ) -> tuple[list[int], str]:
        """The prompt's tokens (and text, for the scripted backend), through the model's template."""
        calls = backend.calls
        tools = list(plan.tools.tools) if plan.tools is not None else []
        messages = chat_messages(items, n_history, tools="tools" in self.models.capabilities(backend), calls=calls)
        if plan.instructions:
            messages = [{"role": "system", "content": plan.instructions}, *messages]
        # The tools are in the prompt whatever tool_choice says (R6.5-7): the grammar alone
        # forbids calls, so an agent loop's next turn starts from the same prefix (KV reuse).
        rendered_tools = None
        _check_custom_tools(tools, calls)
        if tools and calls.native:
            rendered_tools = template_tools(tools)
        elif tools:
            messages = with_tool_prompt(messages, tools)
        variables, effort = _template_controls(backend, plan)
        try:
            # Never on the event loop: a template at its time budget would stall every stream.
            prompt = await asyncio.to_thread(backend.prepare, messages, rendered_tools, variables=variables)
            fmt = backend.thinking
            if fmt is not None and effort == "none" and not fmt.switch:
                # No switch in the template: the prompt itself closes the block (or, harmony,
                # opens the final channel), so the model answers at once.
                suffix = closing_suffix(fmt, prompt[1])
                if suffix:
                    prompt = await asyncio.to_thread(
                        backend.prepare, messages, rendered_tools, variables=variables, suffix=suffix
                    )
            return prompt
        except ContextLengthExceeded as exc:
            raise ProblemError("context_length_exceeded", str(exc), param="input") from None
        except TemplateRenderError as exc:
            raise ProblemError(
                "invalid_request", f"the model's chat template rejected the input: {exc}", param="input"
            ) from None

    def _run(
        self,
        plan: GenerationPlan,
        items: list[Item],
        calls: CallFormat | None,
        log: EventLog | None,
        before_final: BeforeFinal | None,
        tap: EventTap | None,
        early: ResponseRun | None,
    ) -> ResponseRun:
        """The run whose events the generation writes: new, or the one announced while loading."""
        response_id = early.id if early is not None else new_id("resp")
        keep = plan.store and self.conversations is not None
        log = log if log is not None else EventLog()
        run: ResponseRun  # the hook is called only once the run exists
        hook = self._keep_hook(lambda: run) if keep or before_final is not None else None
        builder = EventBuilder(log, response_id, hook, calls=calls, tap=tap)
        if early is not None:
            run = early
            run.builder, run.items, run.keep = builder, items, keep
            return run
        run = ResponseRun(
            response_id,
            plan.model,
            int(time.time()),
            log,
            builder,
            items,
            keep,
            before_final=before_final,
            owner=plan.owner,
        )
        if tap is not None:
            tap.started(run)
        builder.created()
        return run

    async def count_tokens(self, plan: GenerationPlan) -> int:
        """The tokens the plan's prompt takes on its model (instructions, history and tools
        included), generating nothing: what a face's `count_tokens` answers."""
        with await self.models.lease(plan.model) as lease:
            _check_plan(plan, self.models.capabilities(lease.backend))
            items, n_history = await self._history(plan)
            prompt, _ = await self._prompt(lease.backend, plan, items, n_history)
        return len(prompt)

    async def final_response(self, run: ResponseRun) -> dict[str, Any]:
        """The sync view: waits for the run's final event, then folds the log."""
        await wait_closed(run.log)
        return run.snapshot()

    async def get(self, response_id: str, owner: str = LOCAL_OWNER) -> dict[str, Any]:
        """A stored response (R6.2-6); one with `store: true` still running reads in_progress."""
        if self.conversations is None:
            raise ProblemError("response_not_found", "this service stores no responses")
        run = self._runs.get(response_id)
        if run is not None and run.keep and not run.log.closed and run.owner == owner:  # others': 404
            return run.snapshot()
        return await self.conversations.get(owner, response_id)

    async def delete(
        self, response_id: str, owner: str = LOCAL_OWNER, before: Callable[[list[str]], Awaitable[None]] | None = None
    ) -> None:
        """Forgets a stored response and every copy of it (issue 38). One still generating is
        kept (or recorded) once it ends, so it is refused (409) until then. `before` is given
        the ids of the tasks that carried it and drops what lives outside the store (their
        events) first: the store's copies go last, in one transaction, so a failure anywhere
        leaves the response readable and a retry finishes the job."""
        if self.conversations is None:
            raise ProblemError("response_not_found", "this service stores no responses")
        run = self._runs.get(response_id)
        if run is not None and (run.keep or run.before_final is not None) and not run.log.closed:
            if run.owner == owner:
                raise ProblemError(
                    "idempotency_conflict", "the response is still being generated; cancel it or wait for it to end"
                )
        if before is not None:
            await before(await self.conversations.tasks_of(owner, response_id))
        await self.conversations.delete(owner, response_id)
        await self._forget_cached(owner)

    async def _forget_cached(self, owner: str) -> None:
        """The prompt cache's copies (slots, memory, disk) of a DELETE's owner. No state names
        the response it served, so every state of the owner goes, on every model (all its cache
        salts); what it cost is a cold prompt for that owner's next request. The response is
        gone already: a failure here is logged, not answered (the disk's retention and
        budget still age what is left)."""
        try:
            gone = await self.models.forget_cache_owner(cache_owner_key(owner))
        except Exception:
            log.exception("prompt cache: forgetting a deleted response's owner's states failed")
        else:
            log.debug("prompt cache: %d states of a deleting owner dropped", gone)

    async def input_items(self, response_id: str, owner: str = LOCAL_OWNER) -> list[dict[str, Any]]:
        """The input a stored response was generated from, history included, oldest first."""
        if self.conversations is None:
            raise ProblemError("response_not_found", "this service stores no responses")
        return await self.conversations.input_items(owner, response_id)

    @property
    def closing(self) -> bool:
        """The service is stopping or draining: it takes no new responses."""
        return self._closing or self._draining

    def stop_accepting(self) -> None:
        """Drain: new responses are refused (`draining()`), those admitted run to their end."""
        self._draining = True

    def idle(self) -> bool:
        """Nothing is being generated, started or stored: what a drain waits for."""
        running = any(not run.log.closed for run in self._runs.values())
        return not (running or self._admitting or self._loading or self._keeping)

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


def _template_controls(backend: Backend, plan: GenerationPlan) -> tuple[dict[str, Any] | None, str | None]:
    """The variables a thinking model's template is told (thinking on or off, its effort)."""
    fmt = backend.thinking
    if fmt is None:
        return None, None
    effort = plan.reasoning.effort if plan.reasoning is not None else "medium"
    return template_variables(fmt, effort), effort


def _thinking(backend: Backend, plan: GenerationPlan) -> ThinkFormat | None:
    """How this response's output thinks (None: it does not, or `effort: none` turned it off)."""
    fmt = backend.thinking
    if fmt is None or (plan.reasoning is not None and plan.reasoning.effort == "none"):
        return None
    return fmt


def _budget(plan: GenerationPlan) -> int:
    control = plan.reasoning
    if control is not None and control.budget_tokens is not None:
        return control.budget_tokens
    return BUDGETS.get(control.effort if control is not None else "medium", BUDGETS["medium"])


async def _constraint(
    backend: Backend, plan: GenerationPlan, relaxed: Relaxed | None, think: ThinkFormat | None, opened: bool
) -> tuple[CompiledGrammar | None, Relaxed | None]:
    """The grammar the output must follow, compiled before any event is sent (R6.5-5, R6.5-6),
    and the schema it enforces (`relaxed`, or a wider one that compiled: `_schema_grammar`).
    A thinking model thinks first, within its budget, and the grammar holds from the end of
    its thinking block (each part is compiled alone first, so that a refusal names it)."""
    grammars = backend.grammars
    if grammars is None:
        return None, relaxed
    answer: str | None = None
    if relaxed is not None:
        relaxed, compiled = await _schema_grammar(grammars, relaxed)
        if think is None:
            return compiled, relaxed
        answer = "start: %json " + prepared_json_schema(schema_text(relaxed.schema))
    elif plan.tools is not None and plan.tools.tools:
        use = plan.tools
        compiled = await _tools_grammar(grammars, use.tools, use.choice, backend.calls, use.parallel)
        if think is None:
            return compiled, relaxed
        answer = tool_grammar(use.tools, use.choice, backend.calls, parallel=use.parallel)
    if answer is None or think is None:
        # Free text after the thinking is not bounded by a grammar: max_output_tokens bounds it.
        return None, relaxed
    try:
        grammar = await grammars.lark(thinking_grammar(think, opened=opened, budget=_budget(plan), answer=answer))
        return grammar, relaxed
    except UnsupportedGrammar as exc:
        raise ProblemError("invalid_request", f"the output cannot be enforced after thinking: {exc}") from None


def _checks(plan: GenerationPlan, relaxed: Relaxed | None) -> tuple[OutputCheck | None, dict[str, OutputCheck]]:
    """The checks of the finished output (the message's, and each function tool's by name)
    for what the grammar enforces only in part; a schema they cannot be built for is refused."""
    if relaxed is not None:
        try:
            return relaxed.check(), {}
        except ValueError as exc:
            raise ProblemError("unsupported_schema", str(exc), param="response_format.json_schema.schema") from None
    checks = {}
    for i, tool in enumerate(plan.tools.tools if plan.tools is not None else ()):
        if tool.get("type") == "custom":
            continue
        try:
            checks[tool["name"]] = relax(promised_parameters(tool)).check()
        except ValueError as exc:
            raise ProblemError(
                "invalid_request", f"tool {tool['name']!r}: {exc}", param=f"tools[{i}].parameters"
            ) from None
    return None, checks


async def _schema_grammar(grammars: GrammarCompiler, relaxed: Relaxed) -> tuple[Relaxed, CompiledGrammar]:
    """The schema's grammar, and the schema it enforces: where the engine cannot intersect a
    recursive `$ref` with what is beside it, the schema with each `$ref` alone, the rest left
    to the check of the finished value (engine.schema_check, `Relaxed.detached`)."""
    try:
        return relaxed, await grammars.json_schema(relaxed.schema)
    except UnsupportedGrammar as exc:
        refusal = exc
    wider = relaxed.detached() if RECURSIVE_REF in str(refusal) else None
    if wider is not None:
        try:
            return wider, await grammars.json_schema(wider.schema)
        except UnsupportedGrammar:
            pass  # the first reason is the one to give
    raise ProblemError(
        "unsupported_schema", f"the schema cannot be enforced: {refusal}", param="response_format.json_schema.schema"
    ) from None


async def _tools_grammar(
    grammars: GrammarCompiler, tools: Sequence[Tool], choice: ToolChoice, calls: CallFormat, parallel: bool
) -> CompiledGrammar:
    for i, tool in enumerate(tools):
        # Each schema on its own first, so that a refusal names its tool (profile R6.5-2).
        if tool.get("type") == "custom":
            await _custom_grammar(grammars, i, tool)
            continue
        try:
            await grammars.json_schema(enforced_parameters(tool))
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


def _check_custom_tools(tools: Sequence[Tool], calls: CallFormat) -> None:
    """Custom tools are described and called in our own Hermes frame; a template that renders
    tools itself would describe them as functions without their grammar."""
    for i, tool in enumerate(tools):
        if tool.get("type") == "custom" and (calls.native or calls.name != "hermes"):
            raise ProblemError(
                "invalid_request",
                f"tool {tool['name']!r}: this model's chat template has no custom tools",
                param=f"tools[{i}].type",
            )


async def _custom_grammar(grammars: GrammarCompiler, i: int, tool: Tool) -> None:
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
