"""The readable report: what the server was, a timeline of states, the dominant bottleneck, what to change."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvwatch.catalog import Bottleneck
from kvwatch.logs.analyze import LogAnalyzer, RecordResult

__all__ = ["dominant", "render_report", "render_row"]

LIMITS = (Bottleneck.KV_CACHE, Bottleneck.MAX_NUM_SEQS, Bottleneck.TOKEN_BUDGET, Bottleneck.STALLED)


def dominant(results: list[RecordResult]) -> Bottleneck:
    """The limit that bound most often (ties: the more severe); else none / idle."""
    seen = Counter(r.diagnosis.bottleneck for r in results)
    limits = [b for b in seen if b in LIMITS]
    if limits:
        return max(limits, key=lambda b: (seen[b], Bottleneck(b).severity))
    if seen.get(Bottleneck.NONE):
        return Bottleneck.NONE
    return Bottleneck.IDLE


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


def _spans(results: list[RecordResult]) -> list[list[RecordResult]]:
    spans: list[list[RecordResult]] = []
    last: dict[str, list[RecordResult]] = {}
    for r in results:
        cur = last.get(r.record.engine)
        if cur is not None and cur[-1].diagnosis.bottleneck == r.diagnosis.bottleneck:
            cur.append(r)
            continue
        cur = [r]
        spans.append(cur)
        last[r.record.engine] = cur
    return spans


def _span_line(span: list[RecordResult]) -> str:
    a, b = span[0].record, span[-1].record
    lines = f"line {a.line}" if a is b else f"lines {a.line}-{b.line}"
    clock = (a.clock or "") if a is b else (f"{a.clock}-{b.clock}" if a.clock and b.clock else "")
    waiting = [r.record.requests_waiting for r in span]
    wait = (
        f"waiting {waiting[0]}"
        if len(set(waiting)) == 1
        else f"waiting {waiting[0]}->{waiting[-1]} (max {max(waiting)})"
    )
    running = _range([r.record.requests_running for r in span])
    kvs = [r.record.kv_cache_usage_ratio for r in span if r.record.kv_cache_usage_ratio is not None]
    kv = f", KV {_range(kvs, lambda v: f'{v * 100:.0f}')}%" if kvs else ""
    pre = sum(r.preemptions or 0 for r in span)
    pre_text = f", {pre} preemptions" if pre else ""
    n = len(span)
    return (
        f"  {lines:<16} {clock:<18} engine {a.engine:<4} {span[0].diagnosis.bottleneck:<12} "
        f"x{n:<3} running {running}, {wait}{kv}{pre_text}"
    )


def render_report(name: str, an: LogAnalyzer, skipped: list[int], max_spans: int = 60) -> str:
    results = an.results
    out = [f"kvwatch logs: {name}", *_header(an, skipped), ""]
    out.append(
        "Timeline (consecutive records in the same state; throughput is vLLM's interval average, the rest instants):"
    )
    spans = _spans(results)
    shown: Sequence[list[RecordResult] | None] = (
        spans if len(spans) <= max_spans else [*spans[: max_spans // 2], None, *spans[-max_spans // 2 :]]
    )
    out += ["  ..." if span is None else _span_line(span) for span in shown]
    out += ["", *_dominant_lines(results), "", *_evidence_lines(results), "", "What the log could not tell:"]
    out += [f"  - {x}" for x in an.limits()]
    return "\n".join(out)


def _header(an: LogAnalyzer, skipped: list[int]) -> list[str]:
    """The server's start-up, and which records the log holds."""
    results, out = an.results, []
    if len(an.configs) > 1:
        starts = [str(c.start_line) for c in an.configs if c.start_line is not None]
        shown = ", ".join(starts[:5]) + (f", ... {starts[-1]}" if len(starts) > 5 else "")
        out.append(
            f"the server started {len(starts)} times in this log (lines {shown}); "
            "what follows describes the last run's start-up"
        )
    out += [f"  {line}" for line in an.describe_config()]
    engines = sorted({r.record.engine for r in results})
    first, last = results[0].record, results[-1].record
    out.append(
        f"{len(results)} stats records from {len(engines)} engine{'s' if len(engines) > 1 else ''} "
        f"(lines {first.line}-{last.line}"
        + (f", {first.clock} to {last.clock}" if first.clock and last.clock else "")
        + ")"
        + (
            f"; {len(skipped)} incomplete stats {'fragment' if len(skipped) == 1 else 'fragments'} skipped "
            f"(line{'' if len(skipped) == 1 else 's'} {', '.join(map(str, skipped[:10]))}"
            + (" ..." if len(skipped) > 10 else "")
            + ")"
            if skipped
            else ""
        )
    )
    return out


def _dominant_lines(results: list[RecordResult]) -> list[str]:
    dom = dominant(results)
    seen = Counter(r.diagnosis.bottleneck for r in results)
    waited = [r for r in results if r.record.requests_waiting > 0]
    waited_dom = sum(1 for r in waited if r.diagnosis.bottleneck == dom)
    detail = f"{seen[dom]} of {len(results)} records"
    if waited and dom in LIMITS:
        detail += f"; {waited_dom} of the {len(waited)} records with requests waiting"
    out = [f"Dominant bottleneck: {dom} ({detail})"]
    engines = sorted({r.record.engine for r in results})
    if len(engines) > 1:
        for eng in engines:
            mine = [r for r in results if r.record.engine == eng]
            out.append(f"  engine {eng}: {dominant(mine)} ({len(mine)} records)")
    others = ", ".join(f"{b} x{n}" for b, n in seen.most_common() if b != dom)
    if others:
        out.append(f"  also seen: {others}")
    return out


def _evidence_lines(results: list[RecordResult]) -> list[str]:
    """The dominant state's longest queue: the core's evidence, then what the log adds, then the advice."""
    dom = dominant(results)
    pick = [r for r in results if r.diagnosis.bottleneck == dom] or results
    best = max(pick, key=lambda r: (r.record.requests_waiting, r.record.line))
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
