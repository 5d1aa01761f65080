"""The discrete-event simulation: clients, the data-parallel load balancer, engines and phases.

Time is simulated seconds since the start.  :meth:`Simulator.advance_to` processes every event up
to a target time in time order (phase switches, then arrivals, then engine step starts/ends), so
the result depends only on the scenario and the seed — never on how often or in what chunks it is
advanced.  All randomness comes from ``random.Random`` instances seeded from ``seed``.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque

from ._hist import HTTP_BUCKETS, HTTP_HIGHR_BUCKETS, Hist
from .engine import Engine, Request
from .scenario import Phase, Scenario

__all__ = ["Simulator"]

INF = math.inf


class HttpStats:
    """What prometheus-fastapi-instrumentator would have counted for /v1/completions."""

    def __init__(self, created: float):
        self.created = created
        self.requests = 0
        self.request_bytes = 0
        self.handler_created: float | None = None  # virtual time of the first completed request
        self.h_highr = Hist(HTTP_HIGHR_BUCKETS, created)
        self.h_duration = Hist(HTTP_BUCKETS, created)


class Simulator:
    """A vLLM server (one API server, ``engines`` data-parallel engine cores) and its clients.

    >>> sim = Simulator(load_scenario("kv_cache"), seed=1)
    >>> sim.advance_to(10.0)          # ten simulated seconds
    >>> sim.engines[0].stats.running  # as /metrics would show it now
    """

    def __init__(self, scenario: Scenario, seed: int = 0, engines: int | None = None, wall_start: float | None = None):
        if engines is not None:
            scenario = scenario.with_engines(engines)
        self.scenario = scenario
        self.seed = seed
        self.wall_start = time.time() if wall_start is None else wall_start
        self.rng = random.Random(f"kvwatch-sim/{seed}/workload")
        self.now = 0.0
        self.engines = [
            Engine(
                i,
                scenario.phases[0].engine,
                random.Random(f"kvwatch-sim/{seed}/engine/{i}"),
                self.wall_start,
                on_finish=self._on_finish,
                on_lora=self._on_lora,
            )
            for i in range(scenario.engines)
        ]
        self.http = HttpStats(self.wall_start)
        self.lora_info: dict[tuple[str, str], float] = {}  # (running, waiting) -> last set (virtual time)
        self.next_rid = 0
        self.dropped = 0  # arrivals the clients did not send (max_outstanding)
        self.rejected: dict[str, int] = {}  # reason -> requests the frontend refused with 503 (admission caps)
        self.outstanding = 0
        self.phase_index = -1
        self.phase: Phase = scenario.phases[0]
        self.phase_start = 0.0
        self.phase_end = 0.0
        self.cycle = 0
        self.next_arrival = INF
        self.phase_log: deque[tuple[float, str]] = deque(maxlen=1000)  # (start, name), latest last
        # What an exposition keeps from one /metrics call to the next (llama.cpp's per-scrape throughput buckets)
        self.scrape_marks: dict[str, tuple] = {}
        self._enter_phase(0, 0.0)

    # ------------------------------------------------------------------ public

    @property
    def phase_name(self) -> str:
        return self.phase.name

    @property
    def virtual_time(self) -> float:
        """Unix time as the simulated server sees it (wall start + simulated seconds)."""
        return self.wall_start + self.now

    def advance(self, dt: float) -> None:
        self.advance_to(self.now + dt)

    def advance_to(self, target: float) -> None:
        """Run every event with time <= ``target``; then the clock reads ``target``."""
        engines = self.engines
        while True:
            t = self.next_arrival
            kind = 1
            if self.phase_end <= t:
                t = self.phase_end
                kind = 0
            eng = None
            for e in engines:
                if e.next_t < t:
                    t = e.next_t
                    eng = e
            if t > target:
                break
            self.now = t
            if eng is not None:
                eng.on_event(t)
            elif kind == 0:
                self._next_phase(t)
            else:
                self._arrival(t)
        if target > self.now:
            self.now = target

    def summary(self) -> dict:
        """A JSON-able view of the current state (used by ``/sim/state`` and the tests)."""
        return {
            "scenario": self.scenario.name,
            "phase": self.phase.name,
            "phase_index": self.phase_index,
            "phase_elapsed_s": round(self.now - self.phase_start, 6),
            "sim_time_s": round(self.now, 6),
            "seed": self.seed,
            "dropped_arrivals": self.dropped,
            "engines": [
                {
                    "engine": str(e.index),
                    "running": e.stats.running,
                    "waiting": e.stats.waiting,
                    "kv_cache_usage": e.stats.kv_usage,
                    "preemptions": e.stats.preemptions,
                    "prompt_tokens": e.stats.prompt_tokens,
                    "generation_tokens": e.stats.gen_tokens,
                    "steps": e.stats.steps,
                    "stalled": e.stalled,
                    "sleep_level": e.stats.sleep_level,
                    "max_num_seqs": e.cfg.max_num_seqs,
                    "max_num_batched_tokens": e.cfg.max_num_batched_tokens,
                }
                for e in self.engines
            ],
        }

    # ------------------------------------------------------------------ phases

    def _enter_phase(self, index: int, t: float) -> None:
        self.phase_index = index
        ph = self.scenario.phases[index]
        self.phase = ph
        self.phase_start = t
        self.phase_end = INF if ph.duration_s is None else t + ph.duration_s
        self.phase_log.append((t, ph.name))
        for e in self.engines:
            e.set_config(ph.engine, t)
            e.set_stalled(ph.stalled or ph.sleep_level > 0, t)
            e.stats.sleep_level = ph.sleep_level  # vLLM sets engine_sleep_state at once (record_sleep_state)
            if ph.abort_waiting:
                e.abort_waiting(t)
        wl = ph.workload
        for _ in range(wl.burst):
            self._submit(t)
        self.next_arrival = t + self.rng.expovariate(wl.rate) if wl.rate > 0 else INF

    def _next_phase(self, t: float) -> None:
        nxt = self.phase_index + 1
        if nxt >= len(self.scenario.phases):
            if not self.scenario.loop:  # pragma: no cover - last phase without a duration never ends
                self.phase_end = INF
                return
            nxt = 0
            self.cycle += 1
        self._enter_phase(nxt, t)

    # ------------------------------------------------------------------ clients

    def _arrival(self, t: float) -> None:
        self._submit(t)
        rate = self.phase.workload.rate
        self.next_arrival = t + self.rng.expovariate(rate) if rate > 0 else INF

    def _submit(self, t: float) -> None:
        wl = self.phase.workload
        rng = self.rng
        # Draw everything first so the random sequence does not depend on the cap below.
        prompt = wl.prefix_tokens + wl.prompt_tokens.sample(rng)
        n = wl.n
        outs = [wl.output_tokens.sample(rng) for _ in range(1 if wl.ignore_eos else n)]
        group = rng.randrange(wl.prefix_groups) if wl.prefix_tokens else 0
        lora = None
        if wl.lora_fraction > 0 and rng.random() < wl.lora_fraction:
            lora = wl.lora_adapters[rng.randrange(len(wl.lora_adapters))]
        if wl.max_outstanding is not None and self.outstanding + n > wl.max_outstanding:
            self.dropped += 1
            return
        cfg = self.engines[0].cfg
        if cfg.max_num_queued_reqs is not None and self.outstanding + n > cfg.max_num_queued_reqs:
            self.rejected["max_num_queued_reqs"] = self.rejected.get("max_num_queued_reqs", 0) + 1
            return
        max_len = cfg.max_model_len
        if prompt > max_len - 1:
            prompt = max_len - 1
        room = max_len - prompt
        if wl.ignore_eos:
            max_tokens = min(outs[0], room)
        else:
            max_tokens = min(room, max(max(outs), int(round(2 * wl.output_tokens.expected))))
        pid = self.next_rid
        chain: list[tuple[tuple[str, int, int] | tuple[str, int], int]] = []  # (a prefix run's key, its tokens)
        if wl.prefix_tokens:
            chain.append((("prefix", group, wl.prefix_tokens), wl.prefix_tokens))
        if n > 1:
            chain.append((("parent", pid), prompt - 1))  # the last prompt token is never a hit
        chain_keys = tuple(chain)
        engine = min(self.engines, key=lambda e: (len(e.waiting) * 4 + len(e.running), e.index))
        for k in range(n):
            out = max_tokens if wl.ignore_eos else min(outs[k], max_tokens)
            req = Request(self.next_rid, t, prompt, out, max_tokens, n=n, lora=lora, chain_keys=chain_keys)
            req.prompt_bytes = 200 + 4 * prompt  # a JSON body with a few characters per token
            self.next_rid += 1
            self.outstanding += 1
            engine.add_request(req, t)

    def _on_finish(self, engine: Engine, req: Request, t: float, reason: str) -> None:
        self.outstanding -= 1
        if reason == "abort":
            return
        h = self.http
        h.requests += 1
        h.request_bytes += req.prompt_bytes
        if h.handler_created is None:
            h.handler_created = self.wall_start + t
        d = t - req.arrival
        h.h_highr.observe(d)
        h.h_duration.observe(d)

    def _on_lora(self, engine: Engine, t: float) -> None:
        # vLLM sets lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters} to the
        # current time on every iteration; prometheus_client keeps every label pair ever set.
        s = engine.stats
        self.lora_info[(",".join(s.running_loras), ",".join(s.waiting_loras))] = self.wall_start + t
