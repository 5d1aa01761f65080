"""What a report is drawn from: a ``kvwatch record`` directory replayed, or a running kvwatch's history.

Both become one ``Timeline``: the target's columns (``t``, ``up``, ``bottleneck``) and each engine's columns
(``REPORT_FIELDS``: the status page's ``ENGINE_FIELDS`` and two more), in the shape of ``/api/v1/history``, so
the report's charts are the page's. A replay also keeps, per good snapshot, the most severe engine's evidence
and recommendations (``Moment``), the counter resets the window saw (a restart) and the snapshots it could not
read (skipped and counted). ``/api/v1/history`` carries none of those: the report says what it cannot know.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kvwatch.catalog import Bottleneck
from kvwatch.diagnose import Diagnosis
from kvwatch.history import ENGINE_FIELDS, TARGET_FIELDS, engine_row
from kvwatch.parse import ParseError
from kvwatch.recording import read_recorded, recording_files
from kvwatch.state import NoEngineMetrics, Target

__all__ = ["REPORT_FIELDS", "Moment", "ReportError", "Timeline", "from_history", "from_recording"]

# The page's fields, then what a report needs beyond them (ITL over time; the prefix-cache caution).
REPORT_FIELDS = (*ENGINE_FIELDS, "inter_token_latency_seconds_p99", "prefix_cache_hit_ratio")
_BY_SEVERITY = list(Bottleneck)


class ReportError(ValueError):
    """Input the user must fix (exit 2, one line)."""


@dataclass(frozen=True, slots=True)
class Moment:
    """One good snapshot's verdict: the most severe engine's, with its why and what to change."""

    t: float
    bottleneck: str
    evidence: tuple[str, ...]
    recommendations: tuple[tuple[str, str, str], ...]  # (action, the engine's flag for it, why)


@dataclass(slots=True)
class Timeline:
    label: str
    kind: str  # "recording" or "history"
    interval: float
    target: dict[str, list] = field(default_factory=dict)  # TARGET_FIELDS columns, bottleneck as names
    engines: list[dict] = field(default_factory=list)  # {model_name, engine, series: REPORT_FIELDS columns}
    moments: list[Moment] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # snapshots that could not be read
    restarts: list[float] = field(default_factory=list)  # times a counter went back (vLLM restarted)
    limits: dict = field(default_factory=dict)

    @property
    def start(self) -> float:
        return self.target["t"][0]

    @property
    def end(self) -> float:
        return self.target["t"][-1]


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def report_row(t: float, d: Diagnosis) -> tuple[float | None, ...]:
    itl = d.signals.latency.quantiles.get("inter_token_latency_seconds", {}).get(0.99)
    return (*engine_row(t, d), itl, d.signals.throughput.prefix_cache_hit_ratio)


def limits_of(d: Diagnosis) -> dict:
    """The limits and configuration one diagnosis knows (configured or inferred), for the report's table."""

    def limit(v: tuple[int, str] | None) -> dict | None:
        return None if v is None else {"value": v[0], "source": v[1]}

    cap, cache = d.signals.capacity, d.signals.capacity.cache
    return {
        "model_name": d.model_name,
        "engine": d.engine,
        "max_num_seqs": limit(d.max_num_seqs),
        "max_num_batched_tokens": limit(d.max_num_batched_tokens),
        "kv_capacity_tokens": cap.capacity_tokens,
        "mean_sequence_tokens": _round(cap.mean_sequence_tokens),
        "estimated_max_concurrency": _round(cap.estimated_max_concurrency),
        "max_model_len": cache.max_model_len if cache is not None and cache.max_model_len else None,
        "cache_dtype": cache.cache_dtype if cache is not None else None,
        "enable_prefix_caching": cache.enable_prefix_caching if cache is not None else None,
    }


def _moment(t: float, engines: list[Diagnosis]) -> Moment | None:
    if not engines:
        return None
    worst = max(engines, key=lambda e: e.bottleneck.severity)
    recs = tuple((str(r.action), r.flag, r.why) for r in worst.recommendations)
    return Moment(t, str(worst.bottleneck), tuple(worst.evidence), recs)


def _median_interval(ts: list[float]) -> float:
    steps = [b - a for a, b in zip(ts, ts[1:], strict=False) if b > a]
    return statistics.median(steps) if steps else 1.0


def from_recording(directory: Path, target: Target) -> Timeline:
    """Replay ``directory`` through ``target`` (built from the settings, as ``diagnose --replay`` does).

    Raises ReportError for a missing or empty directory, or one where no snapshot could be read."""
    if not directory.is_dir():
        raise ReportError(f"{str(directory)!r} is not a directory (a `kvwatch record --out` directory)")
    files = recording_files(directory)
    if not files:
        raise ReportError(f"no <unix_time>.prom files in {str(directory)!r} (is it a `kvwatch record` directory?)")
    tl = Timeline(str(directory), "recording", _median_interval([t for t, _ in files]))
    tl.target = {f: [] for f in TARGET_FIELDS}
    engines: dict[tuple[str, str], dict[str, list]] = {}
    resets = 0
    for t, f in files:
        try:
            target.observe_body(t, *read_recorded(f))
        except (ParseError, NoEngineMetrics, OSError) as err:
            target.observe_failure(t, f"{f.name}: {err}")
            tl.skipped.append(f.name)
            continue  # a corrupt snapshot is no sample: the report counts it, it draws nothing for it
        d = target.diagnose(t)
        now = sum(h.resets for h in target.engines.values())
        if now > resets:
            tl.restarts.append(t)
        resets = now
        tl.target["t"].append(t)
        tl.target["up"].append(1.0)
        tl.target["bottleneck"].append(str(d.bottleneck))
        for e in d.engines:
            cols = engines.setdefault((e.model_name, e.engine), {f: [] for f in REPORT_FIELDS})
            for name, v in zip(REPORT_FIELDS, report_row(t, e), strict=True):
                cols[name].append(_round(v) if name != "bottleneck" else str(e.bottleneck))
            tl.limits.update({k: v for k, v in limits_of(e).items() if v is not None})  # the latest known
        m = _moment(t, d.engines)
        if m is not None:
            tl.moments.append(m)
    if not tl.target["t"]:
        raise ReportError(f"none of the {len(files)} snapshots in {str(directory)!r} could be read")
    tl.engines = [{"model_name": k[0], "engine": k[1], "series": v} for k, v in sorted(engines.items())]
    return tl


def from_history(doc: dict, label: str | None = None) -> Timeline:
    """A Timeline from ``/api/v1/history``'s JSON (one target: ``label``, or the first).

    Raises ReportError when the document is not kvwatch's history or holds no sample."""
    try:
        targets = doc["targets"]
        t = next(x for x in targets if label in (None, x["target"]))
        series, interval = t["series"], float(doc["interval"])
        engines = [
            {"model_name": e["model_name"], "engine": e["engine"], "series": dict(e["series"])} for e in t["engines"]
        ]
    except (KeyError, TypeError, ValueError, StopIteration):
        raise ReportError("the answer is not kvwatch's /api/v1/history (no targets[].series)") from None
    if not series.get("t"):
        raise ReportError("the history holds no sample yet: let kvwatch scrape for a while")
    tl = Timeline(str(t["target"]), "history", interval)
    tl.target = {f: list(series.get(f) or [None] * len(series["t"])) for f in TARGET_FIELDS}
    for e in engines:
        n = len(e["series"]["t"])
        for f in REPORT_FIELDS:
            e["series"].setdefault(f, [None] * n)
    tl.engines = engines
    if engines:
        s = engines[0]["series"]
        seqs = [v for v in s["max_num_seqs"] if v is not None]
        conc = [v for v in s["estimated_max_concurrency"] if v is not None]
        tl.limits = {
            "model_name": engines[0]["model_name"],
            "engine": engines[0]["engine"],
            "max_num_seqs": {"value": int(seqs[-1]), "source": "history"} if seqs else None,
            "estimated_max_concurrency": conc[-1] if conc else None,
        }
    return tl


def parse_history(text: str) -> dict:
    try:
        doc = json.loads(text)
    except ValueError:
        raise ReportError("the answer is not JSON (is the URL a kvwatch's?)") from None
    if not isinstance(doc, dict):
        raise ReportError("the answer is not kvwatch's /api/v1/history")
    return doc
