"""A fake vLLM ``/metrics`` on loopback, for replaying real captures and injecting faults.

The real-vLLM proof lives in tests/e2e; this fake exists for what a real server will not do on
demand (hang, truncate, gzip-bomb, restart mid-run).

    async with Upstream() as up:
        up.serve_dir(FIXTURES / "kv_cache")   # replay captures in order, one per request
        up.mode = "slow"                      # or: ok, down(500), truncate, garbage, gzip, bomb, huge, ...
"""

from __future__ import annotations

import asyncio
import gzip

from aiohttp import web

from tests.helpers.ports import free_port
from tests.helpers.recordings import captures

class Upstream:
    def __init__(self):
        self.bodies: list[str] = []
        self.index = 0
        self.loop_bodies = True
        self.mode = "ok"
        self.status = 500
        self.delay = 5.0
        self.requests = 0
        self.auth_headers: list[str | None] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def serve_dir(self, scenario: str, loop: bool = True) -> None:
        self.bodies, self.index, self.loop_bodies = captures(scenario), 0, loop

    def serve(self, *bodies: str, loop: bool = True) -> None:
        self.bodies, self.index, self.loop_bodies = list(bodies), 0, loop

    def next_body(self) -> str:
        body = self.bodies[min(self.index, len(self.bodies) - 1)]
        self.index += 1
        if self.loop_bodies and self.index >= len(self.bodies):
            self.index = 0
        return body

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        self.auth_headers.append(request.headers.get("Authorization"))
        mode = self.mode
        if mode == "status":
            return web.Response(status=self.status, text="boom")
        if mode == "slow":
            await asyncio.sleep(self.delay)
            return web.Response(text=self.next_body())
        if mode == "drip":  # headers at once, then a byte at a time: only an overall deadline catches it
            resp = web.StreamResponse()
            await resp.prepare(request)
            for ch in self.next_body()[:200]:
                await resp.write(ch.encode())
                await asyncio.sleep(0.05)
            return resp
        if mode == "truncate":
            body = self.next_body()
            return web.Response(text=body[: len(body) // 2 + 7])
        if mode == "garbage":
            return web.Response(body=b"\x00\xff<html>not metrics</html>\n{\n")
        if mode == "html":
            return web.Response(text="<html><body>It works!</body></html>\n")
        if mode == "gzip":
            return web.Response(body=gzip.compress(self.next_body().encode()), headers={"Content-Encoding": "gzip"})
        if mode == "bomb":  # 256 MiB of zeros in ~250 KiB of gzip
            return web.Response(body=_BOMB(), headers={"Content-Encoding": "gzip"})
        if mode == "huge":
            return web.Response(text="# a\n" * 5_000_000)
        if mode == "metadata_only":
            return web.Response(text="# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n")
        return web.Response(text=self.next_body(), content_type="text/plain")

    async def __aenter__(self) -> "Upstream":
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self.port = self.port or free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def stop(self) -> None:
        """Go down (connection refused) without forgetting the port, so start() can come back."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def start(self) -> None:
        await self.__aenter__()

    async def __aexit__(self, *exc) -> None:
        await self.stop()


_bomb_cache: list[bytes] = []


def _BOMB() -> bytes:
    if not _bomb_cache:
        _bomb_cache.append(gzip.compress(b"\0" * (256 << 20), compresslevel=6))
    return _bomb_cache[0]
