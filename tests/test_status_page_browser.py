"""The status page in a real browser: Debian's headless Chromium (tests/helpers/browser.py) on a real kvwatch
watching the simulator's ``tour`` over HTTP, every assertion read from the DOM after the page's scripts ran.

One simulator, one kvwatch and one browser serve the whole module (a module-scoped fixture); the tests run in
file order and the last one stops the simulator, then kvwatch. Every wait is on a condition with a generous
deadline: nothing here times the page. Screenshots of each state go to ``artifacts/browser/`` (CI keeps them).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import pytest

from kvwatch.catalog import Bottleneck, Thresholds
from tests.helpers.browser import Browser, Page
from tests.helpers.ports import free_ports
from tests.helpers.process import Process, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "browser"
KVWATCH = [sys.executable, "-m", "kvwatch"]
DESKTOP = (1280, 800)
PHONE = 375

# What the page shows next to what kvwatch's own API says, read in one go inside the page.
READ_STATE = """(async () => {
  const d = await (await fetch('api/v1/diagnosis', {cache: 'no-store'})).json();
  const badge = document.querySelector('article.engine [data-role=bottleneck]');
  const target = document.querySelector('#detail [data-role=target-bottleneck]');
  return {api: d.bottleneck, api_engine: d.engines && d.engines.length ? d.engines[0].bottleneck : null,
          dom: badge && badge.dataset.bottleneck, dom_text: badge && badge.textContent,
          dom_target: target && target.dataset.bottleneck,
          api_confidence: d.engines && d.engines.length ? d.engines[0].confidence : null,
          dom_confidence: (document.querySelector('article.engine [data-role=confidence]') || {}).textContent || ''};
})()"""

# Every chart's series paths: how many points each says it drew, and how many its `d` really has.
READ_CHARTS = """[...document.querySelectorAll('article.engine svg.chart')].map(svg => ({
  chart: svg.dataset.chart, role: svg.getAttribute('role'), label: svg.getAttribute('aria-label'),
  width: svg.viewBox.baseVal ? svg.viewBox.baseVal.width : 0,
  paths: [...svg.querySelectorAll('path.series')].map(p => ({series: p.dataset.series,
    points: +p.dataset.points, coords: (p.getAttribute('d').match(/[ML]/g) || []).length})),
  segments: [...svg.querySelectorAll('rect[data-bottleneck]')].map(r => [r.dataset.bottleneck,
    (r.querySelector('title') || {}).textContent || '']),
  summary: (svg.closest('figure').querySelector('[data-role=strip-summary]') || {}).textContent || '',
  legend: [...svg.closest('figure').querySelectorAll('.legend li')].map(li => li.textContent.trim()),
  thresholds: [...svg.querySelectorAll('text.threshold-label')].map(t => t.textContent)}))"""

A11Y = (Path(__file__).parent / "helpers" / "a11y.js").read_text()


@pytest.fixture(scope="module")
def stack():
    sim_port, kv_port = free_ports(2)
    logs = ARTIFACTS / "logs"
    sim = Process(
        [*KVWATCH, "sim", "--scenario", "tour", "--port", sim_port, "--speed", "4", "--seed", "1"],
        logs / "sim.log",
        name="simulator",
    ).start()
    kv = Process(
        [
            *KVWATCH,
            "run",
            "--target",
            f"http://127.0.0.1:{sim_port}/metrics",
            "--listen",
            f"127.0.0.1:{kv_port}",
            "--interval",
            "0.5",
            "--window",
            "3",
            "--stale-after",
            "3",
        ],
        logs / "kvwatch.log",
        name="kvwatch",
    ).start()
    browser = Browser(logs)
    try:
        sim.wait_for_url(f"http://127.0.0.1:{sim_port}/metrics", timeout=60)
        kv.wait_for_url(f"http://127.0.0.1:{kv_port}/readyz", timeout=60)
        browser.start()
        page = browser.new_page()
        page.set_viewport(*DESKTOP)
        page.goto(f"http://127.0.0.1:{kv_port}/")
        yield {
            "sim": sim,
            "kv": kv,
            "page": page,
            "base": f"http://127.0.0.1:{kv_port}",
            "sim_url": f"http://127.0.0.1:{sim_port}/metrics",
        }
    finally:
        browser.stop()
        kv.stop()
        sim.stop()


def _shot(page: Page, name: str) -> None:
    page.screenshot(ARTIFACTS / f"{name}.png")


def _no_console_errors(page: Page) -> None:
    assert page.console_errors == [], page.console_errors


def test_the_bottleneck_shown_is_the_diagnosis_and_follows_it(stack):
    page = stack["page"]
    page.evaluate("window.kvwatchTestMark = 1")  # gone if the page reloaded itself
    seen: list[str] = []

    def shown_matches_api_and_is_new():
        r = page.evaluate(READ_STATE)
        same = r["dom"] == r["api_engine"] and r["dom_target"] == r["api"]
        # The confidence shown is kvwatch's own for that diagnosis (a page a poll behind is waited out).
        same = same and bool(r["api_confidence"]) and r["dom_confidence"].startswith(r["api_confidence"])
        if r["dom"] and same and r["dom"] not in seen:
            return r
        return None

    # The tour passes through every state in ~27 s at speed 4: three different ones, each on screen as the
    # API says it, show that the page follows the diagnosis (not just its first answer).
    for _ in range(3):
        r = wait_for(shown_matches_api_and_is_new, timeout=120, what=f"a new bottleneck on screen (seen {seen})")
        seen.append(r["dom"])
        assert r["dom_text"] == Bottleneck(r["dom"]).label  # the catalogue's word, not the enum name
        _shot(page, f"desktop-{r['dom']}")
    assert page.evaluate("window.kvwatchTestMark") == 1  # refreshed in place, never reloaded
    _no_console_errors(page)


def test_every_chart_has_points_and_the_kv_thresholds(stack):
    page = stack["page"]

    def charts_filled():
        charts = {c["chart"]: c for c in page.evaluate(READ_CHARTS)}
        lines = [c for k, c in charts.items() if k != "bottleneck"]
        if len(lines) == 5 and all(
            p["points"] >= 5 for c in lines for p in c["paths"] if p["series"] != "max_num_seqs"
        ):
            return charts
        return None

    charts = wait_for(charts_filled, timeout=60, what="every chart to have points")
    assert set(charts) == {"bottleneck", "kv", "requests", "tokens", "preemptions", "ttft"}
    for c in charts.values():
        for p in c["paths"]:
            assert p["coords"] == p["points"], c  # the attribute says what the path draws
    assert {p["series"] for p in charts["tokens"]["paths"]} == {
        "prompt_tokens_per_second",
        "generation_tokens_per_second",
    }
    th = Thresholds()
    assert charts["kv"]["thresholds"] == [
        f"admission stall {th.admission_stall:.0%}",
        f"preemption {th.preemption_risk:.0%}",
    ]
    # The strip: colours of the catalogue, never alone: each segment has its word, so do the legend and summary.
    strip = charts["bottleneck"]
    names = {name for name, _ in strip["segments"]}
    assert names and names <= {str(b) for b in Bottleneck}, strip
    for name, title in strip["segments"]:
        assert title.startswith(Bottleneck(name).label + ", "), strip
    labels = {Bottleneck(n).label for n in names}
    assert set(strip["legend"]) == labels and all(label in strip["summary"] for label in labels), strip
    _no_console_errors(page)


@pytest.mark.parametrize("width,height,mobile", [(*DESKTOP, False), (PHONE, 812, True)], ids=["1280x800", "375px"])
def test_layout_fits_the_screen(stack, width, height, mobile):
    page = stack["page"]
    page.set_viewport(width, height, mobile=mobile)
    try:
        # Redrawn at this width (charts measure their box), and nothing wider than the screen.
        fits = page.wait_for(
            f"""(() => {{
            const svgs = [...document.querySelectorAll('svg.chart')];
            const ok = innerWidth === {width} && svgs.length > 0 && svgs.every(s => s.viewBox.baseVal.width <= innerWidth)
                && document.documentElement.scrollWidth <= innerWidth;
            return ok && {{scroll: document.documentElement.scrollWidth, inner: innerWidth}};
        }})()""",
            timeout=30,
            what=f"the page to fit {width} px",
        )
        assert fits["scroll"] <= fits["inner"] == width
        badge = page.evaluate("""(() => { const r = document.querySelector('article.engine [data-role=bottleneck]')
            .getBoundingClientRect(); return [r.left, r.right, r.width]; })()""")
        assert badge[0] >= 0 and badge[1] <= width and badge[2] > 0
        _shot(page, f"layout-{width}px")
    finally:
        page.set_viewport(*DESKTOP)
    _no_console_errors(page)


def test_accessibility_basics(stack):
    page = stack["page"]
    page.wait_for("document.querySelectorAll('article.engine svg.chart path.series').length > 0", timeout=60)
    report = page.evaluate(A11Y)
    assert report["main"] == 1 and report["banner_header"] == 1, report
    assert report["h1"] == 1, report
    assert report["heading_levels"][0] == 1 and not report["heading_skips"], report["heading_levels"]
    assert report["charts"] >= 6 and not report["charts_without_name"], report
    assert report["text_checked"] > 50, report  # the check did look at the page's text
    assert not report["low_contrast"], report["low_contrast"]
    assert report["lang"] == "en" and report["title"]
    _no_console_errors(page)


def test_many_targets_overview_sorted_by_severity_links_to_each(stack, tmp_path):
    page = stack["page"]
    port, dead_port = free_ports(2)
    dead = f"http://127.0.0.1:{dead_port}/metrics"
    argv = [
        *KVWATCH,
        "run",
        "--target",
        stack["sim_url"],
        "--target",
        dead,
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        "0.5",
        "--window",
        "3",
        "--stale-after",
        "3",
    ]
    with Process(argv, ARTIFACTS / "logs" / "kvwatch-two-targets.log", name="kvwatch (two targets)") as kv:
        kv.wait_for_url(f"http://127.0.0.1:{port}/readyz", timeout=60)
        page.goto(f"http://127.0.0.1:{port}/")
        severity = {str(b): b.severity for b in Bottleneck}

        def overview_is_the_api():
            r = page.evaluate("""(async () => {
                const d = await (await fetch('api/v1/diagnosis', {cache: 'no-store'})).json();
                const items = [...document.querySelectorAll('#overview-list li')].map(li => [li.dataset.target,
                    li.dataset.bottleneck, li.querySelector('a').getAttribute('href')]);
                return {api: d.targets.map(t => [t.target, t.bottleneck]), items};
            })()""")
            return r if r["items"] and sorted(r["api"]) == sorted(i[:2] for i in r["items"]) else None

        r = wait_for(overview_is_the_api, timeout=60, what="the overview to list both targets as the API does")
        ranks = [severity[b] for _, b, _ in r["items"]]
        assert ranks == sorted(ranks, reverse=True), r["items"]
        assert r["items"][0][:2] == [dead, str(Bottleneck.UNREACHABLE)]  # unreachable outranks any tour state
        _shot(page, "overview-two-targets")
        for target, _, href in r["items"]:
            assert href.startswith("#target=")
            page.evaluate(f"document.querySelector('#overview-list a[href=\"{href}\"]').click()")
            page.wait_for(
                f"""(async () => {{
                const d = await (await fetch('api/v1/diagnosis', {{cache: 'no-store'}})).json();
                const t = d.targets.find(x => x.target === {json.dumps(target)});
                const sec = document.querySelector('#detail section.target');
                const b = sec && sec.querySelector('[data-role=target-bottleneck]');
                return sec && sec.dataset.target === {json.dumps(target)} && b.dataset.bottleneck === t.bottleneck
                    && document.querySelector('#overview-list li[aria-current=true]').dataset.target === t.target;
            }})()""",
                timeout=60,
                what=f"the detail of {target}",
            )
        # (a wait: a scrape of the simulator that times out on a loaded machine says "2 of 2" for a moment)
        banner = wait_for(
            lambda: (
                (b := page.evaluate("document.getElementById('banner').textContent"))
                and "vLLM unreachable: 1 of 2 targets" in b
                and b
            ),
            timeout=60,
            what="the banner for one target",
        )
        assert dead in banner
        assert kv.running()
        _no_console_errors(page)
        page.goto(stack["base"] + "/")  # back to the one-target kvwatch (before this one stops) for the last test


def test_a_wrong_path_is_not_called_unreachable(stack):
    """A 404 is a wrong address, not a network failure: the banner says what came back (issue 25)."""
    page = stack["page"]
    port = free_ports(1)[0]
    wrong = stack["sim_url"].removesuffix("/metrics") + "/nope"
    argv = [*KVWATCH, "run", "--target", wrong, "--listen", f"127.0.0.1:{port}", "--interval", "0.5"]
    with Process(argv, ARTIFACTS / "logs" / "kvwatch-wrong-path.log", name="kvwatch (wrong path)") as kv:
        kv.wait_for_url(f"http://127.0.0.1:{port}/readyz", timeout=60)
        page.goto(f"http://127.0.0.1:{port}/")
        banner = wait_for(
            lambda: (b := page.evaluate("document.getElementById('banner').textContent")) and "HTTP 404" in b and b,
            timeout=60,
            what="the banner for a wrong path",
        )
        assert "vLLM's metrics unreadable" in banner and "HTTP 404 — is the path /metrics?" in banner, banner
        assert "unreachable" not in banner and "?." not in banner, banner
        _no_console_errors(page)
        page.goto(stack["base"] + "/")  # back to the one-target kvwatch for the next test


def test_unreachable_keeps_the_last_diagnosis_then_stale_when_kvwatch_stops(stack):
    page = stack["page"]
    page.wait_for("document.querySelector('article.engine [data-role=bottleneck]') !== null", timeout=60)
    stack["sim"].stop()

    def unreachable_shown():
        r = page.evaluate("""(async () => {
            const d = await (await fetch('api/v1/diagnosis', {cache: 'no-store'})).json();
            const banner = document.getElementById('banner');
            const card = document.querySelector('article.engine');
            const badge = card && card.querySelector('[data-role=bottleneck]');
            const target = document.querySelector('#detail [data-role=target-bottleneck]');
            return {api: d.bottleneck, api_engines: d.engines.length, up: d.up,
                kind: banner.hidden ? null : banner.dataset.kind, banner: banner.textContent,
                dom_target: target && target.dataset.bottleneck, last_known: !!(card && card.querySelector('[data-role=last-known]')),
                dom: badge && badge.dataset.bottleneck, stamp: badge && +badge.dataset.timestamp,
                evidence: card ? card.querySelectorAll('ul.evidence li').length : 0};
        })()""")
        done = r["api"] == str(Bottleneck.UNREACHABLE) and r["api_engines"] == 0 and r["dom_target"] == r["api"]
        return r if done and r["kind"] == "down" else None

    r = wait_for(unreachable_shown, timeout=60, what="the page to say vLLM is unreachable")
    assert "vLLM unreachable" in r["banner"] and stack["sim_url"] in r["banner"]
    assert "Showing its last diagnosis" in r["banner"]
    # The last diagnosis stays on screen, marked as such: one kvwatch made while vLLM answered (its history
    # holds that scrape with that bottleneck), with its evidence.
    assert r["last_known"] and r["dom"] != str(Bottleneck.UNREACHABLE) and r["evidence"] > 0, r
    hist = httpx.get(stack["base"] + "/api/v1/history", trust_env=False, timeout=10).json()
    series = hist["targets"][0]["engines"][0]["series"]
    rows = list(zip(series["t"], series["bottleneck"], strict=False))
    assert any(abs(t - r["stamp"]) < 0.01 and b == r["dom"] for t, b in rows), (r, rows[-10:])
    assert r["stamp"] >= rows[-1][0] - 30  # among the last ones before vLLM went away
    _shot(page, "unreachable")
    report = page.evaluate(A11Y)  # the banner and the marked last diagnosis read as well as the rest
    assert not report["low_contrast"] and not report["heading_skips"], report
    _no_console_errors(page)

    stack["kv"].stop()
    stale = page.wait_for(
        """(() => { const b = document.getElementById('banner');
        return !b.hidden && b.dataset.kind === 'stale' && b.textContent; })()""",
        timeout=60,
        what="the stale banner",
    )
    assert "kvwatch is not answering" in stale
    still = page.evaluate("document.querySelector('article.engine [data-role=bottleneck]').dataset.bottleneck")
    assert still == r["dom"]  # still the last diagnosis
    _shot(page, "stale")
    # Only the failed polls of the stopped kvwatch, nothing of the page's own.
    odd = [e for e in page.console_errors if not re.search(r"ERR_CONNECTION_REFUSED|Failed to fetch", e)]
    assert not odd, odd
