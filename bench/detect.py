"""Detection latency: from the onset of a KV-bound state in the simulator to
``kvwatch_bottleneck{bottleneck="kv_cache"} == 1`` on a real ``kvwatch run`` process's ``/metrics``.

The simulator (kvwatch.sim.SimServer, in this process) runs the ``kv_cache`` preset behind a warm-up
phase of light traffic (same engine, one request every few seconds: no queue). Ground truth comes
from the simulated scheduler itself: the onset is the first engine step, in the kv_cache phase, that
ends with requests waiting although the batch has sequence and token-budget room -- admission stopped
by free KV blocks -- or that preempts a running request for KV. (Checked after every step through a
wrapper on the engine's step; the simulation itself is unchanged.) The wall-clock time of the onset
is the server's mapping of simulated time (start + sim_time / speed). kvwatch's ``/metrics`` is
polled every 25 ms; the latency is the first poll that shows kv_cache = 1 minus the onset, reported
in seconds and in scrape intervals. A kv_cache = 1 seen before the onset counts as a false alarm.
Trial k of n lengthens the warm-up by (k + 0.5) / n of an interval, so the onsets fall at evenly
spread points of kvwatch's scrape interval (otherwise every trial would see the same phase).
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import statistics

import aiohttp

from bench.procs import kvwatch_run
from kvwatch.catalog import Bottleneck
from kvwatch.sim import SimServer, parse_scenario

POLL = 0.025
_KV_LINE = re.compile(rf'^kvwatch_bottleneck\{{bottleneck="{Bottleneck.KV_CACHE}",[^}}]*\}} 1\.0$', re.M)


def scenario(warmup_s: float):
    """The kv_cache preset, after ``warmup_s`` simulated seconds of light traffic."""
    from importlib import resources

    doc = json.loads(resources.files("kvwatch").joinpath("scenarios/kv_cache.json").read_text())
    doc = copy.deepcopy(doc)
    doc["name"] = "bench_kv_onset"
    doc["phases"] = [
        {"name": "warmup", "duration_s": warmup_s, "workload": {"rate": 0.1, "burst": 0}},
        {"name": "kv_cache", "duration_s": None},
    ]
    return parse_scenario(doc)


def _instrument(engine, blocked: list[tuple[float, str]], phase_of) -> None:
    step_start = engine._step_start

    def watched(now: float) -> None:
        pre = engine.stats.preemptions
        step_start(now)
        cfg = engine.cfg
        tokens = sum(n for _, n in engine.in_flight or ())
        if engine.stats.preemptions > pre or (
            engine.waiting
            and len(engine.running) < cfg.max_num_seqs
            and tokens < cfg.max_num_batched_tokens
            and not engine._deferred
        ):
            blocked.append((now, phase_of()))

    engine._step_start = watched


async def _trial(seed: int, speed: float, interval: float, warmup_s: float, timeout_s: float) -> dict:
    blocked: list[tuple[float, str]] = []
    async with SimServer(scenario(warmup_s), host="127.0.0.1", port=0, seed=seed, speed=speed) as sim:
        simulator = sim.simulator
        assert simulator is not None  # SimServer makes it on entry
        for e in simulator.engines:
            _instrument(e, blocked, lambda: simulator.phase_name)
        loop = asyncio.get_running_loop()
        flags = ("--interval", str(interval))
        cm = kvwatch_run([sim.url], *flags)
        _, kv = await asyncio.to_thread(cm.__enter__)
        try:
            detected = first_alarm = None
            async with aiohttp.ClientSession() as http:
                deadline = loop.time() + warmup_s / speed + timeout_s
                while loop.time() < deadline:
                    async with http.get(kv + "/metrics") as r:
                        text = await r.text()
                    now = loop.time()
                    sim.catch_up()
                    if _KV_LINE.search(text):
                        onset = next((t for t, ph in blocked if ph == "kv_cache"), None)
                        if onset is None or now < sim._t0 + onset / speed:
                            first_alarm = first_alarm or now
                        elif detected is None:
                            detected = now
                            break
                    await asyncio.sleep(POLL)
        finally:
            await asyncio.to_thread(cm.__exit__, None, None, None)
        onset_sim = next((t for t, ph in blocked if ph == "kv_cache"), None)
        warm_blocked = sum(1 for _, ph in blocked if ph != "kv_cache")
        out = {
            "seed": seed,
            "onset_after_phase_s": None if onset_sim is None else onset_sim - warmup_s,
            "kv_blocked_steps_in_warmup": warm_blocked,
            "false_alarm": first_alarm is not None,
        }
        if onset_sim is not None and detected is not None:
            lat = detected - (sim._t0 + onset_sim / speed)
            out["latency_s"] = lat * speed  # in simulated seconds (= wall seconds at speed 1)
            out["latency_intervals"] = lat / interval
        return out


def measure(
    trials: int = 5, speed: float = 1.0, interval: float = 1.0, warmup_s: float = 20.0, timeout_s: float = 30.0
) -> dict:
    results = []
    for k in range(trials):
        # kvwatch starts a fixed time after the simulator, so its scrape schedule has a fixed phase
        # relative to the warm-up's end: move the onset by a different fraction of an interval in
        # each trial, so the trials sample where within an interval the onset falls.
        frac = (k + 0.5) / trials
        res = asyncio.run(_trial(k + 1, speed, interval, warmup_s + frac * interval * speed, timeout_s))
        res["onset_shift_intervals"] = frac
        results.append(res)
    lat = [r["latency_intervals"] for r in results if "latency_intervals" in r]
    return {
        "trials": results,
        "interval_s": interval,
        "speed": speed,
        "detected": len(lat),
        "median_intervals": statistics.median(lat) if lat else None,
        "max_intervals": max(lat) if lat else None,
        "median_s": statistics.median(r["latency_s"] for r in results if "latency_s" in r) if lat else None,
        "false_alarms": sum(r["false_alarm"] for r in results),
    }
