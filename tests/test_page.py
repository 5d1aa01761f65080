"""The status page's files as kvwatch serves them: self-contained, small, and speaking the catalogue's words.

(What the page does in a browser is tests/test_status_page_browser.py, in the slow lane.)
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvwatch.app import Monitor
from kvwatch.catalog import Action, Bottleneck, KvPressure
from kvwatch.config import load_settings
from kvwatch.engines import ENGINES
from kvwatch.page import ASSETS, GRAFANA_HEX, add_page_routes, contrast_ratio
from tests.test_catalog import FLAG_NAMES

PAGE_BUDGET = 200 * 1024  # the page and every asset it loads, together
EVIL = 'http://127.0.0.1:1/metrics?x=</script><script>alert(1)</script>&y=<b>"'


@pytest.fixture
async def client():
    monitor = Monitor(load_settings(target=[EVIL, "http://u:hunter2@127.0.0.1:2/metrics"], max_num_seqs="16"))
    app = web.Application()
    add_page_routes(app, monitor)
    async with TestClient(TestServer(app)) as c:
        yield c


def _config(html: str) -> dict:
    m = re.search(r'<script type="application/json" id="kvwatch-config">(.*?)</script>', html, re.S)
    assert m, "no embedded config"
    return json.loads(m.group(1))


async def test_page_and_assets_are_under_200_kb_and_load_nothing_from_elsewhere(client):
    r = await client.get("/")
    assert r.status == 200 and r.content_type == "text/html"
    html = await r.text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    local = [u for u in refs if not u.startswith("data:")]
    assert all(not re.match(r"^[a-z]+:|^//", u) for u in local), refs  # relative: works behind port-forward
    assets = [u.split("?")[0] for u in local if u.startswith("static/")]
    assert sorted(a.removeprefix("static/") for a in assets) == sorted(ASSETS)
    total = len(html.encode())
    for a in assets:
        ar = await client.get("/" + a)
        assert ar.status == 200 and ar.headers["X-Content-Type-Options"] == "nosniff"
        body = await ar.read()
        total += len(body)
        text = body.decode()
        # No URL to anywhere but the SVG namespace (an identifier, never fetched); no CSS import or remote font.
        assert not [u for u in re.findall(r"https?://[^\s\"')]+", text) if u != "http://www.w3.org/2000/svg"], a
        assert "@import" not in text and "@font-face" not in text and not re.search(r"url\((?!\s*data:)", text), a
    assert total < PAGE_BUDGET, f"page + assets = {total} bytes"
    assert {"content-type"} <= {k.lower() for k in r.headers}
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
    for link in ('href="metrics"', 'href="api/v1/diagnosis"', 'href="api/v1/history"', 'href="healthz"'):
        assert link in html


async def test_the_catalogue_is_served_to_the_page_not_copied_into_it(client):
    html = await (await client.get("/")).text()
    cfg = _config(html)
    assert [b["name"] for b in cfg["bottlenecks"]] == [str(b) for b in Bottleneck]
    for b, c in zip(Bottleneck, cfg["bottlenecks"], strict=True):
        assert (c["label"], c["meaning"], c["severity"], c["colour"]) == (
            b.label,
            b.meaning,
            b.severity,
            GRAFANA_HEX[b.colour],
        )
        assert contrast_ratio(c["colour"], c["ink"]) >= 4.5, b  # the badge's text reads on its colour
    assert cfg["actions"] == {
        str(a): {"meaning": a.meaning, "flags": {e.name: e.flag(a) for e in ENGINES}} for a in Action
    }
    assert {k: v["label"] for k, v in cfg["kv_pressure"].items()} == {str(k): k.label for k in KvPressure}
    assert cfg["thresholds"] == {"admission_stall": 0.9, "preemption_risk": 0.95} and cfg["hints"]["max_num_seqs"] == 16
    assert cfg["history_seconds"] == 900 and cfg["poll_seconds"] == 1.0
    for name in ("page.js", "charts.js", "report.js"):  # the page's scripts, and the report's
        js = resources.files("kvwatch").joinpath("static", name).read_text()
        spelled = [str(b) for b in Bottleneck if str(b) not in FLAG_NAMES and re.search(rf"[\"']{b}[\"']", js)]
        assert not spelled, f"{name} names bottlenecks itself: {spelled}"
        for b in Bottleneck:
            assert b.meaning not in js  # the sentences come from the catalogue too


async def test_target_labels_are_redacted_and_cannot_break_out_of_the_page(client):
    html = await (await client.get("/")).text()
    assert "hunter2" not in html
    assert "</script><script>" not in html and "<b>" not in html  # escaped inside the JSON
    assert _config(html)["targets"] == [EVIL, "http://<secret>@127.0.0.1:2/metrics"]  # and still the same text


async def test_only_the_page_assets_are_served_and_revalidated(client):
    for path in ("/static/index.html", "/static/../page.py", "/static/%2e%2e%2fpage.py", "/static/nope.js", "/static/"):
        r = await client.get(path)
        assert r.status == 404, path
    r = await client.get("/static/page.css")
    assert r.status == 200 and r.content_type == "text/css" and r.headers["Cache-Control"] == "no-cache"
    again = await client.get("/static/page.css", headers={"If-None-Match": r.headers["ETag"]})
    assert again.status == 304


def test_the_assets_are_package_data():
    # pyproject.toml's package-data ships them in the wheel (the Docker image installs the wheel).
    for name in (*ASSETS, "index.html"):
        assert resources.files("kvwatch").joinpath("static", name).is_file()
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert "static/*" in project["tool"]["setuptools"]["package-data"]["kvwatch"]
