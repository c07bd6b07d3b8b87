"""The reference pages' tables, made from the code when the site is built, so they cannot drift.

A page asks for a table with a marker on a line of its own, `<!-- generated: NAME -->`; this
mkdocs hook (mkdocs.yml `hooks:`) replaces the marker with `GENERATORS[NAME]()`. The tables come
from the same objects the service runs on: the argparse parsers of `lmsp.cli` (what
`lmsp serve --help` prints), `lmsp.protocol.errors.CODES`, `lmsp.protocol.events.EVENT_DATA`
and the OpenAPI document a real `lmsp serve` answers. tests/unit/test_docs_reference.py checks
these tables against `lmsp serve --help` and the registries.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


# --- the command line -------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    from lmsp.cli import _parser as cli_parser

    return cli_parser()


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def commands() -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(`serve`, its parser, its one-line help), then `token create`…, in the order of `lmsp --help`."""
    top = _parser()
    helps = _sub_helps(top)
    for name, sub in _subparsers(top).items():
        nested = _subparsers(sub)
        if nested:
            nested_helps = _sub_helps(sub)
            for leaf, leaf_parser in nested.items():
                yield f"{name} {leaf}", leaf_parser, nested_helps.get(leaf, "")
        else:
            yield name, sub, helps.get(name, "")


def _sub_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def env_vars(parser: argparse.ArgumentParser) -> dict[argparse.Action, str]:
    """The variable each option is also read from (lmsp.envargs.EnvArgumentParser)."""
    return {action: var for action, var, _sep, _default in getattr(parser, "_from_env", [])}


_ENV_SUFFIX = re.compile(r"\s*\[env [A-Z0-9_]+\]$")


def _help(action: argparse.Action, env: str | None) -> str:
    """The help text; without the `[env VAR]` the parser added when the table has a column for it."""
    if action.help is argparse.SUPPRESS:
        return ""
    return _ENV_SUFFIX.sub("", action.help or "") if env else action.help or ""


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off"
    if action.default is None or action.default == [] or action.default is argparse.SUPPRESS:
        return "—"
    return f"`{action.default}`"


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if action.choices:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    return f"{names} `{metavar}`" if action.option_strings else f"`{metavar}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("*", "\\*").replace("\n", " ")


def options(parser: argparse.ArgumentParser, *, hidden: bool) -> list[argparse.Action]:
    """The parser's arguments but -h; `hidden`: only those `--help` leaves out, else only those it shows."""
    chosen = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if (action.help is argparse.SUPPRESS) == hidden:
            chosen.append(action)
    return chosen


def option_table(parser: argparse.ArgumentParser, *, hidden: bool = False) -> str:
    env = env_vars(parser)
    with_env = bool(env)
    head = "| option | default | environment | what |\n| --- | --- | --- | --- |"
    if not with_env:
        head = "| option | default | what |\n| --- | --- | --- |"
    rows = [head]
    for action in options(parser, hidden=hidden):
        var = env.get(action)
        cells = [_flag(action), _default(action) if action.option_strings else "(required)"]
        if with_env:
            cells.append(f"`{var}`" if var else "—")
        cells.append(_cell(_help(action, var)) or "—")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def cli_page() -> str:
    parts = []
    for name, parser, summary in commands():
        parts.append(f"## `lmsp {name}`\n")
        if summary:
            parts.append(summary[0].upper() + summary[1:] + ".\n")
        parts.append(f"```text\n{parser.format_usage().strip()}\n```\n")
        if options(parser, hidden=False):
            parts.append(option_table(parser) + "\n")
        if options(parser, hidden=True):
            parts.append(
                "Not shown by `--help` (for tests and tuning; they may change without notice):\n\n"
                + option_table(parser, hidden=True)
                + "\n"
            )
    return "\n".join(parts)


def serve_parser() -> argparse.ArgumentParser:
    return dict((name, parser) for name, parser, _ in commands())["serve"]


def settings_page() -> str:
    return option_table(serve_parser())


def environment_page() -> str:
    parser = serve_parser()
    env = env_vars(parser)
    rows = ["| variable | same as | default |\n| --- | --- | --- |"]
    for action in options(parser, hidden=False):
        if action in env:
            rows.append(f"| `{env[action]}` | `{action.option_strings[0]}` | {_default(action)} |")
    return "\n".join(rows)


# --- errors and events ------------------------------------------------------------------------


def errors_page() -> str:
    from lmsp.client.errors import ERRORS
    from lmsp.protocol.errors import CODES

    rows = ["| status | code | title | `lmsp.Client` raises |\n| --- | --- | --- | --- |"]
    for code, (status, title) in sorted(CODES.items(), key=lambda kv: (kv[1][0], kv[0])):
        cls = ERRORS[code].__name__ if code in ERRORS else "—"
        rows.append(f"| {status} | `{code}` | {title} | `{cls}` |")
    return "\n".join(rows)


def _type(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if kind == "literal":
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["expected"])
    if kind == "nullable":
        return _type(schema["schema"]) + " or `null`"
    if schema.get("ref"):
        return str(schema["ref"]).removeprefix("lmsp.")
    if kind == "definition-ref":
        return str(schema["schema_ref"]).removeprefix("lmsp.")
    if kind in ("union", "tagged-union"):
        choices = schema["choices"]
        values = choices.values() if isinstance(choices, dict) else choices
        return " or ".join(_type(c[0] if isinstance(c, tuple) else c) for c in values)
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(str(kind), str(kind))


def events_page() -> str:
    from lmsp.protocol.events import EVENT_DATA, FINAL_EVENTS

    rows = ["| event | `data` fields | ends the stream |\n| --- | --- | --- |"]
    for name, schema in EVENT_DATA.items():
        fields = ", ".join(f"`{key}` ({_type(f['schema'])})" for key, f in schema["fields"].items())
        rows.append(f"| `{name}` | {fields} | {'yes' if name in FINAL_EVENTS else ''} |")
    return "\n".join(rows)


# --- the OpenAPI document ---------------------------------------------------------------------


@cache
def openapi_document() -> dict[str, Any]:
    """What `GET /lmsp/v1/openapi.json` answers on a real `lmsp serve`: every face mounted
    adds its paths, so only the running service knows the whole document."""
    import httpx

    from lmsp.testing import start_server

    with tempfile.TemporaryDirectory(prefix="lmsp-docs-") as tmp:
        server = start_server(Path(tmp), "--no-discover", "--no-access-log")
        try:
            document: dict[str, Any] = httpx.get(f"{server.url}/lmsp/v1/openapi.json", timeout=30).json()
        finally:
            server.stop()
    return document


def openapi_page() -> str:
    document = openapi_document()
    rows = ["| method | path | operation | what |\n| --- | --- | --- | --- |"]
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            what = op.get("summary") or op.get("description") or ""
            what = _cell(what.split("\n")[0])
            rows.append(f"| `{method.upper()}` | `{path}` | `{op.get('operationId', '')}` | {what} |")
    body = json.dumps(document, indent=2, ensure_ascii=False)
    return (
        "\n".join(rows)
        + f"\n\nThe whole document (OpenAPI {document['openapi']}, {len(document['paths'])} paths, "
        + f"{len(document.get('components', {}).get('schemas', {}))} schemas); "
        + "[download it as `openapi.json`](openapi.json).\n\n"
        + '??? abstract "openapi.json"\n\n'
        + "\n".join("    " + line if line else "" for line in f"```json\n{body}\n```".splitlines())
        + "\n"
    )


def schema_suite_page() -> str:
    """The structured-output pipeline on the JSON Schema Test Suite (tests/support/schema_suite.py)."""
    import sys

    support = str(Path(__file__).resolve().parents[2] / "tests" / "support")
    if support not in sys.path:
        sys.path.insert(0, support)
    import schema_suite

    return schema_suite.table()


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_page,
    "serve-options": settings_page,
    "environment": environment_page,
    "errors": errors_page,
    "events": events_page,
    "openapi": openapi_page,
    "schema-suite": schema_suite_page,
}


def render(markdown: str) -> str:
    """`markdown` with every marker replaced by its table; an unknown name is an error."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise ValueError(f"<!-- generated: {name} -->: no such generator ({', '.join(GENERATORS)})")
        return GENERATORS[name]()

    return MARKER.sub(one, markdown)


# --- the mkdocs hook --------------------------------------------------------------------------


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return render(markdown)


def on_files(files: Any, config: Any) -> Any:
    """The OpenAPI document as a file beside its page (`reference/openapi.json`), for tools to fetch."""
    from mkdocs.structure.files import File

    content = json.dumps(openapi_document(), indent=2, ensure_ascii=False) + "\n"
    files.append(File.generated(config, "reference/openapi.json", content=content))
    return files
