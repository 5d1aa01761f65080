"""vLLM's adapter: every release's metric names onto one snapshot (kvwatch.snapshot) per (model_name, engine).

Names by release (from vLLM's ``vllm/engine/metrics.py`` for V0 and ``vllm/v1/metrics/loggers.py`` for V1):
- V0 (<= 0.10): no ``engine`` label; ``gpu_cache_usage_perc``, ``num_requests_swapped``,
  ``time_per_output_token_seconds``, ``gpu_prefix_cache_hit_rate`` (a gauge), ``cache_config_info``
  without ``model_name``.
- V1 0.8-0.11: ``engine`` label; ``gpu_cache_usage_perc`` then also ``kv_cache_usage_perc`` (0.9-0.11
  export both with equal values: take one, never sum); ``gpu_prefix_cache_{queries,hits}_total``.
- V1 0.12+ (0.32 in tests/fixtures): ``kv_cache_usage_perc``, ``prefix_cache_{queries,hits}_total``,
  ``prompt_tokens_by_source_total{source}``, ``inter_token_latency_seconds``,
  ``num_requests_waiting_by_reason{reason}``; ``cache_config_info`` per engine without ``model_name``.
- V1 0.33 (``vllm/v1/metrics/loggers.py`` at 00ec631b; tests/fixtures/vllm-0.33, written from it): the 0.32
  names; ``num_requests_waiting`` is ``num_waiting_reqs + num_skipped_waiting_reqs``, the deferred included
  (``record()``), so ``requests_waiting`` is the whole queue and ``requests_waiting_deferred`` the part held by
  transient constraints; histogram edges come from ``custom_histogram_buckets`` (every ``le`` is read from the
  body, none is assumed). The newer families each have a reader of their own (``_apply_sleep_state``,
  ``_read_kv_fetch``, ``_apply_admission_rejections``, ``_read_kv_offload``).
- vLLM's Rust frontend (``VLLM_USE_RUST_FRONTEND=1``) serves the same families as OpenMetrics 1.0; the parser
  gives them the same family names, so nothing here depends on the format.
- Ray Serve deployments prefix everything with ``ray_vllm:``.
Unknown families are ignored.
"""

from __future__ import annotations

import math

from kvwatch.catalog import Action, Bottleneck
from kvwatch.engines import Engine
from kvwatch.engines._common import engine_index, first_present, num, read_histograms
from kvwatch.parse import Family, Sample
from kvwatch.snapshot import (
    KV_FETCH_STAGES,
    MAX_REJECTION_REASONS,
    REJECTIONS,
    CacheConfig,
    Counter,
    EngineSnapshot,
    Gauge,
    Hist,
    kv_fetch_gauge,
    rejection_counter,
)

__all__ = ["ENGINE", "FLAGS", "KEEP_FAMILIES", "keep_family", "read"]

# canonical name -> vLLM family names, most recent first. The first one present wins.
GAUGES: dict[Gauge, tuple[str, ...]] = {
    Gauge.KV_CACHE_USAGE_RATIO: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    Gauge.REQUESTS_RUNNING: ("vllm:num_requests_running",),
    Gauge.REQUESTS_WAITING: ("vllm:num_requests_waiting",),
    Gauge.REQUESTS_SWAPPED: ("vllm:num_requests_swapped",),
    Gauge.PREFIX_CACHE_HIT_RATE: ("vllm:gpu_prefix_cache_hit_rate",),  # V0 only: a ratio, not counters
}
# Counters by family name (prometheus_client convention: without _total).
COUNTERS: dict[Counter, tuple[str, ...]] = {
    Counter.PREEMPTIONS: ("vllm:num_preemptions",),
    Counter.PROMPT_TOKENS: ("vllm:prompt_tokens",),
    Counter.GENERATION_TOKENS: ("vllm:generation_tokens",),
    Counter.PREFIX_CACHE_QUERIES: ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    Counter.PREFIX_CACHE_HITS: ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    Counter.REQUESTS_FINISHED: ("vllm:request_success",),
}
HISTOGRAMS: dict[Hist, tuple[str, ...]] = {
    Hist.ITERATION_TOKENS: ("vllm:iteration_tokens_total",),
    Hist.REQUEST_PROMPT_TOKENS: ("vllm:request_prompt_tokens",),
    Hist.REQUEST_GENERATION_TOKENS: ("vllm:request_generation_tokens",),
    Hist.TIME_TO_FIRST_TOKEN_SECONDS: ("vllm:time_to_first_token_seconds",),
    Hist.INTER_TOKEN_LATENCY_SECONDS: ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    Hist.QUEUE_TIME_SECONDS: ("vllm:request_queue_time_seconds",),
}
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source"  # {source="local_compute"} is the prefill work done
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
_WAITING_BY_REASON = {"capacity": Gauge.REQUESTS_WAITING_CAPACITY, "deferred": Gauge.REQUESTS_WAITING_DEFERRED}
CACHE_CONFIG = "vllm:cache_config_info"
LORA_INFO = "vllm:lora_requests_info"
SLEEP_STATE = "vllm:engine_sleep_state"
ADMISSION_REJECTIONS = "vllm:admission_rejections"  # a counter: the family name without _total
KV_FETCH = "vllm:num_requests_kv_fetch_by_stage"  # 0.33, a P/D decode engine (kv_consumer) only

# CPU KV offload, 0.33 (vllm/v1/kv_offload/cpu/common.py CPUOffloadingMetrics; gauge and counter as the CPU
# spec's build_metric_definitions declares them). The gauge is the share of the CPU tier *pinned by in-flight
# transfers* ("sustained high values indicate transfers ... may be dropped"), not how full the tier is.
KV_OFFLOAD_PINNED = "vllm:kv_offload_cpu_cache_usage_perc"
KV_OFFLOAD_STORES_SKIPPED = "vllm:kv_offload_stores_skipped"  # only with store_threshold >= 2

KEEP_FAMILIES: frozenset[str] = frozenset(
    [n for names in (*GAUGES.values(), *COUNTERS.values(), *HISTOGRAMS.values()) for n in names]
    + [PROMPT_BY_SOURCE, WAITING_BY_REASON, CACHE_CONFIG, LORA_INFO, SLEEP_STATE, ADMISSION_REJECTIONS, KV_FETCH]
    + [KV_OFFLOAD_PINNED, KV_OFFLOAD_STORES_SKIPPED]
)
_RAY = "ray_vllm:"


def keep_family(name: str) -> bool:
    """The parser's filter: only the families normalize reads are tokenised."""
    if name.startswith(_RAY):
        name = "vllm:" + name[len(_RAY) :]
    return name in KEEP_FAMILIES


def _cache_config(labels: dict[str, str]) -> CacheConfig:
    pc = labels.get("enable_prefix_caching")
    return CacheConfig(
        block_size=num(labels.get("block_size"), int),
        num_gpu_blocks=num(labels.get("num_gpu_blocks"), int),
        kv_cache_size_tokens=num(labels.get("kv_cache_size_tokens"), int),
        kv_cache_max_concurrency=num(labels.get("kv_cache_max_concurrency")),
        cache_dtype=labels.get("cache_dtype"),
        enable_prefix_caching=None if pc is None else pc.lower() == "true",
        gpu_memory_utilization=num(labels.get("gpu_memory_utilization")),
        kv_cache_memory_bytes=num(labels.get("kv_cache_memory_bytes"), int),
    )


def _adapters(value: str | None) -> int:
    return len([a for a in (value or "").split(",") if a.strip()])


def read(families: dict[str, Family], max_engines: int = 64) -> dict[tuple[str, str], EngineSnapshot]:
    """Canonical snapshots keyed by (model_name, engine). Empty if no vLLM series is present.

    Beyond ``max_engines`` distinct keys, the rest fold into (``_overflow``, ``_overflow``) so a
    misbehaving upstream cannot blow up our own series count.
    """
    fams = {(n.replace(_RAY, "vllm:", 1) if n.startswith(_RAY) else n): f for n, f in families.items()}
    snap, out = engine_index(max_engines)
    # The order matters: snapshots, and the keys inside them, are created in the order first seen.
    _read_gauges(fams, snap)
    _read_waiting_by_reason(fams.get(WAITING_BY_REASON), snap)
    _read_counters(fams, snap)
    _read_prompt_computed(fams.get(PROMPT_BY_SOURCE), snap)
    _read_prompt_external(fams.get(PROMPT_BY_SOURCE), snap)
    _read_kv_fetch(fams.get(KV_FETCH), snap)
    for canon, names in HISTOGRAMS.items():
        fam = first_present(fams, names)
        if fam is not None:
            read_histograms(canon, fam, snap, out)
    if not out:
        return out  # no vLLM series: config and info families alone make no engine
    _apply_cache_config(fams.get(CACHE_CONFIG), out)
    _apply_lora_info(fams.get(LORA_INFO), out)
    _apply_sleep_state(fams.get(SLEEP_STATE), out)
    _apply_admission_rejections(fams.get(ADMISSION_REJECTIONS), out)
    _read_kv_offload(fams, snap)
    return out


def _read_gauges(fams: dict[str, Family], snap) -> None:
    isfinite = math.isfinite
    for canon, names in GAUGES.items():
        fam = first_present(fams, names)
        if fam is None:
            continue
        # Ratios fold by max (an overflow bucket must not read above 1); counts add.
        fold_max = canon.endswith(("ratio", "rate"))
        for smp in fam.samples:
            v = smp.value
            if not isfinite(v):
                continue
            g = snap(smp.labels).gauges
            g[canon] = max(g.get(canon, 0.0), v) if fold_max else g.get(canon, 0.0) + v


def _read_waiting_by_reason(fam: Family | None, snap) -> None:
    """0.12+: the queue split into waiting for capacity and deferred (e.g. LoRA budget)."""
    if fam is None:
        return
    for smp in fam.samples:
        reason = smp.labels.get("reason", "")
        if reason in _WAITING_BY_REASON and math.isfinite(smp.value):
            g = snap(smp.labels).gauges
            key = _WAITING_BY_REASON[reason]
            g[key] = g.get(key, 0.0) + smp.value


def _read_counters(fams: dict[str, Family], snap) -> None:
    isfinite = math.isfinite
    for canon, names in COUNTERS.items():
        fam = first_present(fams, names)
        if fam is None:
            continue
        for smp in fam.samples:
            if smp.name.endswith("_created") or not isfinite(smp.value):
                continue
            c = snap(smp.labels).counters
            c[canon] = c.get(canon, 0.0) + smp.value


def _read_prompt_computed(fam: Family | None, snap) -> None:
    """0.12+: prompt tokens actually prefilled (``source="local_compute"``), not served from cache."""
    if fam is None:
        return
    for smp in fam.samples:
        if smp.labels.get("source") == "local_compute" and smp.name.endswith("_total") and math.isfinite(smp.value):
            c = snap(smp.labels).counters
            c[Counter.PROMPT_TOKENS_COMPUTED] = c.get(Counter.PROMPT_TOKENS_COMPUTED, 0.0) + smp.value


def _in_scope(out: dict[tuple[str, str], EngineSnapshot], model: str | None, engine: str | None):
    """The snapshots an info series applies to: a missing label means every model / engine."""
    return [
        s for s in out.values() if (engine is None or s.engine == engine) and (model is None or s.model_name == model)
    ]


def _apply_cache_config(fam: Family | None, out: dict[tuple[str, str], EngineSnapshot]) -> None:
    """V0 and 0.12+ label cache_config_info without model_name, V0 without engine: it applies to all."""
    if fam is None:
        return
    for smp in fam.samples:
        cfg = _cache_config(smp.labels)
        for s in _in_scope(out, smp.labels.get("model_name"), smp.labels.get("engine")):
            s.cache = cfg


def _apply_lora_info(fam: Family | None, out: dict[tuple[str, str], EngineSnapshot]) -> None:
    if fam is None or not fam.samples:
        return
    # One series per adapter combination ever seen, valued with the time it was set: the newest is current.
    by_scope: dict[tuple[str | None, str | None], Sample] = {}
    for smp in fam.samples:
        scope = (smp.labels.get("model_name"), smp.labels.get("engine"))
        if scope not in by_scope or smp.value >= by_scope[scope].value:
            by_scope[scope] = smp
    for (model, engine), smp in by_scope.items():
        for s in _in_scope(out, model, engine):
            s.lora_running = _adapters(smp.labels.get("running_lora_adapters"))
            s.lora_waiting = _adapters(smp.labels.get("waiting_lora_adapters"))
            s.max_lora = num(smp.labels.get("max_lora"), int)


# vLLM 0.32/0.33 loggers.py PrometheusStatLogger.record_sleep_state: per engine, awake=1 and the others 0 while
# awake; asleep, awake=0 and weights_offloaded=1 (level 1) or discard_all=1 (level 2).
_SLEEP_LEVELS = {"weights_offloaded": 1, "discard_all": 2}


def _apply_sleep_state(fam: Family | None, out: dict[tuple[str, str], EngineSnapshot]) -> None:
    """The engine's sleep level from ``engine_sleep_state{sleep_state}``; an awake=0 without a level is level 1
    (vLLM sets neither level for a level other than 1 or 2: asleep all the same)."""
    if fam is None:
        return
    for smp in fam.samples:
        state = smp.labels.get("sleep_state")
        if state not in ("awake", *_SLEEP_LEVELS) or not math.isfinite(smp.value):
            continue
        for s in _in_scope(out, smp.labels.get("model_name"), smp.labels.get("engine")):
            s.sleep_level = _sleep_level(s.sleep_level, state, smp.value)


def _sleep_level(level: int | None, state: str, value: float) -> int | None:
    if state == "awake":
        return (level or 1) if value < 1 else (level or 0)
    return _SLEEP_LEVELS[state] if value >= 1 else level


def _apply_admission_rejections(fam: Family | None, out: dict[tuple[str, str], EngineSnapshot]) -> None:
    """Requests vLLM's frontend answered 503 (``--max-num-queued-reqs`` / ``--max-num-queued-tokens``,
    AsyncLLM.check_admission), by ``reason``. The 0.32 captures label it by model_name and reason, no engine: the
    frontend's count, given to each engine of the model whole (the same rate on each; never sum over engines)."""
    if fam is None:
        return
    for smp in fam.samples:
        reason = smp.labels.get("reason")
        if not reason or not smp.name.endswith("_total") or not math.isfinite(smp.value):
            continue
        for s in _in_scope(out, smp.labels.get("model_name"), smp.labels.get("engine")):
            key = rejection_counter(_bounded_reason(s.counters, reason))
            s.counters[key] = s.counters.get(key, 0.0) + smp.value


def _bounded_reason(counters: dict[str, float], reason: str) -> str:
    seen = sum(1 for k in counters if k.startswith(REJECTIONS))
    if REJECTIONS + reason in counters or seen < MAX_REJECTION_REASONS - 1:
        return reason if len(reason) <= 64 else reason[:64]
    return "other"


def _read_prompt_external(fam: Family | None, snap) -> None:
    """0.12+: prompt tokens whose KV came from another instance (``source="external_kv_transfer"``, P/D)."""
    if fam is None:
        return
    for smp in fam.samples:
        if smp.labels.get("source") == "external_kv_transfer" and smp.name.endswith("_total"):
            if math.isfinite(smp.value):
                c = snap(smp.labels).counters
                c[Counter.PROMPT_TOKENS_EXTERNAL] = c.get(Counter.PROMPT_TOKENS_EXTERNAL, 0.0) + smp.value


def _read_kv_fetch(fam: Family | None, snap) -> None:
    """0.33 loggers.py: a decode engine's waiting requests by remote KV load stage (the scheduler skips them, so
    they are also ``deferred``)."""
    if fam is None:
        return
    for smp in fam.samples:
        stage = smp.labels.get("stage")
        if stage in KV_FETCH_STAGES and math.isfinite(smp.value):
            g = snap(smp.labels).gauges
            key = kv_fetch_gauge(stage)
            g[key] = g.get(key, 0.0) + smp.value


def _read_kv_offload(fams: dict[str, Family], snap) -> None:
    """CPU KV offload: the pinned share (max over folded series: a ratio) and the stores skipped (a counter)."""
    pinned, skipped = fams.get(KV_OFFLOAD_PINNED), fams.get(KV_OFFLOAD_STORES_SKIPPED)
    for smp in pinned.samples if pinned is not None else ():
        if math.isfinite(smp.value):
            g = snap(smp.labels).gauges
            g[Gauge.KV_OFFLOAD_PINNED_RATIO] = max(g.get(Gauge.KV_OFFLOAD_PINNED_RATIO, 0.0), smp.value)
    for smp in skipped.samples if skipped is not None else ():
        if smp.name.endswith("_total") and math.isfinite(smp.value):
            c = snap(smp.labels).counters
            c[Counter.KV_OFFLOAD_STORES_SKIPPED] = c.get(Counter.KV_OFFLOAD_STORES_SKIPPED, 0.0) + smp.value


# vLLM's spelling of each action (vllm/engine/arg_utils.py EngineArgs; the operations are not flags).
FLAGS: dict[Action, str] = {
    Action.FP8_KV_CACHE: "--kv-cache-dtype fp8",
    Action.ENABLE_PREFIX_CACHING: "--enable-prefix-caching",
    Action.REDUCE_MAX_MODEL_LEN: "--max-model-len",
    Action.RAISE_GPU_MEMORY_UTILIZATION: "--gpu-memory-utilization",
    Action.RAISE_KV_CACHE_MEMORY_BYTES: "--kv-cache-memory-bytes",
    Action.RAISE_MAX_NUM_SEQS: "--max-num-seqs",
    Action.LOWER_MAX_NUM_SEQS: "--max-num-seqs",
    Action.RAISE_MAX_NUM_BATCHED_TOKENS: "--max-num-batched-tokens",
    Action.RAISE_MAX_LORAS: "--max-loras",
    Action.SCALE_PREFILL_SIDE: "prefill engines / --kv-transfer-config",
    Action.ADD_REPLICA: "replicas",
    Action.RESTART_ENGINE: "restart",
}

_OWN_PREFIXES = ("vllm:", _RAY)


def recognise(name: str) -> bool:
    return name.startswith(_OWN_PREFIXES) and keep_family(name)


ENGINE = Engine(
    name="vllm",
    title="vLLM",
    families=KEEP_FAMILIES,
    keep_family=keep_family,
    recognise=recognise,
    read=read,
    flags=FLAGS,
    shows=frozenset(Bottleneck),  # every limit kvwatch knows was first learnt on vLLM
    alias_prefixes=(_RAY,),
)
