"""Fan-in: how many targets one ``kvwatch run`` process polls at 1 Hz on one core, on schedule.

One payload server (its own process, on the other core) serves N paths, each the real 0.32 payload
(gzip, as vLLM serves it). A real ``kvwatch run`` process, pinned to one core, polls all N at
``--interval 1``. After a warm-up, for ``seconds`` seconds the server records when each request
arrives. kvwatch schedules each target's scrapes at anchor + k x interval, so for each target:

- missed: ticks with no scrape (a gap of k intervals between two scrapes is k - 1 of them), and
  scrapes less than half an interval apart -- must be 0;
- jitter: arrival_k - (anchor + k x interval), the anchor taken as the target's least-late scrape --
  p99 must stay under 10 % and the maximum under 25 % of the interval;
- errors: kvwatch_scrape_errors_total growth over the window (timeouts) -- must be 0.

Also reported: the CPU kvwatch used (fraction of its one core), its peak RSS, the spread of the arrivals within
one interval (kvwatch spreads the targets' schedules over the interval, so ~1 s), and *targets per core*: the
scrapes the server answered per second of kvwatch's CPU time, times the interval -- how many targets one core's
CPU time covers at this interval, whatever share of the core a shared machine left kvwatch (`make bench-check`
gates it; on schedule is the quiet machine's figure).
"""

from __future__ import annotations

import json
import statistics
import time

from prometheus_client.parser import text_string_to_metric_families

from bench.procs import cpu_seconds, get, kvwatch_run, rss_kib


def _errors(kv_url: str) -> tuple[float, int]:
    total, up = 0.0, 0
    for fam in text_string_to_metric_families(get(kv_url + "/metrics").decode()):
        for s in fam.samples:
            if s.name == "kvwatch_scrape_errors_total":
                total += s.value
            elif s.name == "kvwatch_up":
                up += int(s.value)
    return total, up


def _analyse(arrivals: dict[str, list[float]], n: int, interval: float, start: float, end: float) -> dict:
    ticks = round((end - start) / interval)
    missed = doubled = 0
    jitters: list[float] = []
    for i in range(n):
        ts = sorted(t for t in arrivals.get(str(i), []) if start <= t < end)
        if not ts:
            missed += ticks
            continue
        # From one scrape to the next: one interval. A gap of k intervals is k - 1 missed ticks, a
        # gap under half an interval a doubled one (the window's edges do not count either way).
        for a, b in zip(ts, ts[1:], strict=False):
            k = round((b - a) / interval)
            missed += max(0, k - 1)
            doubled += k == 0
        ks = [round((t - ts[0]) / interval) for t in ts]
        offsets = [t - k * interval for t, k in zip(ts, ks, strict=False)]
        anchor = min(offsets)
        jitters += [o - anchor for o in offsets]
    jitters.sort()
    return {
        "missed_ticks": missed + doubled,
        "jitter_p50_ms": statistics.median(jitters) * 1e3 if jitters else None,
        "jitter_p99_ms": jitters[int(0.99 * (len(jitters) - 1))] * 1e3 if jitters else None,
        "jitter_max_ms": jitters[-1] * 1e3 if jitters else None,
        "scrapes": len(jitters),
    }


def _burst_spread(arrivals: dict[str, list[float]], interval: float) -> float | None:
    all_t = sorted(t for ts in arrivals.values() for t in ts)
    if not all_t:
        return None
    spreads = []
    t0 = all_t[0]
    bursts: dict[int, list[float]] = {}
    for t in all_t:
        bursts.setdefault(int((t - t0 + 0.5 * interval) // interval), []).append(t)
    for ts in bursts.values():
        spreads.append(max(ts) - min(ts))
    return statistics.median(spreads) * 1e3


def measure(
    server: str, n: int, seconds: float = 20.0, warmup: float = 6.0, interval: float = 1.0, cpu: int = 1
) -> dict:
    targets = [f"{server}/t/{i}/metrics" for i in range(n)]
    with kvwatch_run(targets, "--interval", str(interval), cpu=cpu) as (proc, kv):
        time.sleep(warmup)
        err0, _ = _errors(kv)
        get(server + "/stats?reset=1", timeout=60)
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        t1 = time.monotonic()
        c1 = cpu_seconds(proc.pid)
        stats = json.loads(get(server + "/stats?arrivals=1&reset=1", timeout=60))
        answered = sum(len(ts) for ts in stats["arrivals"].values())  # since the reset, as the CPU time
        err1, up = _errors(kv)
        rss, hwm = rss_kib(proc.pid)
    # Whole ticks only: leave half an interval at each edge of the window.
    res = _analyse(
        stats["arrivals"], n, interval, t0 + 0.5 * interval, t0 + 0.5 * interval + int(seconds - 1) * interval
    )
    res.update(
        targets=n,
        errors=err1 - err0,
        up=up,
        cpu_core_fraction=(c1 - c0) / (t1 - t0),
        targets_per_core=answered * interval / (c1 - c0) if c1 > c0 else None,
        burst_spread_ms=_burst_spread(stats["arrivals"], interval),
        peak_rss_mib=hwm / 1024,
    )
    res["on_schedule"] = (
        res["missed_ticks"] == 0
        and res["errors"] == 0
        and res["up"] == n
        and res["jitter_p99_ms"] is not None
        and res["jitter_p99_ms"] <= 100 * interval
        and res["jitter_max_ms"] <= 250 * interval
    )
    return res
