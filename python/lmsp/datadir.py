"""Where the service keeps its state (the SQLite store; later tokens and settings).

`lmsp serve --data-dir DIR`, else `$LMSP_HOME`, else the platform's user data folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

__all__ = ["resolve_data_dir"]


def resolve_data_dir(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return explicit
    home = os.environ.get("LMSP_HOME")
    if home:
        return Path(home)
    return Path(platformdirs.user_data_dir("lmsp", appauthor=False))
