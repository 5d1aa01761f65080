"""Which limit binds, why we think so, and what to change. Pure functions over ``Signals``.

How vLLM's V1 scheduler admits a waiting request, and so what each bottleneck looks like:
- ``kv_cache``: the prompt's blocks must fit in free KV blocks. When they do not, prefills stop (prompt
  throughput 0 while generation goes on: the throughput gap) and, when a running request cannot get its
  next block, the newest one is preempted. Evidence: requests wait while KV usage is high, or
  preemptions happen (V1 preempts only for KV), or free KV cannot hold a typical prompt.
- ``max_num_seqs``: ``running < max_num_seqs`` must hold. Evidence: requests wait while Running is
  pinned at the ceiling (configured, or inferred from a plateau) and KV has room.
- ``token_budget``: prefill chunks share ``max_num_batched_tokens`` per step with the decodes. Evidence:
  requests wait while steps are full of prefill tokens (mean tokens per step near the budget, or far
  above what decoding alone needs) with KV and sequence room.

vLLM's ``num_requests_waiting_by_reason{reason="capacity"}`` does not say which of these it is; the
1-second prompt-throughput gap alone does not either (it shows under any gated admission), so the
rules weigh KV usage and preemptions first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvwatch.window import Signals

__all__ = [
    "ACTIONS",
    "BOTTLENECKS",
    "Diagnosis",
    "Hints",
    "Recommendation",
    "Thresholds",
    "diagnose_engine",
    "kv_pressure",
    "most_severe",
    "unreachable",
]

BOTTLENECKS = ("idle", "none", "kv_cache", "max_num_seqs", "token_budget", "stalled", "unreachable")
# Higher is worse: the overall bottleneck of a target is its worst engine's.
SEVERITY = {"idle": 0, "none": 1, "token_budget": 2, "max_num_seqs": 3, "kv_cache": 4, "unreachable": 5, "stalled": 6}
# In order of cost to apply.
ACTIONS = (
    "fp8_kv_cache",
    "enable_prefix_caching",
    "reduce_max_model_len",
    "raise_gpu_memory_utilization",
    "raise_max_num_seqs",
    "lower_max_num_seqs",
    "raise_max_num_batched_tokens",
    "add_replica",
    "restart_engine",
)
KV_STATES = ("ok", "admission_stall", "preemption_risk")


@dataclass(frozen=True, slots=True)
class Hints:
    """vLLM's own flags, which it never exports. All optional."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None


@dataclass(frozen=True, slots=True)
class Thresholds:
    admission_stall: float = 0.90
    preemption_risk: float = 0.95
    stall_seconds: float = 5.0  # no token progress with requests present for this long = stalled
    # Samples in a row with a queue before a ceiling is named by elimination: at 1-s scrapes the first
    # sample of a KV-bound queue often shows KV usage a step behind admission, and Poisson traffic
    # leaves an odd sample with a couple of requests not yet admitted.
    min_queue_samples: int = 2


@dataclass(frozen=True, slots=True)
class Recommendation:
    action: str
    why: str


@dataclass(slots=True)
class Diagnosis:
    model_name: str
    engine: str
    bottleneck: str
    evidence: list[str] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    signals: Signals | None = None
    kv_pressure: str = "ok"
    max_num_seqs: tuple[int, str] | None = None  # (value, "configured" | "inferred")
    max_num_batched_tokens: tuple[int, str] | None = None

    def as_dict(self) -> dict:
        return {
            "model_name": self.model_name,
            "engine": self.engine,
            "bottleneck": self.bottleneck,
            "evidence": list(self.evidence),
            "recommendations": [{"action": r.action, "why": r.why} for r in self.recommendations],
            "kv_cache_pressure": self.kv_pressure,
            "max_num_seqs": None if self.max_num_seqs is None else {"value": self.max_num_seqs[0], "source": self.max_num_seqs[1]},
            "max_num_batched_tokens": None
            if self.max_num_batched_tokens is None
            else {"value": self.max_num_batched_tokens[0], "source": self.max_num_batched_tokens[1]},
            "signals": self.signals.as_dict() if self.signals else {},
        }


def kv_pressure(usage: float | None, th: Thresholds) -> str:
    if usage is None or usage < th.admission_stall:
        return "ok"
    return "preemption_risk" if usage >= th.preemption_risk else "admission_stall"


def most_severe(bottlenecks) -> str:
    return max(bottlenecks, key=SEVERITY.__getitem__, default="idle")


def unreachable(model_name: str, engine: str, why: str) -> Diagnosis:
    return Diagnosis(model_name, engine, "unreachable", [why])


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _n(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.0f}" if abs(x) >= 10 or float(x).is_integer() else f"{x:.1f}"


def _pow2(x: float) -> int:
    return 2 ** max(0, round(math.log2(max(x, 1.0))))


def diagnose_engine(s: Signals, hints: Hints = Hints(), th: Thresholds = Thresholds()) -> Diagnosis:
    d = Diagnosis(s.model_name, s.engine, "none", signals=s)
    d.kv_pressure = kv_pressure(s.kv_usage_recent_max, th)
    if hints.max_num_seqs:
        d.max_num_seqs = (hints.max_num_seqs, "configured")
    if hints.max_num_batched_tokens:
        d.max_num_batched_tokens = (hints.max_num_batched_tokens, "configured")

    running = s.requests_running or 0.0
    waiting = s.requests_waiting or 0.0
    kv = s.kv_usage_recent_max
    ev = d.evidence

    if s.stalled_seconds >= th.stall_seconds:
        d.bottleneck = "stalled"
        ev.append(
            f"{_n(running + waiting)} requests present ({_n(running)} running, {_n(waiting)} waiting) "
            f"and no token produced for {s.stalled_seconds:.0f} s"
        )
        d.recommendations.append(
            Recommendation("restart_engine", "the engine makes no progress although it has work; /health may still say 200")
        )
        return d

    if waiting <= 0:
        if running <= 0 and not s.running_recent_max and not s.generation_tokens_per_second:
            d.bottleneck = "idle"
            ev.append("no request running or waiting")
        else:
            d.bottleneck = "none"
            kv_text = f", KV cache {_pct(s.kv_cache_usage_ratio)} used" if s.kv_cache_usage_ratio is not None else ""
            ev.append(f"{_n(running)} running, none waiting{kv_text}")
        return d

    deferred = s.requests_waiting_deferred or 0.0
    if deferred >= waiting:
        d.bottleneck = "none"
        ev.append(f"all {_n(waiting)} waiting requests are deferred (LoRA budget, KV transfer), not held by capacity")
        return d

    # Requests wait. KV first: it is the usual cause and the most severe.
    kv_reasons = []
    if s.preemptions_per_second:
        kv_reasons.append(
            f"{s.preemptions_per_second:.1f} preemptions/s: running requests lose their KV blocks and recompute"
        )
    if kv is not None and kv >= th.admission_stall:
        kv_reasons.append(f"KV cache {_pct(kv)} used (admission stalls above {_pct(th.admission_stall)})")
    cap = s.capacity_tokens
    if cap and kv is not None and s.mean_prompt_tokens and cap * (1 - kv) < s.mean_prompt_tokens:
        kv_reasons.append(
            f"free KV holds {_n(cap * (1 - kv))} tokens, less than a typical prompt ({_n(s.mean_prompt_tokens)} tokens)"
        )
    if s.requests_swapped:
        kv_reasons.append(f"{_n(s.requests_swapped)} requests swapped out to CPU for lack of KV blocks")
    if kv_reasons:
        d.bottleneck = "kv_cache"
        ev.append(f"{_n(waiting)} requests waiting while only {_n(running)} run")
        ev.extend(kv_reasons)
        if s.throughput_gap_fraction:
            ev.append(
                f"prompt throughput was 0 in {_pct(s.throughput_gap_fraction)} of intervals while generation went on "
                "(the throughput gap)"
            )
        if s.estimated_max_concurrency is not None:
            ev.append(
                f"KV capacity {_n(cap)} tokens / {_n(s.mean_sequence_tokens)} tokens per sequence "
                f"= about {_n(s.estimated_max_concurrency)} concurrent sequences"
            )
        d.recommendations.extend(_kv_recommendations(s, hints))
        return d

    seqs_ceiling = hints.max_num_seqs
    if seqs_ceiling and (s.running_recent_max or 0) >= seqs_ceiling:
        d.bottleneck = "max_num_seqs"
        ev.append(f"{_n(waiting)} requests waiting while Running is at max_num_seqs={seqs_ceiling} (configured)")
        ev.append(_kv_room(s))
        d.recommendations.extend(_seqs_recommendations(s, seqs_ceiling))
        return d

    budget = hints.max_num_batched_tokens
    step = s.engine_step_tokens
    # Decoding alone puts about one token per running request in a step; steps far fuller than that with a
    # queue waiting are prefill chunks filling the budget.
    full_step = 0.75 * budget if budget else max(64.0, 8.0 * max(s.running_mean or 0.0, 1.0))
    if step is not None:
        token_bound = step >= full_step
        if token_bound:
            d.bottleneck = "token_budget"
            if not budget:
                d.max_num_batched_tokens = (_pow2(step), "inferred")
            src = f"max_num_batched_tokens={budget}" if budget else f"an inferred budget of ~{_pow2(step)}"
            ev.append(
                f"{_n(waiting)} requests waiting while engine steps carry {_n(step)} tokens on average ({src})"
            )
            if s.prompt_tokens_per_second is not None and s.generation_tokens_per_second is not None:
                total = s.prompt_tokens_per_second + s.generation_tokens_per_second
                if total > 0:
                    ev.append(f"{_pct(s.prompt_tokens_per_second / total)} of scheduled tokens are prefill")
            ev.append(_kv_room(s))
            ev.append(f"{_n(running)} running" + (f" of max_num_seqs={seqs_ceiling}" if seqs_ceiling else ""))
            d.recommendations.append(
                Recommendation(
                    "raise_max_num_batched_tokens",
                    f"steps are full at ~{_n(step)} tokens; a larger budget admits prefills faster "
                    "(trade-off: longer steps raise inter-token latency for running requests)",
                )
            )
            d.recommendations.append(Recommendation("add_replica", "more engines share the prefill load"))
            return d

    peak = s.running_max_waiting or 0.0
    if seqs_ceiling and peak >= max(1.0, 0.75 * seqs_ceiling):
        # Running reads below the ceiling now, but came close to it in the window while requests waited,
        # with KV and token budget to spare: real vLLM's 1-s Running samples read low (one request
        # finishing, the next not yet counted) while every slot is in use.
        d.bottleneck = "max_num_seqs"
        ev.append(
            f"{_n(waiting)} requests waiting; Running peaked at {_n(peak)} of max_num_seqs={seqs_ceiling} "
            f"(configured) over the last {s.waiting_samples} samples with a queue"
        )
        ev.append(_kv_room(s))
        d.recommendations.extend(_seqs_recommendations(s, seqs_ceiling))
        return d
    if seqs_ceiling:
        # A ceiling is known, Running stayed below it, KV and steps have room: requests are on their way in.
        ev.append(
            f"{_n(waiting)} waiting with {_n(running)} of max_num_seqs={seqs_ceiling} running, KV and token budget "
            "not binding: admission in progress"
        )
        return d
    if waiting < 2 and not s.waiting_recent_min:
        # One request caught between arrival and admission is not a queue: Poisson traffic does that.
        ev.append(f"{_n(waiting)} request waiting briefly; no limit binding")
        return d
    if s.waiting_streak < th.min_queue_samples:
        # Naming a ceiling by elimination from one sample would blip max_num_seqs at the start of every
        # queue, KV-bound ones included, and on stray arrivals: wait for the queue to persist.
        ev.append(f"{_n(waiting)} waiting with {_n(running)} running: a queue has just formed, no limit named yet")
        return d
    if s.steps_per_second == 0.0:
        # vLLM's step histogram saw no step end in the window: a long prompt's chunked prefill emits nothing
        # until its last chunk (vLLM 0.32 scheduler.update_from_output: no partial prefill outputs), so the
        # token budget cannot be ruled out, and Running then reads the few requests in prefill, not a ceiling.
        ev.append(
            f"{_n(waiting)} waiting with {_n(running)} running and no engine step finished in the last "
            f"{s.span_seconds:.0f} s (a long prefill reports nothing until it completes): no limit named yet"
        )
        return d
    steps = (s.steps_per_second or 0.0) * s.span_seconds
    if step is not None and s.step_tokens_max and steps > 0 and step + s.step_tokens_max / steps >= full_step:
        # vLLM counts a prompt whole in the step its prefill completes, so the window's mean is off by up to a
        # step's worth / the steps in it: 1800-token prompts, 256-token budget, 27 steps in the window (a slow
        # machine) read 175 tokens per step. Not full by the rule above, but not ruled out either.
        ev.append(
            f"{_n(waiting)} waiting with {_n(running)} running; engine steps average {_n(step)} tokens, within one "
            f"step's {_n(s.step_tokens_max)} over {steps:.0f} steps of the {_n(full_step)} that mean a binding token "
            "budget: no limit named yet"
        )
        return d
    # No hint: by elimination, the sequence ceiling, inferred as Running's peak while requests waited.
    ceiling = int(s.running_max_waiting or s.running_recent_max or running)
    d.bottleneck = "max_num_seqs"
    d.max_num_seqs = (ceiling, "inferred")
    ev.append(
        f"{_n(waiting)} requests waiting while Running peaked at {ceiling} ({s.running_at_max_samples} of "
        f"{s.waiting_samples} samples with a queue in the last {s.span_seconds:.0f} s): inferred "
        f"max_num_seqs={ceiling} (no hint given)"
    )
    ev.append(_kv_room(s))
    d.recommendations.extend(_seqs_recommendations(s, ceiling))
    return d


def _kv_room(s: Signals) -> str:
    if s.kv_usage_recent_max is None:
        return "KV usage unknown"
    text = f"KV cache only {_pct(s.kv_usage_recent_max)} used"
    if s.free_tokens is not None:
        text += f" ({_n(s.free_tokens)} tokens free)"
    return text


def _seqs_recommendations(s: Signals, ceiling: int) -> list[Recommendation]:
    recs = []
    if s.estimated_max_concurrency is not None and s.estimated_max_concurrency > ceiling * 1.2:
        target = int(s.estimated_max_concurrency * 0.9)
        recs.append(
            Recommendation(
                "raise_max_num_seqs",
                f"KV could hold ~{_n(s.estimated_max_concurrency)} sequences of {_n(s.mean_sequence_tokens)} tokens; "
                f"max_num_seqs={ceiling} leaves it idle (try ~{target}; more sequences per step raise inter-token latency)",
            )
        )
    else:
        recs.append(
            Recommendation(
                "raise_max_num_seqs",
                f"Running is pinned at {ceiling} with KV room to spare (more sequences per step raise inter-token latency)",
            )
        )
    recs.append(Recommendation("add_replica", "if latency per token must not rise, spread the queue over more engines"))
    return recs


def _kv_recommendations(s: Signals, hints: Hints) -> list[Recommendation]:
    recs = []
    c = s.cache
    dtype = (c.cache_dtype or "").lower() if c else ""
    if not dtype.startswith("fp8"):
        cap = f" ({_n(s.capacity_tokens)} -> ~{_n(2 * s.capacity_tokens)} tokens)" if s.capacity_tokens else ""
        recs.append(
            Recommendation(
                "fp8_kv_cache",
                f"--kv-cache-dtype fp8 halves the bytes per cached token: about twice the KV capacity{cap} "
                f"(cache_dtype is {c.cache_dtype if c and c.cache_dtype else 'unknown'}; small accuracy cost, check evals)",
            )
        )
    if c is not None and c.enable_prefix_caching is False:
        recs.append(
            Recommendation(
                "enable_prefix_caching",
                "prefix caching is off: shared prompt prefixes are stored once and skip prefill",
            )
        )
    max_len = hints.max_model_len or (c.max_model_len if c else None)
    if max_len and s.mean_sequence_tokens and s.mean_sequence_tokens < 0.25 * max_len:
        recs.append(
            Recommendation(
                "reduce_max_model_len",
                f"sequences average {_n(s.mean_sequence_tokens)} tokens but max_model_len is {max_len}: "
                "a lower limit stops a few long requests from holding most of the KV cache",
            )
        )
    if c is not None and c.kv_cache_memory_bytes:
        recs.append(
            Recommendation(
                "raise_gpu_memory_utilization",
                f"the KV cache is pinned at {c.kv_cache_memory_bytes / 2**20:.0f} MiB by --kv-cache-memory-bytes, "
                "which overrides --gpu-memory-utilization: raise it if the device has memory left",
            )
        )
    elif c is not None and c.gpu_memory_utilization is not None and c.gpu_memory_utilization < 0.95:
        recs.append(
            Recommendation(
                "raise_gpu_memory_utilization",
                f"gpu_memory_utilization is {c.gpu_memory_utilization:.2f}: what is raised goes to KV blocks "
                "(leave headroom for activations and CUDA graphs)",
            )
        )
    if s.preemptions_per_second:
        est, running = s.estimated_max_concurrency, s.running_recent_max
        if est is not None and running and est < running:
            why = (
                f"{s.preemptions_per_second:.1f} preemptions/s throw away computed KV: up to {_n(running)} sequences run "
                f"but the KV cache holds ~{_n(est)} at their length; capping max_num_seqs near {max(1, int(est))} "
                "avoids the recompute"
            )
        else:
            why = (
                f"{s.preemptions_per_second:.1f} preemptions/s throw away computed KV; fewer concurrent sequences "
                "leave each one room to grow"
            )
        recs.append(Recommendation("lower_max_num_seqs", why))
    recs.append(Recommendation("add_replica", "more engines bring more KV cache; the cost is another GPU"))
    return recs
