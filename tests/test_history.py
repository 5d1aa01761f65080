"""The status page's history (kvwatch/history.py) and ``/api/v1/history``: bounded, parsed strictly, its JSON shape.

The endpoint is served by the real aiohttp app (aiohttp's test client) over a Monitor fed real vLLM 0.32
captures through ``Target.observe_body`` — no network, so it stays in the fast lane.
"""

from __future__ import annotations

import math

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvwatch.app import Monitor
from kvwatch.catalog import Bottleneck
from kvwatch.config import ConfigError, load_settings
from kvwatch.history import ENGINE_FIELDS, MAX_SAMPLES, TARGET_FIELDS, Ring, TargetHistory, parse_seconds
from kvwatch.page import add_page_routes
from kvwatch.state import Target
from tests.helpers.recordings import FIXTURES, recording

NAMES = {str(b) for b in Bottleneck}


def test_ring_is_bounded_and_keeps_the_newest_rows():
    ring = Ring(("t", "x"), capacity=5)
    assert ring.nbytes == 5 * 2 * 8  # samples x fields x 8 bytes, allocated once
    for i in range(12):
        ring.append((float(i), None if i == 10 else i * 2.0))
    assert ring.size == 5 and ring.nbytes == 80
    assert ring.since(-math.inf) == {"t": [7.0, 8.0, 9.0, 10.0, 11.0], "x": [14.0, 16.0, 18.0, None, 22.0]}
    assert ring.since(9.5) == {"t": [10.0, 11.0], "x": [None, 22.0]}
    assert ring.last_t == 11.0


def _replay(target: Target, scenario: str, n: int | None = None) -> list[float]:
    times = []
    for t, f in recording(FIXTURES / scenario)[:n]:
        target.observe_body(t, f.read_text())
        target.up = True
        d = target.diagnosis = target.diagnose(t)
        target.history.record(d)
        times.append(t)
    return times


def test_history_records_each_scrape_per_engine_and_its_bottleneck():
    target = Target("http://x:1/metrics", history_seconds=900, history_samples=901)
    times = _replay(target, "kv_cache")
    doc = target.history.as_dict(target.target, times[-1], 900)
    assert set(doc) == {"target", "series", "engines"} and doc["target"] == "http://x:1/metrics"
    assert list(doc["series"]) == list(TARGET_FIELDS) and doc["series"]["up"] == [1.0] * len(times)
    (engine,) = doc["engines"]
    assert (engine["model_name"], engine["engine"]) == ("tiny-llama-dummy", "0")
    s = engine["series"]
    assert list(s) == list(ENGINE_FIELDS) and all(len(v) == len(times) for v in s.values())
    assert s["t"] == [round(t, 4) for t in times]
    assert set(s["bottleneck"]) <= NAMES and str(Bottleneck.KV_CACHE) in s["bottleneck"]
    assert max(v for v in s["kv_cache_usage_ratio"] if v is not None) > 0.9  # the KV-bound capture
    assert any(v for v in s["preemptions_per_second"] if v)
    assert any(v is not None for v in s["time_to_first_token_seconds_p99"])
    # The diagnosis at each time and the history agree.
    assert s["bottleneck"][-1] == str(target.diagnosis.bottleneck)


def test_history_is_bounded_by_samples_whatever_the_scrapes():
    target = Target("http://x:1/metrics", history_seconds=900, history_samples=10)
    times = _replay(target, "kv_cache", 40)
    h = target.history
    assert h.target.size == 10 and h.nbytes == 10 * 8 * (len(TARGET_FIELDS) + len(ENGINE_FIELDS))
    assert len(h.as_dict("x", times[-1], 1e9)["engines"][0]["series"]["t"]) == 10


def test_a_failed_scrape_records_the_target_but_no_engine_values():
    target = Target("http://x:1/metrics")
    times = _replay(target, "kv_cache", 5)
    target.observe_failure(times[-1] + 1, "connect: refused")
    target.history.record(target.diagnose(times[-1] + 1))
    doc = target.history.as_dict("x", times[-1] + 1, 900)
    assert doc["series"]["up"][-1] == 0.0
    assert len(doc["engines"][0]["series"]["t"]) == 5  # the window's old samples are not charted again


def test_engines_gone_for_longer_than_the_history_are_forgotten_and_rings_are_capped():
    h = TargetHistory(seconds=60, samples=61, max_engines=2)
    target = Target("http://x:1/metrics")
    times = _replay(target, "kv_cache", 3)
    d = target.diagnose(times[-1])
    engine = d.engines[0]
    for i, key in enumerate(["a", "b", "c", "d"]):  # four engines, room for max_engines + 1 = 3 rings
        engine.engine = key
        d.timestamp = 1000.0 + i
        h.record(d)
    assert sorted(k[1] for k in h.engines) == ["b", "c", "d"]  # the one heard from longest ago went
    d.engines = []
    d.timestamp = 1000.0 + 3 + 61
    h.record(d)
    assert h.engines == {}


@pytest.mark.parametrize("raw,expected", [(None, 900.0), ("60", 60.0), ("0.5", 0.5), ("1e9", 900.0), (" 30 ", 30.0)])
def test_seconds_parsing(raw, expected):
    assert parse_seconds(raw, 900.0) == expected


@pytest.mark.parametrize(
    "raw", ["", "abc", "nan", "inf", "-inf", "-1", "0", "1e309", "5s", "0x10", "1,5", "x" * 10_000]
)
def test_bad_seconds_is_a_clear_error(raw):
    with pytest.raises(ValueError, match="seconds must be"):
        parse_seconds(raw, 900.0)


def test_history_setting_and_its_memory_bound():
    s = load_settings(target=["http://x:1/metrics"], history="300", interval="0.5")
    assert s.history == 300 and s.history_samples == 601
    assert Target.from_settings("http://x:1/metrics", s).history.samples == 601
    assert load_settings(target=["http://x:1/metrics"]).history == 900  # 15 min by default
    for bad in ("0", "-5", "abc", str(8 * 86400)):
        with pytest.raises(ConfigError, match=r"--history \(env KVWATCH_HISTORY\)"):
            load_settings(target=["http://x:1/metrics"], history=bad)
    with pytest.raises(ConfigError, match=f"more than {MAX_SAMPLES} samples"):
        load_settings(target=["http://x:1/metrics"], history="86400", interval="0.1")


def test_history_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVWATCH_HISTORY", "120")
    assert load_settings(target=["http://x:1/metrics"]).history == 120


@pytest.fixture
async def client():
    settings = load_settings(target=["http://127.0.0.1:1/metrics", "http://u:pw@127.0.0.1:2/metrics"], history="600")
    monitor = Monitor(settings)
    target = monitor.targets[settings.target[0]]
    _replay(target, "kv_cache")
    monitor.clock = lambda: target.last_success
    app = web.Application()
    add_page_routes(app, monitor)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_history_endpoint_json_shape(client):
    r = await client.get("/api/v1/history")
    assert r.status == 200 and r.content_type == "application/json"
    doc = await r.json()
    assert set(doc) == {
        "now",
        "seconds",
        "history_seconds",
        "interval",
        "engine_fields",
        "target_fields",
        "bytes",
        "targets",
    }
    assert doc["seconds"] == doc["history_seconds"] == 600  # the default: all that is kept
    assert doc["engine_fields"] == list(ENGINE_FIELDS) and doc["target_fields"] == list(TARGET_FIELDS)
    assert [t["target"] for t in doc["targets"]] == [
        "http://127.0.0.1:1/metrics",
        "http://<secret>@127.0.0.1:2/metrics",
    ]
    assert doc["bytes"] == 2 * 601 * 8 * len(TARGET_FIELDS) + 601 * 8 * len(ENGINE_FIELDS)
    first, second = doc["targets"]
    assert len(first["engines"]) == 1 and second["engines"] == [] and second["series"]["t"] == []
    n = len(first["engines"][0]["series"]["t"])
    assert n == len(recording(FIXTURES / "kv_cache")) and all(t <= doc["now"] for t in first["series"]["t"])


async def test_history_endpoint_seconds_selects_the_last_n_seconds(client):
    all_t = (await (await client.get("/api/v1/history")).json())["targets"][0]["series"]["t"]
    doc = await (await client.get("/api/v1/history", params={"seconds": "5"})).json()
    t = doc["targets"][0]["series"]["t"]
    assert doc["seconds"] == 5 and t == [x for x in all_t if x >= doc["now"] - 5] and 0 < len(t) < len(all_t)
    big = await (await client.get("/api/v1/history", params={"seconds": "99999"})).json()
    assert big["seconds"] == 600  # cut to what is kept, and said


@pytest.mark.parametrize(
    "query",
    [
        "seconds=",
        "seconds=abc",
        "seconds=-3",
        "seconds=0",
        "seconds=nan",
        "seconds=inf",
        "seconds=1e999",
        "seconds=%00",
        "seconds=" + "9" * 5000,
    ],
)
async def test_history_endpoint_bad_seconds_is_400_with_a_json_error(client, query):
    r = await client.get("/api/v1/history?" + query)
    assert r.status == 400 and r.content_type == "application/json"
    doc = await r.json()
    assert doc["parameter"] == "seconds" and doc["error"].startswith("seconds must be") and len(doc["error"]) < 200
    assert (await client.get("/api/v1/history")).status == 200  # and kvwatch carries on


async def test_history_endpoint_target_selects_one_target(client):
    doc = await (await client.get("/api/v1/history", params={"target": "http://<secret>@127.0.0.1:2/metrics"})).json()
    assert [t["target"] for t in doc["targets"]] == ["http://<secret>@127.0.0.1:2/metrics"]
    doc = await (
        await client.get("/api/v1/history", params={"target": "http://127.0.0.1:1/metrics", "seconds": "3"})
    ).json()
    assert [t["target"] for t in doc["targets"]] == ["http://127.0.0.1:1/metrics"] and doc["seconds"] == 3
    for label in ("http://u:pw@127.0.0.1:2/metrics", "nope", ""):  # only the redacted label names a target
        r = await client.get("/api/v1/history", params={"target": label})
        assert r.status == 404 and (await r.json())["parameter"] == "target"


def test_ring_since_finds_the_first_row_at_or_after_t0_across_the_wrap():
    ring = Ring(("t",), capacity=7)
    for i in range(10):  # wraps: rows 3..9 kept, the oldest in the middle of the arrays
        ring.append((float(i),))
    for t0, first in [(-1, 3), (3, 3), (3.5, 4), (6, 6), (9, 9)]:
        assert ring.since(t0)["t"] == [float(x) for x in range(first, 10)], t0
    assert ring.since(9.5)["t"] == [] and Ring(("t",), 3).since(0)["t"] == []
