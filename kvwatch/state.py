"""Per-target state: the parsed scrapes go in, the current diagnosis comes out. No I/O here.

``TargetState`` ties normalize → window → diagnose together for one scraped URL. The scrape loop
(``kvwatch.app``), the replay of recordings (``kvwatch.cli``) and the tests all drive it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvwatch.diagnose import Diagnosis, Hints, Thresholds, diagnose_engine, most_severe
from kvwatch.normalize import keep_family, normalize
from kvwatch.parse import parse
from kvwatch.window import EngineHistory, summarize

__all__ = ["TargetDiagnosis", "TargetState", "NoVllmMetrics"]


class NoVllmMetrics(ValueError):
    """The body parsed, but carries no vLLM series (wrong URL, metadata only, renamed families)."""


@dataclass(slots=True)
class TargetDiagnosis:
    timestamp: float
    target: str
    up: bool
    bottleneck: str
    engines: list[Diagnosis] = field(default_factory=list)
    error: str | None = None

    def as_dict(self) -> dict:
        out = {
            "timestamp": round(self.timestamp, 3),
            "target": self.target,
            "up": self.up,
            "bottleneck": self.bottleneck,
            "engines": [d.as_dict() for d in self.engines],
        }
        if self.error:
            out["error"] = self.error
        return out


class TargetState:
    def __init__(
        self,
        target: str,
        *,
        window_seconds: float = 10.0,
        stale_after_seconds: float = 5.0,
        max_engines: int = 64,
        hints: Hints = Hints(),
        thresholds: Thresholds = Thresholds(),
    ):
        self.target = target
        self.window_seconds = window_seconds
        self.stale_after_seconds = stale_after_seconds
        self.max_engines = max_engines
        self.hints = hints
        self.thresholds = thresholds
        self.engines: dict[tuple[str, str], EngineHistory] = {}
        self.last_success: float | None = None
        self.last_attempt: float | None = None
        self.last_error: str | None = None
        self.up = False

    def observe_body(self, t: float, body: str) -> None:
        """Parse and record one scrape body. Raises ParseError / NoVllmMetrics (the scrape failed)."""
        self.observe(t, parse(body, keep_family))

    def observe(self, t: float, families) -> None:
        snaps = normalize(families, self.max_engines)
        if not snaps:
            raise NoVllmMetrics("no vLLM series in the response")
        for key, snap in snaps.items():
            hist = self.engines.get(key)
            if hist is None:
                hist = self.engines[key] = EngineHistory(*key, keep_seconds=self.window_seconds + 1.0)
            hist.add(t, snap)
        self.last_success = self.last_attempt = t
        self.last_error = None
        self.up = True

    def observe_failure(self, t: float, error: str) -> None:
        self.last_attempt = t
        self.last_error = error
        self.up = False

    def fresh_engines(self, now: float) -> list[EngineHistory]:
        """Engines with a sample within stale-after: the rest are withdrawn, not repeated."""
        stale = [k for k, h in self.engines.items() if not h.points or now - h.points[-1].t > self.stale_after_seconds]
        for k in stale:
            if now - self.engines[k].points[-1].t > max(self.window_seconds, self.stale_after_seconds) * 2:
                del self.engines[k]  # long gone: forget it, so a restart starts clean
        return [h for k, h in self.engines.items() if k not in stale]

    def diagnose(self, now: float) -> TargetDiagnosis:
        diags = []
        for hist in self.fresh_engines(now):
            sig = summarize(hist, now, self.window_seconds)
            if sig is not None:
                diags.append(diagnose_engine(sig, self.hints, self.thresholds))
        diags.sort(key=lambda d: (d.model_name, d.engine))
        if self.last_success is None or now - self.last_success > self.stale_after_seconds:
            overall = "unreachable"
        else:
            overall = most_severe([d.bottleneck for d in diags])
        return TargetDiagnosis(now, self.target, self.up, overall, diags, self.last_error)
