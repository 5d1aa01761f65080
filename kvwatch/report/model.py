"""The report as data: pure functions from a ``Timeline`` and benchmark ``Stage``s to one JSON-able dict.

Every figure here is computed from the full timeline (never from what the HTML draws, which is downsampled):
the bottleneck strip's shares and order, per stage the verdicts seen while it ran and the limit that bound
(``ReportThresholds.binding_share``), what to change (the diagnoses' own recommendations during the stage),
the knee against the SLOs given, and the cautions a reader of the figures must know.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from kvwatch import __version__
from kvwatch.catalog import Bottleneck, ReportThresholds
from kvwatch.report.bench import LATENCIES, Stage
from kvwatch.report.source import Timeline

__all__ = ["Slo", "build_report", "iso", "stage_rows", "strip_segments"]

# Verdicts that are no limit: a stage that only saw these has nothing binding it.
_NOT_LIMITS = frozenset((Bottleneck.NONE, Bottleneck.IDLE))


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_p99: float | None = None  # seconds
    itl_p99: float | None = None

    @property
    def given(self) -> bool:
        return self.ttft_p99 is not None or self.itl_p99 is not None


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def strip_segments(tl: Timeline, th: ReportThresholds) -> list[list]:
    """``[start, end, bottleneck]`` runs of the target's verdict; a gap in the scrapes ends a run."""
    gap = th.gap_intervals * tl.interval
    ts, names, up = tl.target["t"], tl.target["bottleneck"], tl.target["up"]
    segs: list[list] = []
    for i, t in enumerate(ts):
        if up[i] == 0:
            continue  # a failed scrape: the strip shows a gap (the page's strip shows "unreachable" live)
        nxt = ts[i + 1] if i + 1 < len(ts) else t + tl.interval
        end = min(nxt, t + gap)
        if segs and segs[-1][2] == names[i] and segs[-1][1] >= t - 1e-6:
            segs[-1][1] = end
        else:
            segs.append([t, end, names[i]])
    return segs


def _shares(segs: list[list]) -> dict[str, float]:
    total = sum(b - a for a, b, _ in segs)
    share: Counter[str] = Counter()
    for a, b, name in segs:
        share[name] += b - a
    return {k: round(v / total, 4) for k, v in share.most_common()} if total > 0 else {}


def gaps(tl: Timeline, th: ReportThresholds) -> list[dict]:
    """Spans with no good scrape: scrapes further apart than ``gap_intervals``, or failed ones (history)."""
    out = []
    ts, up = tl.target["t"], tl.target["up"]
    good = [t for t, u in zip(ts, up, strict=True) if u != 0]
    for a, b in zip(good, good[1:], strict=False):
        if b - a > th.gap_intervals * tl.interval:
            out.append({"start": a, "end": b, "seconds": round(b - a, 3)})
    return out


def _in(ts: list[float], start: float, end: float) -> range:
    lo = next((i for i, t in enumerate(ts) if t >= start), len(ts))
    hi = next((i for i in range(len(ts) - 1, -1, -1) if ts[i] <= end), -1)
    return range(lo, hi + 1)


def _mean(xs: list) -> float | None:
    vs = [x for x in xs if x is not None]
    return round(sum(vs) / len(vs), 4) if vs else None


def _peak(xs: list) -> float | None:
    vs = [x for x in xs if x is not None]
    return max(vs) if vs else None


def _observed(tl: Timeline, stage: Stage) -> dict:
    """What kvwatch measured while the stage ran: sums over engines of means (requests), peaks (KV, queue)."""
    running, waiting, kv, hit, prompt, gen = 0.0, 0.0, [], [], 0.0, 0.0
    seen = False
    for e in tl.engines:
        s = e["series"]
        idx = _in(s["t"], stage.start, stage.end)
        if not idx:
            continue
        seen = True
        col = {f: [s[f][i] for i in idx] for f in s}
        running += _mean(col["requests_running"]) or 0.0
        waiting = max(waiting, _peak(col["requests_waiting"]) or 0.0)
        kv.append(_peak(col["kv_cache_usage_ratio"]))
        hit.append(_mean(col["prefix_cache_hit_ratio"]))
        prompt += _mean(col["prompt_tokens_per_second"]) or 0.0
        gen += _mean(col["generation_tokens_per_second"]) or 0.0
    if not seen:
        return {}
    return {
        "requests_running_mean": round(running, 2),
        "requests_waiting_max": waiting,
        "kv_cache_usage_ratio_max": _peak(kv),
        "prefix_cache_hit_ratio_mean": _mean(hit),
        "prompt_tokens_per_second_mean": round(prompt, 2),
        "generation_tokens_per_second_mean": round(gen, 2),
    }


def _advice(tl: Timeline, stage: Stage, binding: str) -> dict:
    """The diagnoses' recommendations while ``binding`` held during the stage, most frequent first, with the
    last such moment's evidence."""
    moments = [m for m in tl.moments if stage.start <= m.t <= stage.end and m.bottleneck == binding]
    if not moments:
        return {"recommendations": [], "evidence": []}
    count: Counter[str] = Counter(a for m in moments for a, _, _ in m.recommendations)
    said = {a: (flag, w) for m in moments for a, flag, w in m.recommendations}  # the latest of each action
    recs = [{"action": a, "flag": said[a][0], "why": said[a][1], "moments": n} for a, n in count.most_common()]
    return {"recommendations": recs, "evidence": list(moments[-1].evidence)}


def stage_verdict(tl: Timeline, stage: Stage, th: ReportThresholds) -> dict:
    ts = tl.target["t"]
    idx = [i for i in _in(ts, stage.start, stage.end) if tl.target["up"][i] != 0]
    duration = max(stage.end - stage.start, 1e-9)
    covered = min(tl.end, stage.end) - max(tl.start, stage.start)
    coverage = 0.0 if not idx else max(0.0, min(1.0, (covered + tl.interval) / duration))
    out: dict = {"coverage": round(coverage, 3), "snapshots": len(idx)}
    if not idx:
        return {**out, "binding": None, "binding_share": None, "verdicts": {}, "recommendations": [], "evidence": []}
    seen = Counter(tl.target["bottleneck"][i] for i in idx)
    verdicts = {k: round(n / len(idx), 4) for k, n in seen.most_common()}
    limits = [(n, k) for k, n in seen.items() if Bottleneck(k) not in _NOT_LIMITS]
    # undetermined names no limit, so it never outvotes one that was named: the e2e sweep's 16-client stage read
    # undetermined in 7 of 15 snapshots (the queue's first seconds, before a Running plateau can be told) and
    # max_num_seqs in the 6 after
    named = [(n, k) for n, k in limits if k != Bottleneck.UNDETERMINED]
    n, top = max(named, key=lambda x: (x[0], Bottleneck(x[1]).severity)) if named else (0, None)
    queued = sum(n for n, _ in limits) / len(idx)  # snapshots where requests waited (or worse)
    if top is not None and n / len(idx) >= th.binding_share:
        binding, share = top, verdicts[top]
    elif queued >= th.binding_share:
        # Requests waited in a binding share of the stage, but no one limit held it: undetermined, never "none"
        # while requests wait.
        binding, share = str(Bottleneck.UNDETERMINED), round(queued, 4)
    else:
        binding, share = str(Bottleneck.NONE), round(sum(verdicts.get(str(b), 0.0) for b in _NOT_LIMITS), 4)
    return {
        **out,
        "binding": binding,
        "binding_share": share,
        "verdicts": verdicts,
        **_advice(tl, stage, binding),
        "observed": _observed(tl, stage),
    }


def _meets(stage: Stage, slo: Slo) -> tuple[bool | None, str]:
    """(met, why): None when a latency the SLO needs is not in the result."""
    broken, unknown = [], []
    for metric, limit in (("ttft", slo.ttft_p99), ("itl", slo.itl_p99)):
        if limit is None:
            continue
        v = stage.p99_seconds(metric)
        if v is None:
            unknown.append(f"p99_{metric}_ms")
        elif v > limit:
            broken.append(f"{metric.upper()} p99 {v:.3g} s > {limit:g} s")
    if broken:
        return False, "; ".join(broken)
    if unknown:
        return None, "the result has no " + ", ".join(unknown)
    return True, "within the SLO"


def knee(rows: list[dict], stages: list[Stage], slo: Slo) -> dict | None:
    """The highest-load stage within the SLO, the limit binding there, and the first stage that broke it."""
    if not slo.given or not stages:
        return None
    by_name = {r["name"]: r for r in rows}
    ordered = sorted(stages, key=lambda s: (s.load, s.start))
    met = [(s, *_meets(s, slo)) for s in ordered]
    for s, ok, why in met:
        by_name[s.name]["slo"] = {"met": ok, "why": why}
    passed = [s for s, ok, _ in met if ok]
    failed = [(s, why) for s, ok, why in met if ok is False]
    best = passed[-1] if passed else None
    first_broken = failed[0] if failed else None
    return {
        "slo": {"ttft_p99_seconds": slo.ttft_p99, "itl_p99_seconds": slo.itl_p99},
        "highest_met": best.name if best else None,
        "highest_met_load": best.load_label if best else None,
        "binding_there": by_name[best.name]["binding"] if best else None,
        "first_broken": first_broken[0].name if first_broken else None,
        "first_broken_load": first_broken[0].load_label if first_broken else None,
        "broken_by": first_broken[1] if first_broken else None,
    }


def stage_rows(tl: Timeline, stages: list[Stage], th: ReportThresholds) -> list[dict]:
    rows = []
    for s in sorted(stages, key=lambda s: (s.load, s.start)):
        rows.append(
            {
                "name": s.name,
                "load": s.load_label,
                "concurrency": s.concurrency,
                "request_rate": s.request_rate,
                "start": s.start,
                "end": s.end,
                "timed_by": s.timed_by,
                "num_prompts": s.num_prompts,
                "completed": s.completed,
                "failed": s.failed,
                "request_throughput": s.request_throughput,
                "output_throughput": s.output_throughput,
                "total_token_throughput": s.total_token_throughput,
                "latency_ms": {m: s.latency_ms[m] for m in LATENCIES if m in s.latency_ms},
                "seed": s.seed,
                **stage_verdict(tl, s, th),
            }
        )
    return rows


def cautions(tl: Timeline, stages: list[Stage], rows: list[dict], th: ReportThresholds) -> list[dict]:
    out = []

    def say(kind: str, text: str, stage: str | None = None) -> None:
        out.append({"kind": kind, "stage": stage, "text": text})

    for r in rows:
        if r["snapshots"] == 0:
            say(
                "outside",
                f"{r['name']} ran {iso(r['start'])} to {iso(r['end'])} ({r['timed_by']}), outside the "
                f"recording ({iso(tl.start)} to {iso(tl.end)}): no verdict for it",
                r["name"],
            )
        elif r["coverage"] < th.min_coverage:
            say(
                "outside",
                f"only {r['coverage']:.0%} of {r['name']} lies in the recording: its verdict covers that part",
                r["name"],
            )
        hit = (r.get("observed") or {}).get("prefix_cache_hit_ratio_mean")
        if hit is not None and hit >= th.prefix_cache_caution:
            say(
                "prefix_cache",
                f"{r['name']}: {hit:.0%} of prompt tokens were prefix-cache hits: reused prompts "
                "inflate its throughput (vary --seed, or reset the prefix cache / restart between runs)",
                r["name"],
            )
    seeds: dict[str, list[str]] = {}
    for s in stages:
        if s.seed is not None:
            seeds.setdefault(s.seed, []).append(s.name)
    for seed, names in seeds.items():
        if len(names) > 1:
            say(
                "shared_seed",
                f"{', '.join(names)} share seed {seed}: the same prompts again, served partly from the prefix cache",
            )
    if tl.skipped:
        say("skipped", f"{len(tl.skipped)} snapshot(s) could not be read and were skipped (first: {tl.skipped[0]})")
    for g in gaps(tl, th):
        say("gap", f"no scrape from {iso(g['start'])} to {iso(g['end'])} ({g['seconds']:g} s)")
    for t in tl.restarts:
        within = [r["name"] for r in rows if r["start"] <= t <= r["end"]]
        where = f" during {', '.join(within)}" if within else ""
        say(
            "restart",
            f"counters went back at {iso(t)}{where}: vLLM restarted (an empty prefix cache, lost "
            "requests); figures across it mix two servers",
        )
    if tl.kind == "history":
        say(
            "history",
            "read from /api/v1/history: no evidence or recommendations, restarts and unreadable "
            "scrapes are not visible; record with `kvwatch record` for those",
        )
    return out


def build_report(
    tl: Timeline,
    stages: list[Stage],
    slo: Slo = Slo(),
    th: ReportThresholds | None = None,
    thresholds: dict | None = None,
) -> dict:
    th = th or ReportThresholds()
    segs = strip_segments(tl, th)
    order = [name for i, (_, _, name) in enumerate(segs) if i == 0 or segs[i - 1][2] != name]
    rows = stage_rows(tl, stages, th)
    return {
        "kvwatch_version": __version__,
        "source": {
            "kind": tl.kind,
            "label": tl.label,
            "start": tl.start,
            "end": tl.end,
            "seconds": round(tl.end - tl.start, 3),
            "snapshots": len(tl.target["t"]),
            "skipped": len(tl.skipped),
            "interval": round(tl.interval, 4),
            "engines": [{"model_name": e["model_name"], "engine": e["engine"]} for e in tl.engines],
        },
        "thresholds": thresholds or {},
        "limits": tl.limits,
        "strip": {"shares": _shares(segs), "order": order},
        "stages": rows,
        "knee": knee(rows, stages, slo),
        "cautions": cautions(tl, stages, rows, th),
        "restarts": tl.restarts,
        "gaps": gaps(tl, th),
    }
