"""What the schedulers count, per model, and how a scrape reads it.

A scheduler's thread is the only writer of its model's numbers, once per token at most, so they
are plain attributes and lists, not prometheus-client's locked values: a scrape reads them as
they are (a sum may lag its count by one observation, which Prometheus tolerates). Gauges that
describe a scheduler's state now (queue depth, busy slots) are asked of it at scrape time.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["Buckets", "EngineStats", "ModelStats", "TOKEN_BUCKETS", "TTFT_BUCKETS"]

# Seconds. A first token takes from tens of ms (a cached prompt on a GPU) to many seconds (a
# long prompt on a CPU); the gap between tokens, from ~1 ms (GPU) to a batched CPU step.
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Buckets:
    """A histogram with one writer: `add` is a bisect and two additions."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def add(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        counts = list(self.counts)  # one copy, so that the buckets agree with each other
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
            running += n
            out.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
        return out


# Queue depth and busy and total slots of a live scheduler, asked at scrape time.
Gauges = Callable[[], tuple[int, int, int]]


class ModelStats:
    """One model's counts, kept across its loads and unloads (counters never go back)."""

    __slots__ = (
        "between_tokens",
        "cache_bytes",
        "cache_disk_bytes",
        "cache_entries",
        "cache_evictions",
        "cache_hits",
        "cache_misses",
        "cache_restore_seconds",
        "cache_restored_tokens",
        "cache_saves",
        "decode_seconds",
        "draft_accepted",
        "draft_proposed",
        "embedding_cancelled",
        "embedding_inputs",
        "first_token",
        "forced_tokens",
        "shared_bytes",
        "shared_evictions",
        "shared_hits",
        "shared_misses",
        "shared_refused",
        "shared_writes",
        "gauges",
        "host_seconds",
        "output_tokens",
        "prompt_decoded",
        "prompt_reused",
        "steps",
        "tokens_decoded",
    )

    def __init__(self) -> None:
        self.first_token = Buckets(TTFT_BUCKETS)
        self.between_tokens = Buckets(TOKEN_BUCKETS)
        self.prompt_decoded = 0
        self.prompt_reused = 0
        self.output_tokens = 0
        # Embedding inputs decoded, and those dropped undecoded because their client left.
        self.embedding_inputs = 0
        self.embedding_cancelled = 0
        # The scheduler's steps, and its thread's time in llama_decode and, while it had work,
        # outside it (admission, the batch, sampling, text): Python's share of a step.
        self.steps = 0
        # Tokens those steps decoded (prompts' chunks, sampled tokens, forced runs): their
        # mean per step is this over `steps`. Of the output, the tokens a grammar forced and
        # the scheduler decoded in runs with a sampled one (engine/fastforward.py).
        self.tokens_decoded = 0
        self.forced_tokens = 0
        self.decode_seconds = 0.0
        self.host_seconds = 0.0
        # Prompt-lookup draft tokens decoded beside a sequence's next token, and those the
        # model agreed with (engine/drafts.py): output tokens per step = output / steps.
        self.draft_proposed = 0
        self.draft_accepted = 0
        self.gauges: Gauges | None = None  # set while a scheduler serves the model
        # The prompt cache beyond the slots (engine/prompt_cache.py): admissions that restored
        # a saved prefix or found none worth it, states saved and evicted, the time restores
        # took and the prompt tokens they spared decoding; its size now (gauges).
        self.cache_hits = 0
        self.cache_misses = 0
        self.cache_saves = 0
        self.cache_evictions = 0
        self.cache_restore_seconds = 0.0
        self.cache_restored_tokens = 0
        self.cache_bytes = 0
        self.cache_disk_bytes = 0
        self.cache_entries = 0
        # The shared tier (engine/prompt_shared.py, --cache-shared): admissions that restored a
        # state another server (or this one) wrote, or looked and found none; states written
        # (by its writer thread), files evicted by this server (of any server), files refused
        # (damaged, or not what their name says), and the folder's bytes as last counted.
        self.shared_hits = 0
        self.shared_misses = 0
        self.shared_writes = 0
        self.shared_evictions = 0
        self.shared_refused = 0
        self.shared_bytes = 0


class EngineStats:
    """Every model's stats, by model id, and their Prometheus families."""

    def __init__(self) -> None:
        self._models: dict[str, ModelStats] = {}
        self._lock = threading.Lock()

    def model(self, model_id: str) -> ModelStats:
        stats = self._models.get(model_id)
        if stats is None:
            with self._lock:
                stats = self._models.setdefault(model_id, ModelStats())
        return stats

    def collect(self) -> Iterator[Metric]:
        models = sorted(self._models.items())
        ttft = HistogramMetricFamily(
            "lmsp_time_to_first_token_seconds", "From a request's arrival to its first output token.", labels=["model"]
        )
        between = HistogramMetricFamily(
            "lmsp_time_between_tokens_seconds", "Between two output tokens of one generation.", labels=["model"]
        )
        prompt = CounterMetricFamily(
            "lmsp_prompt_tokens",
            "Prompt tokens, decoded or reused from the KV cache of an earlier request.",
            labels=["model", "source"],
        )
        output = CounterMetricFamily("lmsp_output_tokens", "Tokens generated.", labels=["model"])
        embedding = CounterMetricFamily(
            "lmsp_embedding_inputs",
            "Embedding inputs: decoded (embedded), or dropped undecoded because their client left (cancelled).",
            labels=["model", "result"],
        )
        steps = CounterMetricFamily(
            "lmsp_engine_steps", "Batches the scheduler decoded (one llama_decode each).", labels=["model"]
        )
        decoded = CounterMetricFamily(
            "lmsp_engine_tokens_decoded",
            "Tokens those batches held (prompt chunks, sampled tokens, forced runs); "
            "their mean per step: this over lmsp_engine_steps.",
            labels=["model"],
        )
        forced = CounterMetricFamily(
            "lmsp_forced_tokens",
            "Output tokens a grammar forced, decoded in one run with the sampled token before them (--fast-forward).",
            labels=["model"],
        )
        step_time = CounterMetricFamily(
            "lmsp_engine_step_seconds",
            "The scheduler thread's time while it had work: in llama_decode, or on the host between two decodes.",
            labels=["model", "part"],
        )
        drafts = CounterMetricFamily(
            "lmsp_draft_tokens",
            "Prompt-lookup draft tokens decoded beside a greedy sequence's next token: proposed, "
            "and accepted (the model chose them; each saves a step).",
            labels=["model", "result"],
        )
        queued = GaugeMetricFamily("lmsp_queue_depth", "Generations waiting for a slot.", labels=["model"])
        busy = GaugeMetricFamily("lmsp_slots_busy", "Slots generating or reading a prompt.", labels=["model"])
        slots = GaugeMetricFamily(
            "lmsp_slots", "Slots of the loaded model (sequences decoded together).", labels=["model"]
        )
        cache_lookups = CounterMetricFamily(
            "lmsp_prompt_cache_lookups",
            "Admissions that consulted the prompt cache: a saved prefix restored (hit) or none worth it (miss).",
            labels=["model", "result"],
        )
        cache_saves = CounterMetricFamily(
            "lmsp_prompt_cache_saves", "Slot states saved into the prompt cache.", labels=["model"]
        )
        cache_evictions = CounterMetricFamily(
            "lmsp_prompt_cache_evictions", "States the prompt cache dropped to stay in its budget.", labels=["model"]
        )
        cache_restore = CounterMetricFamily(
            "lmsp_prompt_cache_restore_seconds", "Time spent restoring saved states into slots.", labels=["model"]
        )
        cache_tokens = CounterMetricFamily(
            "lmsp_prompt_cache_restored_tokens",
            "Prompt tokens restored from the prompt cache instead of decoded again.",
            labels=["model"],
        )
        cache_bytes = GaugeMetricFamily(
            "lmsp_prompt_cache_bytes",
            "Bytes the prompt cache holds: in memory, on disk, in the shared folder (as last counted).",
            labels=["model", "tier"],
        )
        cache_entries = GaugeMetricFamily(
            "lmsp_prompt_cache_entries", "States the prompt cache holds.", labels=["model"]
        )
        shared_lookups = CounterMetricFamily(
            "lmsp_prompt_cache_shared_lookups",
            "Admissions that looked in the shared tier (--cache-shared): a state restored (hit) or none found (miss).",
            labels=["model", "result"],
        )
        shared_writes = CounterMetricFamily(
            "lmsp_prompt_cache_shared_writes", "States written to the shared tier.", labels=["model"]
        )
        shared_evictions = CounterMetricFamily(
            "lmsp_prompt_cache_shared_evictions",
            "Shared-tier files (any server's) this server deleted to keep the budget or the retention.",
            labels=["model"],
        )
        shared_refused = CounterMetricFamily(
            "lmsp_prompt_cache_shared_refused",
            "Shared-tier files refused: damaged, or not what their name says.",
            labels=["model"],
        )
        for model_id, stats in models:
            shared_lookups.add_metric([model_id, "hit"], stats.shared_hits)
            shared_lookups.add_metric([model_id, "miss"], stats.shared_misses)
            shared_writes.add_metric([model_id], stats.shared_writes)
            shared_evictions.add_metric([model_id], stats.shared_evictions)
            shared_refused.add_metric([model_id], stats.shared_refused)
            cache_bytes.add_metric([model_id, "shared"], stats.shared_bytes)
            cache_lookups.add_metric([model_id, "hit"], stats.cache_hits)
            cache_lookups.add_metric([model_id, "miss"], stats.cache_misses)
            cache_saves.add_metric([model_id], stats.cache_saves)
            cache_evictions.add_metric([model_id], stats.cache_evictions)
            cache_restore.add_metric([model_id], stats.cache_restore_seconds)
            cache_tokens.add_metric([model_id], stats.cache_restored_tokens)
            cache_bytes.add_metric([model_id, "ram"], stats.cache_bytes)
            cache_bytes.add_metric([model_id, "disk"], stats.cache_disk_bytes)
            cache_entries.add_metric([model_id], stats.cache_entries)
            for family, buckets in ((ttft, stats.first_token), (between, stats.between_tokens)):
                family.add_metric([model_id], buckets.cumulative(), buckets.total)
            prompt.add_metric([model_id, "decoded"], stats.prompt_decoded)
            prompt.add_metric([model_id, "reused"], stats.prompt_reused)
            output.add_metric([model_id], stats.output_tokens)
            embedding.add_metric([model_id, "embedded"], stats.embedding_inputs)
            embedding.add_metric([model_id, "cancelled"], stats.embedding_cancelled)
            steps.add_metric([model_id], stats.steps)
            decoded.add_metric([model_id], stats.tokens_decoded)
            forced.add_metric([model_id], stats.forced_tokens)
            step_time.add_metric([model_id, "decode"], stats.decode_seconds)
            drafts.add_metric([model_id, "proposed"], stats.draft_proposed)
            drafts.add_metric([model_id, "accepted"], stats.draft_accepted)
            step_time.add_metric([model_id, "host"], stats.host_seconds)
            gauges = stats.gauges
            if gauges is not None:
                depth, n_busy, n_slots = gauges()
                queued.add_metric([model_id], depth)
                busy.add_metric([model_id], n_busy)
                slots.add_metric([model_id], n_slots)
        yield from (
            ttft,
            between,
            prompt,
            output,
            embedding,
            steps,
            decoded,
            forced,
            step_time,
            drafts,
            queued,
            busy,
            slots,
        )
        yield from (
            cache_lookups,
            cache_saves,
            cache_evictions,
            cache_restore,
            cache_tokens,
            cache_bytes,
            cache_entries,
            shared_lookups,
            shared_writes,
            shared_evictions,
            shared_refused,
        )
