/* Basic accessibility checks, evaluated in the page by tests/test_status_page_browser.py (no axe-core: these
 * are the few rules the page must keep, written out so that a failure says exactly what is wrong).
 *   landmarks: one <main>, one page-level <header> (banner); one <h1>; headings never skip a level;
 *   every chart <svg> has role=img and a name (aria-label or <title>);
 *   every visible text has a contrast ratio >= 4.5 (WCAG 2 AA) against what is behind it, from
 *   getComputedStyle: HTML text against its ancestors' backgrounds composited over white, SVG text against
 *   the shape under it (elementsFromPoint). */
(() => {
  const parse = (c) => {
    const m = /rgba?\(([^)]+)\)/.exec(c || "");
    if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
    return { r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1 };
  };
  const over = (top, under) => ({
    r: top.r * top.a + under.r * (1 - top.a), g: top.g * top.a + under.g * (1 - top.a),
    b: top.b * top.a + under.b * (1 - top.a), a: 1,
  });
  const lum = (c) => {
    const f = (v) => { v /= 255; return v <= 0.04045 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
    return 0.2126 * f(c.r) + 0.7152 * f(c.g) + 0.0722 * f(c.b);
  };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  const WHITE = { r: 255, g: 255, b: 255, a: 1 };

  function htmlBackground(el) {
    const chain = [];
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) chain.unshift(e);
    let bg = WHITE;
    for (const e of chain) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0) bg = over(c, bg);
    }
    return bg;
  }

  function svgBackground(text) {
    const r = text.getBoundingClientRect();
    const under = document.elementsFromPoint(r.left + r.width / 2, r.top + r.height / 2);
    for (const e of under) {
      if (e === text) continue;
      if (e instanceof SVGGeometryElement && !(e instanceof SVGLineElement) && !(e instanceof SVGPathElement)) {
        const fill = parse(getComputedStyle(e).fill);
        if (fill) return over(fill, htmlBackground(e.ownerSVGElement));
      }
      if (!(e instanceof SVGElement)) return htmlBackground(e);
    }
    return htmlBackground(text.ownerSVGElement);
  }

  const visible = (el) => {
    const st = getComputedStyle(el);
    return st.visibility !== "hidden" && st.display !== "none" && el.getClientRects().length > 0;
  };

  const low = [];
  let checked = 0;
  for (const el of document.body.querySelectorAll("*")) {
    const own = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!own || !visible(el) || el.closest("[hidden]")) continue;
    const isSvg = el instanceof SVGElement;
    const st = getComputedStyle(el);
    const fg = parse(isSvg ? st.fill : st.color);
    if (!fg) continue;
    const bg = isSvg ? svgBackground(el) : htmlBackground(el);
    const cr = ratio(over(fg, bg), bg);
    checked++;
    if (cr < 4.5) low.push({ text: el.textContent.trim().slice(0, 60), tag: el.tagName, ratio: +cr.toFixed(2), fg: isSvg ? st.fill : st.color });
  }

  const headings = [...document.querySelectorAll("h1,h2,h3,h4,h5,h6")].filter(visible).map((h) => +h.tagName[1]);
  const skips = headings.filter((lvl, i) => i > 0 && lvl > headings[i - 1] + 1);
  const charts = [...document.querySelectorAll("svg.chart")];
  const unnamed = charts.filter((s) => s.getAttribute("role") !== "img" ||
    !((s.getAttribute("aria-label") || "").trim() || (s.querySelector(":scope > title") || {}).textContent));
  const legendSvgs = [...document.querySelectorAll("svg:not(.chart)")].filter((s) => s.getAttribute("aria-hidden") !== "true");
  return {
    main: document.querySelectorAll("main").length,
    banner_header: [...document.querySelectorAll("header")].filter((h) => !h.closest("article,aside,main,nav,section")).length,
    h1: document.querySelectorAll("h1").length,
    heading_levels: headings,
    heading_skips: skips,
    charts: charts.length,
    charts_without_name: unnamed.map((s) => s.dataset.chart).concat(legendSvgs.map(() => "decorative svg not aria-hidden")),
    text_checked: checked,
    low_contrast: low,
    lang: document.documentElement.lang,
    title: document.title,
  };
})()
