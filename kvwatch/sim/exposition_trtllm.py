"""The simulated engine as ``trtllm-serve``'s Prometheus text (``trtllm_`` families; tests/fixtures/engines/trtllm/
FAMILIES.md on the engine-data branch, read from TensorRT-LLM's tensorrt_llm/metrics/collector.py).

Served at ``/prometheus/metrics`` (kvwatch.sim.server); ``/metrics`` answers JSON iteration stats, as trtllm-serve's
does (``iteration_stats``). Labels ``model_name`` and ``engine_type`` (``undefined``, as in the first published dump)
on every series; one executor per server, so one engine (the simulator refuses ``--engines`` > 1).

What differs from vLLM's view of the same simulation:

* The ceilings are exported: ``max_num_active_requests`` and ``max_batch_size_*`` are ``--max_batch_size`` (the
  simulator's max_num_seqs), ``max_num_tokens_runtime`` is ``--max_num_tokens`` (max_num_batched_tokens).
* The KV pool in blocks (max / free / used, tokens per block) and ``kv_cache_utilization`` = used / max.
* No preemption counter: TensorRT-LLM pauses requests instead; ``num_paused_requests`` is the waiting requests the
  simulated scheduler preempted.
* Token counters and ``request_success_total{finished_reason}`` count a request when it finishes.
* Histogram bounds are the simulator's (vLLM's). No ``_created`` series.
"""

from __future__ import annotations

from ._text import Labels, Text

__all__ = ["iteration_stats", "render"]

P = "trtllm_"


def render(sim, version: str | None = None) -> str:
    """The ``/prometheus/metrics`` body for ``sim`` as trtllm-serve prints it (current builds: ``trtllm_`` names)."""
    (e,) = sim.engines
    s, cfg = e.stats, e.cfg
    lab: Labels = (("model_name", cfg.model_name), ("engine_type", "undefined"))
    out = Text()
    used = e.usable - round((1.0 - s.kv_usage) * e.usable)
    paused = sum(1 for r in e.waiting if r.num_preemptions)
    for name, help_, value in (
        ("num_requests_running", "Active requests.", s.running),
        ("num_requests_waiting", "Queued requests.", s.waiting),
        ("num_paused_requests", "Requests paused to free KV cache.", paused),
        ("max_num_active_requests", "The active-request ceiling.", cfg.max_num_seqs),
        ("max_batch_size_static", "max_batch_size as configured.", cfg.max_num_seqs),
        ("max_batch_size_runtime", "max_batch_size at runtime.", cfg.max_num_seqs),
        ("max_num_tokens_runtime", "max_num_tokens at runtime: tokens per iteration.", cfg.max_num_batched_tokens),
        ("kv_cache_max_blocks", "KV cache blocks in the pool.", e.usable),
        ("kv_cache_free_blocks", "KV cache blocks free.", e.usable - used),
        ("kv_cache_used_blocks", "KV cache blocks in use.", used),
        ("kv_cache_tokens_per_block", "Tokens per KV cache block.", e.bs),
        ("kv_cache_utilization", "KV cache blocks in use over the pool.", s.kv_usage),
        ("kv_cache_hit_rate", "Prefix reuse: tokens found in the KV cache over tokens looked up.", _hit_rate(s)),
    ):
        out.family(P + name, help_, "gauge", [(lab, value)])
    finished = s.h_e2e.count
    prompt, computed = s.h_prompt.sum, s.h_prefill_kv.sum
    for name, help_, value in (
        ("num_requests_completed_total", "Requests completed.", finished),
        ("prompt_tokens_total", "Prompt tokens of finished requests.", prompt),
        ("generation_tokens_total", "Generated tokens of finished requests.", s.h_generation.sum),
        (
            "prompt_cached_tokens_total",
            "Prompt tokens of finished requests reused from the KV cache.",
            prompt - computed,
        ),
    ):
        out.family(P + name, help_, "counter", [(lab, value)])
    out.family(
        P + "request_success_total",
        "Requests finished, by reason.",
        "counter",
        [((*lab, ("finished_reason", r)), s.success[r]) for r in ("stop", "length")],
    )
    for name, help_, h in (
        ("e2e_request_latency_seconds", "Seconds from arrival to a request's end.", s.h_e2e),
        ("time_to_first_token_seconds", "Seconds to a request's first token.", s.h_ttft),
        ("time_per_output_token_seconds", "Seconds per output token after the first.", s.h_tpot),
        ("request_queue_time_seconds", "Seconds queued before scheduling.", s.h_queue),
    ):
        out.histogram(P + name, help_, [(lab, h)])
    return out.text()


def _hit_rate(s) -> float:
    return s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0


def iteration_stats(sim) -> list[dict]:
    """trtllm-serve's ``/metrics``: JSON iteration stats (the executor's, camelCase). The real one returns the stats
    queued since the last call; this one the latest iteration's."""
    (e,) = sim.engines
    s, cfg = e.stats, e.cfg
    used = e.usable - round((1.0 - s.kv_usage) * e.usable)
    return [
        {
            "iter": s.steps,
            "timestamp": f"{sim.virtual_time:.6f}",
            "numActiveRequests": s.running,
            "numQueuedRequests": s.waiting,
            "maxNumActiveRequests": cfg.max_num_seqs,
            "maxBatchSizeRuntime": cfg.max_num_seqs,
            "maxNumTokensRuntime": cfg.max_num_batched_tokens,
            "kvCacheStats": {
                "maxNumBlocks": e.usable,
                "freeNumBlocks": e.usable - used,
                "usedNumBlocks": used,
                "tokensPerBlock": e.bs,
            },
        }
    ]
