/* kvwatch status page: polls /api/v1/diagnosis and /api/v1/history and redraws in place.
 *
 * Everything it says about bottlenecks, actions and KV pressure (words, colours, order) comes from the
 * catalogue, embedded by kvwatch in #kvwatch-config; the thresholds it draws are kvwatch's settings. It names
 * no bottleneck itself. Charts are SVG drawn here (no library). Text from vLLM or the target (model names,
 * URLs, evidence) only ever goes in as text nodes, never as HTML.
 */
"use strict";
(function () {
  const CFG = JSON.parse(document.getElementById("kvwatch-config").textContent);
  const BOTTLENECKS = new Map(CFG.bottlenecks.map((b) => [b.name, b]));
  const POLL_MS = CFG.poll_seconds * 1000;
  const SPAN = CFG.history_seconds;
  // A series with no sample for this long has a gap, not a line across it.
  const GAP_SECONDS = Math.max(3 * CFG.interval, 3);
  const SVGNS = "http://www.w3.org/2000/svg";
  // The charts span the history there is, rounded up to these steps (at least a minute, at most SPAN): a
  // kvwatch that started a minute ago draws a minute, not a sliver at the edge of 15 min.
  const VIEW_STEPS = [[120, 15], [600, 60], [3600, 300], [Infinity, 1800]];
  const TICK_STEPS = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

  const state = {
    docs: null, // the latest diagnosis, one document per target
    lastStamp: null, // the diagnoses' timestamps, to see that they move
    lastAdvance: 0, // performance.now() when they last moved
    fetchError: null, // why the last poll of kvwatch failed (null: it answered)
    failingSince: null, // Date.now() of the first failed poll in a row
    lastGood: new Map(), // target -> {timestamp, engines} of its last diagnosis while vLLM answered
    // target -> {series, engines: Map(key -> {model_name, engine, series}), now: the server's clock in its last
    // history answer, at: performance.now() then}. Only the target on screen is fetched.
    hist: new Map(),
    histNow: null, // the server's clock in the last history answer (any target)...
    histAt: 0, // ...and performance.now() when it came
  };

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

  function badge(name, role, big, stamp) {
    const b = bottleneckInfo(name);
    const el = h("span", { className: big ? "badge big" : "badge", "data-role": role, "data-bottleneck": name,
      "data-timestamp": stamp, title: b.meaning }, b.label);
    el.style.background = b.colour;
    el.style.color = b.ink;
    return el;
  }

  function chip(info, text) {
    const el = h("span", { className: "badge" }, text || info.label);
    el.style.background = info.colour;
    el.style.color = info.ink;
    return el;
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
  // The server's clock now (estimated from the last history answer), so "ago" never mixes two clocks.
  const serverNow = () => (state.histNow === null ? Date.now() / 1000 : state.histNow + (performance.now() - state.histAt) / 1000);
  const ago = (t) => span(Math.max(0, serverNow() - t)) + " ago";
  const last = (xs) => (xs && xs.length ? xs[xs.length - 1] : null);

  // ------------------------------------------------------------------------------------------ data

  async function getJSON(url) {
    const r = await fetch(url, { cache: "no-store", headers: { Accept: "application/json" } });
    if (!r.ok) throw new Error(url + " answered HTTP " + r.status);
    return r.json();
  }

  function historySeconds(target) {
    // The first poll of a target asks for everything kept; the next ones for what is new, with a margin.
    const rec = state.hist.get(target);
    if (!rec) return SPAN;
    const elapsed = (performance.now() - rec.at) / 1000;
    return Math.min(SPAN, Math.ceil(elapsed + 2 * CFG.interval + 2));
  }

  function emptyColumns(fields) {
    return Object.fromEntries(fields.map((f) => [f, []]));
  }

  function appendColumns(dst, src) {
    const lastT = dst.t.length ? dst.t[dst.t.length - 1] : -Infinity;
    src.t.forEach((t, i) => {
      if (t <= lastT) return;
      for (const f of Object.keys(dst)) dst[f].push(src[f] ? src[f][i] : null);
    });
  }

  function trimColumns(cols, from) {
    let n = 0;
    while (n < cols.t.length && cols.t[n] < from) n++;
    if (n) for (const f of Object.keys(cols)) cols[f].splice(0, n);
  }

  function onHistory(doc) {
    const from = doc.now - SPAN;
    for (const t of doc.targets) {
      let rec = state.hist.get(t.target);
      if (!rec) state.hist.set(t.target, (rec = { series: emptyColumns(doc.target_fields), engines: new Map() }));
      rec.now = doc.now;
      rec.at = performance.now();
      appendColumns(rec.series, t.series);
      trimColumns(rec.series, from);
      for (const e of t.engines) {
        const key = engineKey(e);
        let er = rec.engines.get(key);
        if (!er) rec.engines.set(key, (er = { model_name: e.model_name, engine: e.engine, series: emptyColumns(doc.engine_fields) }));
        appendColumns(er.series, e.series);
      }
      for (const [key, er] of rec.engines) {
        trimColumns(er.series, from);
        if (!er.series.t.length) rec.engines.delete(key);
      }
    }
    state.histNow = doc.now;
    state.histAt = performance.now();
  }

  function onDiagnosis(doc) {
    const docs = doc.targets || [doc];
    const stamp = docs.map((d) => d.timestamp).join(",");
    if (stamp !== state.lastStamp) {
      state.lastStamp = stamp;
      state.lastAdvance = performance.now();
    }
    state.docs = docs;
    for (const d of docs) {
      if (d.up && d.engines && d.engines.length) state.lastGood.set(d.target, { timestamp: d.timestamp, engines: d.engines });
    }
  }

  let timer = null;
  let inFlight = false;
  let again = false;

  async function poll() {
    if (inFlight) {
      again = true; // e.g. another target chosen mid-poll: poll once more right after
      return;
    }
    inFlight = true;
    clearTimeout(timer);
    try {
      onDiagnosis(await getJSON("api/v1/diagnosis"));
      // The history of the target on screen only: with hundreds of targets, all of it would be megabytes.
      const target = selectedTarget(sortedDocs()).target;
      onHistory(await getJSON("api/v1/history?target=" + encodeURIComponent(target) + "&seconds=" + historySeconds(target)));
      state.fetchError = null;
      state.failingSince = null;
    } catch (err) {
      state.fetchError = String((err && err.message) || err);
      if (state.failingSince === null) state.failingSince = Date.now();
    }
    inFlight = false;
    render();
    timer = setTimeout(poll, again ? 0 : POLL_MS);
    again = false;
  }

  const engineKey = (e) => e.model_name + "\u0000" + e.engine;
  const severity = (name) => bottleneckInfo(name).severity;

  // ------------------------------------------------------------------------------------------ banner, header

  function staleFor() {
    if (state.fetchError || !state.docs) return 0;
    const limit = Math.max(10, CFG.stale_after + 3 * CFG.interval, 3 * CFG.poll_seconds);
    const quiet = (performance.now() - state.lastAdvance) / 1000;
    return quiet > limit ? quiet : 0;
  }

  function bannerInfo() {
    if (state.fetchError) {
      const since = state.failingSince ? new Date(state.failingSince).toLocaleTimeString("en-GB", { hour12: false }) : "?";
      return { kind: "stale", title: "Stale: kvwatch is not answering", lines: [
        "This page has not reached kvwatch since " + since + " (" + state.fetchError + ").",
        state.docs ? "What you see is the last it received; it refreshes by itself when kvwatch answers again." : "Nothing received yet.",
      ] };
    }
    const quiet = staleFor();
    if (quiet) {
      const since = new Date(Date.now() - quiet * 1000).toLocaleTimeString("en-GB", { hour12: false });
      return { kind: "stale", title: "Stale: the diagnosis has not changed since " + since,
        lines: ["kvwatch answers, but its scrape loop has produced nothing new: the figures below are old."] };
    }
    const down = (state.docs || []).filter((d) => d.up === false);
    if (!down.length) return null;
    const n = state.docs.length;
    const lines = down.slice(0, 5).map((d) => {
      const good = state.lastGood.get(d.target);
      // Clock times only: a banner that said "5 s ago" would change, and be read out again, every second.
      const seen = good ? " Showing its last diagnosis, from " + clock(good.timestamp) + "." : "";
      const why = d.error || "no successful scrape yet";
      return d.target + ": " + why + (/[.?!]$/.test(why) ? "" : ".") + seen;
    });
    if (down.length > 5) lines.push("… and " + (down.length - 5) + " more.");
    // Unreachable only when the network is to blame: a wrong address (404, an HTML page...) says what came back.
    const network = down.every((d) => !d.error_reason || CFG.network_reasons.includes(d.error_reason));
    const what = network ? "vLLM unreachable" : "vLLM's metrics unreadable";
    const title = n > 1 ? what + ": " + down.length + " of " + n + " targets" : what;
    return { kind: "down", title: title + (network ? " (kvwatch cannot scrape its /metrics)" : " (kvwatch reaches it, but reads no metrics there)"), lines: lines };
  }

  function renderBanner() {
    const el = document.getElementById("banner");
    const info = bannerInfo();
    if (!info) {
      el.hidden = true;
      el.removeAttribute("data-kind");
      delete el.dataset.key;
      el.replaceChildren();
      return;
    }
    const key = info.kind + "\n" + info.title + "\n" + info.lines.join("\n");
    if (!el.hidden && el.dataset.key === key) return; // unchanged: a live region is not rewritten
    el.hidden = false;
    el.setAttribute("data-kind", info.kind);
    el.dataset.key = key;
    el.replaceChildren(h("strong", {}, info.title), ...info.lines.map((l) => h("p", {}, l)));
  }

  function renderStatus() {
    const el = document.getElementById("status");
    if (!state.docs) {
      el.textContent = state.fetchError ? "No answer from kvwatch yet." : "Loading the diagnosis…";
      return;
    }
    const stamps = state.docs.map((d) => d.timestamp).filter((t) => t !== null);
    const when = stamps.length ? "diagnosis of " + clock(Math.max(...stamps)) : "no scrape yet";
    const n = state.docs.length;
    el.textContent = (n > 1 ? n + " targets" : "watching " + state.docs[0].target) + " · " + when +
      " · refreshes every " + span(CFG.poll_seconds);
  }

  // ------------------------------------------------------------------------------------------ overview

  function sortedDocs() {
    return state.docs.map((d, i) => [d, i]).sort((a, b) => severity(b[0].bottleneck) - severity(a[0].bottleneck) || a[1] - b[1]).map((x) => x[0]);
  }

  function selectedTarget(sorted) {
    const m = /^#target=(.*)$/.exec(location.hash);
    let want = null;
    try {
      want = m ? decodeURIComponent(m[1]) : null;
    } catch (err) {
      want = null; // a mangled link: show the most severe target
    }
    return sorted.find((d) => d.target === want) || sorted[0];
  }

  function overviewFacts(d) {
    if (!d.engines.length) return d.error ? d.error : "no engine reported";
    const kv = Math.max(...d.engines.map((e) => e.signals.kv_cache_usage_ratio || 0));
    const waiting = d.engines.reduce((a, e) => a + (e.signals.requests_waiting || 0), 0);
    const n = d.engines.length;
    return n + (n > 1 ? " engines" : " engine") + " · KV up to " + pct(kv) + " · " + num(waiting) + " waiting";
  }

  function renderOverview(sorted, chosen) {
    const sec = document.getElementById("overview");
    if (sorted.length < 2) {
      sec.hidden = true;
      return;
    }
    sec.hidden = false;
    const items = sorted.map((d, i) => h("li", { "data-target": d.target, "data-bottleneck": d.bottleneck, "aria-current": d === chosen ? "true" : null },
      h("span", { className: "sev" }, i + 1 + "."),
      badge(d.bottleneck, "overview-bottleneck"),
      h("a", { href: "#target=" + encodeURIComponent(d.target) }, d.target),
      h("span", { className: "facts" }, overviewFacts(d))));
    document.getElementById("overview-list").replaceChildren(...items);
  }

  // ------------------------------------------------------------------------------------------ detail

  function heldFor(series, name) {
    // How long the engine's bottleneck has been what it is now, from the history.
    if (!series || !series.t.length || last(series.bottleneck) !== name) return null;
    let i = series.t.length - 1;
    while (i > 0 && series.bottleneck[i - 1] === name && series.t[i] - series.t[i - 1] <= GAP_SECONDS) i--;
    return { seconds: last(series.t) - series.t[i], samples: series.t.length - i };
  }

  function confidence(e, series) {
    const sig = e.signals;
    // kvwatch's own confidence first (diagnose.py), then how long the verdict has held and what it rests on.
    const parts = e.confidence ? [e.confidence + (e.confidence_reason ? " (" + e.confidence_reason + ")" : "")] : [];
    const held = heldFor(series, e.bottleneck);
    if (held) parts.push("held " + span(held.seconds) + " (" + held.samples + (held.samples === 1 ? " scrape)" : " scrapes)"));
    parts.push("window " + sig.samples + " samples over " + span(sig.span_seconds || 0));
    const inferred = ["max_num_seqs", "max_num_batched_tokens"].filter((k) => e[k] && e[k].source !== "configured");
    if (inferred.length) parts.push(inferred.join(", ") + " inferred");
    return parts.join(" · ");
  }

  function limit(e, key, series) {
    if (e && e[key]) return num(e[key].value) + " (" + e[key].source + ")";
    if (CFG.hints[key]) return num(CFG.hints[key]) + " (configured)";
    // Inferred only while it binds: say what was inferred last, and when.
    const col = series && series[key];
    for (let i = col ? col.length - 1 : -1; i >= 0; i--) if (col[i] !== null) return num(col[i]) + " (inferred " + ago(series.t[i]) + ")";
    return "unknown";
  }

  function limitsList(e, series) {
    const sig = e.signals;
    const modelLen = sig.max_model_len_from_cache_config ? num(sig.max_model_len_from_cache_config) + " (vLLM)" : CFG.hints.max_model_len ? num(CFG.hints.max_model_len) + " (configured)" : "unknown";
    const rows = [
      ["max_num_seqs", limit(e, "max_num_seqs", series)],
      ["max_num_batched_tokens", limit(e, "max_num_batched_tokens")],
      ["max_model_len", modelLen],
      ["KV capacity", sig.capacity_tokens ? num(sig.capacity_tokens) + " tokens" : "unknown"],
      ["mean sequence", sig.mean_sequence_tokens ? num(sig.mean_sequence_tokens) + " tokens" : "unknown"],
      ["est. max concurrency", num(sig.estimated_max_concurrency)],
    ];
    if (sig.cache_dtype) rows.push(["KV dtype", sig.cache_dtype]);
    if (sig.enable_prefix_caching !== undefined) rows.push(["prefix caching", sig.enable_prefix_caching ? "on" : "off"]);
    return h("dl", { className: "limits" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  function recommendations(e) {
    if (!e.recommendations.length) return h("p", { className: "empty-note" }, "Nothing to change.");
    return h("ol", {}, e.recommendations.map((r) => {
      const a = CFG.actions[r.action] || { meaning: "" };
      return h("li", { "data-action": r.action, title: a.meaning }, h("span", { className: "rec-flag mono" }, r.flag || r.action), ": " + r.why);
    }));
  }

  function verdict(e, series, stamp) {
    const sig = e.signals;
    const b = bottleneckInfo(e.bottleneck);
    const pressure = CFG.kv_pressure[e.kv_cache_pressure];
    const fact = (k, ...v) => h("div", {}, h("dt", {}, k), h("dd", {}, ...v));
    return [
      h("div", { className: "verdict" }, badge(e.bottleneck, "bottleneck", true, stamp), h("p", { className: "meaning" }, b.meaning)),
      h("dl", { className: "facts-row" },
        fact("KV cache", pct(sig.kv_cache_usage_ratio), " ", pressure ? chip(pressure) : null),
        fact("running / waiting", num(sig.requests_running) + " / " + num(sig.requests_waiting)),
        fact("prompt / generation tokens/s", num(sig.prompt_tokens_per_second) + " / " + num(sig.generation_tokens_per_second)),
        fact("confidence", h("span", { "data-role": "confidence" }, confidence(e, series)))),
      h("div", { className: "cols" },
        h("section", {}, h("h4", {}, "Why"), e.evidence.length ? h("ul", { className: "evidence" }, e.evidence.map((x) => h("li", {}, x))) : h("p", { className: "empty-note" }, "No evidence given.")),
        h("section", {}, h("h4", {}, "What to change"), recommendations(e)),
        h("section", {}, h("h4", {}, "Limits"), limitsList(e, series))),
    ];
  }

  function engineCard(e, good, stamp, hist, targetSeries, draws, view) {
    // e: the diagnosis shown (live, or the last one while vLLM answered when good is set); hist: its history.
    const meta = e || hist;
    const lastKnown = Boolean(e && good);
    const head = h("div", { className: "engine-head" },
      h("h3", {}, "Engine " + meta.engine + " · " + meta.model_name),
      lastKnown ? h("span", { className: "tag", "data-role": "last-known" }, "last diagnosis, " + clock(good.timestamp) + " (" + ago(good.timestamp) + ")") : null);
    const series = hist ? hist.series : null;
    const body = e ? verdict(e, series, stamp) : [h("p", { className: "empty-note" }, "No diagnosis for this engine now: it reported nothing within " + span(CFG.stale_after) + ". Its history:")];
    return h("article", { className: lastKnown ? "engine last-known" : "engine", "data-model": meta.model_name, "data-engine": meta.engine },
      head, ...body, charts(series, targetSeries, draws, view));
  }

  function targetSection(d, draws, view) {
    // While vLLM is unreachable, the last diagnosis it answered for stays on screen, marked as such.
    const good = d.up ? null : state.lastGood.get(d.target) || null;
    const shown = good ? good.engines : d.engines;
    const stamp = good ? good.timestamp : d.timestamp;
    const rec = state.hist.get(d.target) || { engines: new Map(), series: null };
    const byKey = new Map(shown.map((e) => [engineKey(e), e]));
    const keys = [...byKey.keys()];
    for (const k of [...rec.engines.keys()].sort()) if (!byKey.has(k)) keys.push(k);
    const scraped = d.timestamp === null ? "waiting for the first scrape" : d.up ? "scraped " + ago(d.timestamp) : "last scrape failed: " + (d.error || "?");
    const cards = keys.map((k) => engineCard(byKey.get(k) || null, good, stamp, rec.engines.get(k), rec.series, draws, view));
    return h("section", { className: "target", "data-target": d.target, "aria-labelledby": "target-title" },
      h("h2", { id: "target-title" }, d.target),
      h("div", { className: "target-head" }, badge(d.bottleneck, "target-bottleneck", false, d.timestamp), h("p", { className: "scraped" }, scraped)),
      cards.length ? cards : h("p", { className: "empty-note" }, "No engine seen yet."));
  }

  function viewSpan(target, now) {
    const rec = target ? state.hist.get(target) : null;
    const age = Math.max(60, rec && rec.series.t.length ? now - rec.series.t[0] : 0);
    const step = VIEW_STEPS.find(([upTo]) => age <= upTo)[1];
    return Math.min(SPAN, Math.ceil(age / step) * step);
  }

  function renderDetail(chosen) {
    const draws = [];
    const now = state.histNow === null ? serverNow() : state.histNow;
    const view = { now: now, span: viewSpan(chosen && chosen.target, now) };
    const detail = document.getElementById("detail");
    detail.replaceChildren(chosen ? targetSection(chosen, draws, view) : h("p", {}, "Waiting for kvwatch…"));
    for (const [svg, spec] of draws) (spec.strip ? drawStrip : drawChart)(svg, spec, view);
  }

  function render() {
    renderStatus();
    renderBanner();
    if (!state.docs) return renderDetail(null);
    const sorted = sortedDocs();
    const chosen = selectedTarget(sorted);
    renderOverview(sorted, chosen);
    renderDetail(chosen);
  }

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
    const figs = specs.map((spec) => {
      spec.cols = series;
      const svg = s("svg", { className: "chart", "data-chart": spec.id, role: "img" });
      draws.push([svg, spec]);
      return h("figure", { "data-chart": spec.id }, h("figcaption", {}, spec.title), svg, legend(spec));
    });
    const strip = { strip: true, cols: stripRows(series, targetSeries) };
    const svg = s("svg", { className: "chart strip", "data-chart": "bottleneck", role: "img" });
    draws.push([svg, strip]);
    strip.summary = h("p", { className: "strip-summary", "data-role": "strip-summary" });
    strip.legend = h("ul", { className: "legend" });
    const stripFig = h("figure", { className: "strip-figure", "data-chart": "bottleneck" }, h("figcaption", {}, "Bottleneck over time"), svg, strip.legend, strip.summary);
    return h("section", { className: "charts" }, h("h4", {}, "Last " + span(view.span)), stripFig, h("div", { className: "chart-grid" }, figs));
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

  function timeAxis(svg, view, y, x0, x1) {
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
    const segs = stripSegments(spec.cols).filter((g) => g.end > f.from);
    const share = new Map();
    for (const g of segs) {
      const a = X(Math.max(g.start, f.from)), b = X(g.end);
      const info = bottleneckInfo(g.name);
      share.set(g.name, (share.get(g.name) || 0) + (g.end - Math.max(g.start, f.from)));
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

  // ------------------------------------------------------------------------------------------ start

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(render, 150);
  });
  window.addEventListener("hashchange", () => {
    render();
    poll(); // the chosen target's history now, not at the next tick
  });
  poll();
})();
