"""Every real capture is diagnosed as its scenario says, with and without hints; advice follows the config."""

import dataclasses

import pytest

from kvwatch.catalog import Action, Bottleneck, Confidence, Thresholds
from kvwatch.diagnose import Hints, diagnose_engine
from kvwatch.engines.vllm import ENGINE as VLLM
from kvwatch.snapshot import CacheConfig
from kvwatch.state import Target
from kvwatch.window import Signals, StreakPoint
from tests.helpers.recordings import FIXTURES, captures, recording

ACTIONS, BOTTLENECKS = list(Action), list(Bottleneck)

# Server flags from tests/fixtures/README.md.
HINTS = {
    "kv_cache": Hints(max_num_seqs=16, max_model_len=1024),
    "max_num_seqs": Hints(max_num_seqs=2, max_model_len=1024),
    "token_budget": Hints(max_num_seqs=64, max_num_batched_tokens=256, max_model_len=2048),
    "none_prefix_cache": Hints(max_num_seqs=32, max_model_len=1024),
    "max_num_seqs_running_dips": Hints(max_num_seqs=4, max_model_len=1024),
}
EXPECTED = {"none_prefix_cache": "none", "max_num_seqs_running_dips": "max_num_seqs"}


def replay(scenario, hints=Hints()):
    state = Target("fixture", hints=hints)
    out = []
    for t, f in recording(FIXTURES / scenario):
        state.observe_body(t, f.read_text())
        out.append(state.diagnose(t))
    return out


@pytest.mark.parametrize("with_hints", [False, True], ids=["no-hints", "hints"])
@pytest.mark.parametrize("scenario", sorted(HINTS))
def test_each_capture_is_diagnosed_as_its_folder_says(scenario, with_hints):
    timeline = replay(scenario, HINTS[scenario] if with_hints else Hints())
    expected_while_waiting = EXPECTED.get(scenario, scenario)
    waiting_moments = 0
    for d in timeline:
        (e,) = d.engines
        assert d.bottleneck == e.bottleneck
        if e.signals.queue.waiting:
            waiting_moments += 1
            if e.bottleneck == "undetermined":
                # Never "none" while requests wait. Without the hint the ceiling is named on a Running plateau only,
                # never by elimination: until the queue has lasted plateau_samples samples it is undetermined, at
                # low confidence, and says how long until kvwatch can tell (issue 25; issue 27 point 7).
                young = Thresholds().min_queue_samples if with_hints else Thresholds().plateau_samples
                assert e.signals.queue.waiting_streak < young, (d.timestamp, e.evidence)
                assert e.confidence == Confidence.LOW and "until kvwatch can tell" in " ".join(e.evidence), e.evidence
                continue
            assert e.bottleneck == expected_while_waiting, (d.timestamp, e.evidence)
        else:
            assert e.bottleneck in ("none", "idle"), (d.timestamp, e.evidence)
    assert timeline[0].bottleneck == "idle" and timeline[-1].bottleneck == "idle"
    if scenario != "none_prefix_cache":
        assert waiting_moments >= 8


def test_kv_cache_evidence_and_advice_follow_the_config():
    d = next(d for d in replay("kv_cache") if d.engines[0].signals.throughput.preemptions_per_second)
    e = d.engines[0]
    text = " ".join(e.evidence)
    assert "preemptions/s" in text and "KV cache" in text
    actions = [r.action for r in e.recommendations]
    assert actions == sorted(actions, key=ACTIONS.index)  # cheapest first
    assert "fp8_kv_cache" in actions  # cache_dtype auto
    assert "enable_prefix_caching" not in actions  # it is on
    assert "reduce_max_model_len" not in actions  # 500-token sequences vs 1024 is not "far shorter"
    # pinned by --kv-cache-memory-bytes, which overrides --gpu-memory-utilization: the advice is that flag's (issue 25)
    assert "raise_kv_cache_memory_bytes" in actions and "raise_gpu_memory_utilization" not in actions
    assert "lower_max_num_seqs" in actions  # preempting
    assert set(actions) <= set(ACTIONS)


def test_a_dipping_running_gauge_does_not_lower_the_inferred_ceiling():
    """Real vLLM reads Running 3 or 1 for a sample while all 4 slots are busy (tests/fixtures/README.md)."""
    inferred = {
        d.engines[0].max_num_seqs for d in replay("max_num_seqs_running_dips") if d.bottleneck == "max_num_seqs"
    }
    assert inferred >= {(4, "inferred")}
    late = [d for d in replay("max_num_seqs_running_dips") if d.bottleneck == "max_num_seqs"][5:]
    assert {d.engines[0].max_num_seqs for d in late} == {(4, "inferred")}


def test_a_queue_is_not_blamed_on_an_inferred_ceiling_before_running_plateaus():
    """The first sample with a queue is undetermined ("just formed"); the next say no limit is identified (low
    confidence, undetermined, and how long until kvwatch can tell) until Running has held its maximum over
    plateau_samples samples; then the inferred ceiling."""
    timeline = replay("max_num_seqs")
    i = next(i for i, d in enumerate(timeline) if d.engines[0].signals.queue.waiting)
    n = Thresholds().plateau_samples
    first, before, plateau = timeline[i].engines[0], timeline[i + 1 : i + n - 1], timeline[i + n - 1].engines[0]
    assert first.signals.queue.waiting_streak == 1 and first.bottleneck == "undetermined"
    assert "a queue has just formed" in first.evidence[0] and first.max_num_seqs is None
    assert f"{n - 1} more samples of the queue (~{n - 1} s) until kvwatch can tell" in first.evidence[1]
    for k, d in enumerate(before, start=2):
        e = d.engines[0]
        assert e.bottleneck == "undetermined" and e.confidence == Confidence.LOW and e.max_num_seqs is None
        assert "requests wait, no limit identified" in e.evidence[0]
        assert f"{n - k} more sample{'s' if n - k > 1 else ''} of the queue" in " ".join(e.evidence)
    assert plateau.signals.queue.waiting_streak == n and plateau.bottleneck == "max_num_seqs"
    assert plateau.max_num_seqs == (2, "inferred") and plateau.confidence == Confidence.MEDIUM
    assert f"Running held at or near 2 in {n} of the last {n} samples" in plateau.evidence[0]
    assert "ceiling inferred" in plateau.confidence_reason


def test_max_num_seqs_is_inferred_without_hint_and_reported_as_such():
    d = [d for d in replay("max_num_seqs") if d.bottleneck == "max_num_seqs"][3]
    e = d.engines[0]
    assert e.max_num_seqs == (2, "inferred")
    assert "inferred" in " ".join(e.evidence)
    assert [r.action for r in e.recommendations][0] == "raise_max_num_seqs"
    d = [d for d in replay("max_num_seqs", HINTS["max_num_seqs"]) if d.bottleneck == "max_num_seqs"][0]
    assert d.engines[0].max_num_seqs == (2, "configured")


def test_token_budget_infers_the_budget():
    e = [d for d in replay("token_budget") if d.bottleneck == "token_budget"][3].engines[0]
    assert e.max_num_batched_tokens == (256, "inferred")
    assert [r.action for r in e.recommendations][0] == "raise_max_num_batched_tokens"


# The flat names the tests speak (Signals.as_dict's) -> (part, attribute) of Signals.
_PARTS = {
    "requests_running": ("queue", "running"),
    "requests_waiting": ("queue", "waiting"),
    "requests_waiting_deferred": ("queue", "waiting_deferred"),
    "kv_cache_usage_ratio": ("kv", "usage_ratio"),
    "kv_usage_recent_max": ("kv", "recent_max"),
    **{
        k: ("queue", k)
        for k in (
            "running_mean",
            "running_recent_max",
            "running_max_waiting",
            "running_at_max_samples",
            "waiting_samples",
            "waiting_streak",
            "waiting_recent_min",
        )
    },
    **{
        k: ("throughput", k)
        for k in (
            "preemptions_per_second",
            "stalled_seconds",
            "engine_step_tokens",
            "steps_per_second",
            "step_tokens_max",
        )
    },
    **{
        k: ("capacity", k)
        for k in ("capacity_tokens", "mean_prompt_tokens", "mean_sequence_tokens", "estimated_max_concurrency", "cache")
    },
    "streak": ("queue", "streak"),
    "prompt_tokens_per_second": ("throughput", "prompt_tokens_per_second"),
    "generation_tokens_per_second": ("throughput", "generation_tokens_per_second"),
    "log_averages": ("throughput", "log_averages"),
}


def streak(running, waiting, kv=None, prompt_per_s=0.0, dt=1.0):
    """The queue's samples (what window.py keeps in QueueSignals.streak), oldest first, ``dt`` apart: Running
    and Waiting per sample, KV usage (one value for all, or a list), prefill counted per second (one value for
    every interval, or a list of them)."""
    n = len(running)
    kvs = kv if isinstance(kv, list) else [kv] * n
    rates = prompt_per_s if isinstance(prompt_per_s, list) else [prompt_per_s] * (n - 1)
    cum = [0.0]
    for r in rates:
        cum.append(cum[-1] + r * dt)
    return tuple(StreakPoint(i * dt, float(running[i]), float(waiting[i]), kvs[i], cum[i]) for i in range(n))


def _sig(**kw):
    base = dict(
        requests_running=5.0,
        requests_waiting=50.0,
        kv_cache_usage_ratio=0.97,
        kv_usage_recent_max=0.97,
        running_mean=5.0,
        running_recent_max=6.0,
        preemptions_per_second=2.0,
        capacity_tokens=100000,
        mean_prompt_tokens=300.0,
        mean_sequence_tokens=600.0,
        estimated_max_concurrency=166.0,
    )
    base.update(kw)
    s = Signals(model_name="m", engine="0", t=0.0, samples=10, span_seconds=9.0)
    for name, value in base.items():
        part, attr = _PARTS[name]
        setattr(getattr(s, part), attr, value)
    return s


@pytest.mark.parametrize(
    "cache, hints, seq_tokens, present, absent",
    [
        (CacheConfig(cache_dtype="fp8_e4m3"), Hints(), 600.0, [], ["fp8_kv_cache"]),
        (
            CacheConfig(cache_dtype="auto", enable_prefix_caching=True),
            Hints(),
            600.0,
            ["fp8_kv_cache"],
            ["enable_prefix_caching"],
        ),
        (CacheConfig(cache_dtype="auto", enable_prefix_caching=False), Hints(), 600.0, ["enable_prefix_caching"], []),
        (CacheConfig(), Hints(max_model_len=32768), 600.0, ["reduce_max_model_len"], []),
        (CacheConfig(), Hints(max_model_len=1024), 600.0, [], ["reduce_max_model_len"]),
        (CacheConfig(gpu_memory_utilization=0.95), Hints(), 600.0, [], ["raise_gpu_memory_utilization"]),
        (CacheConfig(gpu_memory_utilization=0.85), Hints(), 600.0, ["raise_gpu_memory_utilization"], []),
    ],
)
def test_kv_recommendations_only_when_config_supports_them(cache, hints, seq_tokens, present, absent):
    d = diagnose_engine(_sig(cache=cache, mean_sequence_tokens=seq_tokens), hints)
    assert d.bottleneck == "kv_cache"
    actions = {r.action for r in d.recommendations}
    assert set(present) <= actions and not set(absent) & actions, actions


def test_stalled_beats_everything_and_idle_is_idle():
    d = diagnose_engine(_sig(stalled_seconds=12.0))
    assert d.bottleneck == "stalled" and [r.action for r in d.recommendations] == ["restart_engine"]
    idle = diagnose_engine(
        _sig(requests_running=0.0, requests_waiting=0.0, running_recent_max=0.0, preemptions_per_second=0.0)
    )
    assert idle.bottleneck == "idle" and not idle.recommendations


def test_deferred_waiting_is_not_a_capacity_bottleneck():
    # not this engine's capacity, and nothing says whose: undetermined, never "none" with 50 waiting
    d = diagnose_engine(_sig(requests_waiting_deferred=50.0, kv_usage_recent_max=0.2, preemptions_per_second=0.0))
    assert d.bottleneck == "undetermined" and d.confidence == Confidence.LOW


def test_vocabulary_is_the_documented_one():
    readme = (FIXTURES.parents[2] / "docs" / "diagnosis.md").read_text()
    for b in BOTTLENECKS:
        assert f"`{b}`" in readme
    for a in ACTIONS:
        assert f"`{a}`" in readme
    assert {f.name for f in dataclasses.fields(Signals)} >= {"kv", "queue", "throughput", "latency", "capacity"}


def test_json_document_shape():
    doc = replay("kv_cache")[20].as_dict()
    assert set(doc) >= {"timestamp", "target", "bottleneck", "engines"}
    e = doc["engines"][0]
    assert set(e) >= {
        "model_name",
        "engine",
        "bottleneck",
        "confidence",
        "confidence_reason",
        "evidence",
        "recommendations",
        "signals",
    }
    assert e["confidence"] in {str(c) for c in Confidence} and e["confidence_reason"]
    assert e["evidence"][-1] == f"confidence {e['confidence']}: {e['confidence_reason']}"
    assert "streak" not in e["signals"]  # the queue's samples stay inside kvwatch
    assert all(set(r) == {"action", "flag", "why"} and r["flag"] for r in e["recommendations"])
    assert {"kv_cache_usage_ratio", "requests_running", "requests_waiting"} <= set(e["signals"])
    assert captures("kv_cache")  # the capture set is what tests/fixtures/README.md says it is


def test_stray_arrivals_apart_do_not_name_a_ceiling_by_elimination():
    # Three samples with a queue in the window, but not in a row (Poisson arrivals): the latest one alone
    # says "just formed"; a queue in two samples in a row names no limit either: Running shows no plateau.
    stray = dict(
        requests_waiting=2.0,
        requests_running=6.0,
        kv_cache_usage_ratio=0.1,
        kv_usage_recent_max=0.1,
        preemptions_per_second=0.0,
        running_mean=6.0,
        running_recent_max=6.0,
        running_max_waiting=6.0,
        running_at_max_samples=3,
        waiting_samples=3,
        waiting_recent_min=0.0,
    )
    d = diagnose_engine(_sig(waiting_streak=1, streak=streak([6], [2], 0.1), **stray))
    assert d.bottleneck == "undetermined" and "just formed" in d.evidence[0]
    d = diagnose_engine(_sig(waiting_streak=2, streak=streak([6, 6], [2, 2], 0.1, 300.0), **stray))
    assert d.bottleneck == "undetermined" and d.max_num_seqs is None and d.confidence == Confidence.LOW
    assert "requests wait, no limit identified" in d.evidence[0]


def test_no_ceiling_by_elimination_while_no_engine_step_ends():
    # Real vLLM at the start of a burst of 1800-token prompts with a 256-token budget on a slow machine: one
    # request in chunked prefill for seconds, 119 waiting, no step output yet (so no step histogram
    # observation). Running 1 is not a ceiling; nothing can be named until a step ends.
    queue = dict(
        requests_waiting=119.0,
        requests_running=1.0,
        kv_cache_usage_ratio=0.03,
        kv_usage_recent_max=0.03,
        preemptions_per_second=0.0,
        running_mean=1.0,
        running_recent_max=1.0,
        running_max_waiting=1.0,
        running_at_max_samples=3,
        waiting_samples=3,
        waiting_streak=3,
        waiting_recent_min=119.0,
    )
    d = diagnose_engine(_sig(steps_per_second=0.0, **queue))
    assert d.bottleneck == "undetermined" and d.max_num_seqs is None and "no engine step finished" in d.evidence[0]
    # the first step that ends carries the whole prompt: the token budget, with or without the hint
    first = _sig(steps_per_second=0.2, engine_step_tokens=901.0, **queue)
    assert diagnose_engine(first, Hints(max_num_batched_tokens=256)).bottleneck == "token_budget"
    assert diagnose_engine(first).bottleneck == "token_budget"
    # a configured ceiling that Running reached is named without step data, as before
    assert diagnose_engine(_sig(steps_per_second=0.0, **queue), Hints(max_num_seqs=1)).bottleneck == "max_num_seqs"
    # no step histogram at all (steps unknown, not zero): Running 1 is no plateau (no slot turned over), so no
    # limit is named (it was max_num_seqs by elimination before issue 14)
    one = streak([1, 1, 1], [119, 119, 119], 0.03, 0.0)
    d = diagnose_engine(_sig(streak=one, **queue))
    assert d.bottleneck == "undetermined" and d.confidence == Confidence.LOW and "no limit identified" in d.evidence[0]


def test_no_ceiling_by_elimination_while_one_step_could_make_the_steps_full():
    # The e2e token_budget run on a loaded machine (~3 steps/s): a 9 s window of 27 steps read 175.6 tokens per
    # step against a 256 budget, because vLLM counts each 1800-token prompt whole in the step its prefill ends.
    # 175.6 < 192 does not name the budget, but one step more (up to 2048) would: no ceiling by elimination.
    queue = dict(
        requests_waiting=108.0,
        requests_running=5.0,
        kv_cache_usage_ratio=0.11,
        kv_usage_recent_max=0.12,
        preemptions_per_second=0.0,
        running_mean=5.0,
        running_recent_max=5.0,
        running_max_waiting=6.0,
        running_at_max_samples=2,
        waiting_samples=10,
        waiting_streak=10,
        waiting_recent_min=108.0,
    )
    lumpy = _sig(engine_step_tokens=175.6, steps_per_second=3.0, step_tokens_max=2048.0, **queue)
    d = diagnose_engine(lumpy, Hints(max_num_batched_tokens=256))
    assert d.bottleneck == "undetermined" and d.max_num_seqs is None and "within one step" in d.evidence[0], d.evidence
    full = _sig(engine_step_tokens=201.0, steps_per_second=3.0, step_tokens_max=2048.0, **queue)
    assert diagnose_engine(full, Hints(max_num_batched_tokens=256)).bottleneck == "token_budget"
    # a real sequence ceiling: decode steps of ~12 tokens and a 300-token prompt's end now and then, Running held
    # at 4 (a dip to 3) while the queue persisted and prompts were admitted
    seqs = _sig(
        engine_step_tokens=12.0,
        steps_per_second=8.0,
        step_tokens_max=512.0,
        streak=streak([4, 4, 3, 4, 4], [108, 104, 100, 96, 92], 0.12, 600.0),
        **(queue | dict(requests_running=4.0, running_mean=3.6, running_recent_max=4.0, running_max_waiting=4.0)),
    )
    d = diagnose_engine(seqs)
    assert d.bottleneck == "max_num_seqs" and d.max_num_seqs == (4, "inferred")


def test_a_configured_ceiling_reached_is_seen_not_inferred():
    """With --max-num-seqs 2, every moment Running reaches 2 while requests wait is max_num_seqs of high confidence
    (the ceiling observed), not the medium of a peak near it or the inferred plateau."""
    reached = [
        d.engines[0]
        for d in replay("max_num_seqs", HINTS["max_num_seqs"])
        if d.engines[0].signals.queue.waiting and (d.engines[0].signals.queue.running_recent_max or 0) >= 2
    ]
    assert len(reached) >= 8
    for e in reached:
        assert e.bottleneck == "max_num_seqs" and e.confidence == Confidence.HIGH, e.evidence
        assert e.evidence[0].endswith("while Running is at max_num_seqs=2 (configured)")
        assert e.max_num_seqs == (2, "configured") and e.confidence_reason == "Running at the configured max_num_seqs"


def test_one_request_waiting_briefly_is_undetermined_never_none():
    """Poisson traffic leaves a request between arrival and admission now and then: no limit is named, but a request
    waits, so never "none" (the brief: never say "none" while requests wait). The evidence tells it from a queue that
    persists with no limit seen."""
    brief = dict(
        requests_waiting=1.0,
        requests_running=6.0,
        kv_cache_usage_ratio=0.1,
        kv_usage_recent_max=0.1,
        preemptions_per_second=0.0,
        running_mean=6.0,
        running_recent_max=6.0,
        running_max_waiting=6.0,
        waiting_samples=2,
        waiting_streak=2,
        waiting_recent_min=0.0,
    )
    d = diagnose_engine(_sig(streak=streak([6, 6], [1, 1], 0.1, 300.0), **brief))
    assert d.bottleneck == "undetermined" and d.confidence == Confidence.LOW
    assert d.evidence[0] == "1 request waiting briefly (between arrival and admission): no limit named"
    persisting = brief | dict(waiting_recent_min=1.0, waiting_streak=3)
    d = diagnose_engine(_sig(streak=streak([6, 6, 6], [1, 1, 1], 0.1, 300.0), **persisting))
    assert d.bottleneck == "undetermined" and d.confidence == Confidence.LOW and "no limit identified" in d.evidence[0]


def test_a_queue_small_for_the_batch_is_undetermined_never_none():
    """At GPU scale, 3 waiting beside 120-200 running (no plateau) are arrivals between two steps: no limit
    is named by elimination, and since requests wait the answer is undetermined, never "none"."""
    small = dict(
        requests_waiting=3.0,
        requests_running=150.0,
        kv_cache_usage_ratio=0.3,
        kv_usage_recent_max=0.3,
        preemptions_per_second=0.0,
        running_mean=158.0,
        running_recent_max=200.0,
        running_max_waiting=200.0,
        waiting_samples=6,
        waiting_streak=6,
        waiting_recent_min=2.0,
    )
    d = diagnose_engine(_sig(streak=streak([120, 160, 200, 140, 180, 150], [2, 3, 2, 3, 3, 3], 0.3, 9000.0), **small))
    assert d.bottleneck == "undetermined" and d.confidence == Confidence.LOW, d.evidence
    assert "arrivals between steps" in d.evidence[0], d.evidence


def _flag_names(flag: str) -> tuple[str, ...]:
    """A vLLM flag as a text names it: ``--max-num-seqs`` or its config key ``max_num_seqs``."""
    cli = flag.split()[0]
    return (cli, cli.removeprefix("--").replace("-", "_"))


def _recommendation_texts():
    """Every recommendation kvwatch gives on the real captures (with and without hints), the simulator's LoRA and
    P/D presets, and hand-made signals for the advice the captures never call for."""
    from kvwatch.sim.scenario import load_scenario
    from tests.test_diagnose_evidence import climbing, metrics_history
    from tests.test_sleep_and_lora_limits import diagnoses

    ds = [e for sc in HINTS for h in (Hints(), HINTS[sc]) for d in replay(sc, h) for e in d.engines]
    ds += diagnoses(load_scenario("max_loras"), 24) + diagnoses(load_scenario("kv_transfer"), 24)
    ds.append(diagnose_engine(metrics_history(climbing())))
    for cache, hints in [
        (CacheConfig(cache_dtype="auto", enable_prefix_caching=False), Hints(max_model_len=32768)),
        (CacheConfig(gpu_memory_utilization=0.85), Hints()),
        (CacheConfig(kv_cache_memory_bytes=2**30), Hints()),
    ]:
        ds.append(diagnose_engine(_sig(cache=cache), hints))
        ds.append(diagnose_engine(_sig(cache=cache, estimated_max_concurrency=2.0, running_recent_max=6.0), hints))
    ds.append(diagnose_engine(_sig(stalled_seconds=12.0)))
    return {(r.action, r.why) for d in ds for r in d.recommendations}


def test_every_actions_text_is_about_its_own_flag():
    """Issue 25 point 3: the --kv-cache-memory-bytes advice was filed under raise_gpu_memory_utilization. Every action
    is given somewhere, and the first vLLM flag each of its texts names (as a flag or its config key) is the action's
    own: what the text tells a user to change is what the action, its flag and the page say."""
    texts = _recommendation_texts()
    assert {a for a, _ in texts} == set(ACTIONS)
    flags = {VLLM.flag(a) for a in ACTIONS if "--" in VLLM.flag(a)}
    for action, why in texts:
        own = VLLM.flag(action)
        named = sorted((why.find(n), flag) for flag in flags for n in _flag_names(flag.split(" / ")[-1]) if n in why)
        if "--" not in own:
            assert not named, (action, why)  # replicas, restart: no flag of the engine to name
            continue
        assert named and named[0][1] == own, (action, own, why)
