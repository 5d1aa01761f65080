"""Issue 14 §2, the limits vLLM added: ``asleep`` (engine_sleep_state) and ``max_loras`` (lora_requests_info and
``waiting_by_reason{reason="deferred"}``), read from the simulator's /metrics as vLLM renders them (its
exposition follows vLLM 0.32/0.33 ``v1/metrics/loggers.py``), through parse, normalize, the window and the rules.

Each test also runs the same data without the evidence the rule needs, so it fails if the rule names the limit
without it (asleep without the sleep state reads stalled; max_loras without a full adapter set is no limit).
"""

from __future__ import annotations

import re

from kvwatch.catalog import Action, Bottleneck, Confidence, Thresholds
from kvwatch.diagnose import RULES, Hints, diagnose_engine
from kvwatch.engines.sglang import ENGINE as SGLANG
from kvwatch.engines.vllm import read as read_vllm
from kvwatch.parse import parse
from kvwatch.sim import exposition_sglang
from kvwatch.sim.exposition import render
from kvwatch.sim.scenario import load_scenario
from kvwatch.sim.simulator import Simulator
from kvwatch.snapshot import EngineSnapshot
from kvwatch.window import EngineHistory, summarize

NAMES = [r.__name__ for r in RULES]


def diagnoses(scenario, seconds: int, edit=lambda body: body, hints=Hints()):
    """One diagnosis per simulated second of ``scenario``, its /metrics body passed through ``edit`` first."""
    sim = Simulator(scenario, seed=11)
    history, out = None, []
    for t in range(1, seconds + 1):
        sim.advance_to(float(t))
        ((key, snap),) = read_vllm(parse(edit(render(sim, "0.32")))).items()
        history = history or EngineHistory(*key, keep_seconds=11.0)
        history.add(float(t), snap)
        out.append(diagnose_engine(summarize(history, float(t), 10.0), hints))
    return out


def sglang_diagnoses(scenario, seconds: int, edit=lambda body: body, hints=Hints()):
    """The same, served as SGLang (kvwatch.sim.exposition_sglang) and read by SGLang's adapter."""
    sim = Simulator(scenario, seed=11)
    history, out = None, []
    for t in range(1, seconds + 1):
        sim.advance_to(float(t))
        body = edit(exposition_sglang.render(sim))
        ((key, snap),) = SGLANG.read(parse(body, SGLANG.keep_family), 64).items()
        history = history or EngineHistory(*key, keep_seconds=11.0)
        history.add(float(t), snap)
        out.append(diagnose_engine(summarize(history, float(t), 10.0), hints, engine=SGLANG))
    return out


def without_family(name: str):
    return lambda body: "\n".join(line for line in body.splitlines() if name not in line) + "\n"


# --- normalize: engine_sleep_state ---------------------------------------------------------------------------


def sleep_body(awake: float, offloaded: float, discarded: float) -> str:
    # the layout of vLLM 0.32's capture (tests/fixtures/vllm-0.32.0-cpu/kv_cache/*.prom)
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 0\n'
        "# TYPE vllm:engine_sleep_state gauge\n"
        f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="awake"}} {awake}\n'
        f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="weights_offloaded"}} {offloaded}\n'
        f'vllm:engine_sleep_state{{engine="0",model_name="m",sleep_state="discard_all"}} {discarded}\n'
    )


def test_sleep_state_levels_as_vllm_record_sleep_state_sets_them():
    levels = {
        (1, 0, 0): 0,  # awake
        (0, 1, 0): 1,  # sleep level 1
        (0, 0, 1): 2,  # sleep level 2
        (0, 0, 0): 1,  # asleep at a level vLLM gives no label: asleep all the same
    }
    for states, level in levels.items():
        (snap,) = read_vllm(parse(sleep_body(*states))).values()
        assert snap.sleep_level == level, states


def test_the_real_capture_reads_awake():
    from pathlib import Path

    body = next(Path("tests/fixtures/vllm-0.32.0-cpu/kv_cache").glob("*.prom")).read_text()
    assert {s.sleep_level for s in read_vllm(parse(body)).values()} == {0}


# --- asleep ----------------------------------------------------------------------------------------------------


def test_asleep_preset_reads_asleep_never_stalled_and_never_restart():
    ds = diagnoses(load_scenario("asleep"), 30)
    asleep = ds[10:]  # the phase starts at 10 s; engine_sleep_state changes with it
    assert {d.bottleneck for d in asleep} == {Bottleneck.ASLEEP}
    assert all(d.confidence is Confidence.HIGH for d in asleep)
    assert not any(r.action is Action.RESTART_ENGINE for d in asleep for r in d.recommendations)
    assert "level 1: weights offloaded" in asleep[-1].evidence[0]
    assert asleep[-1].signals.as_dict()["asleep"] is True
    # requests were present and frozen: without the sleep state the same data is a stalled engine
    blind = diagnoses(load_scenario("asleep"), 30, without_family("engine_sleep_state"))
    assert blind[-1].bottleneck is Bottleneck.STALLED


def test_asleep_rule_comes_before_stalled():
    assert NAMES.index("asleep") < NAMES.index("stalled")


# --- max_loras -------------------------------------------------------------------------------------------------


def test_max_loras_preset_names_the_lora_slots_and_the_trade_off():
    ds = diagnoses(load_scenario("max_loras"), 24)
    settled = ds[6:]
    named = [d for d in settled if d.bottleneck is Bottleneck.MAX_LORAS]
    assert len(named) >= 0.9 * len(settled), [d.bottleneck.value for d in settled]
    d = named[-1]
    assert re.search(r"fill max_loras=1 \(1 running\) and 3 more adapters wait", d.evidence[0]), d.evidence
    assert "deferred" in d.evidence[0]
    top = d.recommendations[0]
    assert top.action is Action.RAISE_MAX_LORAS
    assert "--max-loras 4" in top.why and "--max-lora-rank" in top.why


def test_max_loras_with_hints_too():
    cfg = load_scenario("max_loras").phases[0].engine
    ds = diagnoses(load_scenario("max_loras"), 24, hints=Hints(cfg.max_num_seqs, cfg.max_num_batched_tokens))
    assert sum(d.bottleneck is Bottleneck.MAX_LORAS for d in ds[6:]) >= 0.9 * len(ds[6:])


def test_enough_lora_slots_are_not_max_loras():
    """The same traffic with a slot for every adapter: nothing is deferred, no LoRA limit is named."""
    ds = diagnoses(load_scenario("max_loras", overrides={"engine": {"max_loras": 4}}), 24)
    assert not any(d.bottleneck is Bottleneck.MAX_LORAS for d in ds)


def test_max_loras_needs_the_adapter_info():
    """Without lora_requests_info the deferred queue alone is vLLM's own "not capacity": undetermined (requests wait:
    never none, issue 25), not max_loras."""
    ds = diagnoses(load_scenario("max_loras"), 24, without_family("lora_requests_info"))
    assert not any(d.bottleneck is Bottleneck.MAX_LORAS for d in ds)
    assert ds[-1].bottleneck is Bottleneck.UNDETERMINED and ds[-1].signals.queue.waiting


def test_the_docs_list_the_rules_in_their_order():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "diagnosis.md").read_text()
    section = page.split("## The rules, in order", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\d+\. `(\w+)` →", section, re.M) == NAMES


# --- admission rejections (HTTP 503 from --max-num-queued-reqs / --max-num-queued-tokens) ----------------------


def capped(preset: str, cap: int = 8):
    return load_scenario(preset, overrides={"engine": {"max_num_queued_reqs": cap}})


def test_rejections_in_the_real_capture_read_zero_for_each_reason():
    """vLLM 0.32 labels vllm:admission_rejections_total by model_name and reason only (no engine)."""
    from pathlib import Path

    files = sorted(Path("tests/fixtures/vllm-0.32.0-cpu/max_num_seqs").glob("*.prom"))[:3]
    history = None
    for k, f in enumerate(files):
        ((key, snap),) = read_vllm(parse(f.read_text())).items()
        history = history or EngineHistory(*key, keep_seconds=11.0)
        history.add(1000.0 + k, snap)
    s = summarize(history, 1000.0 + len(files) - 1, 10.0)
    assert dict(s.throughput.rejections_per_second) == {"max_num_queued_reqs": 0.0, "max_num_queued_tokens": 0.0}
    assert not any("HTTP 503" in e for e in diagnose_engine(s).evidence)


def test_rejections_are_said_in_the_evidence_of_the_limit_behind_the_queue():
    ds = diagnoses(capped("max_num_seqs"), 24)
    d = ds[-1]
    assert d.bottleneck is Bottleneck.MAX_NUM_SEQS  # the cap does not change what binds
    said = [e for e in d.evidence if "HTTP 503" in e]
    assert len(said) == 1 and "max_num_queued_reqs" in said[0] and "max_num_seqs builds" in said[0], d.evidence
    rate = dict(d.signals.throughput.rejections_per_second)["max_num_queued_reqs"]
    assert rate > 0 and d.signals.as_dict()["rejections_per_second"]["max_num_queued_reqs"] == round(rate, 4)
    # the same traffic without the cap: nothing rejected, nothing said
    assert not any("HTTP 503" in e for e in diagnoses(load_scenario("max_num_seqs"), 24)[-1].evidence)


def test_rejections_are_exported_per_reason():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from kvwatch.export import KvwatchCollector
    from kvwatch.state import Target

    sim, t = Simulator(capped("max_num_seqs"), seed=11), Target("http://x:1/metrics")
    for k in range(1, 16):
        sim.advance_to(float(k))
        t.observe_body(float(k), render(sim, "0.32"))
    t.up, t.diagnosis = True, t.diagnose(15.0)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(KvwatchCollector(lambda: [t]))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    rates = {s.labels["reason"]: s.value for s in fams["kvwatch_rejections_per_second"].samples}
    assert set(rates) == {"max_num_queued_reqs", "max_num_queued_tokens"}
    assert rates["max_num_queued_reqs"] > 0 and rates["max_num_queued_tokens"] == 0


# --- kv_transfer (a P/D decode engine waiting on remote KV) ----------------------------------------------------


def test_kv_transfer_preset_is_named_with_advice_for_the_prefill_side():
    ds = diagnoses(load_scenario("kv_transfer"), 24)
    settled = ds[4:]
    assert all(d.bottleneck is Bottleneck.KV_TRANSFER for d in settled), [d.bottleneck.value for d in settled]
    d = ds[-1]
    assert re.match(r"\d+ of \d+ waiting requests wait for their KV from the prefill side", d.evidence[0])
    assert "arrived over the connector" in d.evidence[0]
    assert [r.action for r in d.recommendations] == [Action.SCALE_PREFILL_SIDE]  # no flag of this engine
    assert d.signals.throughput.kv_transfer_tokens_per_second > 0
    assert set(d.signals.as_dict()["kv_fetch_requests"]) == {"waiting_to_start", "in_progress", "completed_waiting"}


def test_kv_transfer_needs_the_fetch_stages():
    """Without num_requests_kv_fetch_by_stage (vLLM before 0.33) the deferred queue is vLLM's "not capacity":
    undetermined (requests wait: never none, issue 25)."""
    ds = diagnoses(load_scenario("kv_transfer"), 24, without_family("kv_fetch_by_stage"))
    assert not any(d.bottleneck is Bottleneck.KV_TRANSFER for d in ds)
    assert ds[-1].bottleneck is Bottleneck.UNDETERMINED and ds[-1].signals.queue.waiting


def test_a_fast_connector_is_not_kv_transfer():
    """Ten times the bandwidth: loads finish before a queue forms, so nothing is named."""
    fast = load_scenario("kv_transfer", overrides={"engine": {"kv_transfer_tokens_per_s": 30000.0}})
    assert not any(d.bottleneck is Bottleneck.KV_TRANSFER for d in diagnoses(fast, 24))


# --- wedged schedulers, from the figures users posted --------------------------------------------------------


def wedged_history(n, *, running, waiting, deferred, kv, prompt_per_s, gen_per_s, finished_per_s, cache=None):
    """``n`` one-second /metrics snapshots of an engine holding one state (counters advancing at the given rates)."""
    from kvwatch.snapshot import EngineSnapshot

    h = EngineHistory("m", "0", keep_seconds=11.0)
    for t in range(n):
        gauges = {"requests_running": running, "requests_waiting": waiting, "kv_cache_usage_ratio": kv}
        gauges |= {"requests_waiting_deferred": deferred, "requests_waiting_capacity": waiting - deferred}
        counters = {"prompt_tokens": 1e6 + prompt_per_s * t, "generation_tokens": 1e6 + gen_per_s * t}
        counters["requests_finished"] = 5000.0 + finished_per_s * t
        h.add(1000.0 + t, EngineSnapshot("m", "0", gauges, counters, {}, cache))
    s = summarize(h, 1000.0 + n - 1, 10.0)
    assert s is not None
    return s


def test_vllm_metal_479_nothing_running_on_an_empty_cache_is_stalled_and_says_the_scheduler_admits_nothing():
    """vllm-project/vllm-metal#479: Running 0, Waiting 6 (capacity 6, deferred 0), KV 0.0, 90000 KV tokens."""
    from kvwatch.snapshot import CacheConfig

    cache = CacheConfig(block_size=None, num_gpu_blocks=118, kv_cache_size_tokens=90000, kv_cache_max_concurrency=1.0)
    s = wedged_history(
        11, running=0.0, waiting=6.0, deferred=0.0, kv=0.0, prompt_per_s=0, gen_per_s=0, finished_per_s=0, cache=cache
    )
    d = diagnose_engine(s)
    assert d.bottleneck is Bottleneck.STALLED
    assert any(
        "nothing runs while 6 wait (6 for capacity) and the KV cache is 0% used: the scheduler admits nothing" in e
        for e in d.evidence
    ), d.evidence
    assert d.recommendations[0].action is Action.RESTART_ENGINE


def test_a_stall_with_requests_running_says_mid_step():
    s = wedged_history(
        11, running=4.0, waiting=12.0, deferred=0.0, kv=0.41, prompt_per_s=0, gen_per_s=0, finished_per_s=0
    )
    d = diagnose_engine(s)
    assert d.bottleneck is Bottleneck.STALLED
    assert any("4 running requests stopped producing tokens" in e for e in d.evidence), d.evidence
    assert not any("admits nothing" in e for e in d.evidence)


# vllm-project/vllm#53130 at 12:10-12:20: Running 4, Waiting 487 of which 468 deferred, KV 20 %, prompt 1946 tok/s,
# generation 0.48-5.5 tok/s, request_success +0 over the window, --max-num-seqs 256.
VLLM_53130 = dict(running=4.0, waiting=487.0, deferred=468.0, kv=0.20, prompt_per_s=1946.0, gen_per_s=0.48)


def test_vllm_53130_running_plus_deferred_at_max_num_seqs_with_nothing_finishing_is_stalled():
    s = wedged_history(11, **VLLM_53130, finished_per_s=0)
    assert s.throughput.stalled_seconds == 0  # tokens still trickle: no-progress alone never shows it
    d = diagnose_engine(s, Hints(max_num_seqs=256))
    assert d.bottleneck is Bottleneck.STALLED
    assert re.search(
        r"4 running \+ 468 deferred reach max_num_seqs=256 \(configured\) and no request finished in 10 s",
        d.evidence[0],
    ), d.evidence
    assert d.recommendations[0].action is Action.RESTART_ENGINE


def test_vllm_53130_figures_without_the_ceiling_or_with_requests_finishing_are_not_stalled():
    # without --max-num-seqs the arithmetic cannot be done: no stall is named by elimination
    assert diagnose_engine(wedged_history(11, **VLLM_53130, finished_per_s=0)).bottleneck is not Bottleneck.STALLED
    # the same queue with requests finishing is a slow engine, not a wedged one
    busy = diagnose_engine(wedged_history(11, **VLLM_53130, finished_per_s=2.0), Hints(max_num_seqs=256))
    assert busy.bottleneck is not Bottleneck.STALLED


# --- "4 slots but 1.5 effective" (MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#43, measured in #122) -------------


def footprint_history(*, kv_per_request: float, running: float = 3.0):
    """#122's pool (356,667 KV tokens, vLLM: 1.36x at max_model_len 262,144), --max-num-seqs 4, 2.4k-token prompts
    with 400 output tokens, 3 running and 2 waiting for capacity: a request holds ``kv_per_request`` of the pool."""
    from kvwatch.snapshot import CacheConfig, EngineSnapshot, Histogram

    cache = CacheConfig(kv_cache_size_tokens=356667, kv_cache_max_concurrency=1.36)
    h = EngineHistory("m", "0", keep_seconds=11.0)
    one = (float("inf"),)
    for t in range(11):
        done = 10.0 + 0.3 * t
        gauges = {
            "requests_running": running,
            "requests_waiting": 2.0,
            "kv_cache_usage_ratio": kv_per_request * running,
        }
        counters = {"prompt_tokens": 2400.0 * done, "generation_tokens": 1e5 + 30.0 * t, "requests_finished": done}
        hists = {
            "request_prompt_tokens": Histogram(one, [done], 2400.0 * done, done),
            "request_generation_tokens": Histogram(one, [done], 400.0 * done, done),
        }
        h.add(1000.0 + t, EngineSnapshot("m", "0", gauges, counters, hists, cache))
    return summarize(h, 1010.0, 10.0)


def test_requests_holding_90k_pool_tokens_each_are_kv_cache_not_max_num_seqs():
    """#122: a 2.4k-token request holds 25.5 % of the pool; 3 run, the 4th slot never fills. Not max_num_seqs."""
    d = diagnose_engine(footprint_history(kv_per_request=0.255), Hints(max_num_seqs=4))
    assert d.bottleneck is Bottleneck.KV_CACHE and d.confidence is Confidence.MEDIUM
    said = next(e for e in d.evidence if "running requests holds" in e)
    assert re.search(r"holds ~90950 KV tokens, 32x its 2800-token sequence", said), said
    assert "the cache holds ~3.9 such requests in all; vLLM reports 1.36x max_model_len" in said
    assert Action.RAISE_MAX_NUM_SEQS not in [r.action for r in d.recommendations]


def test_requests_holding_about_their_own_tokens_are_not_named_kv_cache_by_footprint():
    """The same engine with each request holding its own 2.8k tokens (0.8 % of the pool): KV has room."""
    d = diagnose_engine(footprint_history(kv_per_request=0.008), Hints(max_num_seqs=4))
    assert d.bottleneck is not Bottleneck.KV_CACHE
    assert not any("running requests holds" in e for e in d.evidence)


def test_an_upstream_cannot_grow_the_rejection_reasons_without_bound():
    """Reasons are vLLM's label values: beyond MAX_REJECTION_REASONS distinct ones per engine, "other"."""
    from kvwatch.engines.vllm import keep_family
    from kvwatch.engines.vllm import read as read_vllm
    from kvwatch.parse import parse
    from kvwatch.snapshot import MAX_REJECTION_REASONS, REJECTIONS

    lines = [
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 1',
        "# TYPE vllm:admission_rejections_total counter",
    ]
    lines += [f'vllm:admission_rejections_total{{model_name="m",reason="r{i}"}} 1' for i in range(1000)]
    (snap,) = read_vllm(parse("\n".join(lines) + "\n", keep_family)).values()
    reasons = {k for k in snap.counters if k.startswith(REJECTIONS)}
    assert len(reasons) == MAX_REJECTION_REASONS and snap.counters[REJECTIONS + "other"] == 1000 - 3


def test_max_loras_capacity_is_what_runs_while_the_slots_are_full():
    """Issue 17: kvwatch_capacity_sequences{limit="max_loras"} is Running while every slot is taken and adapters
    wait, the binding (effective) capacity whenever max_loras is named, and absent with a slot per adapter."""
    cfg = load_scenario("max_loras").phases[0].engine
    ds = diagnoses(load_scenario("max_loras"), 24, hints=Hints(cfg.max_num_seqs, cfg.max_num_batched_tokens))
    named = [d for d in ds if d.bottleneck is Bottleneck.MAX_LORAS]
    assert named
    for d in named:
        assert d.capacity_sequences[Bottleneck.MAX_LORAS] == d.signals.queue.running, d.capacity_sequences
        assert d.capacity_limit is Bottleneck.MAX_LORAS, d.capacity_sequences
        # the flag's gain: the next limit holds more than the slots do (what KvwatchScaleOutNotNeeded pages on)
        others = [v for b, v in d.capacity_sequences.items() if b is not Bottleneck.MAX_LORAS]
        assert others and min(others) > d.capacity_sequences[Bottleneck.MAX_LORAS], d.capacity_sequences
    roomy = diagnoses(load_scenario("max_loras", overrides={"engine": {"max_loras": 4}}), 24)
    assert not any(Bottleneck.MAX_LORAS in d.capacity_sequences for d in roomy)


# --- SGLang's LoRA pool: the slots full, not who waits -----------------------------------------------------------

INFERRED = {Bottleneck.MAX_NUM_SEQS, Bottleneck.TOKEN_BUDGET}


def test_sglang_lora_bound_queue_is_undetermined_with_its_full_slots_never_a_ceiling_inferred():
    """SGLang's lora_pool_slots_used / _total show every slot taken, not that other adapters wait: the LoRA-bound
    queue is undetermined and says so, never a max_num_seqs or token_budget inferred from the Running plateau or the
    steady prefill the slots cause. Without the pool's families the same data names them (issue 24, item 5)."""
    for preset in ("max_loras", "gpu_max_loras"):
        ds = sglang_diagnoses(load_scenario(preset), 24)
        assert not {d.bottleneck for d in ds} & INFERRED, (preset, [d.bottleneck.value for d in ds])
        settled = [d for d in ds[6:] if d.signals.queue.waiting]
        slots = [d for d in settled if d.bottleneck is Bottleneck.UNDETERMINED and "LoRA slots held" in d.evidence[0]]
        assert len(slots) >= 0.9 * len(settled), (preset, [d.evidence[0] for d in settled])
        assert "which LoRA adapters wait" in " ".join(slots[-1].evidence)
        blind = sglang_diagnoses(load_scenario(preset), 24, without_family("lora_pool_"))
        assert {d.bottleneck for d in blind} & INFERRED, preset


def test_sglang_with_a_slot_for_every_adapter_still_infers_its_ceiling():
    """Four adapters, four slots, a max_num_seqs of 2: the slots are never all taken by the two running requests, so
    the Running plateau is the ceiling's, inferred as for any engine."""
    overrides = {"engine": {"max_loras": 4, "max_num_seqs": 2}}
    ds = sglang_diagnoses(load_scenario("max_loras", overrides=overrides), 24)
    assert sum(d.bottleneck is Bottleneck.MAX_NUM_SEQS for d in ds[10:]) >= 0.9 * len(ds[10:])


def plateau(**lora):
    """Running held at 4 with a draining queue and KV room, prefill completing each second: a plateau
    running_plateau infers a ceiling of 4 from; ``lora`` the snapshot's LoRA fields at every sample."""
    h = EngineHistory("m", "0", keep_seconds=11.0)
    for t in range(11):
        gauges = {"requests_running": 4.0, "requests_waiting": 100.0 - 4 * t, "kv_cache_usage_ratio": 0.05}
        counters = {"prompt_tokens": 100.0 * (t + 1), "generation_tokens": 32.0 * (t + 1)}
        h.add(1000.0 + t, EngineSnapshot("m", "0", gauges, counters, **lora))
    return summarize(h, 1010.0, 10.0)


def test_full_slots_of_unknown_waiters_leave_a_plateau_unattributed_and_vllm_keeps_its_verdict():
    deciding = {}
    for name, lora in {
        "none": {},
        "full, waiters unknown (SGLang)": {"lora_running": 4, "max_lora": 4},
        "full, none waiting (vLLM)": {"lora_running": 4, "max_lora": 4, "lora_waiting": 0},
        "a slot free (SGLang)": {"lora_running": 3, "max_lora": 4},
    }.items():
        s = plateau(**lora)
        deciding[name] = (next(r.__name__ for r in RULES if r(s, Hints(), Thresholds()) is not None), s)
    assert {k: v[0] for k, v in deciding.items()} == {
        "none": "running_plateau",
        "full, waiters unknown (SGLang)": "lora_slots_taken",
        "full, none waiting (vLLM)": "running_plateau",
        "a slot free (SGLang)": "running_plateau",
    }
    d = diagnose_engine(deciding["full, waiters unknown (SGLang)"][1], engine=SGLANG)
    assert d.bottleneck is Bottleneck.UNDETERMINED and d.confidence is Confidence.LOW and d.max_num_seqs is None
    assert "every one of the 4 LoRA slots held a running adapter in 11 of the queue's 11 samples" in d.evidence[0]
    # positive evidence still names its limit: Running at the configured ceiling
    d = diagnose_engine(deciding["full, waiters unknown (SGLang)"][1], Hints(max_num_seqs=4), engine=SGLANG)
    assert d.bottleneck is Bottleneck.MAX_NUM_SEQS and d.max_num_seqs == (4, "configured")


def test_lora_slots_taken_comes_before_the_inferring_rules():
    assert NAMES.index("lora_slots_taken") < min(NAMES.index(r) for r in ("running_plateau", "prefill_paced"))
