"""`lmsp serve | run | models | doctor | token`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .client import APIError, Client
from .client.calls import resolve_base_url
from .datadir import resolve_data_dir
from .engine.drafts import DEFAULT_DRAFT_MAX
from .engine.registry import discover
from .engine.scheduler import DEFAULT_CACHE_DISK_MIB, DEFAULT_CACHE_RAM_MIB, SchedulerConfig
from .envargs import EnvArgumentParser, byte_size, duration
from .http.replays import DEFAULT_MAX_REPLAY_BODY
from .local_service import answers
from .run import add_parser as run_add_parser
from .security.cors import parse_origins
from .security.limits import Limits
from .security.scopes import SCOPES, parse_scopes
from .server import DEFAULT_DRAIN_TIMEOUT, ServeError, Settings, serve
from .service.conversations import DEFAULT_STORE_QUOTA, DEFAULT_STORE_QUOTA_BYTES, DEFAULT_STORE_RETENTION
from .service.models import DEFAULT_MAX_LOADED
from .service.responses import CACHE_SCOPES
from .state import DEFAULT_STORE, StateConfig, StateError, open_tokens
from .tokens import QUOTA_FIELDS, Quota, Tokens, TokenUsage

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:
    try:
        cors_origins = parse_origins(args.cors_origin)
    except ValueError as exc:
        print(f"lmsp: {exc}", file=sys.stderr)
        return 2
    settings = Settings(
        host=args.host,
        port=args.port,
        model_dirs=[Path(d) for d in args.model_dir],
        discover_stores=not args.no_discover,
        keep_alive=args.keep_alive,
        max_loaded=args.max_loaded,
        max_loaded_bytes=args.max_loaded_bytes,
        failed_load_ttl=args.failed_load_ttl,
        load_wait=args.load_wait,
        min_residency=args.min_residency,
        preload=args.preload,
        scheduler=SchedulerConfig(
            n_parallel=args.parallel,
            ctx_per_sequence=args.ctx_size,
            n_threads=args.threads or os.cpu_count() or 1,
            max_queue=args.max_queue,
            prefill_chunk=args.prefill_chunk,
            n_batch=args.batch_size,
            flash_attn={"auto": None, "on": True, "off": False}[args.flash_attn],
            fast_forward=args.fast_forward == "on",
            draft_max=max(0, args.draft_max) if args.draft != "off" else 0,
            draft_needs_flash_attn=args.draft == "auto",
            cache_ram_bytes=max(0, args.cache_ram) * 1024 * 1024,
            cache_dir=Path(args.cache_dir) if args.cache_dir else None,
            cache_disk_bytes=max(0, args.cache_disk) * 1024 * 1024,
            cache_shared=Path(args.cache_shared) if args.cache_shared else None,
            cache_shared_bytes=args.cache_shared_bytes,
            digest_memo=resolve_data_dir(Path(args.data_dir) if args.data_dir else None) if args.cache_shared else None,
            # Saved prompts are copies of what the store keeps: its retention bounds them too.
            cache_max_age=max(0.0, args.store_retention),
        ),
        cache_scope=args.cache_scope,
        schema_narrowing=args.schema_narrowing == "on",
        gpu_layers=args.gpu_layers,
        scripted_model=args.scripted_model,
        metrics=args.metrics,
        access_log=args.access_log,
        log_format=args.log_format,
        keepalive=args.keepalive,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        idempotency_ttl=args.idempotency_ttl,
        idempotency_max_body=args.idempotency_max_body,
        store_retention=args.store_retention,
        store_quota=args.store_quota,
        store_quota_bytes=args.store_quota_bytes,
        task_events_max=args.task_events_max,
        task_events_bytes=args.task_events_bytes,
        task_retention=args.task_retention,
        store_url=args.store,
        events_url=args.events,
        task_lease=args.task_lease,
        advertise_url=args.advertise_url,
        drain_timeout=args.drain_timeout,
        max_body=args.max_body_bytes,
        cors_origins=cors_origins,
        limits=Limits(
            input_items=args.max_input_items,
            input_chars=args.max_input_chars,
            max_output_tokens=args.max_output_tokens,
            tools=args.max_tools,
            stops=args.max_stops,
            stop_chars=args.max_stop_chars,
            embedding_inputs=args.max_embedding_inputs,
            embedding_tokens=args.max_embedding_tokens,
            schema_bytes=args.max_schema_bytes,
            schema_depth=args.max_schema_depth,
            json_depth=args.max_json_depth,
            streams=args.max_streams,
            streams_per_token=args.max_streams_per_token,
            replays_per_token=args.max_replays_per_token,
            header_timeout=args.header_timeout,
            body_timeout=args.body_timeout,
            body_deadline=args.body_deadline,
            stream_buffer=args.max_stream_buffer,
            write_timeout=args.stream_write_timeout,
        ),
    )
    for folder in settings.model_dirs:
        if not folder.is_dir():
            print(f"lmsp: --model-dir {folder} is not a folder", file=sys.stderr)
            return 2
    try:
        serve(settings)
    except ServeError as exc:
        print(f"lmsp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _tokens(args: argparse.Namespace) -> Tokens:
    """The tokens `serve` with the same --store (shared by replicas) or --data-dir reads."""
    store_url = args.store or os.environ.get("LMSP_STORE") or DEFAULT_STORE
    data_dir = resolve_data_dir(Path(args.data_dir) if args.data_dir else None)
    try:
        return open_tokens(StateConfig(data_dir=data_dir, store_url=store_url))
    except StateError as exc:
        print(f"lmsp: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _token_create(args: argparse.Namespace) -> int:
    try:
        scopes = parse_scopes(args.scopes)
    except ValueError as exc:
        print(f"lmsp: {exc}", file=sys.stderr)
        return 2
    tokens = _tokens(args)
    quota = Quota(**{name: value for name, value in _quota_args(args).items() if value})
    token, info = tokens.create(scopes, args.name, quota)
    tokens.close()
    print(token)
    print(f"token {info.id} ({', '.join(sorted(scopes))}): shown this once, keep it now", file=sys.stderr)
    return 0


def _non_negative(text: str) -> int:
    """A quota: a whole number, 0 for no bound (a bucket of 0 would refuse everything)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"at least 0 (0: no bound), not {value}")
    return value


def _quota_args(args: argparse.Namespace) -> dict[str, int | None]:
    """The quota flags given (`0`: no bound, which a token without the flag has too)."""
    given = {name: getattr(args, name) for name in QUOTA_FIELDS if getattr(args, name) is not None}
    return {name: value or None for name, value in given.items()}


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)


def _token_list(args: argparse.Namespace) -> int:
    tokens = _tokens(args)
    infos, usage = tokens.list(), tokens.usage()
    tokens.close()
    print("ID\tNAME\tSCOPES\tSTATE\tRPM\tTPM\tSTREAMS\tREQUESTS\tINPUT_TOKENS\tOUTPUT_TOKENS\tRATE_LIMITED")
    for info in infos:
        state = "active" if info.revoked_at is None else "revoked"
        q, used = info.quota, usage.get(info.id, TokenUsage())
        print(
            f"{info.id}\t{info.name or '-'}\t{','.join(sorted(info.scopes))}\t{state}\t"
            f"{_limit(q.rpm)}\t{_limit(q.tpm)}\t{_limit(q.streams)}\t"
            f"{used.requests}\t{used.input_tokens}\t{used.output_tokens}\t{used.limited}"
        )
    return 0


def _token_set(args: argparse.Namespace) -> int:
    changes = _quota_args(args)
    if not changes:
        print("lmsp: name what to change: --rpm, --tpm or --streams (0: no bound)", file=sys.stderr)
        return 2
    tokens = _tokens(args)
    changed = tokens.set_quota(args.token, changes)
    tokens.close()
    if not changed:
        print(f"lmsp: no active token has the id or name {args.token!r}", file=sys.stderr)
        return 1
    for info in changed:
        q = info.quota
        print(f"{info.id}: rpm {_limit(q.rpm)}, tpm {_limit(q.tpm)}, streams {_limit(q.streams)}")
    return 0


def _token_revoke(args: argparse.Namespace) -> int:
    tokens = _tokens(args)
    revoked = tokens.revoke(args.token)
    tokens.close()
    if not revoked:
        print(f"lmsp: no active token has the id or name {args.token!r}", file=sys.stderr)
        return 1
    for info in revoked:
        print(f"revoked {info.id}")
    return 0


def _models(args: argparse.Namespace) -> int:
    """The models of the service at the URL when one answers; else (or with --model-dir, a
    question about what `serve` would find) the models `serve` would offer, with their files."""
    if not args.model_dir:
        url = resolve_base_url(args.url)
        if answers(url):
            try:
                with Client(url, args.token) as client:
                    models = client.models.list()
            except APIError as exc:  # e.g. a service with tokens, and none given
                print(f"lmsp: {url}: {exc}", file=sys.stderr)
                return 1
            print(f"lmsp: the models of the service at {url}", file=sys.stderr)
            for model in models:
                state = "loaded" if model.loaded else "not loaded"
                columns = (model.id, model.source or "-", state, model.device, model.context_window)
                print("\t".join(map(str, columns)) + "\t" + ",".join(model.capabilities))
            return 0
        print(f"lmsp: no service answers at {url}; the models `lmsp serve` would offer", file=sys.stderr)
    for entry in discover([Path(d) for d in args.model_dir], from_stores=not args.no_discover):
        print(f"{entry.id}\t{entry.source}\t{entry.path}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """What the installed llama.cpp build can do, and what `serve` would choose with it."""
    from .engine.backends import auto_parallel, build_report, memory_bytes
    from .engine.llama import LlamaModel

    info: dict[str, object] = {**build_report(), "cpu_threads": os.cpu_count()}
    info["gpu_layers"] = "all" if info["device"] != "cpu" else 0
    models = []
    for entry in discover([Path(d) for d in args.model_dir]):
        model = LlamaModel(entry.path)
        window = min(args.ctx_size, model.n_ctx_train or args.ctx_size)
        models.append(
            {
                "id": entry.id,
                "path": str(entry.path),
                "context_window": window,
                "kv_bytes_per_token": model.kv_bytes_per_token,
                "parallel": auto_parallel(model.kv_bytes_per_token * window, memory_bytes()),
            }
        )
        model.close()
    info["models"] = models
    print(json.dumps(info, indent=2))
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmsp", description="A local model service speaking LMSP 1.0.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=EnvArgumentParser)

    # Every `serve` option can also be set as LMSP_<FLAG> in the environment (the flag wins).
    serve_p = sub.add_parser("serve", help="serve the models over HTTP", env_prefix="LMSP_")
    serve_p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve_p.add_argument("--port", type=int, default=8750, help="the port to listen on")
    serve_p.add_argument(
        "--model-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="serve every *.gguf under DIR (repeatable)",
        env="LMSP_MODEL_DIRS",
        env_separator=os.pathsep,
    )
    serve_p.add_argument(
        "--no-discover",
        action="store_true",
        help="serve only the embedded model and --model-dir, not the Ollama, Hugging Face and LM Studio stores",
    )
    serve_p.add_argument(
        "--keep-alive",
        type=duration,
        default="5m",
        metavar="DURATION",
        help="how long an idle model stays loaded: 300, 90s, 5m, 1h; 0 unloads at once, -1 never (default: 5m)",
    )
    serve_p.add_argument(
        "--max-loaded",
        type=int,
        default=DEFAULT_MAX_LOADED,
        metavar="N",
        help=(
            "models loaded at once; the least recently used idle one makes room "
            f"(0: no bound; default: {DEFAULT_MAX_LOADED})"
        ),
    )
    serve_p.add_argument(
        "--max-loaded-bytes",
        type=byte_size,
        default="0",
        metavar="SIZE",
        help=(
            "memory the loaded models may take together, each estimated from its GGUF (weights + KV cache): "
            "800M, 4G; the least recently used idle ones make room (0: no budget, only --max-loaded)"
        ),
    )
    serve_p.add_argument(
        "--failed-load-ttl",
        type=duration,
        default="30s",
        metavar="DURATION",
        help="how long a model that failed to load answers 503 at once, without loading again (0: tried every time)",
    )
    serve_p.add_argument(
        "--load-wait",
        type=duration,
        default="60s",
        metavar="DURATION",
        help="how long a request waits, first come first served, for room to load its model (--max-loaded) before 503",
    )
    serve_p.add_argument(
        "--min-residency",
        type=duration,
        default="10s",
        metavar="DURATION",
        help="how long a loaded model stays before it may be unloaded to make room for another (--max-loaded)",
    )
    serve_p.add_argument(
        "--preload",
        action="append",
        default=[],
        metavar="ID",
        help="load this model as it starts serving, not ready until it has (repeatable; default: the embedded "
        "model when it is the only one)",
    )
    serve_p.add_argument(
        "--parallel", type=int, default=0, help="sequences decoded together per model (default: from memory, at most 8)"
    )
    serve_p.add_argument("--ctx-size", type=int, default=4096, help="context window per sequence, in tokens")
    serve_p.add_argument("--threads", type=int, default=0, help="CPU threads for llama.cpp (default: all cores)")
    serve_p.add_argument("--max-queue", type=int, default=64, help="requests a model queues before answering 429")
    serve_p.add_argument(
        "--prefill-chunk", type=int, default=256, help="prompt tokens per step while other sequences generate"
    )
    serve_p.add_argument(
        "--batch-size",
        type=int,
        default=512,
        metavar="TOKENS",
        help="tokens one decode step takes at most (llama.cpp's n_batch and n_ubatch; at least --parallel)",
    )
    serve_p.add_argument(
        "--flash-attn",
        choices=("auto", "on", "off"),
        default="auto",
        help=(
            "llama.cpp's flash attention (auto: on for a model on the CPU, where our wheels' patched "
            "kernel is the faster at every context, llama.cpp's choice on a GPU; with it on, T=0 "
            "outputs of short contexts do not depend on what is decoded beside them)"
        ),
    )
    serve_p.add_argument(
        "--fast-forward",
        choices=("on", "off"),
        default="off",
        help=(
            "under a JSON schema or tool grammar, text the grammar forces (keys, quotes, enum tails) "
            "is decoded in one step with the token before it instead of a step a token (off: every "
            "output token is one the model sampled)"
        ),
    )
    serve_p.add_argument(
        "--schema-narrowing",
        choices=("on", "off"),
        default="on",
        help=(
            "under a JSON schema, the grammar writes a predictable subset of the valid values: an "
            "object that declares its properties and says nothing of others gets only those, an "
            "integer without bounds the 64-bit range, a date a real day (docs/guides/structured-"
            "output.md; a request turns it off with extensions.schema_narrowing: false)"
        ),
    )
    serve_p.add_argument(
        "--draft",
        choices=("auto", "ngram", "off"),
        default="auto",
        help=(
            "draft tokens for T=0 outputs (ngram: the tokens that followed the last few tokens' "
            "latest earlier occurrence in the prompt or output, checked in the same step: a "
            "copied run comes out several tokens a step; auto: ngram where flash attention is on and "
            "the build's kernel check at start-up finds a drafted row bit for bit the lone one, so "
            "the text is plain decoding's; off elsewhere)"
        ),
    )
    serve_p.add_argument(
        "--draft-max",
        type=int,
        default=DEFAULT_DRAFT_MAX,
        metavar="TOKENS",
        help=f"draft tokens a sequence decodes beside its next token at most (default: {DEFAULT_DRAFT_MAX})",
    )
    serve_p.add_argument(
        "--cache-ram",
        type=int,
        default=DEFAULT_CACHE_RAM_MIB,
        metavar="MIB",
        help=(
            "host memory per model for prompt states kept beyond the slots, restored when a prompt "
            f"starts with one (0: off; default: {DEFAULT_CACHE_RAM_MIB})"
        ),
    )
    serve_p.add_argument(
        "--cache-dir",
        default=None,
        metavar="DIR",
        help=(
            "keep prompt states on disk under DIR too, so that conversations go on after a restart "
            "without reading their past again (default: off)"
        ),
    )
    serve_p.add_argument(
        "--cache-disk",
        type=int,
        default=DEFAULT_CACHE_DISK_MIB,
        metavar="MIB",
        help=f"disk space per model under --cache-dir (default: {DEFAULT_CACHE_DISK_MIB})",
    )
    serve_p.add_argument(
        "--cache-shared",
        default=None,
        metavar="DIR",
        help=(
            "a folder several servers share prompt states through (replicas behind a balancer, on a "
            "network filesystem across machines): a conversation's next turn restores its past on "
            "whichever server it lands (default: off)"
        ),
    )
    serve_p.add_argument(
        "--cache-shared-bytes",
        type=byte_size,
        default="16G",
        metavar="SIZE",
        help="what --cache-shared may hold per model, every server's files together: 800M, 16G (default: 16G)",
    )
    serve_p.add_argument(
        "--cache-scope",
        choices=CACHE_SCOPES,
        default="owner",
        help=(
            "whose cached prompts a request may reuse (slots and --cache-ram/--cache-dir states): "
            "owner: only its own token owner's, so cached_tokens and timing tell nothing of "
            "another's prompts; shared: every owner's (default: owner)"
        ),
    )
    serve_p.add_argument("--gpu-layers", type=int, default=None, help="layers to offload (default: all on a GPU build)")
    serve_p.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="where stored responses live (default: $LMSP_HOME, else the user data folder)",
    )
    serve_p.add_argument(
        "--store-retention",
        type=duration,
        default=DEFAULT_STORE_RETENTION,
        metavar="DURATION",
        help="stored responses, task records and saved prompt states older than this are deleted "
        "(default: 720h, 30 days; 0: kept for ever)",
    )
    serve_p.add_argument(
        "--store-quota",
        type=int,
        default=DEFAULT_STORE_QUOTA,
        metavar="N",
        help=f"stored responses (and, apart, task records) kept per owner; past it the oldest go "
        f"(0: no bound; default: {DEFAULT_STORE_QUOTA})",
    )
    serve_p.add_argument(
        "--store-quota-bytes",
        type=int,
        default=DEFAULT_STORE_QUOTA_BYTES,
        metavar="BYTES",
        help=f"bytes of stored responses (input and output; and, apart, of task records) kept per owner; past it "
        f"the oldest go, the newest "
        f"always kept (0: no bound; default: {DEFAULT_STORE_QUOTA_BYTES}, 1 GiB)",
    )
    serve_p.add_argument(
        "--idempotency-ttl", type=float, default=24 * 3600.0, metavar="SECONDS", help=argparse.SUPPRESS
    )
    serve_p.add_argument(
        "--idempotency-max-body",
        type=int,
        default=DEFAULT_MAX_REPLAY_BODY,
        metavar="BYTES",
        help=f"the most of an answer kept for an Idempotency-Key's replay; past it a retry gets 409 "
        f"(default: {DEFAULT_MAX_REPLAY_BODY})",
    )
    # Small rings and short retention make expiry testable in seconds.
    serve_p.add_argument("--task-events-max", type=int, default=65536, metavar="N", help=argparse.SUPPRESS)
    serve_p.add_argument("--task-events-bytes", type=int, default=16 * 1024 * 1024, metavar="N", help=argparse.SUPPRESS)
    serve_p.add_argument("--task-retention", type=float, default=300.0, metavar="SECONDS", help=argparse.SUPPRESS)
    serve_p.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="postgresql://… shared by several replicas (default: SQLite in the data folder)",
    )
    serve_p.add_argument(
        "--events",
        default=None,
        metavar="URL",
        help="redis://… for task events shared by several replicas (needs --store)",
    )
    serve_p.add_argument(
        "--task-lease",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --events: a dead replica's tasks end failed this long after it stopped",
    )
    serve_p.add_argument(
        "--advertise-url",
        default=None,
        metavar="URL",
        help="with --events redis://…: where sibling replicas reach this one (http://host:port, no port: "
        "--port's); publishes its loaded models and sends requests for a model only a sibling has loaded "
        "there (default: off, every request served here)",
    )
    serve_p.add_argument(
        "--drain-timeout",
        type=duration,
        default=DEFAULT_DRAIN_TIMEOUT,
        metavar="DURATION",
        help="on SIGTERM: not ready, new work refused (503, Retry-After), running generations get this "
        f"long to finish; 0: they end at once; -1: no deadline, until a second signal (default: "
        f"{DEFAULT_DRAIN_TIMEOUT:g}s)",
    )
    serve_p.add_argument(
        "--keepalive", type=float, default=15.0, metavar="SECONDS", help=argparse.SUPPRESS, env="LMSP_SSE_KEEPALIVE"
    )
    serve_p.add_argument("--scripted-model", default=None, metavar="ID", help=argparse.SUPPRESS)
    serve_p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="access log lines on stderr: text for people, json for tools",
    )
    serve_p.add_argument("--no-access-log", dest="access_log", action="store_false", help="write no access log")
    serve_p.add_argument(
        "--no-metrics", dest="metrics", action="store_false", help="keep no metrics (GET /metrics answers 404)"
    )
    _security_flags(serve_p)
    serve_p.set_defaults(func=_serve)

    token_p = sub.add_parser("token", help="create, list and revoke bearer tokens")
    token_sub = token_p.add_subparsers(dest="token_command", required=True)
    create_p = token_sub.add_parser("create", help="create a token and print it (once)")
    create_p.add_argument("--scopes", required=True, help=f"comma-separated: {','.join(SCOPES)}")
    create_p.add_argument("--name", default=None, help="a name to list and revoke it by")
    create_p.set_defaults(func=_token_create)
    list_p = token_sub.add_parser(
        "list", help="list the tokens (ids, never the secrets), their quotas and what each has used"
    )
    list_p.set_defaults(func=_token_list)
    revoke_p = token_sub.add_parser("revoke", help="revoke a token by its id or name")
    revoke_p.add_argument("token", metavar="ID_OR_NAME")
    revoke_p.set_defaults(func=_token_revoke)
    set_p = token_sub.add_parser("set", help="change a token's quota (holds on a running service too)")
    set_p.add_argument("token", metavar="ID_OR_NAME")
    set_p.set_defaults(func=_token_set)
    for p in (create_p, set_p):
        p.add_argument(
            "--rpm", type=_non_negative, default=None, metavar="N", help="model requests a minute (0: no bound)"
        )
        p.add_argument(
            "--tpm", type=_non_negative, default=None, metavar="N", help="input + output tokens a minute (0: no bound)"
        )
        p.add_argument(
            "--streams",
            type=_non_negative,
            default=None,
            metavar="N",
            help="requests for model work at once, background ones included (0: no bound)",
        )
    for p in (create_p, list_p, revoke_p, set_p):
        p.add_argument("--data-dir", default=None, metavar="DIR", help="the data folder `serve` uses")
        p.add_argument(
            "--store",
            default=None,
            metavar="URL",
            help="postgresql://… that replicas share: its tokens, not the data folder's [env LMSP_STORE]",
        )

    run_add_parser(sub)

    models_p = sub.add_parser("models", help="list the running service's models, else those `serve` would offer")
    models_p.add_argument(
        "--model-dir", action="append", default=[], metavar="DIR", help="list what `serve --model-dir DIR` would offer"
    )
    models_p.add_argument(
        "--no-discover", action="store_true", help="leave out the Ollama, Hugging Face and LM Studio stores"
    )
    models_p.add_argument(
        "--url", default=None, help="the service (default: $LMSP_BASE_URL, else http://127.0.0.1:8750)"
    )
    models_p.add_argument("--token", default=None, help="bearer token (default: $LMSP_TOKEN)")
    models_p.set_defaults(func=_models)

    doctor_p = sub.add_parser("doctor", help="show the llama.cpp build, its devices and what serve would choose")
    doctor_p.add_argument("--model-dir", action="append", default=[], metavar="DIR")
    doctor_p.add_argument("--ctx-size", type=int, default=4096)
    doctor_p.set_defaults(func=_doctor)
    return parser


def _security_flags(serve_p: argparse.ArgumentParser) -> None:
    d = Limits()
    add = serve_p.add_argument
    add(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let pages from ORIGIN call the service (repeatable, or a comma-separated list)",
    )
    add("--max-body-bytes", type=int, default=4 * 1024 * 1024, metavar="N", help="request body size (413 beyond)")
    add("--max-input-items", type=int, default=d.input_items, metavar="N", help="input items per request")
    add("--max-input-chars", type=int, default=d.input_chars, metavar="N", help="characters in a request's input")
    add(
        "--max-output-tokens",
        type=int,
        default=d.max_output_tokens,
        metavar="N",
        help="the largest max_output_tokens accepted",
    )
    add("--max-tools", type=int, default=d.tools, metavar="N", help="tools per request")
    add("--max-stops", type=int, default=d.stops, metavar="N", help="stop sequences per request")
    add(
        "--max-stop-chars",
        type=int,
        default=d.stop_chars,
        metavar="N",
        help="characters in a request's stop sequences, all together",
    )
    add(
        "--max-embedding-inputs",
        type=int,
        default=d.embedding_inputs,
        metavar="N",
        help="inputs per embeddings request",
    )
    add(
        "--max-embedding-tokens",
        type=int,
        default=d.embedding_tokens,
        metavar="N",
        help="tokens in an embeddings request's inputs, all together",
    )
    add(
        "--max-schema-bytes",
        type=int,
        default=d.schema_bytes,
        metavar="N",
        help="size of a JSON schema (response_format, tool parameters)",
    )
    add("--max-schema-depth", type=int, default=d.schema_depth, metavar="N", help="nesting depth of such a schema")
    add("--max-json-depth", type=int, default=d.json_depth, metavar="N", help="nesting depth of any request body")
    add(
        "--max-streams",
        type=int,
        default=d.streams,
        metavar="N",
        help="open event streams, all clients together (429 beyond)",
    )
    add(
        "--max-streams-per-token",
        type=int,
        default=d.streams_per_token,
        metavar="N",
        help="open event streams per token",
    )
    add(
        "--max-replays-per-token",
        type=int,
        default=d.replays_per_token,
        metavar="N",
        help="open event streams per token that start more than 256 events back in their log (429 beyond)",
    )
    add(
        "--header-timeout",
        type=float,
        default=d.header_timeout,
        metavar="SECONDS",
        help="time to send a request's headers",
    )
    add(
        "--body-timeout",
        type=float,
        default=d.body_timeout,
        metavar="SECONDS",
        help="longest pause while sending a body (408 beyond)",
    )
    add(
        "--body-deadline",
        type=float,
        default=d.body_deadline,
        metavar="SECONDS",
        help="time to send a whole request body (408 beyond)",
    )
    add(
        "--max-stream-buffer",
        type=int,
        default=d.stream_buffer,
        metavar="BYTES",
        help="bytes a stream may hold for a reader beyond what its socket took (the writer waits beyond)",
    )
    add(
        "--stream-write-timeout",
        type=float,
        default=d.write_timeout,
        metavar="SECONDS",
        help="time a reader past --max-stream-buffer has to catch up before it is closed",
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
