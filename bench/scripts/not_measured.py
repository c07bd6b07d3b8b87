"""Says loudly which figures a benchmark run could not measure, and why: a skipped baseline
must not pass for a measured one. `python bench/scripts/not_measured.py [figures.json]`; exits 0 (a
figure is reported, not a failure), with a GitHub warning per figure when run in Actions."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))  # bench/lib: shared with the suites

from figures import NOT_MEASURED


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/figures.json")
    figures = json.loads(path.read_text(encoding="utf-8"))
    missing = {name: value for name, value in figures.items() if str(value).startswith(NOT_MEASURED)}
    if not missing:
        print(f"every figure in {path} was measured")
        return
    rule = "!" * 78
    lines = [rule, f"!! {len(missing)} benchmark figure(s) NOT MEASURED in this run:"]
    lines += [f"!!   {name}: {value}" for name, value in sorted(missing.items())]
    lines.append(rule)
    print("\n".join(lines), file=sys.stderr)
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for name, value in sorted(missing.items()):
            print(f"::warning title=benchmark not measured::{name}: {value}")


if __name__ == "__main__":
    main()
