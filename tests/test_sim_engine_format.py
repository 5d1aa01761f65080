"""The simulator's SGLang, TensorRT-LLM and llama.cpp expositions: Prometheus text prometheus_client parses, with
only the families each engine documents, of the documented type, labelled as the engine labels them.

The documented families are listed here from tests/fixtures/engines/{sglang,trtllm,llamacpp}/FAMILIES.md (the
engine-data branch; each table read from the engine's own source): keep them in step with those tables.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.engines import by_name, detect
from kvwatch.sim import Simulator, load_scenario
from kvwatch.sim.expositions import EXPOSITIONS

# Family names as FAMILIES.md's tables spell them (counters with _total), with their type.
# sglang/FAMILIES.md: "Families that bear on the limits" and the tokenizer-side paragraph.
SGLANG = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:num_grammar_queue_reqs": "gauge",
    "sglang:num_used_tokens": "gauge",
    "sglang:max_total_num_tokens": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:swa_token_usage": "gauge",
    "sglang:mamba_usage": "gauge",
    "sglang:pending_prealloc_token_usage": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:new_token_ratio": "gauge",
    "sglang:num_retracted_reqs": "gauge",
    "sglang:num_retracted_requests_total": "counter",
    "sglang:num_retracted_input_tokens_total": "counter",
    "sglang:num_retracted_output_tokens_total": "counter",
    "sglang:num_retractions": "histogram",
    "sglang:num_paused_reqs": "gauge",
    "sglang:queue_time_seconds": "histogram",
    "sglang:num_prefill_prealloc_queue_reqs": "gauge",
    "sglang:num_prefill_inflight_queue_reqs": "gauge",
    "sglang:num_decode_prealloc_queue_reqs": "gauge",
    "sglang:num_decode_transfer_queue_reqs": "gauge",
    "sglang:lora_pool_slots_used": "gauge",
    "sglang:lora_pool_slots_total": "gauge",
    "sglang:lora_pool_utilization": "gauge",
    "sglang:realtime_tokens_total": "counter",
    "sglang:prompt_tokens_total": "counter",
    "sglang:generation_tokens_total": "counter",
    "sglang:cached_tokens_total": "counter",
    "sglang:num_requests_total": "counter",
    "sglang:num_aborted_requests_total": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
}
# trtllm/FAMILIES.md, section 1 (trtllm-serve, current trtllm_ names).
TRTLLM = {
    "trtllm_num_requests_running": "gauge",
    "trtllm_num_requests_waiting": "gauge",
    "trtllm_max_num_active_requests": "gauge",
    "trtllm_max_batch_size_static": "gauge",
    "trtllm_max_batch_size_runtime": "gauge",
    "trtllm_max_num_tokens_runtime": "gauge",
    "trtllm_kv_cache_max_blocks": "gauge",
    "trtllm_kv_cache_free_blocks": "gauge",
    "trtllm_kv_cache_used_blocks": "gauge",
    "trtllm_kv_cache_tokens_per_block": "gauge",
    "trtllm_kv_cache_utilization": "gauge",
    "trtllm_kv_cache_hit_rate": "gauge",
    "trtllm_num_paused_requests": "gauge",
    "trtllm_num_requests_completed_total": "counter",
    "trtllm_request_success_total": "counter",
    "trtllm_prompt_tokens_total": "counter",
    "trtllm_generation_tokens_total": "counter",
    "trtllm_prompt_cached_tokens_total": "counter",
    "trtllm_e2e_request_latency_seconds": "histogram",
    "trtllm_time_to_first_token_seconds": "histogram",
    "trtllm_time_per_output_token_seconds": "histogram",
    "trtllm_request_queue_time_seconds": "histogram",
}
# llamacpp/FAMILIES.md, "Families (current builds)" (n_tokens_max is a counter without _total there).
LLAMACPP = {
    "llamacpp:prompt_tokens_total": "counter",
    "llamacpp:prompt_tokens_cached_total": "counter",
    "llamacpp:prompt_seconds_total": "counter",
    "llamacpp:tokens_predicted_total": "counter",
    "llamacpp:tokens_predicted_seconds_total": "counter",
    "llamacpp:n_decode_total": "counter",
    "llamacpp:n_tokens_max": "counter",
    "llamacpp:spec_decode_num_draft_tokens_total": "counter",
    "llamacpp:spec_decode_num_accepted_tokens_total": "counter",
    "llamacpp:spec_decode_num_drafts_total": "counter",
    "llamacpp:prompt_tokens_seconds": "gauge",
    "llamacpp:predicted_tokens_seconds": "gauge",
    "llamacpp:requests_processing": "gauge",
    "llamacpp:requests_deferred": "gauge",
    "llamacpp:n_busy_slots_per_decode": "gauge",
}
# trtllm/FAMILIES.md, section 2 (Triton's TensorRT-LLM backend), with each family's selector label and its values.
TRITON = {
    "nv_trt_llm_request_metrics": "gauge",
    "nv_trt_llm_kv_cache_block_metrics": "gauge",
    "nv_trt_llm_runtime_memory_metrics": "gauge",
    "nv_trt_llm_inflight_batcher_metrics": "gauge",
    "nv_trt_llm_v1_metrics": "gauge",
    "nv_trt_llm_general_metrics": "gauge",
    "nv_trt_llm_disaggregated_serving_metrics": "counter",
    "nv_llm_output_token_len": "histogram",
    "nv_llm_input_token_len": "histogram",
}
TRITON_SELECTORS = {
    "request_type": {"active", "max", "scheduled", "context", "waiting"},
    "kv_cache_block_type": {"max", "free", "used", "tokens_per", "reused", "fraction"},
    "inflight_batcher_specific_metric": {
        "total_context_tokens",
        "generation_requests",
        "micro_batch_id",
        "paused_requests",
    },
    "general_type": {"timestamp", "iteration_counter"},
}
DOCUMENTED = {"sglang": SGLANG, "trtllm": TRTLLM, "triton-trtllm": TRITON, "llamacpp": LLAMACPP}
# The labels each engine puts on its series (FAMILIES.md): SGLang's scheduler / tokenizer sets, trtllm-serve's
# collector labels, none for llama.cpp; plus each family's own selector (mode, finished_reason, le).
LABELS = {
    "sglang": {"model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank", "mode", "le"},
    "trtllm": {"model_name", "engine_type", "finished_reason", "le"},
    "triton-trtllm": {"model", "version", *TRITON_SELECTORS},
    "llamacpp": set(),
}
# One preset for each family set an engine renders differently: KV-bound (retractions), P/D decode, LoRA, data
# parallel (SGLang only).
RUNS = [("kv_cache", None), ("kv_transfer", None), ("max_loras", None), ("tour", None)]  # one engine each


def rendered(engine: str, preset: str, engines: int | None = None, seconds: float = 20.0) -> str:
    sim = Simulator(load_scenario(preset), seed=3, engines=engines, wall_start=1.8e9)
    sim.advance_to(seconds)
    return EXPOSITIONS[engine].render(sim)


def _printed_names(text: str) -> dict[str, str]:
    """{family name as printed on its TYPE line: type}."""
    return {ln.split()[2]: ln.split()[3] for ln in text.splitlines() if ln.startswith("# TYPE ")}


@pytest.mark.parametrize(("preset", "engines"), RUNS)
@pytest.mark.parametrize("engine", list(DOCUMENTED))
def test_exposition_parses_with_only_documented_families_types_and_labels(engine, preset, engines):
    text = rendered(engine, preset, engines)
    printed = _printed_names(text)
    documented = DOCUMENTED[engine]
    assert set(printed) <= set(documented), sorted(set(printed) - set(documented))
    for name, typ in printed.items():
        assert typ == documented[name], (name, typ)
    parsed = list(text_string_to_metric_families(text))  # raises on anything prometheus_client cannot read
    assert len(parsed) == len(printed)
    labels = {k for fam in parsed for s in fam.samples for k in s.labels}
    assert labels <= LABELS[engine], labels - LABELS[engine]
    assert all(s.value == s.value for fam in parsed for s in fam.samples), "NaN in the exposition"


@pytest.mark.parametrize("engine", list(DOCUMENTED))
def test_every_family_the_adapter_reads_is_rendered(engine):
    """What kvwatch's adapter keeps (kvwatch.engines.<engine>) and the engine documents, the simulator serves (P/D
    queues only on a decode server, LoRA slots only with LoRA; old-build-only names never)."""
    printed = {
        name for preset in ("kv_cache", "kv_transfer", "max_loras") for name in _printed_names(rendered(engine, preset))
    }
    base = {n.removesuffix("_total") for n in printed}
    adapter = by_name(EXPOSITIONS[engine].engine)
    wanted = {n.removesuffix("_total") for n in DOCUMENTED[engine] if adapter.keep_family(n.removesuffix("_total"))}
    assert wanted and wanted <= base, sorted(wanted - base)


@pytest.mark.parametrize("engine", list(EXPOSITIONS))
def test_each_exposition_is_recognised_as_its_engine(engine):
    fams = {f.name for f in text_string_to_metric_families(rendered(engine, "healthy"))}
    assert detect(fams) is by_name(EXPOSITIONS[engine].engine)


def test_sglang_data_parallel_ranks_are_dp_rank_and_the_tokenizer_side_has_none():
    text = rendered("sglang", "healthy", engines=2)
    by_family = {f.name: f for f in text_string_to_metric_families(text)}
    ranks = {s.labels.get("dp_rank") for s in by_family["sglang:num_running_reqs"].samples}
    assert ranks == {"0", "1"}
    assert all("dp_rank" not in s.labels for s in by_family["sglang:prompt_tokens"].samples)
    single = {f.name: f for f in text_string_to_metric_families(rendered("sglang", "healthy"))}
    assert all("dp_rank" not in s.labels for s in single["sglang:num_running_reqs"].samples)


def _value(text: str, name: str, **labels) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


def test_token_counters_move_when_requests_end_and_decode_steps_live():
    """SGLang's and trtllm-serve's token counters and llama.cpp's tokens_predicted_total count a request when it
    ends, so they trail the tokens generated; SGLang's realtime decode counter (per decode step) and llama.cpp's
    n_decode_total (per decode call) move while requests run."""
    sim = Simulator(load_scenario("healthy"), seed=3, wall_start=1.8e9)
    sim.advance_to(20.0)
    (e,) = sim.engines
    generated, finished = e.stats.gen_tokens, e.stats.h_generation.sum
    assert finished < generated  # some requests are mid-generation
    sg = EXPOSITIONS["sglang"].render(sim)
    assert _value(sg, "sglang:generation_tokens_total") == finished
    assert finished < _value(sg, "sglang:realtime_tokens_total", mode="decode") <= generated
    assert _value(EXPOSITIONS["trtllm"].render(sim), "trtllm_generation_tokens_total") == finished
    lc = EXPOSITIONS["llamacpp"].render(sim)
    assert _value(lc, "llamacpp:tokens_predicted_total") == finished
    assert _value(lc, "llamacpp:n_decode_total") == e.stats.steps > 0


def test_sglang_realtime_prefill_counts_each_chunk_as_it_is_batched():
    """SGLang adds each prefill batch's scheduled tokens to realtime_tokens_total{mode="prefill_compute"} (a chunk of
    a long prompt counts when it is batched, PrefillAdder.log_input_tokens), not a prompt when it completes: with
    4,000-8,000-token prompts in 2,048-token chunks, the counter holds the completed prompts' computed tokens plus the
    chunks of the prompts still in prefill, and decode counts one token per running request and step."""
    sim = Simulator(load_scenario("gpu_token_budget"), seed=3, wall_start=1.8e9)
    for t in (5.0, 12.0, 20.0):
        sim.advance_to(t)
        (e,) = sim.engines
        assert e.stats.preemptions == 0  # no recomputation to count twice
        in_prefill = [r for r in e.running if r.output == 0]
        partial = sum(r.num_computed - r.cached_tokens - r.external_tokens for r in in_prefill)
        assert partial > 0, t  # a prompt is mid-prefill at each of these times
        text = EXPOSITIONS["sglang"].render(sim)
        assert (
            _value(text, "sglang:realtime_tokens_total", mode="prefill_compute")
            == e.stats.prompt_local_compute + partial
        )
        started = e.stats.h_ttft.count  # requests with a first token: it came from their prefill, not a decode step
        assert _value(text, "sglang:realtime_tokens_total", mode="decode") == e.stats.gen_tokens - started


def test_llamacpp_defers_only_beyond_its_slots_and_has_no_kv_gauge():
    """--parallel is the simulated max_num_seqs: a request the scheduler holds back for KV is in a slot as llama.cpp,
    only those beyond the slots are deferred; current builds export no KV gauge."""
    sim = Simulator(load_scenario("kv_cache"), seed=3, wall_start=1.8e9)
    sim.advance_to(20.0)
    (e,) = sim.engines
    text = EXPOSITIONS["llamacpp"].render(sim)
    in_server = e.stats.running + e.stats.waiting
    assert e.stats.running < e.cfg.max_num_seqs < in_server  # KV holds the batch below the slots here
    assert _value(text, "llamacpp:requests_processing") == e.cfg.max_num_seqs
    assert _value(text, "llamacpp:requests_deferred") == in_server - e.cfg.max_num_seqs
    assert "kv_cache" not in text


def test_triton_selector_values_are_the_documented_ones():
    text = rendered("triton-trtllm", "kv_cache")
    seen: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            for k in TRITON_SELECTORS.keys() & smp.labels.keys():
                seen.setdefault(k, set()).add(smp.labels[k])
    assert seen.keys() == TRITON_SELECTORS.keys()
    assert all(seen[k] <= TRITON_SELECTORS[k] for k in seen), seen
    used = _value(text, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="used")
    free = _value(text, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="free")
    assert used + free == _value(text, "nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="max")


def test_trtllm_exports_its_ceilings_and_kv_blocks():
    sim = Simulator(load_scenario("kv_cache"), seed=3, wall_start=1.8e9)
    sim.advance_to(20.0)
    (e,) = sim.engines
    text = EXPOSITIONS["trtllm"].render(sim)
    assert _value(text, "trtllm_max_num_active_requests") == e.cfg.max_num_seqs
    assert _value(text, "trtllm_max_num_tokens_runtime") == e.cfg.max_num_batched_tokens
    used, free = _value(text, "trtllm_kv_cache_used_blocks"), _value(text, "trtllm_kv_cache_free_blocks")
    assert used + free == _value(text, "trtllm_kv_cache_max_blocks") == e.usable
    assert _value(text, "trtllm_kv_cache_utilization") == pytest.approx(used / e.usable)
