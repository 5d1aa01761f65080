"""Per-target state: the parsed scrapes go in, the current diagnosis comes out. No I/O here.

``Target`` is everything kvwatch knows about one scraped URL: the engines' history, the scrape counters,
the last error and the last diagnosis. It ties normalize → window → diagnose together; the scrape loop
(``kvwatch.app``), the replay of recordings (``kvwatch.cli``) and the tests all drive it the same way, and
``kvwatch.export`` only reads it. ``Target.from_settings`` is the one place it is built from the settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvwatch.catalog import Bottleneck, Thresholds, most_severe
from kvwatch.diagnose import Diagnosis, Hints, diagnose_engine
from kvwatch.engines import AUTO, ENGINES, Engine, by_name, detect, keep_any
from kvwatch.engines.vllm import ENGINE as VLLM
from kvwatch.history import TargetHistory
from kvwatch.parse import parse
from kvwatch.redact import redact_url
from kvwatch.scrape import REASONS
from kvwatch.snapshot import Counter, EngineSnapshot, Gauge
from kvwatch.window import EngineHistory, summarize

if TYPE_CHECKING:
    from kvwatch.config import Settings

__all__ = ["NoEngineMetrics", "Target", "TargetDiagnosis"]


class NoEngineMetrics(ValueError):
    """The body parsed, but carries no series of the engine read (wrong URL, metadata only, another engine)."""


@dataclass(slots=True)
class TargetDiagnosis:
    timestamp: float
    target: str
    up: bool
    bottleneck: str
    engines: list[Diagnosis] = field(default_factory=list)
    error: str | None = None
    engine_type: str | None = None  # the engine read (kvwatch.engines), None until one is recognised
    error_reason: str | None = None  # the error's ScrapeReason (the metric's reason label)

    def as_dict(self) -> dict:
        out = {
            "timestamp": round(self.timestamp, 3),
            "target": self.target,
            "up": self.up,
            "bottleneck": self.bottleneck,
            "engine_type": self.engine_type,
            "engines": [d.as_dict() for d in self.engines],
        }
        if self.error:
            out["error"] = self.error
            if self.error_reason:
                out["error_reason"] = self.error_reason
        return out


class Target:
    """One scraped URL: its engines' history, scrape counters, last error and last diagnosis."""

    def __init__(
        self,
        target: str,
        *,
        window_seconds: float = 10.0,
        stale_after_seconds: float = 5.0,
        max_engines: int = 64,
        hints: Hints = Hints(),
        thresholds: Thresholds = Thresholds(),
        history_seconds: float = 900.0,
        history_samples: int = 901,
        engine: str = AUTO,
    ):
        self.target = target  # the label: never holds a credential (from_settings redacts it)
        self.url = target  # what is fetched
        self.window_seconds = window_seconds
        self.stale_after_seconds = stale_after_seconds
        self.max_engines = max_engines
        self.hints = hints
        self.thresholds = thresholds
        self.engines: dict[tuple[str, str], EngineHistory] = {}
        # --engine: one engine read whatever the scrape holds, or (auto) the one recognised in it
        self.engine_wanted: Engine | None = None if engine == AUTO else by_name(engine)
        self.engine_kind: Engine | None = self.engine_wanted
        self.last_success: float | None = None
        self.last_attempt: float | None = None
        self.last_error: str | None = None
        self.last_reason: str | None = None  # the last error's ScrapeReason, None after a good scrape
        self.up = False
        # What the scrape loop counts, for kvwatch_up / _scrape_duration_seconds / _scrape_errors_total.
        self.errors = {r: 0 for r in REASONS}
        self.scrape_duration_seconds: float | None = None
        self.folded_engines = 0  # pairs beyond max_engines in the last good scrape (kvwatch_folded_engines)
        # Why the engine's extra path (llama.cpp's /slots) was not read at the last scrape; None: read, or none to read
        self.extra_error: str | None = None
        self.diagnosis: TargetDiagnosis | None = None
        # What the status page charts: a few numbers per scrape, bounded (kvwatch.history).
        self.history = TargetHistory(history_seconds, history_samples, max_engines)

    @classmethod
    def from_settings(cls, url: str, settings: Settings) -> Target:
        """The target scraped at ``url``, labelled by its redacted form (kvwatch.redact)."""
        t = cls(
            redact_url(url),
            window_seconds=settings.window,
            stale_after_seconds=settings.stale_after,
            max_engines=settings.max_engines,
            hints=settings.hints,
            thresholds=settings.thresholds,
            history_seconds=settings.history,
            history_samples=settings.history_samples,
            engine=settings.engine,
        )
        t.url = url
        return t

    @property
    def keep_family(self):
        """The parser's filter: every engine's families, also with --engine (so that a response from another engine
        is named as such); one set lookup per family (kvwatch.engines.keep_any)."""
        return keep_any

    def observe_body(self, t: float, body: str, extra: bytes | None = None) -> None:
        """Parse and record one scrape body (and its engine's extra path's body, if read). Raises ParseError /
        NoEngineMetrics (the scrape failed)."""
        families = parse(body, self.keep_family)
        engine = self.engine_for(families)
        parsed = engine.extra.parse(extra) if engine is not None and engine.extra and extra is not None else None
        self.observe(t, families, body, parsed)

    def engine_for(self, families) -> Engine | None:
        """The engine a scrape of these families is read as (None: none recognised), without changing anything."""
        return self.engine_wanted or detect(families)

    def serving(self, engine: Engine, families) -> bool:
        """Whether the engine has requests in this scrape, had them in the previous one, or made progress between the
        two (a request can start and end between scrapes): only then is its extra path read. Reading llama.cpp's /slots
        is a task in its own loop, which wakes a server asleep (--sleep-idle-seconds) and restarts its idle timer, and
        an idle server's slots only repeat their last requests' figures."""
        for key, snap in engine.read(families, self.max_engines).items():
            hist = self.engines.get(key)
            prev = hist.latest if hist is not None else None
            if _present(snap) or (prev is not None and _present(prev)):
                return True
            if prev is not None and any(snap.counters.get(k) != prev.counters.get(k) for k in _PROGRESS):
                return True
        return False

    def observe(self, t: float, families, body: str = "", extra: object | None = None) -> None:
        """Record one parsed scrape. ``body``, the text it was parsed from, only names what it carried instead when
        no engine's families are in it. ``extra``: its engine's extra path as that engine's ``extra.parse`` read it
        (None: not read, or unreadable; the snapshots then lack what it adds)."""
        engine = self._engine_of(families, body)
        snaps = engine.read(families, self.max_engines)
        if extra is not None and engine.extra is not None and snaps:
            engine.extra.fill(extra, snaps)
        if not snaps:
            seen = detect(families)
            if seen is not None and seen is not engine:  # --engine names another engine than the one serving
                raise NoEngineMetrics(
                    f"--engine {engine.name}, but the response carries {seen.title} metrics "
                    f"(use --engine {seen.name} or auto)"
                )
            raise NoEngineMetrics(f"no {engine.title} series in the response")
        self.folded_engines = sum(s.folded for s in snaps.values())
        for key, snap in snaps.items():
            hist = self.engines.get(key)
            if hist is None:
                hist = self.engines[key] = EngineHistory(*key, keep_seconds=self.window_seconds + 1.0)
            hist.add(t, snap)
        self.last_success = self.last_attempt = t
        self.last_error = self.last_reason = None
        self.up = True

    def _engine_of(self, families, body: str) -> Engine:
        """The engine to read the scrape as. Auto: the one whose families it carries, re-chosen (and the history
        dropped, never mixed) when the target restarts as another engine."""
        if self.engine_wanted is not None:
            return self.engine_wanted
        seen = detect(families)
        if seen is None:
            tried = ", ".join(e.title for e in ENGINES)
            raise NoEngineMetrics(f"no serving engine's series in the response (tried {tried}){_seen(body)}")
        if seen is not self.engine_kind:
            self.engines.clear()
            self.engine_kind = seen
        return seen

    def observe_failure(self, t: float, error: str, reason: str | None = None) -> None:
        self.last_attempt = t
        self.last_error = error
        self.last_reason = reason
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
                diags.append(diagnose_engine(sig, self.hints, self.thresholds, self.engine_kind or VLLM))
        diags.sort(key=lambda d: (d.model_name, d.engine))
        if self.last_success is None or now - self.last_success > self.stale_after_seconds:
            overall = Bottleneck.UNREACHABLE
        else:
            overall = most_severe([d.bottleneck for d in diags])
        engine_type = self.engine_kind.name if self.engine_kind else None
        return TargetDiagnosis(
            now,
            self.target,
            self.up,
            overall,
            diags,
            self.last_error,
            engine_type=engine_type,
            error_reason=self.last_reason,
        )


_PROGRESS = (Counter.ENGINE_STEPS, Counter.GENERATION_TOKENS, Counter.PROMPT_TOKENS)


def _present(snap: EngineSnapshot) -> bool:
    return snap.gauges.get(Gauge.REQUESTS_RUNNING, 0.0) + snap.gauges.get(Gauge.REQUESTS_WAITING, 0.0) > 0


def _seen(body: str, most: int = 5) -> str:
    """The first few metric names the body carried (the parser kept none of them), for the error: what the URL serves
    instead. Read only on this error path, and from at most the body's first 64 KiB."""
    names: list[str] = []
    for line in body[: 64 * 1024].splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0] if line and not line.startswith("#") else ""
        if name and name not in names:
            names.append(name[:64])
            if len(names) > most:
                break
    more = ", ..." if len(names) > most else ""
    return f"; metrics seen: {', '.join(names[:most])}{more}" if names else "; no metric in it"
