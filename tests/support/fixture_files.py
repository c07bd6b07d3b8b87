"""Files the tests read, committed under tests/fixtures/: nothing is downloaded at test time.

- `corpus/json_schemas.json`: JSON Schemas for the constrained-decoding tests.
- `templates/<name>.jinja`: published chat templates of models that render tools themselves, as
  llama.cpp ships them under `models/templates/` (see `templates/README.md` for the version and
  `templates/LICENSE` for the licence).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FIXTURES", "json_schema_corpus", "real_template"]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def json_schema_corpus() -> list[dict[str, Any]]:
    """The schemas of `corpus/json_schemas.json`, in order."""
    return json.loads((FIXTURES / "corpus" / "json_schemas.json").read_text(encoding="utf-8"))


def real_template(name: str) -> str:
    """The text of llama.cpp's `models/templates/<name>.jinja`."""
    return (FIXTURES / "templates" / f"{name}.jinja").read_text(encoding="utf-8")
