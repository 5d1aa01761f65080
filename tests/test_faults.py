"""A down, slow, broken or hostile upstream never crashes kvwatch: it reports kvwatch_up 0 and recovers.

The upstream is a real HTTP server on loopback (tests/helpers/fake_vllm.py) serving real vLLM captures, with
faults injected on demand; kvwatch's Monitor scrapes it exactly as in production.
"""

import asyncio
import random
import re
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.app import Monitor
from kvwatch.catalog import ScrapeReason
from kvwatch.config import load_settings
from kvwatch.export import KvwatchCollector, worst_case
from kvwatch.scrape import FetchConfig, Fetcher, ScrapeError
from kvwatch.snapshot import MAX_LABEL_CHARS, OVERFLOW
from tests.fault_table import ALL, UPSTREAM
from tests.helpers.fake_vllm import FakeVllm, bomb
from tests.helpers.monitor import Clock
from tests.helpers.recordings import captures

REPO = Path(__file__).resolve().parents[1]


def render(monitor) -> dict:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(KvwatchCollector(lambda: monitor.targets.values()))
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "target")))] = s.value
    return out


def value(metrics, name, **labels):
    return metrics.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
async def upstream():
    async with FakeVllm() as up:
        up.serve_dir("kv_cache")
        up.index = 12  # mid-run: KV-bound
        yield up


@pytest.fixture
async def monitor(upstream):
    settings = load_settings(target=[upstream.url], interval=1.0, timeout=0.5, stale_after=5.0)
    clock = Clock()
    m = Monitor(settings, clock=clock)
    m.open()
    yield m, clock
    await m.stop()


async def good_scrapes(m, clock, n):
    for _ in range(n):
        clock.t += 1
        await m.scrape_once(m.settings.target[0])


ENGINE = {"engine": "0", "model_name": "tiny-llama-dummy"}

FAULTS = [(f.id, f.reason) for f in UPSTREAM]  # tests/fault_table.py: docs/faults.md's fault table comes from it


@pytest.mark.parametrize("mode, reason", FAULTS, ids=[f[0] for f in FAULTS])
async def test_fault_sets_up_0_counts_reason_and_recovers(monitor, upstream, mode, reason):
    m, clock = monitor
    # slow and drip last 30 s, sixty times the 0.5-s deadline: a fetch that ignored the deadline would take
    # them whole, one that keeps it ends in 0.5 s; the bound below sits between, far from both.
    upstream.delay = 30.0
    if mode in ("huge", "flood"):
        # This case and bomb are about the cap, not the deadline: 5 s, so that a starved machine (CI at load 10,
        # pytest-xdist beside it) cannot turn a too_large into a timeout before the first MB arrives.
        m.fetcher.cfg = type(m.fetcher.cfg)(5.0, 1_000_000)  # a 20 MB body against a 1 MB cap
    if mode == "bomb":
        bomb()  # build it before the clock starts: compressing 256 MiB is the server's cost, not ours
        m.fetcher.cfg = type(m.fetcher.cfg)(5.0, 16 << 20)
    await good_scrapes(m, clock, 3)
    metrics = render(m)
    assert value(metrics, "kvwatch_up") == 1.0
    assert value(metrics, "kvwatch_bottleneck", bottleneck="kv_cache", **ENGINE) == 1.0

    upstream.mode = mode
    requests = upstream.requests
    started = time.monotonic()
    await good_scrapes(m, clock, 1)
    # Bounded by the deadline (0.5 or 5 s), never the fault's 30 s (or never, for endless and flood).
    assert time.monotonic() - started < 15.0
    metrics = render(m)
    assert value(metrics, "kvwatch_up") == 0.0
    assert value(metrics, "kvwatch_scrape_errors_total", reason=reason) == 1.0
    assert sum(v for k, v in metrics.items() if k[0] == "kvwatch_scrape_errors_total") == 1.0  # that reason only
    error = m.targets[upstream.url].last_error
    if mode == "redirect":
        assert upstream.requests == requests + 1  # not followed
        assert "302" in error and "sso.example/login" in error and "hunter2" not in error and "abc" not in error
    if reason == "html":
        assert "HTML page" in error
    # Still fresh (one bad scrape is within stale-after): the last good values remain, correctly labelled.
    assert value(metrics, "kvwatch_requests_waiting", **ENGINE) is not None

    upstream.mode = "ok"
    await good_scrapes(m, clock, 1)
    metrics = render(m)
    assert value(metrics, "kvwatch_up") == 1.0
    assert value(metrics, "kvwatch_bottleneck", bottleneck="kv_cache", **ENGINE) == 1.0


async def test_timeouts_at_any_point_of_a_fetch_never_wedge_the_target(upstream):
    """A timeout cancels the fetch wherever it is; at some points httpcore keeps the cancelled
    request's connection slot for good (seen in the memory benchmark: after a few thousand scrapes
    at a 25 ms deadline one target timed out forever, vLLM fast). Deadlines of 0-2 ms land
    everywhere; afterwards a normal fetch must succeed (without a fresh client after a timeout it
    fails here in most runs)."""
    fetcher = Fetcher(FetchConfig(timeout=1.0, max_body_bytes=16 << 20), "test")
    rng = random.Random(7)
    outcomes = {"ok": 0, "timeout": 0}
    try:
        for _ in range(400):
            fetcher.cfg = FetchConfig(timeout=rng.uniform(0.0, 0.002), max_body_bytes=16 << 20)
            try:
                await fetcher.fetch(upstream.url)
                outcomes["ok"] += 1
            except ScrapeError as e:
                assert e.reason == "timeout", e
                outcomes["timeout"] += 1
        assert outcomes["timeout"] >= 20, outcomes  # the cancellation path was taken, many times
        fetcher.cfg = FetchConfig(timeout=2.0, max_body_bytes=16 << 20)
        for _ in range(3):
            assert "vllm:num_requests_waiting" in await fetcher.fetch(upstream.url)
    finally:
        await fetcher.aclose()


async def test_down_then_stale_series_are_withdrawn_then_recover(monitor, upstream):
    m, clock = monitor
    await good_scrapes(m, clock, 4)
    await upstream.stop()  # connection refused from now on
    for _ in range(8):
        await good_scrapes(m, clock, 1)
        metrics = render(m)
        assert value(metrics, "kvwatch_up") == 0.0
    assert value(metrics, "kvwatch_scrape_errors_total", reason="connect") == 8.0
    # 8 s without a good scrape > stale-after 5 s: no derived series, and the target says unreachable.
    assert not [k for k in metrics if k[0] == "kvwatch_kv_cache_usage_ratio"]
    assert not [k for k in metrics if k[0] == "kvwatch_bottleneck"]
    assert value(metrics, "kvwatch_target_bottleneck", bottleneck="unreachable") == 1.0
    assert m.diagnosis_json()["bottleneck"] == "unreachable"

    await upstream.start()
    await good_scrapes(m, clock, 1)
    metrics = render(m)
    assert value(metrics, "kvwatch_up") == 1.0
    assert value(metrics, "kvwatch_requests_waiting", **ENGINE) is not None


async def test_counter_reset_on_vllm_restart_gives_no_negative_rate(monitor, upstream):
    m, clock = monitor
    bodies = captures("kv_cache")
    upstream.serve(*bodies[14:20], *bodies[9:14], loop=False)  # counters jump back: a restart
    for i in range(11):
        await good_scrapes(m, clock, 1)
        metrics = render(m)
        for name in (
            "kvwatch_prompt_tokens_per_second",
            "kvwatch_generation_tokens_per_second",
            "kvwatch_preemptions_per_second",
        ):
            v = value(metrics, name, **ENGINE)
            # a rate needs two samples: from the second good scrape on, through the reset, there is one, never < 0
            assert (v is not None or i == 0) and (v is None or v >= 0), (name, i, v)
    assert m.targets[upstream.url].engines[("tiny-llama-dummy", "0")].resets >= 1


async def test_renamed_or_missing_metric_exports_what_is_still_valid(monitor, upstream):
    m, clock = monitor
    body = captures("kv_cache")[15]
    upstream.serve(body.replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_renamed"))
    await good_scrapes(m, clock, 3)
    metrics = render(m)
    assert value(metrics, "kvwatch_up") == 1.0
    assert value(metrics, "kvwatch_requests_waiting", **ENGINE) == 66.0  # capture 15 of kv_cache
    assert value(metrics, "kvwatch_kv_cache_usage_ratio", **ENGINE) is None  # unknown, not invented
    assert sum(v for k, v in metrics.items() if k[0] == "kvwatch_bottleneck") == 1.0


async def test_gzip_is_accepted(monitor, upstream):
    m, clock = monitor
    upstream.mode = "gzip"
    await good_scrapes(m, clock, 2)
    assert value(render(m), "kvwatch_up") == 1.0


async def test_100k_series_are_skipped_cheaply_and_do_not_block_the_loop(monitor, upstream, monkeypatch):
    """A 5 MB body is parsed off the event loop: the loop keeps ticking while the parse waits for it."""
    import threading

    import kvwatch.app as app_mod

    m, clock = monitor
    junk = "# HELP junk_series x\n# TYPE junk_series gauge\n" + "".join(
        f'junk_series{{id="{i}",pod="p{i % 97}"}} {i}\n' for i in range(100_000)
    )
    upstream.serve(junk + captures("kv_cache")[15])
    loop_ran = threading.Event()
    real_parse = app_mod.parse

    def parse_while_loop_runs(body, keep):
        loop_ran.clear()  # runs in the worker thread: the event loop must tick meanwhile
        assert loop_ran.wait(5.0), "the event loop did not run while a 5 MB body was parsed"
        return real_parse(body, keep)

    monkeypatch.setattr(app_mod, "parse", parse_while_loop_runs)

    async def ticker():
        while True:
            await asyncio.sleep(0.005)
            loop_ran.set()

    task = asyncio.create_task(ticker())
    m.fetcher.cfg = type(m.fetcher.cfg)(5.0, 16 << 20)  # generous deadline: this test is about the loop
    try:
        await good_scrapes(m, clock, 2)
    finally:
        task.cancel()
    metrics = render(m)
    assert value(metrics, "kvwatch_up") == 1.0
    assert value(metrics, "kvwatch_requests_waiting", **ENGINE) == 66.0  # the vLLM series among 100k others


async def test_bearer_token_is_sent_from_file_and_never_logged(upstream, tmp_path, caplog):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    settings = load_settings(target=[upstream.url], interval=1.0, bearer_token_file=token)
    m = Monitor(settings, clock=Clock())
    m.open()
    try:
        await m.scrape_once(upstream.url)
        upstream.mode = "status"
        await m.scrape_once(upstream.url)
    finally:
        await m.stop()
    assert upstream.auth_headers[0] == "Bearer s3cret-token"
    assert "s3cret" not in caplog.text and "s3cret" not in str(m.diagnosis_json())


async def _until(pred, timeout: float = 20.0) -> None:
    """Poll until ``pred()``: a bound for a loaded machine, not a measurement."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_the_scrape_loop_keeps_schedule_through_faults(upstream):
    settings = load_settings(target=[upstream.url], interval=0.2, timeout=0.1)
    m = Monitor(settings)
    started = time.monotonic()
    await m.start()
    try:
        await asyncio.sleep(0.5)
        upstream.mode = "slow"
        await _until(lambda: m.targets[upstream.url].up is False)
        await asyncio.sleep(0.6)  # more failing ticks: time for a loop that retried at once to show it
        upstream.mode = "ok"
        await _until(lambda: m.targets[upstream.url].up is True)
        await asyncio.sleep(0.4)
    finally:
        await m.stop()
    elapsed = time.monotonic() - started
    # One scrape at start, then one per 0.2 s tick of the time that really passed (a loaded machine stretches
    # the sleeps): missed ticks are skipped, never bunched after the slow ones; +1 for the clocks' edges.
    assert m.scrapes <= elapsed / 0.2 + 2, (m.scrapes, round(elapsed, 2))


def _engines_body(pairs: int, label=lambda i: (f"m{i % 100}", str(i // 100))) -> str:
    """A real capture, then ``pairs`` more (model_name, engine) pairs with their queue gauges."""
    lines = []
    for i in range(pairs):
        model, engine = label(i)
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            lines.append(f'{name}{{engine="{engine}",model_name="{model}"}} 1.0')
    return captures("kv_cache")[15] + "\n".join(lines) + "\n"


async def test_10000_engines_fold_into_overflow_and_own_metrics_stay_bounded(monitor, upstream):
    m, clock = monitor
    upstream.serve(_engines_body(10_000))
    m.fetcher.cfg = type(m.fetcher.cfg)(10.0, 16 << 20)  # about the cap on engines, not the deadline
    await good_scrapes(m, clock, 3)
    metrics = render(m)
    max_engines = m.settings.max_engines
    assert value(metrics, "kvwatch_up") == 1.0
    # The capture's engine comes first and is kept; 10,000 + 1 pairs, max_engines kept, the rest folded.
    assert value(metrics, "kvwatch_folded_engines") == 10_001 - max_engines
    assert value(metrics, "kvwatch_requests_waiting", **ENGINE) == 66.0
    engines = {dict(k[1]).get("engine") + "/" + dict(k[1]).get("model_name") for k in metrics if "engine" in dict(k[1])}
    assert len(engines) == max_engines + 1 and f"{OVERFLOW}/{OVERFLOW}" in engines
    # The folded engines' queues add up in _overflow: 2 x 1.0 per pair for running + waiting, counted once each.
    assert value(metrics, "kvwatch_requests_running", engine=OVERFLOW, model_name=OVERFLOW) == 10_001 - max_engines
    reg = CollectorRegistry(auto_describe=False)
    reg.register(KvwatchCollector(lambda: m.targets.values(), lambda: 1))
    text = generate_latest(reg)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    bound = worst_case(1, max_engines, len(m.targets[upstream.url].target))
    assert series <= bound[0] and len(text) <= bound[1], (series, len(text), bound)


async def test_1mb_label_values_are_shortened_stably(monitor, upstream):
    m, clock = monitor
    big = "m" * (1 << 20)
    long_engine = "e" * (1 << 20)
    # Two 1 MB model names that differ only at the end: still two engines, with two labels.
    upstream.serve(_engines_body(2, lambda i: (big + str(i), long_engine)))
    m.fetcher.cfg = type(m.fetcher.cfg)(10.0, 16 << 20)
    await good_scrapes(m, clock, 2)
    first = render(m)
    await good_scrapes(m, clock, 1)
    second = render(m)
    labels = {dict(k[1])["model_name"] for k in second if k[0] == "kvwatch_requests_running"}
    assert len(labels) == 3 and "tiny-llama-dummy" in labels  # the capture's engine and the two long ones
    long = labels - {"tiny-llama-dummy"}
    assert all(
        len(v) == MAX_LABEL_CHARS and v.startswith("mmmm") and re.search(r"\.\.\.[0-9a-f]{16}$", v) for v in long
    )
    assert {dict(k[1])["model_name"] for k in first if k[0] == "kvwatch_requests_running"} == labels  # stable
    assert all(len(dict(k[1]).get("engine", "")) <= MAX_LABEL_CHARS for k in second)
    assert max(len(str(m.diagnosis_json())), 0) < 100_000  # the JSON API carries the short form too


@pytest.mark.parametrize("location", ["http://[::1", "/" + "x" * 100_000, ""])
async def test_a_hostile_redirect_location_is_a_redirect_error_kept_short(monitor, upstream, location):
    m, clock = monitor
    upstream.mode, upstream.redirect_to = "redirect", location
    await good_scrapes(m, clock, 1)
    t = m.targets[upstream.url]
    assert t.errors["redirect"] == 1 and len(t.last_error) < 300, t.last_error


def test_the_fault_table_names_real_tests_and_covers_every_reason():
    for f in ALL:
        path, _, name = f.test.partition("::")
        assert f"def {name}(" in (REPO / path).read_text(), f"{f.id}: {f.test} does not exist"
    assert {f.reason for f in ALL} - {None} == set(ScrapeReason), "a scrape error reason without a fault test"
    assert len({f.id for f in ALL}) == len(ALL)
