"""llama.cpp's ``/slots``, read right after ``/metrics`` (kvwatch.engines.ExtraSource), never fails, delays past the
deadline or crashes a scrape: a 501 (a server started without ``--slots``), a slow, garbage, oversized or
wrongly-shaped body leaves the scrape up and the snapshot without the per-slot context (the diagnosis then says the KV
cache was not judged), and the log says why once per change of state, not once per scrape.

The upstream is a real HTTP server on loopback serving the real llama.cpp captures (tests/helpers/fake_llamacpp.py);
kvwatch's Monitor scrapes it exactly as in production.
"""

from __future__ import annotations

import logging
import time

import pytest

from kvwatch.catalog import Bottleneck
from kvwatch.snapshot import Gauge
from tests.helpers.fake_llamacpp import FakeLlamaCpp
from tests.helpers.fake_vllm import bomb
from tests.helpers.monitor import kvwatch_lines, open_monitor, scrape, scraped
from tests.helpers.recordings import captures

KEY = ("", "0")  # llama.cpp's one engine: its metrics have no labels


@pytest.fixture
async def llama():
    async with FakeLlamaCpp() as up:
        up.serve_capture("context_too_small")
        up.index = 3  # the first sample with a slot busy
        yield up


# (slots_mode, what the log line names)
FAULTS = [
    ("status", "(http_status: HTTP 501; start llama-server with --slots (recent builds serve it unless --no-slots))"),
    ("slow", "(timeout: "),
    ("garbage", "(unreadable: not llama.cpp's /slots)"),
    ("html", "(html: "),
    ("huge", "(too_large: "),
    ("bomb", "(too_large: "),
    ("wrong_types", "(unreadable: not llama.cpp's /slots)"),
    ("deep", "(unreadable: not llama.cpp's /slots)"),
    ("huge_numbers", "(unreadable: not llama.cpp's /slots)"),
]


@pytest.mark.parametrize(("mode", "says"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_a_broken_slots_never_fails_the_scrape(llama, caplog, mode, says):
    caplog.set_level(logging.INFO, logger="kvwatch")
    m = open_monitor(llama.url, max_body_bytes=1_000_000)  # huge's 20 MB and bomb's 256 MiB against a 1 MB cap
    if mode in ("huge", "bomb"):
        # About the cap, not the deadline (as tests/test_faults.py): 5 s, so that a starved machine cannot turn a
        # too_large into a timeout before the first MB arrives; the bomb is built before the clock starts.
        bomb()
        m.fetcher.cfg = type(m.fetcher.cfg)(5.0, 1_000_000)
    state = m.targets[llama.url]
    try:
        await scrape(m, 2)
        assert state.engines[KEY].latest.slots is not None  # read while it answers
        llama.slots_mode = mode
        started = time.monotonic()
        await scrape(m, 2)
        # slow lasts 30 s, sixty times the 0.5-s deadline (huge and bomb: 5 s): a fetch that ignored it would take
        # the whole 30 s, twice
        assert time.monotonic() - started < 15.0
        assert state.up and not any(state.errors.values()), state.errors  # the scrape itself succeeded
        latest = state.engines[KEY].latest
        assert state.extra_error is not None and latest.slots is None  # the snapshot lacks the per-slot context
        assert Gauge.CONTEXT_USED_MAX_RATIO not in latest.gauges
        assert state.diagnosis.engines and state.diagnosis.bottleneck is not Bottleneck.UNREACHABLE
        warned = kvwatch_lines(caplog)
        assert len(warned) == 1 and "/slots" in warned[0] and says in warned[0], warned  # once, not once a scrape
        llama.slots_mode = "ok"
        await scrape(m, 1)
        assert state.extra_error is None and state.engines[KEY].latest.slots is not None
        infos = [r.getMessage() for r in caplog.records if r.name == "kvwatch" and r.levelno == logging.INFO]
        assert any(line.startswith("reading /slots of ") and line.endswith(" again") for line in infos), infos
    finally:
        await m.stop()


async def test_without_slots_the_kv_cache_is_not_judged_and_the_log_says_how_to_turn_it_on(llama, caplog):
    caplog.set_level(logging.INFO, logger="kvwatch")
    llama.slots_mode = "status"
    state = await scraped(llama.url, 6)
    (e,) = state.diagnosis.engines
    assert state.up and e.bottleneck is not Bottleneck.KV_CACHE
    (line,) = [x for x in e.evidence if x.startswith("KV cache not judged")]
    assert "start llama-server with --slots" in line, line
    # tried at every scrape while it serves (a server restarted with --slots is read at once): the capture's bodies 3-7
    # have requests or progress, the 6th scrape's (body 8) neither, after one without requests: not asked then
    assert llama.slots_requests == 5
    assert len(kvwatch_lines(caplog)) == 1


async def test_with_slots_the_same_scrapes_name_the_full_slot_context(llama):
    state = await scraped(llama.url, 4)
    (e,) = state.diagnosis.engines
    assert e.bottleneck is Bottleneck.KV_CACHE and e.confidence == "high", e.evidence
    assert state.extra_error is None and llama.slots_requests == 4


async def test_an_idle_server_is_not_asked_for_its_slots_so_it_can_sleep():
    """Reading /slots is a task in llama.cpp's loop: it wakes a server asleep (--sleep-idle-seconds) and restarts its
    idle timer. kvwatch asks only while the server has requests, had them at the scrape before, or made progress."""
    async with FakeLlamaCpp() as up:
        up.serve_capture("context_too_small")
        up.serve(*up.bodies[8:])  # after the load: nothing running, the counters still
        state = await scraped(up.url, 6)
    assert state.up and up.slots_requests == 0
    (e,) = state.diagnosis.engines
    assert e.bottleneck is Bottleneck.IDLE and not any("--slots" in line for line in e.evidence), e.evidence


async def test_an_engine_without_an_extra_path_is_never_asked_for_one():
    async with FakeLlamaCpp() as up:
        up.serve(*captures("kv_cache")[10:14])  # vLLM's metrics at /metrics
        state = await scraped(up.url, 3)
    assert state.diagnosis.engine_type == "vllm"
    assert up.slots_requests == 0


async def test_the_slots_url_keeps_the_targets_prefix_and_query():
    async with FakeLlamaCpp() as up:
        up.serve_capture("context_too_small")
        up.index = 3
        await scraped(up.url + "?format=prometheus", 2)
    assert up.slots_requests == 2 and up.slots_queries == ["format=prometheus"] * 2


class _ElsewhereLlamaCpp(FakeLlamaCpp):
    def add_routes(self, app) -> None:
        super().add_routes(app)
        app.router.add_get("/stats/prometheus", self.handle)  # a proxy's own path for the metrics


async def test_a_target_path_not_ending_in_metrics_says_where_slots_cannot_be_found(caplog):
    caplog.set_level(logging.INFO, logger="kvwatch")
    async with _ElsewhereLlamaCpp() as up:
        up.serve_capture("context_too_small")
        up.index = 3
        state = await scraped(up.base_url + "/stats/prometheus", 3)
    assert state.up and up.slots_requests == 0
    (warned,) = kvwatch_lines(caplog)
    assert "(path: the target's path does not end in /metrics, so where /slots is is not known)" in warned, warned
