"""The models this service serves: discovery, lazy loading, and their §5 descriptions."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..engine.backends import Backend, LlamaBackend
from ..engine.registry import ModelEntry
from ..engine.scheduler import SchedulerConfig
from ..protocol.errors import ProblemError

__all__ = ["ModelManager"]

log = logging.getLogger(__name__)


class ModelManager:
    def __init__(
        self,
        entries: list[ModelEntry],
        config: SchedulerConfig,
        *,
        extra: dict[str, Backend] | None = None,
        gpu_layers: int | None = None,
        service_capabilities: tuple[str, ...] = (),
    ) -> None:
        self._entries = {e.id: e for e in entries}
        # What the service adds to every model, whatever its backend (e.g. `conversations`).
        self._service_capabilities = service_capabilities
        self._config = config
        self._gpu_layers = gpu_layers
        self._loaded: dict[str, Backend] = dict(extra or {})
        self._lock = threading.Lock()

    @property
    def ids(self) -> list[str]:
        return list(dict.fromkeys([*self._entries, *self._loaded]))

    def load(self, model_id: str) -> Backend:
        """Loads synchronously (call from a worker thread when on the event loop); a model
        whose backend has stopped (its scheduler crashed) is closed and loaded again."""
        with self._lock:
            backend = self._loaded.get(model_id)
            if backend is not None and not backend.alive and model_id in self._entries:
                log.warning("model %s stopped; loading it again", model_id)
                del self._loaded[model_id]
                backend.close()
                backend = None
            if backend is None:
                entry = self._entries[model_id]
                backend = LlamaBackend(entry.path, self._config, name=model_id, gpu_layers=self._gpu_layers)
                self._loaded[model_id] = backend
            return backend

    async def get(self, model_id: str) -> Backend:
        """The model's backend, loaded (or loaded again) if need be; 503 model_unavailable when
        it cannot be."""
        backend = self._loaded.get(model_id)
        if backend is not None and backend.alive:
            return backend
        if model_id not in self._entries:
            if backend is not None:  # a backend that came from outside: nothing to reload it from
                raise ProblemError("model_unavailable", f"model {model_id!r} has stopped")
            raise ProblemError("model_not_found", f"no model {model_id!r}; GET /lmsp/v1/models lists them", param="model")
        try:
            return await asyncio.to_thread(self.load, model_id)
        except Exception as exc:  # the file changed or vanished since discovery
            raise ProblemError("model_unavailable", f"model {model_id!r} could not be loaded: {exc}") from None

    def capabilities(self, backend: Backend | None) -> list[str]:
        own = backend.capabilities if backend else LlamaBackend.capabilities
        return list(dict.fromkeys([*own, *self._service_capabilities]))

    def describe(self, model_id: str) -> dict[str, Any] | None:
        backend = self._loaded.get(model_id)
        entry = self._entries.get(model_id)
        if backend is None and entry is None:
            return None
        return {
            "id": model_id,
            "object": "model",
            "capabilities": self.capabilities(backend),
            "context_window": backend.context_window if backend else self._config.ctx_per_sequence,
            "backend": "llama.cpp" if entry is not None else "scripted",
            "device": backend.device if backend else "cpu",
            "loaded": backend is not None,
        }

    def describe_all(self) -> list[dict[str, Any]]:
        return [d for i in self.ids if (d := self.describe(i)) is not None]

    def close(self, closer: Callable[[Backend], None] = lambda b: b.close()) -> None:
        with self._lock:
            for backend in self._loaded.values():
                closer(backend)
            self._loaded.clear()
