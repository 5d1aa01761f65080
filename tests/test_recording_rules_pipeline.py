"""The fleet recording rules (alerts/kvwatch-rules.yaml, unmodified) against the sidecar, on the same data.

Recorded real vLLM 0.32 snapshots (KV-bound run) served over HTTP -> real ``kvwatch run`` and a real Prometheus
scraping both it and the fake vLLM and evaluating the shipped recording rules. Its own file so that pytest-xdist
runs it beside the alerting pipeline test (each takes 1.5-2 minutes of real time).
"""

from __future__ import annotations

import time

import pytest

from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.prometheus import Kvwatch, Prometheus
from tests.test_alerts_pipeline import KV_BOUND, RULE_FILES

pytestmark = [pytest.mark.pipeline, pytest.mark.slow]

# ---------------------------------------------------------------------------------------------------------------
# Fleet recording rules vs the sidecar, on the same data.
# Tolerances: capacity exact; the bottleneck the same; rates, mean sequence tokens and estimated max concurrency
# within 10 % (Prometheus' rate() extrapolates to the window edges, kvwatch divides by the span of its samples;
# both see the same looping real data); throughput-gap fraction within 0.15 absolute (each samples 1 s intervals
# at its own phase).
RATE_TOLERANCE = 0.10
GAP_TOLERANCE = 0.15


def test_fleet_recording_rules_agree_with_the_sidecar(tmp_path):
    with (
        FakeVllm().replay(KV_BOUND) as vllm,
        Kvwatch(["run", "--target", vllm.url, "--interval", "1", "--window", "60"], tmp_path / "kvwatch") as kv,
    ):
        prom_cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [
                {"job_name": "kvwatch", "static_configs": [{"targets": [f"127.0.0.1:{kv.port}"]}]},
                {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{vllm.port}"]}]},
            ],
        }
        # The shipped rules, unmodified.
        with Prometheus(prom_cfg, tmp_path / "prom", rule_files=RULE_FILES) as prom:
            # Both need a full minute of data: kvwatch's --window 60 and the rules' [1m] windows.
            prom.wait_for(
                lambda: prom.value("engine:vllm_generation_tokens:rate1m") is not None,
                timeout=30,
                what="recording rules evaluating",
            )
            start = time.monotonic()
            prom.wait_for(lambda: time.monotonic() - start > 85, timeout=120, what="85 s of data")

            def both(fleet: str, sidecar: str, window: str = "20s") -> tuple[float, float]:
                f = prom.value(f"avg(avg_over_time({fleet}[{window}]))")
                s = prom.value(f"avg(avg_over_time({sidecar}[{window}]))")
                assert f is not None and s is not None, (fleet, f, sidecar, s)
                return f, s

            pairs = {
                "prompt tok/s": ("engine:vllm_prompt_tokens_computed:rate1m", "kvwatch_prompt_tokens_per_second"),
                "generation tok/s": ("engine:vllm_generation_tokens:rate1m", "kvwatch_generation_tokens_per_second"),
                "preemptions/s": ("engine:vllm_num_preemptions:rate1m", "kvwatch_preemptions_per_second"),
                "mean sequence tokens": ("engine:vllm_request_sequence_tokens:mean1m", "kvwatch_mean_sequence_tokens"),
                "estimated max concurrency": (
                    "engine:vllm_estimated_max_concurrency:requests",
                    "kvwatch_estimated_max_concurrency",
                ),
                "engine step tokens": ("engine:vllm_iteration_tokens:mean1m", "kvwatch_engine_step_tokens"),
            }
            report = {}
            for name, (fleet, sidecar) in pairs.items():
                f, s = both(fleet, sidecar)
                report[name] = (round(f, 3), round(s, 3))
                assert abs(f - s) <= RATE_TOLERANCE * abs(s), (name, f, s)

            f, s = both("engine:vllm_kv_cache_capacity:tokens", "kvwatch_kv_cache_capacity_tokens")
            assert f == s == 2048
            f, s = both("engine:vllm_throughput_gap:last", "kvwatch_throughput_gap", window="60s")
            report["throughput gap fraction"] = (round(f, 3), round(s, 3))
            assert abs(f - s) <= GAP_TOLERANCE, ("gap", f, s)

            fleet_b = prom.query("engine:vllm_bottleneck:approx == 1")
            assert [r["metric"]["bottleneck"] for r in fleet_b] == ["kv_cache"]
            # The fleet rule reads [1m] windows; the sidecar's diagnosis is per scrape, so judge its last 20 s.
            side_b = {
                r["metric"]["bottleneck"]: float(r["value"][1])
                for r in prom.query("avg_over_time(kvwatch_bottleneck[20s]) > 0")
            }
            assert side_b.get("kv_cache", 0.0) >= 0.9, side_b
            print("\nfleet vs sidecar:", report)
