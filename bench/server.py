"""A local stand-in for many vLLM servers: one aiohttp process serving recorded payloads.

    python -m bench.server [--port P] [--fanin N] [--b-captures K]

Paths: ``/a/metrics`` (the real 0.32 captures in order, looping), ``/b/metrics`` (the same,
relabelled to 8 engines x 2 models), ``/t/<i>/metrics`` for i < N (the real captures, each path at
its own position), each the ``/metrics`` of a ``tests.helpers.fake_vllm.FakeVllm``. Like
prometheus_client's ASGI app that vLLM mounts, the body is gzip-compressed when the client accepts it
(compressed once per body). ``/stats`` returns, per path, the number of requests and the
``time.monotonic()`` of each arrival since the last ``/stats?reset=1``.
Prints ``listening <port>`` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from aiohttp import web

from bench.payloads import real_bodies, relabel
from tests.helpers.fake_vllm import FakeVllm


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--fanin", type=int, default=0)
    p.add_argument("--b-captures", type=int, default=48, help="how many captures to relabel for /b")
    args = p.parse_args(argv)
    real = real_bodies()
    fakes = {
        "a": FakeVllm(gzip_when_accepted=True).serve(*real),
        "b": FakeVllm(gzip_when_accepted=True).serve(*[relabel(b, 8, 2) for b in real[: args.b_captures]]),
    }
    for i in range(args.fanin):
        fakes[str(i)] = FakeVllm(gzip_when_accepted=True).serve(*real)
        fakes[str(i)].index = i % len(real)

    async def t(request):
        i = request.match_info["i"]
        if not i.isdigit() or i not in fakes:
            raise web.HTTPNotFound()
        return await fakes[i].handle(request)

    async def stats(request):
        requests = {key: f.requests for key, f in fakes.items() if f.requests}
        arrivals = {key: f.arrivals for key, f in fakes.items() if f.arrivals} if request.query.get("arrivals") else {}
        text = json.dumps({"requests": requests, "arrivals": arrivals})
        if request.query.get("reset"):
            for f in fakes.values():
                f.arrivals = []
        return web.Response(text=text, content_type="application/json")

    app = web.Application()
    app.router.add_get("/a/metrics", fakes["a"].handle)
    app.router.add_get("/b/metrics", fakes["b"].handle)
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
