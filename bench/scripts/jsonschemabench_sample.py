"""Draws the fixed sample of real-world schemas the structured-output bench runs on
(bench/suites/bench_schemas.py) from a checkout of JSONSchemaBench
(github.com/guidance-ai/jsonschemabench), and writes it into the repository, so that no bench
reads the network:

    python bench/scripts/jsonschemabench_sample.py PATH/TO/jsonschemabench [SOURCE_COMMIT]

The same checkout gives the same sample: per set, `PER_SET` file names drawn with a fixed seed
from the sorted names of the files that parse as JSON objects. The quick bench's (`"quick": true`)
are the `QUICK_PER_SET` smallest of each set's draw: the quickest to answer, often within its
small budget, so that a quick run sees finished values, not only cut ones."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

PER_SET = 30
QUICK_PER_SET = 1
SEED = 39  # the number: any fixed value would do
OUT = Path(__file__).resolve().parents[1] / "data" / "jsonschemabench" / "sample.jsonl"


def _schemas(folder: Path) -> list[tuple[str, dict]]:
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            schema = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(schema, dict):
            found.append((path.stem, schema))
    return found


def main(root: Path) -> None:
    lines = []
    for folder in sorted(p for p in (root / "data").iterdir() if p.is_dir()):
        schemas = _schemas(folder)
        drawn = random.Random(f"{SEED}:{folder.name}").sample(schemas, min(PER_SET, len(schemas)))
        sizes = sorted((len(json.dumps(schema)), name) for name, schema in drawn)
        quick = {name for _, name in sizes[:QUICK_PER_SET]}
        for name, schema in drawn:
            row = {"set": folder.name, "id": name, "quick": name in quick, "schema": schema}
            lines.append(json.dumps(row, sort_keys=False, separators=(",", ":")))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} schemas written to {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
