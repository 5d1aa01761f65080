"""The status page's memory: a few numbers per engine per scrape, over the last ``--history`` seconds.

The diagnosis window (``window.py``) keeps seconds of raw samples; the page charts minutes. Keeping raw
samples for minutes would cost a histogram per family per scrape, so each scrape's diagnosis is boiled down
to ``ENGINE_FIELDS`` floats (the target itself: ``TARGET_FIELDS``) and written into a ring of ``array('d')``
columns allocated once: ``samples x fields x 8 bytes``, whatever happens. ``samples`` is
``ceil(history / interval) + 1``: the scrape loop never scrapes a target more often than once an interval.
An engine that stops reporting keeps its ring until its last sample leaves the history; a target holds at
most ``max_engines + 1`` rings (``normalize`` folds the rest into ``_overflow``).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvwatch.catalog import Bottleneck
from kvwatch.snapshot import Hist

if TYPE_CHECKING:
    from kvwatch.diagnose import Diagnosis
    from kvwatch.state import TargetDiagnosis

__all__ = [
    "ENGINE_FIELDS",
    "MAX_SAMPLES",
    "Ring",
    "TARGET_FIELDS",
    "TargetHistory",
    "engine_row",
    "parse_seconds",
]

# The names are the diagnosis JSON's (signals), so a reader of both sees one vocabulary.
ENGINE_FIELDS = (
    "t",
    "kv_cache_usage_ratio",
    "requests_running",
    "requests_waiting",
    "max_num_seqs",
    "estimated_max_concurrency",
    "prompt_tokens_per_second",
    "generation_tokens_per_second",
    "preemptions_per_second",
    "time_to_first_token_seconds_p99",
    "bottleneck",
)
TARGET_FIELDS = ("t", "up", "bottleneck")
BYTES_PER_VALUE = 8  # array('d')
# A guard against --history / --interval combinations that would hold gigabytes (config.py refuses them).
MAX_SAMPLES = 100_000
_BY_SEVERITY = list(Bottleneck)  # the bottleneck column holds the severity index


class Ring:
    """``capacity`` rows of ``fields`` floats (NaN = unknown), oldest overwritten first; column 0 is time."""

    def __init__(self, fields: Sequence[str], capacity: int):
        self.fields = tuple(fields)
        self.capacity = max(2, capacity)
        self.cols = [array("d", [math.nan]) * self.capacity for _ in self.fields]
        self.size = 0
        self.next = 0  # where the next row goes

    @property
    def nbytes(self) -> int:
        return sum(c.itemsize * len(c) for c in self.cols)

    @property
    def last_t(self) -> float | None:
        return self.cols[0][(self.next - 1) % self.capacity] if self.size else None

    def append(self, row: Sequence[float | None]) -> None:
        i = self.next
        for col, v in zip(self.cols, row, strict=True):
            col[i] = math.nan if v is None else v
        self.next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def since(self, t0: float) -> dict[str, list]:
        """The rows with t >= t0, oldest first, as columns (unknown values as None).

        Rows are in time order (one per scrape), so the first is found by bisection: the page polls for the
        last few seconds every second, and that must not cost a pass over every row of every target."""
        start = (self.next - self.size) % self.capacity
        t = self.cols[0]
        lo, hi = 0, self.size  # logical positions, oldest = 0
        while lo < hi:
            mid = (lo + hi) // 2
            if t[(start + mid) % self.capacity] < t0:
                lo = mid + 1
            else:
                hi = mid
        idx = [(start + k) % self.capacity for k in range(lo, self.size)]
        return {name: [_json(col[i]) for i in idx] for name, col in zip(self.fields, self.cols, strict=True)}


def _json(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 4)


def engine_row(t: float, d: Diagnosis) -> tuple[float | None, ...]:
    s = d.signals
    ttft = s.latency.quantiles.get(Hist.TIME_TO_FIRST_TOKEN_SECONDS, {}).get(0.99)
    return (
        t,
        s.kv.usage_ratio,
        s.queue.running,
        s.queue.waiting,
        float(d.max_num_seqs[0]) if d.max_num_seqs else None,
        s.capacity.estimated_max_concurrency,
        s.throughput.prompt_tokens_per_second,
        s.throughput.generation_tokens_per_second,
        s.throughput.preemptions_per_second,
        ttft,
        float(d.bottleneck.severity),
    )


def _names(col: list) -> list[str | None]:
    return [None if v is None else str(_BY_SEVERITY[int(v)]) for v in col]


class TargetHistory:
    """One target's rings: the target's own (up, bottleneck) and one per engine."""

    def __init__(self, seconds: float, samples: int, max_engines: int = 64):
        self.seconds = seconds
        self.samples = min(max(2, samples), MAX_SAMPLES)
        self.max_rings = max_engines + 1
        self.target = Ring(TARGET_FIELDS, self.samples)
        self.engines: dict[tuple[str, str], Ring] = {}

    @property
    def nbytes(self) -> int:
        return self.target.nbytes + sum(r.nbytes for r in self.engines.values())

    def record(self, d: TargetDiagnosis) -> None:
        """One scrape's diagnosis. Engines only when the scrape succeeded: after a failed one the diagnosis
        still reads the window's old samples, and charting them again would draw values vLLM never sent."""
        t = d.timestamp
        self.target.append((t, 1.0 if d.up else 0.0, float(Bottleneck(d.bottleneck).severity)))
        if d.up:
            for e in d.engines:
                key = (e.model_name, e.engine)
                ring = self.engines.get(key)
                if ring is None:
                    self._make_room(t)
                    ring = self.engines[key] = Ring(ENGINE_FIELDS, self.samples)
                ring.append(engine_row(t, e))
        self._forget(t)

    def _forget(self, now: float) -> None:
        for key, ring in list(self.engines.items()):
            last = ring.last_t
            if last is None or now - last > self.seconds:
                del self.engines[key]

    def _make_room(self, now: float) -> None:
        while len(self.engines) >= self.max_rings:  # drop the engine heard from longest ago
            oldest = min(self.engines, key=lambda k: self.engines[k].last_t or -math.inf)
            del self.engines[oldest]

    def as_dict(self, label: str, now: float, seconds: float) -> dict:
        t0 = now - seconds
        series = self.target.since(t0)
        series["bottleneck"] = _names(series["bottleneck"])
        engines = []
        for (model_name, engine), ring in sorted(self.engines.items()):
            cols = ring.since(t0)
            if not cols["t"]:
                continue
            cols["bottleneck"] = _names(cols["bottleneck"])
            engines.append({"model_name": model_name, "engine": engine, "series": cols})
        return {"target": label, "series": series, "engines": engines}


def parse_seconds(raw: str | None, limit: float) -> float:
    """``?seconds=N`` of /api/v1/history: a positive, finite number, at most ``limit`` (what is kept: larger
    asks are cut to it, and the answer says so); absent, all of it. Raises ValueError with the sentence a
    client is told."""
    if raw is None:
        return limit
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"seconds must be a number of seconds, e.g. ?seconds=300 (got {raw[:40]!r})") from None
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"seconds must be a positive, finite number of seconds (got {raw[:40]!r})")
    return min(v, limit)
