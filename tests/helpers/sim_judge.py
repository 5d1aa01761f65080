"""Judging a simulator preset's diagnoses: each phase visit is named as expected within its lag and stays so.

Shared by tests/test_sim_diagnosis.py (kvwatch run over HTTP, real time, no hints) and
tests/test_sim_hints.py (the same presets in simulated time, with and without hints).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvwatch.catalog import Thresholds

__all__ = ["CASES", "Judged", "MAX_GAP_INTERVALS", "Poll", "judge", "seconds"]

#: kvwatch's successful scrapes of a visit further apart than this many intervals leave it unjudged (see judge)
MAX_GAP_INTERVALS = 2.5

# Without a hint kvwatch names the sequence ceiling on a Running plateau only (never by elimination): the queue must
# have been seen in plateau_samples 1-s scrapes, after kvwatch's first scrape of the simulator and the scrape's
# phase against the simulator's clock (up to a second each).
PLATEAU_LAG = Thresholds().plateau_samples + 3.0

# preset: (speed, {phase: (expected bottleneck, allowed lag in simulated seconds)})
CASES = {
    "idle": (1.0, {"idle": ("idle", 6.0)}),
    "healthy": (1.0, {"healthy": ("none", 6.0)}),
    "kv_cache": (1.0, {"kv_cache": ("kv_cache", 6.0)}),
    "max_num_seqs": (1.0, {"max_num_seqs": ("max_num_seqs", PLATEAU_LAG)}),
    "token_budget": (1.0, {"token_budget": ("token_budget", 6.0)}),
    # kvwatch calls a target stalled after max(5 s, 3 intervals) without token progress
    "stalled": (1.0, {"serving": ("none", 6.0), "stalled": ("stalled", 10.0)}),
    # asleep: engine_sleep_state changes at once, within a scrape; the frozen rest must never read stalled
    "asleep": (1.0, {"serving": ("none", 6.0), "asleep": ("asleep", 3.0)}),
    # max_loras: a queue of deferred requests in min_queue_samples scrapes
    "max_loras": (1.0, {"max_loras": ("max_loras", 6.0)}),
    "kv_transfer": (1.0, {"kv_transfer": ("kv_transfer", 6.0)}),
    # The tour in real time too: each phase is judged with the previous one still in kvwatch's
    # 10 s window (max_num_seqs follows recovery's decaying preemption rate; token_budget's mean
    # tokens per step must climb from max_num_seqs' ~64: with hints it is named once the window holds
    # only this phase, and the first scrape after that is up to one interval past 10 s, 10.3 s when
    # scraped 0.3 s into each second).
    "tour": (
        1.0,
        {
            "healthy": ("none", 6.0),
            "kv_cache": ("kv_cache", 6.0),
            "recovery": ("none", 6.0),
            "max_num_seqs": ("max_num_seqs", PLATEAU_LAG),
            "token_budget": ("token_budget", 11.0),
        },
    ),
    # The GPU regime (kvwatch/scenarios/gpu_*.json: Llama 3.1 8B on an H100, 70B on four). A GPU server's
    # 'filling' phase (prefill paces admission until the cache or the ceiling is reached) is not judged.
    "gpu_idle": (1.0, {"idle": ("idle", 6.0)}),
    "gpu_healthy": (1.0, {"healthy": ("none", 6.0)}),
    "gpu_kv_cache": (1.0, {"kv_cache": ("kv_cache", 6.0)}),
    "gpu_max_num_seqs": (1.0, {"max_num_seqs": ("max_num_seqs", PLATEAU_LAG)}),
    "gpu_token_budget": (1.0, {"token_budget": ("token_budget", 6.0)}),
    "gpu_stalled": (1.0, {"serving": ("none", 6.0), "stalled": ("stalled", 10.0)}),
    "gpu_asleep": (1.0, {"serving": ("none", 6.0), "asleep": ("asleep", 3.0)}),
    "gpu_max_loras": (1.0, {"max_loras": ("max_loras", 6.0)}),
    "gpu_kv_transfer": (1.0, {"kv_transfer": ("kv_transfer", 6.0)}),
}

# Simulated seconds each preset is watched: long enough for its judged phases (a filling phase first).
SECONDS = {"tour": 118.0, "gpu_kv_cache": 36.0, "gpu_max_num_seqs": 26.0}
SINGLE_STATE_SECONDS = 24.0  # stalled needs 10 s of serving first


def seconds(preset: str) -> float:
    return SECONDS.get(preset, SINGLE_STATE_SECONDS)


@dataclass
class Judged:
    judged: int = 0  # phase visits judged
    unjudged: list[str] = field(default_factory=list)  # visits long enough but too sparsely scraped, and why


@dataclass
class Poll:
    sim_time: float
    phase: str
    phase_start: float
    bottleneck: str
    running: float | None = None
    waiting: float | None = None
    kv: float | None = None
    preempt: float | None = None
    step_tokens: float | None = None


def _right(p: Poll, want: str) -> bool:
    """Where no limit binds (want "none"), a sample with requests waiting reads undetermined, never "none"
    (issue 25: a healthy server's queue of 3 at 49 running, in its first sample, is not yet known to be transient)."""
    return p.bottleneck == want or (want == "none" and p.bottleneck == "undetermined" and bool(p.waiting))


def judge(preset: str, polls: list[Poll], speed: float, expected: dict, *, interval: float | None = None) -> Judged:
    """Assert every phase visit long enough to judge; return how many were judged and which were not.

    ``polls`` in simulated time (the in-process test: one a simulated second) are judged on the simulator's clock.
    With ``interval``, ``polls`` are kvwatch's own record of its successful scrapes (``/api/v1/history``, real
    time over HTTP) and the lag is counted in those scrapes: a phase named within ``lag`` seconds at one scrape
    a second is named by scrape ``lag / interval + 1`` of the visit, however late a starved machine made them,
    since kvwatch never scrapes more often than once an interval (so its k-th scrape comes no earlier than at 1-s
    spacing, and rules that wait for time or for samples have both). A visit where kvwatch's successful scrapes
    left a gap over ``MAX_GAP_INTERVALS`` intervals (timeouts on a CPU-starved machine: the window then holds too
    few samples for a plateau) is not judged but returned, with its gap, for the caller to report."""
    seen_phases = {p.phase for p in polls}
    assert set(expected) <= seen_phases, f"{preset}: phases seen {seen_phases}"
    out = Judged()
    for phase, (want, lag) in expected.items():
        in_phase = [p for p in polls if p.phase == phase]
        for start in sorted({p.phase_start for p in in_phase}):  # each visit (the tour loops)
            visit = [p for p in in_phase if p.phase_start == start]
            if visit[-1].sim_time - start < lag + 2 * speed:
                continue  # the observation ended during this visit
            trace = [(round(p.sim_time - start, 1), p.bottleneck) for p in visit]
            if interval is not None:
                times = [start] + [p.sim_time for p in visit]
                gap = max(b - a for a, b in zip(times, times[1:], strict=False)) / speed
                if gap > MAX_GAP_INTERVALS * interval:
                    out.unjudged.append(f"{phase} at {start:.1f} s: kvwatch's scrapes {gap:.1f} s apart")
                    continue
            out.judged += 1
            first = next((i for i, p in enumerate(visit) if _right(p, want)), None)
            assert first is not None, f"{preset}/{phase}: never diagnosed {want}: {trace}"
            if interval is None:
                settled = [p for p in visit if p.sim_time - start > lag]
                if visit[0].sim_time - start <= 2 * speed:  # watched from its start (not before kvwatch was up)
                    since = visit[first].sim_time - start
                    assert since <= lag, f"{preset}/{phase}: {want} only after {since:.1f} s: {trace}"
            else:
                allowed = int(lag / interval) + 1  # the scrape of the visit by which a correct kvwatch names it
                settled = visit[allowed:]
                assert first < allowed, (
                    f"{preset}/{phase}: {want} only at kvwatch's scrape {first + 1} of the visit (allowed {allowed}): {trace}"
                )
            wrong = [p for p in settled if not _right(p, want)]
            assert len(wrong) <= max(1, len(settled) // 10), f"{preset}/{phase}: {trace}"
    return out
