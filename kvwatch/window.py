"""Bounded history per engine, and the signals derived from it over a time window.

Counters follow Prometheus ``rate()`` semantics: any decrease is a reset (a vLLM restart), counted as
an increase from zero, so no rate is ever negative. Histograms are handled the same way, bucket by
bucket, and their window deltas give quantiles exactly as ``histogram_quantile`` does.

History stores reset-corrected cumulative values, so a window delta is one subtraction.
``summarize`` is a pure function of the history: it can be run on recorded data.

Single samples are noisy on real vLLM (a 1 s sample can read Running 0 / KV 0 in the middle of a
saturated run), so the diagnosis reads window statistics, not points.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from kvwatch.snapshot import (
    KV_FETCH_STAGES,
    REJECTIONS,
    CacheConfig,
    Counter,
    EngineSnapshot,
    Gauge,
    Hist,
    Histogram,
    SlotContext,
    kv_fetch_gauge,
)

__all__ = [
    "CapacitySignals",
    "EngineHistory",
    "KvSignals",
    "LatencySignals",
    "Measured",
    "Point",
    "QueueSignals",
    "QUANTILES",
    "Signals",
    "StreakPoint",
    "ThroughputSignals",
    "histogram_quantile",
    "summarize",
]

QUANTILES = (0.5, 0.9, 0.99)
_KV_FETCH = tuple((stage, kv_fetch_gauge(stage)) for stage in KV_FETCH_STAGES)
RECENT = 3  # samples that count as "now" for gauges that dip at random (KV usage, running)


@dataclass(slots=True)
class Point:
    t: float
    gauges: dict[str, float]
    counters: dict[str, float]  # reset-corrected cumulative
    hists: dict[str, Histogram]  # reset-corrected cumulative
    lora_slots_full: bool = False  # every LoRA slot held a running adapter (EngineSnapshot.lora_running >= max_lora)
    # Requests seen reaching the end of their slot's context since the previous sample (None: the slots of this sample
    # or the previous one unknown): from the snapshots' slots, the only thing a point keeps of them
    context_filled: int | None = None


def _corrected(prev_raw: float | None, prev_corr: float | None, raw: float) -> float:
    if prev_raw is None or prev_corr is None:
        return raw
    return prev_corr + (raw - prev_raw if raw >= prev_raw else raw)


def _hist_corrected(prev_raw: Histogram | None, prev_corr: Histogram | None, raw: Histogram) -> Histogram:
    """The corrected cumulative histogram; its counts are an ``array('d')`` (8 bytes a bucket instead
    of a float object and a pointer: the history of one engine is mostly these)."""
    if prev_raw is None or prev_corr is None:
        return Histogram(raw.bounds, array("d", raw.counts), raw.sum, raw.count)
    reset = (
        raw.bounds != prev_raw.bounds
        or prev_corr.bounds != raw.bounds
        or raw.count < prev_raw.count
        or any(c < p for c, p in zip(raw.counts, prev_raw.counts, strict=False))
    )
    if reset:
        base = prev_corr if prev_corr.bounds == raw.bounds else Histogram(raw.bounds, [0.0] * len(raw.bounds))
        return Histogram(
            raw.bounds,
            array("d", [b + c for b, c in zip(base.counts, raw.counts, strict=False)]),
            base.sum + raw.sum,
            base.count + raw.count,
        )
    return Histogram(
        raw.bounds,
        array("d", [pc + (c - p) for pc, c, p in zip(prev_corr.counts, raw.counts, prev_raw.counts, strict=False)]),
        prev_corr.sum + (raw.sum - prev_raw.sum),
        prev_corr.count + (raw.count - prev_raw.count),
    )


class EngineHistory:
    """The recent past of one (model_name, engine): bounded by time and by count."""

    def __init__(self, model_name: str, engine: str, keep_seconds: float, max_points: int = 600):
        self.model_name = model_name
        self.engine = engine
        self.keep_seconds = keep_seconds
        self.points: deque[Point] = deque(maxlen=max_points)
        self.latest: EngineSnapshot | None = None
        # The slots of the last scrape that read them (llama.cpp's /slots): an idle server's /slots is not read (state's
        # serving), and each slot's n_ctx is configuration, the same until a restart
        self.slots_seen: tuple[SlotContext, ...] | None = None
        # The highest running-request ceiling the engine showed since its last restart: llama.cpp's, read from its busy
        # slots while requests are deferred, can read low for one scrape (engines/llamacpp.py); an exported one is
        # configuration, the same until a restart
        self.ceiling_seen: int | None = None
        self.resets = 0

    def add(self, t: float, snap: EngineSnapshot) -> None:
        prev = self.latest
        last = self.points[-1] if self.points else None
        counters = {}
        reset = False
        for name, raw in snap.counters.items():
            prev_raw = prev.counters.get(name) if prev else None
            if prev_raw is not None and raw < prev_raw:
                reset = True
            counters[name] = _corrected(prev_raw, last.counters.get(name) if last else None, raw)
        hists = {
            name: _hist_corrected(
                prev.histograms.get(name) if prev else None, last.hists.get(name) if last else None, raw
            )
            for name, raw in snap.histograms.items()
        }
        if reset:
            self.resets += 1
            self.ceiling_seen = None
        if snap.max_running_requests:
            self.ceiling_seen = max(self.ceiling_seen or 0, snap.max_running_requests)
        full = bool(snap.max_lora and (snap.lora_running or 0) >= snap.max_lora)
        filled = contexts_filled(prev.slots if prev else None, snap.slots)
        self.points.append(Point(t, dict(snap.gauges), counters, hists, full, filled))
        self.latest = snap
        if snap.slots:
            self.slots_seen = snap.slots
        while len(self.points) > 2 and t - self.points[0].t > self.keep_seconds:
            self.points.popleft()


def contexts_filled(before: tuple[SlotContext, ...] | None, now: tuple[SlotContext, ...] | None) -> int | None:
    """Requests that reached the end of their slot's context between two scrapes: a slot now full whose request was not
    (another request, or the same one below the end) in the scrape before. An idle slot keeps its last request's
    figures, so a slot full in both with the same request is that old request again, not counted twice. A request
    that started and ended between the two in a slot that holds another since is not seen (a lower bound)."""
    if before is None or now is None:
        return None
    prior = {s.slot: s for s in before}
    n = 0
    for s in now:
        p = prior.get(s.slot)
        if s.full and s.task is not None and (p is None or p.task != s.task or not p.full):
            n += 1
    return n


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts (linear within a bucket)."""
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower_bound, lower_count = 0.0, 0.0
    for b, c in zip(bounds, counts, strict=False):
        if c >= rank:
            if math.isinf(b):
                # Like Prometheus: a quantile in the +Inf bucket is the highest finite bound.
                finite = [x for x in bounds if not math.isinf(x)]
                return finite[-1] if finite else None
            if c == lower_count:
                return b
            return lower_bound + (b - lower_bound) * (rank - lower_count) / (c - lower_count)
        lower_bound, lower_count = b, c
    return None


@dataclass(slots=True)
class KvSignals:
    """KV-cache usage over the window."""

    usage_ratio: float | None = None  # the latest sample
    recent_max: float | None = None  # max of the last RECENT samples: a 1-s sample can read 0 mid-run
    mean: float | None = None
    slope_per_second: float | None = None
    seconds_to_full: float | None = None
    # CPU KV offload (0.33, vllm:kv_offload_cpu_cache_usage_perc): the share of the CPU tier pinned by in-flight
    # stores and loads, the latest and the window's maximum; not how full the tier is (normalize's docstring)
    offload_pinned_ratio: float | None = None
    offload_pinned_max: float | None = None
    # Each slot's own context (an engine's extra path: llama.cpp's /slots), None where not read: the most of its
    # context a running request held over the window (0-1), the requests that reached the end of theirs since the
    # window's first sample (cut short), and the slots' context in tokens (the last scrape that read them)
    context_used_max_ratio: float | None = None
    context_full_requests: int | None = None
    slot_context_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class StreakPoint:
    """One sample of the current queue: what the rules read for a trend (a plateau, an admission, steady
    prefill). ``prompt_tokens`` is the reset-corrected cumulative prefill count (computed tokens when vLLM
    reports them), None when the engine exports none."""

    t: float
    running: float
    waiting: float
    kv: float | None
    prompt_tokens: float | None
    generation_tokens: float | None = None  # the reset-corrected cumulative count, None if not exported
    lora_slots_full: bool = False  # every LoRA slot held a running adapter (Point.lora_slots_full)


@dataclass(slots=True)
class QueueSignals:
    """Running and Waiting over the window."""

    running: float | None = None
    waiting: float | None = None
    waiting_deferred: float | None = None
    # a P/D decode engine's waiting requests by KV load stage (latest): ((stage, requests), ...)
    kv_fetch: tuple[tuple[str, float], ...] = ()
    swapped: float | None = None
    running_mean: float | None = None
    running_recent_max: float | None = None
    # Highest Running while requests waited, over the window. Running can never exceed max_num_seqs, but a
    # 1-s sample of real vLLM can read below it while every slot is busy: the peak, not the last value,
    # is the ceiling.
    running_max_waiting: float | None = None
    running_at_max_samples: int = 0  # samples (with requests waiting) that read that peak
    waiting_samples: int = 0  # samples in the window with requests waiting
    waiting_streak: int = 0  # the latest samples in a row with requests waiting
    waiting_recent_min: float | None = None  # > 0 when the queue persisted over the last RECENT samples
    waiting_mean: float | None = None
    # The samples of waiting_streak, oldest first (not in the JSON: the diagnosis says what it read from them).
    streak: tuple[StreakPoint, ...] = ()


@dataclass(slots=True)
class ThroughputSignals:
    """Work done per second over the window, and whether it stopped."""

    prompt_tokens_per_second: float | None = None  # prefill work done (cached tokens excluded when known)
    prompt_tokens_all_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    preemptions_per_second: float | None = None
    # over the last RECENT samples only: a window's preemptions can be the previous state's (the tour's recovery
    # read kv_cache 6 s in, KV at 0.06, one request waiting, on the kv_cache phase's preemptions)
    preemptions_recent_per_second: float | None = None
    gap: bool = False  # the last interval: prompt throughput ~0 while generation goes on and requests wait
    gap_fraction: float | None = None
    # vllm:iteration_tokens_total over the window: a prompt counts whole (its prefill's computed tokens) in
    # the step its prefill completes, steps without output are not observed at all (vLLM 0.32
    # loggers.py PrometheusStatLogger.record, async_llm.py output_handler); the mean holds over whole
    # prefills, a window with few steps reads it off by a prompt's worth at either end
    engine_step_tokens: float | None = None
    steps_per_second: float | None = None  # 0: the histogram saw no step end in the window (None: no histogram)
    step_tokens_max: float | None = None  # the most one step in the window can have read (its bucket's bound)
    stalled_seconds: float = 0.0  # how long requests have been present with no token progress
    prefix_cache_hit_ratio: float | None = None
    # vLLM's frontend admission rejections (HTTP 503) per second over the window, by reason: ((reason, rate), ...)
    rejections_per_second: tuple[tuple[str, float], ...] = ()
    finished_per_second: float | None = None  # requests finished (vllm:request_success, every reason)
    kv_transfer_tokens_per_second: float | None = None  # prompt tokens whose KV came over KV transfer (P/D)
    log_averages: bool = False  # the rates are a log's own interval averages (kvwatch logs), not counter rates
    # the engine counts tokens only when a request finishes (EngineSnapshot.tokens_at_request_end): no gap is read,
    # and no prefill pace
    tokens_at_request_end: bool = False


@dataclass(slots=True)
class LatencySignals:
    """Histogram quantiles over the window: family -> {quantile: seconds}."""

    quantiles: dict[str, dict[float, float]] = field(default_factory=dict)


@dataclass(slots=True)
class CapacitySignals:
    """What the KV cache can hold, at the lengths seen."""

    mean_prompt_tokens: float | None = None
    mean_sequence_tokens: float | None = None
    sequence_tokens_source: str | None = None  # "window" or "lifetime"
    capacity_tokens: int | None = None
    free_tokens: float | None = None
    estimated_max_concurrency: float | None = None
    concurrency_headroom: float | None = None
    cache: CacheConfig | None = None
    lora_running: int | None = None
    lora_waiting: int | None = None
    max_lora: int | None = None
    asleep: bool | None = None  # vLLM's engine_sleep_state, latest scrape (None: not exported)
    sleep_level: int | None = None  # 1 weights offloaded to CPU, 2 weights discarded
    # Limits the engine exports itself (TensorRT-LLM's max_num_active_requests / max_num_tokens, llama.cpp's busy
    # slots while requests are deferred), latest scrape (its ceiling the highest seen since the engine's restart): the
    # rules take them as configured
    max_running_requests: int | None = None
    max_step_tokens: int | None = None


@dataclass(slots=True)
class Measured:
    """Rates measured elsewhere (vLLM's log lines carry their own 10-s averages): given to ``summarize``,
    they stand instead of the rates the history's counters would give."""

    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    preemptions_per_second: float | None = None
    prefix_cache_hit_ratio: float | None = None
    engine_step_tokens: float | None = None
    steps_per_second: float | None = None
    log_averages: bool | None = None


@dataclass(slots=True)
class Signals:
    """What the window says about one engine, in parts. Rates are per second over the window."""

    model_name: str
    engine: str
    t: float
    samples: int
    span_seconds: float
    kv: KvSignals = field(default_factory=KvSignals)
    queue: QueueSignals = field(default_factory=QueueSignals)
    throughput: ThroughputSignals = field(default_factory=ThroughputSignals)
    latency: LatencySignals = field(default_factory=LatencySignals)
    capacity: CapacitySignals = field(default_factory=CapacitySignals)

    def as_dict(self) -> dict:
        """The JSON form (flat, the API's names): only what is known, rounded for people."""
        out: dict = {"t": round(self.t, 4), "samples": self.samples, "span_seconds": round(self.span_seconds, 4)}
        for part, renames in _JSON_NAMES.items():
            obj = getattr(self, part)
            for name in obj.__slots__:
                if name in ("cache", "quantiles", "streak", "rejections_per_second", "kv_fetch"):
                    continue
                v = getattr(obj, name)
                if v is not None:
                    out[renames.get(name, name)] = round(v, 4) if isinstance(v, float) else v
        if self.queue.kv_fetch:
            out["kv_fetch_requests"] = dict(self.queue.kv_fetch)
        if self.throughput.rejections_per_second:
            out["rejections_per_second"] = {r: round(v, 4) for r, v in self.throughput.rejections_per_second}
        for fam, qs in self.latency.quantiles.items():
            for q, v in qs.items():
                out[f"{fam}_p{int(q * 100)}"] = round(v, 4)
        c = self.capacity.cache
        if c is not None:
            out["cache_dtype"] = c.cache_dtype
            out["enable_prefix_caching"] = c.enable_prefix_caching
            if c.max_model_len:
                out["max_model_len_from_cache_config"] = c.max_model_len
        return out


# The JSON keeps the flat names it had before Signals came in parts (API users and the e2e lane read them).
_JSON_NAMES: dict[str, dict[str, str]] = {
    "kv": {
        "usage_ratio": "kv_cache_usage_ratio",
        "recent_max": "kv_usage_recent_max",
        "mean": "kv_usage_mean",
        "slope_per_second": "kv_usage_slope_per_second",
        "offload_pinned_ratio": "kv_offload_pinned_ratio",
        "offload_pinned_max": "kv_offload_pinned_max",
    },
    "queue": {
        "running": "requests_running",
        "waiting": "requests_waiting",
        "waiting_deferred": "requests_waiting_deferred",
        "swapped": "requests_swapped",
    },
    "throughput": {"gap": "throughput_gap", "gap_fraction": "throughput_gap_fraction"},
    "capacity": {},
}


def _rate(a: Point, b: Point, name: str) -> float | None:
    if name not in a.counters or name not in b.counters or b.t <= a.t:
        return None
    return (b.counters[name] - a.counters[name]) / (b.t - a.t)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    n = len(xs)
    if n < 3:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    if den <= 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / den


def _hist_delta(a: Point, b: Point, name: str) -> Histogram | None:
    ha, hb = a.hists.get(name), b.hists.get(name)
    if hb is None:
        return None
    if ha is None or ha.bounds != hb.bounds:
        return None
    return Histogram(
        hb.bounds, [y - x for x, y in zip(ha.counts, hb.counts, strict=False)], hb.sum - ha.sum, hb.count - ha.count
    )


def summarize(
    history: EngineHistory, now: float, window_seconds: float, measured: Measured | None = None
) -> Signals | None:
    """Signals over the last ``window_seconds`` of ``history`` (None if it holds no point). ``measured``
    rates, where given, stand instead of those the counters would give."""
    pts = [p for p in history.points if now - p.t <= window_seconds + 1e-9]
    if not pts:
        return None
    first, last = pts[0], pts[-1]
    s = Signals(history.model_name, history.engine, last.t, len(pts), last.t - first.t)
    s.kv = kv_signals(pts)
    context_signals(s.kv, pts, history.slots_seen)
    s.queue = queue_signals(pts)
    s.throughput = throughput_signals(pts, measured or Measured())
    if history.latest is not None and history.latest.tokens_at_request_end:
        s.throughput.tokens_at_request_end = True
        s.throughput.gap_fraction, s.throughput.gap = None, False  # a request's end is not a prefill stopping
    s.latency = latency_signals(first, last)
    s.capacity = capacity_signals(history, first, last, s.kv, s.queue)
    _drop_non_finite(s)
    return s


_DEFAULTS: dict[type, dict[str, object]] = {}


def _drop_non_finite(s: Signals) -> None:
    """A non-finite signal is an unknown one. normalize drops NaN and infinite samples, but finite ones
    from a broken or hostile upstream can still add up past the largest float (1e308 + 1e308) or divide
    into one: none of that may reach the rules (int(inf) raises) or the JSON API (NaN is not JSON)."""
    for part in (s.kv, s.queue, s.throughput, s.capacity):
        defaults = _DEFAULTS.get(type(part))
        if defaults is None:
            defaults = _DEFAULTS[type(part)] = {f.name: f.default for f in fields(part)}
        for name in part.__slots__:
            v = getattr(part, name)
            if type(v) is float and not math.isfinite(v):
                setattr(part, name, defaults[name])
    for qs in s.latency.quantiles.values():
        for q in [q for q, v in qs.items() if not math.isfinite(v)]:
            del qs[q]


def kv_signals(pts: list[Point]) -> KvSignals:
    k = KvSignals(usage_ratio=pts[-1].gauges.get(Gauge.KV_CACHE_USAGE_RATIO))
    pinned = [p.gauges[Gauge.KV_OFFLOAD_PINNED_RATIO] for p in pts if Gauge.KV_OFFLOAD_PINNED_RATIO in p.gauges]
    if pinned:
        k.offload_pinned_ratio = pts[-1].gauges.get(Gauge.KV_OFFLOAD_PINNED_RATIO)
        k.offload_pinned_max = max(pinned)
    with_kv = [p for p in pts if Gauge.KV_CACHE_USAGE_RATIO in p.gauges]
    if not with_kv:
        return k
    kv = [p.gauges[Gauge.KV_CACHE_USAGE_RATIO] for p in with_kv]
    k.mean = sum(kv) / len(kv)
    k.recent_max = max(p.gauges.get(Gauge.KV_CACHE_USAGE_RATIO, 0.0) for p in pts[-RECENT:])
    k.slope_per_second = _slope([p.t for p in with_kv], kv)
    if (
        k.slope_per_second is not None
        and k.slope_per_second > 1e-4
        and k.usage_ratio is not None
        and k.usage_ratio < 1.0
    ):
        k.seconds_to_full = (1.0 - k.usage_ratio) / k.slope_per_second
    return k


def context_signals(k: KvSignals, pts: list[Point], slots: tuple[SlotContext, ...] | None) -> None:
    """The slots' context over the window (KvSignals' context_* fields), where the engine showed its slots."""
    used = [p.gauges[Gauge.CONTEXT_USED_MAX_RATIO] for p in pts if Gauge.CONTEXT_USED_MAX_RATIO in p.gauges]
    if used:
        k.context_used_max_ratio = max(used)
    filled = [p.context_filled for p in pts[1:] if p.context_filled is not None]
    if filled:
        k.context_full_requests = sum(filled)
    if slots:
        k.slot_context_tokens = max(s.n_ctx for s in slots)


def queue_signals(pts: list[Point]) -> QueueSignals:
    g = pts[-1].gauges
    q = QueueSignals(
        running=g.get(Gauge.REQUESTS_RUNNING),
        waiting=g.get(Gauge.REQUESTS_WAITING),
        waiting_deferred=g.get(Gauge.REQUESTS_WAITING_DEFERRED),
        swapped=g.get(Gauge.REQUESTS_SWAPPED),
        kv_fetch=tuple((stage, g[key]) for stage, key in _KV_FETCH if key in g),
    )
    recent = pts[-RECENT:]
    running = [p.gauges[Gauge.REQUESTS_RUNNING] for p in pts if Gauge.REQUESTS_RUNNING in p.gauges]
    if running:
        q.running_mean = sum(running) / len(running)
        q.running_recent_max = max(p.gauges.get(Gauge.REQUESTS_RUNNING, 0.0) for p in recent)
        queued = [
            p.gauges.get(Gauge.REQUESTS_RUNNING, 0.0) for p in pts if p.gauges.get(Gauge.REQUESTS_WAITING, 0.0) > 0
        ]
        q.waiting_samples = len(queued)
        if queued:
            q.running_max_waiting = max(queued)
            q.running_at_max_samples = queued.count(q.running_max_waiting)
    waiting = [p.gauges[Gauge.REQUESTS_WAITING] for p in pts if Gauge.REQUESTS_WAITING in p.gauges]
    if waiting:
        q.waiting_mean = sum(waiting) / len(waiting)
        for p in reversed(pts):
            if p.gauges.get(Gauge.REQUESTS_WAITING, 0.0) <= 0:
                break
            q.waiting_streak += 1
        if len(recent) >= RECENT:
            q.waiting_recent_min = min(p.gauges.get(Gauge.REQUESTS_WAITING, 0.0) for p in recent)
        q.streak = _streak(pts[len(pts) - q.waiting_streak :]) if q.waiting_streak else ()
    return q


def _streak(pts: list[Point]) -> tuple[StreakPoint, ...]:
    key = (
        Counter.PROMPT_TOKENS_COMPUTED if Counter.PROMPT_TOKENS_COMPUTED in pts[-1].counters else Counter.PROMPT_TOKENS
    )
    return tuple(
        StreakPoint(
            p.t,
            p.gauges.get(Gauge.REQUESTS_RUNNING, 0.0),
            p.gauges.get(Gauge.REQUESTS_WAITING, 0.0),
            p.gauges.get(Gauge.KV_CACHE_USAGE_RATIO),
            p.counters.get(key),
            p.counters.get(Counter.GENERATION_TOKENS),
            p.lora_slots_full,
        )
        for p in pts
    )


def prefix_cache_hit_rate_mean(pts: list[Point]) -> float | None:
    """The window's mean of an engine's own hit-rate gauge, where it exports a ratio and no lookup/hit counters:
    SGLang's ``cache_hit_rate`` where it exports no cached_tokens_total (hit / (hit + computed) prompt tokens of the
    last prefill batch, its scheduler_metrics_mixin log_prefill_stats), TensorRT-LLM's ``kv_cache_hit_rate`` (reused /
    (reused + missed) blocks), vLLM V0's ``gpu_prefix_cache_hit_rate``. A value above 1 is not a ratio: dropped."""
    rates = [r for p in pts if (r := p.gauges.get(Gauge.PREFIX_CACHE_HIT_RATE)) is not None and r <= 1.0]
    return sum(rates) / len(rates) if rates else None


def throughput_signals(pts: list[Point], measured: Measured) -> ThroughputSignals:
    first, last = pts[0], pts[-1]
    th = ThroughputSignals(stalled_seconds=stalled_seconds(pts))
    if len(pts) >= 2:
        th.prompt_tokens_all_per_second = _rate(first, last, Counter.PROMPT_TOKENS)
        th.prompt_tokens_per_second = _rate(first, last, Counter.PROMPT_TOKENS_COMPUTED)
        if th.prompt_tokens_per_second is None:
            th.prompt_tokens_per_second = th.prompt_tokens_all_per_second
        th.generation_tokens_per_second = _rate(first, last, Counter.GENERATION_TOKENS)
        th.preemptions_per_second = _rate(first, last, Counter.PREEMPTIONS)
        th.preemptions_recent_per_second = _rate(pts[max(0, len(pts) - 1 - RECENT)], last, Counter.PREEMPTIONS)
        q, h = _rate(first, last, Counter.PREFIX_CACHE_QUERIES), _rate(first, last, Counter.PREFIX_CACHE_HITS)
        if q and h is not None and q > 0:
            th.prefix_cache_hit_ratio = h / q
        else:
            th.prefix_cache_hit_ratio = prefix_cache_hit_rate_mean(pts)
        it = _hist_delta(first, last, Hist.ITERATION_TOKENS)
        if it is not None and it.count > 0:
            th.engine_step_tokens = it.sum / it.count
            th.steps_per_second = it.count / (last.t - first.t)
            # every observation is at most the first bound whose bucket holds them all (None: only +Inf does)
            # (a histogram whose count exceeds even its +Inf bucket is inconsistent: no bound is known)
            top = next((b for b, c in zip(it.bounds, it.counts, strict=False) if c >= it.count), math.inf)
            th.step_tokens_max = None if math.isinf(top) else top
        elif it is not None:
            # vLLM observes iteration_tokens only for a step that emits output, and a chunked prefill emits
            # none until its last chunk: on a long prompt the window can hold busy steps and no observation.
            # 0, not None: the histogram is there and saw no step end, so tokens per step are unknown.
            th.steps_per_second = 0.0
        th.gap_fraction, th.gap = throughput_gap(pts)
        th.rejections_per_second = rejection_rates(first, last)
        th.kv_transfer_tokens_per_second = _rate(first, last, Counter.PROMPT_TOKENS_EXTERNAL)
        th.finished_per_second = _rate(first, last, Counter.REQUESTS_FINISHED)
    if measured.prompt_tokens_per_second is not None or measured.generation_tokens_per_second is not None:
        th.prompt_tokens_all_per_second = None  # the measured averages say nothing of cached tokens
    for name in Measured.__slots__:
        v = getattr(measured, name)
        if v is not None:
            setattr(th, name, v)
    if measured.preemptions_per_second is not None:  # a log record's own interval is its recent past
        th.preemptions_recent_per_second = measured.preemptions_per_second
    return th


def rejection_rates(first: Point, last: Point) -> tuple[tuple[str, float], ...]:
    """The frontend's admission rejections per second over the window, by reason (normalize's REJECTIONS keys)."""
    rates = ((k.removeprefix(REJECTIONS), _rate(first, last, k)) for k in last.counters if k.startswith(REJECTIONS))
    return tuple((reason, r) for reason, r in rates if r is not None and math.isfinite(r))


def throughput_gap(pts: list[Point]) -> tuple[float | None, bool]:
    """The share of intervals with prompt throughput ~0 while generation goes on and requests wait, and
    whether the last interval is one."""
    prompt_key = (
        Counter.PROMPT_TOKENS_COMPUTED if Counter.PROMPT_TOKENS_COMPUTED in pts[-1].counters else Counter.PROMPT_TOKENS
    )
    gaps = intervals = 0
    last_gap = False
    for a, b in zip(pts, pts[1:], strict=False):
        pr, gr = _rate(a, b, prompt_key), _rate(a, b, Counter.GENERATION_TOKENS)
        if pr is None or gr is None:
            continue
        intervals += 1
        if pr < 1.0 and gr > 0 and b.gauges.get(Gauge.REQUESTS_WAITING, 0.0) > 0:
            gaps += 1
            last_gap = b is pts[-1]
    return (gaps / intervals if intervals else None), last_gap


_PROGRESS = (Counter.GENERATION_TOKENS, Counter.PROMPT_TOKENS, Counter.ENGINE_STEPS)


def stalled_seconds(pts: list[Point]) -> float:
    """How long requests have been present with no prompt or generation token since the last progress. 0 when the
    engine shows no progress at all, neither a token counter nor a KV gauge: no stall is judged on silence."""
    last = pts[-1]
    if Gauge.KV_CACHE_USAGE_RATIO not in last.gauges and not any(k in last.counters for k in _PROGRESS):
        return 0.0
    since = None
    for a, b in zip(reversed(pts[:-1]), reversed(pts), strict=False):
        present = b.gauges.get(Gauge.REQUESTS_RUNNING, 0.0) + b.gauges.get(Gauge.REQUESTS_WAITING, 0.0) > 0
        # vLLM counts a prompt's tokens when its prefill completes (and emits nothing before), so a long prompt
        # in chunked prefill shows no token for seconds while its chunks allocate KV blocks: KV usage that moves
        # is progress. A hung engine publishes nothing at all, KV usage included.
        moved = any(
            k in a.counters and k in b.counters and b.counters[k] > a.counters[k] for k in _PROGRESS
        ) or a.gauges.get(Gauge.KV_CACHE_USAGE_RATIO) != b.gauges.get(Gauge.KV_CACHE_USAGE_RATIO)
        if moved or not present:
            break
        since = a.t
    g = pts[-1].gauges
    last_present = g.get(Gauge.REQUESTS_RUNNING, 0.0) + g.get(Gauge.REQUESTS_WAITING, 0.0) > 0
    return (pts[-1].t - since) if (since is not None and last_present) else 0.0


LATENCY_HISTOGRAMS = (Hist.TIME_TO_FIRST_TOKEN_SECONDS, Hist.INTER_TOKEN_LATENCY_SECONDS, Hist.QUEUE_TIME_SECONDS)


def latency_signals(first: Point, last: Point) -> LatencySignals:
    lat = LatencySignals()
    if first is last:
        return lat
    for name in LATENCY_HISTOGRAMS:
        d = _hist_delta(first, last, name)
        if d is not None and d.count > 0:
            qs = {q: histogram_quantile(q, d.bounds, d.counts) for q in QUANTILES}
            lat.quantiles[name] = {q: v for q, v in qs.items() if v is not None}
    return lat


def capacity_signals(
    history: EngineHistory, first: Point, last: Point, kv: KvSignals, queue: QueueSignals
) -> CapacitySignals:
    """Sequence lengths from requests finished in the window, else from everything vLLM has seen since
    start; capacity from vLLM's cache_config_info."""
    c = CapacitySignals()
    latest = history.latest
    pd, gd = (
        _hist_delta(first, last, Hist.REQUEST_PROMPT_TOKENS),
        _hist_delta(first, last, Hist.REQUEST_GENERATION_TOKENS),
    )
    if first is not last and pd is not None and gd is not None and pd.count > 0 and gd.count > 0:
        c.mean_prompt_tokens = pd.sum / pd.count
        c.mean_sequence_tokens = c.mean_prompt_tokens + gd.sum / gd.count
        c.sequence_tokens_source = "window"
    elif latest is not None:
        lp, lg = (
            latest.histograms.get(Hist.REQUEST_PROMPT_TOKENS),
            latest.histograms.get(Hist.REQUEST_GENERATION_TOKENS),
        )
        if lp is not None and lg is not None and lp.count > 0 and lg.count > 0:
            c.mean_prompt_tokens = lp.sum / lp.count
            c.mean_sequence_tokens = c.mean_prompt_tokens + lg.sum / lg.count
            c.sequence_tokens_source = "lifetime"
    if latest is not None:
        c.cache = latest.cache
        c.lora_running, c.lora_waiting, c.max_lora = latest.lora_running, latest.lora_waiting, latest.max_lora
        c.max_step_tokens = latest.max_step_tokens
        if latest.max_running_requests:
            c.max_running_requests = max(latest.max_running_requests, history.ceiling_seen or 0)
        if latest.sleep_level is not None:  # SLEEP_LEVEL_UNKNOWN (-1): asleep, level None
            c.asleep, c.sleep_level = latest.sleep_level != 0, latest.sleep_level if latest.sleep_level > 0 else None
    cap = c.cache.capacity_tokens if c.cache else None
    if cap:
        c.capacity_tokens = cap
        if kv.usage_ratio is not None:
            c.free_tokens = cap * max(0.0, 1.0 - kv.usage_ratio)
        if c.mean_sequence_tokens:
            c.estimated_max_concurrency = cap / c.mean_sequence_tokens
            if queue.running_mean is not None:
                c.concurrency_headroom = c.estimated_max_concurrency - queue.running_mean
    return c
