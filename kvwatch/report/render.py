"""The report model as Markdown (tickets, CI), JSON, or one self-contained HTML file.

The HTML is the status page's look and charts: ``kvwatch/static/page.css`` and ``charts.js`` (the very code
the page draws with), inlined with the report's own ``report.js``, ``report.css`` and the data as JSON. No
network: every script and style is in the file, allowed by hash in its Content-Security-Policy, and nothing
from a target (model names, evidence, labels) is ever markup: Python escapes it, the scripts write text nodes.
The series are downsampled for drawing (``downsample``: at most ``MAX_POINTS`` per series, each bucket's peak
kept so a spike stays visible); every figure in the tables comes from the full timeline (``model``).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from importlib import resources

from kvwatch.catalog import Bottleneck, ReportThresholds
from kvwatch.page import page_config
from kvwatch.report.model import iso, strip_segments
from kvwatch.report.source import Timeline

__all__ = ["MAX_POINTS", "downsample", "render_html", "render_json", "render_markdown"]

MAX_POINTS = 720  # per series: more than a chart 1200 px wide can show apart


def render_json(model: dict) -> str:
    return json.dumps(model, indent=1)


def _num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}g}"


def _ms(stats: dict | None) -> str:
    if not stats:
        return "–"
    return " / ".join(_num(stats.get(k)) for k in ("mean", "median", "p99"))


def _label(name: str | None) -> str:
    return "unknown (outside the recording)" if name is None else Bottleneck(name).label


def _limit(v: dict | None) -> str:
    return "unknown" if not v else f"{v['value']} ({v['source']})"


def limit_rows(model: dict) -> list[tuple[str, str]]:
    lim = model["limits"]
    rows = [
        ("max_num_seqs", _limit(lim.get("max_num_seqs"))),
        ("max_num_batched_tokens", _limit(lim.get("max_num_batched_tokens"))),
        ("KV capacity", f"{lim['kv_capacity_tokens']:,} tokens" if lim.get("kv_capacity_tokens") else "unknown"),
        (
            "mean sequence",
            f"{_num(lim['mean_sequence_tokens'])} tokens" if lim.get("mean_sequence_tokens") else "unknown",
        ),
        ("est. max concurrency", _num(lim.get("estimated_max_concurrency"))),
        ("max_model_len", str(lim["max_model_len"]) if lim.get("max_model_len") else "unknown"),
    ]
    if lim.get("cache_dtype"):
        rows.append(("KV dtype", str(lim["cache_dtype"])))
    if lim.get("enable_prefix_caching") is not None:
        rows.append(("prefix caching", "on" if lim["enable_prefix_caching"] else "off"))
    th = model.get("thresholds") or {}
    if th:
        rows.append(
            ("KV thresholds", f"admission stall {th['admission_stall']:.0%}, preemption {th['preemption_risk']:.0%}")
        )
    rows.append(("kvwatch", model["kvwatch_version"]))
    return rows


def knee_sentence(k: dict | None) -> str:
    if k is None:
        return "No SLO given (--slo-ttft-p99 / --slo-itl-p99): no knee."
    slo = ", ".join(
        f"{n} p99 <= {v:g} s"
        for n, v in (("TTFT", k["slo"]["ttft_p99_seconds"]), ("ITL", k["slo"]["itl_p99_seconds"]))
        if v is not None
    )
    if k["highest_met"] is None:
        head = f"No stage met {slo}."
    else:
        there = (
            "no verdict: outside the recording" if k["binding_there"] is None else f"{_label(k['binding_there'])} bound"
        )
        head = f"The highest load within {slo}: {k['highest_met_load']} ({k['highest_met']}), where {there}."
    tail = (
        f" First broken at {k['first_broken_load']} ({k['first_broken']}): {k['broken_by']}."
        if k["first_broken"]
        else " No stage broke it."
    )
    return head + tail


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(model: dict) -> str:
    src = model["source"]
    out = [
        f"# kvwatch report: {_md_escape(src['label'])}",
        "",
        f"{src['kind']} {iso(src['start'])} to {iso(src['end'])} ({src['seconds']:g} s, {src['snapshots']} "
        f"snapshots, {src['skipped']} skipped), kvwatch {model['kvwatch_version']}",
        "",
        "## Verdict over time",
        "",
        " · ".join(f"{Bottleneck(k).label} {v:.0%}" for k, v in model["strip"]["shares"].items()),
        "",
        "In order: " + " → ".join(Bottleneck(k).label for k in model["strip"]["order"]),
        "",
    ]
    if model["stages"]:
        out += [
            "## Stages",
            "",
            "| stage | load | req/s | output tok/s | TTFT ms mean/median/p99 | TPOT ms | ITL ms "
            "| bound by (share) | what to change |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in model["stages"]:
            lat = r["latency_ms"]
            bound = _label(r["binding"]) + (f" ({r['binding_share']:.0%})" if r["binding_share"] is not None else "")
            change = "; ".join(f"`{x['flag']}`: {x['why']}" for x in r["recommendations"]) or "–"
            out.append(
                f"| {_md_escape(r['name'])} | {r['load']} | {_num(r['request_throughput'])} | "
                f"{_num(r['output_throughput'])} | {_ms(lat.get('ttft'))} | {_ms(lat.get('tpot'))} | "
                f"{_ms(lat.get('itl'))} | {bound} | {_md_escape(change)} |"
            )
        out += ["", "## Knee", "", knee_sentence(model["knee"]), ""]
    out += ["## Cautions", ""]
    out += [f"- {_md_escape(c['text'])}" for c in model["cautions"]] or ["None."]
    out += ["", "## Limits and configuration", ""]
    out += [f"- {k}: {_md_escape(v)}" for k, v in limit_rows(model)]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------ HTML


def downsample(cols: dict[str, list], max_points: int = MAX_POINTS) -> dict[str, list]:
    """At most ``max_points`` rows: rows bucketed by position, each bucket's first time and each field's peak
    (a chart of peaks shows every spike the full series has; the figures never come from here)."""
    n = len(cols["t"])
    if n <= max_points:
        return cols
    step = n / max_points
    out: dict[str, list] = {f: [] for f in cols}
    for b in range(max_points):
        lo, hi = int(b * step), int((b + 1) * step)
        out["t"].append(cols["t"][lo])
        for f, col in cols.items():
            if f == "t":
                continue
            vs = [v for v in col[lo:hi] if v is not None]
            if f == "bottleneck":
                out[f].append(col[hi - 1])
            else:
                out[f].append(max(vs) if vs else None)
    return out


def _static(name: str) -> str:
    return resources.files("kvwatch").joinpath("static", name).read_text(encoding="utf-8")


def _json_script(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c").replace("&", "\\u0026")


def _sha(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _table(head: list[str], rows: list[list[str]], cls: str, caption: str) -> str:
    th = "".join(f'<th scope="col">{h}</th>' for h in head)
    labels = [_e(h.replace("<br>", " ")) for h in head]
    body = "".join(
        "<tr>" + "".join(f'<td data-label="{k}">{c}</td>' for k, c in zip(labels, r, strict=True)) + "</tr>"
        for r in rows
    )
    return (
        f'<div class="table-wrap"><table class="{cls}"><caption>{caption}</caption><thead><tr>{th}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _badge(name: str | None) -> str:
    if name is None:
        return '<span class="muted">no verdict: outside the recording</span>'
    b = Bottleneck(name)
    return f'<span class="rbadge" data-bottleneck="{_e(b)}">{_e(b.label)}</span>'


def _stages_html(model: dict) -> str:
    if not model["stages"]:
        return '<p class="empty-note">No benchmark result given (--bench FILE): the recording alone.</p>'
    rows = []
    for r in model["stages"]:
        lat = r["latency_ms"]
        share = f" {r['binding_share']:.0%} of the stage" if r["binding_share"] is not None else ""
        recs = "".join(
            f'<li data-action="{_e(x["action"])}"><code>{_e(x["flag"])}</code>: {_e(x["why"])}</li>'
            for x in r["recommendations"]
        )
        ev = "".join(f"<li>{_e(x)}</li>" for x in r["evidence"][:4])
        change = (f"<ol>{recs}</ol>" if recs else "nothing to change at this load") + (
            f"<details><summary>evidence</summary><ul>{ev}</ul></details>" if ev else ""
        )
        slo = r.get("slo")
        slo_cell = "–" if slo is None else ("met" if slo["met"] else "unknown" if slo["met"] is None else "broken")
        rows.append(
            [
                _e(r["name"]),
                _e(r["load"]),
                _num(r["request_throughput"]),
                _num(r["output_throughput"]),
                _ms(lat.get("ttft")),
                _ms(lat.get("tpot")),
                _ms(lat.get("itl")),
                _badge(r["binding"]) + share,
                _e(slo_cell),
                change,
            ]
        )
    head = [
        "stage",
        "load",
        "req/s",
        "output tok/s",
        "TTFT ms<br>mean / median / p99",
        "TPOT ms",
        "ITL ms",
        "bound by (share)",
        "SLO",
        "what to change",
    ]
    return _table(head, rows, "stages", "Per benchmark stage, lightest load first")


def _report_config(model: dict, tl: Timeline, settings) -> dict:
    cfg = page_config(settings, [tl.label])
    cfg["interval"] = tl.interval
    segs = strip_segments(tl, ReportThresholds())
    cfg["report"] = {
        "start": tl.start,
        "end": tl.end,
        "segments": segs if len(segs) <= 4 * MAX_POINTS else _merge_short(segs, (tl.end - tl.start) / (4 * MAX_POINTS)),
        "engines": [
            {**{k: e[k] for k in ("model_name", "engine")}, "series": downsample(e["series"])} for e in tl.engines
        ],
        "stages": [{"name": r["name"], "start": r["start"], "end": r["end"]} for r in model["stages"]],
    }
    return cfg


def _merge_short(segs: list[list], min_seconds: float) -> list[list]:
    """Runs shorter than ``min_seconds`` folded into the previous one, for drawing only."""
    out: list[list] = []
    for s in segs:
        if out and (s[1] - s[0] < min_seconds or out[-1][2] == s[2]) and out[-1][1] >= s[0] - 1e-6:
            out[-1][1] = s[1]
        else:
            out.append(list(s))
    return out


def render_html(model: dict, tl: Timeline, settings) -> str:
    css = _static("page.css") + _static("report.css")
    scripts = [_static("charts.js"), _static("report.js")]
    csp = (
        "default-src 'none'; img-src data:; style-src "
        + _sha(css)
        + "; script-src "
        + " ".join(_sha(s) for s in scripts)
        + "; base-uri 'none'; form-action 'none'"
    )
    src = model["source"]
    cautions = "".join(f'<li data-kind="{_e(c["kind"])}">{_e(c["text"])}</li>' for c in model["cautions"])
    limits = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in limit_rows(model))
    shares = " · ".join(f"{_e(Bottleneck(k).label)} {v:.0%}" for k, v in model["strip"]["shares"].items())
    body = f"""<header class="top"><div class="brand"><h1>kvwatch report <span class="version">{_e(model["kvwatch_version"])}</span></h1>
<p class="tagline">{_e(src["label"])} · {_e(iso(src["start"]))} to {_e(iso(src["end"]))} ({src["seconds"]:g} s, {src["snapshots"]} snapshots, {src["skipped"]} skipped)</p></div></header>
<main id="main">
<section aria-labelledby="knee-title" class="report-section" id="knee"><h2 id="knee-title">Knee</h2><p data-role="knee">{_e(knee_sentence(model["knee"]))}</p></section>
<section aria-labelledby="stages-title" class="report-section" id="stages"><h2 id="stages-title">Benchmark stages</h2>{_stages_html(model)}</section>
<section aria-labelledby="cautions-title" class="report-section" id="cautions"><h2 id="cautions-title">Cautions</h2>{f'<ul class="cautions">{cautions}</ul>' if cautions else '<p class="empty-note">None.</p>'}</section>
<section aria-labelledby="charts-title" class="report-section"><h2 id="charts-title">Over time</h2><p class="strip-total" data-role="shares">Share of the recording: {shares}</p><div id="charts"></div>
<noscript><p>The charts need JavaScript; every figure above is in the tables.</p></noscript></section>
<section aria-labelledby="limits-title" class="report-section" id="limits"><h2 id="limits-title">Limits and configuration</h2><dl class="limits">{limits}</dl></section>
</main>
<footer class="foot"><p>kvwatch {_e(model["kvwatch_version"])} · one self-contained file: nothing is loaded from elsewhere</p></footer>"""
    config = _json_script(_report_config(model, tl, settings))
    return (
        f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_e(csp)}">\n'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<title>kvwatch report: {_e(src["label"])}</title>\n<link rel="icon" href="data:,">\n'
        f"<style>{css}</style>\n"
        f'<script type="application/json" id="kvwatch-config">{config}</script>\n</head>\n<body>\n{body}\n'
        + "".join(f"<script>{s}</script>\n" for s in scripts)
        + "</body>\n</html>\n"
    )
