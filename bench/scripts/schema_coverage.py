"""Which schemas of the committed JSONSchemaBench sample (bench/data/jsonschemabench) lmsp
accepts, without a server or a generation: each goes through what the service does before any
event (the size and depth limits, `relax`, the check's validator, the grammar compile with its
fallback for recursive `$ref`s) on the embedded model's vocabulary. Seconds, not the bench's
minutes: the refusals' side of `bench/suites/bench_schemas.py`.

    python bench/scripts/schema_coverage.py     # counts, then every refusal: set/id, reason"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from lmsp.engine.grammar import GrammarCompiler
from lmsp.engine.llama import LlamaModel
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.schema_check import relax
from lmsp.protocol.errors import ProblemError
from lmsp.security.limits import Limits, check_request
from lmsp.service.responses import _schema_grammar

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "jsonschemabench" / "sample.jsonl"


async def main() -> None:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    model = LlamaModel(embedded_model_path())
    compiler = GrammarCompiler.for_model(model)
    counts: Counter[str] = Counter()
    refused = []
    for row in rows:
        try:
            check_request(Limits(), [], None, None, [], row["schema"])
            relaxed = relax(row["schema"])
            relaxed.check()
            await _schema_grammar(compiler, relaxed)
            counts["accepted"] += 1
        except (ProblemError, ValueError) as exc:
            counts["refused"] += 1
            refused.append(f"{row['set']}/{row['id']}: {' '.join(str(exc).split())[:160]}")
    compiler.close()
    print(f"{counts['accepted']} of {len(rows)} accepted, {counts['refused']} refused")
    for line in refused:
        print(line)


if __name__ == "__main__":
    asyncio.run(main())
