"""The scheduler model: behaviour against the real vLLM 0.32 captures, invariants, determinism, speed.

The comparisons drive the simulator with the captured runs' server flags and benchmark loads
(tests/fixtures/vllm-0.32.0-cpu/*/config.txt) and read both through the same /metrics text, one
sample per second, exactly as the captures were taken.
"""

from __future__ import annotations

import re
import statistics
import time

import pytest

from kvwatch.sim import Simulator, load_scenario, parse_scenario, render
from kvwatch.sim.engine import Engine, Request
from kvwatch.sim.scenario import EngineConfig, ScenarioError, StepTime
from tests.helpers.recordings import FIXTURES, recording

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})? (\S+)$", re.M)


def values(text: str) -> dict[str, float]:
    """Sum of every sample per sample name (one engine, or all engines together)."""
    out: dict[str, float] = {}
    for name, v in _LINE.findall(text):
        out[name] = out.get(name, 0.0) + float(v)
    return out


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    pat = re.compile(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$", re.M)
    out = {}
    for labels, v in pat.findall(text):
        m = re.search(label + r'="([^"]*)"', labels)
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(v)
    return out


def timeline(texts: list[tuple[float, str]]) -> list[dict]:
    """Per interval: gauges at its end, counter rates over it."""
    rows = []
    prev_t, prev = None, None
    for t, text in texts:
        v = values(text)
        v["local_compute"] = by_label(text, "vllm:prompt_tokens_by_source_total", "source").get("local_compute", 0.0)
        if prev is not None:
            dt = t - prev_t
            steps = v["vllm:iteration_tokens_total_count"] - prev["vllm:iteration_tokens_total_count"]
            toks = v["vllm:iteration_tokens_total_sum"] - prev["vllm:iteration_tokens_total_sum"]
            rows.append(
                {
                    "t": t,
                    "running": v["vllm:num_requests_running"],
                    "waiting": v["vllm:num_requests_waiting"],
                    "kv": v["vllm:kv_cache_usage_perc"],
                    "preempt_rate": (v["vllm:num_preemptions_total"] - prev["vllm:num_preemptions_total"]) / dt,
                    "prompt_rate": (v["vllm:prompt_tokens_total"] - prev["vllm:prompt_tokens_total"]) / dt,
                    "gen_rate": (v["vllm:generation_tokens_total"] - prev["vllm:generation_tokens_total"]) / dt,
                    "tok_per_step": toks / steps if steps else 0.0,
                    "hits": v["vllm:prefix_cache_hits_total"] - prev["vllm:prefix_cache_hits_total"],
                    "queries": v["vllm:prefix_cache_queries_total"] - prev["vllm:prefix_cache_queries_total"],
                    "preemptions": v["vllm:num_preemptions_total"],
                    "success": v["vllm:request_success_total"],
                }
            )
        prev_t, prev = t, v
    return rows


def real_timeline(run: str) -> list[dict]:
    return timeline([(t, p.read_text()) for t, p in recording(FIXTURES / run)])


def sim_timeline(scenario, seconds: int, seed: int = 1, engines: int | None = None) -> list[dict]:
    sim = Simulator(scenario, seed=seed, engines=engines)
    texts = [(0.0, render(sim))]
    for k in range(1, seconds + 1):
        sim.advance_to(float(k))
        texts.append((float(k), render(sim)))
    return timeline(texts)


def busy(rows):
    """Samples taken while requests wait (the state the capture is named after)."""
    return [r for r in rows if r["waiting"] > 0 and r["running"] > 0]


def bench(preset: str, prompt: int, output: int, n: int, rate: float = 0.0, prefix: int = 0):
    """The preset's server flags under the capture's `vllm bench serve` load."""
    wl = {
        "rate": rate,
        "burst": 0 if rate else n,
        "max_outstanding": None,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "ignore_eos": True,
        "prefix_tokens": prefix,
    }
    sc = load_scenario(preset, overrides={"workload": wl})
    if rate:
        # a finite benchmark: n requests, then nothing (the phase ends after ~n/rate seconds)
        doc = {
            "name": preset,
            "engine": {
                k: getattr(sc.engine, k)
                for k in (
                    "model_name",
                    "block_size",
                    "num_gpu_blocks",
                    "max_model_len",
                    "max_num_seqs",
                    "max_num_batched_tokens",
                    "enable_prefix_caching",
                )
            },
            "workload": wl,
            "phases": [{"name": "bench", "duration_s": n / rate}, {"name": "after", "workload": {"rate": 0.0}}],
        }
        sc = parse_scenario(doc)
    return sc


# --------------------------------------------------------------------------- behaviour vs the captures


def test_kv_cache_capture_settings_hold_running_small_and_preempt_like_real_vllm():
    # --max-model-len 1024 --kv-cache-memory-bytes 8388608 --max-num-seqs 16; 100 x (250 in + 250 out) at once
    real = busy(real_timeline("kv_cache"))
    sim_rows = sim_timeline(bench("kv_cache", 250, 250, 100), 40)
    ours = busy(sim_rows)
    assert len(real) >= 15 and len(ours) >= 15

    real_run = [r["running"] for r in real if r["running"] > 0]
    our_run = [r["running"] for r in ours]
    print(
        f"\nrunning while waiting: real {min(real_run):.0f}-{max(real_run):.0f} "
        f"(median {statistics.median(real_run)}), sim {min(our_run):.0f}-{max(our_run):.0f} "
        f"(median {statistics.median(our_run)})"
    )
    assert min(real_run) <= statistics.median(our_run) <= max(real_run)
    assert min(real_run) - 1 <= min(our_run) and max(our_run) <= max(real_run) + 1
    assert max(our_run) < 16  # far below max_num_seqs: the KV cache binds, not the sequence ceiling

    real_kv = [r["kv"] for r in real]
    our_kv = [r["kv"] for r in ours]
    print(f"KV while waiting: real {min(real_kv):.2f}-{max(real_kv):.2f}, sim {min(our_kv):.2f}-{max(our_kv):.2f}")
    assert statistics.median(our_kv) >= 0.85 and max(our_kv) <= 1.0
    assert min(our_kv) >= min(real_kv) - 0.1

    real_pre = [r["preempt_rate"] for r in real]
    our_pre = [r["preempt_rate"] for r in ours]
    print(
        f"preemptions/s: real {min(real_pre):.1f}-{max(real_pre):.1f} (total {real[-1]['preemptions']:.0f}), "
        f"sim {min(our_pre):.1f}-{max(our_pre):.1f} (total {sim_rows[-1]['preemptions']:.0f})"
    )
    assert statistics.median(our_pre) >= 1.0 and max(our_pre) <= 2 * max(real_pre)
    assert 0.5 * real[-1]["preemptions"] <= sim_rows[-1]["preemptions"] <= 1.5 * real[-1]["preemptions"]

    # prompt throughput falls to 0 between admissions in some seconds, as in the capture
    assert any(r["prompt_rate"] == 0 for r in real)
    # ... and the whole benchmark takes about as long (real: 100 requests done in ~24 s)
    real_all = real_timeline("kv_cache")
    real_span = _span(real_all)
    our_span = _span(sim_rows)
    print(f"benchmark span: real {real_span:.0f} s, sim {our_span:.0f} s")
    assert 0.75 * real_span <= our_span <= 1.25 * real_span
    assert sim_rows[-1]["success"] == 100


def _span(rows):
    active = [r["t"] for r in rows if r["gen_rate"] > 0 or r["prompt_rate"] > 0]
    return active[-1] - active[0] + 1


def test_kv_cache_preset_throughput_gap_prompt_rate_hits_zero_while_requests_wait():
    rows = busy(sim_timeline(load_scenario("kv_cache"), 60))
    zero = [r for r in rows if r["prompt_rate"] == 0 and r["gen_rate"] > 0]
    # 1 s samples of a KV-bound server: admission is gated, so some seconds admit nothing
    assert rows and zero, [(r["prompt_rate"], r["gen_rate"]) for r in rows]
    assert statistics.median(r["kv"] for r in rows) >= 0.85
    assert sum(r["preempt_rate"] for r in rows) > 0


def test_max_num_seqs_capture_settings_pin_running_at_two_with_kv_near_two_percent():
    # --kv-cache-memory-bytes 134217728 --max-num-seqs 2; 40 x (300 + 150) at once
    real = busy(real_timeline("max_num_seqs"))
    ours = busy(sim_timeline(bench("max_num_seqs", 300, 150, 40), 30))
    assert ours and all(r["running"] == 2 for r in ours)
    assert all(r["running"] == 2 for r in real)
    real_kv = statistics.median(r["kv"] for r in real)
    our_kv = statistics.median(r["kv"] for r in ours)
    print(f"\nKV: real median {real_kv:.4f}, sim {our_kv:.4f}")
    assert abs(our_kv - real_kv) < 0.005
    assert all(r["preempt_rate"] == 0 for r in ours)
    real_steps = statistics.median(r["tok_per_step"] for r in real)
    our_steps = statistics.median(r["tok_per_step"] for r in ours)
    print(f"tokens per step: real {real_steps:.1f}, sim {our_steps:.1f}")
    assert 0.6 * real_steps <= our_steps <= 1.4 * real_steps


def test_token_budget_capture_settings_fill_every_step_to_about_250_tokens():
    # --max-model-len 2048 --kv 268435456 --max-num-seqs 64 --max-num-batched-tokens 256; 60 x (1800 + 30)
    real = busy(real_timeline("token_budget"))
    ours = busy(sim_timeline(bench("token_budget", 1800, 30, 60), 20))
    real_tps = statistics.median(r["tok_per_step"] for r in real)
    our_tps = statistics.median(r["tok_per_step"] for r in ours)
    print(
        f"\ntokens per step: real {real_tps:.0f}, sim {our_tps:.0f}; running real "
        f"{statistics.median(r['running'] for r in real)}, sim {statistics.median(r['running'] for r in ours)}; "
        f"KV real {statistics.median(r['kv'] for r in real):.3f}, sim {statistics.median(r['kv'] for r in ours):.3f}"
    )
    assert 230 <= our_tps <= 290 and 230 <= real_tps <= 290
    assert abs(statistics.median(r["running"] for r in ours) - statistics.median(r["running"] for r in real)) <= 1
    assert abs(statistics.median(r["kv"] for r in ours) - statistics.median(r["kv"] for r in real)) < 0.03
    real_p = statistics.median(r["prompt_rate"] for r in real)
    our_p = statistics.median(r["prompt_rate"] for r in ours)
    assert 0.8 * real_p <= our_p <= 1.2 * real_p


def test_prefix_caching_hit_rate_matches_the_none_prefix_cache_capture():
    # --max-num-seqs 32; 50 x (200 shared prefix + 100 + 80) Poisson 4 req/s
    real = real_timeline("none_prefix_cache")
    sc = bench("healthy", 100, 80, 50, rate=4.0, prefix=200)
    sc = parse_scenario(
        {
            "name": "b",
            "engine": {
                "block_size": 32,
                "num_gpu_blocks": 1024,
                "max_model_len": 1024,
                "max_num_seqs": 32,
                "max_num_batched_tokens": 4096,
            },
            "workload": {"rate": 4.0, "prompt_tokens": 100, "output_tokens": 80, "prefix_tokens": 200},
            "phases": [{"name": "bench", "duration_s": 12.5}, {"name": "after", "workload": {"rate": 0}}],
        }
    )
    ours = sim_timeline(sc, 25)
    ratio = lambda rows: sum(r["hits"] for r in rows) / sum(r["queries"] for r in rows)  # noqa: E731
    print(f"\nprefix-cache hit ratio: real {ratio(real):.3f}, sim {ratio(ours):.3f}")
    assert abs(ratio(ours) - ratio(real)) < 0.05
    assert not busy(ours)  # no queue, like the capture


# --------------------------------------------------------------------------- scheduler invariants


def _engine(**kw) -> Engine:
    st = StepTime(jitter=0.0)
    cfg = EngineConfig(
        **{
            "block_size": 16,
            "num_gpu_blocks": 11,
            "max_model_len": 160,
            "max_num_seqs": 8,
            "max_num_batched_tokens": 1000,
            "step_time": st,
            **kw,
        }
    )
    import random

    return Engine(0, cfg, random.Random(0), 0.0)


def _run(e: Engine, steps: int):
    t = 0.0
    for _ in range(steps):
        if e.next_t == float("inf"):
            break
        t = e.next_t
        e.on_event(t)


def test_admission_needs_the_whole_uncached_prompt_in_free_blocks():
    e = _engine()  # 10 usable blocks of 16 tokens
    for i in range(3):
        e.add_request(Request(i, 0.0, 64, 10, 10), 0.0)  # 4 blocks each
    _run(e, 1)  # schedule
    assert [r.rid for r in e.running] == [0, 1]  # 4 + 4 fit, a third needs 4 more of the 2 left
    assert e.free == 2 and len(e.waiting) == 1


def test_running_is_capped_by_max_num_seqs_with_kv_to_spare():
    e = _engine(num_gpu_blocks=1000, max_num_seqs=3)
    for i in range(10):
        e.add_request(Request(i, 0.0, 20, 50, 50), 0.0)
    for _ in range(40):
        _run(e, 2)
        assert len(e.running) <= 3
    assert e.stats.running == 3 and e.stats.kv_usage < 0.02


def test_preemption_takes_the_newest_running_request_back_to_the_front_of_the_queue():
    e = _engine()  # 10 usable blocks
    reqs = [Request(i, 0.0, 64, 80, 80) for i in range(2)]  # 4 blocks each at admission, grow to 9
    for r in reqs:
        e.add_request(r, 0.0)
    late = Request(9, 0.0, 16, 5, 5)
    e.add_request(late, 0.0)
    _run(e, 400)
    assert e.stats.preemptions >= 1
    assert reqs[1].num_preemptions >= 1 and reqs[0].num_preemptions == 0  # the older one is never the victim
    assert e.stats.success["length"] == 3
    h = e.stats.h_preemptions
    assert h.count == 3 and h.sum == e.stats.preemptions
    assert e.free == e.usable  # every block came back


def test_kv_usage_never_exceeds_one_and_blocks_balance():
    sim = Simulator(load_scenario("kv_cache"), seed=5)
    e = sim.engines[0]
    for k in range(1, 200):
        sim.advance_to(k * 0.1)
        held = sum(r.blocks for r in e.running) + sum(run.nblocks for run in e.runs.values() if run.refs > 0)
        assert held + e.free == e.usable
        assert 0.0 <= e.stats.kv_usage <= 1.0
        assert all(r.blocks == 0 and not r.runs for r in e.waiting)


def test_chunked_prefill_shares_the_budget_with_one_token_per_decode():
    e = _engine(num_gpu_blocks=1000, max_num_batched_tokens=64, max_model_len=1000)
    e.add_request(Request(0, 0.0, 16, 100, 100), 0.0)
    _run(e, 4)  # prefill (1 step) and into decode
    e.add_request(Request(1, 0.0, 600, 5, 5), 0.0)
    _run(e, 1)
    sched = dict((r.rid, n) for r, n in e.in_flight)
    assert sched == {0: 1, 1: 63}


def test_lora_requests_beyond_max_loras_are_deferred_and_keep_their_place():
    e = _engine(num_gpu_blocks=1000, max_loras=1)
    e.add_request(Request(0, 0.0, 16, 30, 30, lora="a"), 0.0)
    e.add_request(Request(1, 0.0, 16, 30, 30, lora="b"), 0.0)
    e.add_request(Request(2, 0.0, 16, 30, 30, lora="a"), 0.0)
    e.add_request(Request(3, 0.0, 16, 30, 30), 0.0)
    _run(e, 2)
    assert sorted(r.rid for r in e.running) == [0, 2, 3]
    assert [r.rid for r in e.waiting] == [1]
    assert e.stats.waiting_deferred == 1 and e.stats.running_loras == ("a",)
    assert e.stats.waiting_loras == ("b",)
    _run(e, 200)
    assert e.stats.success["length"] == 4


def test_stalled_engine_freezes_every_series_while_requests_are_present():
    sim = Simulator(load_scenario("stalled"), seed=2)
    sim.advance_to(10.5)
    assert sim.phase_name == "stalled"
    frozen = render(sim)
    sim.advance_to(30.0)
    later = render(sim)
    vllm = lambda t: [ln for ln in t.splitlines() if ln.startswith("vllm:")]  # noqa: E731
    assert vllm(frozen) == vllm(later)
    v = values(later)
    assert v["vllm:num_requests_running"] > 0
    assert sim.engines[0].waiting  # clients kept sending; the engine never picked them up


def test_data_parallel_load_balancer_spreads_requests():
    sc = load_scenario("max_num_seqs", overrides={"workload": {"rate": 30.0, "max_outstanding": 200}})
    sim = Simulator(sc, seed=1, engines=4)
    sim.advance_to(20.0)
    per_engine = [e.stats.success["length"] for e in sim.engines]
    assert min(per_engine) > 0.8 * max(per_engine)
    assert all(e.stats.running == 2 and e.stats.waiting > 0 for e in sim.engines)


def test_n_parallel_samples_share_the_prompt_through_the_prefix_cache():
    # Siblings admitted in the same step all compute the prompt (nothing is cached yet, as in vLLM);
    # with a 512-token budget a 640-token prompt spans two steps, so the 3rd and 4th sibling are
    # admitted after the 1st has cached it and hit all but the last block.
    doc = {
        "name": "n",
        "engine": {"num_gpu_blocks": 2048, "max_model_len": 2048, "max_num_batched_tokens": 512},
        "workload": {"rate": 2.0, "prompt_tokens": 640, "output_tokens": 50, "n": 4},
    }
    sim = Simulator(parse_scenario(doc), seed=1)
    sim.advance_to(30.0)
    s = sim.engines[0].stats
    assert s.h_n.count > 0 and s.h_n.sum == 4 * s.h_n.count
    assert s.prefix_hits == pytest.approx(0.475 * s.prefix_queries, rel=0.05)  # 2 x 608 of 4 x 640


def test_scenario_files_are_validated_with_the_field_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"engine": {"max_num_seqz": 4}}')
    with pytest.raises(ScenarioError, match="max_num_seqz"):
        load_scenario(path=bad)
    bad.write_text('{"engine": {"num_gpu_blocks": 4, "block_size": 16, "max_model_len": 4096}}')
    with pytest.raises(ScenarioError, match="max_model_len"):
        load_scenario(path=bad)
    bad.write_text('{"phases": [{"name": "a"}, {"name": "b"}]}')
    with pytest.raises(ScenarioError, match="duration_s"):
        load_scenario(path=bad)
    bad.write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        load_scenario(path=bad)
    with pytest.raises(ScenarioError, match="unknown preset"):
        load_scenario("nope")


_LORA = {"lora_adapters": ["a"], "lora_fraction": 0.5}


@pytest.mark.parametrize(
    "doc, path",
    [
        ({"bogus": 1}, "bogus"),
        ({"name": ""}, "name"),
        ({"description": 3}, "description"),
        ({"engines": True}, "engines"),  # a JSON true is not the number 1
        ({"loop": 1}, "loop"),
        ({"loop": True, "phases": [{"name": "a"}]}, "loop"),
        ({"engine": 3}, "engine"),
        ({"engine": {"block_size": 2.0}}, "engine.block_size"),  # 2.0 is not an integer
        ({"engine": {"num_gpu_blocks": 1}}, "engine.num_gpu_blocks"),
        ({"engine": {"gpu_memory_utilization": 0}}, "engine.gpu_memory_utilization"),
        ({"engine": {"model_name": ""}}, "engine.model_name"),
        ({"engine": {"enable_prefix_caching": 1}}, "engine.enable_prefix_caching"),
        ({"engine": {"step_time": {"jitter": -1}}}, "engine.step_time.jitter"),
        ({"engine": {"step_time": {"jiter": 0}}}, "engine.step_time.jiter"),
        ({"engine": {"step_time": {"base_s": 0, "per_token_s": 0}}}, "engine.step_time"),
        ({"workload": {"rate": "fast"}}, "workload.rate"),
        ({"workload": {"burst": 1.5}}, "workload.burst"),
        ({"workload": {"max_outstanding": 0}}, "workload.max_outstanding"),
        ({"workload": {"ignore_eos": "no"}}, "workload.ignore_eos"),
        ({"workload": {"prompt_tokens": 0}}, "workload.prompt_tokens"),
        ({"workload": {"prompt_tokens": True}}, "workload.prompt_tokens"),
        ({"workload": {"prompt_tokens": {"dist": "zipf"}}}, "workload.prompt_tokens"),
        ({"workload": {"prompt_tokens": {"dist": "fixed", "value": 3, "min": 1}}}, "workload.prompt_tokens.min"),
        ({"workload": {"output_tokens": {"dist": "uniform", "min": 5}}}, "workload.output_tokens.max"),
        ({"workload": {"output_tokens": {"dist": "uniform", "min": "1", "max": 5}}}, "workload.output_tokens.min"),
        (
            {"workload": {"output_tokens": {"dist": "normal", "mean": 5, "std": 1, "min": 9, "max": 3}}},
            "workload.output_tokens",
        ),
        (
            {"workload": {"output_tokens": {"dist": "lognormal", "mean": 5, "sigma": -1}}},
            "workload.output_tokens.sigma",
        ),
        ({"workload": {"lora_adapters": ["a", ""]}}, "workload.lora_adapters[1]"),
        ({"workload": {"lora_adapters": ["a", "a"]}}, "workload.lora_adapters"),
        ({"workload": {"lora_fraction": 0.5}}, "workload.lora_fraction"),
        ({"workload": {"shared_prefix_fraction": 0.5, "prefix_tokens": 3}}, "workload"),
        ({"phases": {}}, "phases"),
        ({"phases": []}, "phases"),
        ({"phases": [3]}, "phases[0]"),
        ({"phases": [{"duration_s": True}]}, "phases[0].duration_s"),
        ({"phases": [{"stalled": "yes"}]}, "phases[0].stalled"),
        ({"phases": [{"nam": "x"}]}, "phases[0].nam"),
        ({"phases": [{"name": "a", "duration_s": 5}, {"workload": {"rate": -1}}]}, "phases[1].workload.rate"),
        ({"phases": [{"engine": {"num_gpu_blocks": 9}}]}, "phases[0].engine.num_gpu_blocks"),
        ({"phases": [{"engine": {"step_time": {"jitter": "x"}}}]}, "phases[0].engine.step_time.jitter"),
        ({"workload": _LORA}, "phases[0]"),
        (
            {
                "engine": {"max_loras": 1},
                "workload": _LORA,
                "phases": [{"duration_s": 1}, {"engine": {"max_loras": 0}, "workload": {"lora_fraction": 0}}],
            },
            "engine.max_loras",
        ),
    ],
)
def test_each_bad_field_is_named_by_its_path_in_one_line(doc, path):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(doc)
    msg = str(e.value)
    assert msg.startswith(f"{path}: ") and len(msg) > len(path) + 2 and "\n" not in msg, msg


def test_phases_override_the_scenario_key_by_key():
    sc = parse_scenario(
        {
            "engine": {"step_time": {"jitter": 0.0, "per_seq_s": 0.001}},
            "workload": {"rate": 2, "prompt_tokens": 400, "shared_prefix_fraction": 0.5},
            "phases": [
                {"duration_s": 1, "engine": {"step_time": {"base_s": 0.01}}, "workload": {"prompt_tokens": 1000}},
                {
                    "workload": {
                        "shared_prefix_fraction": 0.25,
                        "prompt_tokens": {"dist": "uniform", "min": 100, "max": 300},
                    }
                },
            ],
        }
    )
    first, second = sc.phases
    assert first.engine.step_time.model_dump() == {
        "base_s": 0.01,
        "per_token_s": 0.000061,
        "per_seq_s": 0.001,
        "per_context_token_s": 0.0,
        "jitter": 0.0,
    }
    # The scenario's fraction made a 200-token prefix; the phase keeps it and replaces the random part.
    assert (first.workload.rate, first.workload.prefix_tokens, first.workload.prompt_tokens.expected) == (
        2.0,
        200,
        1000,
    )
    assert second.name == "phase1"
    assert (second.workload.prefix_tokens, second.workload.prompt_tokens.expected) == (50, 150)


def test_tour_visits_every_phase_in_order_and_loops():
    sc = load_scenario("tour")
    sim = Simulator(sc, seed=0)
    sim.advance_to(sc.cycle_s + 5)
    names = [n for _, n in sim.phase_log]
    assert names == ["healthy", "kv_cache", "recovery", "max_num_seqs", "token_budget", "healthy"]
    assert sim.cycle == 1


# --------------------------------------------------------------------------- determinism and speed


def _vllm_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("vllm:")]


def test_same_seed_same_metrics_whatever_the_advance_granularity():
    sc = load_scenario("tour")
    a = Simulator(sc, seed=42, wall_start=1.7e9)
    b = Simulator(sc, seed=42, wall_start=1.7e9)
    a.advance_to(120.0)
    t = 0.0
    while t < 120.0:  # many small uneven slices, like the real-time driver
        t = min(120.0, t + 0.037)
        b.advance_to(t)
    assert _vllm_lines(render(a)) == _vllm_lines(render(b))
    c = Simulator(sc, seed=43, wall_start=1.7e9)
    c.advance_to(120.0)
    assert _vllm_lines(render(c)) != _vllm_lines(render(a))


def test_speed_one_simulated_second_with_256_running_requests():
    """Report what one simulated second of the kv_cache preset costs with ~256 requests running.

    Not a timed assertion (the figure is printed; run with -s to see it): the KV cache is scaled so
    that ~256 requests of the capture's 250-in/250-out load fit, and the load is scaled to keep it full.
    """
    sc = load_scenario(
        "kv_cache",
        overrides={
            "engine": {"num_gpu_blocks": 3300, "max_num_seqs": 512},
            "workload": {
                "burst": 300,
                "rate": 40.0,
                "max_outstanding": 600,
                "prompt_tokens": 250,
                "output_tokens": 250,
            },
        },
    )
    sim = Simulator(sc, seed=1)
    sim.advance_to(5.0)
    costs, running = [], []
    for k in range(6, 36):
        running.append(sim.engines[0].stats.running)
        t0 = time.perf_counter()
        sim.advance_to(float(k))
        costs.append(time.perf_counter() - t0)
        render(sim)
    mean_running = statistics.mean(running)
    print(
        f"\nkv_cache with 3300 KV blocks: mean running {mean_running:.0f} (max {max(running)}), "
        f"{sim.engines[0].stats.preemptions} preemptions; one simulated second costs "
        f"mean {1000 * statistics.mean(costs):.1f} ms, max {1000 * max(costs):.1f} ms of CPU"
    )
    assert 200 <= mean_running <= 330
    assert sim.engines[0].stats.preemptions > 0 and sim.engines[0].stats.kv_usage > 0.4
