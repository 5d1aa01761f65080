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

The rules are ``RULES``, an ordered tuple of small functions ``(signals, hints, thresholds) -> Verdict |
None``: the first verdict wins. A verdict carries facts; ``SENTENCES`` turns them into evidence, in one place.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass, field

from kvwatch.catalog import Action, Bottleneck, KvPressure, Source, Thresholds, most_severe
from kvwatch.window import Signals

__all__ = [
    "Diagnosis",
    "Hints",
    "RULES",
    "Recommendation",
    "Thresholds",
    "Verdict",
    "diagnose_engine",
    "kv_pressure",
    "most_severe",
]


@dataclass(frozen=True, slots=True)
class Hints:
    """vLLM's own flags, which it never exports. All optional."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None


@dataclass(frozen=True, slots=True)
class Recommendation:
    action: Action
    why: str


Fact = tuple[str, dict]  # (key of SENTENCES, the values it names)


@dataclass(slots=True)
class Verdict:
    """What a rule found: the bottleneck, the facts behind it, and the advice."""

    bottleneck: Bottleneck
    facts: list[Fact] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    max_num_seqs: tuple[int, Source] | None = None  # set when the rule inferred it
    max_num_batched_tokens: tuple[int, Source] | None = None


@dataclass(slots=True)
class Diagnosis:
    model_name: str
    engine: str
    bottleneck: Bottleneck
    signals: Signals
    evidence: list[str] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    kv_pressure: KvPressure = KvPressure.OK
    max_num_seqs: tuple[int, str] | None = None  # (value, "configured" | "inferred")
    max_num_batched_tokens: tuple[int, str] | None = None

    def as_dict(self) -> dict:
        def limit(v: tuple[int, str] | None) -> dict | None:
            return None if v is None else {"value": v[0], "source": v[1]}

        return {
            "model_name": self.model_name,
            "engine": self.engine,
            "bottleneck": self.bottleneck,
            "evidence": list(self.evidence),
            "recommendations": [{"action": r.action, "why": r.why} for r in self.recommendations],
            "kv_cache_pressure": self.kv_pressure,
            "max_num_seqs": limit(self.max_num_seqs),
            "max_num_batched_tokens": limit(self.max_num_batched_tokens),
            "signals": self.signals.as_dict(),
        }


def kv_pressure(usage: float | None, th: Thresholds) -> KvPressure:
    if usage is None or usage < th.admission_stall:
        return KvPressure.OK
    return KvPressure.PREEMPTION_RISK if usage >= th.preemption_risk else KvPressure.ADMISSION_STALL


# ------------------------------------------------------------------------------------------- evidence


class _Formatter(string.Formatter):
    """``{x!n}`` a count or size for people (``?`` if unknown), ``{x!p}`` a ratio as a percentage."""

    def convert_field(self, value, conversion):
        if conversion == "n":
            return _n(value)
        if conversion == "p":
            return f"{value * 100:.0f}%"
        return super().convert_field(value, conversion)


def _n(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.0f}" if abs(x) >= 10 or float(x).is_integer() else f"{x:.1f}"


SENTENCES: dict[str, str] = {
    "no_progress": "{present!n} requests present ({running!n} running, {waiting!n} waiting) and no token produced for {seconds:.0f} s",
    "nothing_present": "no request running or waiting",
    "serving": "{running!n} running, none waiting{kv_text}",
    "all_deferred": "all {waiting!n} waiting requests are deferred (LoRA budget, KV transfer), not held by capacity",
    "waiting_few_run": "{waiting!n} requests waiting while only {running!n} run",
    "preempting": "{rate:.1f} preemptions/s: running requests lose their KV blocks and recompute",
    "kv_high": "KV cache {kv!p} used (admission stalls above {threshold!p})",
    "prompt_does_not_fit": "free KV holds {free!n} tokens, less than a typical prompt ({prompt!n} tokens)",
    "swapped": "{swapped!n} requests swapped out to CPU for lack of KV blocks",
    "throughput_gap": "prompt throughput was 0 in {share!p} of intervals while generation went on (the throughput gap)",
    "kv_concurrency": "KV capacity {capacity!n} tokens / {sequence!n} tokens per sequence = about {concurrency!n} concurrent sequences",
    "at_configured_ceiling": "{waiting!n} requests waiting while Running is at max_num_seqs={ceiling} (configured)",
    "kv_room": "KV cache only {kv!p} used{free_text}",
    "kv_unknown": "KV usage unknown",
    "full_steps": "{waiting!n} requests waiting while engine steps carry {step!n} tokens on average ({source})",
    "prefill_share": "{share!p} of scheduled tokens are prefill",
    "running_of": "{running!n} running{ceiling_text}",
    "near_configured_ceiling": (
        "{waiting!n} requests waiting; Running peaked at {peak!n} of max_num_seqs={ceiling} (configured) "
        "over the last {samples} samples with a queue"
    ),
    "admission_in_progress": (
        "{waiting!n} waiting with {running!n} of max_num_seqs={ceiling} running, KV and token budget not binding: "
        "admission in progress"
    ),
    "brief_wait": "{waiting!n} request waiting briefly; no limit binding",
    "queue_just_formed": "{waiting!n} waiting with {running!n} running: a queue has just formed, no limit named yet",
    "no_step_ended": (
        "{waiting!n} waiting with {running!n} running and no engine step finished in the last {span:.0f} s "
        "(a long prefill reports nothing until it completes): no limit named yet"
    ),
    "steps_nearly_full": (
        "{waiting!n} waiting with {running!n} running; engine steps average {step!n} tokens, within one step's "
        "{step_max!n} over {steps:.0f} steps of the {full!n} that mean a binding token budget: no limit named yet"
    ),
    "inferred_ceiling": (
        "{waiting!n} requests waiting while Running peaked at {ceiling} ({at_max} of {samples} samples with a queue "
        "in the last {span:.0f} s): inferred max_num_seqs={ceiling} (no hint given)"
    ),
}
_FMT = _Formatter()


def evidence(facts: list[Fact]) -> list[str]:
    """The sentences a verdict's facts say, in order."""
    return [_FMT.format(SENTENCES[key], **values) for key, values in facts]


# ------------------------------------------------------------------------------------------- rules

Rule = Callable[[Signals, Hints, Thresholds], "Verdict | None"]


def _running(s: Signals) -> float:
    return s.queue.running or 0.0


def _waiting(s: Signals) -> float:
    return s.queue.waiting or 0.0


def stalled(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Requests present and no token for ``stall_seconds``: /health may still say 200."""
    if s.throughput.stalled_seconds < th.stall_seconds:
        return None
    running, waiting = _running(s), _waiting(s)
    fact = (
        "no_progress",
        {"present": running + waiting, "running": running, "waiting": waiting, "seconds": s.throughput.stalled_seconds},
    )
    why = "the engine makes no progress although it has work; /health may still say 200"
    return Verdict(Bottleneck.STALLED, [fact], [Recommendation(Action.RESTART_ENGINE, why)])


def no_queue(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Nothing waits: ``idle`` if nothing ran in the window either, else ``none``."""
    if _waiting(s) > 0:
        return None
    if _running(s) <= 0 and not s.queue.running_recent_max and not s.throughput.generation_tokens_per_second:
        return Verdict(Bottleneck.IDLE, [("nothing_present", {})])
    usage = s.kv.usage_ratio
    kv_text = f", KV cache {usage * 100:.0f}% used" if usage is not None else ""
    return Verdict(Bottleneck.NONE, [("serving", {"running": _running(s), "kv_text": kv_text})])


def all_deferred(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """vLLM defers requests for a LoRA slot or remote KV: not this engine's capacity."""
    deferred = s.queue.waiting_deferred or 0.0
    if deferred < _waiting(s):
        return None
    return Verdict(Bottleneck.NONE, [("all_deferred", {"waiting": _waiting(s)})])


def kv_cache(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """KV first: it is the usual cause and the most severe. Any one sign is enough."""
    kv, cap, prompt = s.kv.recent_max, s.capacity.capacity_tokens, s.capacity.mean_prompt_tokens
    signs: list[Fact] = []
    if s.throughput.preemptions_per_second:  # V1 preempts only when a running request needs a block
        signs.append(("preempting", {"rate": s.throughput.preemptions_per_second}))
    if kv is not None and kv >= th.admission_stall:
        signs.append(("kv_high", {"kv": kv, "threshold": th.admission_stall}))
    if cap and kv is not None and prompt and cap * (1 - kv) < prompt:
        signs.append(("prompt_does_not_fit", {"free": cap * (1 - kv), "prompt": prompt}))
    if s.queue.swapped:  # V0 swaps to CPU before it preempts
        signs.append(("swapped", {"swapped": s.queue.swapped}))
    if not signs:
        return None
    facts: list[Fact] = [("waiting_few_run", {"waiting": _waiting(s), "running": _running(s)}), *signs]
    if s.throughput.gap_fraction:
        facts.append(("throughput_gap", {"share": s.throughput.gap_fraction}))
    if s.capacity.estimated_max_concurrency is not None:
        facts.append(
            (
                "kv_concurrency",
                {
                    "capacity": cap,
                    "sequence": s.capacity.mean_sequence_tokens,
                    "concurrency": s.capacity.estimated_max_concurrency,
                },
            )
        )
    return Verdict(Bottleneck.KV_CACHE, facts, kv_recommendations(s, hints, th))


def at_configured_ceiling(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Running has reached the ``--max-num-seqs`` given as a hint."""
    ceiling = hints.max_num_seqs
    if not ceiling or (s.queue.running_recent_max or 0) < ceiling:
        return None
    facts = [("at_configured_ceiling", {"waiting": _waiting(s), "ceiling": ceiling}), _kv_room(s)]
    return Verdict(Bottleneck.MAX_NUM_SEQS, facts, seqs_recommendations(s, ceiling, th))


def full_steps(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Steps full of prefill tokens: near the configured budget, or without it far above what decoding
    alone needs (about one token per running request)."""
    step, budget = s.throughput.engine_step_tokens, hints.max_num_batched_tokens
    if step is None or step < _full_step(s, hints, th):
        return None
    inferred = None if budget else (_pow2(step), Source.INFERRED)
    source = f"max_num_batched_tokens={budget}" if budget else f"an inferred budget of ~{_pow2(step)}"
    facts: list[Fact] = [("full_steps", {"waiting": _waiting(s), "step": step, "source": source})]
    prompt, gen = s.throughput.prompt_tokens_per_second, s.throughput.generation_tokens_per_second
    if prompt is not None and gen is not None and prompt + gen > 0:
        facts.append(("prefill_share", {"share": prompt / (prompt + gen)}))
    ceiling = hints.max_num_seqs
    facts += [
        _kv_room(s),
        ("running_of", {"running": _running(s), "ceiling_text": f" of max_num_seqs={ceiling}" if ceiling else ""}),
    ]
    recs = [
        Recommendation(
            Action.RAISE_MAX_NUM_BATCHED_TOKENS,
            f"steps are full at ~{_n(step)} tokens; a larger budget admits prefills faster "
            "(trade-off: longer steps raise inter-token latency for running requests)",
        ),
        Recommendation(Action.ADD_REPLICA, "more engines share the prefill load"),
    ]
    return Verdict(Bottleneck.TOKEN_BUDGET, facts, recs, max_num_batched_tokens=inferred)


def near_configured_ceiling(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Running reads below the ceiling now but came close to it while requests waited, with KV and token
    budget to spare: real vLLM's 1-s Running samples read low (one request finishing, the next not yet
    counted) while every slot is in use."""
    ceiling, peak = hints.max_num_seqs, s.queue.running_max_waiting or 0.0
    if not ceiling or peak < max(1.0, th.near_ceiling_share * ceiling):
        return None
    fact = (
        "near_configured_ceiling",
        {"waiting": _waiting(s), "peak": peak, "ceiling": ceiling, "samples": s.queue.waiting_samples},
    )
    return Verdict(Bottleneck.MAX_NUM_SEQS, [fact, _kv_room(s)], seqs_recommendations(s, ceiling, th))


def admission_in_progress(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """A ceiling is known, Running stayed below it, KV and steps have room: requests are on their way in."""
    if not hints.max_num_seqs:
        return None
    fact = ("admission_in_progress", {"waiting": _waiting(s), "running": _running(s), "ceiling": hints.max_num_seqs})
    return Verdict(Bottleneck.NONE, [fact])


def brief_wait(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """One request caught between arrival and admission is not a queue: Poisson traffic does that."""
    if _waiting(s) >= th.brief_queue_requests or s.queue.waiting_recent_min:
        return None
    return Verdict(Bottleneck.NONE, [("brief_wait", {"waiting": _waiting(s)})])


def queue_just_formed(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Naming a ceiling by elimination from one sample would blip max_num_seqs at the start of every queue,
    KV-bound ones included, and on stray arrivals: wait for the queue to persist."""
    if s.queue.waiting_streak >= th.min_queue_samples:
        return None
    return Verdict(Bottleneck.NONE, [("queue_just_formed", {"waiting": _waiting(s), "running": _running(s)})])


def no_step_ended(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """vLLM's step histogram saw no step end in the window: a long prompt's chunked prefill emits nothing until
    its last chunk (vLLM 0.32 scheduler.update_from_output: no partial prefill outputs), so the token budget
    cannot be ruled out, and Running then reads the few requests in prefill, not a ceiling."""
    if s.throughput.steps_per_second != 0.0:
        return None
    fact = ("no_step_ended", {"waiting": _waiting(s), "running": _running(s), "span": s.span_seconds})
    return Verdict(Bottleneck.NONE, [fact])


def steps_nearly_full(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """vLLM counts a prompt whole in the step its prefill completes, so the window's mean is off by up to one
    step's worth / the steps in it: 1800-token prompts, a 256-token budget, 27 steps in the window (a slow
    machine) read 175 tokens per step. Not full by ``full_steps``, but not ruled out either."""
    th_ = s.throughput
    step, step_max = th_.engine_step_tokens, th_.step_tokens_max
    steps = (th_.steps_per_second or 0.0) * s.span_seconds
    full = _full_step(s, hints, th)
    if step is None or not step_max or steps <= 0 or step + step_max / steps < full:
        return None
    fact = (
        "steps_nearly_full",
        {
            "waiting": _waiting(s),
            "running": _running(s),
            "step": step,
            "step_max": step_max,
            "steps": steps,
            "full": full,
        },
    )
    return Verdict(Bottleneck.NONE, [fact])


def ceiling_by_elimination(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """No hint, nothing else binds, the queue persists: the sequence ceiling, inferred as Running's peak
    while requests waited."""
    q = s.queue
    ceiling = int(q.running_max_waiting or q.running_recent_max or _running(s))
    fact = (
        "inferred_ceiling",
        {
            "waiting": _waiting(s),
            "ceiling": ceiling,
            "at_max": q.running_at_max_samples,
            "samples": q.waiting_samples,
            "span": s.span_seconds,
        },
    )
    return Verdict(
        Bottleneck.MAX_NUM_SEQS,
        [fact, _kv_room(s)],
        seqs_recommendations(s, ceiling, th),
        max_num_seqs=(ceiling, Source.INFERRED),
    )


RULES: tuple[Rule, ...] = (
    stalled,
    no_queue,
    all_deferred,
    kv_cache,
    at_configured_ceiling,
    full_steps,
    near_configured_ceiling,
    admission_in_progress,
    brief_wait,
    queue_just_formed,
    no_step_ended,
    steps_nearly_full,
    ceiling_by_elimination,
)


def diagnose_engine(s: Signals, hints: Hints = Hints(), th: Thresholds = Thresholds()) -> Diagnosis:
    verdict = next(v for v in (rule(s, hints, th) for rule in RULES) if v is not None)
    d = Diagnosis(s.model_name, s.engine, verdict.bottleneck, s, evidence(verdict.facts), verdict.recommendations)
    d.kv_pressure = kv_pressure(s.kv.recent_max, th)
    if hints.max_num_seqs:
        d.max_num_seqs = (hints.max_num_seqs, Source.CONFIGURED)
    if hints.max_num_batched_tokens:
        d.max_num_batched_tokens = (hints.max_num_batched_tokens, Source.CONFIGURED)
    d.max_num_seqs = verdict.max_num_seqs or d.max_num_seqs
    d.max_num_batched_tokens = verdict.max_num_batched_tokens or d.max_num_batched_tokens
    return d


# ------------------------------------------------------------------------------------------- advice


def _full_step(s: Signals, hints: Hints, th: Thresholds) -> float:
    """Mean tokens per step that mean a binding token budget: near the configured budget, or without it far
    above what decoding alone needs (about one token per running request)."""
    if hints.max_num_batched_tokens:
        return th.full_step_budget_share * hints.max_num_batched_tokens
    return max(th.min_prefill_step_tokens, th.prefill_tokens_per_running * max(s.queue.running_mean or 0.0, 1.0))


def _pow2(x: float) -> int:
    return 2 ** max(0, round(math.log2(max(x, 1.0))))


def _kv_room(s: Signals) -> Fact:
    if s.kv.recent_max is None:
        return ("kv_unknown", {})
    free = s.capacity.free_tokens
    return ("kv_room", {"kv": s.kv.recent_max, "free_text": "" if free is None else f" ({_n(free)} tokens free)"})


def seqs_recommendations(s: Signals, ceiling: int, th: Thresholds) -> list[Recommendation]:
    est = s.capacity.estimated_max_concurrency
    if est is not None and est > ceiling * th.raise_seqs_margin:
        why = (
            f"KV could hold ~{_n(est)} sequences of {_n(s.capacity.mean_sequence_tokens)} tokens; "
            f"max_num_seqs={ceiling} leaves it idle (try ~{int(est * th.raise_seqs_target_share)}; more sequences per "
            "step raise inter-token latency)"
        )
    else:
        why = (
            f"Running is pinned at {ceiling} with KV room to spare (more sequences per step raise inter-token latency)"
        )
    return [
        Recommendation(Action.RAISE_MAX_NUM_SEQS, why),
        Recommendation(Action.ADD_REPLICA, "if latency per token must not rise, spread the queue over more engines"),
    ]


def kv_recommendations(s: Signals, hints: Hints, th: Thresholds) -> list[Recommendation]:
    """KV advice the evidence and vLLM's cache_config_info support, cheapest first."""
    recs = [*_cache_config_advice(s, hints, th)]
    if s.throughput.preemptions_per_second:
        recs.append(_preemption_advice(s))
    recs.append(Recommendation(Action.ADD_REPLICA, "more engines bring more KV cache; the cost is another GPU"))
    return recs


def _cache_config_advice(s: Signals, hints: Hints, th: Thresholds):
    c, cap, seq = s.capacity.cache, s.capacity.capacity_tokens, s.capacity.mean_sequence_tokens
    dtype = (c.cache_dtype or "").lower() if c else ""
    if not dtype.startswith("fp8"):
        more = f" ({_n(cap)} -> ~{_n(2 * cap)} tokens)" if cap else ""
        yield Recommendation(
            Action.FP8_KV_CACHE,
            f"--kv-cache-dtype fp8 halves the bytes per cached token: about twice the KV capacity{more} "
            f"(cache_dtype is {c.cache_dtype if c and c.cache_dtype else 'unknown'}; small accuracy cost, check evals)",
        )
    if c is not None and c.enable_prefix_caching is False:
        yield Recommendation(
            Action.ENABLE_PREFIX_CACHING,
            "prefix caching is off: shared prompt prefixes are stored once and skip prefill",
        )
    max_len = hints.max_model_len or (c.max_model_len if c else None)
    if max_len and seq and seq < th.short_sequence_share * max_len:
        yield Recommendation(
            Action.REDUCE_MAX_MODEL_LEN,
            f"sequences average {_n(seq)} tokens but max_model_len is {max_len}: "
            "a lower limit stops a few long requests from holding most of the KV cache",
        )
    if c is not None and c.kv_cache_memory_bytes:
        yield Recommendation(
            Action.RAISE_GPU_MEMORY_UTILIZATION,
            f"the KV cache is pinned at {c.kv_cache_memory_bytes / 2**20:.0f} MiB by --kv-cache-memory-bytes, "
            "which overrides --gpu-memory-utilization: raise it if the device has memory left",
        )
    elif (
        c is not None
        and c.gpu_memory_utilization is not None
        and c.gpu_memory_utilization < th.gpu_memory_utilization_ceiling
    ):
        yield Recommendation(
            Action.RAISE_GPU_MEMORY_UTILIZATION,
            f"gpu_memory_utilization is {c.gpu_memory_utilization:.2f}: what is raised goes to KV blocks "
            "(leave headroom for activations and CUDA graphs)",
        )


def _preemption_advice(s: Signals) -> Recommendation:
    rate, est, running = (
        s.throughput.preemptions_per_second,
        s.capacity.estimated_max_concurrency,
        s.queue.running_recent_max,
    )
    if est is not None and running and est < running:
        why = (
            f"{rate:.1f} preemptions/s throw away computed KV: up to {_n(running)} sequences run "
            f"but the KV cache holds ~{_n(est)} at their length; capping max_num_seqs near {max(1, int(est))} "
            "avoids the recompute"
        )
    else:
        why = f"{rate:.1f} preemptions/s throw away computed KV; fewer concurrent sequences leave each one room to grow"
    return Recommendation(Action.LOWER_MAX_NUM_SEQS, why)
