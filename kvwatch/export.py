"""Re-export the diagnosis as Prometheus metrics: the families of ``kvwatch.catalog.FAMILIES``.

``KvwatchCollector.collect()`` builds fresh metric families from the targets' latest state on every call,
into kvwatch's own ``CollectorRegistry``: a series that vanishes upstream (or goes stale) vanishes here
too, instead of repeating an old value. ``export`` only reads the targets; it never changes them.

Example (one engine in a KV-bound state)::

    kvwatch_up{target="http://127.0.0.1:8000/metrics"} 1.0
    kvwatch_kv_cache_usage_ratio{engine="0",model_name="m",target="..."} 0.95
    kvwatch_bottleneck{bottleneck="kv_cache",engine="0",model_name="m",target="..."} 1.0
    kvwatch_diagnosis_confidence{confidence="high",engine="0",model_name="m",target="..."} 1.0
    kvwatch_recommendation{action="fp8_kv_cache",engine="0",model_name="m",target="..."} 1.0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kvwatch import __version__
from kvwatch.catalog import (
    CAPACITY_LIMITS,
    ENGINE,
    FAMILIES,
    Action,
    Bottleneck,
    Confidence,
    Family,
    KvPressure,
    ScrapeReason,
)
from kvwatch.diagnose import Diagnosis
from kvwatch.snapshot import KV_FETCH_STAGES, MAX_LABEL_CHARS, MAX_REJECTION_REASONS
from kvwatch.state import Target
from kvwatch.window import QUANTILES

__all__ = ["KvwatchCollector", "worst_case"]

# Plain per-engine gauges: (family, how to read its value from Signals).
_ENGINE_GAUGES = [(f, attrgetter(f.signal)) for f in FAMILIES if f.signal]
_QUANTILES = [f for f in FAMILIES if f.labels[-1:] == ("quantile",)]

# The catalogue's families are gauges and counters (prometheus_client's Metric has no add_metric).
_Metric = GaugeMetricFamily | CounterMetricFamily


def _new(f: Family) -> _Metric:
    cls = CounterMetricFamily if f.type == "counter" else GaugeMetricFamily
    return cls(f.name, f.help, labels=list(f.labels))


class KvwatchCollector(Collector):
    """Every family of the catalogue, from ``targets()`` at the moment of the scrape."""

    def __init__(self, targets: Callable[[], Iterable[Target]], tasks: Callable[[], int] | None = None):
        self._targets = targets
        self._tasks = tasks  # the served app counts its event loop's tasks; offline uses have none

    def describe(self):
        return []  # unchecked collector: families depend on the data

    def collect(self):
        fams = {f.name: _new(f) for f in FAMILIES}
        fams["kvwatch_build_info"].add_metric([__version__], 1)
        if self._tasks is not None:
            fams["kvwatch_asyncio_tasks"].add_metric([], self._tasks())
        for t in self._targets():
            _add_target(fams, t)
        yield from fams.values()


def _add_target(fams: dict[str, _Metric], t: Target) -> None:
    name = t.target
    fams["kvwatch_up"].add_metric([name], 1.0 if t.up else 0.0)
    fams["kvwatch_folded_engines"].add_metric([name], t.folded_engines)
    if t.engine_kind is not None:
        fams["kvwatch_target_info"].add_metric([name, t.engine_kind.name], 1.0)
    if t.scrape_duration_seconds is not None:
        fams["kvwatch_scrape_duration_seconds"].add_metric([name], t.scrape_duration_seconds)
    for reason, n in t.errors.items():
        fams["kvwatch_scrape_errors"].add_metric([name, reason], n)
    diag = t.diagnosis
    if diag is None:
        return
    for b in Bottleneck:
        fams["kvwatch_target_bottleneck"].add_metric([name, b], 1.0 if diag.bottleneck == b else 0.0)
    for d in diag.engines:
        _add_engine(fams, [name, d.model_name, d.engine], d)


def _add_engine(fams: dict[str, _Metric], labels: list[str], d: Diagnosis) -> None:
    s = d.signals
    for f, value in _ENGINE_GAUGES:
        v = value(s)
        if v is not None:
            fams[f.name].add_metric(labels, float(v))
    for f in _QUANTILES:
        for q, v in s.latency.quantiles.get(f.name.removeprefix("kvwatch_"), {}).items():
            fams[f.name].add_metric([*labels, str(q)], v)
    for stage, n in s.queue.kv_fetch:
        fams["kvwatch_kv_fetch_requests"].add_metric([*labels, stage], n)
    for reason, rate in s.throughput.rejections_per_second:
        fams["kvwatch_rejections_per_second"].add_metric([*labels, reason], rate)
    if s.throughput.gap_fraction is not None:
        fams["kvwatch_throughput_gap"].add_metric(labels, 1.0 if s.throughput.gap else 0.0)
    if s.kv.recent_max is not None:
        for k in KvPressure:
            fams["kvwatch_kv_cache_pressure"].add_metric([*labels, k], 1.0 if d.kv_pressure == k else 0.0)
    for fam, limit in (
        ("kvwatch_max_num_seqs", d.max_num_seqs),
        ("kvwatch_max_num_batched_tokens", d.max_num_batched_tokens),
    ):
        if limit is not None:
            fams[fam].add_metric([*labels, limit[1]], limit[0])
    if s.capacity.lora_running is not None:
        fams["kvwatch_lora_adapters"].add_metric([*labels, "running"], s.capacity.lora_running)
    if s.capacity.lora_waiting is not None:  # unknown for SGLang: no 0 that would say none wait
        fams["kvwatch_lora_adapters"].add_metric([*labels, "waiting"], s.capacity.lora_waiting)
    _add_capacity(fams, labels, d)
    for b in Bottleneck:
        fams["kvwatch_bottleneck"].add_metric([*labels, b], 1.0 if d.bottleneck == b else 0.0)
    for c in Confidence:
        fams["kvwatch_diagnosis_confidence"].add_metric([*labels, c], 1.0 if d.confidence == c else 0.0)
    for r in d.recommendations:
        fams["kvwatch_recommendation"].add_metric([*labels, r.action], 1.0)


def _add_capacity(fams: dict[str, _Metric], labels: list[str], d: Diagnosis) -> None:
    for limit, v in d.capacity_sequences.items():
        fams["kvwatch_capacity_sequences"].add_metric([*labels, limit], v)
    if d.capacity_sequences_effective is not None:
        fams["kvwatch_capacity_sequences_effective"].add_metric(labels, d.capacity_sequences_effective)
    if d.demand_sequences is not None:
        fams["kvwatch_demand_sequences"].add_metric(labels, d.demand_sequences)


# How many series a label beyond (target, model_name, engine) can take per engine or target (see _add_engine):
# one limit value per engine whatever its source, LoRA running and waiting.
_LABEL_VALUES = {
    "quantile": len(QUANTILES),
    "reason": len(ScrapeReason),
    "bottleneck": len(Bottleneck),
    "confidence": len(Confidence),
    "action": len(Action),
    "source": 1,
    "engine_type": 1,  # kvwatch_target_info: the one engine a target is read as
    "limit": len(CAPACITY_LIMITS),  # kvwatch_capacity_sequences: one per limit kvwatch/capacity.py reports
}
_STATE_VALUES = {"kvwatch_kv_cache_pressure": len(KvPressure), "kvwatch_lora_adapters": 2}
# Per-family label counts where a label name means different things (reason: scrape errors vs admission).
_FAMILY_VALUES = {
    ("kvwatch_rejections_per_second", "reason"): MAX_REJECTION_REASONS,
    ("kvwatch_kv_fetch_requests", "stage"): len(KV_FETCH_STAGES),
}
VALUE_CHARS = 24  # the longest float repr: -1.2345678901234567e-308


def _series_per_key(f: Family) -> int:
    n = 1
    for label in f.labels:
        if (f.name, label) in _FAMILY_VALUES:
            n *= _FAMILY_VALUES[(f.name, label)]
        elif label == "state":
            n *= _STATE_VALUES[f.name]
        elif label not in ("target", "model_name", "engine", "version"):
            n *= _LABEL_VALUES[label]
    return n


def worst_case(targets: int, max_engines: int, target_chars: int) -> tuple[int, int]:
    """(series, bytes) of kvwatch's own /metrics at most, in the text format: every family at its most series
    for ``targets`` targets of ``max_engines`` + 1 engines each (the overflow one), every label value as long
    as it can be and every character escaped (``\\``, twice as long). The README states it for the defaults
    (docs/generate.py); tests/test_faults.py checks a /metrics that 10,000 engines with 1 MB labels produced."""
    engines = targets * (max_engines + 1)
    label_chars = 2 * MAX_LABEL_CHARS  # shortened, then escaped
    series = size = 0
    for f in FAMILIES:
        keys = engines if f.labels[: len(ENGINE)] == ENGINE else targets if "target" in f.labels else 1
        n = keys * _series_per_key(f)
        line = len(f.sample_name) + 2 + VALUE_CHARS + 1  # name, braces, space, value, newline
        for label in f.labels:
            value = 2 * target_chars if label == "target" else label_chars
            line += len(label) + 4 + value  # label="value",
        series += n
        size += n * line + len(f"# HELP {f.sample_name} {f.help}\n# TYPE {f.sample_name} {f.type}\n") + 64
    return series, size
