"""Issue 40's "3 models, 2 replicas" figure: how many times each replica loads each model under
a mixed load through nginx round-robin, with routing between the replicas off and on
(`--advertise-url`). Two real `lmsp serve` replicas on real Redis and PostgreSQL, `--max-loaded 2`
each, three copies of the embedded GGUF as three models; the same seeded sequence of requests
in both runs. A script, not part of `pytest bench` (run it under the slot):

    python bench/scripts/routing_loads.py                      # 90 requests, 4 at once
    python bench/scripts/routing_loads.py --requests 30 --concurrency 2

Target (issue 40): loads per model ≤ 1 per replica that serves it, with routing on.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import nginx_balancer, postgres_server, redis_server

MODELS = ["smol:m1-q4_1", "smol:m2-q4_1", "smol:m3-q4_1"]


def _metrics(server: RunningServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _sum(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics.items() if n == name and all((k, w) in ls for k, w in labels.items()))


def _one(client: httpx.Client, model: str, n: int) -> tuple[str, int, str]:
    payload: dict[str, Any] = {
        "model": model,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"Count to {n}."}]}],
        "max_output_tokens": 8,
        "temperature": 0,
    }
    response = client.post("/lmsp/v1/responses", json=payload)
    return model, response.status_code, response.headers.get("lmsp-served-by", "")


def run(routing: bool, args: argparse.Namespace, models: Path, redis_url: str, postgres_url: str) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="lmsp-routing-"))
    flags = [
        "--store", postgres_url, "--events", redis_url, "--model-dir", str(models),
        "--max-loaded", "2", "--min-residency", str(args.min_residency), "--parallel", "2", "--threads", "1",
    ]  # fmt: skip
    if routing:
        flags += ["--advertise-url", "http://127.0.0.1"]
    replicas: list[RunningServer] = []
    try:
        for name in ("a", "b"):
            (work / name).mkdir()
            replicas.append(start_server(work / name, *flags))
        rng = random.Random(args.seed)
        sequence = [rng.choice(MODELS) for _ in range(args.requests)]
        with (
            nginx_balancer([r.url for r in replicas]) as balancer,
            httpx.Client(base_url=balancer.url, timeout=300) as client,
        ):
            started = time.monotonic()
            with ThreadPoolExecutor(args.concurrency) as pool:
                results = list(pool.map(lambda mn: _one(client, mn[1], mn[0]), enumerate(sequence)))
            wall = time.monotonic() - started
        metrics = [_metrics(r) for r in replicas]
    finally:
        for r in replicas:
            r.stop()
        shutil.rmtree(work, ignore_errors=True)
    loads = {
        (replica, model): int(_sum(m, "lmsp_model_loads_total", model=model))
        for replica, m in zip("ab", metrics, strict=True)
        for model in MODELS
    }
    return {
        "routing": routing,
        "loads": loads,
        "statuses": Counter(status for _, status, _ in results),
        "forwarded": [int(_sum(m, "lmsp_forwarded_requests_total")) for m in metrics],
        "fallbacks": [int(_sum(m, "lmsp_forward_fallbacks_total")) for m in metrics],
        "wall": wall,
    }


def report(result: dict[str, Any]) -> None:
    loads = result["loads"]
    state = "on " if result["routing"] else "off"
    print(f"routing {state}: wall {result['wall']:.1f} s, statuses {dict(result['statuses'])}")
    print("  loads     " + "  ".join(f"{m:>13}" for m in MODELS) + "  total")
    for replica in "ab":
        row = [loads[(replica, m)] for m in MODELS]
        print(f"  replica {replica} " + "  ".join(f"{n:>13}" for n in row) + f"  {sum(row):>5}")
    worst = max(loads.values())
    print(f"  most loads of one model on one replica: {worst}; total {sum(loads.values())}")
    print(f"  forwarded (a, b): {result['forwarded']}, fallen back: {result['fallbacks']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=90)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--min-residency", type=float, default=2.0, help="each replica's --min-residency")
    args = parser.parse_args()
    source = embedded_model_path()
    assert source is not None, "the embedded model is not installed"
    models = Path(tempfile.mkdtemp(prefix="lmsp-routing-models-"))
    try:
        for model in MODELS:  # copies: hard links would be one model to discovery
            shutil.copyfile(source, models / f"{model.replace(':', '-')}.gguf")
        with redis_server() as redis_url, postgres_server() as postgres_url:
            for routing in (False, True):
                report(run(routing, args, models, redis_url, postgres_url))
    finally:
        shutil.rmtree(models, ignore_errors=True)


if __name__ == "__main__":
    main()
