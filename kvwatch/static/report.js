/* kvwatch report: draws the recording's charts with the status page's own code (charts.js) from the data kvwatch
 * embedded in #kvwatch-config (series downsampled for drawing; every figure is in the tables, computed from
 * all of it). Text from the target only ever goes in as text nodes.
 */
"use strict";
(function () {
  const CFG = JSON.parse(document.getElementById("kvwatch-config").textContent);
  const C = window.kvwatchCharts(CFG);
  const R = CFG.report;

  function colourBadges() {
    // The catalogue's colour and ink for each verdict in the tables (set here: the CSP allows no style attribute).
    for (const el of document.querySelectorAll(".rbadge[data-bottleneck]")) {
      const b = C.bottleneckInfo(el.dataset.bottleneck);
      el.style.background = b.colour;
      el.style.color = b.ink;
      el.title = b.meaning;
    }
  }

  function render() {
    const draws = [];
    const view = { now: R.end, span: Math.max(R.end - R.start, 1), clock: true, segments: R.segments,
      bands: R.stages.map((st) => ({ start: st.start, end: st.end, label: st.name })),
      title: "The whole recording, " + C.clock(R.start) + " to " + C.clock(R.end) + " (" + C.span(R.end - R.start) + ")" };
    const cards = R.engines.map((e) => C.h("article", { className: "engine", "data-model": e.model_name, "data-engine": e.engine },
      C.h("div", { className: "engine-head" }, C.h("h3", {}, "Engine " + e.engine + " · " + e.model_name)),
      C.charts(e.series, null, draws, view)));
    document.getElementById("charts").replaceChildren(...(cards.length ? cards : [C.h("p", { className: "empty-note" }, "No engine in the recording.")]));
    for (const [svg, spec] of draws) (spec.strip ? C.drawStrip : C.drawChart)(svg, spec, view);
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(render, 150);
  });
  colourBadges();
  render();
})();
