"""Memory: peak RSS of a real ``kvwatch run`` process after N scrape cycles, and the RSS slope over
the second half of the run.

One ``kvwatch run`` process polls two targets on the local payload server: (a) the real 0.32
payload and (b) the 8 engines x 2 models payload (both gzip, captures in order, looping). To reach
10,000 cycles in minutes it runs with a short interval (``--interval 0.03 --timeout 0.025
--window 0.06``): the window then keeps (window + 1 s) / interval = ~35 points per engine, about three
times what the default ``--interval 1 --window 10`` keeps, so the figure errs high. ``--history`` is 900
intervals (27 s), so the status page's rings hold the 901 rows a ring holds at the defaults (``--history 900
--interval 1``): the default 900 s at 0.03 s would allocate 30,001 rows a ring, ~45 MiB for (b)'s 16 engines,
which no default run holds (the peak read 107 MiB with it, under load 7-11). kvwatch's own
``/metrics`` is fetched once a second meanwhile, as Prometheus would. A cycle is one request the
server answered; the run ends when both targets have had ``cycles`` of them (the two polls are
spread apart, so either may be one behind at any instant); RSS (VmRSS) is sampled twice a second from
/proc, the peak is the kernel's VmHWM.
"""

from __future__ import annotations

import json
import time

from bench.procs import get, kvwatch_run, payload_server, rss_kib
from kvwatch.window import _slope  # the least-squares slope kvwatch's KV trend uses

HISTORY_INTERVALS = 900  # the default --history (900 s) over the default --interval (1 s): rows a ring holds


def measure(cycles: int = 10_000, interval: float = 0.03, timeout: float = 0.025, window: float = 0.06) -> dict:
    samples: list[tuple[int, int, int]] = []  # (cycles b, cycles a, rss KiB)
    with payload_server() as srv:
        targets = [srv + "/a/metrics", srv + "/b/metrics"]
        flags = (
            "--interval",
            str(interval),
            "--timeout",
            str(timeout),
            "--window",
            str(window),
            "--history",
            f"{HISTORY_INTERVALS * interval:g}",
        )
        with kvwatch_run(targets, *flags) as (proc, kv):
            started = time.monotonic()
            last_scrape = 0.0
            done, progressed = 0, started  # cycles both targets have had; when that last grew
            while True:
                req = json.loads(get(srv + "/stats"))["requests"]
                a, b = req.get("a", 0), req.get("b", 0)
                if min(a, b) > done:
                    done, progressed = min(a, b), time.monotonic()
                elif time.monotonic() - progressed > 30:  # a target no longer scraped: report, never hang
                    raise RuntimeError(f"no scrape progress for 30 s at {a} cycles of (a), {b} of (b)")
                rss, hwm = rss_kib(proc.pid)
                samples.append((b, a, rss))
                if done >= cycles:  # both targets, not whichever happens to lead
                    break
                now = time.monotonic()
                if now - last_scrape >= 1.0:
                    get(kv + "/metrics")
                    last_scrape = now
                time.sleep(0.5)
            errors = sum(
                float(line.rsplit(" ", 1)[1])
                for line in get(kv + "/metrics").decode().splitlines()
                if line.startswith("kvwatch_scrape_errors_total{")
            )
            rss, hwm = rss_kib(proc.pid)
            elapsed = time.monotonic() - started
    half = [(c, r) for c, _, r in samples if c >= cycles / 2]
    slope = _slope([c for c, _ in half], [r for _, r in half])
    first_half_end = min(half, key=lambda x: x[0])[1] if half else None
    return {
        "cycles_b": samples[-1][0],
        "cycles_a": samples[-1][1],
        "seconds": elapsed,
        "interval_s": interval,
        "scrape_errors": errors,
        "peak_rss_mib": hwm / 1024,
        "final_rss_mib": rss / 1024,
        "rss_at_half_mib": None if first_half_end is None else first_half_end / 1024,
        "slope_kib_per_1000_cycles": None if slope is None else slope * 1000,
        "growth_second_half_mib": None if first_half_end is None else (samples[-1][2] - first_half_end) / 1024,
    }
