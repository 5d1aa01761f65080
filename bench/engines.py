"""engines: each engine's adapter on its own payloads, against prometheus_client's parse of the same bytes.

Payloads: the real llama.cpp captures (tests/fixtures/engines/llamacpp/captures/slot_ceiling, a real server with its
slots full), and the simulator's ``kv_cache`` preset in each engine's exposition (``kvwatch.sim.expositions``: the
same simulated engine as vLLM, SGLang, trtllm-serve, Triton's TensorRT-LLM backend and llama.cpp print it).

Two figures per engine, each the median over rounds of per-round ratios (baseline and kvwatch alternate body by body,
as in ``bench.cycle``):
- ``adapter``: the parse with auto-detection's filter, the engine recognised and its adapter's read, against the
  baseline: what reading this engine costs.
- ``cycle``: the whole per-scrape work (``bench.cycle``: parse, adapter, window, diagnosis, kvwatch's own /metrics).
  Small payloads read high here: the diagnosis and kvwatch's own /metrics are a fixed cost that parsing 15 samples
  does not outweigh (docs/performance.md).
Neither is gated: ``make bench-check`` gates vLLM's cycle.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.cycle import baseline
from bench.cycle import run as run_cycle
from kvwatch.engines import by_name, detect, keep_any
from kvwatch.parse import parse
from kvwatch.recording import recording_files
from kvwatch.sim.expositions import EXPOSITIONS
from kvwatch.sim.scenario import load_scenario
from kvwatch.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parents[1]
LLAMACPP = ROOT / "tests" / "fixtures" / "engines" / "llamacpp" / "captures" / "slot_ceiling"


def simulated(exposition: str, seconds: int) -> list[str]:
    """The kv_cache preset's first ``seconds`` scrapes in one exposition."""
    sim = Simulator(load_scenario("kv_cache"), seed=7, wall_start=1.8e9)
    out = []
    for k in range(1, seconds + 1):
        sim.advance_to(float(k))
        out.append(EXPOSITIONS[exposition].render(sim))
    return out


def payloads(quick: bool) -> dict[str, list[str]]:
    seconds = 6 if quick else 30
    out = {"llamacpp (real captures)": [p.read_text() for _, p in recording_files(LLAMACPP)]}
    for name in EXPOSITIONS:
        out[f"{name} (simulated)"] = simulated(name, seconds)
    return out


def _adapter(body: str) -> int:
    families = parse(body, keep_any)
    engine = detect(families)
    assert engine is not None, "bench: no engine recognised in the payload"
    return len(by_name(engine.name).read(families, 64))


def adapter_ratio(bodies: list[str], rounds: int) -> dict:
    ratios, base_t, ours_t = [], [], []
    for _ in range(rounds):
        for body in bodies:
            t0 = time.perf_counter()
            baseline(body)
            t1 = time.perf_counter()
            _adapter(body)
            t2 = time.perf_counter()
            base_t.append(t1 - t0)
            ours_t.append(t2 - t1)
            ratios.append((t2 - t1) / (t1 - t0))
    return {
        "baseline_ms": statistics.median(base_t) * 1e3,
        "adapter_ms": statistics.median(ours_t) * 1e3,
        "ratio": statistics.median(ratios),
    }


def run(quick: bool) -> dict:
    out = {}
    for name, bodies in payloads(quick).items():
        engine = detect(parse(bodies[0], keep_any))
        cycle = run_cycle(bodies, rounds=3 if quick else 30)
        out[name] = {
            "engine": engine.name if engine else None,
            "bytes": len(bodies[0].encode()),
            "samples": baseline(bodies[0]),
            "adapter": adapter_ratio(bodies, rounds=3 if quick else 30),
            "cycle_ms": cycle["cycle_ms"],
            "cycle_ratio": cycle["ratio"],
        }
    return out
