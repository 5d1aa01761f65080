/* kvwatch status page: polls /api/v1/diagnosis and /api/v1/history and redraws in place.
 *
 * Everything it says about bottlenecks, actions and KV pressure (words, colours, order) comes from the
 * catalogue, embedded by kvwatch in #kvwatch-config; the thresholds it draws are kvwatch's settings. It names
 * no bottleneck itself. Its charts are charts.js's (the report draws with the same code). Text from vLLM or
 * the target (model names, URLs, evidence) only ever goes in as text nodes, never as HTML.
 */
"use strict";
(function () {
  const CFG = JSON.parse(document.getElementById("kvwatch-config").textContent);
  const { h, s, bottleneckInfo, num, pct, span, clock, last, charts, drawChart, drawStrip, GAP_SECONDS } = window.kvwatchCharts(CFG);
  const POLL_MS = CFG.poll_seconds * 1000;
  const SPAN = CFG.history_seconds;
  // The charts span the history there is, rounded up to these steps (at least a minute, at most SPAN): a
  // kvwatch that started a minute ago draws a minute, not a sliver at the edge of 15 min.
  const VIEW_STEPS = [[120, 15], [600, 60], [3600, 300], [Infinity, 1800]];

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

  // The server's clock now (estimated from the last history answer), so "ago" never mixes two clocks.
  const serverNow = () => (state.histNow === null ? Date.now() / 1000 : state.histNow + (performance.now() - state.histAt) / 1000);
  const ago = (t) => span(Math.max(0, serverNow() - t)) + " ago";

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
