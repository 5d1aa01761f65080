"""The readable report: what the server was, a timeline of states, the dominant bottleneck, what to change."""

from __future__ import annotations

from collections import Counter, deque

from kvwatch.catalog import Bottleneck
from kvwatch.logs.analyze import LogAnalyzer, RecordResult
from kvwatch.logs.records import StatsRecord

__all__ = ["Span", "Summary", "dominant", "render_report", "render_row"]

LIMITS = (Bottleneck.KV_CACHE, Bottleneck.MAX_NUM_SEQS, Bottleneck.TOKEN_BUDGET, Bottleneck.STALLED)


def dominant(results: list[RecordResult]) -> Bottleneck:
    """The limit that bound most often (ties: the more severe); else undetermined or none, whichever held more
    records; else idle."""
    return _dominant_of(Counter(r.diagnosis.bottleneck for r in results))


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x * 100:.0f}%"


def _range(values: list[float], fmt=lambda v: f"{v:g}") -> str:
    lo, hi = min(values), max(values)
    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"


def render_row(r: RecordResult) -> str:
    rec, d = r.record, r.diagnosis
    parts = [
        f"line {rec.line}",
        rec.clock or "--:--:--",
        f"engine {rec.engine}",
        f"{d.bottleneck:<12}",
        f"running {rec.requests_running}",
        f"waiting {rec.requests_waiting}",
        f"KV {_pct(rec.kv_cache_usage_ratio)}",
        f"prompt {rec.prompt_tokens_per_second:g} / gen {rec.generation_tokens_per_second:g} tok/s",
    ]
    if r.preemptions:
        parts.append(f"{r.preemptions} preemptions")
    return "  ".join(parts)


class Span:
    """Consecutive records of one engine in the same state, summed up as they come (no record is kept)."""

    __slots__ = ("first", "last", "n", "bottleneck", "waiting", "waiting_max", "waiting_varies", "running", "kv", "pre")

    def __init__(self, r: RecordResult):
        rec = r.record
        self.first = self.last = rec
        self.n = 1
        self.bottleneck = r.diagnosis.bottleneck
        self.waiting = (rec.requests_waiting, rec.requests_waiting)  # (first, last)
        self.waiting_max = rec.requests_waiting
        self.waiting_varies = False
        self.running = (rec.requests_running, rec.requests_running)  # (min, max)
        kv = rec.kv_cache_usage_ratio
        self.kv = None if kv is None else (kv, kv)
        self.pre = r.preemptions or 0

    def add(self, r: RecordResult) -> None:
        rec = r.record
        self.last = rec
        self.n += 1
        w = rec.requests_waiting
        self.waiting_varies = self.waiting_varies or w != self.waiting[0]
        self.waiting = (self.waiting[0], w)
        self.waiting_max = max(self.waiting_max, w)
        self.running = (min(self.running[0], rec.requests_running), max(self.running[1], rec.requests_running))
        kv = rec.kv_cache_usage_ratio
        if kv is not None:
            self.kv = (kv, kv) if self.kv is None else (min(self.kv[0], kv), max(self.kv[1], kv))
        self.pre += r.preemptions or 0


class Summary:
    """What the report needs of every record, in memory that does not grow with the log: counts per state
    and engine, the first and last ``max_spans // 2`` spans of the timeline, the best evidence per state.

    ``kvwatch logs`` on a 1 GB log or an endless pipe keeps this, never the records (bench: --only logs)."""

    MAX_ENGINES = 256  # engines counted one by one; the rest are counted together (a hostile log)

    def __init__(self, max_spans: int = 60):
        self.half = max_spans // 2
        self.count = 0
        self.first: StatsRecord | None = None
        self.last: StatsRecord | None = None
        self.seen: Counter[Bottleneck] = Counter()
        self.waited: Counter[Bottleneck] = Counter()  # records with requests waiting, by state
        self.by_engine: dict[str, Counter[Bottleneck]] = {}
        self.best: dict[str, RecordResult] = {}  # per state: the record with the longest queue (then latest line)
        self.best_any: RecordResult | None = None
        self.spans = 0
        self.head: list[Span] = []
        self.tail: deque[Span] = deque(maxlen=self.half)
        self.open: dict[str, Span] = {}  # the current span of each engine

    def add(self, r: RecordResult) -> None:
        rec, b = r.record, r.diagnosis.bottleneck
        self.count += 1
        self.first = self.first or rec
        self.last = rec
        self.seen[b] += 1
        if rec.requests_waiting > 0:
            self.waited[b] += 1
        eng = rec.engine if rec.engine in self.by_engine or len(self.by_engine) < self.MAX_ENGINES else "..."
        self.by_engine.setdefault(eng, Counter())[b] += 1
        key = (rec.requests_waiting, rec.line)
        for slot in (b, None):
            cur = self.best.get(slot) if slot is not None else self.best_any
            if cur is None or key > (cur.record.requests_waiting, cur.record.line):
                if slot is None:
                    self.best_any = r
                else:
                    self.best[slot] = r
        span = self.open.get(rec.engine)
        if span is not None and span.bottleneck == b:
            span.add(r)
            return
        span = Span(r)
        if len(self.open) >= self.MAX_ENGINES and rec.engine not in self.open:
            self.open.clear()  # endless engine names: forget the open spans rather than grow
        self.open[rec.engine] = span
        self.spans += 1
        (self.head if len(self.head) < self.half else self.tail).append(span)

    def shown_spans(self) -> list[Span | None]:
        """Every span, or the first and last halves with None between them."""
        if self.spans <= 2 * self.half:
            return [*self.head, *self.tail]
        return [*self.head, None, *self.tail]


def _span_line(span: Span) -> str:
    a, b = span.first, span.last
    lines = f"line {a.line}" if a is b else f"lines {a.line}-{b.line}"
    clock = (a.clock or "") if a is b else (f"{a.clock}-{b.clock}" if a.clock and b.clock else "")
    first, last = span.waiting
    wait = f"waiting {first}" if not span.waiting_varies else f"waiting {first}->{last} (max {span.waiting_max})"
    running = _range(list(span.running))
    kv = f", KV {_range(list(span.kv), lambda v: f'{v * 100:.0f}')}%" if span.kv else ""
    pre_text = f", {span.pre} preemptions" if span.pre else ""
    return (
        f"  {lines:<16} {clock:<18} engine {a.engine:<4} {span.bottleneck:<12} "
        f"x{span.n:<3} running {running}, {wait}{kv}{pre_text}"
    )


def render_report(name: str, an: LogAnalyzer, summary: Summary, skipped: int, skipped_lines: list[int]) -> str:
    """The report; ``skipped`` incomplete records were dropped, the first of them at ``skipped_lines``."""
    out = [f"kvwatch logs: {name}", *_header(an, summary, skipped, skipped_lines), ""]
    out.append(
        "Timeline (consecutive records in the same state; throughput is vLLM's interval average, the rest instants):"
    )
    out += ["  ..." if span is None else _span_line(span) for span in summary.shown_spans()]
    out += ["", *_dominant_lines(summary), "", *_evidence_lines(summary), "", "What the log could not tell:"]
    out += [f"  - {x}" for x in an.limits()]
    return "\n".join(out)


def _header(an: LogAnalyzer, summary: Summary, skipped: int, skipped_lines: list[int]) -> list[str]:
    """The server's start-up, and which records the log holds."""
    out = []
    if an.runs > 1:
        starts = [str(c.start_line) for c in an.configs if c.start_line is not None][:5]
        shown = ", ".join(starts) + (f", ... {an.config.start_line}" if an.runs_started > 5 else "")
        out.append(
            f"the server started {an.runs_started} times in this log (lines {shown}); "
            "what follows describes the last run's start-up"
        )
    out += [f"  {line}" for line in an.describe_config()]
    engines = len(summary.by_engine)
    first, last = summary.first, summary.last
    assert first is not None and last is not None  # the report is made only when records were read
    n = skipped
    out.append(
        f"{summary.count} stats records from {engines} engine{'s' if engines > 1 else ''} "
        f"(lines {first.line}-{last.line}"
        + (f", {first.clock} to {last.clock}" if first.clock and last.clock else "")
        + ")"
        + (
            f"; {n} incomplete stats {'fragment' if n == 1 else 'fragments'} skipped "
            f"(line{'' if n == 1 else 's'} {', '.join(map(str, skipped_lines[:10]))}" + (" ..." if n > 10 else "") + ")"
            if n
            else ""
        )
    )
    return out


def _dominant_of(seen: Counter[Bottleneck]) -> Bottleneck:
    limits = [b for b in seen if b in LIMITS]
    if limits:
        return max(limits, key=lambda b: (seen[b], Bottleneck(b).severity))
    # no limit bound: whichever of "requests waited, none named" and "served, no queue" held more records
    unnamed = [b for b in (Bottleneck.UNDETERMINED, Bottleneck.NONE) if seen.get(b)]
    return max(unnamed, key=seen.__getitem__) if unnamed else Bottleneck.IDLE


def _dominant_lines(summary: Summary) -> list[str]:
    seen = summary.seen
    dom = _dominant_of(seen)
    waited = sum(summary.waited.values())
    detail = f"{seen[dom]} of {summary.count} records"
    if waited and dom in LIMITS:
        detail += f"; {summary.waited[dom]} of the {waited} records with requests waiting"
    out = [f"Dominant bottleneck: {dom} ({detail})"]
    if len(summary.by_engine) > 1:
        for eng in sorted(summary.by_engine):
            mine = summary.by_engine[eng]
            out.append(f"  engine {eng}: {_dominant_of(mine)} ({sum(mine.values())} records)")
    others = ", ".join(f"{b} x{n}" for b, n in seen.most_common() if b != dom)
    if others:
        out.append(f"  also seen: {others}")
    return out


def _evidence_lines(summary: Summary) -> list[str]:
    """The dominant state's longest queue: the core's evidence, then what the log adds, then the advice."""
    dom = _dominant_of(summary.seen)
    best = summary.best.get(dom) or summary.best_any
    assert best is not None  # the report is made only when records were read
    rec, d = best.record, best.diagnosis
    where = f"line {rec.line}" + (f", {rec.clock}" if rec.clock else "") + f", engine {rec.engine}"
    out = [f"Evidence ({where}" + (", the longest queue" if rec.requests_waiting else "") + "):"]
    out += [f"  - {e}" for e in (*d.evidence, *best.notes)]
    if d.recommendations:
        out.append("Recommendations:")
        out += [f"  - {x.action}: {x.why}" for x in d.recommendations]
    else:
        out.append("Recommendations: none (no limit binds)")
    return out
