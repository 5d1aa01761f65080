"""llama.cpp's adapter: ``llama-server --metrics`` (tools/server, ggml-org/llama.cpp) onto the snapshot.

``llamacpp:`` families carry no labels and no histograms: one engine per server. What they mean here (read from the
server's ``/metrics`` handler and from a real server under load, tests/fixtures/engines/llamacpp):
- ``requests_processing`` is the slots busy; ``requests_deferred`` the requests waiting because no slot was free
  (the server defers a task when ``get_available_slot`` finds none). So while requests are deferred, the busy slots
  *are* the slot count (``--parallel``): the ceiling is read, not inferred.
- ``prompt_tokens_total`` (computed, cached ones excluded: ``prompt_tokens_cached_total`` counts those) moves when a
  prompt is processed, ``tokens_predicted_total`` only when a request ends; ``n_decode_total`` (one per
  ``llama_decode`` call) moves while tokens flow, so it is the engine's progress (a stall is no decode).
- ``n_busy_slots_per_decode`` is a lifetime average (busy slots / decodes since start), not the current value: not read.
- ``kv_cache_usage_ratio`` / ``kv_cache_tokens`` exist only in older builds. A current build leaves no trace of a
  full KV cache in ``/metrics`` (requests fail with HTTP 500 "context size has been exceeded"): where no KV gauge is
  exported, the KV cache is not judged, and the diagnosis says so.
"""

from __future__ import annotations

import math

from kvwatch.catalog import Action, Bottleneck
from kvwatch.engines import Engine
from kvwatch.engines._common import engine_index
from kvwatch.parse import Family
from kvwatch.snapshot import Counter, EngineSnapshot, Gauge

__all__ = ["ENGINE", "FLAGS", "keep_family", "read"]

_P = "llamacpp:"
PROCESSING, DEFERRED = _P + "requests_processing", _P + "requests_deferred"
GAUGES: dict[str, Gauge] = {
    PROCESSING: Gauge.REQUESTS_RUNNING,
    DEFERRED: Gauge.REQUESTS_WAITING,
    _P + "kv_cache_usage_ratio": Gauge.KV_CACHE_USAGE_RATIO,  # older builds only
}
# Counters by family name (the parser's: without _total).
COUNTERS: dict[str, Counter] = {
    _P + "prompt_tokens": Counter.PROMPT_TOKENS,
    _P + "tokens_predicted": Counter.GENERATION_TOKENS,
    _P + "n_decode": Counter.ENGINE_STEPS,
}
CACHED = _P + "prompt_tokens_cached"  # newer builds: prompt tokens reused from the prompt cache
KEEP_FAMILIES = frozenset([*GAUGES, *COUNTERS, CACHED])


def keep_family(name: str) -> bool:
    return name in KEEP_FAMILIES


def recognise(name: str) -> bool:
    return name.startswith(_P)


def read(families: dict[str, Family], max_engines: int = 64) -> dict[tuple[str, str], EngineSnapshot]:
    """One snapshot (model "", engine "0"): the server's families have no labels. Empty without its request gauges."""
    snap, out = engine_index(max_engines)
    for name, canon in GAUGES.items():
        fam = families.get(name)
        for smp in fam.samples if fam is not None else ():
            if math.isfinite(smp.value):
                snap(smp.labels).gauges[canon] = smp.value
    if not out:
        return out
    for name, counter in COUNTERS.items():
        fam = families.get(name)
        for smp in fam.samples if fam is not None else ():
            if math.isfinite(smp.value) and not smp.name.endswith("_created"):
                snap(smp.labels).counters[counter] = smp.value
    cached = families.get(CACHED)
    for smp in cached.samples if cached is not None else ():
        c = snap(smp.labels).counters
        if math.isfinite(smp.value) and Counter.PROMPT_TOKENS in c:  # prompt_tokens_total excludes cached ones
            c[Counter.PROMPT_TOKENS_COMPUTED] = c[Counter.PROMPT_TOKENS]
            c[Counter.PROMPT_TOKENS] += smp.value
    for s in out.values():
        s.max_running_requests = _slots_when_deferring(s)
        s.tokens_at_request_end = True  # tokens_predicted_total moves when a request ends
    return out


def _slots_when_deferring(s: EngineSnapshot) -> int | None:
    """Requests are deferred only when no slot is free: then the busy slots are all of them (--parallel)."""
    busy, deferred = s.gauges.get(Gauge.REQUESTS_RUNNING), s.gauges.get(Gauge.REQUESTS_WAITING)
    return int(busy) if busy and deferred and deferred > 0 else None


# llama-server's spelling of each action (tools/server/README.md).
FLAGS: dict[Action, str] = {
    Action.FP8_KV_CACHE: "--cache-type-k q8_0 --cache-type-v q8_0",
    Action.ENABLE_PREFIX_CACHING: "--cache-reuse (prompt caching is on by default)",
    Action.REDUCE_MAX_MODEL_LEN: "--ctx-size / --parallel (each slot's context)",
    Action.RAISE_GPU_MEMORY_UTILIZATION: "--ctx-size (and --n-gpu-layers)",
    Action.RAISE_KV_CACHE_MEMORY_BYTES: "--ctx-size",
    Action.RAISE_MAX_NUM_SEQS: "--parallel",
    Action.LOWER_MAX_NUM_SEQS: "--parallel",
    Action.RAISE_MAX_NUM_BATCHED_TOKENS: "--batch-size / --ubatch-size",
    Action.RAISE_MAX_LORAS: "--lora (adapters are loaded at start)",
    Action.SCALE_PREFILL_SIDE: "-",
    Action.ADD_REPLICA: "replicas",
    Action.RESTART_ENGINE: "restart",
}

ENGINE = Engine(
    name="llamacpp",
    title="llama.cpp",
    families=KEEP_FAMILIES,
    keep_family=keep_family,
    recognise=recognise,
    read=read,
    flags=FLAGS,
    # No step histogram (the token budget), no LoRA queue, no P/D, no sleep state in its metrics.
    shows=frozenset(Bottleneck)
    - {Bottleneck.ASLEEP, Bottleneck.MAX_LORAS, Bottleneck.KV_TRANSFER, Bottleneck.TOKEN_BUDGET},
    cannot_tell="the KV cache in current builds (no KV gauge; a full context fails requests: HTTP 400, older builds 500), and the "
    "slot count while no request is deferred",
)
