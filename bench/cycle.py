"""cycle / parse-baseline: kvwatch's whole per-scrape work against prometheus_client's parse alone.

One cycle is what the sidecar does for one scrape of one target, through the product's own code:
``Monitor.scrape_once`` (parse with the family filter — in a worker thread above 256 KiB, as in
production — normalize, window update, diagnosis) followed by kvwatch's own ``/metrics`` handler
answering a Prometheus scrape (content negotiation and body; the HTTP transport and gzip excluded). Only the HTTP fetch is replaced by a stub
that hands over the bytes, since the baseline does not fetch either. The clock is simulated: one
scrape per second, so the window holds what it holds at ``--interval 1``.

The baseline is ``prometheus_client.parser.text_string_to_metric_families`` on the same body, run to
completion. Baseline and cycle alternate body by body, and the ratio is taken per round (so a burst
of load from other processes hits both sides of one ratio); the figure is the median over rounds.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import time

from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.app import Monitor
from kvwatch.config import load_settings
from kvwatch.export import KvwatchCollector
from kvwatch.scrape import FetchConfig, ScrapeError

TARGET = "http://127.0.0.1:1/metrics"
# What a Prometheus 3 server sends (scrape_protocols default): it gets OpenMetrics 1.0.0.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,"
    "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)


class _Clock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class _StubFetcher:
    def __init__(self):
        self.body = ""
        self.cfg = FetchConfig(timeout=0.8, max_body_bytes=16 << 20)  # the defaults at --interval 1

    async def fetch(self, url: str) -> str:
        return self.body

    async def fetch_extra(self, url: str, timeout: float) -> bytes:
        # An engine's second path (llama.cpp's /slots) is not what the parse baseline measures: answered as by a
        # server that does not serve it, so the cycle is the metrics' alone (the log says so once).
        raise ScrapeError("http_status", "HTTP 501 (bench: not served)")

    async def aclose(self) -> None:
        pass


def baseline(body: str) -> int:
    n = 0
    for fam in text_string_to_metric_families(body):
        n += len(fam.samples)
    return n


class Cycle:
    """One target's sidecar state, driven one scrape at a time."""

    def __init__(self, interval: float = 1.0, window: float = 10.0):
        self.clock = _Clock()
        self.interval = interval
        settings = load_settings(target=[TARGET], interval=interval, window=window)
        self.monitor = Monitor(settings, clock=self.clock)
        self.fetcher = _StubFetcher()
        self.monitor.fetcher = self.fetcher  # type: ignore[assignment]  # the fetch is the one thing stubbed
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(KvwatchCollector(lambda: self.monitor.targets.values()))
        self.handler = make_aiohttp_handler(self.registry)
        self.request = make_mocked_request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
        self.rendered = b""

    async def run(self, body: str) -> None:
        self.clock.t += self.interval
        self.fetcher.body = body
        await self.monitor.scrape_once(TARGET)
        self.rendered = (await self.handler(self.request)).body  # type: ignore[attr-defined]  # a web.Response
        status = self.monitor.targets[TARGET]
        if not status.up:
            raise RuntimeError(f"bench: kvwatch refused the payload: {status.last_error}")


async def measure(bodies: list[str], rounds: int, warmup: int = 12) -> dict:
    """Median ratio over ``rounds`` (body i = bodies[i % len]), after ``warmup`` unmeasured cycles."""
    cyc = Cycle()
    for i in range(warmup):
        await cyc.run(bodies[i % len(bodies)])
    base_t, cyc_t, ratios = [], [], []
    gc.collect()
    for r in range(rounds):
        body = bodies[(warmup + r) % len(bodies)]
        t0 = time.perf_counter()
        baseline(body)
        t1 = time.perf_counter()
        await cyc.run(body)
        t2 = time.perf_counter()
        base_t.append(t1 - t0)
        cyc_t.append(t2 - t1)
        ratios.append((t2 - t1) / (t1 - t0))
    diag = cyc.monitor.targets[TARGET].diagnosis
    assert diag is not None  # the cycle ran: every scrape sets a diagnosis
    return {
        "rounds": rounds,
        "bytes": len(bodies[0].encode()),
        "samples": baseline(bodies[0]),
        "engines": len(diag.engines),
        "bottleneck": diag.bottleneck,
        "baseline_ms": statistics.median(base_t) * 1e3,
        "cycle_ms": statistics.median(cyc_t) * 1e3,
        "ratio": statistics.median(ratios),
        "ratio_p90": statistics.quantiles(ratios, n=10)[-1] if len(ratios) >= 2 else ratios[0],
        "rendered_bytes": len(cyc.rendered),
    }


def run(bodies: list[str], rounds: int, warmup: int = 12) -> dict:
    return asyncio.run(measure(bodies, rounds, warmup))
