"""The child process that compiles and renders chat templates (`python -m lmsp.engine.template_worker`).

A template comes inside a downloaded model file. Jinja's sandbox stops it from reaching
Python's internals (CVE-2024-34359 was a template that did), but not from running for ever
or filling memory: a loop over `range` in a loop, `9**9**9` (folded while compiling), a
`center(10**10)` filter run in C where no in-process deadline can interrupt them. So the
template runs here, in a process of its own with a memory cap, which the service kills when
it runs past its time budget.

One JSON object a line each way, never pickle: the service must not trust what comes back.
Started, it says `{"ready": true}` once its imports are done. Asked
`{"source", "bos_token", "eos_token", "variables"?}` it answers `{"text": …}` (or
`{"compiled": true}` when there are no variables), else `{"error": "…"}`.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import Any

import orjson
from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["MEMORY_LIMIT", "main"]

# Address space for the whole child (the interpreter and jinja2 take ~100 MiB of it).
MEMORY_LIMIT = 1024 * 1024 * 1024


class _RaisedByTemplate(Exception):
    """The template called raise_exception on purpose (e.g. roles out of order)."""


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, indent: int | None = None, separators: tuple[str, str] | None = None, sort_keys: bool = False
) -> str:
    """`tojson` as the templates' authors render them (Hugging Face's): keys in their order,
    no HTML escaping. Jinja's own sorts keys and writes `<` as `\u003c`, so a call in the
    prompt would not read as the model writes it, and the grammar's frame would not match."""
    return json.dumps(value, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env


def _answer(env: ImmutableSandboxedEnvironment, cache: dict[str, Template], request: dict[str, Any]) -> dict[str, Any]:
    try:
        source = request["source"]
        template = cache.get(source)
        if template is None:
            template = cache[source] = env.from_string(source)
        variables = request.get("variables")
        if variables is None:
            return {"compiled": True}
        text = template.render(
            **variables, add_generation_prompt=True, bos_token=request["bos_token"], eos_token=request["eos_token"]
        )
        return {"text": text}
    except _RaisedByTemplate as exc:
        return {"error": str(exc)}
    except TemplateError as exc:
        return {"error": f"chat template failed: {exc}"}
    # What else a hostile or broken template can raise: each is its failure, never ours.
    except (TypeError, ValueError, LookupError, ArithmeticError, AttributeError, RecursionError, MemoryError) as exc:
        return {"error": f"chat template failed: {type(exc).__name__}: {exc}"}


def _limit_memory() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except (ImportError, ValueError, OSError):  # not on this platform: the time budget still holds
        pass


def main() -> None:
    _limit_memory()
    env = _environment()
    cache: dict[str, Template] = {}
    sys.stdout.buffer.write(b'{"ready":true}\n')
    sys.stdout.buffer.flush()
    for line in sys.stdin.buffer:
        answer = _answer(env, cache, orjson.loads(line))
        sys.stdout.buffer.write(orjson.dumps(answer) + b"\n")
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
