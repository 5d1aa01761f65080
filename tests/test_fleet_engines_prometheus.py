"""The fleet recording rules and the Fleet dashboard on a real Prometheus, for SGLang and llama.cpp pods.

A real llama.cpp server's captures under load (tests/fixtures/engines/llamacpp/captures/slot_ceiling: every slot
busy, requests deferred) and an SGLang exposition written from its collector's source (tests/fixtures/engines/sglang,
two data-parallel ranks, its counters moving) are served over HTTP; the real Prometheus scrapes both with the labels
Kubernetes would add and evaluates the shipped rules (alerts/, unmodified). Every Fleet panel then has data for each
pod, or the panel states the reason it cannot (``no_data`` in grafana/fleet.py, the reasons
tests/test_dashboards_prometheus.py checks on the simulator): llama.cpp exports no KV gauge, no context size, no
preemption, no finished-request count and no live token counter (docs/alerts.md, "Fleet rules per engine"); a stated
reason for a query that has data fails too. The llama.cpp pod is never called KV- or token-budget bound. The vLLM
side: tests/test_dashboards_prometheus.py and tests/test_recording_rules_pipeline.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import grafana
from grafana import common
from tests.helpers.dashboards import RATE_INTERVAL, STEP, grafana_regex_escape, has_data, recording_rule_files
from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.prometheus import Prometheus
from tests.helpers.recordings import recording

pytestmark = [pytest.mark.pipeline, pytest.mark.slow, pytest.mark.timeout(600)]

ENGINES = Path(__file__).resolve().parent / "fixtures" / "engines"
NAMESPACE = "llm"
LLAMA_POD, SGLANG_POD = "llama-0", "sglang-0"
COUNTER = re.compile(r"^(sglang:\S+_total(?:\{[^}]*\})?) (\S+)$", re.M)


def sglang_recording(folder: Path, seconds: int = 30) -> list[tuple[float, Path]]:
    """The SGLang exposition written from its collector's source, once a second with every counter moving
    (100 x its per-second step), and a finished-request counter beside its token counters."""
    body = (ENGINES / "sglang" / "written_from_source.prom").read_text()
    body += (
        "# TYPE sglang:num_requests_total counter\n"
        'sglang:num_requests_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 1000.0\n'
    )
    folder.mkdir()
    t0 = 1_800_000_000.0
    for i in range(seconds):
        moved = COUNTER.sub(lambda m, i=i: f"{m[1]} {float(m[2]) * (1 + i / 100):.1f}", body)
        (folder / f"{t0 + i:.3f}.prom").write_text(moved)
    return recording(folder)


def fleet_queries() -> list[tuple[str, str, str]]:
    dash = grafana.build_all()["kvwatch-fleet"]
    return [(p["title"], t["refId"], t["expr"]) for p, t in common.panel_queries(dash)]


def cannot(engine: str) -> set[tuple[str, str]]:
    """The Fleet queries (title, refId) whose panel states that ``engine`` cannot fill them."""
    dash = grafana.build_all()["kvwatch-fleet"]
    return {(p["title"], ref) for p in common.iter_panels(dash) for e, ref in common.no_data_of(p) if e == engine}


def has_data_for(prom: Prometheus, expr: str, pod: str, start: float) -> bool:
    values = {
        "namespace": NAMESPACE,
        "pod": grafana_regex_escape(pod),
        "model_name": ".*",
        "__rate_interval": RATE_INTERVAL,
    }
    return has_data(prom.query_range(common.substitute(expr, values), start, time.time(), STEP))


def test_fleet_rules_and_dashboard_for_sglang_and_llamacpp_pods(tmp_path):
    llama = recording(ENGINES / "llamacpp" / "captures" / "slot_ceiling")
    sglang = sglang_recording(tmp_path / "sglang")
    with FakeVllm().replay(llama) as fake_llama, FakeVllm().replay(sglang) as fake_sglang:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [
                {
                    "job_name": "llamacpp",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{fake_llama.port}"],
                            "labels": {"namespace": NAMESPACE, "pod": LLAMA_POD},
                        }
                    ],
                },
                {
                    "job_name": "sglang",
                    "static_configs": [
                        {
                            "targets": [f"127.0.0.1:{fake_sglang.port}"],
                            "labels": {"namespace": NAMESPACE, "pod": SGLANG_POD},
                        }
                    ],
                },
            ],
        }
        with Prometheus(config, tmp_path / "prom", rule_files=recording_rule_files()) as prom:
            start = time.time()
            # The rules' [1m] windows need a minute of data before the conditions settle.
            prom.wait_for(lambda: time.time() - start > 70, timeout=120, what="70 s of data")
            for pod in (LLAMA_POD, SGLANG_POD):
                rule = prom.query(f'engine:vllm_bottleneck:approx{{pod="{pod}"}}')
                assert rule, f"{pod}: no bottleneck approximation"
            empty, filled = [], []
            for title, ref, expr in fleet_queries():
                for pod in (LLAMA_POD, SGLANG_POD):
                    (filled if has_data_for(prom, expr, pod, start) else empty).append((pod, title, ref))
            llama_empty = {(t, r) for p, t, r in empty if p == LLAMA_POD}
            sglang_empty = {(t, r) for p, t, r in empty if p == SGLANG_POD}
            assert sglang_empty == cannot("sglang"), sglang_empty ^ cannot("sglang")
            assert llama_empty == cannot("llamacpp"), llama_empty ^ cannot("llamacpp")
            assert llama_empty, "the Fleet panels state what llama.cpp cannot fill"
            # SGLang: one engine per data-parallel rank (the exposition's two), its tensor ranks not added.
            ranks = prom.query(f'engine:vllm_num_requests_running:avg1m{{pod="{SGLANG_POD}"}}')
            running = sorted((r["metric"].get("dp_rank"), float(r["value"][1])) for r in ranks)
            assert running == [("0", 48.0), ("1", 31.0)], running
            # llama.cpp: the KV cache and the token budget are never named; over the run it is one of the others.
            seen = prom.query(f'max_over_time(engine:vllm_bottleneck:approx{{pod="{LLAMA_POD}"}}[2m]) == 1')
            states = {r["metric"]["bottleneck"] for r in seen}
            assert states and not states & {"kv_cache", "token_budget"}, states
            print(f"\nllama.cpp pod: states {sorted(states)}; panels without data: {sorted(llama_empty)}")
