"""The structured-output pipeline measured on the official JSON Schema Test Suite (draft
2020-12, tests/fixtures/json-schema-test-suite), with no model: what a schema a client sends
comes to, instance by instance.

For each of the suite's schemas the service's own steps run as a request runs them
(`engine.schema_check.relax`, the grammar compiled by `service.responses._schema_grammar` on a
vocabulary of one token a byte, and the check against the schema as given). Then either the
schema is refused up front, or each instance is tried:

- *sound*: an instance the suite marks invalid is rejected, by the grammar (it cannot consume the
  instance's JSON) or by the check;
- *complete*: an instance the suite marks valid is accepted: the grammar consumes its JSON as the
  service writes JSON (`", "` and `": "`, integral numbers without a fraction, an object's keys in
  whichever order the grammar takes them) and the check passes. A valid instance refused only
  because of the service's narrowing (it is accepted with narrowing off) is *narrowed*, a
  documented narrowing, not a miss.

The same is measured for llguidance alone: the schema as given compiled straight away, no
relaxing, no narrowing, no check. `table()` is the structured-output guide's table
(docs/hooks/reference.py); tests/unit/engine/test_schema_suite.py holds the figures to their
targets.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from lmsp._core import GrammarError, GrammarProbe, Vocabulary
from lmsp.engine.grammar import GrammarCompiler
from lmsp.engine.schema_check import OutputCheck, relax, schema_text
from lmsp.protocol.errors import ProblemError
from lmsp.service.responses import _schema_grammar

SUITE = Path(__file__).resolve().parents[1] / "fixtures" / "json-schema-test-suite"
# One token a byte: any JSON can be spelled, so what the grammar refuses is the grammar's.
BYTES = Vocabulary([bytes([b]) for b in range(256)] + ["<eos>"], [256])


@dataclass
class Tally:
    """One keyword's (one suite file's) figures, for one pipeline."""

    schemas: int = 0
    refused: int = 0
    invalid: int = 0  # invalid instances among the schemas served
    rejected: int = 0  # of those, rejected
    valid: int = 0  # valid instances among the schemas served
    accepted: int = 0  # of those, accepted
    narrowed: int = 0  # of those, refused only by the narrowing
    misses: list[str] = field(default_factory=list)  # "file: group / test (what went wrong)"

    def add(self, other: Tally) -> None:
        for name in ("schemas", "refused", "invalid", "rejected", "valid", "accepted", "narrowed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.misses += other.misses

    @property
    def sound(self) -> float:
        return self.rejected / self.invalid if self.invalid else 1.0

    @property
    def complete(self) -> float:
        counted = self.valid - self.narrowed
        return self.accepted / counted if counted else 1.0


@dataclass(frozen=True)
class Group:
    keyword: str  # the suite file it is from, e.g. "dependentRequired"
    description: str
    schema: Any
    tests: tuple[tuple[str, Any, bool], ...]  # (description, instance, valid)


def groups() -> Iterator[Group]:
    for path in sorted(SUITE.glob("*.json")):
        for group in json.loads(path.read_text()):
            tests = tuple((t["description"], t["data"], t["valid"]) for t in group["tests"])
            yield Group(path.stem, group["description"], group["schema"], tests)


# --- what a grammar consumes -------------------------------------------------------------------


def _scalar(value: Any) -> bytes:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**63:
        value = int(value)  # the value an integer grammar writes for it: 1.0 is 1
    try:
        return json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: only an escape spells it
        return json.dumps(value).encode()


def consume(probe: GrammarProbe, value: Any) -> GrammarProbe | None:
    """`probe` advanced past `value` written as the service writes JSON, an object's keys in
    an order the grammar takes (searched, with backtracking: the suite's objects are small);
    None when it takes it in no order."""
    if isinstance(value, dict):
        at = probe.fork()
        if not at.feed(b"{"):
            return None
        return _members(at, list(value.items()), first=True)
    if isinstance(value, list):
        at = probe.fork()
        if not at.feed(b"["):
            return None
        for i, item in enumerate(value):
            after = consume(at, item) if i == 0 or at.feed(b", ") else None
            if after is None:
                return None
            at = after
        return at if at.feed(b"]") else None
    at = probe.fork()
    return at if at.feed(_scalar(value)) else None


def _members(at: GrammarProbe, left: list[tuple[str, Any]], *, first: bool) -> GrammarProbe | None:
    if not left:
        end = at.fork()
        return end if end.feed(b"}") else None
    for i, (key, item) in enumerate(left):
        trial = at.fork()
        if not trial.feed((b"" if first else b", ") + _scalar(key) + b": "):
            continue
        after = consume(trial, item)
        done = _members(after, left[:i] + left[i + 1 :], first=False) if after is not None else None
        if done is not None:
            return done
    return None


def grammar_accepts(probe: GrammarProbe, value: Any) -> bool:
    after = consume(probe, value)
    return after is not None and after.accepting()


# --- the pipelines -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    probe: GrammarProbe | None  # None: refused
    check: OutputCheck | None
    refusal: str = ""

    def accepts(self, value: Any) -> bool:
        if self.probe is None or not grammar_accepts(self.probe, value):
            return False
        return self.check is None or self.check.error(schema_text(value)) is None


def service(schema: Any, *, narrowing: bool = True) -> Served:
    """The service's steps for a response format's schema (service/responses.py `_start`)."""
    try:
        relaxed = relax(schema, narrowing=narrowing)
        check = relaxed.check()
        _, compiled = asyncio.run(_schema_grammar(_compiler(), relaxed))
    except (ProblemError, ValueError, GrammarError) as exc:
        return Served(None, None, str(exc))
    return Served(compiled._probe(), check)


def llguidance_alone(schema: Any) -> Served:
    try:
        compiled = BYTES.compile_json_schema(schema_text(schema))
    except GrammarError as exc:
        return Served(None, None, str(exc))
    return Served(compiled._probe(), None)


@cache
def _compiler() -> GrammarCompiler:
    return GrammarCompiler(BYTES, budget_s=10.0)  # a slow machine's compile is not a refusal here


def measure_service(group: Group) -> Tally:
    tally = Tally(schemas=1)
    served = service(group.schema)
    if served.probe is None:
        tally.refused = 1
        tally.misses.append(f"{group.keyword}: {group.description} (refused: {served.refusal})")
        return tally
    wide: Served | None = None
    for description, value, valid in group.tests:
        accepted = served.accepts(value)
        where = f"{group.keyword}: {group.description} / {description}"
        if not valid:
            tally.invalid += 1
            tally.rejected += not accepted
            if accepted:
                tally.misses.append(f"{where} (an invalid instance accepted)")
            continue
        tally.valid += 1
        if accepted:
            tally.accepted += 1
            continue
        wide = wide or service(group.schema, narrowing=False)
        if wide.accepts(value):
            tally.narrowed += 1
        else:
            tally.misses.append(f"{where} (a valid instance refused)")
    return tally


def measure_alone(group: Group) -> Tally:
    tally = Tally(schemas=1)
    served = llguidance_alone(group.schema)
    if served.probe is None:
        tally.refused = 1
        return tally
    for _, value, valid in group.tests:
        accepted = served.accepts(value)
        if valid:
            tally.valid += 1
            tally.accepted += accepted
        else:
            tally.invalid += 1
            tally.rejected += not accepted
    return tally


@cache
def results() -> tuple[dict[str, Tally], dict[str, Tally]]:
    """Per keyword: the service's tally and llguidance's alone."""
    ours: dict[str, Tally] = {}
    alone: dict[str, Tally] = {}
    for group in groups():
        ours.setdefault(group.keyword, Tally()).add(measure_service(group))
        alone.setdefault(group.keyword, Tally()).add(measure_alone(group))
    return ours, alone


def totals(per_keyword: dict[str, Tally]) -> Tally:
    total = Tally()
    for tally in per_keyword.values():
        total.add(tally)
    return total


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def table() -> str:
    """The guide's table: per keyword, the service's figures beside llguidance's alone."""
    ours, alone = results()
    rows = [
        "| keyword (suite file) | schemas | refused: lmsp / llguidance | sound: lmsp / llguidance "
        "| complete: lmsp / llguidance | narrowed |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for keyword in sorted(ours, key=str.lower):
        a, b = ours[keyword], alone[keyword]
        rows.append(
            f"| `{keyword}` | {a.schemas} | {a.refused} / {b.refused} | {_pct(a.sound)} / {_pct(b.sound)} "
            f"| {_pct(a.complete)} / {_pct(b.complete)} | {a.narrowed} |"
        )
    a, b = totals(ours), totals(alone)
    rows.append(
        f"| **all** | {a.schemas} | {a.refused} / {b.refused} | {_pct(a.sound)} / {_pct(b.sound)} "
        f"| {_pct(a.complete)} / {_pct(b.complete)} | {a.narrowed} |"
    )
    return "\n".join(rows) + (
        f"\n\n{a.invalid + a.valid} instances of the schemas lmsp serves: {a.rejected} of {a.invalid} invalid "
        f"ones rejected, {a.accepted} of {a.valid - a.narrowed} valid ones accepted, {a.narrowed} valid ones "
        "outside the narrowing.\n"
    )


if __name__ == "__main__":
    print(table())
    for miss in totals(results()[0]).misses:
        print("-", miss)
