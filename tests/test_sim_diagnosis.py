"""Issue 3's key test: every preset, served over HTTP by the simulator and watched by a real
``kvwatch run`` process, is diagnosed as the bottleneck it is named after within a few simulated
seconds of the state starting.

One ``kvwatch run`` process watches all presets at once (several ``--target``), polling each
simulator every second; the test reads ``/api/v1/diagnosis`` every second.  Everything runs in
real time (``--speed 1``); the tour takes 107 s per cycle, so this module takes about two minutes.
The observed timeline is printed (``pytest -s``) so a misdiagnosis shows its data.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field

import httpx
import pytest

from kvwatch.sim import SimServer
from tests.helpers.ports import free_ports
from tests.helpers.process import Process
from tests.helpers.sim_judge import CASES, MAX_GAP_INTERVALS, Poll, judge, seconds

pytestmark = pytest.mark.slow  # real time: one kvwatch process and a simulator per preset for two minutes


@dataclass
class Observation:
    polls: dict[str, list[Poll]] = field(default_factory=dict)  # what this test read from /api/v1/diagnosis
    scrapes: dict[str, list[Poll]] = field(default_factory=dict)  # kvwatch's own record: /api/v1/history
    log: str = ""
    missed_polls: int = 0  # polls of kvwatch's API that this test itself could not make


def _sim_clock(pairs: list[tuple[float, float]], speed: float):
    """Wall time -> simulated time, from (time.time(), simulator's now) pairs read together at each poll: the
    nearest pair's offset, so a wall-clock step mid-run moves only the scrapes after it."""
    walls = [w for w, _ in pairs]

    def to_sim(t: float) -> float:
        i = min(range(len(walls)), key=lambda j: abs(walls[j] - t))
        return pairs[i][1] + (t - walls[i]) * speed

    return to_sim


def kvwatch_scrapes(doc: dict, sim: SimServer, pairs: list[tuple[float, float]], speed: float) -> list[Poll]:
    """kvwatch's record of one target (its /api/v1/history engine series: one row per successful scrape, at
    the scrape's time) on the simulator's clock and phases (Simulator.phase_log: each visit's exact start)."""
    engines = doc.get("engines") or []
    if not engines or not pairs:
        return []
    series, to_sim = engines[0]["series"], _sim_clock(pairs, speed)
    visits = sim.simulator.phase_log
    out = []
    for i, t in enumerate(series["t"]):
        at = to_sim(t)
        start, phase = next(((s, n) for s, n in reversed(visits) if s <= at), visits[0])
        out.append(
            Poll(
                at,
                phase,
                start,
                series["bottleneck"][i],
                series["requests_running"][i],
                series["requests_waiting"][i],
                series["kv_cache_usage_ratio"][i],
                series["preemptions_per_second"][i],
            )
        )
    return out


# One kvwatch process per module and group: the GPU presets watch in tests/test_sim_diagnosis_gpu.py, in a process
# (and event loop) of their own, since all nineteen simulators on one loop starved it under a load of ~8 (two
# clean-clone CI runs side by side): polls came 5 s apart and kvwatch's scrapes of them timed out.
CPU_PRESETS = [p for p in CASES if not p.startswith("gpu_")]
INTERVAL = 1.0  # kvwatch's scrape interval, seconds


async def _observe(tmp_path, presets: list[str]) -> Observation:
    obs = Observation(polls={p: [] for p in presets})
    clocks: dict[str, list[tuple[float, float]]] = {p: [] for p in presets}
    sims: dict[str, SimServer] = {}
    kv = None
    log_path = tmp_path / "kvwatch.log"
    try:
        # kvwatch first (its targets refuse connections for a moment), then the simulators on the
        # ports it already polls: every state is watched from its first simulated second.
        port, *preset_ports = free_ports(len(presets) + 1)  # all different (a serial run once drew one twice)
        ports = dict(zip(presets, preset_ports, strict=True))
        args = [
            sys.executable,
            "-m",
            "kvwatch",
            "run",
            "--listen",
            f"127.0.0.1:{port}",
            "--interval",
            str(INTERVAL),
            "--log-level",
            "warning",
        ]
        for p in ports.values():
            args += ["--target", f"http://127.0.0.1:{p}/metrics"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
        kv = Process(args, log_path, env=env).start()
        base = f"http://127.0.0.1:{port}"
        # nothing else runs on this loop yet: the simulators start once kvwatch is ready
        kv.wait_for_url(base + "/readyz", timeout=30, what="kvwatch run to become ready", interval=0.2)
        async with httpx.AsyncClient(timeout=3.0) as client:
            for preset in presets:
                speed = CASES[preset][0]
                sims[preset] = await SimServer(
                    preset, host="127.0.0.1", port=ports[preset], seed=11, speed=speed
                ).start()
            t0 = time.monotonic()
            while time.monotonic() - t0 < max(seconds(p) for p in presets):
                await asyncio.sleep(1.0)
                elapsed = time.monotonic() - t0
                try:
                    doc = (await client.get(base + "/api/v1/diagnosis")).json()
                except httpx.TransportError:
                    # A machine starved this test's own poll (three CI runs side by side: ConnectTimeout to
                    # kvwatch); the next second polls again, and a visit with too few polls is not judged.
                    obs.missed_polls += 1
                    continue
                by_target = {t["target"]: t for t in doc.get("targets", [doc])}
                for preset, sim in sims.items():
                    if elapsed > seconds(preset):
                        continue
                    t = by_target.get(sim.url)
                    if t is None:
                        continue
                    st = sim.simulator
                    sim.catch_up()
                    clocks[preset].append((time.time(), st.now))
                    eng = (t.get("engines") or [{}])[0]
                    sig = eng.get("signals") or {}
                    obs.polls[preset].append(
                        Poll(
                            st.now,
                            st.phase_name,
                            st.phase_start,
                            t["bottleneck"],
                            sig.get("requests_running"),
                            sig.get("requests_waiting"),
                            sig.get("kv_cache_usage_ratio"),
                            sig.get("preemptions_per_second"),
                            sig.get("engine_step_tokens"),
                        )
                    )
            history = await _history(client, base, max(seconds(p) for p in presets) + 60)
            for preset, sim in sims.items():
                sim.catch_up()
                doc = next((t for t in history["targets"] if t["target"] == sim.url), {})
                obs.scrapes[preset] = kvwatch_scrapes(doc, sim, clocks[preset], CASES[preset][0])
    finally:
        if kv is not None:
            kv.stop()
        for s in sims.values():
            await s.stop()
        obs.log = log_path.read_text(errors="replace") if log_path.exists() else ""
    return obs


async def _history(client: httpx.AsyncClient, base: str, seconds: float) -> dict:
    """kvwatch's /api/v1/history, read once at the end: a starved machine gets several tries."""
    for attempt in range(5):
        try:
            r = await client.get(base + "/api/v1/history", params={"seconds": seconds}, timeout=10.0)
            r.raise_for_status()
            return r.json()
        except httpx.TransportError:
            if attempt == 4:
                raise
            await asyncio.sleep(1.0)
    raise AssertionError("unreachable")


def observe_and_print(tmp_path_factory, presets: list[str]) -> Observation:
    obs = asyncio.run(_observe(tmp_path_factory.mktemp("diag"), presets))
    print(f"\npolls of kvwatch's API this test could not make: {obs.missed_polls}")
    print(
        "kvwatch's diagnosis of each preset (simulated time, phase, bottleneck, running, waiting, KV, "
        "preemptions/s, tokens/step):"
    )
    for preset, polls in obs.scrapes.items():
        print(f"== {preset} ({len(obs.polls[preset])} polls of the API; kvwatch's successful scrapes:)")
        for p in polls:
            f = lambda v, fmt: "-" if v is None else format(v, fmt)  # noqa: E731
            print(
                f"  t={p.sim_time:6.1f} {p.phase:13s} {p.bottleneck:13s} run={f(p.running, '.0f'):>3s} "
                f"wait={f(p.waiting, '.0f'):>3s} kv={f(p.kv, '.2f')} pre/s={f(p.preempt, '.1f')} "
                f"tok/step={f(p.step_tokens, '.0f')}"
            )
    return obs


@pytest.fixture(scope="module")
def observation(tmp_path_factory) -> Observation:
    return observe_and_print(tmp_path_factory, CPU_PRESETS)


def assert_named(observation: Observation, preset: str) -> None:
    """Judged on kvwatch's own record of its scrapes (judge's ``interval``): the lag in its successful scrapes, not
    in the seconds a starved machine took (two CI runs side by side: this test's polls 5 s apart, kvwatch's
    scrapes timing out). The API must have answered for the preset, and at least one of its visits must have been
    scraped densely enough to judge: a kvwatch that thins out its scrapes of some targets leaves their visits
    unjudged, and that fails here, with each visit's widest gap between kvwatch's scrapes and the machine's load
    (a visit too sparsely scraped beside a judged one is only reported)."""
    speed, expected = CASES[preset]
    assert observation.polls[preset], f"no diagnosis for {preset}; kvwatch log:\n{observation.log[-3000:]}"
    scrapes = observation.scrapes[preset]
    assert scrapes, f"no successful scrape of {preset} in kvwatch's history; kvwatch log:\n{observation.log[-3000:]}"
    out = judge(preset, scrapes, speed, expected, interval=INTERVAL)
    assert out.judged + len(out.unjudged) >= len(expected), f"{preset}: only {out.judged} phase visits long enough"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    assert out.judged, (
        f"{preset}: no visit judged, kvwatch's successful scrapes too far apart (over "
        f"{MAX_GAP_INTERVALS} intervals) in every one: {out.unjudged}; load average {load}"
    )
    if out.unjudged:
        print(f"{preset}: {out.judged} visit(s) judged; not judged: {out.unjudged}")


@pytest.mark.parametrize("preset", CPU_PRESETS)
def test_preset_is_diagnosed_as_named(observation, preset):
    assert_named(observation, preset)
