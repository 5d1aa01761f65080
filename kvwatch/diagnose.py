"""Which limit binds, why we think so, and what to change. Pure functions over ``Signals``.

How vLLM's V1 scheduler admits a waiting request, and so what each bottleneck looks like:
- ``kv_cache``: the prompt's blocks must fit in free KV blocks. When they do not, prefills stop (prompt
  throughput 0 while generation goes on: the throughput gap) and, when a running request cannot get its
  next block, the newest one is preempted. Evidence: requests wait while KV usage is high, or
  preemptions happen (V1 preempts only for KV), or free KV cannot hold a typical prompt, or (capacity in
  tokens unknown) the free share is less than what one running request holds.
  An engine whose slots each own a slice of the KV cache (llama.cpp without ``--kv-unified``) never queues for KV:
  a request that reaches the end of its slot's context is cut short instead. Evidence (its ``/slots``): a request
  seen reaching the end of its slot's context, named before ``no_queue`` since nothing needs to wait.
- ``max_num_seqs``: ``running < max_num_seqs`` must hold. Evidence: requests wait while Running is
  pinned at the ceiling (configured, or inferred from a plateau: flat at its maximum while slots turn
  over) and KV has room.
- ``token_budget``: prefill chunks share ``max_num_batched_tokens`` per step with the decodes. Evidence:
  requests wait while steps are full of prefill tokens (mean tokens per step near the budget, or far
  above what decoding alone needs) with KV and sequence room; without step data, prompt throughput
  steady near its maximum (prefill paces admission), the budget itself not observed.

vLLM's ``num_requests_waiting_by_reason{reason="capacity"}`` does not say which of these it is; the
1-second prompt-throughput gap alone does not either (it shows under any gated admission), so the
rules weigh KV usage and preemptions first. No limit is named by elimination: when requests wait and none shows,
the answer is ``undetermined`` (never ``none``, which says the server is fine) with what could not be seen and,
for a young queue, how long until kvwatch can tell; where one sample already shows the likely limit, it is
named at low confidence. Every verdict says how sure it is (``Confidence``).

The rules are ``RULES``, an ordered tuple of small functions ``(signals, hints, thresholds) -> Verdict |
None``: the first verdict wins. A verdict carries facts; ``SENTENCES`` turns them into evidence, in one place.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvwatch.capacity import (
    capacity_sequences,
    demand_sequences,
    effective_capacity,
    lora_slots_full,
    lora_slots_unattributed,
)
from kvwatch.catalog import Action, Bottleneck, Confidence, KvPressure, Source, Thresholds, most_severe
from kvwatch.engines import Engine
from kvwatch.engines.vllm import ENGINE as VLLM
from kvwatch.window import Signals, StreakPoint

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
    why: str  # "{flag}" stands for the action's flag in the engine's own spelling (diagnose_engine fills it)
    flag: str = ""


Fact = tuple[str, dict]  # (key of SENTENCES, the values it names)


@dataclass(slots=True)
class Verdict:
    """What a rule found: the bottleneck, the facts behind it, and the advice."""

    bottleneck: Bottleneck
    facts: list[Fact] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    max_num_seqs: tuple[int, Source] | None = None  # set when the rule inferred it
    max_num_batched_tokens: tuple[int, Source] | None = None
    confidence: Confidence = Confidence.HIGH
    reason: str = ""  # why that confidence: what was seen, or what was not


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
    confidence: Confidence = Confidence.HIGH
    confidence_reason: str = ""
    # Sequences each known limit holds at the observed lengths, the binding one, and the demand (kvwatch.capacity)
    capacity_sequences: dict[Bottleneck, float] = field(default_factory=dict)
    capacity_limit: Bottleneck | None = None
    demand_sequences: float | None = None

    @property
    def capacity_sequences_effective(self) -> float | None:
        return None if self.capacity_limit is None else self.capacity_sequences[self.capacity_limit]

    def as_dict(self) -> dict:
        def limit(v: tuple[int, str] | None) -> dict | None:
            return None if v is None else {"value": v[0], "source": v[1]}

        return {
            "model_name": self.model_name,
            "engine": self.engine,
            "bottleneck": self.bottleneck,
            "confidence": self.confidence,
            "confidence_reason": self.confidence_reason,
            "evidence": list(self.evidence),
            "recommendations": [{"action": r.action, "flag": r.flag, "why": r.why} for r in self.recommendations],
            "kv_cache_pressure": self.kv_pressure,
            "max_num_seqs": limit(self.max_num_seqs),
            "max_num_batched_tokens": limit(self.max_num_batched_tokens),
            "capacity": {
                "sequences": {b: round(v, 4) for b, v in self.capacity_sequences.items()},
                "binding_limit": self.capacity_limit,
                "effective_sequences": _round(self.capacity_sequences_effective),
                "demand_sequences": _round(self.demand_sequences),
            },
            "signals": self.signals.as_dict(),
        }


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


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
    "sleeping": (
        "{source} says the engine sleeps ({level_text}) with {running!n} running and {waiting!n} "
        "waiting: it serves nothing until woken (POST /wake_up), which no flag of this engine changes"
    ),
    "lora_slots_full": (
        "{waiting!n} requests waiting ({deferred_text}) while the running LoRA adapters fill max_loras={max_lora} "
        "({running_adapters} running) and {waiting_adapters} more adapters wait for a slot (lora_requests_info)"
    ),
    "stalled_mid_step": "{running!n} running requests stopped producing tokens: a hung engine step or worker",
    "stalled_admits_nothing": (
        "nothing runs while {waiting!n} wait ({capacity!n} for capacity) and the KV cache is {kv!p} used: the "
        "scheduler admits nothing although it has room"
    ),
    "wedged_deferred": (
        "{running!n} running + {deferred!n} deferred reach max_num_seqs={ceiling} (configured) and no request "
        "finished in {seconds:.0f} s: the scheduler counts the deferred requests against the ceiling and admits nothing"
    ),
    "no_progress": "{present!n} requests present ({running!n} running, {waiting!n} waiting) and no token produced for {seconds:.0f} s",
    "nothing_present": "no request running or waiting",
    "no_request_counts": "the engine's metrics carry no count of running or waiting requests: whether requests wait is unknown",
    "serving": "{running!n} running, none waiting{kv_text}",
    "kv_fetch_waiting": (
        "{fetching!n} of {waiting!n} waiting requests wait for their KV from the prefill side ({waiting_to_start!n} "
        "loads not started, {in_progress!n} in progress, {completed_waiting!n} loaded and not yet running: vLLM's "
        "KV-fetch stages){transfer_text}"
    ),
    "all_deferred": "all {waiting!n} waiting requests are deferred (LoRA budget, KV transfer), not held by capacity",
    "lora_slots_taken": (
        "{waiting!n} requests waiting with {running!n} running, and every one of the {slots} LoRA slots held a "
        "running adapter in {full} of the queue's {samples} samples ({adapters} adapters now): the engine does not "
        "say which adapters wait, so the slots may be what holds the queue, and a Running plateau or steady prefill "
        "cannot be told from them"
    ),
    "waiting_few_run": "{waiting!n} requests waiting while only {running!n} run",
    "preempting": "{rate:.1f} preemptions/s: running requests lose their KV blocks and recompute",
    "kv_high": "KV cache {kv!p} used (admission stalls above {threshold!p})",
    "prompt_does_not_fit": "free KV holds {free!n} tokens, less than a typical prompt ({prompt!n} tokens)",
    "next_request_does_not_fit": (
        "KV cache {kv!p} used by {running!n} running requests = {per!p} each{tokens_text}: the {free!p} free is less "
        "than one running request holds{prompt_text}, so the next request likely does not fit"
    ),
    "request_footprint": (
        "each of the {running!n} running requests holds ~{held!n} KV tokens, {ratio:.0f}x its {sequence!n}-token "
        "sequence (pages a request holds whatever its length): the {free!n} free hold no more, and the cache holds "
        "~{fits:.1f} such requests in all{vllm_text}"
    ),
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
    "brief_wait": "{waiting!n} request waiting briefly (between arrival and admission): no limit named",
    "small_queue": "{waiting!n} waiting with {running!n} running, under {share:.0%} of Running: arrivals between steps "
    "at this scale, no limit named",
    "queue_just_formed": "{waiting!n} waiting with {running!n} running: a queue has just formed, no limit named yet",
    "too_young": (
        "too little history to name a limit ({need}): {more} more sample{plural} of the queue{seconds_text} until "
        "kvwatch can tell"
    ),
    "round_ceiling": (
        "{waiting!n} requests waiting while Running is at {running!n}, a round number as a --max-num-seqs is, with "
        "KV room: likely the sequence ceiling (no hint given)"
    ),
    "prefill_climb": (
        "{waiting!n} requests waiting while Running climbs to {running!n} (window mean {mean!n}) and prefill fills "
        "the steps: ~{step!n} tokens per step estimated from {prompt!n} prompt and {gen!n} generation tokens/s: "
        "prefill likely paces admission"
    ),
    "draining": "at that rate the queue is admitted in ~{seconds:.0f} s",
    "no_step_ended": (
        "{waiting!n} waiting with {running!n} running and no engine step finished in the last {span:.0f} s "
        "(a long prefill reports nothing until it completes): no limit named yet"
    ),
    "steps_nearly_full": (
        "{waiting!n} waiting with {running!n} running; engine steps average {step!n} tokens, within one step's "
        "{step_max!n} over {steps:.0f} steps of the {full!n} that mean a binding token budget: no limit named yet"
    ),
    "inferred_ceiling": (
        "{waiting!n} requests waiting while Running held at or near {ceiling} in {at_max} of the last {samples} samples "
        "({seconds:.0f} s, every one with a queue, requests admitted meanwhile): inferred max_num_seqs={ceiling} "
        "(no hint given)"
    ),
    "prefill_steady": (
        "{waiting!n} requests waiting while prompt throughput held at {low!n}-{high!n} tokens/s over {spans} spans "
        "of the last {seconds:.0f} s (within {share!p} of its maximum): prefill paces admission"
    ),
    "room_configured": "Running peaked at {peak!n} of max_num_seqs={ceiling} (configured): sequences have room",
    "room_rising": "Running rose from {first!n} to {last!n}: sequences have room",
    "room_not_pinned": (
        "Running is not pinned at a ceiling: it read its peak {peak!n} in only {at_max} of the last {samples} samples "
        "with a queue"
    ),
    "room_prefill_fills_steps": (
        "Running held at {peak!n}, but prefill fills the steps: ~{step!n} tokens per step estimated from "
        "{prompt!n} prompt and {gen!n} generation tokens/s at {running!n} running (a ceiling at {peak!n} is not "
        "ruled out without --max-num-seqs)"
    ),
    "budget_not_observed": (
        "the per-step budget itself was not observed ({why}): the budget or the prefill compute binds{budget_text}"
    ),
    "admitting": (
        "Running rose {first_running!n}->{last_running!n} and Waiting fell {first_waiting!n}->{last_waiting!n} "
        "over {seconds:.0f} s: admission in progress at {rate:.1f} requests/s or more"
    ),
    "no_limit": "{waiting!n} waiting with {running!n} running: requests wait, no limit identified",
    "rejecting": (
        "vLLM's frontend rejected {rate:.1f} requests/s with HTTP 503 ({reasons}): its admission caps "
        "(--max-num-queued-reqs / --max-num-queued-tokens) turn away the queue {behind}"
    ),
    "ruled_out": "not seen: {what}",
    "unseen": "kvwatch could not see {what}",
    "kv_offload": (
        "CPU KV offload: up to {max!p} of the CPU tier pinned by in-flight transfers over the window ({now!p} now); "
        "{meaning}"
    ),
    "context_full": (
        "{requests!n} request{plural} reached the end of {whose} slot's {n_ctx!n}-token context over the window "
        "(per-slot context, the engine's /slots): generation cut short (truncated), and a prompt that long is refused "
        "outright (unseen)"
    ),
    "context_used": "the fullest running request held {ratio!p} of its slot's context over the window",
    "slot_context": (
        "KV cache judged per slot only: the fullest running request held {ratio!p} of its slot's {n_ctx!n}-token "
        "context over the window (the engine's /slots), and none reached its end; a KV pool the slots share "
        "(llama.cpp's --kv-unified, its default without --parallel) can fill first, unseen"
    ),
    "kv_not_exported": (
        "KV cache not judged: no KV usage in {engine}'s metrics (llama.cpp's current builds export none); a full KV "
        "cache then shows only as failed or cut-short requests, which kvwatch does not see{extra_text}"
    ),
    "confidence": "confidence {level}: {reason}",
}
_FMT = _Formatter()


def _rejection_facts(s: Signals, bottleneck: Bottleneck) -> list[Fact]:
    """Rejections are not a limit of their own: the caps refuse what the limit behind the queue holds back."""
    rates = [(reason, rate) for reason, rate in s.throughput.rejections_per_second if rate > 0]
    if not rates:
        return []
    reasons = ", ".join(f"{reason} {rate:.1f}/s" for reason, rate in rates)
    behind = (
        f"that {bottleneck.label} builds"
        if bottleneck.severity > Bottleneck.UNDETERMINED.severity
        else "before it builds: no limit is named behind it"
    )
    return [("rejecting", {"rate": sum(r for _, r in rates), "reasons": reasons, "behind": behind})]


def evidence(facts: list[Fact]) -> list[str]:
    """The sentences a verdict's facts say, in order."""
    return [_FMT.format(SENTENCES[key], **values) for key, values in facts]


# ------------------------------------------------------------------------------------------- rules

Rule = Callable[[Signals, Hints, Thresholds], "Verdict | None"]

HIGH, MEDIUM, LOW = Confidence.HIGH, Confidence.MEDIUM, Confidence.LOW


def _running(s: Signals) -> float:
    return s.queue.running or 0.0


def _waiting(s: Signals) -> float:
    return s.queue.waiting or 0.0


_SLEEP_LEVEL_TEXT = {1: "level 1: weights offloaded to CPU", 2: "level 2: weights discarded"}


def asleep(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Sleep mode (``--enable-sleep-mode``, POST /sleep): a sleeping engine steps no more and its gauges freeze, which
    would read as stalled; vLLM says so itself in ``engine_sleep_state``, so this comes first and never advises a
    restart (the engine is doing what it was told)."""
    if not s.capacity.asleep:
        return None
    level = _SLEEP_LEVEL_TEXT.get(s.capacity.sleep_level or 0)
    if level is None:  # only a log says asleep without the level (kvwatch.logs: the executor's sleep line)
        source, level = "vLLM's log ('It took ... seconds to fall asleep', no wake-up since)", "level not printed"
        reason = "vLLM's log reads asleep"
    else:
        source = "vLLM's engine_sleep_state"
        reason = "vLLM's engine_sleep_state reads asleep"
    fact = ("sleeping", {"source": source, "level_text": level, "running": _running(s), "waiting": _waiting(s)})
    return Verdict(Bottleneck.ASLEEP, [fact], reason=reason)


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
    reason = f"no token for {s.throughput.stalled_seconds:.0f} s with requests present"
    facts = [fact, *_stall_pattern(s, th)]
    return Verdict(Bottleneck.STALLED, facts, [Recommendation(Action.RESTART_ENGINE, why)], reason=reason)


def _stall_pattern(s: Signals, th: Thresholds) -> list[Fact]:
    """Which stall it is: nothing running while the queue waits on a free cache is the scheduler itself
    (vllm-project/vllm-metal#479: Running 0, 6 waiting for capacity, KV 0 %); running requests that stopped
    producing are a hung step or worker."""
    kv, capacity = s.kv.recent_max, _waiting(s) - (s.queue.waiting_deferred or 0.0)
    if _running(s) > 0:
        return [("stalled_mid_step", {"running": _running(s)})]
    if kv is not None and kv < th.admission_stall and _waiting(s) > 0:
        return [("stalled_admits_nothing", {"waiting": _waiting(s), "capacity": capacity, "kv": kv})]
    return []


def wedged_admission(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """vllm-project/vllm#53130: once running + deferred reach max_num_seqs, vLLM's admission gate counts the deferred
    requests as running and admits no more, with the KV cache mostly free; tokens still trickle (a few running),
    so no-progress never shows. Named on that arithmetic (``--max-num-seqs`` needed), no request finished over the
    window, and nothing else explaining the deferral (LoRA slots full, remote KV loads)."""
    ceiling, deferred, running = hints.max_num_seqs, s.queue.waiting_deferred or 0.0, _running(s)
    if not ceiling or not deferred or s.queue.waiting_streak < th.min_queue_samples:
        return None
    if running + deferred < ceiling or running >= th.near_ceiling_share * ceiling:
        return None
    kv = s.kv.recent_max
    if s.throughput.finished_per_second != 0.0 or (kv is not None and kv >= th.admission_stall):
        return None  # a request finished (or vLLM does not count them), or KV is what holds the queue
    if lora_slots_full(s) or any(n for stage, n in s.queue.kv_fetch if stage != "completed_waiting"):
        return None
    numbers = {"running": running, "deferred": deferred, "ceiling": ceiling, "seconds": s.span_seconds}
    why = "the scheduler admits nothing while deferred requests hold its slots (vllm#53130): only a restart clears it"
    reason = "running + deferred fill max_num_seqs and no request finished"
    recs = [Recommendation(Action.RESTART_ENGINE, why)]
    return Verdict(Bottleneck.STALLED, [("wedged_deferred", numbers), _kv_room(s)], recs, reason=reason)


def _idle(s: Signals) -> bool:
    return _running(s) <= 0 and not s.queue.running_recent_max and not s.throughput.generation_tokens_per_second


def slot_context_full(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Requests reached the end of their slot's own context (llama.cpp's /slots: n_tokens + 1 >= n_ctx, where it
    stops a request, truncated): the KV slice each slot owns binds the request's length. Nothing waits for it (a slot
    is taken whatever its context), so this comes before no_queue; not on an idle server, whose slots keep their last
    request's figures."""
    k = s.kv
    if k.context_full_requests is None or k.context_full_requests < th.context_full_requests or _idle(s):
        return None
    n = k.context_full_requests
    facts: list[Fact] = [
        (
            "context_full",
            {"requests": n, "plural": "" if n == 1 else "s", "whose": "its" if n == 1 else "their"}
            | {"n_ctx": k.slot_context_tokens},
        )
    ]
    if k.context_used_max_ratio is not None:
        facts.append(("context_used", {"ratio": k.context_used_max_ratio}))
    reason = "requests were seen reaching the end of their slot's context (cut short)"
    return Verdict(Bottleneck.KV_CACHE, facts, context_recommendations(s), reason=reason)


def no_queue(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Nothing waits: ``idle`` if nothing ran in the window either, else ``none``. Neither when the snapshot counts no
    requests at all (a missing gauge is unknown, not zero): SGLang's documented example dump, as published, carries
    its KV gauge and token counters and no request gauge (cited in tests/fixtures/engines/sglang/SOURCES.md), as did
    v0.3.5's dumps read with today's names."""
    if s.queue.running is None and s.queue.waiting is None:
        return Verdict(Bottleneck.UNDETERMINED, [("no_request_counts", {})], confidence=LOW, reason="no request counts")
    if _waiting(s) > 0:
        return None
    if _idle(s):
        return Verdict(Bottleneck.IDLE, [("nothing_present", {})], reason="nothing running or waiting")
    usage = s.kv.usage_ratio
    kv_text = f", KV cache {usage * 100:.0f}% used" if usage is not None else ""
    fact = ("serving", {"running": _running(s), "kv_text": kv_text})
    return Verdict(Bottleneck.NONE, [fact], reason="nothing waits")


def max_loras(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Requests wait for a LoRA slot: the running adapters fill ``max_lora`` while other adapters wait. vLLM's
    scheduler skips a request whose adapter would exceed max_loras and counts it deferred (0.12+
    ``num_requests_waiting_by_reason{reason="deferred"}``): named when the deferred requests are the whole queue
    (or vLLM does not split it), or most of it with KV room; a queue held mostly by capacity goes on below."""
    c, deferred, waiting = s.capacity, s.queue.waiting_deferred, _waiting(s)
    if not lora_slots_full(s):
        return None
    if s.queue.waiting_streak < th.min_queue_samples:
        return None
    if deferred is not None and deferred < waiting:
        kv = s.kv.recent_max or 0.0
        if deferred < th.lora_deferred_share * waiting or kv >= th.admission_stall:
            return None
    deferred_text = "vLLM does not split the queue by reason" if deferred is None else f"{_n(deferred)} deferred"
    numbers = {"running_adapters": c.lora_running, "waiting_adapters": c.lora_waiting, "max_lora": c.max_lora}
    fact = ("lora_slots_full", {"waiting": waiting, "deferred_text": deferred_text} | numbers)
    return Verdict(Bottleneck.MAX_LORAS, [fact, _kv_room(s)], lora_recommendations(s), reason=_lora_reason(deferred))


def kv_transfer(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """A P/D decode engine (0.33 kv_consumer) waits on remote KV: the scheduler skips a request whose KV load has
    not finished (deferred), so this engine's own limits cannot be what holds most of the queue."""
    stages = dict(s.queue.kv_fetch)
    fetching, waiting = stages.get("waiting_to_start", 0.0) + stages.get("in_progress", 0.0), _waiting(s)
    if not fetching or s.queue.waiting_streak < th.min_queue_samples or fetching < th.kv_transfer_share * waiting:
        return None
    if waiting < th.brief_queue_requests and not s.queue.waiting_recent_min:  # one load in flight is no queue
        return None
    rate = s.throughput.kv_transfer_tokens_per_second
    transfer_text = "" if rate is None else f"; KV for {_n(rate)} prompt tokens/s arrived over the connector"
    numbers = {k: stages.get(k, 0.0) for k in ("waiting_to_start", "in_progress", "completed_waiting")}
    fact = ("kv_fetch_waiting", {"fetching": fetching, "waiting": waiting, "transfer_text": transfer_text} | numbers)
    why = (
        "requests wait for their KV, not for this engine: more prefill engines (or faster ones) if loads wait to "
        "start, a faster connector path ({flag}: RDMA/NIXL transport, larger transfer buffers) if they are slow in "
        "progress; this engine's flags change nothing"
    )
    recs = [Recommendation(Action.SCALE_PREFILL_SIDE, why)]
    reason = "vLLM counts most of the queue as waiting for remote KV loads"
    return Verdict(Bottleneck.KV_TRANSFER, [fact, _kv_room(s)], recs, reason=reason)


def _lora_reason(deferred: float | None) -> str:
    if deferred is None:
        return "every LoRA slot is taken while adapters wait (lora_requests_info)"
    return "every LoRA slot is taken while adapters wait, and vLLM counts most of the queue as deferred"


def all_deferred(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """vLLM defers requests for a LoRA slot or remote KV: not this engine's capacity."""
    deferred = s.queue.waiting_deferred or 0.0
    if deferred < _waiting(s):
        return None
    fact = ("all_deferred", {"waiting": _waiting(s)})
    reason = "vLLM counts every waiting request as deferred; neither full LoRA slots nor KV loads show why"
    return Verdict(Bottleneck.UNDETERMINED, [fact], confidence=LOW, reason=reason)


_KV_REASONS = {
    "preempting": "preemptions counted",
    "kv_high": "KV usage past the admission-stall threshold",
    "prompt_does_not_fit": "a typical prompt is larger than the free KV",
    "swapped": "requests swapped out for lack of KV blocks",
}


def kv_cache(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """KV first: it is the usual cause and the most severe. Any one sign is enough; without the capacity in
    tokens, the room one request needs is judged from the share a running request holds."""
    signs, confidence, reason = _kv_signs(s, th)
    if not signs:
        return None
    facts: list[Fact] = [("waiting_few_run", {"waiting": _waiting(s), "running": _running(s)}), *signs]
    if s.throughput.gap_fraction:
        facts.append(("throughput_gap", {"share": s.throughput.gap_fraction}))
    cap = s.capacity
    if cap.estimated_max_concurrency is not None:
        numbers = {
            "capacity": cap.capacity_tokens,
            "sequence": cap.mean_sequence_tokens,
            "concurrency": cap.estimated_max_concurrency,
        }
        facts.append(("kv_concurrency", numbers))
    return Verdict(Bottleneck.KV_CACHE, facts, kv_recommendations(s, hints, th), confidence=confidence, reason=reason)


def _kv_signs(s: Signals, th: Thresholds) -> tuple[list[Fact], Confidence, str]:
    """The signs that KV binds, how sure they make it, and why."""
    kv, cap, prompt = s.kv.recent_max, s.capacity.capacity_tokens, s.capacity.mean_prompt_tokens
    signs: list[Fact] = []
    t = s.throughput
    # V1 preempts only when a running request needs a block; once the preemptions are all older than the
    # recent samples they say what KV did, not what it does (None: a log's own interval, recent by nature)
    if t.preemptions_per_second and t.preemptions_recent_per_second != 0:
        signs.append(("preempting", {"rate": s.throughput.preemptions_per_second}))
    if kv is not None and kv >= th.admission_stall:
        signs.append(("kv_high", {"kv": kv, "threshold": th.admission_stall}))
    if cap and kv is not None and prompt and cap * (1 - kv) < prompt:
        signs.append(("prompt_does_not_fit", {"free": cap * (1 - kv), "prompt": prompt}))
    if s.queue.swapped:  # V0 swaps to CPU before it preempts
        signs.append(("swapped", {"swapped": s.queue.swapped}))
    if signs:
        return signs, HIGH, _KV_REASONS[signs[0][0]]
    if cap and prompt:  # the prompt's tokens were compared above; what a request holds may be far more
        footprint = _request_footprint(s, th)
        reason = "each running request holds several times its sequence's KV: the next one needs as much"
        return ([footprint], MEDIUM, reason) if footprint else ([], LOW, "")
    share = _kv_share(s)
    if share is None:
        return [], LOW, ""
    fact, confidence = share
    what = "the KV capacity in tokens" if not cap else "the prompt lengths"
    if confidence is MEDIUM:
        reason = f"{what} unknown: the room one request needs is the prompt's share of a running request's"
    else:
        reason = f"{what} and the prompt's share unknown: the next request is assumed as large as a running one"
    return [fact], confidence, reason


def _request_footprint(s: Signals, th: Thresholds) -> Fact | None:
    """A request's real KV footprint (usage x capacity / running, at the latest sample with a queue) against its
    tokens: at ``fixed_footprint_ratio`` times the mean sequence or more, requests hold pages whatever their length,
    and the free KV holds as many more as it has footprints ("4 slots but 1.5 effective")."""
    pts = [p for p in s.queue.streak if p.running > 0 and p.kv is not None]
    cap, seq = s.capacity.capacity_tokens, s.capacity.mean_sequence_tokens
    if not pts or not cap or not seq:
        return None
    p = pts[-1]
    held, free = p.kv * cap / p.running, (1.0 - p.kv) * cap  # type: ignore[operator]
    if held < th.fixed_footprint_ratio * seq or free >= held:
        return None
    c = s.capacity.cache
    vllm_text = (
        f"; vLLM reports {c.kv_cache_max_concurrency:.2f}x max_model_len" if c and c.kv_cache_max_concurrency else ""
    )
    numbers = {"running": p.running, "held": held, "ratio": held / seq, "sequence": seq, "free": free}
    return ("request_footprint", numbers | {"fits": cap / held, "vllm_text": vllm_text})


def _kv_share(s: Signals) -> tuple[Fact, Confidence] | None:
    """The free share of the KV cache against what one running request holds (usage / running, at the
    latest sample with a queue), and against the prompt's share of it when the lengths are known: a running
    request holds its prompt and part of its output, so prompt / (prompt + output) of its share is the least
    the next prompt needs."""
    pts = [(p, p.kv) for p in s.queue.streak if p.running > 0 and p.kv is not None]
    if not pts:
        return None
    p, kv = pts[-1]
    per, free = kv / p.running, 1.0 - kv
    if free >= per:
        return None
    c, cap = s.capacity, s.capacity.capacity_tokens
    least = (
        per * c.mean_prompt_tokens / c.mean_sequence_tokens if c.mean_prompt_tokens and c.mean_sequence_tokens else None
    )
    tokens_text = f" (~{_n(cap * per)} of {_n(cap)} tokens)" if cap else ""
    prompt_text = ""
    if least is not None and free < least:
        prompt_text = f" and less than the prompt's share (at least {least * 100:.0f}%)"
    values = {"kv": kv, "running": p.running, "per": per, "free": free}
    fact = ("next_request_does_not_fit", values | {"tokens_text": tokens_text, "prompt_text": prompt_text})
    return fact, (MEDIUM if prompt_text else LOW)


def at_configured_ceiling(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Running has reached the ``--max-num-seqs`` given as a hint."""
    ceiling = hints.max_num_seqs
    if not ceiling or (s.queue.running_recent_max or 0) < ceiling:
        return None
    facts = [("at_configured_ceiling", {"waiting": _waiting(s), "ceiling": ceiling}), _kv_room(s)]
    reason = "Running at the configured max_num_seqs"
    return Verdict(Bottleneck.MAX_NUM_SEQS, facts, seqs_recommendations(s, ceiling, th), reason=reason)


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
            f"steps are full at ~{_n(step)} tokens; a larger max_num_batched_tokens admits prefills faster "
            "(trade-off: longer steps raise inter-token latency for running requests)",
        ),
        Recommendation(Action.ADD_REPLICA, "more engines share the prefill load"),
    ]
    if budget:
        return Verdict(
            Bottleneck.TOKEN_BUDGET, facts, recs, reason="full engine steps counted at the configured budget"
        )
    reason = "full engine steps counted; the budget inferred from the step size (no --max-num-batched-tokens)"
    return Verdict(
        Bottleneck.TOKEN_BUDGET, facts, recs, max_num_batched_tokens=inferred, confidence=MEDIUM, reason=reason
    )


def near_configured_ceiling(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Running reads below the ceiling now but came close to it while requests waited, with KV and token
    budget to spare: real vLLM's 1-s Running samples read low (one request finishing, the next not yet
    counted) while every slot is in use. Near it *now* (its last RECENT samples), not only earlier in the
    window: the tour's token_budget phase read Running 2-3 of 32 with 27 waiting for 9 s after the previous
    phase's peak of 32; and with a queue, not one request caught between arrival and admission (the
    stalled preset's serving phase named the ceiling on that, scraped at 0.5 and 0.7 s into the second)."""
    ceiling, peak = hints.max_num_seqs, s.queue.running_max_waiting or 0.0
    if not ceiling or _waiting(s) < th.brief_queue_requests:
        return None
    if min(peak, s.queue.running_recent_max or 0.0) < max(1.0, th.near_ceiling_share * ceiling):
        return None
    fact = (
        "near_configured_ceiling",
        {"waiting": _waiting(s), "peak": peak, "ceiling": ceiling, "samples": s.queue.waiting_samples},
    )
    reason = f"Running came within {th.near_ceiling_share:.0%} of the configured ceiling, not to it"
    recs = seqs_recommendations(s, ceiling, th)
    return Verdict(Bottleneck.MAX_NUM_SEQS, [fact, _kv_room(s)], recs, confidence=MEDIUM, reason=reason)


def brief_wait(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """One request caught between arrival and admission is not a queue a limit builds: Poisson traffic does that.
    It still waits, so the verdict is undetermined (no limit named), never "none"."""
    if _waiting(s) >= th.brief_queue_requests or s.queue.waiting_recent_min:
        return None
    reason = "one request between arrival and admission"
    return Verdict(Bottleneck.UNDETERMINED, [("brief_wait", {"waiting": _waiting(s)})], confidence=LOW, reason=reason)


def queue_just_formed(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """A queue's first sample names no limit but KV with confidence: at 1-s scrapes KV usage lags admission by a
    step, so a KV-bound queue can look roomy for a sample, and stray arrivals leave one. What one sample shows is
    named at low confidence (``_likely_limit``); else it is undetermined, and says how long until kvwatch can tell."""
    if s.queue.waiting_streak >= th.min_queue_samples:
        return None
    if _small_for_batch(s, th):  # arrivals between steps, at any age
        return small_queue(s, hints, th)
    guess = _likely_limit(s, hints, th)
    if guess is not None:
        return guess
    facts = [("queue_just_formed", {"waiting": _waiting(s), "running": _running(s)}), _too_young(s, hints, th)]
    return Verdict(Bottleneck.UNDETERMINED, facts, confidence=LOW, reason="the queue has just formed")


def no_step_ended(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """vLLM's step histogram saw no step end in the window: a long prompt's chunked prefill emits nothing until
    its last chunk (vLLM 0.32 scheduler.update_from_output: no partial prefill outputs), so the token budget
    cannot be ruled out, and Running then reads the few requests in prefill, not a ceiling."""
    if s.throughput.steps_per_second != 0.0:
        return None
    fact = ("no_step_ended", {"waiting": _waiting(s), "running": _running(s), "span": s.span_seconds})
    return Verdict(Bottleneck.UNDETERMINED, [fact], confidence=LOW, reason="no engine step ended in the window")


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
    return Verdict(Bottleneck.UNDETERMINED, [fact], confidence=LOW, reason="engine steps within one step of full")


def lora_slots_taken(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Every LoRA slot was taken while the queue persisted, and the engine does not say which adapters wait (SGLang's
    lora_pool_slots_*): requests of other adapters wait for a slot whatever the ceiling, and Running then holds at
    what the running adapters' requests number, flat like a ceiling, with prefill paced by the slots turning over. No
    limit is named on what the slots may explain (the positive evidence above still names one: Running at the
    configured ceiling, full steps, KV); a queue small for the batch is ``small_queue``'s."""
    if not lora_slots_unattributed(s):
        return None
    if _small_for_batch(s, th):
        return small_queue(s, hints, th)
    c, streak = s.capacity, s.queue.streak
    numbers = {"adapters": c.lora_running, "slots": c.max_lora, "full": sum(p.lora_slots_full for p in streak)}
    fact = ("lora_slots_taken", {"waiting": _waiting(s), "running": _running(s), "samples": len(streak)} | numbers)
    facts: list[Fact] = [fact, _kv_room(s)]
    unseen = ["which LoRA adapters wait"]
    if not hints.max_num_seqs:
        unseen.append("max_num_seqs (pass --max-num-seqs)")
    facts.append(("unseen", {"what": ", ".join(unseen)}))
    reason = "every LoRA slot was taken and the engine does not say which adapters wait: the queue is not attributed"
    return Verdict(Bottleneck.UNDETERMINED, facts, confidence=LOW, reason=reason)


def running_plateau(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """No hint: Running flat at its window maximum over the latest samples, all with a queue, while requests
    were admitted (prefill completed) meanwhile, so slots turned over and none was added: the sequence
    ceiling, inferred. Without step data a prefill that fills the steps flattens Running as well: that is
    ``prefill_paced``'s to judge."""
    p = None if hints.max_num_seqs else _plateau(s, th)
    if p is None or (s.throughput.engine_step_tokens is None and _prefill_fills_steps(s, hints, th)):
        return None
    ceiling = int(p.running)
    fact = (
        "inferred_ceiling",
        {"waiting": _waiting(s), "ceiling": ceiling, "at_max": p.at_max, "samples": p.samples, "seconds": p.seconds},
    )
    reason = f"ceiling inferred from a Running plateau over {p.samples} samples (pass --max-num-seqs to confirm)"
    return Verdict(
        Bottleneck.MAX_NUM_SEQS,
        [fact, _kv_room(s)],
        seqs_recommendations(s, ceiling, th),
        max_num_seqs=(ceiling, Source.INFERRED),
        confidence=MEDIUM,
        reason=reason,
    )


def prefill_paced(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """No step data, and prompt throughput steady near its window maximum while requests wait with KV and
    sequence room: prefill paces admission, so the per-step budget (or the prefill compute) binds. The budget
    itself is not observed, and the evidence says so."""
    if s.throughput.engine_step_tokens is not None or s.throughput.tokens_at_request_end:
        return None  # steps are observed (full_steps' to judge), or prompt tokens counted as requests end
    steady = _prefill_steady(s, th)
    room = None if steady is None else _sequence_room(s, hints, th)
    if steady is None or room is None:
        return None
    numbers = {"low": steady.low, "high": steady.high, "spans": steady.spans, "seconds": steady.seconds}
    facts: list[Fact] = [("prefill_steady", {"waiting": _waiting(s), "share": th.prefill_steady_share} | numbers)]
    facts += [room, _kv_room(s)]
    log = s.throughput.log_averages
    why = "the log has no iteration-detail lines" if log else "no vllm:iteration_tokens_total in /metrics"
    budget = hints.max_num_batched_tokens
    budget_text = f" (max_num_batched_tokens={budget}, configured)" if budget else ""
    facts.append(("budget_not_observed", {"why": why, "budget_text": budget_text}))
    admitting = _admitting(s, th)
    if admitting is not None:
        facts.append(_admitting_fact(admitting))
    recs = [
        Recommendation(
            Action.RAISE_MAX_NUM_BATCHED_TOKENS,
            f"prefill holds at ~{_n(steady.high)} tokens/s while requests wait; if the per-step budget binds, a "
            "larger max_num_batched_tokens admits prefills faster (not observed: enable "
            "--enable-logging-iteration-details or read vllm:iteration_tokens_total; trade-off: longer steps raise "
            "inter-token latency)",
        ),
        Recommendation(Action.ADD_REPLICA, "if the prefill compute itself binds, more engines share it"),
    ]
    if log:
        reason = "log averages only: the budget was not observed (no tokens per step in the log)"
        return Verdict(Bottleneck.TOKEN_BUDGET, facts, recs, confidence=LOW, reason=reason)
    reason = "the budget was not observed: no tokens per step in /metrics"
    return Verdict(Bottleneck.TOKEN_BUDGET, facts, recs, confidence=MEDIUM, reason=reason)


def _small_for_batch(s: Signals, th: Thresholds) -> bool:
    return _waiting(s) < th.small_queue_share * _running(s)


def _likely_limit(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """A young queue (fewer samples than the pattern rules need) whose latest sample already shows its likely limit,
    named at low confidence by the rules that would otherwise say undetermined: Running at a round number with KV
    room (600 running, 4,475 waiting: a --max-num-seqs 600), or prefill filling the steps while Running climbs (206
    waiting at ~30k prompt tokens/s). Not on a queue small for the batch (``small_queue``'s), nor while no engine
    step ends, nor with the KV cache filling."""
    if s.queue.waiting_streak >= _samples_to_tell(s, hints, th) or s.throughput.steps_per_second == 0.0:
        return None
    if lora_slots_unattributed(s):  # full LoRA slots may be what holds the queue (lora_slots_taken)
        return None
    kv = s.kv.recent_max
    if kv is None or kv > th.guess_kv_room or _small_for_batch(s, th):
        return None
    # a climb first: Running passes round numbers on its way up (vllm#37307: 10, 16, 22, 28, 34 running at a steady
    # 24k prompt tokens/s, 90 -> 66 waiting, KV 19 -> 65 %)
    return _prefill_climb(s, hints, th) or _round_ceiling(s, hints, th)


def _round_ceiling(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    running = _running(s)
    if hints.max_num_seqs or running < th.round_ceiling_min or running < (s.queue.running_max_waiting or 0.0):
        return None
    if not any(running % m == 0 for m in th.round_ceiling_multiples):
        return None
    facts = [("round_ceiling", {"waiting": _waiting(s), "running": running}), _kv_room(s), _too_young(s, hints, th)]
    reason = "one sample of a young queue: Running at a round number with KV room (pass --max-num-seqs to confirm)"
    return Verdict(
        Bottleneck.MAX_NUM_SEQS, facts, seqs_recommendations(s, int(running), th), confidence=LOW, reason=reason
    )


def _prefill_climb(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    t, running, mean = s.throughput, _running(s), s.queue.running_mean or 0.0
    if t.engine_step_tokens is not None or not _prefill_fills_steps(s, hints, th):
        return None  # step data, where it exists, shows whether the budget binds (full_steps)
    if running - mean <= max(th.trend_band_requests, th.plateau_tolerance * running):
        return None
    numbers = {"prompt": t.prompt_tokens_per_second, "gen": t.generation_tokens_per_second}
    values = {"waiting": _waiting(s), "running": running, "mean": mean, "step": _estimated_step_tokens(s)} | numbers
    facts = [("prefill_climb", values), _kv_room(s), _too_young(s, hints, th)]
    recs = [
        Recommendation(
            Action.RAISE_MAX_NUM_BATCHED_TOKENS,
            f"prefill runs at ~{_n(t.prompt_tokens_per_second)} tokens/s while requests wait; if the per-step budget "
            "binds, a larger max_num_batched_tokens admits prefills faster (likely, not yet seen: trade-off, longer "
            "steps raise inter-token latency)",
        ),
        Recommendation(Action.ADD_REPLICA, "if the prefill compute itself binds, more engines share it"),
    ]
    reason = "one sample of a young queue: prefill fills the steps while Running climbs (the budget not observed)"
    return Verdict(Bottleneck.TOKEN_BUDGET, facts, recs, confidence=LOW, reason=reason)


def _samples_to_tell(s: Signals, hints: Hints, th: Thresholds) -> int:
    """Samples of the queue before every pattern rule has had what it needs: a Running plateau (no hint), prefill
    steady over its spans (no step data; at the samples' spacing), and min_queue_samples in any case."""
    need = [th.min_queue_samples]
    if not hints.max_num_seqs:
        need.append(th.plateau_samples)
    if s.throughput.engine_step_tokens is None:
        interval = _interval(s)  # unknown from one sample: a sample a span at least
        per_span = math.ceil(th.prefill_span_seconds / interval - 1e-9) if interval else 1
        need.append(th.prefill_min_spans * per_span + 1)
    return max(need)


def _interval(s: Signals) -> float | None:
    return s.span_seconds / (s.samples - 1) if s.samples > 1 and s.span_seconds > 0 else None


def _too_young(s: Signals, hints: Hints, th: Thresholds) -> Fact:
    """What is missing to name a limit, and how long until kvwatch can tell (at the samples' spacing)."""
    more = max(1, _samples_to_tell(s, hints, th) - s.queue.waiting_streak)
    need = []
    if not hints.max_num_seqs:
        need.append(f"a Running plateau takes {th.plateau_samples} samples with a queue")
    if s.throughput.engine_step_tokens is None:
        need.append(f"steady prefill {th.prefill_min_spans} spans of {th.prefill_span_seconds:g} s")
    interval = _interval(s)
    seconds_text = f" (~{more * interval:.0f} s)" if interval else ""
    values = {"need": "; ".join(need) or "the queue must persist", "more": more, "plural": "" if more == 1 else "s"}
    return ("too_young", values | {"seconds_text": seconds_text})


def small_queue(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """A queue under ``small_queue_share`` of Running that no rule above explains: at GPU scale the arrivals
    between two steps; naming a limit on it would be by elimination. Requests still wait: undetermined, never
    "none"."""
    if not _small_for_batch(s, th):
        return None
    waiting, running = _waiting(s), _running(s)
    fact = ("small_queue", {"waiting": waiting, "running": running, "share": th.small_queue_share})
    return Verdict(
        Bottleneck.UNDETERMINED, [fact], confidence=LOW, reason="a queue small for the batch: arrivals between steps"
    )


def admission_in_progress(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """Running rises while Waiting falls, and nothing above paces it: requests are on their way in."""
    admitting = _admitting(s, th)
    if admitting is None:
        return None
    guess = _likely_limit(s, hints, th)
    if guess is not None:
        return guess
    facts = [_admitting_fact(admitting), _kv_room(s)]
    if admitting[2] > 0:
        facts.append(("draining", {"seconds": _waiting(s) / admitting[2]}))
    reason = "requests are being admitted (Running rises as Waiting falls) and no limit shows yet"
    return Verdict(Bottleneck.UNDETERMINED, facts, confidence=LOW, reason=reason)


def no_limit_identified(s: Signals, hints: Hints, th: Thresholds) -> Verdict | None:
    """The queue persists and no rule above found a limit: say so, and what kvwatch could not see, rather
    than name one by elimination; a young queue's likely limit, where one sample shows it, at low confidence."""
    guess = _likely_limit(s, hints, th)
    if guess is not None:
        return guess
    facts: list[Fact] = [("no_limit", {"waiting": _waiting(s), "running": _running(s)}), _kv_room(s)]
    checked = []
    if not hints.max_num_seqs:
        checked.append("Running flat at a maximum while requests were admitted")
    if s.throughput.engine_step_tokens is None:
        checked.append("prompt throughput steady near its maximum")
    checked.append("Running rising as Waiting falls")
    facts.append(("ruled_out", {"what": ", ".join(checked)}))
    unseen = []
    if s.throughput.engine_step_tokens is None:
        unseen.append("tokens per engine step")
    if not hints.max_num_seqs:
        unseen.append("max_num_seqs (pass --max-num-seqs)")
    if s.capacity.capacity_tokens is None:
        unseen.append("the KV capacity in tokens")
    if unseen:
        facts.append(("unseen", {"what": ", ".join(unseen)}))
    if s.queue.waiting_streak < _samples_to_tell(s, hints, th):
        facts.append(_too_young(s, hints, th))
    return Verdict(Bottleneck.UNDETERMINED, facts, confidence=LOW, reason="requests wait, no limit identified")


RULES: tuple[Rule, ...] = (
    asleep,
    stalled,
    wedged_admission,
    slot_context_full,
    no_queue,
    max_loras,
    kv_transfer,
    all_deferred,
    kv_cache,
    at_configured_ceiling,
    full_steps,
    near_configured_ceiling,
    brief_wait,
    queue_just_formed,
    no_step_ended,
    steps_nearly_full,
    lora_slots_taken,
    running_plateau,
    small_queue,
    prefill_paced,
    admission_in_progress,
    no_limit_identified,
)


def diagnose_engine(
    s: Signals, hints: Hints = Hints(), th: Thresholds = Thresholds(), engine: Engine = VLLM
) -> Diagnosis:
    """The first rule's verdict that names a limit ``engine`` can show at all (the rules themselves are
    engine-neutral: they read the snapshot contract), its advice in the engine's own flags."""
    hints = _with_engine_limits(hints, s)
    verdict = next(v for v in (rule(s, hints, th) for rule in RULES) if v is not None and v.bottleneck in engine.shows)
    facts = [
        *verdict.facts,
        *_rejection_facts(s, verdict.bottleneck),
        *_offload_facts(s),
        *_unseen_kv(s, engine, verdict.bottleneck),
    ]
    facts.append(("confidence", {"level": verdict.confidence, "reason": verdict.reason}))
    recs = [_in_engine_words(r, engine) for r in verdict.recommendations]
    d = Diagnosis(s.model_name, s.engine, verdict.bottleneck, s, evidence(facts), recs)
    d.confidence, d.confidence_reason = verdict.confidence, verdict.reason
    d.kv_pressure = kv_pressure(s.kv.recent_max, th)
    if hints.max_num_seqs:
        d.max_num_seqs = (hints.max_num_seqs, Source.CONFIGURED)
    if hints.max_num_batched_tokens:
        d.max_num_batched_tokens = (hints.max_num_batched_tokens, Source.CONFIGURED)
    d.max_num_seqs = verdict.max_num_seqs or d.max_num_seqs
    d.max_num_batched_tokens = verdict.max_num_batched_tokens or d.max_num_batched_tokens
    _add_capacity(d)
    return d


def _unseen_kv(s: Signals, engine: Engine, verdict: Bottleneck) -> list[Fact]:
    """An engine serving without a KV gauge (llama.cpp's current builds): say the KV cache was not judged, so that no
    verdict reads as "the KV cache is fine"; or, where its slots were read (llama.cpp's /slots), that it was judged per
    slot only."""
    if s.kv.usage_ratio is not None or s.kv.mean is not None or s.queue.running is None:
        return []
    if verdict in (Bottleneck.KV_CACHE, Bottleneck.IDLE):  # judged, its facts say so; or nothing to judge
        return []
    k = s.kv
    if k.context_used_max_ratio is not None:
        return [("slot_context", {"ratio": k.context_used_max_ratio, "n_ctx": k.slot_context_tokens})]
    extra = engine.extra
    extra_text = f" ({extra.enable}: kvwatch then reads each slot's context from {extra.path})" if extra else ""
    return [("kv_not_exported", {"engine": engine.title, "extra_text": extra_text})]


def _with_engine_limits(hints: Hints, s: Signals) -> Hints:
    """Limits the engine exports itself count as configured, as the hints do; a hint given wins."""
    c = s.capacity
    if hints.max_num_seqs is None and c.max_running_requests:
        hints = replace(hints, max_num_seqs=c.max_running_requests)
    if hints.max_num_batched_tokens is None and c.max_step_tokens:
        hints = replace(hints, max_num_batched_tokens=c.max_step_tokens)
    return hints


def _in_engine_words(r: Recommendation, engine: Engine) -> Recommendation:
    flag = engine.flag(r.action)
    return Recommendation(r.action, r.why.replace("{flag}", flag), flag)


def _offload_facts(s: Signals) -> list[Fact]:
    """CPU KV offload, reported whenever vLLM exports it: it names no limit (our rules read GPU KV). The gauge is
    the CPU tier's share pinned by transfers (vllm/v1/kv_offload/cpu: "sustained high values indicate transfers
    ... may be dropped"), so a full share means offload saturated, not a full CPU cache."""
    k = s.kv
    if k.offload_pinned_max is None:
        return []
    saturated = k.offload_pinned_max >= 1.0  # vLLM's own scale: "0.0 = idle, 1.0 = saturated" (not a threshold)
    meaning = (
        "offload saturated: stores or promotions may be dropped, so fewer prefixes come back from CPU"
        if saturated
        else "not how full the CPU tier is"
    )
    return [("kv_offload", {"max": k.offload_pinned_max, "now": k.offload_pinned_ratio or 0.0, "meaning": meaning})]


def _add_capacity(d: Diagnosis) -> None:
    """Capacity per limit at the ceilings just settled (configured or inferred), and the demand."""
    seqs = d.max_num_seqs[0] if d.max_num_seqs else None
    budget = d.max_num_batched_tokens[0] if d.max_num_batched_tokens else None
    d.capacity_sequences = capacity_sequences(d.signals, seqs, budget)
    binding = effective_capacity(d.capacity_sequences)
    d.capacity_limit = binding[0] if binding else None
    d.demand_sequences = demand_sequences(d.signals)


# ------------------------------------------------------------------------------------------- patterns


@dataclass(frozen=True, slots=True)
class _Plateau:
    running: float  # the window maximum Running held at
    at_max: int  # samples of the latest ``samples`` that read it
    samples: int
    seconds: float


def _plateau(s: Signals, th: Thresholds) -> _Plateau | None:
    """Running at its window maximum (within ``plateau_tolerance``) in at least ``plateau_share`` of the latest
    ``plateau_samples`` samples, every one with a queue, not falling over them nor rising to a new maximum, prefill
    completed between the first and the last (slots turned over), and tokens still generated at the end."""
    n, peak = max(2, th.plateau_samples), s.queue.running_max_waiting
    pts = s.queue.streak[-n:]
    if len(pts) < n or not peak:
        return None
    at_max, trend = _at_max(pts, peak, th), _trend(pts, peak, th)
    if at_max < math.ceil(th.plateau_share * n - 1e-9) or trend < 0:
        return None
    if trend > 0 and not _at_max(s.queue.streak[:-n], peak, th):
        # A rise to a maximum Running already held earlier in the same queue is a return from a dip, not a
        # climb: requests that start and end together leave every slot at once, and real vLLM at
        # --max-num-seqs 4 read Running 1, 3, 4, 4, 4 with 40-64 waiting after reading 4 (e2e, 2-core CPU).
        return None
    a, b = pts[0].prompt_tokens, pts[-1].prompt_tokens
    if a is None or b is None or b <= a:  # nothing admitted: one long request, not a ceiling shown
        return None
    g, h = pts[-2].generation_tokens, pts[-1].generation_tokens
    if g is not None and h is not None and h <= g:
        # No token since the previous sample: an engine that stopped stepping holds Running flat too (the
        # gpu_stalled preset read as an inferred ceiling for the seconds before the stall rule could tell).
        return None
    return _Plateau(peak, at_max, n, pts[-1].t - pts[0].t)


def _at_max(pts: tuple[StreakPoint, ...], peak: float, th: Thresholds) -> int:
    """Samples at ``peak``: within ``plateau_tolerance`` of it, or ``plateau_slack_requests`` (one slot turning
    over), whichever is more, and never 0."""
    floor = max(1.0, peak - max(th.plateau_tolerance * peak, th.plateau_slack_requests))
    return sum(1 for p in pts if p.running >= floor)


def _trend(pts: tuple[StreakPoint, ...], peak: float, th: Thresholds) -> int:
    """+1 if Running rises over ``pts``, -1 if it falls, else 0: its least-squares change beyond the band
    (``trend_band_requests`` or ``plateau_tolerance`` of ``peak``), and the later half's highest and lowest
    both past the earlier half's (a dip at a ceiling, first or last, moves one of them; a climb both)."""
    n = len(pts)
    mt = sum(p.t for p in pts) / n
    den = sum((p.t - mt) ** 2 for p in pts)
    if n < 2 or den <= 0:
        return 0
    mr = sum(p.running for p in pts) / n
    change = sum((p.t - mt) * (p.running - mr) for p in pts) / den * (pts[-1].t - pts[0].t)
    band = max(th.trend_band_requests, th.plateau_tolerance * peak)
    early, late = [p.running for p in pts[: n // 2]], [p.running for p in pts[(n + 1) // 2 :]]
    if change > band and max(late) > max(early) and min(late) > min(early):
        return 1
    if change < -band and max(late) < max(early) and min(late) < min(early):
        return -1
    return 0


@dataclass(frozen=True, slots=True)
class _Steady:
    low: float
    high: float
    spans: int
    seconds: float


def _prefill_steady(s: Signals, th: Thresholds) -> _Steady | None:
    """Prompt throughput over the queue's spans (its intervals merged, newest first, to at least
    ``prefill_span_seconds``), every span within ``prefill_steady_share`` of the highest."""
    pts, rates = s.queue.streak, []
    dt = dp = 0.0
    for a, b in zip(reversed(pts[:-1]), reversed(pts[1:]), strict=True):
        if a.prompt_tokens is None or b.prompt_tokens is None:
            return None
        dt, dp = dt + b.t - a.t, dp + b.prompt_tokens - a.prompt_tokens
        if dt >= th.prefill_span_seconds:
            rates.append(dp / dt)
            dt = dp = 0.0
    if len(rates) < th.prefill_min_spans or max(rates) <= 0 or min(rates) < th.prefill_steady_share * max(rates):
        return None
    return _Steady(min(rates), max(rates), len(rates), pts[-1].t - pts[0].t)


def _estimated_step_tokens(s: Signals) -> float | None:
    """Tokens per step from the averages alone: each running request decodes one token per step, so steps
    per second ~ generation / running and a step carries (prompt + generation) / that."""
    p, g, r = s.throughput.prompt_tokens_per_second, s.throughput.generation_tokens_per_second, s.queue.running_mean
    if p is None or g is None or not r or p <= 0:
        return None
    return math.inf if g <= 0 else (p + g) * r / g


def _prefill_fills_steps(s: Signals, hints: Hints, th: Thresholds) -> bool:
    step = _estimated_step_tokens(s)
    return step is not None and step >= _full_step(s, hints, th)


def _sequence_room(s: Signals, hints: Hints, th: Thresholds) -> Fact | None:
    """Positive evidence that sequences have room, or None."""
    peak = s.queue.running_max_waiting or _running(s)
    ceiling = hints.max_num_seqs
    if ceiling:
        return (
            None if peak >= th.near_ceiling_share * ceiling else ("room_configured", {"peak": peak, "ceiling": ceiling})
        )
    admitting = _admitting(s, th)
    if admitting is not None:
        return ("room_rising", {"first": admitting[0].running, "last": admitting[1].running})
    n = max(2, th.plateau_samples)
    if len(s.queue.streak) < n:
        return None
    at_max = _at_max(s.queue.streak[-n:], peak, th)
    if at_max <= th.unpinned_share * n + 1e-9:
        return ("room_not_pinned", {"peak": peak, "at_max": at_max, "samples": n})
    # Running flat (a plateau) or dipping below it: either way, steps that prefill fills are the limit, and a
    # larger max_num_seqs would admit nothing faster (gpu_token_budget's log: Running 31-41 with 40-285 waiting,
    # prompt throughput steady at ~11,600 tokens/s, two records a window).
    if not _prefill_fills_steps(s, hints, th):
        return None
    t = s.throughput
    numbers = {"prompt": t.prompt_tokens_per_second, "gen": t.generation_tokens_per_second}
    return (
        "room_prefill_fills_steps",
        {"peak": peak, "step": _estimated_step_tokens(s), "running": s.queue.running_mean} | numbers,
    )


def _admitting(s: Signals, th: Thresholds) -> tuple[StreakPoint, StreakPoint, float] | None:
    """Running rising (``_trend``) while Waiting fell, over the queue; with the admission rate that shows at least: Running's rise (completions
    only lower it) and Waiting's fall (arrivals only slow it)."""
    pts = s.queue.streak
    if len(pts) < 2:
        return None
    a, b = pts[0], pts[-1]
    peak = s.queue.running_max_waiting or b.running
    if _trend(pts, peak, th) != 1 or b.waiting >= a.waiting or b.t <= a.t:
        return None
    dt = b.t - a.t
    return a, b, max((b.running - a.running) / dt, (a.waiting - b.waiting) / dt)


def _admitting_fact(admitting: tuple[StreakPoint, StreakPoint, float]) -> Fact:
    a, b, rate = admitting
    values = {"first_running": a.running, "last_running": b.running, "first_waiting": a.waiting}
    return ("admitting", values | {"last_waiting": b.waiting, "seconds": b.t - a.t, "rate": rate})


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
            f"Running is pinned at max_num_seqs={ceiling} with KV room to spare (more sequences per step raise "
            "inter-token latency)"
        )
    return [
        Recommendation(Action.RAISE_MAX_NUM_SEQS, why),
        Recommendation(Action.ADD_REPLICA, "if latency per token must not rise, spread the queue over more engines"),
    ]


def lora_recommendations(s: Signals) -> list[Recommendation]:
    c = s.capacity
    want = (c.lora_running or 0) + (c.lora_waiting or 0)
    why = (
        f"{c.lora_running} adapters fill max_loras={c.max_lora} while {c.lora_waiting} more wait: {{flag}} {want} "
        "would batch them all (trade-off: each slot reserves GPU memory for an adapter of --max-lora-rank, taken "
        "from the KV cache; a lower --max-lora-rank makes slots cheaper)"
    )
    return [
        Recommendation(Action.RAISE_MAX_LORAS, why),
        Recommendation(Action.ADD_REPLICA, "or route each adapter's traffic to engines that keep it loaded"),
    ]


def context_recommendations(s: Signals) -> list[Recommendation]:
    """A slot's context too small for its requests: more context per slot (a larger KV cache, fewer slots sharing
    it, or cheaper tokens), cheapest first; or shorter requests."""
    n_ctx = s.kv.slot_context_tokens
    each = f" ({_n(n_ctx)} tokens here)" if n_ctx else ""
    return [
        Recommendation(
            Action.FP8_KV_CACHE,
            "{flag} halves the bytes per cached token: the same memory then holds a context twice as long (raise "
            "--ctx-size with it; small accuracy cost, check evals)",
        ),
        Recommendation(
            Action.RAISE_KV_CACHE_MEMORY_BYTES,
            f"each slot's context is {{flag}} / --parallel{each}, or all of it with --kv-unified: raise {{flag}} if "
            "the device has memory left, or bound clients' max_tokens (n_predict) to what fits",
        ),
        Recommendation(
            Action.LOWER_MAX_NUM_SEQS,
            "fewer slots ({flag}) give each a larger share of --ctx-size (not with --kv-unified, where each may "
            "already use all of it); requests beyond the slots then wait",
        ),
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
            f"{{flag}} halves the bytes per cached token: about twice the KV capacity{more} "
            f"(cache_dtype is {c.cache_dtype if c and c.cache_dtype else 'unknown'}; small accuracy cost, check evals)",
        )
    if c is not None and c.enable_prefix_caching is False:
        yield Recommendation(
            Action.ENABLE_PREFIX_CACHING,
            "prefix caching is off: {flag} stores shared prompt prefixes once, and they skip prefill",
        )
    max_len = hints.max_model_len or (c.max_model_len if c else None)
    usage, running = s.kv.usage_ratio or 0.0, _running(s)
    if max_len and seq and seq < th.short_sequence_share * max_len:
        yield Recommendation(
            Action.REDUCE_MAX_MODEL_LEN,
            f"sequences average {_n(seq)} tokens but max_model_len is {max_len}: "
            "a lower limit stops a few long requests from holding most of the KV cache",
        )
    elif running and _waiting(s) and usage / running >= th.single_request_kv_share:
        yield Recommendation(
            Action.REDUCE_MAX_MODEL_LEN,
            f"each running request holds {usage / running:.0%} of the KV cache while {_n(_waiting(s))} wait: a "
            "{flag} (and clients' max_tokens) that bounds one sequence to a fraction of the cache stops one "
            "long generation from holding the queue",
        )
    if c is not None and c.kv_cache_memory_bytes:
        yield Recommendation(
            Action.RAISE_KV_CACHE_MEMORY_BYTES,
            f"the KV cache is pinned at {c.kv_cache_memory_bytes / 2**20:.0f} MiB by --kv-cache-memory-bytes, "
            "which overrides --gpu-memory-utilization: raise {flag} if the device has memory left",
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
        why = (
            f"{rate:.1f} preemptions/s throw away computed KV; a lower max_num_seqs (fewer concurrent sequences) "
            "leaves each one room to grow"
        )
    return Recommendation(Action.LOWER_MAX_NUM_SEQS, why)
