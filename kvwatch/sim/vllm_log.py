"""The simulator's server log: the lines vLLM 0.32 writes that ``kvwatch logs`` reads.

At start-up, per engine, the KV-cache size line of ``vllm/v1/core/kv_cache_utils.py``
(``_report_kv_cache_config``, as the 0.32 CPU captures in tests/fixtures/vllm-0.32.0-cpu show it, one line)::

    (EngineCore_DP0 pid=101) INFO 12-01 10:22:11 [kv_cache_utils.py:2327] GPU KV cache size: 447,440 tokens, Maximum concurrency for 32,768 tokens per request: 13.65x

then every ``interval`` simulated seconds (vLLM's ``VLLM_LOG_STATS_INTERVAL``, 10 s) one stats line per engine,
``LoggingStatLogger.log`` of ``vllm/v1/metrics/loggers.py``: the prompt and generation tokens of the interval
over its length, the gauges as last published, and the prefix-cache hit rate over the interval::

    (APIServer pid=100) INFO 12-01 10:22:22 [loggers.py:335] Engine 000: Avg prompt throughput: 161.7 tokens/s, Avg generation throughput: 18.1 tokens/s, Running: 7 reqs, Waiting: 72 reqs, GPU KV cache usage: 100.0%, Prefix cache hit rate: 0.0%

with, between Waiting and the KV field, ``Deferred: %d reqs`` (counted in Waiting too), ``KV fetch: %d waiting to
start, %d in progress, %d completed waiting`` and ``Preemptions: %d`` (of the interval), each only when non-zero,
as 0.32's ``LoggingStatLogger.log`` prints them. When an engine falls asleep or wakes, its engine core's executor
line (``vllm/v1/executor/abstract.py``, 0.32)::

    (EngineCore_DP0 pid=101) INFO 12-01 10:23:02 [abstract.py:391] It took 0.512000 seconds to fall asleep.
    (EngineCore_DP0 pid=101) INFO 12-01 10:23:32 [abstract.py:409] It took 0.301000 seconds to wake up tags {'kv_cache', 'weights'}.

A stalled engine publishes no stats, so its line repeats the frozen gauges with zero throughput, as vLLM's
logger does (it logs on its own timer from the last stats it received).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from kvwatch.catalog import VLLM_SLEEP_TAGS

from .simulator import Simulator

__all__ = ["LogWriter", "simulated_log"]

API_PID, CORE_PID = 100, 101
# vLLM prints the set of tags it woke: {'kv_cache', 'weights'} when every tag sleeps (executor/abstract.py)
_WAKE_TAGS = "{" + ", ".join(repr(t) for t in sorted(VLLM_SLEEP_TAGS)) + "}"


def _stamp(t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(t))


class LogWriter:
    """vLLM's log lines for ``sim``, a line per engine each time ``lines`` is called past an interval."""

    def __init__(self, sim: Simulator, interval: float = 10.0, device: str = "GPU"):
        self.sim = sim
        self.interval = interval
        self.device = device
        self._last = sim.now
        self._totals = [self._counts(e) for e in sim.engines]
        self._preempted = [e.stats.preemptions for e in sim.engines]
        self._asleep = [e.stats.sleep_level > 0 for e in sim.engines]

    def startup(self) -> list[str]:
        out = []
        for e in self.sim.engines:
            cfg = e.cfg
            tokens = cfg.num_gpu_blocks * cfg.block_size
            out.append(
                f"(EngineCore_DP{e.index} pid={CORE_PID + e.index}) INFO {_stamp(self.sim.virtual_time)} "
                f"[kv_cache_utils.py:2327] {self.device} KV cache size: {tokens:,} tokens, Maximum concurrency "
                f"for {cfg.max_model_len:,} tokens per request: {tokens / cfg.max_model_len:.2f}x"
            )
        return out

    @staticmethod
    def _counts(e) -> tuple[int, int, int, int]:
        s = e.stats
        return s.prompt_tokens, s.gen_tokens, s.prefix_queries, s.prefix_hits

    def _sleep_lines(self) -> list[str]:
        out = []
        for i, e in enumerate(self.sim.engines):
            asleep = e.stats.sleep_level > 0
            if asleep == self._asleep[i]:
                continue
            self._asleep[i] = asleep
            what = "fall asleep." if asleep else f"wake up tags {_WAKE_TAGS}."
            out.append(
                f"(EngineCore_DP{e.index} pid={CORE_PID + e.index}) INFO {_stamp(self.sim.virtual_time)} "
                f"[abstract.py:{391 if asleep else 409}] It took {0.512 if asleep else 0.301:.6f} seconds to {what}"
            )
        return out

    def lines(self) -> list[str]:
        """The sleep / wake-up lines since the last call, and the stats lines due (one per engine once
        ``interval`` has passed)."""
        out = self._sleep_lines()
        elapsed = self.sim.now - self._last
        if elapsed < self.interval:
            return out
        self._last = self.sim.now
        for i, e in enumerate(self.sim.engines):
            now = self._counts(e)
            prompt, gen, queries, hits = (b - a for a, b in zip(self._totals[i], now, strict=True))
            self._totals[i] = now
            s = e.stats
            hit_rate = 100.0 * hits / queries if queries else 0.0
            preempted, self._preempted[i] = s.preemptions - self._preempted[i], s.preemptions
            optional = ""
            if s.waiting_deferred:
                optional += f"Deferred: {s.waiting_deferred} reqs, "
            if any(s.kv_fetch):
                a, b, c = s.kv_fetch
                optional += f"KV fetch: {a} waiting to start, {b} in progress, {c} completed waiting, "
            if preempted:
                optional += f"Preemptions: {preempted}, "
            out.append(
                f"(APIServer pid={API_PID}) INFO {_stamp(self.sim.virtual_time)} [loggers.py:335] "
                f"Engine {e.index:03d}: Avg prompt throughput: {prompt / elapsed:.1f} tokens/s, "
                f"Avg generation throughput: {gen / elapsed:.1f} tokens/s, Running: {s.running} reqs, "
                f"Waiting: {s.waiting} reqs, {optional}{self.device} KV cache usage: {100.0 * s.kv_usage:.1f}%, "
                f"Prefix cache hit rate: {hit_rate:.1f}%"
            )
        return out


def simulated_log(sim: Simulator, seconds: float, interval: float = 10.0, device: str = "GPU") -> Iterator[str]:
    """Run ``sim`` for ``seconds`` simulated seconds and yield its server log, start-up lines first."""
    w = LogWriter(sim, interval, device)
    yield from w.startup()
    t = sim.now
    while t + interval <= seconds + 1e-9:
        t += interval
        sim.advance_to(t)
        yield from w.lines()
