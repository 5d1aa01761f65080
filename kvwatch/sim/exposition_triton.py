"""The simulated engine as Triton's TensorRT-LLM backend (``nv_trt_llm_*`` gauges; tests/fixtures/engines/trtllm/
FAMILIES.md section 2 on the engine-data branch, from the backend's custom_metrics_reporter.cc).

Every family is a gauge told apart by one selector label, per Triton ``model`` (``tensorrt_llm``) and ``version``:
``nv_trt_llm_request_metrics{request_type}`` (``active`` = running, ``max`` = ``max_batch_size``, ``scheduled``,
``context``, ``waiting``), ``nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`` (``max``, ``free``, ``used``,
``tokens_per``, ``reused``, ``fraction`` = used / max), ``nv_trt_llm_inflight_batcher_metrics`` (this iteration's
context tokens and generation requests, paused requests) and ``nv_trt_llm_general_metrics`` (iteration counter,
timestamp in µs). No token counters: Triton's ``nv_inference_*`` families count requests, not tokens, and are
left out here. One engine (the simulator refuses ``--engines`` > 1). Labels sorted, as Triton's prometheus-cpp
prints them.
"""

from __future__ import annotations

from ._text import Text

__all__ = ["render"]


def render(sim, version: str | None = None) -> str:
    (e,) = sim.engines
    s, cfg = e.stats, e.cfg
    used = e.usable - round((1.0 - s.kv_usage) * e.usable)
    paused = sum(1 for r in e.waiting if r.num_preemptions)
    decoding = sum(1 for r in e.running if r.output > 0)
    groups = (
        (
            "nv_trt_llm_request_metrics",
            "TRT LLM request metrics",
            "request_type",
            # active: in flight; scheduled: in this iteration (the simulator schedules every running request)
            (
                ("active", s.running),
                ("context", s.running - decoding),
                ("max", cfg.max_num_seqs),
                ("scheduled", s.running),
                ("waiting", s.waiting),
            ),
        ),
        (
            "nv_trt_llm_kv_cache_block_metrics",
            "TRT LLM KV cache block metrics",
            "kv_cache_block_type",
            (
                ("fraction", s.kv_usage),
                ("free", e.usable - used),
                ("max", e.usable),
                ("reused", s.prefix_hits // e.bs),
                ("tokens_per", e.bs),
                ("used", used),
            ),
        ),
        (
            "nv_trt_llm_inflight_batcher_metrics",
            "TRT LLM inflight batcher metrics",
            "inflight_batcher_specific_metric",
            (("generation_requests", decoding), ("micro_batch_id", 0), ("paused_requests", paused)),
        ),
        (
            "nv_trt_llm_general_metrics",
            "General TRT LLM metrics",
            "general_type",
            (("iteration_counter", s.steps), ("timestamp", int(sim.virtual_time * 1e6))),
        ),
    )
    out = Text()
    for name, help_, selector, values in groups:
        rows = [
            (tuple(sorted((("model", "tensorrt_llm"), (selector, kind), ("version", "1")))), v) for kind, v in values
        ]
        out.family(name, help_, "gauge", rows, fmt=_num)
    return out.text()


def _num(v: float) -> str:
    return str(v) if isinstance(v, int) else repr(float(v))
