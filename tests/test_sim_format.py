"""The simulator's /metrics text against real vLLM 0.32 captures (tests/fixtures/vllm-0.32.0-cpu)."""

from __future__ import annotations

import math
import random
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from kvwatch.sim import Simulator, load_scenario, render
from kvwatch.sim.exposition import float_to_go
from tests.helpers.recordings import FIXTURES, recording

CAPTURE_DIRS = ("kv_cache", "max_num_seqs", "none_prefix_cache", "token_budget")
PRESETS = ("idle", "healthy", "kv_cache", "max_num_seqs", "token_budget", "stalled", "tour")

_HEAD = re.compile(r"^# (HELP|TYPE) (\S+) ?(.*)$")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def families(text: str) -> dict[str, dict]:
    """{family: {"type", "help", "labels": {sample_name: set of label-name tuples (in printed order)}}}."""
    out: dict[str, dict] = {}
    current = None
    for line in text.split("\n")[:-1]:
        m = _HEAD.match(line)
        if m:
            kind, name, rest = m.groups()
            fam = out.setdefault(name, {"type": None, "help": None, "labels": {}})
            fam["help" if kind == "HELP" else "type"] = rest
            current = name
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        sample, _, labels, _ = m.groups()
        names = tuple(k for k, _ in _PAIR.findall(labels or ""))
        out[current]["labels"].setdefault(sample, set()).add(names)
    return out


def real_families() -> dict[str, dict]:
    merged: dict[str, dict] = {}
    for d in CAPTURE_DIRS:
        for _, f in recording(FIXTURES / d):
            for name, fam in families(f.read_text()).items():
                m = merged.setdefault(name, {"type": fam["type"], "help": fam["help"], "labels": {}})
                assert m["type"] == fam["type"]
                for s, ls in fam["labels"].items():
                    m["labels"].setdefault(s, set()).update(ls)
    return merged


REAL = real_families()


# Families the 0.32 captures cannot show (no LoRA, no P/D there): each is checked against vLLM's source below.
NOT_CAPTURED = {"vllm:lora_requests_info", "vllm:num_requests_kv_fetch_by_stage"}


def simulated(preset: str, seconds: float = 20.0, version: str = "0.32", **kw) -> str:
    sim = Simulator(load_scenario(preset, overrides=kw.pop("overrides", None)), seed=3, **kw)
    sim.advance_to(seconds)
    return render(sim, version)


def test_the_captures_are_there():
    assert len(REAL) > 80, "tests/fixtures/vllm-0.32.0-cpu is missing or empty"
    assert REAL["vllm:kv_cache_usage_perc"]["type"] == "gauge"


@pytest.mark.parametrize("preset", PRESETS)
def test_every_emitted_family_exists_in_the_real_captures_with_same_type_help_and_labels(preset):
    text = simulated(preset)
    sim = families(text)
    assert sim, "nothing rendered"
    for name, fam in sim.items():
        if name in NOT_CAPTURED:
            continue  # not in the captures (no LoRA, no P/D there); checked against vLLM's source below
        assert name in REAL, f"{name} is not a vLLM 0.32 family"
        real = REAL[name]
        assert fam["type"] == real["type"], name
        assert fam["help"] == real["help"], name
        for sample, labelsets in fam["labels"].items():
            assert sample in real["labels"], f"{sample} never appears in the captures"
            assert labelsets <= real["labels"][sample], (sample, labelsets, real["labels"][sample])


@pytest.mark.parametrize("preset", PRESETS)
def test_the_vllm_families_are_all_there_in_the_captures_order(preset):
    """Same families in the same order as a real capture (python/process/http aside)."""
    ours = [n for n in families(simulated(preset)) if n.startswith("vllm:") and n not in NOT_CAPTURED]
    real = [n for n in families((FIXTURES / "kv_cache" / "1796120560.003.prom").read_text()) if n.startswith("vllm:")]
    assert ours == real


def test_a_busy_snapshot_has_the_capture_line_structure():
    """Line by line the same as a real capture of the same state, once values and label values are masked."""

    def mask(text):
        out = []
        for line in text.split("\n"):
            if line.startswith(("python_", "process_", "http_", "# HELP http", "# TYPE http")):
                continue
            out.append(re.sub(r'="[^"]*"', '=""', re.sub(r" [^ ]+$", " V", line)))
        return out

    real = (FIXTURES / "kv_cache" / "1796120560.003.prom").read_text()
    ours = simulated("kv_cache", 10.0)
    assert mask(ours) == mask(real)


def test_cache_config_info_has_the_real_label_set_and_values_for_the_same_flags():
    real_line = next(
        ln
        for ln in (FIXTURES / "kv_cache" / "1796120560.003.prom").read_text().splitlines()
        if ln.startswith("vllm:cache_config_info{")
    )
    ours_line = next(ln for ln in simulated("kv_cache", 1.0).splitlines() if ln.startswith("vllm:cache_config_info{"))
    assert ours_line == real_line  # 64 blocks x 32, 8 MiB, 2048 tokens, max concurrency 2.0 at 1024


def test_kv_fetch_by_stage_matches_vllm_033_source_definition():
    # vLLM 0.33 v1/metrics/loggers.py (commit 00ec631b): Gauge("vllm:num_requests_kv_fetch_by_stage", ...,
    # labelnames=[model_name, engine, stage]) for stage in KV_FETCH_STAGES, only with a kv_consumer config.
    text = simulated("kv_transfer", 20.0)
    fam = families(text)["vllm:num_requests_kv_fetch_by_stage"]
    assert fam["type"] == "gauge"
    assert fam["help"] == (
        "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs an async KV "
        "load that has not started; 'in_progress' = load started and not yet reported finished; "
        "'completed_waiting' = load finished, request not running yet."
    )
    assert fam["labels"] == {"vllm:num_requests_kv_fetch_by_stage": {("engine", "model_name", "stage")}}
    stages = re.findall(r'^vllm:num_requests_kv_fetch_by_stage\{.*stage="(\w+)"\}', text, re.M)
    assert stages == ["waiting_to_start", "in_progress", "completed_waiting"]
    assert "vllm:num_requests_kv_fetch_by_stage" not in families(simulated("healthy", 5.0))


def test_lora_requests_info_matches_vllm_source_definition():
    # vllm/v1/metrics/loggers.py: Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
    # labelnames=[max_lora, waiting_lora_adapters, running_lora_adapters]), set_to_current_time();
    # prometheus_client prints the label names sorted.
    text = simulated("healthy", 20.0)
    fam = families(text)["vllm:lora_requests_info"]
    assert fam["type"] == "gauge"
    assert fam["help"] == "Running stats on lora requests."
    assert fam["labels"] == {
        "vllm:lora_requests_info": {("max_lora", "running_lora_adapters", "waiting_lora_adapters")}
    }
    values = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:lora_requests_info{")]
    assert values and all(v > 1.6e9 for v in values)  # a unix timestamp
    running = {
        m
        for ln in text.splitlines()
        if ln.startswith("vllm:lora_requests_info{")
        for m in re.findall(r'running_lora_adapters="([^"]*)"', ln)
    }
    assert {a for r in running for a in r.split(",") if a} <= {"sql-lora", "chat-lora", "code-lora"}
    assert any(r for r in running), "no adapter ever ran"


@pytest.mark.parametrize("version", ["0.32", "0.10", "v0"])
def test_text_is_valid_exposition_and_every_line_ends_with_newline(version):
    text = simulated("tour", 40.0, version=version)
    assert text.endswith("\n") and "\n\n" not in text
    fams = list(text_string_to_metric_families(text))
    assert len(fams) > 20
    for f in fams:  # histograms are cumulative and end in +Inf == count
        if f.type != "histogram":
            continue
        groups: dict = {}
        for s in f.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            groups.setdefault(key, {"b": [], "count": None})
            if s.name.endswith("_bucket"):
                groups[key]["b"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                groups[key]["count"] = s.value
        for g in groups.values():
            if not g["b"]:
                continue
            vals = [v for _, v in g["b"]]
            assert vals == sorted(vals), f.name
            assert g["b"][-1][0] == math.inf and g["b"][-1][1] == g["count"], f.name


def test_numbers_are_formatted_like_prometheus_client():
    rng = random.Random(7)
    values = [
        0.0,
        1.0,
        -1.0,
        0.1,
        2.5e-05,
        1796120531.6861255,
        771809280.0,
        1e10,
        12345678901234.5,
        math.inf,
        -math.inf,
    ]
    values += [rng.uniform(0, 1e12) * 10 ** rng.randint(-12, 6) for _ in range(3000)]
    for v in values:
        assert float_to_go(v) == floatToGoString(v), v
    assert float_to_go(float("nan")) == "NaN"


def test_version_0_10_exports_both_kv_usage_names_with_equal_values():
    text = simulated("kv_cache", 8.0, version="0.10")

    def value(name):
        return [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name + "{")]

    kv, gpu = value("vllm:kv_cache_usage_perc"), value("vllm:gpu_cache_usage_perc")
    assert kv and kv == gpu and kv[0] > 0.5
    assert value("vllm:gpu_prefix_cache_queries_total") == value("vllm:prefix_cache_queries_total")
    fams = families(text)
    assert fams["vllm:gpu_cache_usage_perc"]["type"] == "gauge"
    assert fams["vllm:gpu_cache_usage_perc"]["labels"]["vllm:gpu_cache_usage_perc"] == {("engine", "model_name")}


def test_version_v0_uses_v0_names_and_no_engine_label():
    text = simulated("kv_cache", 8.0, version="v0")
    fams = families(text)
    for name in (
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_swapped",
        "vllm:time_per_output_token_seconds",
        "vllm:gpu_prefix_cache_hit_rate",
        "vllm:num_requests_running",
        "vllm:num_preemptions_total",
    ):
        assert name in fams, name
    for gone in ("vllm:kv_cache_usage_perc", "vllm:inter_token_latency_seconds", "vllm:prefix_cache_queries_total"):
        assert gone not in fams
    assert "engine=" not in text
    assert "_created" not in text  # V0 served its registry in multiprocess mode
    assert not any(n.startswith(("python_", "process_")) for n in fams)
    usage = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("vllm:gpu_cache_usage_perc{")]
    assert usage and 0.5 < usage[0] <= 1.0
    assert list(text_string_to_metric_families(text))


def test_v0_refuses_data_parallel_engines():
    sim = Simulator(load_scenario("kv_cache"), seed=1, engines=2)
    with pytest.raises(ValueError, match="engines"):
        render(sim, "v0")


def test_data_parallel_engines_get_their_own_engine_label_and_cache_config_series():
    sim = Simulator(load_scenario("kv_cache"), seed=1, engines=3)
    sim.advance_to(10.0)
    text = render(sim, "0.32")
    running = re.findall(
        r'^vllm:num_requests_running\{engine="(\d+)",model_name="tiny-llama-dummy"\} (\S+)$', text, re.M
    )
    assert [e for e, _ in running] == ["0", "1", "2"]
    assert all(float(v) > 0 for _, v in running)  # the load balancer spread the work
    assert len(re.findall(r"^vllm:cache_config_info\{", text, re.M)) == 3
    # no duplicate series
    series = [ln.rsplit(" ", 1)[0] for ln in text.splitlines() if not ln.startswith("#")]
    assert len(series) == len(set(series))
