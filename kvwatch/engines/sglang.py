"""SGLang's adapter: ``sglang:`` families (python/sglang/srt/metrics/collector.py, sgl-project/sglang) onto the snapshot.

What SGLang exports, and what it means here:
- ``num_running_reqs``, ``num_queue_reqs`` (the waiting queue), ``token_usage`` (the KV pool's use, 0-1: the maximum
  over its pools), ``max_total_num_tokens`` (the pool's size in tokens), ``cache_hit_rate`` (a ratio, not counters).
- Token counters: ``prompt_tokens_total`` / ``generation_tokens_total`` / ``cached_tokens_total`` are counted by the
  tokenizer manager when a request *finishes* (``observe_one_finished_request``), so they move in lumps; newer builds
  (sgl-project/sglang#15198, Dec 2025) also count ``realtime_tokens_total{mode=prefill_compute|prefill_cache|decode}``
  as the scheduler batches tokens (each prefill batch's chunks, each decode iteration:
  python/sglang/srt/managers/scheduler_components/metrics_reporter.py at 00df707e), read instead where present.
- Retraction is SGLang's preemption: ``num_retracted_requests_total`` (a counter; older builds only the
  ``num_retracted_reqs`` gauge, not read: it is the last interval's count, not a total).
- P/D disaggregation: a decode server's ``num_decode_prealloc_queue_reqs`` wait for KV room to receive into and
  ``num_decode_transfer_queue_reqs`` for their KV to arrive: the snapshot's KV-fetch stages, part of the queue.
- Histograms: ``time_to_first_token_seconds``, ``inter_token_latency_seconds``, ``queue_time_seconds``.
- LoRA (only with ``--enable-lora``; sgl-project/sglang#15149, Dec 2025): ``lora_pool_slots_used``, the distinct
  adapters of the running batch (the base model not counted), and ``lora_pool_slots_total``, ``--max-loras-per-batch``
  (python/sglang/srt/metrics/collector.py at 00ae9c15; set by ``_update_lora_metrics`` in
  python/sglang/srt/managers/scheduler_components/metrics_reporter.py at 00df707e): the snapshot's ``lora_running`` /
  ``max_lora``, as vLLM's lora_requests_info fills them. SGLang does not say which adapters wait (``lora_waiting``
  stays unknown), so a full pool shows that the slots may hold the queue, never that they do.
- Labels: ``model_name`` (``name`` in old builds), then ``engine_type``, ``tp_rank``, ``pp_rank``, ``dp_rank``,
  ``moe_ep_rank``; series of one data-parallel rank are one engine; tensor/pipeline ranks of it report the same
  scheduler and are not added (the maximum is kept). ``priority`` series other than "" are parts of the total.
- The first builds with metrics (PR sgl-project/sglang#1853, Nov 2024, v0.3.5 era) named the scheduler's gauges
  ``num_requests_running`` / ``num_requests_waiting`` and exported its configuration: ``max_running_requests`` (the
  running-request ceiling, read as configured) beside ``max_total_num_tokens`` (the dump published in that PR's
  review, cited in tests/fixtures/engines/sglang/SOURCES.md).
Later builds export no configured ceiling (``--max-running-requests``) nor step budget (``--chunked-prefill-size``):
they are inferred as for vLLM, or given as hints, and the evidence says which.
"""

from __future__ import annotations

import math

from kvwatch.catalog import Action, Bottleneck
from kvwatch.engines import Engine
from kvwatch.engines._common import engine_index, read_histograms
from kvwatch.parse import Family, Sample
from kvwatch.snapshot import CacheConfig, Counter, EngineSnapshot, Gauge, Hist, kv_fetch_gauge

__all__ = ["ENGINE", "FLAGS", "keep_family", "read"]

_P = "sglang:"
GAUGES: dict[str, Gauge] = {
    _P + "num_running_reqs": Gauge.REQUESTS_RUNNING,
    _P + "num_queue_reqs": Gauge.REQUESTS_WAITING,
    _P + "token_usage": Gauge.KV_CACHE_USAGE_RATIO,
    _P + "cache_hit_rate": Gauge.PREFIX_CACHE_HIT_RATE,
    _P + "num_decode_prealloc_queue_reqs": kv_fetch_gauge("waiting_to_start"),
    _P + "num_decode_transfer_queue_reqs": kv_fetch_gauge("in_progress"),
    # The first metrics builds' names (python/sglang/srt/metrics/metrics_collector.py of PR #1853; the dump published
    # in its review, cited in tests/fixtures/engines/sglang/SOURCES.md, carries its max_running_requests and context_len).
    _P + "num_requests_running": Gauge.REQUESTS_RUNNING,
    _P + "num_requests_waiting": Gauge.REQUESTS_WAITING,
}
# Gauges that are also waiting requests (the KV-fetch stages wait too, as vLLM counts them).
_ALSO_WAITING = (_P + "num_decode_prealloc_queue_reqs", _P + "num_decode_transfer_queue_reqs")
COUNTERS: dict[str, Counter] = {
    _P + "prompt_tokens": Counter.PROMPT_TOKENS,
    _P + "generation_tokens": Counter.GENERATION_TOKENS,
    _P + "num_retracted_requests": Counter.PREEMPTIONS,
    _P + "num_requests": Counter.REQUESTS_FINISHED,
}
REALTIME = _P + "realtime_tokens"  # {mode}: prefill_compute, prefill_cache, decode
CACHED = _P + "cached_tokens"
POOL = _P + "max_total_num_tokens"
LORA_USED, LORA_TOTAL = _P + "lora_pool_slots_used", _P + "lora_pool_slots_total"
CEILING = _P + "max_running_requests"  # first builds only: the running-request ceiling (2231 in #1853's dump)
HISTOGRAMS: dict[str, Hist] = {
    _P + "time_to_first_token_seconds": Hist.TIME_TO_FIRST_TOKEN_SECONDS,
    _P + "inter_token_latency_seconds": Hist.INTER_TOKEN_LATENCY_SECONDS,
    _P + "queue_time_seconds": Hist.QUEUE_TIME_SECONDS,
    # request lengths, exported only with --collect-tokens-histogram (TokenizerMetricsCollector): the mean sequence
    # length, so the sequences the KV pool holds (vLLM's request_prompt_tokens / request_generation_tokens)
    _P + "prompt_tokens_histogram": Hist.REQUEST_PROMPT_TOKENS,
    _P + "generation_tokens_histogram": Hist.REQUEST_GENERATION_TOKENS,
}
KEEP_FAMILIES = frozenset([*GAUGES, *COUNTERS, *HISTOGRAMS, REALTIME, CACHED, POOL, CEILING, LORA_USED, LORA_TOTAL])
_MODEL, _RANK = "model_name", "dp_rank"


def keep_family(name: str) -> bool:
    return name in KEEP_FAMILIES


def _key_labels(labels: dict[str, str]) -> dict[str, str]:
    """Old builds label the model ``name``; the rank is ``dp_rank`` when data-parallel."""
    if _MODEL not in labels and "name" in labels:
        return {**labels, _MODEL: labels["name"]}
    return labels


def _is_total(labels: dict[str, str]) -> bool:
    """A ``priority`` label splits a family by request priority where "" is the total (collector's labels)."""
    return labels.get("priority", "") == ""


def read(families: dict[str, Family], max_engines: int = 64) -> dict[tuple[str, str], EngineSnapshot]:
    """Snapshots keyed by (model_name, dp_rank). Empty if no SGLang gauge is present."""
    snap, out = engine_index(max_engines, _MODEL, _RANK)
    _read_gauges(families, snap)
    if not out:
        return out  # counters and histograms alone make no engine
    _read_counters(families, snap)
    _read_realtime(families.get(REALTIME), snap)
    live = families.get(REALTIME)
    for s in out.values():  # without realtime_tokens_total, only observe_one_finished_request counts tokens
        s.tokens_at_request_end = live is None or not live.samples
    for name, canon in HISTOGRAMS.items():
        fam = families.get(name)
        if fam is not None:
            read_histograms(canon, _relabelled(fam), snap, out, (_MODEL, _RANK))
    _apply_pool(families.get(POOL), snap)
    _apply_lora(families.get(LORA_USED), families.get(LORA_TOTAL), snap)
    _apply_ceiling(families.get(CEILING), snap)
    return out


def _relabelled(fam: Family) -> Family:
    if all((_MODEL in s.labels or "name" not in s.labels) and _is_total(s.labels) for s in fam.samples):
        return fam
    samples = [Sample(s.name, _key_labels(s.labels), s.value, s.timestamp) for s in fam.samples if _is_total(s.labels)]
    return Family(fam.name, fam.type, fam.help, samples)


def _read_gauges(families: dict[str, Family], snap) -> None:
    """Tensor / pipeline ranks of one scheduler report the same numbers: keep the maximum, never add them."""
    for name, canon in GAUGES.items():
        fam = families.get(name)
        for smp in fam.samples if fam is not None else ():
            if not math.isfinite(smp.value) or not _is_total(smp.labels):
                continue
            g = snap(_key_labels(smp.labels)).gauges
            g[canon] = max(g.get(canon, 0.0), smp.value)
            if name in _ALSO_WAITING:
                g[Gauge.REQUESTS_WAITING] = g.get(Gauge.REQUESTS_WAITING, 0.0) + smp.value


def _read_counters(families: dict[str, Family], snap) -> None:
    for name, canon in COUNTERS.items():
        fam = families.get(name)
        for smp in fam.samples if fam is not None else ():
            if smp.name.endswith("_total") and math.isfinite(smp.value) and _is_total(smp.labels):
                c = snap(_key_labels(smp.labels)).counters
                c[canon] = max(c.get(canon, 0.0), smp.value)
    cached = families.get(CACHED)
    for smp in cached.samples if cached is not None else ():
        if smp.name.endswith("_total") and math.isfinite(smp.value) and _is_total(smp.labels):
            c = snap(_key_labels(smp.labels)).counters
            if Counter.PROMPT_TOKENS in c:  # prompt tokens computed: those not served from the prefix cache
                c[Counter.PROMPT_TOKENS_COMPUTED] = max(0.0, c[Counter.PROMPT_TOKENS] - smp.value)
                # every prompt token is looked up in the radix cache, the cached ones found (both counted as a
                # request finishes): the hit ratio from counters, before the last batch's cache_hit_rate gauge
                c[Counter.PREFIX_CACHE_QUERIES] = c[Counter.PROMPT_TOKENS]
                c[Counter.PREFIX_CACHE_HITS] = smp.value


_REALTIME_MODES = {"prefill_compute": Counter.PROMPT_TOKENS_COMPUTED, "decode": Counter.GENERATION_TOKENS}


def _read_realtime(fam: Family | None, snap) -> None:
    """Counted every log interval, not at a request's end: they stand instead of the finish-time counters."""
    modes: dict[int, dict[str, float]] = {}
    owners: dict[int, EngineSnapshot] = {}
    for smp in fam.samples if fam is not None else ():
        mode = smp.labels.get("mode", "")
        if smp.name.endswith("_total") and math.isfinite(smp.value) and _is_total(smp.labels):
            s = snap(_key_labels(smp.labels))
            owners[id(s)] = s
            m = modes.setdefault(id(s), {})
            m[mode] = max(m.get(mode, 0.0), smp.value)
    for key, m in modes.items():
        c = owners[key].counters
        for mode, canon in _REALTIME_MODES.items():
            if mode in m:
                c[canon] = m[mode]
        if "prefill_compute" in m:
            c[Counter.PROMPT_TOKENS] = m["prefill_compute"] + m.get("prefill_cache", 0.0)
        if "prefill_compute" in m and "prefill_cache" in m:  # the same ratio, counted live
            c[Counter.PREFIX_CACHE_QUERIES] = c[Counter.PROMPT_TOKENS]
            c[Counter.PREFIX_CACHE_HITS] = m["prefill_cache"]


def _apply_pool(fam: Family | None, snap) -> None:
    """``max_total_num_tokens``: the KV pool in tokens (SGLang's pool is token-granular: a block of 1)."""
    for smp in fam.samples if fam is not None else ():
        if math.isfinite(smp.value) and smp.value > 0:
            s = snap(_key_labels(smp.labels))
            s.cache = CacheConfig(kv_cache_size_tokens=int(smp.value))


def _apply_lora(used: Family | None, total: Family | None, snap) -> None:
    """The LoRA pool per scheduler (the maximum over its tensor / pipeline ranks, as for the gauges): adapters in the
    running batch and slots. Read only with both: adapters without the slots say nothing of a full pool."""
    adapters: dict[tuple[str, str], float] = {}
    for smp in used.samples if used is not None else ():
        if math.isfinite(smp.value) and smp.value >= 0 and _is_total(smp.labels):
            labels = _key_labels(smp.labels)
            key = (labels.get(_MODEL, ""), labels.get(_RANK, "0"))
            adapters[key] = max(adapters.get(key, 0.0), smp.value)
    for smp in total.samples if total is not None else ():
        labels = _key_labels(smp.labels)
        key = (labels.get(_MODEL, ""), labels.get(_RANK, "0"))
        if key in adapters and math.isfinite(smp.value) and smp.value >= 1 and _is_total(smp.labels):
            s = snap(labels)
            s.max_lora = max(s.max_lora or 0, int(smp.value))
            s.lora_running = max(s.lora_running or 0, int(adapters[key]))


def _apply_ceiling(fam: Family | None, snap) -> None:
    """The first builds' ``max_running_requests``: the ceiling the scheduler runs with (``--max-running-requests``, or the one
    it derived from the pool), so the rules read it as configured, not inferred."""
    for smp in fam.samples if fam is not None else ():
        if math.isfinite(smp.value) and smp.value > 0:
            snap(_key_labels(smp.labels)).max_running_requests = int(smp.value)


def recognise(name: str) -> bool:
    return name.startswith(_P)


# SGLang's spelling of each action (python/sglang/srt/server_args.py).
FLAGS: dict[Action, str] = {
    Action.FP8_KV_CACHE: "--kv-cache-dtype fp8_e5m2",
    Action.ENABLE_PREFIX_CACHING: "radix cache (drop --disable-radix-cache)",
    Action.REDUCE_MAX_MODEL_LEN: "--context-length",
    Action.RAISE_GPU_MEMORY_UTILIZATION: "--mem-fraction-static",
    Action.RAISE_KV_CACHE_MEMORY_BYTES: "--mem-fraction-static (SGLang sizes the pool by fraction)",
    Action.RAISE_MAX_NUM_SEQS: "--max-running-requests",
    Action.LOWER_MAX_NUM_SEQS: "--max-running-requests",
    Action.RAISE_MAX_NUM_BATCHED_TOKENS: "--chunked-prefill-size / --max-prefill-tokens",
    Action.RAISE_MAX_LORAS: "--max-loras-per-batch",
    Action.SCALE_PREFILL_SIDE: "prefill servers / --disaggregation-transfer-backend",
    Action.ADD_REPLICA: "replicas (or --dp-size)",
    Action.RESTART_ENGINE: "restart",
}

ENGINE = Engine(
    name="sglang",
    title="SGLang",
    families=KEEP_FAMILIES,
    keep_family=keep_family,
    recognise=recognise,
    read=read,
    flags=FLAGS,
    # No sleep state, and no per-adapter queue: lora_pool_slots_* say the slots are full, not that anyone waits for
    # one (a full pool with a queue is undetermined: kvwatch.capacity.lora_slots_unattributed).
    shows=frozenset(Bottleneck) - {Bottleneck.ASLEEP, Bottleneck.MAX_LORAS},
    cannot_tell=(
        "its configured ceilings (--max-running-requests, --chunked-prefill-size): inferred or given as hints; which "
        "LoRA adapters wait (lora_pool_slots_* show the slots full, not a queue for them): a queue while every slot is "
        "taken is undetermined, never a ceiling inferred"
    ),
)
