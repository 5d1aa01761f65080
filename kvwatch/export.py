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
from prometheus_client.utils import floatToGoString

from kvwatch import __version__
from kvwatch.diagnose import BOTTLENECKS, KV_STATES
from kvwatch.scrape import REASONS
from kvwatch.state import TargetDiagnosis

__all__ = ["KvwatchCollector", "TargetStatus", "ENGINE_GAUGES", "render"]

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


def _esc(value: str) -> str:
    """A label value as prometheus_client escapes it (both text formats)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')


def _help_line(name: str, help_: str, openmetrics: bool) -> str:
    text = help_.replace("\\", r"\\").replace("\n", r"\n")
    if openmetrics:
        text = text.replace('"', r'\"')
    return f"# HELP {name} {text}\n"


def _headers(openmetrics: bool) -> dict[str, str]:
    """'# HELP' and '# TYPE' lines of every family, as prometheus_client writes them."""
    fams = [
        ("kvwatch_up", "gauge", _UP_HELP),
        ("kvwatch_scrape_duration_seconds", "gauge", _DUR_HELP),
        ("kvwatch_scrape_errors", "counter", _ERRS_HELP),
        ("kvwatch_build_info", "gauge", _INFO_HELP),
        ("kvwatch_target_bottleneck", "gauge", _TB_HELP),
        *(("kvwatch_" + n, "gauge", h) for n, (_, h) in ENGINE_GAUGES.items()),
        *(("kvwatch_" + n, "gauge", h) for n, h in QUANTILE_GAUGES.items()),
        ("kvwatch_throughput_gap", "gauge", _GAP_HELP),
        ("kvwatch_kv_cache_pressure", "gauge", _PRESSURE_HELP),
        ("kvwatch_max_num_seqs", "gauge", _SEQS_HELP),
        ("kvwatch_max_num_batched_tokens", "gauge", _BUDGET_HELP),
        ("kvwatch_lora_adapters", "gauge", _LORA_HELP),
        ("kvwatch_bottleneck", "gauge", _BOTT_HELP),
        ("kvwatch_recommendation", "gauge", _RECS_HELP),
    ]
    out = {}
    for name, typ, help_ in fams:
        shown = name + "_total" if typ == "counter" and not openmetrics else name
        out[name] = _help_line(shown, help_, openmetrics) + f"# TYPE {shown} {typ}\n"
    return out


_UP_HELP = "1 if the last scrape of the target succeeded."
_DUR_HELP = "Duration of the last scrape (fetch + parse)."
_ERRS_HELP = "Failed scrapes of the target, by reason."
_TB_HELP = "Most severe bottleneck across the target's engines (state set)."
_INFO_HELP = "kvwatch version."
_GAP_HELP = "1 while prompt throughput is ~0, generation continues and requests wait (last interval)."
_PRESSURE_HELP = "KV-cache pressure state set: ok, admission_stall, preemption_risk."
_SEQS_HELP = "The max_num_seqs ceiling, configured or inferred."
_BUDGET_HELP = "The per-step token budget, configured or inferred."
_LORA_HELP = "LoRA adapters running / waiting."
_BOTT_HELP = "Which limit binds the engine (state set: exactly one is 1)."
_RECS_HELP = "1 per active recommendation for the engine."


def render(statuses: Iterable[TargetStatus], openmetrics: bool = False) -> bytes:
    """The ``/metrics`` body: byte for byte what ``prometheus_client`` writes for ``KvwatchCollector``
    (``generate_latest``, or the OpenMetrics 1.0.0 ``generate_latest`` when ``openmetrics``), without
    building its metric objects: label strings are made once per target and engine, and the 0/1 of
    the state sets are constants. Labels appear sorted by name, as prometheus_client sorts them.
    ``tests/test_bench_equivalence.py`` holds the two outputs equal.
    """
    heads = _HEADERS_OM if openmetrics else _HEADERS_TEXT
    up, dur, errs, tb = [], [], [], []
    gauges: dict[str, list[str]] = {name: [] for name in ENGINE_GAUGES}
    quantiles: dict[str, list[str]] = {name: [] for name in QUANTILE_GAUGES}
    gap, pressure, seqs, budget, lora, bott, recs = [], [], [], [], [], [], []
    gauge_attrs = [(gauges[name], attr) for name, (attr, _) in ENGINE_GAUGES.items()]
    one, zero = " 1.0\n", " 0.0\n"
    for st in statuses:
        tl = f'target="{_esc(st.target)}"'
        up.append(f"kvwatch_up{{{tl}}}{one if st.up else zero}")
        if st.scrape_duration_seconds is not None:
            dur.append(f"kvwatch_scrape_duration_seconds{{{tl}}} {floatToGoString(st.scrape_duration_seconds)}\n")
        for reason, n in st.errors.items():
            errs.append(f'kvwatch_scrape_errors_total{{reason="{_esc(reason)}",{tl}}} {floatToGoString(n)}\n')
        diag = st.diagnosis
        if diag is None:
            continue
        for b in BOTTLENECKS:
            tb.append(f'kvwatch_target_bottleneck{{bottleneck="{b}",{tl}}}{one if diag.bottleneck == b else zero}')
        for d in diag.engines:
            em = f'engine="{_esc(d.engine)}",model_name="{_esc(d.model_name)}"'
            base = f"{em},{tl}"
            s = d.signals
            for lines, attr in gauge_attrs:
                v = getattr(s, attr)
                if v is not None:
                    lines.append(f"{{{base}}} {floatToGoString(v)}\n")
            for name, qs in s.quantiles.items():
                lines = quantiles[name]
                for q, v in qs.items():
                    lines.append(f'{{{em},quantile="{_esc(str(q))}",{tl}}} {floatToGoString(v)}\n')
            if s.throughput_gap_fraction is not None:
                gap.append(f"kvwatch_throughput_gap{{{base}}}{one if s.throughput_gap else zero}")
            if s.kv_usage_recent_max is not None:
                for k in KV_STATES:
                    pressure.append(f'kvwatch_kv_cache_pressure{{{em},state="{k}",{tl}}}{one if d.kv_pressure == k else zero}')
            if d.max_num_seqs is not None:
                seqs.append(
                    f'kvwatch_max_num_seqs{{{em},source="{_esc(d.max_num_seqs[1])}",{tl}}} {floatToGoString(d.max_num_seqs[0])}\n'
                )
            if d.max_num_batched_tokens is not None:
                v, src = d.max_num_batched_tokens
                budget.append(f'kvwatch_max_num_batched_tokens{{{em},source="{_esc(src)}",{tl}}} {floatToGoString(v)}\n')
            if s.lora_running is not None:
                lora.append(f'kvwatch_lora_adapters{{{em},state="running",{tl}}} {floatToGoString(s.lora_running)}\n')
                lora.append(f'kvwatch_lora_adapters{{{em},state="waiting",{tl}}} {floatToGoString(s.lora_waiting or 0)}\n')
            for b in BOTTLENECKS:
                bott.append(f'kvwatch_bottleneck{{bottleneck="{b}",{base}}}{one if d.bottleneck == b else zero}')
            for r in d.recommendations:
                recs.append(f'kvwatch_recommendation{{action="{_esc(r.action)}",{base}}}{one}')

    out = [heads["kvwatch_up"], *up, heads["kvwatch_scrape_duration_seconds"], *dur]
    out += [heads["kvwatch_scrape_errors"], *errs, heads["kvwatch_build_info"], _INFO_LINE]
    out += [heads["kvwatch_target_bottleneck"], *tb]
    for name, lines in gauges.items():
        out.append(heads["kvwatch_" + name])
        prefix = "kvwatch_" + name
        out.extend(prefix + line for line in lines)
    for name, lines in quantiles.items():
        out.append(heads["kvwatch_" + name])
        prefix = "kvwatch_" + name
        out.extend(prefix + line for line in lines)
    for name, lines in (
        ("kvwatch_throughput_gap", gap),
        ("kvwatch_kv_cache_pressure", pressure),
        ("kvwatch_max_num_seqs", seqs),
        ("kvwatch_max_num_batched_tokens", budget),
        ("kvwatch_lora_adapters", lora),
        ("kvwatch_bottleneck", bott),
        ("kvwatch_recommendation", recs),
    ):
        out.append(heads[name])
        out.extend(lines)
    if openmetrics:
        out.append("# EOF\n")
    return "".join(out).encode("utf-8")


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
        up = GaugeMetricFamily("kvwatch_up", _UP_HELP, labels=["target"])
        dur = GaugeMetricFamily("kvwatch_scrape_duration_seconds", _DUR_HELP, labels=["target"])
        errs = CounterMetricFamily("kvwatch_scrape_errors", _ERRS_HELP, labels=["target", "reason"])
        tb = GaugeMetricFamily("kvwatch_target_bottleneck", _TB_HELP, labels=["target", "bottleneck"])
        info = GaugeMetricFamily("kvwatch_build_info", _INFO_HELP, labels=["version"])
        info.add_metric([__version__], 1)

        gauges = {
            name: GaugeMetricFamily("kvwatch_" + name, help_, labels=ENGINE_LABELS)
            for name, (_, help_) in ENGINE_GAUGES.items()
        }
        quantiles = {
            name: GaugeMetricFamily("kvwatch_" + name, help_, labels=ENGINE_LABELS + ["quantile"])
            for name, help_ in QUANTILE_GAUGES.items()
        }
        gap = GaugeMetricFamily("kvwatch_throughput_gap", _GAP_HELP, labels=ENGINE_LABELS)
        pressure = GaugeMetricFamily("kvwatch_kv_cache_pressure", _PRESSURE_HELP, labels=ENGINE_LABELS + ["state"])
        seqs = GaugeMetricFamily("kvwatch_max_num_seqs", _SEQS_HELP, labels=ENGINE_LABELS + ["source"])
        budget = GaugeMetricFamily("kvwatch_max_num_batched_tokens", _BUDGET_HELP, labels=ENGINE_LABELS + ["source"])
        lora = GaugeMetricFamily("kvwatch_lora_adapters", _LORA_HELP, labels=ENGINE_LABELS + ["state"])
        bott = GaugeMetricFamily("kvwatch_bottleneck", _BOTT_HELP, labels=ENGINE_LABELS + ["bottleneck"])
        recs = GaugeMetricFamily("kvwatch_recommendation", _RECS_HELP, labels=ENGINE_LABELS + ["action"])

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


_HEADERS_TEXT = _headers(openmetrics=False)
_HEADERS_OM = _headers(openmetrics=True)
_INFO_LINE = f'kvwatch_build_info{{version="{_esc(__version__)}"}} 1.0\n'
