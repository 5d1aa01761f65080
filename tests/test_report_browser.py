"""The report's HTML in a real browser (tests/helpers/browser.py, the status page's harness), opened from disk
as a user opens an attachment: no console error, every chart has points, the knee and the stage table are
shown, it fits a desktop and a phone without sideways scrolling, and the page's accessibility check passes.

The report is of a real vLLM 0.32 capture (tests/fixtures/vllm-0.32.0-cpu/max_num_seqs) with two benchmark stages
laid over it. Screenshots go to ``artifacts/browser/`` (CI keeps them; docs/ may use them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.catalog import Bottleneck
from tests.helpers.bench_results import vllm_result, write_result
from tests.helpers.browser import Browser
from tests.helpers.recordings import FIXTURES, recording

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "browser"
A11Y = (Path(__file__).parent / "helpers" / "a11y.js").read_text()
FOLDER = FIXTURES / "max_num_seqs"

READ = """(() => ({
  charts: [...document.querySelectorAll('svg.chart')].map(svg => ({chart: svg.dataset.chart,
    label: svg.getAttribute('aria-label') || '',
    paths: [...svg.querySelectorAll('path.series')].map(p => ({series: p.dataset.series, points: +p.dataset.points})),
    segments: [...svg.querySelectorAll('rect[data-bottleneck]')].map(r => r.dataset.bottleneck),
    past_edge: [...svg.querySelectorAll('rect[data-bottleneck]')].filter(r =>
      +r.getAttribute('x') + +r.getAttribute('width') > svg.viewBox.baseVal.width - 4 + 0.5).length,
    bands: svg.querySelectorAll('rect[data-band]').length})),
  knee: (document.querySelector('[data-role=knee]') || {}).textContent || '',
  kneeShown: !!document.querySelector('[data-role=knee]') && document.querySelector('[data-role=knee]').getBoundingClientRect().height > 0,
  rows: [...document.querySelectorAll('table.stages tbody tr')].map(tr => ({text: tr.textContent,
    shown: tr.getBoundingClientRect().height > 0,
    bound: (tr.querySelector('.rbadge') || {dataset: {}}).dataset.bottleneck,
    colour: tr.querySelector('.rbadge') ? getComputedStyle(tr.querySelector('.rbadge')).backgroundColor : ''})),
  scroll: document.documentElement.scrollWidth, inner: innerWidth,
}))()"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    files = [t for t, _ in recording(FOLDER)]
    half = files[len(files) // 2]
    light = write_result(tmp / "light.json", vllm_result(files[0] + 8, 8, 1, 150.0, 20.0))
    heavy = write_result(tmp / "heavy.json", vllm_result(half + 10, 20, 40, 4000.0, 30.0))
    out = tmp / "report.html"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvwatch",
            "report",
            FOLDER,
            "--bench",
            light,
            "--bench",
            heavy,
            "--slo-ttft-p99",
            "1",
            "--max-num-seqs",
            "2",
            "--out",
            out,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def page(report):
    browser = Browser(ARTIFACTS / "logs")
    try:
        browser.start()
        p = browser.new_page()
        p.set_viewport(1280, 800)
        p.goto(report.as_uri())
        yield p
    finally:
        browser.stop()


def test_every_chart_has_points_and_the_knee_and_stages_are_shown(page):
    r = page.evaluate(READ)
    charts = {c["chart"]: c for c in r["charts"]}
    assert set(charts) == {"bottleneck", "kv", "requests", "tokens", "preemptions", "ttft", "itl"}, charts.keys()
    for name, c in charts.items():
        if name == "bottleneck":
            assert c["segments"] and set(c["segments"]) <= {str(b) for b in Bottleneck}, c
            assert c["past_edge"] == 0, c  # the last scrape's segment ends at the recording's end
            continue
        assert c["paths"] and all(p["points"] > 0 for p in c["paths"]), c
        assert c["bands"] == 2, c  # the two stages, shaded behind every chart
    assert r["kneeShown"] and "light.json" in r["knee"] and "heavy.json" in r["knee"], r["knee"]
    assert [row["shown"] for row in r["rows"]] == [True, True]
    assert r["rows"][1]["bound"] == "max_num_seqs" and r["rows"][1]["colour"] != "rgba(0, 0, 0, 0)"
    page.screenshot(ARTIFACTS / "report-1280.png")
    assert page.console_errors == [], page.console_errors


@pytest.mark.parametrize("width,height,mobile", [(1280, 800, False), (375, 812, True)], ids=["1280x800", "375px"])
def test_it_fits_without_sideways_scrolling(page, width, height, mobile):
    page.set_viewport(width, height, mobile=mobile)
    try:
        fits = page.wait_for(
            f"""(() => {{
            const svgs = [...document.querySelectorAll('svg.chart')];
            const ok = innerWidth === {width} && svgs.length > 0 && svgs.every(s => s.viewBox.baseVal.width <= innerWidth)
                && document.documentElement.scrollWidth <= innerWidth;
            return ok && {{scroll: document.documentElement.scrollWidth, inner: innerWidth}};
        }})()""",
            timeout=30,
            what=f"the report to fit {width} px",
        )
        assert fits["scroll"] <= fits["inner"] == width
        wide = page.evaluate("""[...document.querySelectorAll('main *')].filter(el => {
            const r = el.getBoundingClientRect(); return r.width > 0 && (r.right > innerWidth + 1 || r.left < -1);
        }).map(el => el.tagName + '.' + el.className).slice(0, 5)""")
        assert wide == [], wide  # nothing sticks out (nor scrolls inside a box of its own)
        page.screenshot(ARTIFACTS / f"report-{width}px.png")
    finally:
        page.set_viewport(1280, 800)
    assert page.console_errors == [], page.console_errors


def test_accessibility_basics(page):
    report = page.evaluate(A11Y)
    assert report["main"] == 1 and report["banner_header"] == 1 and report["h1"] == 1, report
    assert report["heading_levels"][0] == 1 and not report["heading_skips"], report["heading_levels"]
    assert report["charts"] >= 7 and not report["charts_without_name"], report
    assert report["text_checked"] > 50, report
    assert not report["low_contrast"], report["low_contrast"]
    assert report["lang"] == "en" and report["title"]
    assert page.console_errors == [], page.console_errors
