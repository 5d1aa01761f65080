"""TensorRT-LLM's adapter, in its two forms:

- ``trtllm-serve`` (tensorrt_llm/metrics/collector.py, NVIDIA/TensorRT-LLM) serves Prometheus text at
  ``/prometheus/metrics`` (its ``/metrics`` is JSON). Current builds prefix ``trtllm_``; older ones exported the
  same names without a prefix. Read: ``num_requests_running`` / ``_waiting``, ``kv_cache_utilization`` (0-1), the KV
  pool in blocks (``kv_cache_max_blocks``, ``kv_cache_tokens_per_block``), the configured ceilings
  ``max_num_active_requests`` and ``max_num_tokens_runtime`` (the per-step token budget), ``prompt_tokens_total``
  / ``generation_tokens_total`` / ``prompt_cached_tokens_total`` (counted per request as it finishes),
  ``request_success_total``, and the TTFT / TPOT / queue-time histograms. Labels: ``model_name``, ``engine_type``.
- Triton's TensorRT-LLM backend (triton-inference-server/tensorrtllm_backend, inflight_batcher_llm) exports gauges
  told apart by a selector label, per ``model`` and ``version``: ``nv_trt_llm_request_metrics{request_type=active|
  scheduled|max|waiting|context}``, ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max|free|used|tokens_per|
  fraction}``. No token counters: Triton's own ``nv_inference_*`` counters count requests, not tokens.
Neither form counts preemptions (TensorRT-LLM pauses requests instead; ``num_paused_requests`` is not a rate).
"""

from __future__ import annotations

import math

from kvwatch.catalog import Action, Bottleneck
from kvwatch.engines import Engine
from kvwatch.engines._common import engine_index, read_histograms
from kvwatch.parse import Family
from kvwatch.snapshot import CacheConfig, Counter, EngineSnapshot, Gauge, Hist

__all__ = ["ENGINE", "FLAGS", "keep_family", "read"]

PREFIX = "trtllm_"
GAUGES: dict[str, Gauge] = {
    "num_requests_running": Gauge.REQUESTS_RUNNING,
    "num_requests_waiting": Gauge.REQUESTS_WAITING,
    "kv_cache_utilization": Gauge.KV_CACHE_USAGE_RATIO,
    "kv_cache_hit_rate": Gauge.PREFIX_CACHE_HIT_RATE,
}
COUNTERS: dict[str, Counter] = {
    "prompt_tokens": Counter.PROMPT_TOKENS,
    "generation_tokens": Counter.GENERATION_TOKENS,
    "request_success": Counter.REQUESTS_FINISHED,
}
CACHED = "prompt_cached_tokens"
LIMITS = ("max_num_active_requests", "max_num_tokens_runtime", "kv_cache_max_blocks", "kv_cache_tokens_per_block")
HISTOGRAMS: dict[str, Hist] = {
    "time_to_first_token_seconds": Hist.TIME_TO_FIRST_TOKEN_SECONDS,
    "time_per_output_token_seconds": Hist.INTER_TOKEN_LATENCY_SECONDS,
    "request_queue_time_seconds": Hist.QUEUE_TIME_SECONDS,
}
_OWN = frozenset([*GAUGES, *COUNTERS, CACHED, *LIMITS, *HISTOGRAMS])
# Unprefixed builds share generic names (request_success, prompt_tokens) with other exporters: only these say
# TensorRT-LLM on their own.
_UNPREFIXED_SIGNATURE = frozenset(("kv_cache_utilization", "max_num_active_requests", "kv_cache_max_blocks"))
# The first builds (NVIDIA/TensorRT-LLM#5785, mid-2025; aibrix#2004 shows one in March 2026) exported five families,
# unprefixed: request_success_total and four latency histograms, no request or KV gauge. These two names are
# TensorRT-LLM's own among them (vLLM and SGLang prefix theirs): such a server is recognised, and read as what it is,
# an engine whose requests kvwatch cannot count (undetermined, not "no engine").
_FIRST_BUILD_SIGNATURE = frozenset(("time_per_output_token_seconds", "request_queue_time_seconds"))

TRITON_REQUESTS = "nv_trt_llm_request_metrics"  # {request_type}
TRITON_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"  # {kv_cache_block_type}
_TRITON = frozenset((TRITON_REQUESTS, TRITON_KV_BLOCKS))

KEEP_FAMILIES = frozenset([*_OWN, *(PREFIX + n for n in _OWN), *_TRITON])


def keep_family(name: str) -> bool:
    return name in KEEP_FAMILIES


def recognise(name: str) -> bool:
    return (
        name in _TRITON
        or (name.startswith(PREFIX) and name in KEEP_FAMILIES)
        or name in _UNPREFIXED_SIGNATURE
        or name in _FIRST_BUILD_SIGNATURE
    )


def read(families: dict[str, Family], max_engines: int = 64) -> dict[tuple[str, str], EngineSnapshot]:
    if any(n in families for n in _TRITON):
        return _read_triton(families, max_engines)
    prefix = PREFIX if any(n.startswith(PREFIX) for n in families) else ""
    fams = {n.removeprefix(prefix): f for n, f in families.items() if n.startswith(prefix)}
    snap, out = engine_index(max_engines, "model_name", "engine")
    _read_gauges(fams, snap)
    _read_counters(fams, snap)
    for s in out.values():
        s.tokens_at_request_end = True  # log_request_metrics_dict: counted when a request has finished
    for name, canon in HISTOGRAMS.items():
        if (fam := fams.get(name)) is not None:
            read_histograms(canon, fam, snap, out)
    _read_limits(fams, snap)
    return out


def _values(fam: Family | None):
    for smp in fam.samples if fam is not None else ():
        if math.isfinite(smp.value) and not smp.name.endswith("_created"):
            yield smp


def _read_gauges(fams: dict[str, Family], snap) -> None:
    for name, canon in GAUGES.items():
        for smp in _values(fams.get(name)):
            g = snap(smp.labels).gauges
            g[canon] = max(g.get(canon, 0.0), smp.value) if canon.endswith(("ratio", "rate")) else smp.value


def _read_counters(fams: dict[str, Family], snap) -> None:
    for name, canon in COUNTERS.items():
        for smp in _values(fams.get(name)):
            if smp.name.endswith("_total"):
                c = snap(smp.labels).counters
                c[canon] = c.get(canon, 0.0) + smp.value  # request_success is split by finished_reason
    for smp in _values(fams.get(CACHED)):
        c = snap(smp.labels).counters
        if smp.name.endswith("_total") and Counter.PROMPT_TOKENS in c:
            c[Counter.PROMPT_TOKENS_COMPUTED] = max(0.0, c[Counter.PROMPT_TOKENS] - smp.value)
            # prompt tokens looked up / found in the reused KV blocks, per finished request: the hit ratio from
            # counters, before the kv_cache_hit_rate gauge
            c[Counter.PREFIX_CACHE_QUERIES] = c[Counter.PROMPT_TOKENS]
            c[Counter.PREFIX_CACHE_HITS] = smp.value


def _read_limits(fams: dict[str, Family], snap) -> None:
    """The configured ceilings trtllm-serve exports: max_num_active_requests (its max_batch_size at runtime) and
    max_num_tokens_runtime (the per-step token budget); the KV pool as blocks x tokens per block."""
    values: dict[int, dict[str, float]] = {}
    owners: dict[int, EngineSnapshot] = {}
    for name in LIMITS:
        for smp in _values(fams.get(name)):
            s = snap(smp.labels)
            owners[id(s)] = s
            values.setdefault(id(s), {})[name] = smp.value
    for key, v in values.items():
        s = owners[key]
        s.max_running_requests = _positive(v.get("max_num_active_requests"))
        s.max_step_tokens = _positive(v.get("max_num_tokens_runtime"))
        blocks, per = _positive(v.get("kv_cache_max_blocks")), _positive(v.get("kv_cache_tokens_per_block"))
        if blocks and per:
            s.cache = CacheConfig(block_size=per, num_gpu_blocks=blocks)


def _positive(v: float | None) -> int | None:
    return int(v) if v is not None and v > 0 else None


# Triton's request_type values (inflight_batcher_llm/src/custom_metrics_reporter): active = in flight,
# waiting = queued, max = the backend's max_batch_size (the ceiling on requests in flight).
_TRITON_REQUESTS = {"active": Gauge.REQUESTS_RUNNING, "waiting": Gauge.REQUESTS_WAITING}


def _read_triton(families: dict[str, Family], max_engines: int) -> dict[tuple[str, str], EngineSnapshot]:
    snap, out = engine_index(max_engines, "model", "version")
    kv: dict[int, dict[str, float]] = {}
    owners: dict[int, EngineSnapshot] = {}
    for smp in _values(families.get(TRITON_REQUESTS)):
        kind, s = smp.labels.get("request_type"), snap(smp.labels)
        if kind in _TRITON_REQUESTS:
            s.gauges[_TRITON_REQUESTS[kind]] = smp.value
        elif kind == "max":
            s.max_running_requests = _positive(smp.value)
    for smp in _values(families.get(TRITON_KV_BLOCKS)):
        s = snap(smp.labels)
        owners[id(s)] = s
        kv.setdefault(id(s), {})[smp.labels.get("kv_cache_block_type", "")] = smp.value
    for key, v in kv.items():
        s = owners[key]
        if "fraction" in v:
            s.gauges[Gauge.KV_CACHE_USAGE_RATIO] = v["fraction"]
        elif v.get("max"):
            s.gauges[Gauge.KV_CACHE_USAGE_RATIO] = v.get("used", v["max"] - v.get("free", 0.0)) / v["max"]
        blocks, per = _positive(v.get("max")), _positive(v.get("tokens_per"))
        if blocks and per:
            s.cache = CacheConfig(block_size=per, num_gpu_blocks=blocks)
    return {k: s for k, s in out.items() if Gauge.REQUESTS_RUNNING in s.gauges or Gauge.REQUESTS_WAITING in s.gauges}


# TensorRT-LLM's spelling of each action (trtllm-serve's flags and the LLM API's KvCacheConfig).
FLAGS: dict[Action, str] = {
    Action.FP8_KV_CACHE: "kv_cache_config.dtype fp8 (an FP8 KV cache quantisation)",
    Action.ENABLE_PREFIX_CACHING: "kv_cache_config.enable_block_reuse",
    Action.REDUCE_MAX_MODEL_LEN: "--max_seq_len",
    Action.RAISE_GPU_MEMORY_UTILIZATION: "--kv_cache_free_gpu_memory_fraction",
    Action.RAISE_KV_CACHE_MEMORY_BYTES: "kv_cache_config.max_tokens",
    Action.RAISE_MAX_NUM_SEQS: "--max_batch_size",
    Action.LOWER_MAX_NUM_SEQS: "--max_batch_size",
    Action.RAISE_MAX_NUM_BATCHED_TOKENS: "--max_num_tokens",
    Action.RAISE_MAX_LORAS: "lora_config.max_loras",
    Action.SCALE_PREFILL_SIDE: "context servers (disaggregated serving)",
    Action.ADD_REPLICA: "replicas",
    Action.RESTART_ENGINE: "restart",
}

ENGINE = Engine(
    name="trtllm",
    title="TensorRT-LLM",
    families=KEEP_FAMILIES,
    keep_family=keep_family,
    recognise=recognise,
    read=read,
    flags=FLAGS,
    # No sleep state, no LoRA queue, no KV-transfer stages and no preemption counter in its metrics; no per-step token
    # data read, and prompt tokens counted as requests end: the step budget is not observed.
    shows=frozenset(Bottleneck)
    - {Bottleneck.ASLEEP, Bottleneck.MAX_LORAS, Bottleneck.KV_TRANSFER, Bottleneck.TOKEN_BUDGET},
    metrics_path="/prometheus/metrics",
    cannot_tell="preemptions (it pauses requests instead); whether --max_num_tokens binds (no per-step data read; "
    "tokens counted as requests end); Triton's form exports no token counters; the first trtllm-serve builds "
    "(latency histograms only) export no request count: undetermined",
)
