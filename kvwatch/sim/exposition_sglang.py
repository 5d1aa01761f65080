"""The simulated engine as SGLang's ``/metrics`` (``sglang:`` families; tests/fixtures/engines/sglang/FAMILIES.md on
the engine-data branch, read from SGLang's python/sglang/srt/metrics/collector.py).

The same simulation as vLLM's exposition, spelled and counted as SGLang does:

* Two sides, as in SGLang. The **scheduler** (one per data-parallel rank) labels its families ``model_name``,
  ``engine_type`` (``unified``; ``decode`` for a P/D decode server), ``tp_rank``, ``pp_rank`` and, when data
  parallel (``--engines`` > 1), ``dp_rank``: the running batch, the waiting queue, the KV pool (``token_usage``,
  ``num_used_tokens``, ``max_total_num_tokens``), retractions (SGLang's preemption), ``gen_throughput`` (set at each
  stats log: every prefill batch and every 40th decode batch, kvwatch.sim.engine's ``logged``) and
  ``realtime_tokens_total{mode}``, which SGLang adds as its scheduler batches the tokens: each prefill batch's
  chunks (a long prompt chunk by chunk) and each decode step's tokens (kvwatch.sim.engine's ``_count_realtime``).
  The **tokenizer manager** (one per server, ``model_name`` and ``engine_type`` only) counts tokens when a request
  *finishes* (``observe_one_finished_request``), so ``prompt_tokens_total`` / ``generation_tokens_total`` move in
  lumps, and observes TTFT, inter-token latency and end-to-end latency over every rank's requests.
* A P/D decode server's requests waiting for KV room or for their KV to arrive are in the decode prealloc / transfer
  queues, not in ``num_queue_reqs`` (the simulator's KV-fetch stages ``waiting_to_start`` / ``in_progress``).
* With LoRA (``max_loras`` > 0, SGLang's ``--enable-lora``), ``lora_pool_slots_used`` (the distinct adapters of the
  running batch), ``lora_pool_slots_total`` (``--max-loras-per-batch``) and ``lora_pool_utilization``: which adapters
  wait is not exported, as in SGLang. The simulator's base-model requests take no slot (vLLM's rule; SGLang's
  admission counts the base model as one, its gauge does not).
* No ``_created`` series (prometheus_client in multiprocess mode). Histogram bounds are the simulator's (vLLM's):
  SGLang takes TTFT / ITL / e2e bounds from ``--bucket-*`` flags, so these are bounds it can serve.
* Simplified: the gauges are published after every step (SGLang sets them at its stats log only), and
  ``cache_hit_rate`` is the lifetime ratio (SGLang's is the last prefill batch's).

Example (abridged)::

    # HELP sglang:num_running_reqs Requests in the running batch.
    # TYPE sglang:num_running_reqs gauge
    sglang:num_running_reqs{model_name="tiny-llama-dummy",engine_type="unified",tp_rank="0",pp_rank="0"} 16.0
"""

from __future__ import annotations

from ._text import Labels, Text, merged

__all__ = ["render"]

P = "sglang:"


def _scheduler_labels(sim) -> list[Labels]:
    cfg = sim.engines[0].cfg
    engine_type = "decode" if cfg.kv_transfer_tokens_per_s else "unified"
    base: Labels = (("model_name", cfg.model_name), ("engine_type", engine_type), ("tp_rank", "0"), ("pp_rank", "0"))
    if len(sim.engines) == 1:
        return [base]
    return [(*base, ("dp_rank", str(e.index))) for e in sim.engines]


def render(sim, version: str | None = None) -> str:
    """The ``/metrics`` body for ``sim`` as SGLang prints it (one version: the current label set)."""
    out = Text()
    labels = _scheduler_labels(sim)
    _scheduler_gauges(out, sim, labels)
    _scheduler_counters(out, sim, labels)
    _tokenizer_families(out, sim, labels[0][:2])
    return out.text()


def _scheduler_gauges(out: Text, sim, labels: list[Labels]) -> None:
    engines = sim.engines
    pool = [e.usable * e.bs for e in engines]  # the KV pool in tokens: SGLang's pool is token-granular
    fetch = [e.stats.kv_fetch for e in engines]

    def gauge(name: str, help_: str, values) -> None:
        out.family(P + name, help_, "gauge", zip(labels, values, strict=True))

    gauge("num_running_reqs", "Requests in the running batch.", [e.stats.running for e in engines])
    gauge(
        "num_used_tokens",
        "Tokens held in the KV pool.",
        [round(e.stats.kv_usage * n) for e, n in zip(engines, pool, strict=True)],
    )
    gauge("token_usage", "Share of the KV pool in use.", [e.stats.kv_usage for e in engines])
    gauge(
        "gen_throughput",
        "Generation tokens per second over the last log interval.",
        [e.stats.logged[2] for e in engines],
    )
    # The waiting queue; a P/D decode server's requests still waiting for KV room or transfer are in their own queues.
    gauge(
        "num_queue_reqs",
        "Requests in the waiting queue.",
        [e.stats.waiting - f[0] - f[1] for e, f in zip(engines, fetch, strict=True)],
    )
    gauge("cache_hit_rate", "Prefix (radix) cache hit rate.", [_hit_rate(e.stats) for e in engines])
    gauge("max_total_num_tokens", "The KV pool's size in tokens.", pool)
    if engines[0].cfg.kv_transfer_tokens_per_s:
        gauge("num_decode_prealloc_queue_reqs", "Requests waiting for KV room to receive into.", [f[0] for f in fetch])
        gauge("num_decode_transfer_queue_reqs", "Requests whose KV is being transferred.", [f[1] for f in fetch])
    if engines[0].cfg.max_loras:  # --enable-lora: the slots, not which adapters wait
        used, total = [len(e.stats.running_loras) for e in engines], [e.cfg.max_loras for e in engines]
        gauge("lora_pool_slots_used", "LoRA adapter slots occupied by the running batch's adapters.", used)
        gauge("lora_pool_slots_total", "LoRA adapter slots (max_loras_per_batch).", total)
        gauge(
            "lora_pool_utilization",
            "LoRA pool utilization (used / total).",
            [u / n for u, n in zip(used, total, strict=True)],
        )
    out.histogram(
        P + "queue_time_seconds",
        "Seconds in the waiting queue.",
        zip(labels, [e.stats.h_queue for e in engines], strict=True),
    )


def _hit_rate(s) -> float:
    return s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0


def _scheduler_counters(out: Text, sim, labels: list[Labels]) -> None:
    stats = [e.stats for e in sim.engines]
    out.family(
        P + "num_retracted_requests_total",
        "Requests retracted (preempted) for lack of KV room.",
        "counter",
        zip(labels, [s.preemptions for s in stats], strict=True),
    )
    rows = []
    for lab, s in zip(labels, stats, strict=True):
        rows += [
            ((*lab, ("mode", m)), v)
            for m, v in (
                ("prefill_compute", s.realtime_prefill_compute),
                ("prefill_cache", s.realtime_prefill_cache),
                ("decode", s.realtime_decode),
            )
        ]
    out.family(P + "realtime_tokens_total", "Tokens processed as the scheduler batches them, by mode.", "counter", rows)


def _tokenizer_families(out: Text, sim, lab: Labels) -> None:
    """One tokenizer manager for every rank: its counters and histograms add the ranks' finished requests."""
    stats = [e.stats for e in sim.engines]
    prompt = sum(s.h_prompt.sum for s in stats)
    computed = sum(s.h_prefill_kv.sum for s in stats)  # prompt tokens not served from the prefix cache

    def counter(name: str, help_: str, value: float) -> None:
        out.family(P + name, help_, "counter", [(lab, value)])

    counter("prompt_tokens_total", "Prompt tokens of finished requests.", prompt)
    counter("generation_tokens_total", "Generated tokens of finished requests.", sum(s.h_generation.sum for s in stats))
    counter(
        "cached_tokens_total", "Prompt tokens of finished requests served from the prefix cache.", prompt - computed
    )
    counter("num_requests_total", "Finished requests.", sum(s.h_e2e.count for s in stats))
    counter("num_aborted_requests_total", "Aborted requests.", sum(s.success["abort"] for s in stats))
    for name, help_, attr in (
        ("time_to_first_token_seconds", "Seconds to a request's first token.", "h_ttft"),
        ("inter_token_latency_seconds", "Seconds between a request's tokens.", "h_itl"),
        ("e2e_request_latency_seconds", "Seconds from arrival to a request's end.", "h_e2e"),
        ("num_retractions", "Retractions per finished request.", "h_preemptions"),
    ):
        out.histogram(P + name, help_, [(lab, merged([getattr(s, attr) for s in stats]))])
