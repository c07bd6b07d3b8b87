"""What distinct JSON schemas cost a server in resident memory: a real `lmsp serve` on the
embedded model, sent N small json_schema requests in a row, each schema new (a property name
no earlier one had), a 4-token output. A script, not a benchmark:

    python bench/scripts/schema_memory.py [N] [-- SERVE_ARGS...]

It prints the server's VmRSS every 100 requests, the growth from the first request's RSS to
the last's, and what the prompt cache's memory tier holds then (`lmsp_prompt_cache_bytes`):
each request leaves its slot's KV state (prompt and output, 23 kB a token on the embedded
model) in that cache, up to `--cache-ram`, so `-- --cache-ram 0` shows what the rest keeps.
`LMSP_SCHEMA_PROMPT_WORDS` (default 0) pads the prompt, so that each state is worth saving
(32 tokens or more) and large.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from lmsp.testing import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from procstat import rss_kib

MODEL = "smollm2:135m-instruct-q4_1"


def schema(i: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {f"field_{i}": {"type": "integer"}, "name": {"type": "string", "maxLength": 20}},
        "required": [f"field_{i}"],
    }


def payload(i: int, words: int = 0) -> dict[str, Any]:
    text = " ".join(["Write the record as JSON."] + ["please"] * words)
    return {
        "model": MODEL,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema(i)}},
        "max_output_tokens": 4,
        "temperature": 0,
    }


def cache_ram_bytes(client: httpx.Client) -> int:
    found = re.search(r'^lmsp_prompt_cache_bytes\{[^}]*tier="ram"\} (\S+)$', client.get("/metrics").text, re.M)
    return int(float(found.group(1))) if found else 0


def main() -> None:
    args = sys.argv[1:]
    serve_args = args[args.index("--") + 1 :] if "--" in args else []
    n = int(args[0]) if args and args[0] != "--" else 1000
    words = int(os.environ.get("LMSP_SCHEMA_PROMPT_WORDS", "0"))
    with tempfile.TemporaryDirectory() as tmp:
        srv = start_server(Path(tmp), "--keep-alive", "-1", *serve_args)
        try:
            with httpx.Client(base_url=srv.url, timeout=120) as client:
                started = time.monotonic()
                first = 0
                for i in range(n):
                    r = client.post("/lmsp/v1/responses", json=payload(i, words))
                    r.raise_for_status()
                    if i == 0:
                        first = rss_kib(srv.proc.pid)
                        print(f"after 1: {first / 1024:.0f} MiB", flush=True)
                    if (i + 1) % 100 == 0:
                        now = rss_kib(srv.proc.pid)
                        print(f"after {i + 1}: {now / 1024:.0f} MiB (+{(now - first) / 1024:.0f})", flush=True)
                last = rss_kib(srv.proc.pid)
                seconds = time.monotonic() - started
                cached = cache_ram_bytes(client)
            print(
                f"{n} distinct schemas: RSS {first / 1024:.0f} -> {last / 1024:.0f} MiB, "
                f"+{(last - first) / 1024:.0f} MiB ({(last - first) / max(1, n - 1):.0f} KiB a schema), "
                f"{seconds:.0f} s; "
                f"the prompt cache holds {cached / 2**20:.0f} MiB of it"
            )
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
