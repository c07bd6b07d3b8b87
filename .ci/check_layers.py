#!/usr/bin/env python3
"""Checks that dependencies run one way: no module cycles inside a Rust crate, and in
`python/lmsp` no import from a lower layer to a higher one and no cycle between subpackages.

    python .ci/check_layers.py                 # both checks; exit 1 on any violation
    python .ci/check_layers.py --rust          # only the Rust crates
    python .ci/check_layers.py --python        # only python/lmsp
    python .ci/check_layers.py --runtime-only  # Python: ignore `if TYPE_CHECKING:` imports
    python .ci/check_layers.py --edges         # also list every dependency it found

Rust: each crate under `crates/*/src` is read from its `lib.rs`/`main.rs` down its `mod`
declarations (`#[path]` and inline `mod x { … }` included). Every `crate::`, `super::` and
`self::` path, in `use` trees and inline in code, is an edge to the module it names; a name
re-exported by a module (`pub use m::Name`) is followed to `m`. Edges between a module and its
own ancestor (a `tests` submodule's `use super::*`, a module using an item of `lib.rs`) are not
dependencies. A cycle is reported with one file:line for each of its edges.

Python: every `import` / `from … import` of `lmsp` (absolute or relative, at module level, in a
function, or under `if TYPE_CHECKING:`) is an edge. Each module belongs to the layer of the
longest key of LAYERS that prefixes its dotted name below `lmsp` (so a key such as
`security.tokens` can place one module apart from its package). An import whose target is in a
higher layer is a violation; a module matching no key is an "unassigned" warning (not a
failure). Cycles are looked for between units: top-level subpackages and modules, and for the
packages in SPLIT, their children (`faces.openai`, `faces.lmsp`, …).
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

# --- The Python layer table: edit here. -------------------------------------------------------
# Layers from lowest to highest; each names the modules below `lmsp` that live in it (a
# subpackage, a module, or a dotted path for one module apart from its package). A module may
# import from its own layer and from lower ones. Names not present today are harmless.
LAYERS: dict[str, list[str]] = {
    "core": ["_core"],  # the Rust extension
    # Leaves every layer may use: counters and traces, the wake-up pipe, paths and env flags.
    "base": ["observability", "wakeups", "datadir", "envargs"],
    "protocol": ["protocol"],
    "state": ["state", "store", "events", "tokens"],
    # Who is asking and what one request may ask for: knows tokens, not the service's plans.
    "policy": ["security"],
    "engine": ["engine"],
    "service": ["service"],
    "http": ["http"],
    "faces": ["faces"],
    "entry": [
        "server",
        "cli",
        "run",
        "client",
        "playground",
        "loadbar",
        "local_service",
        "testing",
        "testing_servers",
        "__main__",
    ],
}
# Packages whose children are separate units when looking for cycles (faces.openai ↔ faces.lmsp
# is a cycle; two modules of one unit importing each other is not looked at).
SPLIT: set[str] = {"faces", "state"}
# ----------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "lmsp"


@dataclass
class Edge:
    source: str
    target: str
    where: str  # path:line
    note: str = ""


@dataclass
class Report:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    edges: list[str] = field(default_factory=list)  # every dependency found, for --edges


# --- Cycles ----------------------------------------------------------------------------------


def strongly_connected(nodes: Iterable[str], succ: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; only components of two or more nodes (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(succ.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in succ.get(node, ()):
                    found.append(sorted(component))
    return found


def report_cycles(kind: str, edges: list[Edge], report: Report) -> None:
    succ: dict[str, set[str]] = defaultdict(set)
    nodes: set[str] = set()
    for e in edges:
        succ[e.source].add(e.target)
        nodes.update((e.source, e.target))
    for component in strongly_connected(nodes, succ):
        members = set(component)
        lines = [f"{kind} import cycle between {', '.join(component)}:"]
        seen: set[tuple[str, str]] = set()
        for e in sorted(edges, key=lambda e: (e.source, e.target, e.where)):
            if e.source in members and e.target in members and (e.source, e.target) not in seen:
                seen.add((e.source, e.target))
                lines.append(f"    {e.source} -> {e.target}  ({e.where}{e.note})")
        report.errors.append("\n".join(lines))


# --- Rust ------------------------------------------------------------------------------------

RAW_STRING = re.compile(r'b?r(#*)"')
CHAR_LITERAL = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'")


def strip_rust(text: str, keep_strings: bool) -> str:
    """The source with comments (and unless `keep_strings`, the inside of string and char
    literals) blanked out; line breaks are kept so that offsets still give line numbers."""
    out: list[str] = []
    i, n = 0, len(text)

    def blank(chunk: str) -> str:
        return "".join(c if c == "\n" else " " for c in chunk)

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append(blank(text[i:end]))
            i = end
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(blank(text[i:j]))
            i = j
        elif (m := RAW_STRING.match(text, i)) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + m.group(1)
            end = text.find(close, m.end())
            end = n if end < 0 else end + len(close)
            out.append(text[i:end] if keep_strings else m.group(0) + blank(text[m.end() : end - len(close)]) + close)
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(text[i:j] if keep_strings else '"' + blank(text[i + 1 : j - 1]) + '"')
            i = j
        elif c == "'" and (m := CHAR_LITERAL.match(text, i)):
            out.append(m.group(0) if keep_strings else "' '")
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


USE_TOKEN = re.compile(r"\s*(::|[{}(),*;]|[A-Za-z_][A-Za-z0-9_]*)")


def use_leaves(tree: str) -> list[tuple[list[str], str | None]]:
    """The paths a `use` tree names, each with its `as` alias (`self` leaves resolved)."""
    tokens = [m.group(1) for m in USE_TOKEN.finditer(tree)]
    pos = 0
    leaves: list[tuple[list[str], str | None]] = []

    def parse(prefix: list[str]) -> None:
        nonlocal pos
        path = list(prefix)
        while pos < len(tokens):
            tok = tokens[pos]
            if tok == "{":
                pos += 1
                while pos < len(tokens) and tokens[pos] != "}":
                    parse(path)
                    if pos < len(tokens) and tokens[pos] == ",":
                        pos += 1
                pos += 1
                return
            if tok == "*":
                pos += 1
                leaves.append((path + ["*"], None))
                return
            if tok == "::":
                pos += 1
                continue
            if tok in (",", "}", ";"):
                break
            pos += 1
            if tok == "self" and path:
                continue  # `m::{self, X}` names `m` itself
            path.append(tok)
        alias = None
        if pos + 1 < len(tokens) and tokens[pos] == "as":
            alias = tokens[pos + 1]
            pos += 2
        leaves.append((path, alias))

    parse([])
    return leaves


MOD_DECL = re.compile(r"((?:#\s*\[[^\]]*\]\s*)*)(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*([;{])")
PATH_ATTR = re.compile(r'#\s*\[\s*path\s*=\s*"([^"]+)"\s*\]')
USE_STMT = re.compile(r"(?<![A-Za-z0-9_])use\s+([^;]*);")
INLINE_PATH = re.compile(r"(?<![A-Za-z0-9_$:])(crate|super|self)((?:\s*::\s*[A-Za-z_][A-Za-z0-9_]*)+)")


@dataclass
class RustFile:
    path: Path
    module: tuple[str, ...]
    code: str  # comments and string contents blanked
    inline: list[tuple[int, int, tuple[str, ...]]] = field(default_factory=list)  # inline mods

    def module_at(self, offset: int) -> tuple[str, ...]:
        best = self.module
        for start, end, module in self.inline:
            if start <= offset < end and len(module) > len(best):
                best = module
        return best


def load_crate(src: Path) -> list[RustFile]:
    roots = [p for p in (src / "lib.rs", src / "main.rs") if p.exists()]
    files: list[RustFile] = []
    todo = [(root, ()) for root in roots]
    seen: set[Path] = set()
    while todo:
        path, module = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        raw = path.read_text(encoding="utf-8")
        with_strings = strip_rust(raw, keep_strings=True)
        code = strip_rust(raw, keep_strings=False)
        f = RustFile(path, module, code)
        files.append(f)
        mod_rs = path.name in ("lib.rs", "main.rs", "mod.rs")
        base = path.parent if mod_rs else path.parent / path.stem
        for m in MOD_DECL.finditer(with_strings):
            name = m.group(2)
            # Offsets agree between the two stripped texts: both keep every character's place.
            inner = f.module_at(m.start(2))
            child = (*inner, name)
            if m.group(3) == "{":
                f.inline.append((m.end(), matching_brace(code, m.end() - 1), child))
                continue
            attr = PATH_ATTR.search(m.group(1) or "")
            if attr:
                todo.append(((path.parent / attr.group(1)).resolve(), child))
            else:
                nested = base.joinpath(*inner[len(module) :])
                candidate = nested / f"{name}.rs"
                todo.append((candidate if candidate.exists() else nested / name / "mod.rs", child))
    return files


def matching_brace(code: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(code)):
        if code[i] == "{":
            depth += 1
        elif code[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return len(code)


def resolve_rust(segments: list[str], current: tuple[str, ...]) -> list[str] | None:
    """Absolute segments below the crate root, or None for a path outside the crate."""
    if not segments:
        return None
    head, rest = segments[0], segments[1:]
    if head == "crate":
        base: list[str] = []
    elif head == "self":
        base = list(current)
    elif head == "super":
        base = list(current[:-1])
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    else:
        return None
    return base + rest


def check_rust(report: Report) -> None:
    crates = sorted(p.parent for p in ROOT.glob("crates/*/src/lib.rs")) + sorted(
        p.parent for p in ROOT.glob("crates/*/src/main.rs") if not (p.parent / "lib.rs").exists()
    )
    for src in crates:
        check_crate(src, report)


def check_crate(src: Path, report: Report) -> None:
    crate = src.parent.name
    files = load_crate(src)
    modules = {f.module for f in files} | {m for f in files for _, _, m in f.inline}

    def children(module: tuple[str, ...]) -> set[str]:
        return {other[-1] for other in modules if other and other[:-1] == module}

    refs: list[tuple[RustFile, int, list[str], tuple[str, ...]]] = []
    reexports: dict[tuple[str, ...], dict[str, list[str]]] = defaultdict(dict)
    for f in files:
        use_spans = []
        for m in USE_STMT.finditer(f.code):
            use_spans.append((m.start(), m.end()))
            current = f.module_at(m.start())
            is_pub = re.search(r"pub(?:\s*\([^)]*\))?\s*$", f.code[max(0, m.start() - 20) : m.start()])
            for leaf, alias in use_leaves(m.group(1)):
                refs.append((f, m.start(), leaf, current))
                target = resolve_rust(leaf, current) if leaf[0] in ("crate", "self", "super") else None
                if target is None and leaf[0] in children(current):
                    target = [*current, *leaf]  # `pub use child::Name` (2018 paths)
                if is_pub and target and target[-1] != "*":
                    reexports[current][alias or target[-1]] = target
        for m in INLINE_PATH.finditer(f.code):
            if any(a <= m.start() < b for a, b in use_spans):
                continue
            segments = [m.group(1), *re.findall(r"[A-Za-z_][A-Za-z0-9_]*", m.group(2))]
            refs.append((f, m.start(), segments, f.module_at(m.start())))

    def target_module(absolute: list[str], depth: int = 0) -> tuple[str, ...]:
        for cut in range(len(absolute), -1, -1):
            prefix = tuple(absolute[:cut])
            if prefix in modules:
                name = absolute[cut] if cut < len(absolute) else None
                again = reexports.get(prefix, {}).get(name) if name else None
                if again and depth < 8:
                    return target_module(again + absolute[cut + 1 :], depth + 1)
                return prefix
        return ()

    edges: list[Edge] = []
    for f, offset, segments, current in refs:
        absolute = resolve_rust(segments, current)
        if absolute is None:
            if segments[0] not in children(current):
                continue
            absolute = [*current, *segments]
        target = target_module([s for s in absolute if s != "*"])
        source = current
        if source[: len(target)] == target or target[: len(source)] == source:
            continue  # a module and its own ancestor
        edges.append(
            Edge(
                "::".join(source),
                "::".join(target),
                f"{f.path.relative_to(ROOT)}:{line_of(f.code, offset)}",
            )
        )
    report.edges += [f"rust ({crate}): {e.source} -> {e.target}  ({e.where})" for e in edges]
    report_cycles(f"rust ({crate})", edges, report)


# --- Python ----------------------------------------------------------------------------------

LAYER_OF: dict[str, tuple[int, str]] = {
    key: (rank, layer) for rank, (layer, keys) in enumerate(LAYERS.items()) for key in keys
}


def layer_of(module: str) -> tuple[int, str] | None:
    """`module` is dotted, below `lmsp` ("" is the package itself)."""
    parts = module.split(".") if module else []
    for cut in range(len(parts), 0, -1):
        key = ".".join(parts[:cut])
        if key in LAYER_OF:
            return LAYER_OF[key]
    return None


def unit_of(module: str) -> str:
    parts = module.split(".") if module else []
    if not parts:
        return "lmsp (package root)"
    if parts[0] in SPLIT and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def python_modules(base: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in sorted(base.rglob("*")):
        if path.suffix not in (".py", ".pyi", ".so", ".pyd") or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(base).with_suffix("")
        parts = list(rel.parts)
        parts[-1] = parts[-1].split(".")[0]  # _core.cpython-311-x86_64-linux-gnu
        if parts[-1] == "__init__":
            parts = parts[:-1]
        name = ".".join(parts)
        if path.suffix == ".py" or name not in found:
            found[name] = path
    return found


def imports(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import node with how it runs: "", " (lazy)" or " (type-only)"."""

    def walk(node: ast.AST, note: str) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, note
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, note or " (lazy)")
            elif isinstance(child, ast.If) and is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), " (type-only)")
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), note)
            else:
                yield from walk(child, note)

    return walk(tree, "")


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def check_python(report: Report, runtime_only: bool) -> None:
    base = ROOT / "python" / PACKAGE
    modules = python_modules(base)
    edges: list[Edge] = []
    for name, path in modules.items():
        if path.suffix != ".py":
            continue
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node, note in imports(tree):
            if runtime_only and note == " (type-only)":
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                        targets.append(alias.name[len(PACKAGE) + 1 :])
            else:
                if node.level:
                    parts = package.split(".") if package else []
                    up = node.level - 1
                    if up > len(parts):
                        continue
                    parts = parts[: len(parts) - up]
                    origin = ".".join(parts + (node.module.split(".") if node.module else []))
                elif node.module == PACKAGE or (node.module or "").startswith(PACKAGE + "."):
                    origin = node.module[len(PACKAGE) + 1 :] if node.module else ""
                else:
                    continue
                for alias in node.names:
                    sub = f"{origin}.{alias.name}" if origin else alias.name
                    targets.append(sub if sub in modules else origin)
            for target in targets:
                edges.append(Edge(name, target, f"{path.relative_to(ROOT)}:{node.lineno}", note))

    report.edges += [f"python: {e.source or PACKAGE} -> {e.target or PACKAGE}  ({e.where}{e.note})" for e in edges]
    unassigned: dict[str, list[str]] = defaultdict(list)
    for module in modules:
        if layer_of(module) is None:
            unassigned[unit_of(module)].append(module or PACKAGE)
    for e in edges:
        if layer_of(e.target) is None:
            unassigned[unit_of(e.target)].append(f"imported at {e.where}")
    for unit in sorted(unassigned):
        report.warnings.append(f"python: {unit} is in no layer (edit LAYERS in {Path(__file__).name})")

    seen: set[tuple[str, str, str]] = set()
    for e in sorted(edges, key=lambda e: e.where):
        source, target = layer_of(e.source), layer_of(e.target)
        if source is None or target is None or unit_of(e.source) == unit_of(e.target):
            continue
        if target[0] > source[0] and (e.source, e.target, e.note) not in seen:
            seen.add((e.source, e.target, e.note))
            report.errors.append(
                f"python: upward import {e.where}{e.note}: {e.source or PACKAGE} ({source[1]})"
                f" imports {e.target or PACKAGE} ({target[1]})"
            )

    unit_edges = [
        Edge(unit_of(e.source), unit_of(e.target), e.where, e.note)
        for e in edges
        if unit_of(e.source) != unit_of(e.target)
    ]
    report_cycles("python", unit_edges, report)


def main() -> int:
    global ROOT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rust", action="store_true", help="only the Rust crates")
    parser.add_argument("--python", action="store_true", help="only python/lmsp")
    parser.add_argument("--runtime-only", action="store_true", help="ignore `if TYPE_CHECKING:` imports")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this script's)")
    parser.add_argument("--edges", action="store_true", help="also print every dependency found")
    args = parser.parse_args()
    ROOT = args.root.resolve()
    both = not (args.rust or args.python)
    report = Report()
    if both or args.rust:
        check_rust(report)
    if both or args.python:
        check_python(report, args.runtime_only)
    if args.edges:
        print("\n".join(dict.fromkeys(report.edges)))
    for warning in report.warnings:
        print(f"warning: {warning}")
    for error in report.errors:
        print(f"error: {error}")
    print(f"check_layers: {len(report.errors)} violation(s), {len(report.warnings)} warning(s)")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
