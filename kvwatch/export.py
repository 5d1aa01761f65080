"""Re-export the diagnosis as Prometheus metrics.

``KvwatchCollector.collect()`` builds fresh metric families from the latest state on every call, into
kvwatch's own ``CollectorRegistry``: a series that vanishes upstream (or goes stale) vanishes here
too, instead of repeating an old value. The README's metrics table documents every family below.

Example (one engine in a KV-bound state)::

    kvwatch_up{target="http://127.0.0.1:8000/metrics"} 1.0
    kvwatch_kv_cache_usage_ratio{engine="0",model_name="m",target="..."} 0.95
    kvwatch_bottleneck{bottleneck="kv_cache",engine="0",model_name="m",target="..."} 1.0
    kvwatch_recommendation{action="fp8_kv_cache",engine="0",model_name="m",target="..."} 1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvwatch import __version__
from kvwatch.diagnose import BOTTLENECKS, KV_STATES
from kvwatch.scrape import REASONS
from kvwatch.state import TargetDiagnosis

__all__ = ["KvwatchCollector", "TargetStatus", "ENGINE_GAUGES"]

ENGINE_LABELS = ["target", "model_name", "engine"]

# kvwatch metric name (without prefix) -> (Signals attribute, help text)
ENGINE_GAUGES: dict[str, tuple[str, str]] = {
    "kv_cache_usage_ratio": ("kv_cache_usage_ratio", "Fraction of KV-cache blocks in use (0-1)."),
    "kv_cache_capacity_tokens": ("capacity_tokens", "KV cache size in tokens."),
    "kv_cache_free_tokens": ("free_tokens", "KV-cache tokens free: capacity x (1 - usage)."),
    "requests_running": ("requests_running", "Requests in the running batch."),
    "requests_waiting": ("requests_waiting", "Requests in the waiting queue."),
    "prompt_tokens_per_second": ("prompt_tokens_per_second", "Prefill tokens computed per second over the window."),
    "generation_tokens_per_second": ("generation_tokens_per_second", "Generated tokens per second over the window."),
    "preemptions_per_second": ("preemptions_per_second", "Preemptions per second over the window."),
    "engine_step_tokens": ("engine_step_tokens", "Mean tokens scheduled per engine step over the window."),
    "mean_sequence_tokens": ("mean_sequence_tokens", "Mean prompt + generation tokens of finished requests."),
    "estimated_max_concurrency": (
        "estimated_max_concurrency",
        "Sequences the KV cache holds at the observed mean length: capacity / mean sequence tokens.",
    ),
    "concurrency_headroom": ("concurrency_headroom", "Estimated max concurrency minus mean running requests."),
    "kv_cache_seconds_to_full": ("seconds_to_full", "Linear forecast of seconds until KV usage reaches 1 (absent when not rising)."),
    "prefix_cache_hit_ratio": ("prefix_cache_hit_ratio", "Prefix-cache hit tokens / queried tokens over the window."),
}
QUANTILE_GAUGES = {
    "time_to_first_token_seconds": "Time to first token, quantiles over the window.",
    "inter_token_latency_seconds": "Inter-token latency, quantiles over the window.",
    "queue_time_seconds": "Time requests spent waiting, quantiles over the window.",
}


class TargetStatus:
    """What the scrape loop knows about a target besides its diagnosis."""

    def __init__(self, target: str):
        self.target = target
        self.up = False
        self.scrape_duration_seconds: float | None = None
        self.errors = {r: 0 for r in REASONS}
        self.diagnosis: TargetDiagnosis | None = None


class KvwatchCollector(Collector):
    def __init__(self, statuses: Callable[[], Iterable[TargetStatus]]):
        self._statuses = statuses

    def describe(self):
        return []  # unchecked collector: families depend on the data

    def collect(self):
        statuses = list(self._statuses())
        up = GaugeMetricFamily("kvwatch_up", "1 if the last scrape of the target succeeded.", labels=["target"])
        dur = GaugeMetricFamily(
            "kvwatch_scrape_duration_seconds", "Duration of the last scrape (fetch + parse).", labels=["target"]
        )
        errs = CounterMetricFamily(
            "kvwatch_scrape_errors", "Failed scrapes of the target, by reason.", labels=["target", "reason"]
        )
        tb = GaugeMetricFamily(
            "kvwatch_target_bottleneck",
            "Most severe bottleneck across the target's engines (state set).",
            labels=["target", "bottleneck"],
        )
        info = GaugeMetricFamily("kvwatch_build_info", "kvwatch version.", labels=["version"])
        info.add_metric([__version__], 1)

        gauges = {
            name: GaugeMetricFamily("kvwatch_" + name, help_, labels=ENGINE_LABELS)
            for name, (_, help_) in ENGINE_GAUGES.items()
        }
        quantiles = {
            name: GaugeMetricFamily("kvwatch_" + name, help_, labels=ENGINE_LABELS + ["quantile"])
            for name, help_ in QUANTILE_GAUGES.items()
        }
        gap = GaugeMetricFamily(
            "kvwatch_throughput_gap",
            "1 while prompt throughput is ~0, generation continues and requests wait (last interval).",
            labels=ENGINE_LABELS,
        )
        pressure = GaugeMetricFamily(
            "kvwatch_kv_cache_pressure", "KV-cache pressure state set: ok, admission_stall, preemption_risk.",
            labels=ENGINE_LABELS + ["state"],
        )
        seqs = GaugeMetricFamily(
            "kvwatch_max_num_seqs", "The max_num_seqs ceiling, configured or inferred.", labels=ENGINE_LABELS + ["source"]
        )
        budget = GaugeMetricFamily(
            "kvwatch_max_num_batched_tokens",
            "The per-step token budget, configured or inferred.",
            labels=ENGINE_LABELS + ["source"],
        )
        lora = GaugeMetricFamily("kvwatch_lora_adapters", "LoRA adapters running / waiting.", labels=ENGINE_LABELS + ["state"])
        bott = GaugeMetricFamily(
            "kvwatch_bottleneck", "Which limit binds the engine (state set: exactly one is 1).",
            labels=ENGINE_LABELS + ["bottleneck"],
        )
        recs = GaugeMetricFamily(
            "kvwatch_recommendation", "1 per active recommendation for the engine.", labels=ENGINE_LABELS + ["action"]
        )

        for st in statuses:
            t = st.target
            up.add_metric([t], 1.0 if st.up else 0.0)
            if st.scrape_duration_seconds is not None:
                dur.add_metric([t], st.scrape_duration_seconds)
            for reason, n in st.errors.items():
                errs.add_metric([t, reason], n)
            diag = st.diagnosis
            if diag is None:
                continue
            for b in BOTTLENECKS:
                tb.add_metric([t, b], 1.0 if diag.bottleneck == b else 0.0)
            for d in diag.engines:
                labels = [t, d.model_name, d.engine]
                s = d.signals
                for name, (attr, _) in ENGINE_GAUGES.items():
                    v = getattr(s, attr)
                    if v is not None:
                        gauges[name].add_metric(labels, float(v))
                for name, qs in s.quantiles.items():
                    for q, v in qs.items():
                        quantiles[name].add_metric(labels + [str(q)], v)
                if s.throughput_gap_fraction is not None:
                    gap.add_metric(labels, 1.0 if s.throughput_gap else 0.0)
                if s.kv_usage_recent_max is not None:
                    for k in KV_STATES:
                        pressure.add_metric(labels + [k], 1.0 if d.kv_pressure == k else 0.0)
                if d.max_num_seqs is not None:
                    seqs.add_metric(labels + [d.max_num_seqs[1]], d.max_num_seqs[0])
                if d.max_num_batched_tokens is not None:
                    budget.add_metric(labels + [d.max_num_batched_tokens[1]], d.max_num_batched_tokens[0])
                if s.lora_running is not None:
                    lora.add_metric(labels + ["running"], s.lora_running)
                    lora.add_metric(labels + ["waiting"], s.lora_waiting or 0)
                for b in BOTTLENECKS:
                    bott.add_metric(labels + [b], 1.0 if d.bottleneck == b else 0.0)
                for r in d.recommendations:
                    recs.add_metric(labels + [r.action], 1.0)

        yield from (up, dur, errs, info, tb)
        yield from gauges.values()
        yield from quantiles.values()
        yield from (gap, pressure, seqs, budget, lora, bott, recs)
