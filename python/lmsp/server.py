"""Builds the service from its settings and serves it with granian (embedded, one process:
the models, their scheduler threads and the HTTP app share memory and one event loop)."""

from __future__ import annotations

import asyncio
import errno
import socket
from dataclasses import dataclass, field
from pathlib import Path

from granian.constants import Interfaces
from granian.log import LogLevels
from granian.server.embed import Server

from .engine.backends import Backend, ScriptedBackend
from .engine.registry import ModelEntry, discover
from .engine.scheduler import SchedulerConfig
from .http.app import DEFAULT_MAX_BODY, App
from .http.sse import KEEPALIVE_SECONDS
from .service.models import ModelManager
from .service.responses import ResponsesService

__all__ = ["ServeError", "Settings", "build_app", "check_port", "check_readable", "serve"]


class ServeError(Exception):
    """The service cannot start; the message says why, for a person."""


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8750
    model_dirs: list[Path] = field(default_factory=list)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    gpu_layers: int | None = None
    max_body: int = DEFAULT_MAX_BODY
    keepalive: float = KEEPALIVE_SECONDS
    # A scripted model next to the real ones: for protocol tests and benchmarks.
    scripted_model: str | None = None


def check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServeError(f"port {port} on {host} is already in use (is another lmsp running?)") from None
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def check_readable(entries: list[ModelEntry]) -> None:
    for entry in entries:
        try:
            with entry.path.open("rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ServeError(f"cannot read model file {entry.path}: {exc.strerror}") from None
        if magic != b"GGUF":
            raise ServeError(f"{entry.path} is not a GGUF file")


def build_app(settings: Settings) -> tuple[App, ModelManager]:
    entries = discover(settings.model_dirs)
    check_readable(entries)
    extra: dict[str, Backend] = {}
    if settings.scripted_model:
        extra[settings.scripted_model] = ScriptedBackend()
    if not entries and not extra:
        raise ServeError("no models: the embedded model is not installed and no --model-dir holds a .gguf")
    models = ModelManager(entries, settings.scheduler, extra=extra, gpu_layers=settings.gpu_layers)
    if entries:
        models.load(entries[0].id)  # the default model is ready before the first request
    return App(ResponsesService(models), models, max_body=settings.max_body, keepalive=settings.keepalive), models


def serve(settings: Settings) -> None:
    check_port(settings.host, settings.port)
    app, models = build_app(settings)
    print(f"lmsp listening on http://{settings.host}:{settings.port}/lmsp/v1", flush=True)
    for described in models.describe_all():
        print(f"  model {described['id']} ({described['backend']}, {described['device']})", flush=True)
    server = Server(
        app,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.RSGI,
        log_level=LogLevels.error,  # granian's start-up chatter would bury the lines above
    )
    try:
        asyncio.run(server.serve())
    finally:
        models.close()
