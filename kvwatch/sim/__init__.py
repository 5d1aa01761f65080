"""The built-in vLLM simulator: a discrete-time model of vLLM's V1 scheduler behind vLLM's /metrics, or behind
SGLang's, trtllm-serve's, Triton's TensorRT-LLM backend's or llama.cpp's (``--engine``; kvwatch.sim.expositions).

Command line (the lead's ``kvwatch/cli.py`` dispatches ``kvwatch sim ...`` here)::

    kvwatch sim --scenario NAME [--port P] [--host H] [--seed S] [--speed X] [--engines N]
                [--engine {vllm,sglang,trtllm,triton-trtllm,llamacpp}]
                [--metrics-version {0.32,0.10,v0}] [--scenario-file F] [--duration S]

    from kvwatch.sim.cli import main
    main(["--scenario", "kv_cache", "--port", "0"])      # -> exit status

In-process, for ``kvwatch demo`` and the tests (inside a running asyncio loop)::

    from kvwatch.sim import SimServer

    async with SimServer("kv_cache", host="127.0.0.1", port=0, seed=1, speed=1.0) as sim:
        sim.url          # "http://127.0.0.1:PORT/metrics" -- the bound /metrics URL
        sim.base_url     # "http://127.0.0.1:PORT"  (also /health, /version, /sim/state)
        sim.phase        # name of the current scenario phase, e.g. "kv_cache"
        sim.sim_time     # simulated seconds since start
        sim.state()      # dict: phase, sim_time_s, per-engine running/waiting/kv_cache_usage/...
        sim.simulator    # the Simulator itself (engines, stats)

``SimServer(scenario="tour" | Scenario, host, port=0, seed=0, speed=1.0, engines=None,
metrics_version="0.32", scenario_file=None, on_phase=callback(name, sim_time), engine="vllm")`` — ``start()`` /
``stop()`` work too.  ``GET /sim/state`` returns the same JSON as ``state()`` over HTTP, so a
separate process can follow the phases.

Without a server (pure simulation, exact and fast)::

    from kvwatch.sim import Simulator, load_scenario, render
    sim = Simulator(load_scenario("kv_cache"), seed=1)
    sim.advance_to(10.0)                 # ten simulated seconds
    text = render(sim, "0.32")           # the /metrics body at that instant
    from kvwatch.sim.expositions import EXPOSITIONS
    text = EXPOSITIONS["sglang"].render(sim)  # the same instant as SGLang's /metrics

Scenarios are JSON data (``kvwatch/scenarios/*.json``; format in :mod:`kvwatch.sim.scenario`):
``idle``, ``healthy``, ``kv_cache``, ``max_num_seqs``, ``token_budget``, ``stalled``, ``asleep``, ``max_loras``,
``kv_transfer`` and ``tour``
(the default; loops healthy -> kv_cache -> recovery -> max_num_seqs -> token_budget).
The kv_cache / max_num_seqs / token_budget presets use the flags of the real vLLM 0.32 captures in
tests/fixtures/vllm-0.32.0-cpu, and the step-time model is fitted to them.

The model (:mod:`kvwatch.sim.engine`) and what it leaves out: see that module's docstring.
"""

from .exposition import METRICS_VERSIONS, render
from .scenario import Scenario, ScenarioError, list_presets, load_scenario, parse_scenario
from .server import SimServer
from .simulator import Simulator

__all__ = [
    "METRICS_VERSIONS",
    "Scenario",
    "ScenarioError",
    "SimServer",
    "Simulator",
    "list_presets",
    "load_scenario",
    "parse_scenario",
    "render",
]
