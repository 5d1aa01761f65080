"""A local stand-in for many vLLM servers: one aiohttp process serving recorded payloads.

    python -m bench.server [--port P] [--fanin N] [--b-captures K]

Paths: ``/a/metrics`` (the real 0.32 captures in order, looping), ``/b/metrics`` (the same,
relabelled to 8 engines x 2 models), ``/t/<i>/metrics`` for i < N (the real captures, each path at
its own position). Like prometheus_client's ASGI app that vLLM mounts, the body is gzip-compressed
when the client accepts it (compressed once, up front). ``/stats`` returns, per path, the number of
requests and the ``time.monotonic()`` of each arrival since the last ``/stats?reset=1``.
Prints ``listening <port>`` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
import time

from aiohttp import web

from bench.payloads import real_bodies, relabel


def _variants(bodies: list[str]) -> list[tuple[bytes, bytes]]:
    return [(b.encode(), gzip.compress(b.encode(), compresslevel=6)) for b in bodies]


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fanin", type=int, default=0)
    p.add_argument("--b-captures", type=int, default=48, help="how many captures to relabel for /b")
    args = p.parse_args(argv)
    real = real_bodies()
    payloads = {"a": _variants(real), "b": _variants([relabel(b, 8, 2) for b in real[: args.b_captures]])}
    counters: dict[str, int] = {}
    arrivals: dict[str, list[float]] = {}

    def serve(kind: str, key: str, request: web.Request) -> web.Response:
        now = time.monotonic()
        n = counters.get(key, 0)
        counters[key] = n + 1
        arrivals.setdefault(key, []).append(now)
        bodies = payloads[kind]
        plain, packed = bodies[(n + (int(key) if kind == "t" else 0)) % len(bodies)]
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            headers["Content-Encoding"] = "gzip"
            return web.Response(body=packed, headers=headers)
        return web.Response(body=plain, headers=headers)

    payloads["t"] = payloads["a"]

    async def a(request):
        return serve("a", "a", request)

    async def b(request):
        return serve("b", "b", request)

    async def t(request):
        i = request.match_info["i"]
        if not i.isdigit() or int(i) >= args.fanin:
            raise web.HTTPNotFound()
        return serve("t", i, request)

    async def stats(request):
        text = json.dumps({"requests": counters, "arrivals": arrivals if request.query.get("arrivals") else {}})
        if request.query.get("reset"):
            arrivals.clear()
        return web.Response(text=text, content_type="application/json")

    app = web.Application()
    app.router.add_get("/a/metrics", a)
    app.router.add_get("/b/metrics", b)
    app.router.add_get("/t/{i}/metrics", t)
    app.router.add_get("/stats", stats)

    async def run():
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=4096)
        await site.start()
        port = runner.addresses[0][1]
        print(f"listening {port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
