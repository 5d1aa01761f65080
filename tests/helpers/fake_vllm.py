"""``FakeVllm``: a fake vLLM ``/metrics`` on loopback (aiohttp), for replaying real captures and injecting faults.

The real-vLLM proof lives in tests/e2e; this fake exists for what a real server will not do on demand (hang,
truncate, gzip-bomb, restart mid-run) and for serving recordings to kvwatch and Prometheus. One body a
request::

    async with FakeVllm() as vllm:               # in the running event loop, on a free port
        vllm.url                                 # "http://127.0.0.1:PORT/metrics" (vllm.base_url without the path)
        vllm.serve_dir("kv_cache")               # the captures of tests/fixtures/vllm-0.32.0-cpu/kv_cache, in order,
        vllm.index = 12                          # looping; from the 13th on
        vllm.serve(body_a, body_b, loop=False)   # these, then the last one for ever
        vllm.mode = "slow"                       # a fault, see below
        await vllm.stop(); await vllm.start()    # down (connection refused), then back on the same port

or a recording in real time (``replay``)::

    with FakeVllm().replay(recording(FIXTURES / "kv_cache", start=..., end=...)) as vllm:  # in a thread of its own
        vllm.replay(idle)                        # another recording from now on; counters continue

Which snapshot ``replay`` serves depends only on the wall clock (the recorded spacing between the files'
times, scaled by ``speed``), so every scraper sees the same stream. When the sequence wraps, each counter /
histogram ``_bucket``/``_sum``/``_count`` / summary ``_sum``/``_count`` sample is offset by its increase over
the recording, and on a switch by the value it had reached, so ``rate()`` and kvwatch see a steady,
never-resetting server - as a vLLM under constant load would look. Gauges are served as recorded.

``mode``: ``ok`` (the body; gzipped when the client accepts it if ``gzip_when_accepted``, as vLLM's
prometheus_client app does), ``status`` (``status``, default 500), ``slow`` (the body after ``delay`` s),
``drip`` (headers at once, then 200 bytes over ``delay`` seconds), ``trickle`` (headers at once, then 1 byte/s for
``delay`` s), ``endless`` (a chunked body of valid metric lines that never ends, a line every 10 ms), ``flood`` (the
same, 64 KiB chunks as fast as the socket takes them), ``redirect`` (302 to ``redirect_to``, a URL with
credentials), ``login`` (a 200 text/html login page), ``truncate``, ``garbage``, ``html`` (an HTML page served as
text/plain), ``gzip`` (always), ``bomb`` (256 MiB of zeros in ~250 KiB of gzip), ``huge`` (20 MB of comment lines),
``metadata_only``.
Every request is counted: ``requests``, ``arrivals`` (``time.monotonic()``), ``auth_headers``.
``handle`` is the ``/metrics`` handler, for an app serving several fakes (bench/server.py).
"""

from __future__ import annotations

import asyncio
import bisect
import functools
import gzip
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from tests.helpers.ports import HOST
from tests.helpers.recordings import captures

__all__ = ["FakeVllm", "bomb"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client's, as vLLM 0.32 serves it
# vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1): OpenMetrics whatever the Accept header (gpustack/gpustack#6215)
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
_TYPE_RE = re.compile(r"^# TYPE (\S+) (\S+)")


class FakeVllm:
    def __init__(
        self, *, host: str = HOST, port: int = 0, gzip_when_accepted: bool = False, content_type: str = CONTENT_TYPE
    ):
        self.host = host
        self.content_type = content_type  # sent whatever the request's Accept says, as both vLLM frontends do
        self.port = port
        self.gzip_when_accepted = gzip_when_accepted
        self.bodies: list[str] = []
        self.index = 0
        self.loop_bodies = True
        self.mode = "ok"
        self.status = 500
        self.delay = 5.0
        self.redirect_to = "http://admin:hunter2@sso.example/login?token=abc&next=/metrics"
        self.requests = 0
        self.arrivals: list[float] = []
        self.auth_headers: list[str | None] = []
        self._replay: _Replay | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # with-statement use: the thread's loop
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return self.base_url + "/metrics"

    # -- what it serves ----------------------------------------------------------------------------
    def serve(self, *bodies: str, loop: bool = True) -> FakeVllm:
        """These bodies, one a request, in order; then again (``loop``) or the last one for ever."""
        self.bodies, self.index, self.loop_bodies, self._replay = list(bodies), 0, loop, None
        if self.gzip_when_accepted:
            for body in self.bodies:
                _gzip(body)  # compressed once, up front: a scrape never waits for it
        return self

    def serve_dir(self, scenario: str, loop: bool = True) -> FakeVllm:
        """The real captures of ``tests/fixtures/vllm-0.32.0-cpu/<scenario>``, in time order."""
        return self.serve(*captures(scenario), loop=loop)

    def replay(self, files: Sequence[tuple[float, Path]], speed: float = 1.0) -> FakeVllm:
        """A recording (``tests.helpers.recordings.recording``) in real time; while one plays, switch to
        ``files`` now, every monotonic sample continuing from the value it had reached (see module doc)."""
        if self._replay is None:
            self._replay = _Replay(files, speed)
        else:
            self._replay.switch(files)
        return self

    def next_body(self) -> str:
        if self._replay is not None:
            return self._replay.render()
        body = self.bodies[min(self.index, len(self.bodies) - 1)]
        self.index += 1
        if self.loop_bodies and self.index >= len(self.bodies):
            self.index = 0
        return body

    # -- the /metrics handler ------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.arrivals.append(time.monotonic())
        self.auth_headers.append(request.headers.get("Authorization"))
        mode = self.mode
        if mode == "status":
            return web.Response(status=self.status, text="boom")
        if mode == "slow":
            await asyncio.sleep(self.delay)
            return self._ok(request)
        if mode == "drip":  # headers at once, then a byte at a time: only an overall deadline catches it
            resp = web.StreamResponse()
            await resp.prepare(request)
            for ch in self.next_body()[:200]:  # 200 bytes over ``delay`` seconds
                await resp.write(ch.encode())
                await asyncio.sleep(self.delay / 200)
            return resp
        if mode in ("trickle", "endless", "flood"):
            return await self._stream(request, mode)
        if mode == "redirect":
            return web.Response(status=302, headers={"Location": self.redirect_to})
        if mode == "login":
            # Not starting with a tag: the Content-Type is what names it (docs/faults.md).
            page = "Sign in to continue\n<form action=/login><input name=password></form>\n"
            return web.Response(text=page, content_type="text/html")
        if mode == "truncate":
            body = self.next_body()
            return web.Response(text=body[: len(body) // 2 + 7], headers={"Content-Type": self.content_type})
        if mode == "garbage":
            return web.Response(body=b"\x00\xff<html>not metrics</html>\n{\n")
        if mode == "html":
            return web.Response(text="<html><body>It works!</body></html>\n")
        if mode == "gzip":
            return web.Response(body=_gzip(self.next_body()), headers={"Content-Encoding": "gzip"})
        if mode == "bomb":  # 256 MiB of zeros in ~250 KiB of gzip
            return web.Response(body=bomb(), headers={"Content-Encoding": "gzip"})
        if mode == "huge":
            return web.Response(text="# a\n" * 5_000_000)
        if mode == "metadata_only":
            return web.Response(text="# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n")
        return self._ok(request)

    async def _stream(self, request: web.Request, mode: str) -> web.StreamResponse:
        """Headers at once, then a body that trickles (1 byte/s for ``delay`` s) or never ends (chunked)."""
        resp = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if mode == "trickle":
            for ch in self.next_body()[: max(1, int(self.delay))]:
                await resp.write(ch.encode())
                await asyncio.sleep(1.0)
            return resp
        line = b'vllm:num_requests_running{engine="0",model_name="endless"} 1.0\n'
        chunk, pause = (line * (65536 // len(line)), 0.0) if mode == "flood" else (line, 0.01)
        while True:  # until the client goes away: aiohttp then fails the write
            await resp.write(chunk)
            await asyncio.sleep(pause)

    def _ok(self, request: web.Request) -> web.Response:
        body = self.next_body()
        if self.gzip_when_accepted and "gzip" in request.headers.get("Accept-Encoding", ""):
            headers = {"Content-Type": self.content_type, "Content-Encoding": "gzip"}
            return web.Response(body=_gzip(body), headers=headers)
        return web.Response(body=_encoded(body), headers={"Content-Type": self.content_type})

    # -- in the running event loop ---------------------------------------------------------------------
    async def start(self) -> FakeVllm:
        """Listen (again, on the same port after a ``stop``)."""
        app = web.Application()
        app.router.add_get("/metrics", self.handle)
        self.add_routes(app)
        # Going down cancels a handler still sleeping in "slow" mode (its client gave up long ago) instead of
        # waiting out the delay: a test's teardown no longer sits through the rest of those 5 s.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        return self

    def add_routes(self, app: web.Application) -> None:
        """More paths beside /metrics (a subclass's: tests/helpers/fake_llamacpp.py's /slots)."""

    async def stop(self) -> None:
        """Go down (connection refused) without forgetting the port, so ``start()`` can come back."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeVllm:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- in a thread of its own, for synchronous tests ---------------------------------------------------
    def __enter__(self) -> FakeVllm:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-vllm", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        loop, thread = self._loop, self._thread
        assert loop is not None and thread is not None
        asyncio.run_coroutine_threadsafe(self.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        self._loop = self._thread = None


@functools.lru_cache(maxsize=1024)
def _encoded(body: str) -> bytes:
    return body.encode()


@functools.lru_cache(maxsize=1024)
def _gzip(body: str) -> bytes:
    return gzip.compress(body.encode(), compresslevel=6)


@functools.lru_cache(maxsize=1)
def bomb() -> bytes:
    """256 MiB of zeros, gzipped (built once: compressing it takes a while)."""
    return gzip.compress(b"\0" * (256 << 20), compresslevel=6)


# -- a recording in real time -------------------------------------------------------------------------------


class _Snapshot:
    """One exposition body split into lines; ``values`` maps each monotonic sample's key to its value."""

    def __init__(self, text: str):
        types: dict[str, str] = {}
        for line in text.splitlines():
            m = _TYPE_RE.match(line)
            if m:
                types[m.group(1)] = m.group(2)
        self.lines: list[tuple[str, str | None]] = []  # (line, key if monotonic)
        self.values: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                self.lines.append((line, None))
                continue
            key, _, raw = line.rpartition(" ")
            name = key.split("{", 1)[0]
            if _monotonic(name, types):
                self.values[key] = float(raw)
                self.lines.append((line, key))
            else:
                self.lines.append((line, None))

    def render(self, offsets: dict[str, float]) -> str:
        out = []
        for line, key in self.lines:
            if key is not None and offsets.get(key):
                out.append(f"{key} {self.values[key] + offsets[key]!r}")
            else:
                out.append(line)
        return "\n".join(out) + "\n"


def _monotonic(name: str, types: dict[str, str]) -> bool:
    if types.get(name) == "counter":
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            family = name[: -len(suffix)]
            if types.get(family) in ("histogram", "summary") and not (
                suffix == "_bucket" and types.get(family) == "summary"
            ):
                return True
    return False


class _Phase:
    def __init__(self, files: Sequence[tuple[float, Path]], speed: float):
        if not files:
            raise ValueError("no snapshot files")
        self.snaps = [_Snapshot(Path(f).read_text()) for _, f in files]
        times = [t for t, _ in files]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)] or [1.0]
        gaps.append(sorted(gaps)[len(gaps) // 2])  # the last snapshot is held for a median gap
        self.starts = [0.0]
        for g in gaps[:-1]:
            self.starts.append(self.starts[-1] + g / speed)
        self.period = self.starts[-1] + gaps[-1] / speed
        first, last = self.snaps[0].values, self.snaps[-1].values
        self.increase = {k: last.get(k, v) - v for k, v in first.items()}


class _Replay:
    """The snapshot due now (see the module doc); thread-safe: the server may run in a thread of its own."""

    def __init__(self, files: Sequence[tuple[float, Path]], speed: float):
        self.speed = speed
        self._lock = threading.Lock()
        self._phase = _Phase(files, speed)
        self._t0 = time.monotonic()
        self._base: dict[str, float] = {}

    def _position(self, now: float) -> tuple[int, int]:
        ph = self._phase
        elapsed = max(0.0, now - self._t0)
        wrap, within = divmod(elapsed, ph.period)
        return int(wrap), bisect.bisect_right(ph.starts, within) - 1

    def _offsets(self, wrap: int) -> dict[str, float]:
        inc = self._phase.increase
        keys = set(self._base) | set(inc)
        return {k: self._base.get(k, 0.0) + wrap * inc.get(k, 0.0) for k in keys}

    def render(self) -> str:
        with self._lock:
            wrap, idx = self._position(time.monotonic())
            return self._phase.snaps[idx].render(self._offsets(wrap))

    def switch(self, files: Sequence[tuple[float, Path]]) -> None:
        new = _Phase(files, self.speed)
        with self._lock:
            wrap, idx = self._position(time.monotonic())
            offsets = self._offsets(wrap)
            reached = {k: v + offsets.get(k, 0.0) for k, v in self._phase.snaps[idx].values.items()}
            # may be negative: new values = reached + (value - first value), never below what was served
            self._base = {k: reached[k] - v for k, v in new.snaps[0].values.items() if k in reached}
            self._phase = new
            self._t0 = time.monotonic()
