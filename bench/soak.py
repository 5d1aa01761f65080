"""Soak: a real ``kvwatch run`` scrapes the simulator's ``tour`` at ``hz`` for ``minutes``; does anything grow?

    python -m bench soak --minutes 30 --hz 10     # the issue's figure (bench/RESULTS.md)

The simulator (``kvwatch.sim.SimServer``, ``tour``: healthy, KV-bound, recovery, max_num_seqs, token budget,
looping) runs in a thread of this process and records when each ``/metrics`` request arrives; kvwatch is its
own process (``python -m kvwatch run --interval 1/hz``). Every ``sample_s`` seconds we read kvwatch's RSS
(VmRSS) and open file descriptors from /proc, and its ``/metrics`` (as Prometheus would), whose
``kvwatch_asyncio_tasks`` counts the event loop's tasks. Reported:

- RSS slope (MiB/h, least squares) over the second half: the first half holds the start-up and the status
  page's history filling (``--history`` 900 s, allocated once, but first touched as it fills);
- fds and tasks: their range over the second half (flat = a range of a few: requests in flight);
- lateness: each scrape's arrival minus kvwatch's schedule (anchor + k x interval; ``lateness`` says how the
  anchor is found), p50 / p99 / max, per tenth of the run, and ticks without a scrape.

``leaks(result)`` names what grew; tests/test_soak.py runs a minute of this and proves it bites on a kvwatch
patched to leak one task per scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from bench.procs import get, kvwatch_run, open_fds, rss_kib
from kvwatch.sim import SimServer
from kvwatch.window import _slope  # the least-squares slope kvwatch's KV trend uses

# Flat means: over the second half, fds and tasks move by at most this many (a request or two in flight,
# a discarded client closing after a timeout). A leak of one per scrape moves them by thousands.
FLAT_RANGE = 8
# The leak check's RSS bound: 1 MiB a minute. The shipped kvwatch reads ~14 MiB/h over the second half of a minute at
# 10 Hz (the status page's history still being touched as it fills; ~0.01-0.3 MiB/h over 30 minutes), and a leak of
# 3 MiB a minute (180 MiB/h) reads ~196 MiB/h: tests/test_soak.py proves the bound catches it (512, the old bound,
# let it through).
RSS_SLOPE_BOUND_MIB_PER_H = 60.0


@contextlib.contextmanager
def simulator(scenario: str = "tour", speed: float = 1.0):
    """A SimServer in a thread of its own; yields (server, the monotonic arrival time of each /metrics request)."""
    loop = asyncio.new_event_loop()
    sim = SimServer(scenario, speed=speed)
    arrivals: list[float] = []
    serve_metrics = sim._metrics

    async def metrics(request):
        arrivals.append(time.monotonic())  # list.append is atomic: the main thread reads it
        return await serve_metrics(request)

    sim._metrics = metrics  # type: ignore[method-assign]  # start() routes /metrics to the instance attribute
    thread = threading.Thread(target=loop.run_forever, name="soak-sim", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(sim.start(), loop).result(30)
        yield sim, arrivals
    finally:
        asyncio.run_coroutine_threadsafe(sim.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def own_metrics(kv_url: str) -> dict[str, float]:
    """kvwatch's own /metrics: the task count and the scrape errors (all targets, all reasons)."""
    out = {"tasks": math.nan, "errors": 0.0}
    for fam in text_string_to_metric_families(get(kv_url + "/metrics").decode()):
        for s in fam.samples:
            if s.name == "kvwatch_asyncio_tasks":
                out["tasks"] = s.value
            elif s.name == "kvwatch_scrape_errors_total":
                out["errors"] += s.value
    return out


def lateness(arrivals: list[float], interval: float, bins: int = 1000) -> tuple[list[float], int]:
    """(lateness of each scrape in s, ticks without a scrape). kvwatch ticks at anchor + k x interval and skips a
    missed tick, so a scrape's lateness is its arrival's phase past the anchor, in [0, interval): one later than
    an interval shows as a missed tick. The anchor is the phase (to interval / ``bins``) that minimises the mean
    lateness: the leading edge of the on-time mass. (The least-late scrape is no anchor here: a scrape late by
    most of an interval looks early for the next tick, and would shift every lateness by the rest.)"""
    if not arrivals:
        return [], 0
    t0 = arrivals[0]
    counts = [0] * bins
    for t in arrivals:
        counts[int((t - t0) % interval / interval * bins) % bins] += 1
    used = [(b, c) for b, c in enumerate(counts) if c]
    anchor_bin = min(used, key=lambda bc: sum(c * ((b - bc[0]) % bins) for b, c in used))[0]
    anchor = t0 + anchor_bin * interval / bins
    ks = [math.floor((t - anchor) / interval) for t in arrivals]
    missed = sum(max(0, b - a - 1) for a, b in zip(ks, ks[1:], strict=False))
    return [t - anchor - k * interval for t, k in zip(arrivals, ks, strict=False)], missed


def quantiles_ms(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    s = sorted(xs)
    return {"p50_ms": statistics.median(s) * 1e3, "p99_ms": s[int(0.99 * (len(s) - 1))] * 1e3, "max_ms": s[-1] * 1e3}


def _sample(proc_pid: int, kv: str, started: float) -> dict:
    m = own_metrics(kv)
    return {"t": time.monotonic() - started, "rss_kib": rss_kib(proc_pid)[0], "fds": open_fds(proc_pid), **m}


def measure(
    minutes: float, hz: float, sample_s: float = 5.0, entry: tuple[str, ...] = ("-m", "kvwatch"), log=None
) -> dict:
    interval = 1.0 / hz
    seconds = minutes * 60.0
    samples: list[dict] = []
    with simulator() as (sim, arrivals):
        with kvwatch_run([sim.url], "--interval", f"{interval:g}", entry=entry) as (proc, kv):
            started = time.monotonic()
            next_sample = started
            while (now := time.monotonic()) < started + seconds:
                if now >= next_sample:
                    samples.append(_sample(proc.pid, kv, started))
                    next_sample += sample_s
                    if log and len(samples) % 60 == 0:
                        log(f"soak: {samples[-1]['t'] / 60:.0f} min, RSS {samples[-1]['rss_kib'] / 1024:.1f} MiB")
                time.sleep(min(0.5, max(0.0, next_sample - time.monotonic())))
            samples.append(_sample(proc.pid, kv, started))
            seen = [t for t in arrivals if t >= started]
    return summarize(samples, seen, interval, seconds)


def summarize(samples: list[dict], arrivals: list[float], interval: float, seconds: float) -> dict:
    second = [s for s in samples if s["t"] >= seconds / 2]
    slope = _slope([s["t"] for s in second], [s["rss_kib"] for s in second])
    late, missed = lateness(arrivals, interval)
    tenths = []
    if arrivals:
        t0 = arrivals[0]
        for i in range(10):
            part = [x for t, x in zip(arrivals, late, strict=False) if i / 10 <= (t - t0) / seconds < (i + 1) / 10]
            tenths.append(quantiles_ms(part))

    def rng(key: str) -> float:
        vals = [s[key] for s in second if not math.isnan(s[key])]
        return max(vals) - min(vals) if vals else math.nan

    return {
        "minutes": seconds / 60,
        "hz": 1 / interval,
        "scrapes": len(arrivals),
        "expected_scrapes": int(seconds / interval),
        "missed_ticks": missed,
        "scrape_errors": samples[-1]["errors"] - samples[0]["errors"],
        "rss_start_mib": samples[0]["rss_kib"] / 1024,
        "rss_half_mib": second[0]["rss_kib"] / 1024,
        "rss_end_mib": samples[-1]["rss_kib"] / 1024,
        "rss_peak_mib": max(s["rss_kib"] for s in samples) / 1024,
        "rss_slope_mib_per_h": None if slope is None else slope / 1024 * 3600,
        "fds": [samples[0]["fds"], samples[-1]["fds"]],
        "fds_range_second_half": rng("fds"),
        "tasks": [samples[0]["tasks"], samples[-1]["tasks"]],
        "tasks_range_second_half": rng("tasks"),
        "lateness": quantiles_ms(late),
        "lateness_by_tenth": tenths,
        "samples": samples,
    }


def leaks(r: dict) -> list[str]:
    """What grew, as short sentences; empty when fds and tasks stayed flat and RSS under its bound."""
    out = []
    for key in ("fds", "tasks"):
        span = r[f"{key}_range_second_half"]
        if not span <= FLAT_RANGE:  # NaN (never read) fails too
            out.append(f"{key} moved by {span:g} over the second half (flat: <= {FLAT_RANGE})")
    slope = r["rss_slope_mib_per_h"]
    if slope is None or slope > RSS_SLOPE_BOUND_MIB_PER_H:
        out.append(f"RSS slope {slope} MiB/h (bound {RSS_SLOPE_BOUND_MIB_PER_H:g})")
    return out


def table(r: dict) -> str:
    late = r["lateness"]
    lines = [
        f"soak: kvwatch run on the simulator's tour, {r['minutes']:g} min at {r['hz']:g} Hz: {r['scrapes']} scrapes "
        f"({r['expected_scrapes']} ticks), {r['missed_ticks']} ticks missed, {r['scrape_errors']:.0f} failed scrapes",
        f"RSS {r['rss_start_mib']:.1f} MiB at start, {r['rss_half_mib']:.1f} at half way, {r['rss_end_mib']:.1f} at the "
        f"end (peak {r['rss_peak_mib']:.1f}); slope over the second half **{_f(r['rss_slope_mib_per_h'])} MiB/h** "
        "(goal < 1)",
        f"open fds {r['fds'][0]} -> {r['fds'][1]} (range over the second half {r['fds_range_second_half']:g}); asyncio "
        f"tasks {r['tasks'][0]:g} -> {r['tasks'][1]:g} (range {r['tasks_range_second_half']:g})",
        f"scrape lateness p50 {_f(late['p50_ms'])} ms, p99 {_f(late['p99_ms'])} ms, max {_f(late['max_ms'])} ms",
        "",
        "| tenth of the run | lateness p50 ms | p99 ms | max ms |",
        "|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {i + 1} | {_f(q['p50_ms'])} | {_f(q['p99_ms'])} | {_f(q['max_ms'])} |"
        for i, q in enumerate(r["lateness_by_tenth"])
    ]
    found = leaks(r)
    lines += ["", "leak check: " + ("; ".join(found) if found else "nothing grew")]
    return "\n".join(lines)


def _f(x, nd: int = 2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"
