"""vLLM 0.33's newer families reach the snapshot as raw fields, the same from text and from OpenMetrics, and CPU KV
offload is reported in the evidence. Bodies are written inline from the source lines cited beside each family
(vllm/v1/metrics/loggers.py at 00ec631b; vllm/v1/kv_offload/cpu/common.py), on top of a 0.33 fixture."""

from __future__ import annotations

from kvwatch.diagnose import Hints
from kvwatch.engines.vllm import keep_family
from kvwatch.engines.vllm import read as read_vllm
from kvwatch.parse import parse
from kvwatch.snapshot import REJECTIONS
from kvwatch.state import Target
from tests.helpers.recordings import recording
from tests.helpers.v033 import fixtures, make

V033 = fixtures()
M = 'model_name="tiny-llama-dummy"'


def _to_openmetrics(text: str) -> str:
    return make().to_openmetrics(text)


def _extra(pinned: dict[str, float], skipped: float = 3.0, rejected: float | None = 7.0, fetch: bool = True) -> str:
    """The 0.33 families a P/D consumer with CPU offload adds, for the engines of ``pinned`` (engine -> the
    pinned share), each family declared once; ``rejected``: the API server's admission counter, or none;
    ``fetch``: the KV consumer's loads (3 of the queue: the kv_transfer rule reads them)."""
    es = [f'engine="{e}",{M}' for e in pinned]
    fetches = [
        # loggers.py gauge_kv_fetch_by_stage: only when kv_transfer_config.is_kv_consumer
        "# HELP vllm:num_requests_kv_fetch_by_stage Number of waiting requests by async KV load stage.",
        "# TYPE vllm:num_requests_kv_fetch_by_stage gauge",
        *(
            f'vllm:num_requests_kv_fetch_by_stage{{{e},stage="{s}"}} {v}'
            for e in es
            for s, v in (("waiting_to_start", 2.0), ("in_progress", 1.0), ("completed_waiting", 0.0))
        ),
    ]
    lines = fetches if fetch else []
    lines += [
        # vllm/v1/kv_offload/cpu/common.py CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, a gauge
        "# HELP vllm:kv_offload_cpu_cache_usage_perc Fraction of CPU KV-cache space currently pinned by active transfers.",
        "# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge",
        *(f"vllm:kv_offload_cpu_cache_usage_perc{{{e}}} {v}" for e, v in zip(es, pinned.values(), strict=True)),
        # CPUOffloadingMetrics.STORES_SKIPPED, a counter (store_threshold >= 2)
        "# HELP vllm:kv_offload_stores_skipped_total Number of KV offload stores skipped.",
        "# TYPE vllm:kv_offload_stores_skipped_total counter",
        *(f"vllm:kv_offload_stores_skipped_total{{{e}}} {skipped}" for e in es),
    ]
    if rejected is not None:  # the API server's counter: model_name and reason, no engine (as the real 0.32 capture)
        lines += [
            "# HELP vllm:admission_rejections_total Number of admission attempts rejected by a queue limit, by reason.",
            "# TYPE vllm:admission_rejections_total counter",
            f'vllm:admission_rejections_total{{{M},reason="max_num_queued_reqs"}} {rejected}',
            f'vllm:admission_rejections_total{{{M},reason="max_num_queued_tokens"}} 0.0',
        ]
    return "\n".join(lines) + "\n"


def _two_engines(body: str) -> str:
    """A 0.33 body for data parallel 2: each engine-labelled sample followed by the same for engine 1."""
    out = []
    for line in body.splitlines():
        out.append(line)
        if 'engine="0"' in line and not line.startswith("#"):
            out.append(line.replace('engine="0"', 'engine="1"'))
    return "\n".join(out) + "\n"


def _snapshots(body: str) -> dict:
    return {k: (s.gauges, s.counters) for k, s in read_vllm(parse(body, keep_family)).items()}


def test_033_raw_fields_from_text_and_from_openmetrics():
    base = _two_engines(next(V033.glob("text/kv_cache/*.prom")).read_text())
    body = base + _extra({"0": 0.25, "1": 0.5})
    snaps = _snapshots(body)
    snaps_hists = {k[1]: s.histograms for k, s in read_vllm(parse(body, keep_family)).items()}
    levels = {k[1]: s.sleep_level for k, s in read_vllm(parse(_to_openmetrics(body), keep_family)).items()}
    assert levels == {"0": 0, "1": 0}  # awake=1 (loggers.py record_sleep_state), read from OpenMetrics too
    assert snaps == _snapshots(_to_openmetrics(body))  # the Rust frontend's form gives the same fields
    for engine, pinned in (("0", 0.25), ("1", 0.5)):
        gauges, counters = snaps[("tiny-llama-dummy", engine)]
        assert gauges["kv_fetch_waiting_to_start"] == 2.0 and gauges["kv_fetch_in_progress"] == 1.0
        assert counters["prompt_tokens"] > 0 and "iteration_tokens" in snaps_hists[engine]
        assert gauges["kv_offload_pinned_ratio"] == pinned and counters["kv_offload_stores_skipped"] == 3.0
        # The model's count on each engine as it is: not halved, not doubled.
        assert counters[REJECTIONS + "max_num_queued_reqs"] == 7.0
        assert counters[REJECTIONS + "max_num_queued_tokens"] == 0.0
        # num_requests_waiting includes the deferred (loggers.py record()): the reasons add up to it
        assert gauges["requests_waiting"] == gauges["requests_waiting_capacity"] + gauges["requests_waiting_deferred"]


def _diagnoses(extra_for):
    """The 0.33 kv_cache run with ``extra_for(i)`` appended to its i-th body."""
    state, out = Target("fixture", hints=Hints(max_num_seqs=16, max_model_len=1024)), []
    for i, (t, f) in enumerate(recording(V033 / "text" / "kv_cache")):
        state.observe_body(t, f.read_text() + extra_for(i))
        out.append(state.diagnose(t))
    return out


def test_offload_saturation_is_in_the_evidence_and_changes_no_verdict():
    plain = _diagnoses(lambda i: "")
    pinned = [0.4, 1.0, 1.0, 0.6]
    offload = _diagnoses(lambda i: _extra({"0": pinned[i % 4]}, rejected=None, fetch=False))
    assert [d.bottleneck for d in offload] == [d.bottleneck for d in plain]
    texts = [" ".join(d.engines[0].evidence) for d in offload]
    assert all("CPU KV offload: up to 100% of the CPU tier pinned by in-flight transfers" in t for t in texts[2:])
    assert all("offload saturated" in t for t in texts[2:])
    assert not any("CPU KV offload" in " ".join(d.engines[0].evidence) for d in plain)  # absent, nothing said
    never_full = _diagnoses(lambda i: _extra({"0": 0.6}, rejected=None, fetch=False))
    text = " ".join(never_full[5].engines[0].evidence)
    assert "up to 60% of the CPU tier" in text and "not how full the CPU tier is" in text and "saturated" not in text
    assert offload[5].engines[0].signals.as_dict()["kv_offload_pinned_max"] == 1.0


def _custom_steps_body(counts: tuple[int, int, int], steps: int, tokens: float) -> str:
    """0.33 with custom_histogram_buckets={"iteration_tokens": [100, 250, 300]} (loggers.py histogram_buckets)."""
    e = f'engine="0",{M}'
    cum = [counts[0], counts[0] + counts[1], sum(counts)]
    return (
        "\n".join(
            [
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{e}}} 8.0",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{e}}} 20.0",
                "# TYPE vllm:kv_cache_usage_perc gauge",
                f"vllm:kv_cache_usage_perc{{{e}}} 0.3",
                "# TYPE vllm:iteration_tokens_total histogram",
                *(
                    f'vllm:iteration_tokens_total_bucket{{{e},le="{le}"}} {c}.0'
                    for le, c in zip(("100.0", "250.0", "300.0"), cum, strict=True)
                ),
                f'vllm:iteration_tokens_total_bucket{{{e},le="+Inf"}} {steps}.0',
                f"vllm:iteration_tokens_total_count{{{e}}} {steps}.0",
                f"vllm:iteration_tokens_total_sum{{{e}}} {tokens}",
            ]
        )
        + "\n"
    )


def test_a_custom_step_bucket_layout_bounds_the_steps_by_its_own_edges():
    state = Target("custom")
    state.observe_body(1000.0, _custom_steps_body((0, 0, 0), 0, 0.0))
    state.observe_body(1001.0, _custom_steps_body((2, 38, 0), 40, 9200.0))  # 40 steps, all in (100, 250]
    th = state.diagnose(1001.0).engines[0].signals.throughput
    assert th.step_tokens_max == 250.0 and th.engine_step_tokens == 230.0
