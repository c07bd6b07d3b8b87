"""`lmsp serve`'s progress bar for the models it loads before it serves."""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["LoadBar"]


class LoadBar:
    """Redrawn in place on a terminal; elsewhere (a log file, a pipe) it draws nothing, and
    the log's lines say when each load starts and ends. Called on the loading thread."""

    WIDTH = 30

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stderr
        self._tty = self._stream.isatty()
        self._drawn: tuple[str, int] | None = None

    def __call__(self, model_id: str, fraction: float) -> None:
        if not self._tty:
            return
        filled = int(max(0.0, min(1.0, fraction)) * self.WIDTH)
        if self._drawn == (model_id, filled):
            return
        self._drawn = (model_id, filled)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self._stream.write(
            f"\r  loading {model_id} [{bar}] {int(fraction * 100):3d}%" + ("\n" if filled == self.WIDTH else "")
        )
        self._stream.flush()
