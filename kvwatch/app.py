"""The sidecar: one scrape loop per target, and the aiohttp server that exposes the result.

Each target is polled on a fixed schedule (missed ticks are skipped, never bunched). After every
scrape, success or not, the target's diagnosis is recomputed and cached: ``/metrics`` and
``/api/v1/diagnosis`` only read the cache, so a Prometheus scrape costs rendering, not analysis.
Large bodies are parsed in a worker thread so one huge target cannot freeze the others' schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry
from prometheus_client.aiohttp import make_aiohttp_handler

from kvwatch import __version__
from kvwatch.catalog import Bottleneck, most_severe
from kvwatch.config import Settings
from kvwatch.export import KvwatchCollector
from kvwatch.page import add_page_routes
from kvwatch.parse import ParseError, parse
from kvwatch.scrape import FetchConfig, Fetcher, ScrapeError
from kvwatch.state import NoEngineMetrics, Target
from kvwatch.webconfig import WebConfigWatcher

__all__ = ["LISTEN_BACKLOG", "Monitor", "make_app", "make_runner", "serve"]

log = logging.getLogger("kvwatch")
OFF_LOOP_BYTES = 256 * 1024  # parse bodies larger than this in a thread

# kvwatch's own port, under abuse (README "Faults"; bench/abuse.py). Our clients are Prometheus, a browser on
# the status page and probes: short URLs, a few headers, one request at a time each. aiohttp answers a longer
# request line or header 400 and reads no further (its parser raises LineTooLong / BadHttpMessage).
MAX_REQUEST_LINE_BYTES = 4096  # our longest URL is /api/v1/history?seconds=N (aiohttp's default: 8190)
MAX_HEADER_BYTES = 8190  # one header line: a browser's cookies for the host can be long (aiohttp's default)
MAX_HEADERS = 64  # header lines per request (aiohttp's default: 128)
MAX_BODY_BYTES = 64 * 1024  # every route is a GET; aiohttp's default lets a request carry 1 MiB
# A connection must deliver a complete request head within this, from accept or from the last response:
# aiohttp's keep-alive timer runs from connection_made and only a parsed request stops it, so a client
# trickling header bytes is dropped at 10 s (aiohttp's default waits 3630 s). Prometheus reconnects at 15 s.
REQUEST_DEADLINE_SECONDS = 10.0
# Connections served at once; past this, a new one gets 503 and is closed unread. Prometheus uses one, a
# status page a few: 128 is far above need and bounds what 1,000 hostile clients cost (memory, fds).
MAX_CONNECTIONS = 128
LISTEN_BACKLOG = 32  # accepted-not-yet-served connections the kernel queues; the rest are refused
# aiohttp logs each malformed request with a traceback: 1,000 oversized requests would be 1,000 tracebacks.
# A client's error is answered 400 and is no news to us; a handler's own exception is still logged.
http_log = logging.getLogger("kvwatch.http")
http_log.addFilter(lambda record: not (record.exc_info and isinstance(record.exc_info[1], HttpProcessingError)))
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 31\r\n"
    b"Retry-After: 1\r\nConnection: close\r\n\r\nkvwatch: too many connections\r\n"
)


class Monitor:
    """All targets' state; the scrape loops write it, the web handlers read it."""

    def __init__(self, settings: Settings, clock=time.time):
        self.settings = settings
        self.clock = clock
        self.targets = {url: Target.from_settings(url, settings) for url in settings.target}  # by URL; labels redacted
        self.fetcher: Fetcher | None = None
        self._tasks: list[asyncio.Task] = []
        self.scrapes = 0  # completed scrape attempts, all targets (tests and the demo wait on it)

    def open(self) -> None:
        """Ready to scrape (``scrape_once``) without starting the loops."""
        s = self.settings
        self.fetcher = Fetcher(
            FetchConfig(s.scrape_timeout, s.max_body_bytes, s.bearer_token_file, s.tls_verify),
            user_agent=f"kvwatch/{__version__}",
        )

    async def start(self) -> None:
        self.open()
        targets = self.settings.target
        for i, t in enumerate(targets):
            # Spread the targets' schedules over the interval: N targets ticking together would
            # queue up behind each other every second (see _loop).
            offset = self.settings.interval * i / len(targets)
            self._tasks.append(asyncio.create_task(self._loop(t, offset), name=f"scrape {t}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.fetcher is not None:
            await self.fetcher.aclose()

    async def _loop(self, target: str, offset: float = 0.0) -> None:
        """Scrape ``target`` now, then at start + offset + k x interval (k >= 1).

        Every target is scraped at once on start; from the second scrape on, target i of N runs
        ``i / N`` of an interval after target 0, so one process polling hundreds of targets does
        a steady trickle of scrapes instead of a burst each tick (bench/fanin.py measures it).
        The gap between a target's first two scrapes is one to two intervals.
        """
        interval = self.settings.interval
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + offset
        while True:
            try:
                await self.scrape_once(target)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not end the loop: log it and keep scraping
                label = self.targets[target].target
                log.exception("unexpected error scraping %s", label, extra={"target": label})
            next_tick += interval
            now = loop.time()
            if next_tick < now:  # overran: skip the missed ticks instead of bunching them
                next_tick += ((now - next_tick) // interval + 1) * interval
            await asyncio.sleep(next_tick - now)

    async def scrape_once(self, target: str) -> None:
        state = self.targets[target]
        was_up, last_reason = state.up, state.last_reason
        started = time.perf_counter()
        t = self.clock()
        assert self.fetcher is not None  # open() sets it before any scrape
        try:
            body = await self.fetcher.fetch(target)
            try:
                if len(body) > OFF_LOOP_BYTES:
                    families = await asyncio.to_thread(parse, body, state.keep_family)
                else:
                    families = parse(body, state.keep_family)
            except ParseError as e:
                raise ScrapeError("parse", str(e)) from None
            extra = await self._read_extra(state, families, started)
            try:
                state.observe(t, families, body, extra)
            except NoEngineMetrics as e:
                raise ScrapeError("no_vllm_metrics", str(e)) from None
        except ScrapeError as e:
            state.errors[e.reason] += 1
            state.observe_failure(t, str(e), e.reason)
            # Once per change of state (up -> down, or another reason), never once per scrape: a target that
            # never answers is in the log from its first failure (a wrong KVWATCH_TARGET shows in kubectl logs).
            if was_up or e.reason != last_reason:
                log.warning("scrape of %s failed (%s): %s", state.target, e.reason, e, extra={"target": state.target})
        else:
            if not was_up:
                log.info("scraping %s", state.target, extra={"target": state.target})
        state.scrape_duration_seconds = time.perf_counter() - started
        state.diagnosis = state.diagnose(self.clock())
        state.history.record(state.diagnosis)
        self.scrapes += 1

    async def _read_extra(self, state: Target, families, started: float) -> object | None:
        """The engine's extra path (llama.cpp's /slots), read after its metrics within what is left of the scrape's
        deadline while the engine serves (Target.serving), as its adapter parses it; None when it has none, the engine
        is idle, or it failed, was slow or unreadable: then the snapshot lacks what it adds, and the log says why once
        per change (the scrape itself has succeeded)."""
        engine = state.engine_for(families)
        if engine is None or engine.extra is None or not state.serving(engine, families):
            return None
        url, path = engine.extra_url(state.url), engine.extra.path
        assert self.fetcher is not None
        if url is None:
            why = f"path: the target's path does not end in {engine.metrics_path}, so where {path} is is not known"
        else:
            try:
                data = await self.fetcher.fetch_extra(url, self.fetcher.cfg.timeout - (time.perf_counter() - started))
            except ScrapeError as e:
                hint = f"; {engine.extra.enable}" if e.reason == "http_status" and engine.extra.enable else ""
                why = f"{e.reason}: {e.detail}{hint}"
            else:
                parse = engine.extra.parse
                parsed = await asyncio.to_thread(parse, data) if len(data) > OFF_LOOP_BYTES else parse(data)
                if parsed is not None:
                    if state.extra_error is not None:
                        log.info("reading %s of %s again", path, state.target, extra={"target": state.target})
                    state.extra_error = None
                    return parsed
                why = f"unreadable: not {engine.title}'s {path}"
        if state.extra_error is None or why.split(":")[0] != state.extra_error.split(":")[0]:
            log.warning(
                "not reading %s of %s (%s): what it shows is not judged",
                path,
                state.target,
                why,
                extra={"target": state.target},
            )
        state.extra_error = why
        return None

    def diagnosis_json(self) -> dict:
        docs = []
        for t in self.settings.target:
            d = self.targets[t].diagnosis
            label = self.targets[t].target
            docs.append(
                d.as_dict()
                if d
                else {
                    "timestamp": None,
                    "target": label,
                    "up": False,
                    "bottleneck": Bottleneck.UNREACHABLE,
                    "engines": [],
                }
            )
        if len(docs) == 1:
            return docs[0]
        return {"timestamp": self.clock(), "bottleneck": most_severe([d["bottleneck"] for d in docs]), "targets": docs}


MONITOR = web.AppKey("monitor", Monitor)


def make_app(monitor: Monitor, web_config: WebConfigWatcher | None = None) -> web.Application:
    """The sidecar's routes; with ``web_config``, its basic auth (every route but the probes) and headers."""
    registry = CollectorRegistry(auto_describe=False)
    # collect() runs in the event loop (make_aiohttp_handler renders in the handler), so all_tasks() sees it.
    registry.register(KvwatchCollector(lambda: monitor.targets.values(), lambda: len(asyncio.all_tasks())))

    @web.middleware
    async def server_header(request, handler):
        resp = await handler(request)
        resp.headers["Server"] = f"kvwatch/{__version__}"
        return resp

    middlewares = [server_header, *([web_config.middleware] if web_config else [])]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[MONITOR] = monitor
    if web_config is not None:
        app.on_response_prepare.append(web_config.add_headers)

    async def diagnosis(_):
        return web.Response(text=json.dumps(monitor.diagnosis_json(), indent=1), content_type="application/json")

    async def ok(_):
        # Readiness means "kvwatch serves", never "vLLM is up": a loading model must not pull the pod.
        return web.Response(text="ok\n")

    add_page_routes(app, monitor)  # /, /static/*, /api/v1/history: the status page
    app.router.add_get("/metrics", make_aiohttp_handler(registry))
    app.router.add_get("/api/v1/diagnosis", diagnosis)
    app.router.add_get("/healthz", ok)
    app.router.add_get("/readyz", ok)

    async def lifecycle(app):
        await monitor.start()
        yield
        await monitor.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


class _Busy(asyncio.Protocol):
    """A connection past MAX_CONNECTIONS: 503 and close, without reading the request."""

    def connection_made(self, transport) -> None:
        transport.write(_BUSY)
        transport.close()


class _CappedRunner(web.AppRunner):
    """An AppRunner whose sites hand a new connection to aiohttp only while fewer than MAX_CONNECTIONS are open."""

    @property
    def server(self):
        handlers = super().server
        if handlers is None:
            return None

        def protocol():
            return _Busy() if len(handlers.connections) >= MAX_CONNECTIONS else handlers()

        return protocol


def make_runner(app: web.Application) -> web.AppRunner:
    """The runner every kvwatch server uses (``serve``, ``kvwatch demo``): the port's limits above."""
    return _CappedRunner(
        app,
        access_log=None,
        logger=http_log,
        keepalive_timeout=REQUEST_DEADLINE_SECONDS,
        max_line_size=MAX_REQUEST_LINE_BYTES,
        max_field_size=MAX_HEADER_BYTES,
        max_headers=MAX_HEADERS,
    )


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Run the sidecar until ``stop`` is set (or forever). A bad ``--web-config-file`` raises ``ConfigError``
    before anything listens."""
    web_config = WebConfigWatcher(settings.web_config_file) if settings.web_config_file else None
    monitor = Monitor(settings)
    runner = make_runner(make_app(monitor, web_config))
    await runner.setup()
    ssl_context = web_config.ssl_context if web_config else None
    site = web.TCPSite(
        runner, settings.listen_host, settings.listen_port, ssl_context=ssl_context, backlog=LISTEN_BACKLOG
    )
    await site.start()
    watching = ", ".join(t.target for t in monitor.targets.values())
    scheme = "https" if ssl_context else "http"
    log.info("kvwatch %s listening on %s://%s, watching %s", __version__, scheme, settings.listen, watching)
    async with web_config.running() if web_config else contextlib.nullcontext():
        try:
            await (stop.wait() if stop else asyncio.Event().wait())
        finally:
            await runner.cleanup()
