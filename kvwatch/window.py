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
from dataclasses import dataclass, field

from kvwatch.normalize import CacheConfig, EngineSnapshot, Histogram

__all__ = ["EngineHistory", "Point", "Signals", "histogram_quantile", "summarize", "QUANTILES"]

QUANTILES = (0.5, 0.9, 0.99)
RECENT = 3  # samples that count as "now" for gauges that dip at random (KV usage, running)


@dataclass(slots=True)
class Point:
    t: float
    gauges: dict[str, float]
    counters: dict[str, float]  # reset-corrected cumulative
    hists: dict[str, Histogram]  # reset-corrected cumulative


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
        or any(c < p for c, p in zip(raw.counts, prev_raw.counts))
    )
    if reset:
        base = prev_corr if prev_corr.bounds == raw.bounds else Histogram(raw.bounds, [0.0] * len(raw.bounds))
        return Histogram(
            raw.bounds, array("d", [b + c for b, c in zip(base.counts, raw.counts)]), base.sum + raw.sum, base.count + raw.count
        )
    return Histogram(
        raw.bounds,
        array("d", [pc + (c - p) for pc, c, p in zip(prev_corr.counts, raw.counts, prev_raw.counts)]),
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
            name: _hist_corrected(prev.histograms.get(name) if prev else None, last.hists.get(name) if last else None, raw)
            for name, raw in snap.histograms.items()
        }
        if reset:
            self.resets += 1
        self.points.append(Point(t, dict(snap.gauges), counters, hists))
        self.latest = snap
        while len(self.points) > 2 and t - self.points[0].t > self.keep_seconds:
            self.points.popleft()


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative bucket counts (linear within a bucket)."""
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower_bound, lower_count = 0.0, 0.0
    for b, c in zip(bounds, counts):
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
class Signals:
    """What the window says about one engine. Rates are per second over the window."""

    model_name: str
    engine: str
    t: float
    samples: int
    span_seconds: float
    kv_cache_usage_ratio: float | None = None
    kv_usage_recent_max: float | None = None
    kv_usage_mean: float | None = None
    kv_usage_slope_per_second: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    requests_waiting_deferred: float | None = None
    requests_swapped: float | None = None
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
    prompt_tokens_per_second: float | None = None  # prefill work done (cached tokens excluded when known)
    prompt_tokens_all_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    preemptions_per_second: float | None = None
    throughput_gap: bool = False
    throughput_gap_fraction: float | None = None
    # vllm:iteration_tokens_total over the window: a prompt counts whole (its prefill's computed tokens) in
    # the step its prefill completes, steps without output are not observed at all (vLLM 0.32
    # loggers.py PrometheusStatLogger.record, async_llm.py output_handler); the mean holds over whole
    # prefills, a window with few steps reads it off by a prompt's worth at either end
    engine_step_tokens: float | None = None
    steps_per_second: float | None = None  # 0: the histogram saw no step end in the window (None: no histogram)
    step_tokens_max: float | None = None  # the most one step in the window can have read (its bucket's bound)
    stalled_seconds: float = 0.0  # how long requests have been present with no token progress
    mean_prompt_tokens: float | None = None
    mean_sequence_tokens: float | None = None
    sequence_tokens_source: str | None = None  # "window" or "lifetime"
    capacity_tokens: int | None = None
    free_tokens: float | None = None
    estimated_max_concurrency: float | None = None
    concurrency_headroom: float | None = None
    seconds_to_full: float | None = None
    prefix_cache_hit_ratio: float | None = None
    quantiles: dict[str, dict[float, float]] = field(default_factory=dict)
    cache: CacheConfig | None = None
    lora_running: int | None = None
    lora_waiting: int | None = None
    max_lora: int | None = None

    def as_dict(self) -> dict:
        """The JSON form: only what is known, rounded for people."""
        out = {}
        for name in self.__slots__:
            if name in ("cache", "quantiles", "model_name", "engine"):
                continue
            v = getattr(self, name)
            if v is None:
                continue
            out[name] = round(v, 4) if isinstance(v, float) else v
        for fam, qs in self.quantiles.items():
            for q, v in qs.items():
                out[f"{fam}_p{int(q * 100)}"] = round(v, 4)
        if self.cache is not None:
            c = self.cache
            out["cache_dtype"] = c.cache_dtype
            out["enable_prefix_caching"] = c.enable_prefix_caching
            if c.max_model_len:
                out["max_model_len_from_cache_config"] = c.max_model_len
        return out


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
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den


def _hist_delta(a: Point, b: Point, name: str) -> Histogram | None:
    ha, hb = a.hists.get(name), b.hists.get(name)
    if hb is None:
        return None
    if ha is None or ha.bounds != hb.bounds:
        return None
    return Histogram(hb.bounds, [y - x for x, y in zip(ha.counts, hb.counts)], hb.sum - ha.sum, hb.count - ha.count)


def summarize(history: EngineHistory, now: float, window_seconds: float) -> Signals | None:
    """Signals over the last ``window_seconds`` of ``history`` (None if it holds no point)."""
    pts = [p for p in history.points if now - p.t <= window_seconds + 1e-9]
    if not pts:
        return None
    first, last = pts[0], pts[-1]
    s = Signals(history.model_name, history.engine, last.t, len(pts), last.t - first.t)
    g = last.gauges
    s.kv_cache_usage_ratio = g.get("kv_cache_usage_ratio")
    s.requests_running = g.get("requests_running")
    s.requests_waiting = g.get("requests_waiting")
    s.requests_waiting_deferred = g.get("requests_waiting_deferred")
    s.requests_swapped = g.get("requests_swapped")

    recent = pts[-RECENT:]
    kv = [p.gauges["kv_cache_usage_ratio"] for p in pts if "kv_cache_usage_ratio" in p.gauges]
    if kv:
        s.kv_usage_mean = sum(kv) / len(kv)
        s.kv_usage_recent_max = max(p.gauges.get("kv_cache_usage_ratio", 0.0) for p in recent)
        s.kv_usage_slope_per_second = _slope(
            [p.t for p in pts if "kv_cache_usage_ratio" in p.gauges], kv
        )
    running = [p.gauges["requests_running"] for p in pts if "requests_running" in p.gauges]
    if running:
        s.running_mean = sum(running) / len(running)
        s.running_recent_max = max(p.gauges.get("requests_running", 0.0) for p in recent)
        queued = [p.gauges.get("requests_running", 0.0) for p in pts if p.gauges.get("requests_waiting", 0.0) > 0]
        s.waiting_samples = len(queued)
        if queued:
            s.running_max_waiting = max(queued)
            s.running_at_max_samples = queued.count(s.running_max_waiting)
    waiting = [p.gauges["requests_waiting"] for p in pts if "requests_waiting" in p.gauges]
    if waiting:
        s.waiting_mean = sum(waiting) / len(waiting)
        for p in reversed(pts):
            if p.gauges.get("requests_waiting", 0.0) <= 0:
                break
            s.waiting_streak += 1
        if len(recent) >= RECENT:
            s.waiting_recent_min = min(p.gauges.get("requests_waiting", 0.0) for p in recent)

    if len(pts) >= 2:
        s.prompt_tokens_all_per_second = _rate(first, last, "prompt_tokens")
        s.prompt_tokens_per_second = _rate(first, last, "prompt_tokens_computed")
        if s.prompt_tokens_per_second is None:
            s.prompt_tokens_per_second = s.prompt_tokens_all_per_second
        s.generation_tokens_per_second = _rate(first, last, "generation_tokens")
        s.preemptions_per_second = _rate(first, last, "preemptions")
        q, h = _rate(first, last, "prefix_cache_queries"), _rate(first, last, "prefix_cache_hits")
        if q and h is not None and q > 0:
            s.prefix_cache_hit_ratio = h / q
        it = _hist_delta(first, last, "iteration_tokens")
        if it is not None and it.count > 0:
            s.engine_step_tokens = it.sum / it.count
            s.steps_per_second = it.count / (last.t - first.t)
            # every observation is at most the first bound whose bucket holds them all (None: only +Inf does)
            top = next(b for b, c in zip(it.bounds, it.counts) if c >= it.count)
            s.step_tokens_max = None if math.isinf(top) else top
        elif it is not None:
            # vLLM observes iteration_tokens only for a step that emits output, and a chunked prefill emits
            # none until its last chunk: on a long prompt the window can hold busy steps and no observation.
            # 0, not None: the histogram is there and saw no step end, so tokens per step are unknown.
            s.steps_per_second = 0.0

        prompt_key = "prompt_tokens_computed" if "prompt_tokens_computed" in last.counters else "prompt_tokens"
        gaps = 0
        intervals = 0
        for a, b in zip(pts, pts[1:]):
            pr, gr = _rate(a, b, prompt_key), _rate(a, b, "generation_tokens")
            if pr is None or gr is None:
                continue
            intervals += 1
            if pr < 1.0 and gr > 0 and b.gauges.get("requests_waiting", 0.0) > 0:
                gaps += 1
                if b is last:
                    s.throughput_gap = True
        if intervals:
            s.throughput_gap_fraction = gaps / intervals

        for name, out_name in (
            ("time_to_first_token_seconds", "time_to_first_token_seconds"),
            ("inter_token_latency_seconds", "inter_token_latency_seconds"),
            ("queue_time_seconds", "queue_time_seconds"),
        ):
            d = _hist_delta(first, last, name)
            if d is not None and d.count > 0:
                qs = {q: histogram_quantile(q, d.bounds, d.counts) for q in QUANTILES}
                s.quantiles[out_name] = {q: v for q, v in qs.items() if v is not None}

    # Stall: requests present, and no prompt or generation token since the last progress.
    since = None
    for a, b in zip(reversed(pts[:-1]), reversed(pts)):
        present = b.gauges.get("requests_running", 0.0) + b.gauges.get("requests_waiting", 0.0) > 0
        moved = any(
            k in a.counters and k in b.counters and b.counters[k] > a.counters[k]
            for k in ("generation_tokens", "prompt_tokens")
        )
        if moved or not present:
            break
        since = a.t
    last_present = g.get("requests_running", 0.0) + g.get("requests_waiting", 0.0) > 0
    s.stalled_seconds = (last.t - since) if (since is not None and last_present) else 0.0

    # Sequence lengths: requests finished in the window, else everything vLLM has seen since start.
    latest = history.latest
    pd, gd = _hist_delta(first, last, "request_prompt_tokens"), _hist_delta(first, last, "request_generation_tokens")
    if pd is not None and gd is not None and pd.count > 0 and gd.count > 0:
        s.mean_prompt_tokens = pd.sum / pd.count
        s.mean_sequence_tokens = s.mean_prompt_tokens + gd.sum / gd.count
        s.sequence_tokens_source = "window"
    elif latest is not None:
        lp, lg = latest.histograms.get("request_prompt_tokens"), latest.histograms.get("request_generation_tokens")
        if lp is not None and lg is not None and lp.count > 0 and lg.count > 0:
            s.mean_prompt_tokens = lp.sum / lp.count
            s.mean_sequence_tokens = s.mean_prompt_tokens + lg.sum / lg.count
            s.sequence_tokens_source = "lifetime"

    if latest is not None:
        s.cache = latest.cache
        s.lora_running, s.lora_waiting, s.max_lora = latest.lora_running, latest.lora_waiting, latest.max_lora
    cap = s.cache.capacity_tokens if s.cache else None
    if cap:
        s.capacity_tokens = cap
        if s.kv_cache_usage_ratio is not None:
            s.free_tokens = cap * max(0.0, 1.0 - s.kv_cache_usage_ratio)
        if s.mean_sequence_tokens:
            s.estimated_max_concurrency = cap / s.mean_sequence_tokens
            if s.running_mean is not None:
                s.concurrency_headroom = s.estimated_max_concurrency - s.running_mean
    slope = s.kv_usage_slope_per_second
    if slope is not None and slope > 1e-4 and s.kv_cache_usage_ratio is not None and s.kv_cache_usage_ratio < 1.0:
        s.seconds_to_full = (1.0 - s.kv_cache_usage_ratio) / slope
    return s
