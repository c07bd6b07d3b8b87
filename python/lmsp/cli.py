"""`lmsp serve | models | doctor`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .engine.registry import discover
from .engine.scheduler import SchedulerConfig
from .server import ServeError, Settings, serve

__all__ = ["main"]


def _serve(args: argparse.Namespace) -> int:
    settings = Settings(
        host=args.host,
        port=args.port,
        model_dirs=[Path(d) for d in args.model_dir],
        scheduler=SchedulerConfig(
            n_parallel=args.parallel,
            ctx_per_sequence=args.ctx_size,
            n_threads=args.threads or os.cpu_count() or 1,
            max_queue=args.max_queue,
            prefill_chunk=args.prefill_chunk,
        ),
        gpu_layers=args.gpu_layers,
        scripted_model=args.scripted_model,
        keepalive=args.keepalive,
        data_dir=Path(args.data_dir) if args.data_dir else None,
        idempotency_ttl=args.idempotency_ttl,
        task_events_max=args.task_events_max,
        task_events_bytes=args.task_events_bytes,
        task_retention=args.task_retention,
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


def _models(args: argparse.Namespace) -> int:
    for entry in discover([Path(d) for d in args.model_dir]):
        print(f"{entry.id}\t{entry.path}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """What the installed llama.cpp build can do, and what `serve` would choose with it."""
    from .engine.backends import auto_parallel, device_of_build, memory_bytes
    from .engine.llama import LlamaModel, build_info

    info: dict[str, object] = {**build_info(), "device": device_of_build(), "cpu_threads": os.cpu_count()}
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
    sub = parser.add_subparsers(dest="command", required=True)

    serve_p = sub.add_parser("serve", help="serve the models over HTTP")
    serve_p.add_argument("--host", default="127.0.0.1")
    serve_p.add_argument("--port", type=int, default=8750)
    serve_p.add_argument("--model-dir", action="append", default=[], metavar="DIR", help="serve every *.gguf under DIR")
    serve_p.add_argument(
        "--parallel", type=int, default=0, help="sequences decoded together per model (default: from memory, at most 8)"
    )
    serve_p.add_argument("--ctx-size", type=int, default=4096, help="context window per sequence, in tokens")
    serve_p.add_argument("--threads", type=int, default=0, help="CPU threads for llama.cpp (default: all cores)")
    serve_p.add_argument("--max-queue", type=int, default=64, help="requests a model queues before answering 429")
    serve_p.add_argument(
        "--prefill-chunk", type=int, default=256, help="prompt tokens per step while other sequences generate"
    )
    serve_p.add_argument("--gpu-layers", type=int, default=None, help="layers to offload (default: all on a GPU build)")
    serve_p.add_argument(
        "--data-dir", default=None, metavar="DIR", help="where stored responses live (default: $LMSP_HOME, else the user data folder)"
    )
    serve_p.add_argument("--idempotency-ttl", type=float, default=24 * 3600.0, metavar="SECONDS", help=argparse.SUPPRESS)
    # Small rings and short retention make expiry testable in seconds.
    serve_p.add_argument("--task-events-max", type=int, default=65536, metavar="N", help=argparse.SUPPRESS)
    serve_p.add_argument("--task-events-bytes", type=int, default=16 * 1024 * 1024, metavar="N", help=argparse.SUPPRESS)
    serve_p.add_argument("--task-retention", type=float, default=300.0, metavar="SECONDS", help=argparse.SUPPRESS)
    serve_p.add_argument("--keepalive", type=float, default=15.0, metavar="SECONDS", help=argparse.SUPPRESS)
    serve_p.add_argument("--scripted-model", default=None, metavar="ID", help=argparse.SUPPRESS)
    serve_p.set_defaults(func=_serve)

    models_p = sub.add_parser("models", help="list the models `serve` would offer")
    models_p.add_argument("--model-dir", action="append", default=[], metavar="DIR")
    models_p.set_defaults(func=_models)

    doctor_p = sub.add_parser("doctor", help="show the llama.cpp build, its devices and what serve would choose")
    doctor_p.add_argument("--model-dir", action="append", default=[], metavar="DIR")
    doctor_p.add_argument("--ctx-size", type=int, default=4096)
    doctor_p.set_defaults(func=_doctor)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
