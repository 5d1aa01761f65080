/* kvwatch's charts: the status page's (page.js) and the report's (report.js), one code.
 *
 * window.kvwatchCharts(CFG) returns the DOM helpers, the formats and the chart functions, bound to CFG (the
 * catalogue's words and colours, the thresholds, the scrape interval) as kvwatch embeds it in #kvwatch-config.
 * Charts are SVG drawn here (no library). Text from vLLM or the target (model names, URLs, evidence) only ever
 * goes in as text nodes, never as HTML.
 *
 * A view is {now, span}: the charts show [now - span, now]. The page labels ticks as time ago; a view with
 * `clock: true` (the report) labels them with clock times, and its `bands` ([{start, end, label}]) shade
 * spans (benchmark stages) behind every chart. A strip spec may carry `segments` ([start, end, bottleneck])
 * computed by kvwatch instead of the rows it would build them from.
 */
"use strict";
window.kvwatchCharts = function (CFG) {
  const BOTTLENECKS = new Map(CFG.bottlenecks.map((b) => [b.name, b]));
  // A series with no sample for this long has a gap, not a line across it.
  const GAP_SECONDS = Math.max(3 * CFG.interval, 3);
  const SVGNS = "http://www.w3.org/2000/svg";
  const TICK_STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];
  // ------------------------------------------------------------------------------------------ DOM helpers

  function build(ns, tag, attrs, kids) {
    const el = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = String(v);
      else el.setAttribute(k === "className" ? "class" : k, v === true ? "" : String(v));
    }
    for (const kid of (kids || []).flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  const h = (tag, attrs, ...kids) => build(null, tag, attrs, kids);
  const s = (tag, attrs, ...kids) => build(SVGNS, tag, attrs, kids);

  function bottleneckInfo(name) {
    return BOTTLENECKS.get(name) || { name: name, label: String(name), meaning: "", severity: -1, colour: "#ffffff", ink: "#111111" };
  }

  // ------------------------------------------------------------------------------------------ formats

  function num(v) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a >= 1000) return Math.round(v).toLocaleString("en-US");
    if (a >= 100) return v.toFixed(0);
    if (a >= 10) return v.toFixed(1).replace(/\.0$/, "");
    return v.toFixed(2).replace(/\.?0+$/, "") || "0";
  }
  const pct = (v) => (v === null || v === undefined ? "–" : Math.round(v * 100) + "%");
  function secs(v) {
    if (v === null || v === undefined) return "–";
    if (v === 0) return "0 s";
    return v < 1 ? Math.round(v * 1000) + " ms" : num(v) + " s";
  }
  function span(seconds) {
    if (seconds < 90) return Math.round(seconds) + " s";
    if (seconds < 5400) return +(seconds / 60).toFixed(1) + " min";
    return (seconds / 3600).toFixed(1).replace(/\.0$/, "") + " h";
  }
  const clock = (t) => new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });
  const last = (xs) => (xs && xs.length ? xs[xs.length - 1] : null);

  // ------------------------------------------------------------------------------------------ charts

  function charts(series, targetSeries, draws, view) {
    const th = CFG.thresholds;
    const specs = [
      { id: "kv", title: "KV cache usage", fmt: pct, yMax: 1, series: [{ key: "kv_cache_usage_ratio", label: "KV usage", cls: "c1" }],
        lines: [{ y: th.admission_stall, label: "admission stall " + pct(th.admission_stall), cls: "stall", below: true },
          { y: th.preemption_risk, label: "preemption " + pct(th.preemption_risk), cls: "risk" }] },
      { id: "requests", title: "Running and waiting requests", fmt: num, series: [
        { key: "requests_running", label: "running", cls: "c1" }, { key: "requests_waiting", label: "waiting", cls: "c2 d2" },
        { key: "max_num_seqs", label: "max_num_seqs", cls: "c4 d3" }, { key: "estimated_max_concurrency", label: "est. max concurrency", cls: "c3 d4" }] },
      { id: "tokens", title: "Prompt vs generation tokens/s", fmt: num, series: [
        { key: "prompt_tokens_per_second", label: "prompt", cls: "c1" }, { key: "generation_tokens_per_second", label: "generation", cls: "c2 d2" }] },
      { id: "preemptions", title: "Preemptions/s", fmt: num, series: [{ key: "preemptions_per_second", label: "preemptions/s", cls: "c2" }] },
      { id: "ttft", title: "Time to first token, p99", fmt: secs, series: [{ key: "time_to_first_token_seconds_p99", label: "TTFT p99", cls: "c4" }] },
    ];
    // Inter-token latency: in the report's series (the page's history does not keep it).
    if (series && series.inter_token_latency_seconds_p99) specs.push({ id: "itl", title: "Inter-token latency, p99", fmt: secs, series: [{ key: "inter_token_latency_seconds_p99", label: "ITL p99", cls: "c3" }] });
    const figs = specs.map((spec) => {
      spec.cols = series;
      const svg = s("svg", { className: "chart", "data-chart": spec.id, role: "img" });
      draws.push([svg, spec]);
      return h("figure", { "data-chart": spec.id }, h("figcaption", {}, spec.title), svg, legend(spec));
    });
    const strip = { strip: true, cols: view.segments ? null : stripRows(series, targetSeries), segments: view.segments };
    const svg = s("svg", { className: "chart strip", "data-chart": "bottleneck", role: "img" });
    draws.push([svg, strip]);
    strip.summary = h("p", { className: "strip-summary", "data-role": "strip-summary" });
    strip.legend = h("ul", { className: "legend" });
    const stripFig = h("figure", { className: "strip-figure", "data-chart": "bottleneck" }, h("figcaption", {}, "Bottleneck over time"), svg, strip.legend, strip.summary);
    return h("section", { className: "charts" }, h("h4", {}, view.title || "Last " + span(view.span)), stripFig, h("div", { className: "chart-grid" }, figs));
  }

  function legend(spec) {
    return h("ul", { className: "legend" }, spec.series.map((x) => {
      const v = spec.cols ? lastValue(spec.cols[x.key]) : null;
      return h("li", {}, s("svg", { viewBox: "0 0 26 10", "aria-hidden": "true" }, s("line", { x1: 1, y1: 5, x2: 25, y2: 5, class: x.cls })),
        x.label + " ", h("span", { className: "value" }, spec.fmt(v)));
    }));
  }

  function lastValue(col) {
    if (!col) return null;
    for (let i = col.length - 1; i >= 0; i--) if (col[i] !== null) return col[i];
    return null;
  }

  function niceMax(v) {
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  function frame(svg, view) {
    const box = svg.getBoundingClientRect();
    const W = Math.max(220, Math.round(box.width) || 600);
    const H = Math.max(40, Math.round(box.height) || 170);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    const from = view.now - view.span;
    return { W: W, H: H, from: from, x: (x0, x1) => (t) => x0 + ((t - from) / view.span) * (x1 - x0) };
  }

  function tickLabel(seconds) {
    if (seconds < 120) return "−" + seconds + " s";
    if (seconds < 7200) return "−" + +(seconds / 60).toFixed(1) + " min";
    return "−" + +(seconds / 3600).toFixed(1) + " h";
  }

  function clockAxis(svg, view, y, x0, x1) {
    // Clock times at round steps: at most 4 marks, none at the very edges.
    const step = TICK_STEPS.find((t) => view.span / t <= 4) || view.span / 4;
    const from = view.now - view.span;
    const X = (t) => x0 + ((t - from) / view.span) * (x1 - x0);
    for (let t = Math.ceil(from / step) * step; t <= view.now; t += step) {
      const x = X(t);
      if (x - x0 < 24 || x1 - x < 24) continue;
      svg.append(s("text", { x: x, y: y, "text-anchor": "middle" }, clock(t)));
    }
  }

  function bands(svg, view, X, top, bottom) {
    for (const b of view.bands || []) {
      const a = X(Math.max(b.start, view.now - view.span)), z = X(Math.min(b.end, view.now));
      if (z <= a) continue;
      svg.append(s("rect", { class: "band", x: a.toFixed(1), y: top, width: (z - a).toFixed(1), height: bottom - top, "data-band": b.label },
        s("title", {}, b.label)));
    }
  }

  function timeAxis(svg, view, y, x0, x1) {
    if (view.clock) return clockAxis(svg, view, y, x0, x1);
    // "now" at the right, then every `step` seconds back: at most 4 marks, at round times ago.
    const step = TICK_STEPS.find((t) => view.span / t <= 4) || view.span / 4;
    const X = (ago) => x1 - (ago / view.span) * (x1 - x0);
    svg.append(s("text", { x: x1, y: y, "text-anchor": "end" }, "now"));
    for (let ago = step; ago <= view.span + 1e-9; ago += step) {
      const x = X(ago);
      const edge = x - x0 < 24;
      svg.append(s("text", { x: edge ? x0 : x, y: y, "text-anchor": edge ? "start" : "middle" }, tickLabel(ago)));
    }
  }

  function path(ts, vs, X, Y) {
    let d = "";
    let n = 0;
    let prev = null;
    ts.forEach((t, i) => {
      const v = vs[i];
      if (v === null || v === undefined) {
        prev = null;
        return;
      }
      const cmd = prev === null || t - prev > GAP_SECONDS ? "M" : "L";
      d += cmd + X(t).toFixed(1) + " " + Y(v).toFixed(1);
      prev = t;
      n++;
    });
    return { d: d, n: n };
  }

  function drawChart(svg, spec, view) {
    const f = frame(svg, view);
    const m = { l: 48, r: 8, t: 10, b: 18 };
    const x0 = m.l, x1 = f.W - m.r, y0 = f.H - m.b, y1 = m.t;
    const X = f.x(x0, x1);
    const cols = spec.cols || { t: [] };
    let max = spec.yMax || 0;
    for (const x of spec.series) for (const v of cols[x.key] || []) if (v !== null && v > max) max = v;
    const top = spec.yMax || niceMax(max > 0 ? max : 1);
    const Y = (v) => y0 - (Math.min(v, top) / top) * (y0 - y1);
    svg.replaceChildren();
    for (const g of [0, 0.5, 1]) {
      svg.append(s("line", { class: g === 0 ? "axis" : "grid", x1: x0, x2: x1, y1: Y(g * top), y2: Y(g * top) }));
      svg.append(s("text", { x: x0 - 6, y: Y(g * top) + 4, "text-anchor": "end" }, spec.fmt(g * top)));
    }
    timeAxis(svg, view, f.H - 3, x0, x1);
    bands(svg, view, X, y1, y0);
    for (const line of spec.lines || []) {
      svg.append(s("line", { class: "threshold " + line.cls, x1: x0, x2: x1, y1: Y(line.y), y2: Y(line.y) }));
      svg.append(s("text", { class: "threshold-label " + line.cls, x: x0 + 6, y: Y(line.y) + (line.below ? 12 : -4) }, line.label));
    }
    const said = [];
    let points = 0;
    for (const x of spec.series) {
      const p = path(cols.t, cols[x.key] || [], X, Y);
      points += p.n;
      svg.append(s("path", { class: "series " + x.cls, d: p.d, "data-series": x.key, "data-points": p.n }));
      const vals = (cols[x.key] || []).filter((v) => v !== null);
      if (vals.length) said.push(x.label + " now " + spec.fmt(last(vals)) + ", peak " + spec.fmt(Math.max(...vals)));
    }
    if (!points) svg.append(s("text", { class: "empty", x: (x0 + x1) / 2, y: (y0 + y1) / 2, "text-anchor": "middle" }, "no data yet"));
    const lines = (spec.lines || []).map((l) => l.label + " line");
    svg.setAttribute("aria-label", spec.title + ", last " + span(view.span) + ": " + (said.length ? said.join("; ") : "no data yet") + (lines.length ? "; " + lines.join(", ") : ""));
  }

  function stripRows(series, targetSeries) {
    // The engine's bottleneck at each scrape, and the target's while kvwatch could not scrape it.
    const rows = [];
    if (series) series.t.forEach((t, i) => series.bottleneck[i] !== null && rows.push([t, series.bottleneck[i]]));
    if (targetSeries) targetSeries.t.forEach((t, i) => targetSeries.up[i] === 0 && rows.push([t, targetSeries.bottleneck[i]]));
    rows.sort((a, b) => a[0] - b[0]);
    return rows;
  }

  function stripSegments(rows) {
    const segs = [];
    rows.forEach(([t, name], i) => {
      const next = i + 1 < rows.length ? rows[i + 1][0] : t + CFG.interval;
      const end = Math.min(next, t + GAP_SECONDS);
      const prev = last(segs);
      if (prev && prev.name === name && prev.end >= t - 1e-6) prev.end = end;
      else segs.push({ name: name, start: t, end: end });
    });
    return segs;
  }

  function drawStrip(svg, spec, view) {
    const f = frame(svg, view);
    const x0 = 4, x1 = f.W - 4, top = 2, bottom = f.H - 16;
    const X = f.x(x0, x1);
    svg.replaceChildren();
    svg.append(s("rect", { x: x0, y: top, width: x1 - x0, height: bottom - top, fill: "#f3f4f6", stroke: "#9ca3af" }));
    const segs = (spec.segments ? spec.segments.map(([a, b, name]) => ({ start: a, end: b, name: name })) : stripSegments(spec.cols)).filter((g) => g.end > f.from);
    const share = new Map();
    for (const g of segs) {
      const end = Math.min(g.end, view.now); // the last scrape's interval ends at the view's edge, not past it
      const a = X(Math.max(g.start, f.from)), b = X(end);
      const info = bottleneckInfo(g.name);
      share.set(g.name, (share.get(g.name) || 0) + (end - Math.max(g.start, f.from)));
      const rect = s("rect", { x: a.toFixed(1), y: top, width: Math.max(1, b - a).toFixed(1), height: bottom - top, fill: info.colour, "data-bottleneck": g.name },
        s("title", {}, info.label + ", " + clock(g.start) + "–" + clock(g.end)));
      svg.append(rect);
      if (b - a > info.label.length * 6.6 + 10) {
        const label = s("text", { x: ((a + b) / 2).toFixed(1), y: (top + bottom) / 2 + 4, "text-anchor": "middle", class: "segment-label" }, info.label);
        label.style.fill = info.ink; // the catalogue colour's own ink (a stylesheet rule would beat an attribute)
        svg.append(label);
      }
    }
    timeAxis(svg, view, f.H - 3, x0, x1);
    const total = [...share.values()].reduce((a, b) => a + b, 0);
    const ranked = [...share.entries()].sort((a, b) => b[1] - a[1]);
    const summary = ranked.map(([name, t]) => bottleneckInfo(name).label + " " + Math.round((100 * t) / total) + "%").join(" · ");
    spec.summary.textContent = ranked.length ? "Share of the time shown: " + summary : "No diagnosis recorded yet.";
    spec.legend.replaceChildren(...ranked.map(([name]) => {
      const sw = h("span", { className: "swatch", "aria-hidden": "true" });
      sw.style.background = bottleneckInfo(name).colour;
      return h("li", {}, sw, bottleneckInfo(name).label);
    }));
    svg.setAttribute("aria-label", "Bottleneck over the last " + span(view.span) + ": " + (ranked.length ? summary : "no diagnosis recorded yet"));
  }

  return { h: h, s: s, bottleneckInfo: bottleneckInfo, num: num, pct: pct, secs: secs, span: span, clock: clock,
    last: last, charts: charts, drawChart: drawChart, drawStrip: drawStrip, GAP_SECONDS: GAP_SECONDS };
};
