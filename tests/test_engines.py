"""The engine contract (kvwatch/engines): the registry, recognising an engine from its families, each adapter's
reading of its engine's exposition, and the target's handling of the wrong engine, a mix, or a restart as another.

llama.cpp is read on real captures of a real server (tests/fixtures/engines/llamacpp/captures); SGLang and
TensorRT-LLM, which need GPUs, on exposition written from their collectors' source (tests/fixtures/engines/*/
written_from_source.prom, each file says from which) and on the simulator speaking them (tests/test_sim_engines.py).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from kvwatch.catalog import Action, Bottleneck
from kvwatch.diagnose import diagnose_engine
from kvwatch.engines import ENGINES, by_name, detect, keep_any, llamacpp, sglang, trtllm, vllm
from kvwatch.engines.vllm import ENGINE as VLLM
from kvwatch.export import KvwatchCollector
from kvwatch.parse import ParseError, parse
from kvwatch.recording import read_recorded
from kvwatch.snapshot import Counter, EngineSnapshot, Gauge, Hist, SlotContext
from kvwatch.state import NoEngineMetrics, Target
from kvwatch.window import contexts_filled, summarize
from tests.helpers.recordings import FIXTURES, captures, recording

ENGINE_FIXTURES = Path(__file__).resolve().parent / "fixtures" / "engines"
LLAMACPP = ENGINE_FIXTURES / "llamacpp" / "captures"
SGLANG = (ENGINE_FIXTURES / "sglang" / "written_from_source.prom").read_text()
TRTLLM = (ENGINE_FIXTURES / "trtllm" / "trtllm_serve_written_from_source.prom").read_text()
TRTLLM_OLD = (ENGINE_FIXTURES / "trtllm" / "trtllm_serve_unprefixed_written_from_source.prom").read_text()
TRTLLM_FIRST = (ENGINE_FIXTURES / "trtllm" / "trtllm_serve_first_build_written_from_source.prom").read_text()
TRITON = (ENGINE_FIXTURES / "trtllm" / "triton_written_from_source.prom").read_text()
LLAMA_SLOTS_FULL = next(
    p.read_text() for _, p in recording(LLAMACPP / "slot_ceiling") if "requests_deferred 14" in p.read_text()
)
BODIES = {
    "vllm": captures("kv_cache")[10],
    "sglang": SGLANG,
    "trtllm": TRTLLM,
    "trtllm-unprefixed": TRTLLM_OLD,
    "trtllm-first-build": TRTLLM_FIRST,
    "triton": TRITON,
    "llamacpp": LLAMA_SLOTS_FULL,
}
ENGINE_OF = {"trtllm-unprefixed": "trtllm", "trtllm-first-build": "trtllm", "triton": "trtllm"}


def read(name: str, body: str):
    return by_name(name).read(parse(body, by_name(name).keep_family), 64)


# --- the registry ---------------------------------------------------------------------------------------------------


def test_every_engine_spells_every_action_and_can_say_idle_none_and_stalled():
    assert [e.name for e in ENGINES] == ["vllm", "sglang", "trtllm", "llamacpp"]
    for e in ENGINES:
        assert all(e.flag(a) for a in Action), e.name
        assert {Bottleneck.IDLE, Bottleneck.NONE, Bottleneck.STALLED} <= e.shows, e.name
    assert VLLM.shows == frozenset(Bottleneck)  # everything kvwatch names was learnt on vLLM


@pytest.mark.parametrize("body", sorted(BODIES))
def test_each_engine_is_recognised_from_its_own_families(body):
    families = parse(BODIES[body], keep_any)
    assert detect(families).name == ENGINE_OF.get(body, body)
    assert all(keep_any(n) for n in families)


def test_families_of_no_engine_are_recognised_as_none():
    body = '# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu="0"} 1.0\nup 1\n'
    assert detect(parse(body)) is None


# --- SGLang -----------------------------------------------------------------------------------------------------------


def test_sglang_one_snapshot_per_dp_rank_tensor_ranks_not_added_priority_parts_ignored():
    snaps = read("sglang", SGLANG)
    model = "meta-llama/Llama-3.1-8B-Instruct"
    assert set(snaps) == {(model, "0"), (model, "1")}
    r0, r1 = snaps[(model, "0")], snaps[(model, "1")]
    assert r0.gauges[Gauge.REQUESTS_RUNNING] == 48 and r0.gauges[Gauge.REQUESTS_WAITING] == 12  # not 96 / 24
    assert r1.gauges[Gauge.REQUESTS_RUNNING] == 31  # the priority="1" part (7) is inside the total
    assert r0.gauges[Gauge.KV_CACHE_USAGE_RATIO] == 0.97 and r1.gauges[Gauge.KV_CACHE_USAGE_RATIO] == 0.41
    assert r0.cache.capacity_tokens == 412345
    assert r0.counters[Counter.PREEMPTIONS] == 17  # retractions
    # the per-interval counters, not the finish-time ones: prompt = computed + cached
    assert r0.counters[Counter.PROMPT_TOKENS] == 1_000_000 and r0.counters[Counter.PROMPT_TOKENS_COMPUTED] == 900_000
    assert r0.counters[Counter.GENERATION_TOKENS] == 250_000
    assert r0.histograms[Hist.TIME_TO_FIRST_TOKEN_SECONDS].count == 40


def test_sglang_old_name_label_is_the_model():
    body = '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{name="/models/llama"} 3\n'
    (key,) = read("sglang", body)
    assert key == ("/models/llama", "0")


def test_sglang_first_builds_request_gauges_and_exported_ceiling_are_read_as_configured():
    # The first metrics builds (sgl-project/sglang PR #1853, v0.3.5) named the request gauges num_requests_running /
    # _waiting and exported the scheduler's max_running_requests; written from that PR's collector, labels as then.
    body = (
        '# TYPE sglang:num_requests_running gauge\nsglang:num_requests_running{name="m"} 2231\n'
        '# TYPE sglang:num_requests_waiting gauge\nsglang:num_requests_waiting{name="m"} 40\n'
        '# TYPE sglang:max_running_requests gauge\nsglang:max_running_requests{name="m"} 2231\n'
    )
    (snap,) = read("sglang", body).values()
    assert snap.gauges == {Gauge.REQUESTS_RUNNING: 2231, Gauge.REQUESTS_WAITING: 40}
    assert snap.max_running_requests == 2231


def _lora_pool(rank: str, tp: str, used: float | None, total: float | None) -> str:
    labels = f'dp_rank="{rank}",engine_type="unified",model_name="m",pp_rank="0",tp_rank="{tp}"'
    lines = [f"sglang:num_running_reqs{{{labels}}} 8"]
    if used is not None:
        lines.append(f"sglang:lora_pool_slots_used{{{labels}}} {used}")
    if total is not None:
        lines.append(f"sglang:lora_pool_slots_total{{{labels}}} {total}")
    return "\n".join(lines) + "\n"


def test_sglang_lora_pool_is_the_adapters_running_and_the_slots_never_who_waits():
    """lora_pool_slots_used / _total (collector.py at 00ae9c15, only with --enable-lora) fill the snapshot's
    lora_running / max_lora per dp_rank, the maximum over its tensor ranks; which adapters wait stays unknown (None,
    not 0: SGLang does not say), and adapters without the slots are not read."""
    body = (
        "# TYPE sglang:num_running_reqs gauge\n# TYPE sglang:lora_pool_slots_used gauge\n"
        "# TYPE sglang:lora_pool_slots_total gauge\n"
        + _lora_pool("0", "0", 4, 4)
        + _lora_pool("0", "1", 3, 4)
        + _lora_pool("1", "0", 2, 8)
        + _lora_pool("2", "0", 2, None)
    )
    snaps = read("sglang", body)
    lora = {key[1]: (s.lora_running, s.max_lora, s.lora_waiting) for key, s in snaps.items()}
    assert lora == {"0": (4, 4, None), "1": (2, 8, None), "2": (None, None, None)}
    assert read("sglang", SGLANG)[("meta-llama/Llama-3.1-8B-Instruct", "0")].max_lora is None  # no --enable-lora


def test_sglang_exports_the_adapters_running_and_no_waiting_series():
    """kvwatch_lora_adapters{state="waiting"} would say 0 adapters wait: SGLang does not say, so it is absent."""
    t = Target("sglang")
    for i in range(3):
        t.observe_body(1000.0 + i, "# TYPE sglang:num_running_reqs gauge\n" + _lora_pool("0", "0", 4, 4))
    t.diagnosis = t.diagnose(1002.0)
    registry = CollectorRegistry()
    registry.register(KvwatchCollector(lambda: [t]))
    text = generate_latest(registry).decode()
    states = {
        ln.split('state="')[1].split('"')[0] for ln in text.splitlines() if ln.startswith("kvwatch_lora_adapters{")
    }
    assert states == {"running"}


def _hit_ratio(engine: str, bodies: list[str]) -> float | None:
    t = Target(engine)
    for i, body in enumerate(bodies):
        t.observe_body(1000.0 + i, body)
    return t.diagnose(1000.0 + len(bodies) - 1).engines[0].signals.throughput.prefix_cache_hit_ratio


def test_prefix_cache_hit_ratio_from_each_engines_own_figures():
    """SGLang and TensorRT-LLM export a hit-rate gauge: its mean over the window, where their counters of prompt
    tokens and of those served from the cache are not exported (they come first). llama.cpp counts the
    prompt tokens its prompt cache served (prompt_tokens_cached_total) beside those it computed (prompt_tokens_total):
    cached / all. An engine that exports neither has no ratio: unknown, not 0."""
    sglang_ = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\nsglang:cache_hit_rate {}\n"
    assert _hit_ratio("sglang", [sglang_.format(r) for r in (0.2, 0.4, 0.6)]) == pytest.approx(0.4)
    # its counters, where exported, come first: 400 prompt tokens finished, 100 of them from the radix cache
    counted = sglang_ + "".join(
        f"# TYPE sglang:{name} counter\nsglang:{name}_total {{}}\n" for name in ("prompt_tokens", "cached_tokens")
    )
    assert _hit_ratio("sglang", [counted.format(0.9, 1000, 100), counted.format(0.9, 1400, 200)]) == pytest.approx(0.25)
    trt = "trtllm_num_requests_running 2\ntrtllm_kv_cache_hit_rate {}\n"
    assert _hit_ratio("trtllm", [trt.format(r) for r in (0.5, 0.7)]) == pytest.approx(0.6)
    trt_counted = trt + "".join(
        f"# TYPE trtllm_{name} counter\ntrtllm_{name}_total {{}}\n"
        for name in ("prompt_tokens", "prompt_cached_tokens")
    )
    assert _hit_ratio("trtllm", [trt_counted.format(0.9, 500, 0), trt_counted.format(0.9, 1500, 500)]) == 0.5
    llama = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 1\n" + "".join(
        f"# TYPE llamacpp:{name} counter\nllamacpp:{name} {{}}\n"
        for name in ("n_decode_total", "prompt_tokens_total", "prompt_tokens_cached_total")
    )
    # 300 prompt tokens between the two scrapes, 100 of them from the cache
    assert _hit_ratio("llamacpp", [llama.format(10, 1000, 500), llama.format(20, 1200, 600)]) == pytest.approx(1 / 3)
    assert _hit_ratio("sglang", ["# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\n"] * 2) is None


def test_sglang_request_length_histograms_give_the_sequences_its_kv_pool_holds():
    """With --collect-tokens-histogram SGLang exports each finished request's prompt and generation lengths: the
    mean sequence over the window and, with its pool (max_total_num_tokens), the sequences the KV cache holds."""

    def body(finished: int) -> str:
        lines = ["# TYPE sglang:num_running_reqs gauge", 'sglang:num_running_reqs{model_name="m"} 4']
        lines += ["# TYPE sglang:max_total_num_tokens gauge", 'sglang:max_total_num_tokens{model_name="m"} 40000']
        for name, length in (("prompt_tokens_histogram", 300), ("generation_tokens_histogram", 100)):
            lines.append(f"# TYPE sglang:{name} histogram")
            for le in ("100.0", "500.0", "+Inf"):
                n = finished if le == "+Inf" or float(le) >= length else 0
                lines.append(f'sglang:{name}_bucket{{model_name="m",le="{le}"}} {n}')
            lines += [f'sglang:{name}_sum{{model_name="m"}} {finished * length}']
            lines += [f'sglang:{name}_count{{model_name="m"}} {finished}']
        return "\n".join(lines) + "\n"

    t = Target("sglang")
    t.observe_body(1000.0, body(10))
    t.observe_body(1001.0, body(30))
    c = t.diagnose(1001.0).engines[0].signals.capacity
    assert c.mean_sequence_tokens == pytest.approx(400) and c.sequence_tokens_source == "window"
    assert c.estimated_max_concurrency == pytest.approx(100)  # 40,000 tokens / 400 per sequence


def test_sglang_kv_bound_rank_is_named_kv_cache_with_sglang_flags():
    t = Target("sglang")
    for i in range(12):
        t.observe_body(1000.0 + i, SGLANG.replace("900000.0", f"{900000 + i * 10}.0"))
    d = t.diagnose(1011.0)
    assert d.engine_type == "sglang"
    by_rank = {e.engine: e for e in d.engines}
    assert by_rank["0"].bottleneck is Bottleneck.KV_CACHE  # 12 waiting at 97 % of the pool
    flags = {r.action: r.flag for r in by_rank["0"].recommendations}
    assert flags.get(Action.FP8_KV_CACHE) == "--kv-cache-dtype fp8_e5m2"
    assert by_rank["1"].bottleneck is not Bottleneck.KV_CACHE  # no queue on rank 1


# --- TensorRT-LLM -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [TRTLLM, TRTLLM_OLD], ids=["trtllm_-prefixed", "unprefixed"])
def test_trtllm_serve_reads_its_configured_ceilings(body):
    ((key, s),) = read("trtllm", body).items()
    assert key == ("nemotron-nano-3", "0")
    assert s.gauges[Gauge.REQUESTS_RUNNING] == 256 and s.gauges[Gauge.REQUESTS_WAITING] == 90
    assert s.gauges[Gauge.KV_CACHE_USAGE_RATIO] == 0.42
    assert (s.max_running_requests, s.max_step_tokens) == (256, 8192)
    assert s.cache.capacity_tokens == 20000 * 32
    assert s.counters[Counter.REQUESTS_FINISHED] == 4000  # summed over finished_reason


def test_trtllm_at_its_exported_ceiling_with_kv_room_is_max_num_seqs_configured_with_its_flag():
    t = Target("trtllm")
    for i in range(12):
        t.observe_body(1000.0 + i, TRTLLM.replace("2.0e+06", f"{2_000_000 + 500 * i}"))
    (e,) = t.diagnose(1011.0).engines
    assert e.bottleneck is Bottleneck.MAX_NUM_SEQS and e.max_num_seqs == (256, "configured")
    assert {r.action: r.flag for r in e.recommendations}[Action.RAISE_MAX_NUM_SEQS] == "--max_batch_size"


def _scaled(line: str, by: float) -> str:
    if line.startswith("#"):
        return line
    name, value = line.rsplit(" ", 1)
    return f"{name} {float(value) * by}"


def test_trtllm_serves_first_builds_latency_histograms_alone_are_undetermined_never_none():
    """Five unprefixed families, no request or KV gauge (NVIDIA/TensorRT-LLM#5785): kvwatch names the engine and says
    it cannot count its requests, rather than "no engine" or "nothing waits", while requests finish and queue."""
    t = Target("first-build")
    for i in range(12):  # every counter and bucket grows by a tenth of its value a second: requests finish
        t.observe_body(1000.0 + i, "\n".join(_scaled(ln, 1 + i / 10) for ln in TRTLLM_FIRST.splitlines()) + "\n")
    d = t.diagnose(1011.0)
    (e,) = d.engines
    assert d.engine_type == "trtllm" and (e.model_name, e.engine) == ("undefined", "0")
    assert e.bottleneck is Bottleneck.UNDETERMINED and e.confidence == "low", e.evidence
    assert any("no count of running or waiting requests" in line for line in e.evidence), e.evidence
    assert Hist.TIME_TO_FIRST_TOKEN_SECONDS in e.signals.latency.quantiles  # its histograms are read
    ((_, s),) = read("trtllm", TRTLLM_FIRST).items()
    assert s.counters == {Counter.REQUESTS_FINISHED: 42} and not s.gauges  # summed over its finish reasons


def test_triton_selector_labels():
    ((key, s),) = read("trtllm", TRITON).items()
    assert key == ("tensorrt_llm", "1")
    assert s.gauges[Gauge.REQUESTS_RUNNING] == 64 and s.gauges[Gauge.REQUESTS_WAITING] == 37
    assert s.gauges[Gauge.KV_CACHE_USAGE_RATIO] == 0.31 and s.max_running_requests == 64
    assert s.cache.capacity_tokens == 6239 * 64
    assert not s.counters  # Triton's backend counts no tokens


def test_triton_with_no_progress_signal_is_never_called_stalled():
    t = Target("triton")
    body = TRITON.replace('kv_cache_block_type="fraction"', 'kv_cache_block_type="unused"').replace(
        'kv_cache_block_type="max"', 'kv_cache_block_type="unused2"'
    )
    for i in range(20):
        t.observe_body(1000.0 + i, body)
    (e,) = t.diagnose(1019.0).engines
    assert e.signals.throughput.stalled_seconds == 0 and e.bottleneck is not Bottleneck.STALLED


# --- llama.cpp: a real server's captures -------------------------------------------------------------------------------


def replay(folder: Path, slots: bool = True, **kw) -> list:
    """The capture as ``kvwatch diagnose --replay`` reads it: each /metrics body with the /slots body read after it
    (``slots=False``: /metrics alone, a server without --slots)."""
    t = Target("llamacpp", **kw)
    out = []
    for ts, p in recording(folder):
        body, extra = read_recorded(p)
        t.observe_body(ts, body, extra if slots else None)
        out.append(t.diagnose(ts))
    return out


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "metrics-only"])
def test_llamacpp_slots_full_with_requests_deferred_names_the_slot_ceiling_read_not_inferred(slots):
    timeline = replay(LLAMACPP / "slot_ceiling", slots)
    deferred = [d for d in timeline if d.engines and d.engines[0].signals.queue.waiting]
    assert len(deferred) >= 10 and {d.engine_type for d in timeline} == {"llamacpp"}
    for d in deferred:
        (e,) = d.engines
        assert e.bottleneck is Bottleneck.MAX_NUM_SEQS and e.confidence == "high", e.evidence
        assert e.max_num_seqs == (2, "configured")  # --parallel 2, read from the busy slots while deferring
        assert {r.action: r.flag for r in e.recommendations}[Action.RAISE_MAX_NUM_SEQS] == "--parallel"
    # its requests end at 447 of their slot's 512 tokens: the per-slot context never binds, and kvwatch says so
    assert Bottleneck.KV_CACHE not in {d.bottleneck for d in timeline}
    if slots:
        serving = [d.engines[0] for d in timeline if d.bottleneck is Bottleneck.NONE]
        assert serving and all(any(x.startswith("KV cache judged per slot only") for x in e.evidence) for e in serving)


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "metrics-only"])
def test_llamacpp_a_scrape_between_a_slots_release_and_its_next_request_keeps_the_slot_ceiling(slots):
    """llama.cpp posts /metrics' task at the front of its queue, so a scrape can land after a finished request freed its
    slot and before the deferred request it re-queued takes it: one busy slot of two, requests still deferred (a CI run
    of tests/test_llamacpp_server.py saw it). The ceiling stays --parallel 2: /slots lists both slots, and without it
    the window keeps the most seen since the restart. A restart (its counters back to 0) forgets it: a server started
    again with --parallel 1 has a ceiling of 1."""
    t = Target("llamacpp")
    recorded = [(ts, read_recorded(p)) for ts, p in recording(LLAMACPP / "slot_ceiling")]
    deferring = [(ts, b, x) for ts, (b, x) in recorded if "llamacpp:requests_deferred 12\n" in b]
    for ts, body, extra in [(ts, b, x) for ts, (b, x) in recorded if ts < deferring[0][0]] + deferring[:1]:
        t.observe_body(ts, body, extra if slots else None)
    ts, body, extra = deferring[0]
    released = body.replace("llamacpp:requests_processing 2\n", "llamacpp:requests_processing 1\n")
    assert released != body
    t.observe_body(ts + 0.5, released, extra if slots else None)
    (e,) = t.diagnose(ts + 0.5).engines
    assert e.signals.queue.running == 1 and e.signals.queue.waiting == 12
    assert e.max_num_seqs == (2, "configured") and e.bottleneck is Bottleneck.MAX_NUM_SEQS, e.evidence
    assert not any(" 1 " in line and "max_num_seqs" in line for line in e.evidence), e.evidence
    if slots:  # /slots' count even when that scrape is the first kvwatch sees
        fresh = Target("llamacpp")
        fresh.observe_body(ts, released, extra)
        assert fresh.diagnose(ts).engines[0].max_num_seqs == (2, "configured")

    restarted = "\n".join(
        f"{line.split()[0]} 0" if line.split()[0].endswith("_total") else line for line in released.splitlines()
    ).replace("llamacpp:requests_deferred 12", "llamacpp:requests_deferred 3")
    one_slot = json.dumps([{"id": 0, "n_ctx": 1024, "is_processing": True, "id_task": 0, "n_prompt_tokens": 70}])
    t.observe_body(ts + 1.0, restarted + "\n", one_slot.encode() if slots else None)
    (e,) = t.diagnose(ts + 1.0).engines
    assert e.max_num_seqs == (1, "configured"), e.evidence


def test_llamacpp_slot_context_stays_known_once_the_server_idles_and_its_slots_are_not_read():
    """As the scrape loop reads it: /slots only while the server serves (Target.serving), then the last body again
    and again, the server idle. The window still holds the requests cut short, so kv_cache stays named for a while;
    its evidence keeps the slots' 256-token context (configuration, the same until a restart), never "?-token"."""
    t = Target("llamacpp")
    kv = []
    recorded = [(ts, read_recorded(p)) for ts, p in recording(LLAMACPP / "context_too_small")]
    idle = [(recorded[-1][0] + 0.5 * (i + 1), recorded[-1][1]) for i in range(6)]
    for ts, (body, extra) in recorded + idle:
        families = parse(body, t.keep_family)
        t.observe_body(ts, body, extra if t.serving(llamacpp.ENGINE, families) else None)
        d = t.diagnose(ts)
        if d.bottleneck is Bottleneck.KV_CACHE:
            kv.append((ts, d.engines[0]))
    assert kv[-1][0] > recorded[-1][0]  # still named after the load ended, with /slots no longer read
    for _, e in kv:
        assert e.signals.kv.slot_context_tokens == 256 and "256-token context" in e.evidence[0], e.evidence


@pytest.mark.parametrize("slots", [True, False], ids=["slots", "metrics-only"])
def test_llamacpp_light_load_names_no_limit(slots):
    for d in replay(LLAMACPP / "light", slots):
        assert d.bottleneck in (Bottleneck.IDLE, Bottleneck.NONE)


def test_llamacpp_context_too_small_names_the_full_slot_context_from_slots():
    """The real server cut generations short at a slot's 256 tokens (its /slots: 255 of n_ctx 256) and refused 300-token
    prompts; /metrics shows no trace. With /slots read, every scrape while it serves names the per-slot context
    (kv_cache, high), with llama.cpp's own flags; never healthy, never "not judged"."""
    timeline = replay(LLAMACPP / "context_too_small")
    serving = [d.engines[0] for d in timeline if d.bottleneck is not Bottleneck.IDLE]
    assert len(serving) >= 6
    for e in serving:
        assert e.bottleneck is Bottleneck.KV_CACHE and e.confidence == "high", e.evidence
        assert "of their slot's 256-token context" in e.evidence[0] or "of its slot's 256-token" in e.evidence[0]
        assert not any(x.startswith("KV cache not judged") for x in e.evidence), e.evidence
        recs = {r.action: r.flag for r in e.recommendations}
        assert recs == {
            Action.FP8_KV_CACHE: "--cache-type-k q8_0 --cache-type-v q8_0",
            Action.RAISE_KV_CACHE_MEMORY_BYTES: "--ctx-size",
            Action.LOWER_MAX_NUM_SEQS: "--parallel",
        }
        assert e.signals.kv.slot_context_tokens == 256 and e.signals.kv.context_full_requests >= 1
    # nothing ran before the load: the slots' figures then say nothing of any request
    assert timeline[0].bottleneck is Bottleneck.IDLE


def test_llamacpp_context_too_small_without_slots_is_never_called_a_healthy_kv_cache():
    """A server without --slots (or kvwatch unable to read it): /metrics shows no trace of the full contexts, so kvwatch
    must say it did not judge the KV cache rather than imply it is fine, and how to let it judge."""
    serving = [
        d.engines[0] for d in replay(LLAMACPP / "context_too_small", slots=False) if d.bottleneck is Bottleneck.NONE
    ]
    assert serving
    for e in serving:
        (line,) = [x for x in e.evidence if x.startswith("KV cache not judged")]
        assert "start llama-server with --slots" in line


# --- llama.cpp's /slots: the reader ----------------------------------------------------------------------------------


def _slots_of(folder: str) -> list[bytes]:
    return [extra for _, p in recording(LLAMACPP / folder) if (extra := read_recorded(p)[1]) is not None]


def test_llamacpp_slots_of_a_real_server_are_read_as_each_slots_context():
    bodies = _slots_of("context_too_small")
    assert len(bodies) == len(recording(LLAMACPP / "context_too_small"))
    never_used = llamacpp.parse_slots(bodies[0])
    assert never_used == (SlotContext(0, 256, 0, False, None, False), SlotContext(1, 256, 0, False, None, False))
    one_busy = llamacpp.parse_slots(bodies[3])  # slot 0 generating; slot 1 idle after a request cut short at 255
    assert one_busy == (SlotContext(0, 256, 214, True, 145, False), SlotContext(1, 256, 255, False, 11, True))
    light = llamacpp.parse_slots(_slots_of("light")[-1])  # 64 + 384 tokens, the last not cached: 447 of 512
    assert {(s.tokens, s.full) for s in light} == {(447, False)}


def test_llamacpp_slots_fill_the_snapshot_and_a_recording_keeps_only_what_is_read():
    body = _slots_of("context_too_small")[5]  # both slots generating: 150 and 245 of 256
    parsed = llamacpp.parse_slots(body)
    snaps = read("llamacpp", (LLAMACPP / "context_too_small" / "1796401794.513.prom").read_text())
    llamacpp.fill_slots(parsed, snaps)
    (snap,) = snaps.values()
    assert snap.slots == parsed and snap.gauges[Gauge.CONTEXT_USED_MAX_RATIO] == 245 / 256
    kept = llamacpp.record_slots(parsed)
    assert llamacpp.parse_slots(kept) == parsed
    assert b"params" in body and b"params" not in kept and len(kept) < len(body) / 4


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\xff{[",
        b"null",
        b"{}",
        b'{"slots": []}',
        b'[{"id": 0, "n_ctx": 256}]',  # no is_processing
        b'[{"id": "0", "n_ctx": 256, "is_processing": false}]',
        b'[{"id": 0, "n_ctx": 256.0, "is_processing": false}]',
        b'[{"id": 0, "n_ctx": 0, "is_processing": false}]',
        b'[{"id": 0, "n_ctx": true, "is_processing": false}]',
        b'[{"id": 0, "n_ctx": 256, "is_processing": 1}]',
        b'[{"id": 0, "n_ctx": 256, "is_processing": true, "id_task": 3, "n_prompt_tokens": -1}]',
        b'[{"id": 0, "n_ctx": 256, "is_processing": true, "id_task": 3, "n_prompt_tokens": NaN}]',
        b'[{"id": 0, "n_ctx": 256, "is_processing": true, "id_task": "x", "n_prompt_tokens": 3}]',
        b'[{"id": 0, "n_ctx": 4294967296, "is_processing": false}]',
        b'[{"id": 0, "n_ctx": 256, "is_processing": false}, {"id": 0, "n_ctx": 256, "is_processing": false}]',
        b'[{"id": 0, "n_ctx": 256, "is_processing": false}, 7]',
        b"[" * 100_000 + b"]" * 100_000,
        b'[{"id": 0, "n_ctx": 256, "is_processing": true, "id_task": 1, "n_prompt_tokens": ' + b"9" * 5000 + b"}]",
        b"[" + b'{"id": 0, "n_ctx": 1, "is_processing": false},' * (llamacpp.MAX_SLOTS + 1) + b"0]",
    ],
    ids=lambda b: repr(b[:40]),
)
def test_llamacpp_slots_of_another_shape_are_not_read(body):
    assert llamacpp.parse_slots(body) is None


_JUNK = st.one_of(st.integers(), st.booleans(), st.none(), st.floats(), st.text(max_size=3), st.lists(st.none()))
_SLOT_KEYS = ["id", "n_ctx", "is_processing", "id_task", "n_prompt_tokens"]


@st.composite
def _slots_docs(draw) -> object:
    """/slots as llama.cpp serves it (ids in order, a slot used or not, tokens up to a little past its context), or
    with one field of one slot spoilt (any JSON value, a field dropped as None), or not a list at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_JUNK)
    slots = []
    for i in range(draw(st.integers(0, 5))):
        n_ctx = draw(st.integers(1, 600))
        slot: dict = {"id": i, "n_ctx": n_ctx, "is_processing": draw(st.booleans())}
        if draw(st.booleans()):
            slot |= {"id_task": draw(st.integers(-1, 10**6)), "n_prompt_tokens": draw(st.integers(0, n_ctx + 2))}
        slots.append(slot)
    if slots and draw(st.booleans()):
        draw(st.sampled_from(slots))[draw(st.sampled_from(_SLOT_KEYS))] = draw(_JUNK)
    return slots


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_slots_docs())
@example([{"id": 0, "n_ctx": 1, "is_processing": False, "id_task": None, "n_prompt_tokens": 1}])  # found by it
def test_llamacpp_slots_reader_never_raises_and_reads_only_ints_in_range(doc):
    body = json.dumps(doc).encode()
    parsed = llamacpp.parse_slots(body)
    if parsed is not None:
        snaps = {("", "0"): EngineSnapshot("", "0")}
        llamacpp.fill_slots(parsed, snaps)
        assert 0.0 <= snaps["", "0"].gauges[Gauge.CONTEXT_USED_MAX_RATIO] <= 1.0
        assert all(type(s.n_ctx) is int and s.n_ctx >= 1 and type(s.tokens) is int and s.tokens >= 0 for s in parsed)
        assert llamacpp.parse_slots(llamacpp.record_slots(parsed)) == parsed


@pytest.mark.parametrize(
    ("target", "slots"),
    [
        ("http://127.0.0.1:8080/metrics", "http://127.0.0.1:8080/slots"),
        ("https://user:pw@proxy.example/llama/metrics/?tenant=a", "https://user:pw@proxy.example/llama/slots?tenant=a"),
        ("http://127.0.0.1:8080/stats/prometheus", None),  # where /slots is cannot be known: not asked
    ],
)
def test_the_slots_url_is_the_targets_with_metrics_replaced(target, slots):
    assert llamacpp.ENGINE.extra_url(target) == slots
    assert VLLM.extra_url(target) is None  # an engine without a second path is never asked for one


def test_a_request_reaching_its_slots_context_is_counted_once_and_an_idle_slots_old_one_never():
    busy = SlotContext(0, 256, 200, True, 7, False)
    cut = SlotContext(0, 256, 255, False, 7, True)  # the same request, ended at the end of its context
    other = SlotContext(0, 256, 255, False, 9, True)  # another request, also cut short, between two scrapes
    assert contexts_filled((busy,), (cut,)) == 1
    assert contexts_filled((cut,), (cut,)) == 0  # an idle slot keeps its last request's figures: not again
    assert contexts_filled((cut,), (other,)) == 1
    assert contexts_filled(None, (cut,)) is None  # the scrape before unknown: when it ended cannot be told
    assert contexts_filled((busy,), None) is None
    assert contexts_filled((), (SlotContext(0, 256, 255, False, None, True),)) == 0  # no request in it


# --- the target: wrong engine, no engine, a mix, a restart as another -------------------------------------------------


def test_engine_forced_on_another_engines_endpoint_says_which_engine_it_is():
    t = Target("x", engine="vllm")
    with pytest.raises(NoEngineMetrics, match=r"llama\.cpp metrics \(use --engine llamacpp or auto\)"):
        t.observe_body(1.0, LLAMA_SLOTS_FULL)  # as the scrape loop reads it: parsed with the target's filter
    t.observe_body(2.0, captures("kv_cache")[10] + LLAMA_SLOTS_FULL)  # vLLM's families in it: read as vLLM
    assert t.diagnose(2.0).engine_type == "vllm"


def test_no_engine_names_the_engines_tried_and_the_families_seen():
    t = Target("x")
    body = "# TYPE node_load1 gauge\nnode_load1 0.5\n# TYPE up gauge\nup 1\n"
    with pytest.raises(NoEngineMetrics) as e:
        t.observe_body(1.0, body)
    msg = str(e.value)
    assert all(engine.title in msg for engine in ENGINES) and "node_load1" in msg


def test_a_target_that_restarts_as_another_engine_starts_clean():
    t = Target("x")
    for i, body in enumerate(captures("kv_cache")[5:10]):
        t.observe_body(1000.0 + i, body)
    assert t.diagnose(1004.0).engine_type == "vllm"
    t.observe_body(1005.0, LLAMA_SLOTS_FULL)
    d = t.diagnose(1005.0)
    assert d.engine_type == "llamacpp" and [(e.model_name, e.engine) for e in d.engines] == [("", "0")]
    assert len(t.engines[("", "0")].points) == 1  # no vLLM point mixed into llama.cpp's history


def test_a_body_mixing_engines_is_read_as_the_engine_it_mostly_is():
    t = Target("x")
    t.observe_body(1.0, captures("kv_cache")[10] + "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n")
    assert t.diagnose(1.0).engine_type == "vllm"


# --- diagnose: never a limit the engine cannot show -------------------------------------------------------------------


def test_a_limit_the_engine_cannot_show_is_never_named_for_it():
    blind = dataclasses.replace(VLLM, shows=VLLM.shows - {Bottleneck.KV_CACHE})
    t = Target("fixture")
    named = set()
    for ts, p in recording(FIXTURES / "kv_cache"):
        t.observe_body(ts, p.read_text())
        for h in t.fresh_engines(ts):
            sig = summarize(h, ts, t.window_seconds)
            assert diagnose_engine(sig, engine=VLLM).bottleneck in VLLM.shows
            named.add(diagnose_engine(sig, engine=blind).bottleneck)
    assert Bottleneck.KV_CACHE not in named and named  # the capture is KV-bound: VLLM names it (test_diagnose)


# --- hostile input, every adapter --------------------------------------------------------------------------------------

_FAMILIES_OF = [sorted(m.KEEP_FAMILIES) for m in (vllm, sglang, trtllm, llamacpp)]
_FAMILY_NAMES = sorted({n for names in _FAMILIES_OF for n in names})
_LABELS = [
    "model_name",
    "engine",
    "dp_rank",
    "tp_rank",
    "name",
    "priority",
    "mode",
    "model",
    "version",
    "request_type",
    "kv_cache_block_type",
    "le",
    "reason",
    "source",
    "stage",
    "finished_reason",
]
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**20), 10**20).map(float),
    st.sampled_from([0.0, 1.0, -1.0, 1e308, 5e-324]),
)
_LABEL_VALUES = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "",
            "+Inf",
            "0.5",
            "active",
            "max",
            "fraction",
            "decode",
            "prefill_compute",
            "waiting",
            "used",
            "tokens_per",
        ]
    ),
    st.text(min_size=0, max_size=300),
)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


@st.composite
def _bodies(draw) -> str:
    lines = []
    own = draw(st.sampled_from(_FAMILIES_OF))  # mostly one engine's families (else vLLM, with the most, wins)
    names = draw(st.lists(st.sampled_from(own), min_size=1, max_size=12))
    names += draw(st.lists(st.sampled_from(_FAMILY_NAMES), max_size=2))  # and a few of any engine's
    for name in names:
        suffix = draw(st.sampled_from(["", "", "", "_total", "_total", "_bucket", "_sum", "_count", "_created"]))
        for _ in range(draw(st.integers(1, 4))):
            labels = draw(st.dictionaries(st.sampled_from(_LABELS), _LABEL_VALUES, max_size=4))
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            value = draw(_VALUES)
            lines.append(f"{name}{suffix}{{{text}}} {value!r}".replace("nan", "NaN").replace("inf", "Inf"))
    return "\n".join(lines) + "\n"


@pytest.mark.slow  # 300 scrapes of hostile text through every adapter: ~20 s
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_bodies(), min_size=1, max_size=4))
@example(  # found by this test: engines that change from scrape to scrape stay within --max-engines per scrape
    [
        "vllm:admission_rejections{} 0.0\n",
        'trtllm_num_requests_running{} 0.0\ntrtllm_num_requests_running{model_name="0"} 0.0\n'
        'trtllm_num_requests_running{model_name="0.5"} 0.0\n',
        'trtllm_kv_cache_hit_rate{model_name="+Inf"} 0.0\ntrtllm_kv_cache_hit_rate{model_name="1"} 0.0\n',
    ]
)
def test_any_mix_of_engine_families_never_crashes_and_stays_bounded_and_json(bodies):
    """Families of every engine, any labels, any values (NaN, infinities, huge, negative), scrape after scrape through
    auto-detection: a scrape is read or refused with a reason, never a crash, the engines stay within --max-engines,
    and the exports and the JSON document stay valid."""
    t = Target("http://fuzz/metrics", max_engines=3)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KvwatchCollector(lambda: [t]))
    for i, body in enumerate(bodies):
        try:
            t.observe_body(1000.0 + i, body)
        except (ParseError, NoEngineMetrics) as e:
            t.observe_failure(1000.0 + i, str(e))
        t.diagnosis = t.diagnose(1000.0 + i)
        # this scrape's engines: 3 + the overflow one (earlier scrapes' engines stay until stale: fresh_engines)
        assert sum(1 for h in t.engines.values() if h.points and h.points[-1].t == 1000.0 + i) <= 4
        assert generate_latest(registry)
        json.dumps(t.diagnosis.as_dict(), allow_nan=False)
