"""``FakeLlamaCpp``: ``FakeVllm`` (tests/helpers/fake_vllm.py) serving a real llama.cpp capture's ``/metrics`` and its
``/slots``, with faults injected on ``/slots`` alone::

    async with FakeLlamaCpp() as llama:          # in the running event loop (or ``with``: a thread of its own)
        llama.serve_capture("context_too_small") # tests/fixtures/engines/llamacpp/captures/<folder>, in order, looping
        llama.url                                # "http://127.0.0.1:PORT/metrics"; /slots beside it
        llama.slots_mode = "status"              # a fault on /slots, see below; /metrics goes on serving

``/slots`` answers the body recorded with the ``/metrics`` body served last (``<t>.slots.json``), so the two agree as
on the real server. ``slots_mode``: ``ok``; ``status`` (501 and llama.cpp's own ``not_supported_error`` body, a server
started without ``--slots``); ``slow`` (the body after ``slots_delay`` s); ``garbage`` (binary bytes); ``html`` (a
login page); ``huge`` (a 20 MB JSON list); ``bomb`` (256 MiB of zeros in ~250 KiB of gzip); ``wrong_types`` (JSON of
another shape: numbers as strings, an object for the list); ``deep`` (a list nested 100,000 deep); ``huge_numbers``
(integers of thousands of digits). ``slots_requests`` counts its requests, ``slots_queries`` their query strings.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from kvwatch.recording import read_recorded
from tests.helpers.fake_vllm import FakeVllm, bomb
from tests.helpers.recordings import recording

__all__ = ["CAPTURES", "FakeLlamaCpp", "NOT_SUPPORTED"]

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "llamacpp" / "captures"
# llama-server's answer to GET /slots without --slots (server-context.cpp, get_slots; format_error_response)
NOT_SUPPORTED = {
    "error": {
        "code": 501,
        "message": "This server does not support slots endpoint. Start it with `--slots`",
        "type": "not_supported_error",
    }
}


class FakeLlamaCpp(FakeVllm):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.slots_bodies: list[bytes | None] = []
        self.slots_mode = "ok"
        self.slots_delay = 30.0
        self.slots_requests = 0
        self.slots_queries: list[str] = []  # each /slots request's query string
        self._last = 0  # the index of the /metrics body served last

    def serve_capture(self, folder: str, loop: bool = True) -> FakeLlamaCpp:
        recorded = [read_recorded(p) for _, p in recording(CAPTURES / folder)]
        self.serve(*(body for body, _ in recorded), loop=loop)
        self.slots_bodies = [slots for _, slots in recorded]
        return self

    def next_body(self) -> str:
        self._last = min(self.index, len(self.bodies) - 1)
        return super().next_body()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/slots", self.handle_slots)

    async def handle_slots(self, request: web.Request) -> web.StreamResponse:
        self.slots_requests += 1
        self.slots_queries.append(request.query_string)
        mode = self.slots_mode
        if mode == "status":
            return web.json_response(NOT_SUPPORTED, status=501)
        if mode == "slow":
            await asyncio.sleep(self.slots_delay)
        if mode == "garbage":
            return web.Response(body=b"\x00\xff\xfe{[not json\n")
        if mode == "html":
            return web.Response(text="<html><body>Sign in</body></html>\n", content_type="text/html")
        if mode == "huge":
            return web.Response(body=b"[" + b"0," * 10_000_000 + b"0]", content_type="application/json")
        if mode == "bomb":
            return web.Response(body=bomb(), headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
        if mode == "wrong_types":
            wrong = {"slots": [{"id": "0", "n_ctx": "256", "is_processing": "yes", "n_prompt_tokens": 1.5}]}
            return web.json_response(wrong)
        if mode == "deep":
            return web.Response(body=b"[" * 100_000 + b"]" * 100_000, content_type="application/json")
        if mode == "huge_numbers":
            slot = '{"id": 0, "n_ctx": 256, "is_processing": true, "id_task": 1, "n_prompt_tokens": %s}' % ("9" * 4000)
            return web.Response(text=f"[{slot}]", content_type="application/json")
        body = self.slots_bodies[self._last] if self.slots_bodies else None
        if body is None:
            return web.json_response(NOT_SUPPORTED, status=501)
        return web.Response(body=body, content_type="application/json")
