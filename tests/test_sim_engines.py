"""Every simulator preset, served as SGLang, TensorRT-LLM and llama.cpp, is read by the adapter of that engine
(``engine="auto"``) and diagnosed as that engine's metrics allow.

The same simulations and judge as tests/test_sim_hints.py (vLLM), in simulated time: each preset is advanced one
simulated second at a time, rendered by each engine's exposition (kvwatch.sim.expositions) and diagnosed by a
``Target`` with and without the preset's flags as hints. A limit the engine can show (``Engine.shows``) is judged
as for vLLM; for one it cannot, the verdict that engine's metrics support is written out below (EXPECTED), and
no other limit may be named in that phase at any scrape (``test_a_limit_the_engine_cannot_show_is_never_named_as_
another``).
"""

from __future__ import annotations

import functools

import pytest

from kvwatch.catalog import Action, Bottleneck
from kvwatch.diagnose import Hints
from kvwatch.engines import by_name
from kvwatch.sim.expositions import EXPOSITIONS
from kvwatch.sim.scenario import load_scenario
from kvwatch.sim.simulator import Simulator
from kvwatch.state import Target
from tests.helpers.sim_judge import CASES, Poll, judge, seconds

ENGINES = ("sglang", "trtllm", "triton-trtllm", "llamacpp")

# Limits the trtllm adapter can show in trtllm-serve's form but not in Triton's: Triton's nv_trt_llm_* gauges carry
# no token counter and no max_num_tokens (FAMILIES.md section 2), so nothing shows the step budget there.
FORM_CANNOT_SHOW = {"triton-trtllm": {"token_budget"}}


def shows(engine: str) -> set[str]:
    """The limits this exposition can show: its adapter's ``Engine.shows``, less what its form lacks."""
    return {str(b) for b in by_name(EXPOSITIONS[engine].engine).shows} - FORM_CANNOT_SHOW.get(engine, set())


# A paused engine with requests in flight and no sleep state in its metrics is, by those metrics, a stall: after the
# stall rule's max(5 s, 3 intervals) without progress, as for a wedged engine.
_ASLEEP = {"serving": ("none", 6.0), "asleep": ("stalled", 10.0)}

_TRTLLM = {
    "asleep": _ASLEEP,
    "gpu_asleep": _ASLEEP,
    "max_loras": {"max_loras": ("none", 6.0)},
    "gpu_max_loras": {"max_loras": ("none", 6.0)},
    "kv_transfer": {"kv_transfer": ("none", 6.0)},
    "gpu_kv_transfer": {"kv_transfer": ("none", 6.0)},
    "token_budget": {"token_budget": ("none", 6.0)},
    "gpu_token_budget": {"token_budget": ("none", 6.0)},
    "tour": {**CASES["tour"][1], "token_budget": ("none", 6.0)},
}

# Per engine, the presets whose expected verdicts differ from vLLM's (tests/helpers/sim_judge.CASES), and why.
OVERRIDES: dict[str, dict[str, dict[str, tuple[str, float]]]] = {
    # SGLang shows no sleep state, and its LoRA slots (lora_pool_slots_*) but not which adapters wait: a queue while
    # every slot is taken is undetermined (diagnose.lora_slots_taken), never a ceiling inferred from Running.
    "sglang": {
        "asleep": _ASLEEP,
        "gpu_asleep": _ASLEEP,
        "max_loras": {"max_loras": ("undetermined", 6.0)},
        "gpu_max_loras": {"max_loras": ("undetermined", 6.0)},
    },
    # trtllm-serve: no sleep state, no LoRA queue, no KV-transfer stages; its queue there has room: none. No step
    # data read, and its token counters move as requests end (EngineSnapshot.tokens_at_request_end): no step budget.
    "trtllm": _TRTLLM,
    # Triton's TensorRT-LLM backend: the same blind spots, and no token counters at all.
    "triton-trtllm": _TRTLLM,
    # llama.cpp: no KV gauge, no step data, no LoRA queue, no P/D, no sleep state. Its slots are the simulated
    # max_num_seqs and a request waits (deferred) only when every slot is busy (kvwatch.sim.exposition_llamacpp). Its
    # /slots shows each slot's context (max_model_len): no preset's request reaches it, so none names kv_cache for it
    # (test_a_request_cut_short_at_its_slots_context_is_named_for_llamacpp does).
    "llamacpp": {
        "asleep": _ASLEEP,
        "gpu_asleep": _ASLEEP,
        # 16 slots, ~70 requests in the server from the first second: the slots really bind, and kvwatch reads
        # the slot count while requests are deferred.
        "kv_cache": {"kv_cache": ("max_num_seqs", 6.0)},
        # ~60-175 requests in the server, 1024 slots: nothing deferred, and /slots shows no slot's context (the
        # scenario's max_model_len, 32768) filled, the fullest ~40 % (a KV pool shared by slots is not judged): none.
        "gpu_kv_cache": {"kv_cache": ("none", 6.0)},
        "token_budget": {"token_budget": ("none", 6.0)},
        "gpu_token_budget": {"token_budget": ("none", 6.0)},
        "max_loras": {"max_loras": ("none", 6.0)},
        "gpu_max_loras": {"max_loras": ("none", 6.0)},
        "kv_transfer": {"kv_transfer": ("none", 6.0)},
        "gpu_kv_transfer": {"kv_transfer": ("none", 6.0)},
        # The tour's kv_cache phase caps clients at 40 outstanding over 32 slots: requests are first deferred ~9 s
        # into the phase, so the slot ceiling is named by 11 s; its token_budget phase shows nothing nameable.
        "tour": {
            **CASES["tour"][1],
            "kv_cache": ("max_num_seqs", 11.0),
            "token_budget": ("none", 6.0),
        },
    },
}


def expected(engine: str, preset: str) -> dict[str, tuple[str, float]]:
    return OVERRIDES[engine].get(preset, CASES[preset][1])


@functools.cache  # one simulation per preset and scrape phase, diagnosed by every engine's two targets
def observe(preset: str, offset: float) -> dict[tuple[str, bool], list[Poll]]:
    scenario = load_scenario(preset)
    cfg = scenario.phases[0].engine
    hints = Hints(cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len)
    targets = {
        (e, h): Target(f"sim://{preset}/{e}", hints=hints if h else Hints()) for e in ENGINES for h in (False, True)
    }
    sim = Simulator(scenario, seed=11, wall_start=1.8e9)
    polls: dict[tuple[str, bool], list[Poll]] = {k: [] for k in targets}
    for k in range(1, int(seconds(preset)) + 1):
        sim.advance_to(k + offset)
        bodies = {e: EXPOSITIONS[e].render(sim) for e in ENGINES}
        # and the engine's extra path, read right after its metrics as kvwatch run does (llama.cpp's /slots)
        extras = {e: x.render_extra(sim) for e in ENGINES if (x := EXPOSITIONS[e]).render_extra}
        for (e, h), target in targets.items():
            target.observe_body(sim.virtual_time, bodies[e], extras.get(e))
            assert target.engine_kind is by_name(EXPOSITIONS[e].engine), (preset, e, target.engine_kind)
            (engine,) = target.diagnose(sim.virtual_time).engines
            if e in extras:  # its slots were read (each slot's context), not only its metrics
                assert engine.signals.kv.context_used_max_ratio is not None, (preset, e)
            q = engine.signals.queue
            polls[e, h].append(Poll(sim.now, sim.phase_name, sim.phase_start, engine.bottleneck, q.running, q.waiting))
    return polls


#: where in the simulated second kvwatch scrapes (test_sim_hints scrapes ten; three here, for three engines)
OFFSETS = (0.0, 0.3, 0.7)


@pytest.mark.parametrize("offset", OFFSETS)
@pytest.mark.parametrize("hinted", [False, True], ids=["no-hints", "hints"])
@pytest.mark.parametrize(
    ("preset", "engine"),
    [pytest.param(p, e, id=f"{p}-{e}") for p in CASES for e in ENGINES],
)
def test_preset_is_diagnosed_as_the_engine_can_show(preset, engine, hinted, offset):
    want = expected(engine, preset)
    assert judge(f"{preset}/{engine}", observe(preset, offset)[engine, hinted], 1.0, want).judged >= len(want)


@pytest.mark.parametrize("engine", ENGINES)
def test_expected_verdicts_name_only_limits_the_engine_can_show(engine):
    """The table above never expects a limit the engine's metrics cannot show, and changes vLLM's expectation
    only where the engine cannot show it (or, llama.cpp, where its slots bind instead)."""
    can = shows(engine)
    for preset in CASES:
        for phase, (want, _) in expected(engine, preset).items():
            assert want in can | {"none", "idle"}, (engine, preset, phase, want)
            vllm_want = CASES[preset][1][phase][0]
            if want != vllm_want and engine != "llamacpp":
                assert vllm_want not in can, (engine, preset, phase)


@pytest.mark.parametrize("hinted", [False, True], ids=["no-hints", "hints"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_limit_the_engine_cannot_show_is_never_named_as_another(engine, hinted):
    """In a phase whose limit the engine cannot show, kvwatch says the verdict the table expects, none or (requests
    waiting, no limit it can name) undetermined, at every scrape once the window holds only that phase (a tour's phase
    starts with the last one's samples), at every phase of the second: never some other limit (max_num_seqs,
    token_budget, kv_cache)."""
    can = shows(engine)
    window = Target("x").window_seconds
    for preset, (_, phases) in CASES.items():
        for phase, (vllm_want, _) in phases.items():
            if vllm_want in can | {"none", "idle"}:
                continue
            allowed = {expected(engine, preset)[phase][0], str(Bottleneck.NONE), str(Bottleneck.UNDETERMINED)}
            for offset in OFFSETS:
                polls = observe(preset, offset)[engine, hinted]
                named = {
                    p.bottleneck
                    for p in polls
                    if p.phase == phase and (p.phase_start == 0 or p.sim_time - p.phase_start >= window)
                }
                assert named and named <= allowed, (preset, engine, phase, offset, named - allowed)


def test_a_request_cut_short_at_its_slots_context_is_named_for_llamacpp():
    """The healthy preset with max_model_len 512: its longest requests (up to ~800 tokens) end at max_model_len, as
    llama.cpp cuts a request short at the end of its slot's context. Read as llama.cpp with its /slots, kvwatch names
    the per-slot context (kv_cache) with llama.cpp's flags; from its /metrics alone it cannot (KV not judged)."""
    scenario = load_scenario("healthy", overrides={"engine": {"max_model_len": 512}})
    sim = Simulator(scenario, seed=11, wall_start=1.8e9)
    with_slots, metrics_only = Target("sim://llamacpp"), Target("sim://llamacpp-metrics-only")
    exposition = EXPOSITIONS["llamacpp"]
    named, blind = [], []
    for k in range(1, 25):
        sim.advance_to(float(k))
        body, slots = exposition.render(sim), exposition.render_extra(sim)
        with_slots.observe_body(sim.virtual_time, body, slots)
        metrics_only.observe_body(sim.virtual_time, body)
        named.append(with_slots.diagnose(sim.virtual_time).engines[0])
        blind.append(metrics_only.diagnose(sim.virtual_time).engines[0])
    settled = named[5:]
    assert all(e.bottleneck is Bottleneck.KV_CACHE for e in settled), [e.bottleneck for e in named]
    recs = {r.action: r.flag for r in settled[-1].recommendations}
    assert recs[Action.RAISE_KV_CACHE_MEMORY_BYTES] == "--ctx-size" and recs[Action.LOWER_MAX_NUM_SEQS] == "--parallel"
    assert "512-token context" in settled[-1].evidence[0], settled[-1].evidence
    assert all(e.bottleneck is not Bottleneck.KV_CACHE for e in blind)
    assert any(line.startswith("KV cache not judged") for line in blind[-1].evidence)
