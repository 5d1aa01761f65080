"""Every simulator preset is diagnosed as named with and without hints, in simulated time.

The same presets and judgement as tests/test_sim_diagnosis.py (which runs a real ``kvwatch run`` over HTTP in
real time, without hints), but in process: the simulator is advanced one simulated second at a time, its
/metrics body (``kvwatch.sim.exposition.render``, what ``kvwatch sim`` serves) is parsed and diagnosed by
kvwatch's ``Target`` at the simulator's clock. With hints, kvwatch is given the preset's own
``--max-num-seqs``, ``--max-num-batched-tokens`` and ``--max-model-len``, as a user who knows the server would.
Deterministic (seed 11, as the HTTP test); one simulation per preset serves both targets.
"""

from __future__ import annotations

import functools

import pytest

from kvwatch.diagnose import Hints
from kvwatch.sim.exposition import render
from kvwatch.sim.scenario import load_scenario
from kvwatch.sim.simulator import Simulator
from kvwatch.state import Target
from tests.helpers.sim_judge import CASES, Poll, judge, seconds


@functools.cache  # one simulation per preset and scrape phase, diagnosed by both targets
def observe(preset: str, offset: float = 0.0) -> dict[bool, list[Poll]]:
    scenario = load_scenario(preset)
    cfg = scenario.phases[0].engine
    targets = {
        False: Target(f"sim://{preset}"),
        True: Target(f"sim://{preset}", hints=Hints(cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len)),
    }
    sim = Simulator(scenario, seed=11, wall_start=1.8e9)
    polls: dict[bool, list[Poll]] = {False: [], True: []}
    for k in range(1, int(seconds(preset)) + 1):
        sim.advance_to(k + offset)
        body = render(sim)
        for hinted, target in targets.items():
            target.observe_body(sim.virtual_time, body)
            (engine,) = target.diagnose(sim.virtual_time).engines
            q = engine.signals.queue
            polls[hinted].append(
                Poll(sim.now, sim.phase_name, sim.phase_start, engine.bottleneck, q.running, q.waiting)
            )
    return polls


#: where in the simulated second kvwatch scrapes: a rule that holds at one phase of the simulator's steps and
#: arrivals only can fail at another (the stalled preset's serving phase named max_num_seqs on one waiting
#: request at 0.5 and 0.7 with hints, before near_configured_ceiling required a queue)
OFFSETS = [round(0.1 * i, 1) for i in range(10)]


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("hinted", [False, True], ids=["no-hints", "hints"])
@pytest.mark.parametrize("preset", list(CASES))
def test_preset_is_diagnosed_as_named_with_and_without_hints(preset, hinted, offset):
    speed, expected = CASES[preset]
    assert judge(preset, observe(preset, offset)[hinted], speed, expected).judged >= len(expected)


def test_every_preset_but_the_tour_keeps_one_engine_config():
    """The hints are the preset's flags: a preset whose phases changed them could not be hinted once."""
    for preset in CASES:
        s = load_scenario(preset)
        flags = {(p.engine.max_num_seqs, p.engine.max_num_batched_tokens, p.engine.max_model_len) for p in s.phases}
        assert len(flags) == 1, (preset, flags)


@pytest.mark.parametrize("preset", [p for p in CASES if "stalled" in CASES[p][1]])
def test_a_stalling_engine_is_never_given_a_limit(preset):
    """Before the stall rule can tell (max(5 s, 3 intervals) without progress), Running is flat with a queue: a
    plateau. An engine that generates nothing is not at a ceiling: until then no limit is named (``none``, or
    ``undetermined`` while requests wait), then ``stalled``."""
    for hinted, polls in observe(preset).items():
        named = [(round(p.sim_time - p.phase_start, 1), p.bottleneck) for p in polls if p.phase == "stalled"]
        assert named and {b for _, b in named} <= {"none", "undetermined", "stalled"}, (preset, hinted, named)
        assert "stalled" in {b for _, b in named}, (preset, hinted, named)


@pytest.mark.parametrize("offset", [0.0, 0.2, 0.4, 0.6, 0.8])
def test_past_preemptions_do_not_name_kv_once_it_has_drained(offset):
    """The tour's recovery, scraped at every phase of the second: the kv_cache phase's preemptions stay in the
    10-s window for seconds after KV drains, and a stray arrival then found them (the HTTP test once read
    kv_cache 6-11 s into recovery with KV at 0.06). Only recent preemptions are a sign."""
    sim, target = Simulator(load_scenario("tour"), seed=11, wall_start=1.8e9), Target("sim://tour")
    seen = []
    for k in range(1, 60):
        sim.advance_to(k + offset)
        target.observe_body(sim.virtual_time, render(sim))
        (engine,) = target.diagnose(sim.virtual_time).engines
        if sim.phase_name == "recovery":
            waiting = bool(engine.signals.queue.waiting)
            seen.append((round(sim.now - sim.phase_start, 1), str(engine.bottleneck), waiting))
    late = [(b, waiting) for since, b, waiting in seen if since > CASES["tour"][1]["recovery"][1]]
    # no limit: none, or undetermined where a stray arrival waits (never none while one does)
    assert late and all(b == ("undetermined" if waiting else "none") for b, waiting in late), seen


@pytest.mark.parametrize("hinted", [False, True], ids=["no-hints", "hints"])
def test_a_prefill_only_queue_at_low_kv_is_the_token_budget(hinted):
    """llm-d/llm-d-autoscaling#662's prefill-only run: an H100, 6000 input and 2 output tokens per request, 8
    requests/s, --max-num-batched-tokens 65000; Waiting grew constantly while Running sat at ~20 and KV at ~32 %,
    so a KV-usage signal never called it saturated. Here (Llama 3.1 8B's H100 preset with those flags and that
    load) prefill paces admission: token_budget, never kv_cache or a sequence ceiling, with KV well below half."""
    sc = load_scenario(
        "gpu_healthy",
        overrides={
            "engine": {"max_num_batched_tokens": 65000},
            "workload": {
                "rate": 8.0,
                "prompt_tokens": 6000,
                "output_tokens": 2,
                "ignore_eos": True,
                "max_outstanding": 5000,
            },
        },
    )
    cfg = sc.phases[0].engine
    hints = Hints(cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len) if hinted else Hints()
    sim, target = Simulator(sc, seed=11, wall_start=1.8e9), Target("sim://662", hints=hints)
    seen = []
    for k in range(1, 61):
        sim.advance_to(float(k))
        target.observe_body(sim.virtual_time, render(sim))
        (engine,) = target.diagnose(sim.virtual_time).engines
        seen.append((k, str(engine.bottleneck), engine.signals.kv.usage_ratio, engine.signals.queue.waiting))
    settled = [b for k, b, _, _ in seen if k > 15]
    assert settled.count("token_budget") >= 0.9 * len(settled) and not {"kv_cache", "max_num_seqs"} & set(settled), seen
    assert max(kv for _, _, kv, _ in seen) < 0.5 and seen[-1][3] > seen[20][3] > 0, seen  # KV low, the queue grows


def _visit(times, names, start=10.0):
    return [Poll(start - 1.0, "before", 0.0, "none")] + [
        Poll(start + t, "kv_cache", start, b) for t, b in zip(times, names, strict=True)
    ]


def test_the_judge_counts_lag_in_kvwatch_scrapes_and_leaves_sparse_visits_unjudged():
    """judge's ``interval`` mode (the HTTP test's): a phase with a lag of 6 s must be named by kvwatch's 7th
    successful scrape of the visit, however late those came; the 8th is too late; gaps over 2.5 intervals leave
    the visit unjudged, not passed."""
    expected, late = {"kv_cache": ("kv_cache", 6.0)}, ["none"] * 7 + ["kv_cache"] * 13
    on_time = ["none"] * 6 + ["kv_cache"] * 14
    assert judge("p", _visit([0.5 + i for i in range(20)], on_time), 1.0, expected, interval=1.0).judged == 1
    # starved: 2-s apart, named at the 7th scrape, 12.5 s in: in scrapes on time, in seconds not
    assert judge("p", _visit([0.5 + 2 * i for i in range(20)], on_time), 1.0, expected, interval=1.0).judged == 1
    with pytest.raises(AssertionError, match="only at kvwatch's scrape 8"):
        judge("p", _visit([0.5 + i for i in range(20)], late), 1.0, expected, interval=1.0)
    with pytest.raises(AssertionError, match="never diagnosed"):
        judge("p", _visit([0.5 + i for i in range(20)], ["none"] * 20), 1.0, expected, interval=1.0)
    settled_wrong = on_time[:10] + ["none"] * 10
    with pytest.raises(AssertionError):
        judge("p", _visit([0.5 + i for i in range(20)], settled_wrong), 1.0, expected, interval=1.0)
    gapped = judge(
        "p", _visit([0.5, 1.5, 5.0] + [6.0 + i for i in range(17)], ["none"] * 20), 1.0, expected, interval=1.0
    )
    assert gapped.judged == 0 and gapped.unjudged == ["kv_cache at 10.0 s: kvwatch's scrapes 3.5 s apart"]
