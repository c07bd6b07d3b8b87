"""The benchmark run as a reviewer reads it: `bench/results/report.md`, a table of every figure
beside the previous run's (ratio, and ▲/▼ where it moved more than its measured noise), and
`bench/results/sweep.png`, events/s and tokens/s against concurrent streams.

    python bench/scripts/report.py [figures.json]   # previous run: $LMSP_BENCH_PREVIOUS, else
                                            # previous.json beside figures.json

Prints the table. A regression is shown, never a failure: exits 0 whatever moved."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))  # bench/lib: shared with the suites

from figures import NOISE, NOT_MEASURED

__all__ = ["TARGETS", "better", "moved", "render_table", "render_targets"]

FACES = {"lmsp": "/lmsp/v1/responses", "openai": "/v1/responses (OpenAI)"}
KINDS = {"post": "POST streams", "task": "task readers"}
SERVERS = {"lmsp": "lmsp --parallel 8", "llama_server_np8": "llama-server -np 8"}
_STREAMS = re.compile(r"\.streams_(\d+)\.")
# Costs, times and sizes: lower is better. Counts of what was measured, and what the bench's
# own client took: neither.
_LOWER = re.compile(
    r"(_us|_ms|_kib|\.us|ns_per_event|_per_event|_p99_ratio|_mean_ratio|ttft.*|host_share|wall_ratio|time_ratio"
    r"|_p50_s|\.invalid|\.refused|\.error)$"
)
_COUNT = re.compile(
    r"(readers|tokens|tokens_measured|client_cpu_cores|cache_hits|cache_misses|\.sample|\.uncheckable)$"
)


# Figures an issue set a bound for: (figure, its bound, what it says); the bound is the most a
# figure may be where lower is better (`better`), the least where higher is. Shown above the
# table with whether this run met it; a missed target is a prompt to look, never a failure.
TARGETS = (
    (
        "drafts.edit.lmsp_vs_llama_server.tok_per_s_ratio",
        1.5,
        "edit workload (T=0): tokens/s, lmsp with drafts ÷ llama-server without speculation (issue 39)",
    ),
    (
        "drafts.edit.lmsp_vs_llama_server_ngram.tok_per_s_ratio",
        1.0,
        "edit workload: tokens/s, lmsp with drafts ÷ llama-server with its n-gram speculation (issue 39)",
    ),
    (
        "conversations.lmsp_vs_llama_server.c_24.ttft_later_p50_ratio",
        0.8,
        "24 conversations on 8 slots: later turns' first token, p50, lmsp ÷ llama-server (issue 26)",
    ),
    (
        "conversations.lmsp_vs_llama_server.c_24.wall_ratio",
        0.9,
        "24 conversations on 8 slots: whole run's wall time, lmsp ÷ llama-server (issue 26)",
    ),
    (
        "conversations.lmsp_flash_attn_off_vs_llama_server.c_24.ttft_later_p50_ratio",
        0.8,
        "the same, lmsp with --flash-attn off (the CPU default before our patched kernel)",
    ),
    (
        "conversations.lmsp_flash_attn_off_vs_llama_server.c_24.wall_ratio",
        0.9,
        "the same whole run, lmsp with --flash-attn off",
    ),
    (
        "restart.cached_vs_reread.ttft_ratio",
        0.2,
        "a conversation continued after a restart: first token with --cache-dir ÷ re-reading it (issue 26)",
    ),
    (
        "backpressure.streams_8_on_off_events_s_ratio",
        0.95,
        "8 scripted POST streams, 600k events a round: events/s with write backpressure ÷ without (issue 53)",
    ),
    (
        "backpressure.streams_64_on_off_events_s_ratio",
        0.95,
        "the same at 64 streams (issue 53)",
    ),
    (
        "backpressure.beside_stalled_vs_fast_deltas_s_ratio",
        0.95,
        "4 model streams' deltas/s beside a reader at 1 byte/s past its bound ÷ beside a fast reader (issue 53)",
    ),
    (
        "fast_forward.on_off_wall_ratio",
        0.85,
        "schema-constrained answers, T=0: wall time per response, --fast-forward on ÷ off (issue 39)",
    ),
    (
        "sweep.model.portable_vs_native.streams_1.tok_per_s_ratio",
        0.95,
        "1 stream: tokens/s on the portable llama-cpp-python wheel ÷ on a native build (issue 37)",
    ),
    (
        "sweep.model.portable_vs_native.streams_8.tok_per_s_ratio",
        0.95,
        "8 streams: tokens/s on the portable wheel ÷ on a native build (issue 37)",
    ),
    (
        "schemas.lmsp.coverage",
        0.95,
        "JSONSchemaBench sample, Chat Completions json_schema at T=0: (valid + cut) ÷ sample, lmsp (issue 39)",
    ),
    (
        "schemas.lmsp_vs_llama_server.answered_minus_llama_server",
        0,
        "the same sample: schemas lmsp answered − those llama-server answered, same run (issue 39)",
    ),
    ("schemas.lmsp.invalid", 0, "the same sample: answers lmsp finished that break their schema (issue 39)"),
    (
        "schemas.lmsp_vs_llama_server.time_ratio",
        0.7,
        "the same sample: median time per response both answered, lmsp (fast-forward on) ÷ llama-server (issue 39)",
    ),
    (
        "schemas.lmsp_ff_on_vs_off.time_ratio",
        0.85,
        "the same sample: wall time per response, lmsp with grammar fast-forward ÷ without (issue 39)",
    ),
)


def render_targets(now: dict[str, Any]) -> str:
    """The targets' rows: each figure, its bound and whether this run met it."""
    rows = ["| target | figure | this run | bound | met |", "|---|---|---:|---:|:---|"]
    for name, bound, what in TARGETS:
        value = now.get(name)
        v = _number(value)
        higher = better(name) > 0
        ok = v is not None and (v >= bound if higher else v <= bound)
        met = "—" if v is None else "yes" if ok else "**no**"
        rows.append(f"| {what} | `{name}` | {_fmt(value)} | {'≥' if higher else '≤'} {bound:g} | {met} |")
    return "\n".join(rows)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def better(name: str) -> int:
    """+1 when a larger value is better, -1 when a smaller one is, 0 for counts."""
    return 0 if _COUNT.search(name) else -1 if _LOWER.search(name) else 1


def moved(name: str, now: dict[str, Any], before: dict[str, Any]) -> tuple[float | None, str]:
    """(this ÷ previous, its mark): ▲ or ▼ when the ratio is further from 1 than the larger of
    both runs' noise for the figure, with better or worse; nothing when either run measured the
    figure only once (no noise to weigh it against)."""
    a, b = _number(now.get(name)), _number(before.get(name))
    if a is None or b is None or b == 0:
        return None, ""
    ratio = a / b
    noises = [_number(run.get(NOISE + name)) for run in (now, before)]
    if any(n is None for n in noises):
        return ratio, ""
    noise = max(n for n in noises if n is not None)
    if abs(ratio - 1) <= noise:
        return ratio, ""
    up = ratio > 1
    direction = better(name)
    verdict = "" if direction == 0 else " better" if up == (direction > 0) else " **worse**"
    return ratio, ("▲" if up else "▼") + verdict


def _fmt(value: Any) -> str:
    v = _number(value)
    if v is None:  # absent, or why it was not measured (a table cell: no bare pipes)
        return "—" if value is None else str(value).replace("|", "\\|")
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.3g}"


def _order(name: str) -> tuple[int, str]:
    """The sweep first, as its plot reads (the server, then the model); every other figure
    after it, by name."""
    return (0 if name.startswith("sweep.scripted.") else 1 if name.startswith("sweep.") else 2, name)


def render_table(now: dict[str, Any], before: dict[str, Any]) -> str:
    rows = ["| figure | this run | previous | ratio | noise | moved |", "|---|---:|---:|---:|---:|:---|"]
    for name in sorted((n for n in now if not n.startswith(NOISE)), key=_order):
        ratio, mark = moved(name, now, before)
        noise = _number(now.get(NOISE + name))
        rows.append(
            f"| `{name}` | {_fmt(now[name])} | {_fmt(before.get(name))} | "
            f"{'—' if ratio is None else f'{ratio:.2f}'} | {'—' if noise is None else f'±{noise:.0%}'} | {mark} |"
        )
    return "\n".join(rows)


def _client_share(now: dict[str, Any]) -> str:
    shares = {
        n: v
        for n, v in now.items()
        if n.endswith(".client_cpu_cores") and _number(v) is not None and not n.startswith(NOISE)
    }
    if not shares:
        return ""
    worst = max(shares, key=lambda n: shares[n])
    cores = os.cpu_count() or 1
    return (
        f"The scripted streams' client (one asyncio process, raw sockets) shares the machine with the "
        f"server: it used at most {shares[worst]:.2f} of {cores} cores ({shares[worst] / cores:.0%} of the "
        f"machine), in `{worst}`; `*.client_cpu_cores` rows have every cell's share."
    )


def render(now: dict[str, Any], before: dict[str, Any], previous_path: Path | None) -> str:
    missing = sorted(n for n, v in now.items() if str(v).startswith(NOT_MEASURED))
    parts = [
        "## Benchmarks",
        f"Previous run: `{previous_path}`." if before else "Previous run: none found, so nothing to compare with.",
        "Noise (±) is each figure's spread over the repeats measured within this run, (max − min) ÷ median; "
        "a figure is marked ▲/▼ when this run ÷ the previous one is further from 1 than the larger of the two "
        "runs' noise (figures measured once have none and are never marked). These machines are shared and "
        "noisy: a mark is a prompt to look, never a failure.",
    ]
    if share := _client_share(now):
        parts.append(share)
    if missing:
        parts.append(
            f"**{len(missing)} figure(s) not measured** in this run: " + ", ".join(f"`{n}`" for n in missing) + "."
        )
    parts += ["### Targets", render_targets(now), "### Every figure", render_table(now, before)]
    return "\n\n".join(parts) + "\n"


def _series(figures: dict[str, Any], prefix: str, metric: str) -> tuple[list[int], list[float]]:
    points = sorted(
        (int(m.group(1)), v)
        for name, v in figures.items()
        if name.startswith(prefix) and name.endswith(metric) and (m := _STREAMS.search(name)) and _number(v) is not None
    )
    return [n for n, _ in points], [float(v) for _, v in points]


def _draw(
    ax: Any, lines: list[tuple[str, str, str]], now: dict[str, Any], before: dict[str, Any], ylabel: str, title: str
) -> None:
    """One line per (label, figure prefix, metric): this run solid, the previous one dotted."""
    colors = iter(["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"])
    streams: set[int] = set()
    for label, prefix, metric in lines:
        color = next(colors)
        for figures, style in ((now, {"marker": "o", "label": label}), (before, {"linestyle": ":", "alpha": 0.6})):
            x, y = _series(figures, prefix, metric)
            if x:
                ax.plot(x, y, color=color, **style)
                streams.update(x if figures is now else ())
    ax.set_title(title)
    if not streams:  # not measured in this run: say so where the lines would be
        ax.text(0.5, 0.5, "not measured in this run", ha="center", va="center", transform=ax.transAxes)
        ax.set(xticks=[], yticks=[])
        return
    from matplotlib.ticker import NullLocator

    ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel=ylabel)
    ax.xaxis.set_minor_locator(NullLocator())  # a tick at each measured N, and only there
    ax.set_xticks(sorted(streams), [f"{n:,}" for n in sorted(streams)])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


def plot(now: dict[str, Any], before: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # a file, no display: CI has none
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    scripted = [
        (f"{face_name}, {kind_name}", f"sweep.scripted.{face}.{kind}.", ".events_per_s")
        for face, face_name in FACES.items()
        for kind, kind_name in KINDS.items()
    ]
    _draw(left, scripted, now, before, "events/s, all clients together", "Scripted streams through the server")
    model = [(name, f"sweep.model.{server}.", ".tok_per_s") for server, name in SERVERS.items()]
    _draw(right, model, now, before, "tokens/s, all streams together", "Real model (embedded SmolLM2-135M)")
    key = "solid: this run; dotted: the previous run" if before else "this run (no previous run to draw)"
    fig.text(0.01, 0.01, key, fontsize="small")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/figures.json")
    now = json.loads(path.read_text(encoding="utf-8"))
    previous = Path(os.environ.get("LMSP_BENCH_PREVIOUS") or path.with_name("previous.json"))
    before = json.loads(previous.read_text(encoding="utf-8")) if previous.is_file() else {}
    report = render(now, before, previous if before else None)
    path.with_name("report.md").write_text(report, encoding="utf-8")
    plot(now, before, path.with_name("sweep.png"))
    print(report)
    print(f"written: {path.with_name('report.md')}, {path.with_name('sweep.png')}")


if __name__ == "__main__":
    main()
