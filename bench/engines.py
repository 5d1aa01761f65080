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
- ``cycle_vs_vllm``: that cycle against the simulated vLLM payload's cycle, the two alternating body by body (two
  sidecars' states, the median of per-round ratios): no engine may cost a scrape more than vLLM does, so the fan-in
  gate (measured on vLLM) holds for every engine.

``make bench-check`` gates the adapter figure (``GATES["engine_adapter_ratio"]``: the cycle goal, 0.2, with a
shared machine's margin, on payloads of 100 samples or more; ``engine_adapter_ratio_small`` below that) and
``cycle_vs_vllm`` (``GATES["engine_cycle_vs_vllm"]``). Why small payloads get their own bound: prometheus_client's
parse and kvwatch's both do per-line Python work, and a llama.cpp or Triton body has two comment lines (HELP, TYPE)
per sample, so the skip-by-regular-expression that makes vLLM's 410 samples cheap has nothing to skip (every
llama.cpp family is read): the adapter reads ~0.4x there, ~0.03 ms a scrape.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time
from pathlib import Path

from bench.cycle import Cycle, baseline
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


async def _against_vllm(bodies: list[str], vllm: list[str], rounds: int, warmup: int = 12) -> float:
    ours, theirs = Cycle(), Cycle()
    for i in range(warmup):
        await ours.run(bodies[i % len(bodies)])
        await theirs.run(vllm[i % len(vllm)])
    gc.collect()
    ratios = []
    for r in range(rounds):
        t0 = time.perf_counter()
        await ours.run(bodies[(warmup + r) % len(bodies)])
        t1 = time.perf_counter()
        await theirs.run(vllm[(warmup + r) % len(vllm)])
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ratios)


SMALL = 100  # samples: below this a body is mostly comment lines (see the module's docstring)
VLLM = "vllm (simulated)"  # the payload every engine's cycle is compared with


def run(quick: bool) -> dict:
    out: dict[str, dict] = {}
    every = payloads(quick)
    for name, bodies in every.items():
        engine = detect(parse(bodies[0], keep_any))
        cycle = run_cycle(bodies, rounds=3 if quick else 30)
        out[name] = {
            "engine": engine.name if engine else None,
            "bytes": len(bodies[0].encode()),
            "samples": baseline(bodies[0]),
            "adapter": adapter_ratio(bodies, rounds=3 if quick else 30),
            "cycle_ms": cycle["cycle_ms"],
            "cycle_ratio": cycle["ratio"],
            "cycle_vs_vllm": asyncio.run(_against_vllm(bodies, every[VLLM], rounds=3 if quick else 30)),
        }
    return out


def gate_failures(res: dict, gates: dict) -> list[str]:
    """Each engine's figures past their gates, one sentence each."""
    out = []
    for name, r in res.items():
        small = r["samples"] < SMALL
        bound = gates["engine_adapter_ratio_small" if small else "engine_adapter_ratio"]
        if not r["adapter"]["ratio"] <= bound:
            out.append(
                f"engines: {name}'s adapter/parse-baseline {r['adapter']['ratio']:.3f}, above {bound:g} "
                f"({'under' if small else 'at least'} {SMALL} samples)"
            )
        # vLLM's own row is vLLM against itself: 1 give or take the machine's noise, a figure to print, not to gate
        if name != VLLM and not r["cycle_vs_vllm"] <= gates["engine_cycle_vs_vllm"]:
            out.append(
                f"engines: {name}'s cycle {r['cycle_ms']:.2f} ms is {r['cycle_vs_vllm']:.2f}x vLLM's, above "
                f"{gates['engine_cycle_vs_vllm']:g}x"
            )
    return out
