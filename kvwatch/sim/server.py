"""Serve a running simulation over HTTP, driven in real time (aiohttp)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from aiohttp import web

from . import exposition_trtllm
from .exposition import CONTENT_TYPE, normalize_version, process_start_time, render
from .expositions import by_name
from .scenario import Scenario, load_scenario
from .simulator import Simulator
from .vllm_log import LogWriter

__all__ = ["SimServer"]

log = logging.getLogger("kvwatch.sim")

VLLM_VERSION = "0.32.0"


class SimServer:
    """The simulator behind a vLLM-compatible HTTP server.

    ``scenario`` is a preset name, a :class:`Scenario`, or ``None`` with ``scenario_file``.
    Simulated time runs ``speed`` times faster than the wall clock; a background task steps the
    model every ``tick`` seconds and every ``/metrics`` request first catches up to "now".

    ``engine`` (kvwatch.sim.expositions): the engine whose metrics it serves, ``vllm`` (default), ``sglang``,
    ``trtllm`` (at ``/prometheus/metrics``; ``/metrics`` is JSON iteration stats, as trtllm-serve's) or ``llamacpp``
    (with ``/slots``, llama-server's per-slot JSON).

    Endpoints: ``/metrics`` (the engine's exposition; gzip if asked), ``/health`` (200, always — also
    when stalled, like vLLM), ``/version``, ``/v1/models``, ``/sim/state`` (JSON: phase, simulated
    time, per-engine running/waiting/KV), ``/`` (a short text page).
    """

    def __init__(
        self,
        scenario: str | Scenario | None = "tour",
        host: str = "127.0.0.1",
        port: int = 0,
        seed: int = 0,
        speed: float = 1.0,
        engines: int | None = None,
        metrics_version: str = "0.32",
        scenario_file: str | Path | None = None,
        tick: float = 0.05,
        on_phase: Callable[[str, float], None] | None = None,
        log_stream: TextIO | None = None,
        engine: str = "vllm",
    ):
        if scenario_file is not None:
            sc = load_scenario(path=scenario_file)
        elif isinstance(scenario, Scenario):
            sc = scenario
        else:
            sc = load_scenario(scenario or "tour")
        if engines is not None:
            sc = sc.with_engines(engines)
        if not speed > 0:
            raise ValueError("speed: must be > 0")
        self.exposition = by_name(engine)  # the engine whose /metrics it speaks (kvwatch.sim.expositions)
        self.metrics_version = normalize_version(metrics_version)
        if self.metrics_version == "v0" and sc.engines != 1:
            raise ValueError("metrics-version v0: the V0 engine has no data parallelism (use --engines 1)")
        if self.exposition.one_engine and sc.engines != 1:
            raise ValueError(f"engine {engine}: {self.exposition.one_engine} (use --engines 1)")
        self.scenario = sc
        self.host = host
        self.port = port
        self.seed = seed
        self.speed = float(speed)
        self.tick = tick
        self.on_phase = on_phase
        self.log_stream = log_stream  # vLLM's own server log lines go here (kvwatch.sim.vllm_log)
        self._log: LogWriter | None = None
        self.simulator: Simulator | None = None
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task | None = None
        self._t0 = 0.0
        self._phase_seen = -1
        self._cycle_seen = 0
        self._process_start = process_start_time()
        self.scrapes = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> SimServer:
        loop = asyncio.get_running_loop()
        self.simulator = Simulator(self.scenario, seed=self.seed, wall_start=time.time())
        self._t0 = loop.time()
        if self.log_stream is not None:
            self._log = LogWriter(self.simulator)
            self._write_log(self._log.startup())
        app = web.Application()
        app.router.add_get(self.exposition.metrics_path, self._metrics)
        if self.exposition.name == "trtllm":  # trtllm-serve's /metrics is JSON iteration stats
            app.router.add_get("/metrics", self._iteration_stats)
        if self.exposition.extra_path:  # llama-server's per-slot JSON, /slots
            app.router.add_get(self.exposition.extra_path, self._extra)
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/sim/state", self._state)
        app.router.add_get("/", self._index)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._task = asyncio.create_task(self._drive(), name="kvwatch-sim-drive")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> SimServer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    # ------------------------------------------------------------------ state

    @property
    def base_url(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The bound metrics URL (``/metrics``; trtllm-serve's ``/prometheus/metrics``)."""
        return self.base_url + self.exposition.metrics_path

    @property
    def phase(self) -> str:
        """Name of the current scenario phase (after catching up to now)."""
        self.catch_up()
        return self.simulator.phase_name  # type: ignore[union-attr]

    @property
    def sim_time(self) -> float:
        """Simulated seconds since start (after catching up to now)."""
        self.catch_up()
        return self.simulator.now  # type: ignore[union-attr]

    def state(self) -> dict:
        self.catch_up()
        d = self.simulator.summary()  # type: ignore[union-attr]
        d["speed"] = self.speed
        d["metrics_version"] = self.metrics_version
        d["engine_type"] = self.exposition.name
        return d

    def target_time(self) -> float:
        return (asyncio.get_running_loop().time() - self._t0) * self.speed

    def catch_up(self) -> None:
        sim = self.simulator
        if sim is None:
            raise RuntimeError("SimServer is not started")
        try:
            target = self.target_time()
        except RuntimeError:  # no running loop (called from a plain thread): leave it where it is
            return
        if target > sim.now:
            sim.advance_to(target)
        self._note_phase()

    def _write_log(self, lines: list[str]) -> None:
        if lines and self.log_stream is not None:
            self.log_stream.write("".join(line + "\n" for line in lines))
            self.log_stream.flush()

    def _note_phase(self) -> None:
        sim = self.simulator
        if sim is None:
            return
        if self._log is not None:
            self._write_log(self._log.lines())
        if sim.phase_index != self._phase_seen or sim.cycle != self._cycle_seen:
            self._phase_seen = sim.phase_index
            self._cycle_seen = sim.cycle
            log.info("phase %s at t=%.1fs (simulated)", sim.phase_name, sim.now)
            if self.on_phase is not None:
                self.on_phase(sim.phase_name, sim.now)

    async def _drive(self) -> None:
        sim = self.simulator
        assert sim is not None
        while True:
            await asyncio.sleep(self.tick)
            target = self.target_time()
            # Step in slices of at most 0.25 simulated seconds so a high --speed cannot starve the
            # event loop (scrapes are served between slices).
            while sim.now < target:
                sim.advance_to(min(target, sim.now + 0.25))
                self._note_phase()
                if sim.now < target:
                    await asyncio.sleep(0)
                    target = self.target_time()

    # ------------------------------------------------------------------ handlers

    async def _metrics(self, request: web.Request) -> web.Response:
        self.catch_up()
        self.scrapes += 1
        if self.exposition.name == "vllm":
            body = render(self.simulator, self.metrics_version, process_start=self._process_start).encode()
        else:
            body = self.exposition.render(self.simulator).encode()
        headers = {"Content-Type": CONTENT_TYPE}
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, headers=headers)

    async def _iteration_stats(self, request: web.Request) -> web.Response:
        self.catch_up()
        return web.json_response(exposition_trtllm.iteration_stats(self.simulator))

    async def _extra(self, request: web.Request) -> web.Response:
        self.catch_up()
        assert self.exposition.render_extra is not None
        return web.Response(body=self.exposition.render_extra(self.simulator), content_type="application/json")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def _models(self, request: web.Request) -> web.Response:
        sim = self.simulator
        assert sim is not None
        model = sim.engines[0].cfg.model_name
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": model,
                        "object": "model",
                        "created": int(sim.wall_start),
                        "owned_by": "vllm",
                        "root": model,
                        "parent": None,
                        "max_model_len": sim.engines[0].cfg.max_model_len,
                    }
                ],
            }
        )

    async def _state(self, request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(self.state()), content_type="application/json")

    def _speaks(self) -> str:
        return f"vLLM {VLLM_VERSION}" if self.exposition.name == "vllm" else self.exposition.title

    def _metrics_line(self) -> str:
        if self.exposition.name == "vllm":
            return f"vLLM's Prometheus metrics (format {self.metrics_version})"
        return f"{self.exposition.title}'s Prometheus metrics"

    async def _index(self, request: web.Request) -> web.Response:
        sim = self.simulator
        assert sim is not None
        text = (
            f"kvwatch sim: a simulated {self._speaks()} server\n"
            f"scenario {self.scenario.name}, phase {self.phase}, seed {self.seed}, speed {self.speed:g}\n"
            f"  {self.exposition.metrics_path}    {self._metrics_line()}\n"
            f"  /sim/state  the simulation state as JSON\n"
            f"  /health     200\n"
        )
        return web.Response(text=text)
