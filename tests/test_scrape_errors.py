"""What a user reads of a failed scrape: the log names it once per change of state, never once per scrape, and
its words say what came back ("unreachable" only when the network is to blame), in the log, the JSON and the
CLI, while the metric's reason label stays the catalogue's."""

from __future__ import annotations

import logging

import pytest

from kvwatch.app import Monitor
from kvwatch.catalog import ScrapeReason
from kvwatch.cli import render_text
from kvwatch.config import load_settings
from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.monitor import Clock, kvwatch_lines, open_monitor, scrape
from tests.helpers.ports import free_port

NETWORK = {ScrapeReason.CONNECT, ScrapeReason.TIMEOUT}


@pytest.fixture
async def upstream():
    async with FakeVllm() as up:
        up.serve_dir("kv_cache")
        up.index = 12
        yield up


async def test_a_target_that_never_answers_is_logged_at_its_first_failure(caplog):
    caplog.set_level(logging.INFO, logger="kvwatch")
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    m = open_monitor(dead)
    try:
        await scrape(m, 4)
    finally:
        await m.stop()
    warnings = kvwatch_lines(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings  # the first failure, not one a scrape
    assert dead in warnings[0] and "(connect)" in warnings[0] and "unreachable" in warnings[0], warnings


async def test_the_log_follows_changes_of_state_not_scrapes(caplog, upstream):
    caplog.set_level(logging.INFO, logger="kvwatch")
    m = open_monitor(upstream.url)
    events = []

    async def step(mode: str, n: int) -> None:
        upstream.mode = mode
        before = len(caplog.records)
        await scrape(m, n)
        events.append([(r.levelname, r.getMessage()) for r in caplog.records[before:] if r.name == "kvwatch"])

    upstream.status = 404
    try:
        await step("status", 3)  # never up: one warning, at the first failure
        await step("html", 2)  # another reason: one more
        await step("ok", 3)  # down -> up: one info line
        await step("status", 2)  # up -> down: one warning
        await step("status", 2)  # still down, same reason: nothing
    finally:
        await m.stop()
    assert [[level for level, _ in e] for e in events] == [["WARNING"], ["WARNING"], ["INFO"], ["WARNING"], []], events
    label = m.targets[upstream.url].target
    assert events[0][0][1] == f"scrape of {label} failed (http_status): HTTP 404 — is the path /metrics?"
    assert events[1][0][1].startswith(f"scrape of {label} failed (html): an HTML page, not metrics")
    assert events[2][0][1] == f"scraping {label}"


@pytest.mark.parametrize(
    "mode, reason, words",
    [
        ("status", "http_status", "HTTP 404 — is the path /metrics?"),
        ("html", "html", "an HTML page, not metrics"),
        ("login", "html", "an HTML page, not metrics"),
        ("garbage", "decode", "not UTF-8"),
        ("metadata_only", "no_vllm_metrics", "metrics, but none from a serving engine"),
        ("truncate", "parse", "not Prometheus metrics"),
        ("slow", "timeout", "unreachable"),
    ],
)
async def test_each_failure_has_its_own_words_and_keeps_its_label(upstream, mode, reason, words):
    upstream.mode, upstream.status, upstream.delay = mode, 404, 5.0
    m = open_monitor(upstream.url)
    try:
        await scrape(m)
    finally:
        await m.stop()
    t = m.targets[upstream.url]
    assert t.errors[reason] == 1 and sum(t.errors.values()) == 1  # the metric's reason label, as before
    assert words in t.last_error, t.last_error
    assert ("unreachable" in t.last_error) == (reason in NETWORK), t.last_error
    doc = m.diagnosis_json()  # the JSON API (and the status page, which reads it)
    assert (doc["error"], doc["error_reason"]) == (t.last_error, reason)
    m.clock.t += 10  # stale: the target's bottleneck is unreachable, the CLI's line says why in these words
    text = render_text(t.diagnose(m.clock()))
    assert text == f"{t.target}: {t.last_error}", text
    assert ("unreachable" in text) == (reason in NETWORK), text


async def test_a_refused_connection_is_unreachable():
    dead = f"http://127.0.0.1:{free_port()}/metrics"
    m = open_monitor(dead)
    try:
        await scrape(m)
    finally:
        await m.stop()
    assert m.targets[dead].last_error.startswith("unreachable: ConnectError"), m.targets[dead].last_error


async def test_an_unreadable_token_file_is_not_called_unreachable(tmp_path, upstream):
    token = tmp_path / "token"
    token.write_text("zq7\nxk9")  # a line break in the middle: no header can carry it
    m = Monitor(load_settings(target=[upstream.url], bearer_token_file=str(token)), clock=Clock())
    m.open()
    t = m.targets[upstream.url]
    errors = []
    try:
        await scrape(m)
        errors.append(t.last_error)
        token.unlink()
        await scrape(m)
        errors.append(t.last_error)
    finally:
        await m.stop()
    assert t.errors["connect"] == 2 and upstream.requests == 0  # counted as before; nothing sent
    # h11 would refuse the header with its value in the message ("Illegal header value b'Bearer zq7\\nxk9'")
    assert "zq7" not in errors[0] and "xk9" not in errors[0] and "a header cannot carry" in errors[0], errors
    assert all("unreachable" not in e and "bearer token file" in e for e in errors), errors


def test_only_the_network_reasons_say_unreachable():
    for reason in ScrapeReason:
        assert "{detail}" in reason.text, reason
        assert ("unreachable" in reason.text) == (reason in NETWORK) == reason.network, reason
