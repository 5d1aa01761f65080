"""kvwatch against a real llama.cpp server under real load (issue 24): llama.cpp's own HTTP server from the pinned
xllamacpp wheel on a tiny random model (tests/helpers/llamacpp.py), and a real ``kvwatch run`` scraping it with
``--engine auto``.

Judged on kvwatch's own record of its successful scrapes (``/api/v1/history``), as the preset judges are, and the
load goes on until kvwatch has recorded enough scrapes of it (bounded): a starved machine stretches the run or
drops scrapes (llama.cpp answers /metrics late while it decodes on a busy core), it does not change what a correct
kvwatch says in each scrape it makes.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kvwatch.catalog import Bottleneck
from tests.helpers.llamacpp import llamacpp_server, make_tiny_gguf, prompt_of_tokens
from tests.helpers.ports import HOST, free_port
from tests.helpers.process import Process

pytestmark = pytest.mark.slow

PARALLEL = 2
# Not a limit a correct kvwatch may name for a llama.cpp server in any scrape of these runs (kv_cache: but for the run
# whose slots' context is too small).
NEVER = {
    Bottleneck.KV_CACHE,
    Bottleneck.TOKEN_BUDGET,
    Bottleneck.MAX_LORAS,
    Bottleneck.KV_TRANSFER,
    Bottleneck.ASLEEP,
    Bottleneck.STALLED,
    Bottleneck.UNREACHABLE,
}
DEADLINE = 240.0  # seconds of load at most before a test gives up waiting for kvwatch's scrapes


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("llamacpp") / "tiny.gguf")


class Kvwatch:
    def __init__(self, target: str, log: Path):
        self.url = f"http://{HOST}:{free_port()}"
        # 2-s scrapes with a 1.8-s timeout: a busy llama.cpp answers /metrics late, and a late answer is still one.
        argv = [
            sys.executable,
            "-m",
            "kvwatch",
            "run",
            "--target",
            target,
            "--listen",
            self.url.removeprefix("http://"),
            "--interval",
            "2",
            "--timeout",
            "1.8",
            "--window",
            "20",
            "--stale-after",
            "10",
        ]
        self.proc = Process(argv, log, name="kvwatch")

    def __enter__(self) -> Kvwatch:
        self.proc.start()
        self.proc.wait_for_url(self.url + "/healthz", timeout=30)
        self.proc.wait_until(self.scrapes, timeout=60, what="a first successful scrape")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()

    def get(self, path: str):
        r = httpx.get(self.url + path, trust_env=False, timeout=10)
        r.raise_for_status()
        return r

    def scrapes(self) -> list[dict]:
        """kvwatch's successful scrapes of the one engine: {requests_waiting, requests_running, bottleneck, ...}."""
        (target,) = self.get("/api/v1/history").json()["targets"]
        if not target["engines"]:
            return []
        (engine,) = target["engines"]
        series = engine["series"]
        return [dict(zip(series, row, strict=True)) for row in zip(*series.values(), strict=True)]


def load_until(server, enough: Callable[[], bool], *, concurrency: int, prompt: int, n_predict: int) -> list[int]:
    """Send requests, ``concurrency`` at a time, until ``enough()`` (checked every second) or DEADLINE; then let the
    ones in flight finish. Returns their HTTP statuses."""
    stop = threading.Event()
    statuses: list[int] = []
    counter = itertools.count()

    def client() -> None:
        while not stop.is_set():
            statuses.append(server.complete(prompt_of_tokens(prompt, next(counter)), n_predict).status_code)

    with ThreadPoolExecutor(concurrency) as pool:
        for _ in range(concurrency):
            pool.submit(client)
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end and not enough():
            time.sleep(1.0)
        stop.set()
    return statuses


def test_more_requests_than_slots_name_the_slot_ceiling(model: Path, tmp_path: Path) -> None:
    with (
        llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=1024) as server,
        Kvwatch(server.url + "/metrics", tmp_path / "kvwatch.log") as kv,
    ):
        start = len(kv.scrapes())

        def deferred() -> list[dict]:
            return [s for s in kv.scrapes()[start:] if (s["requests_waiting"] or 0) >= 2]

        # 16 clients on 2 slots: 14 requests deferred whenever kvwatch looks, until it has looked 6 times.
        statuses = load_until(server, lambda: len(deferred()) >= 6, concurrency=16, prompt=64, n_predict=384)
        diag = kv.get("/api/v1/diagnosis").json()
        scrapes, seen = kv.scrapes(), deferred()
    assert statuses and set(statuses) == {200}
    assert diag["engine_type"] == "llamacpp"
    assert len(seen) >= 6, f"kvwatch recorded too few scrapes with requests deferred in {DEADLINE:.0f} s: {scrapes}"
    named = [s["bottleneck"] for s in seen]
    # Every scrape with requests deferred names the slot ceiling, read from the busy slots, bar a queue's first.
    assert named.count(Bottleneck.MAX_NUM_SEQS) >= len(named) - 1, named
    assert not NEVER & {s["bottleneck"] for s in scrapes}, scrapes
    assert all(s["max_num_seqs"] in (None, PARALLEL) for s in scrapes)


def test_one_request_at_a_time_names_no_limit(model: Path, tmp_path: Path) -> None:
    with (
        llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=1024) as server,
        Kvwatch(server.url + "/metrics", tmp_path / "kvwatch.log") as kv,
    ):
        start = len(kv.scrapes())

        def serving() -> list[dict]:
            return [s for s in kv.scrapes()[start:] if s["requests_running"]]

        statuses = load_until(server, lambda: len(serving()) >= 4, concurrency=1, prompt=64, n_predict=384)
        scrapes, seen = kv.scrapes(), serving()
    assert statuses and set(statuses) == {200}
    assert len(seen) >= 4, scrapes
    assert {s["bottleneck"] for s in scrapes} <= {Bottleneck.IDLE, Bottleneck.NONE}, scrapes


def test_a_context_too_small_names_the_full_slot_context(model: Path, tmp_path: Path) -> None:
    """The server cuts generations short at a slot's 256 tokens, and its /metrics shows no trace of it; its /slots
    (the helper starts it with --slots; kvwatch reads it right after /metrics) does: once a request has been cut short,
    every scrape under load names the per-slot context (kv_cache, high), with llama.cpp's own flags, never a healthy
    server and never "not judged"."""
    with (
        llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=512) as server,
        Kvwatch(server.url + "/metrics", tmp_path / "kvwatch.log") as kv,
    ):
        start = len(kv.scrapes())
        diagnoses: list[dict] = []

        def named() -> list[dict]:
            return [s for s in kv.scrapes()[start:] if s["bottleneck"] == Bottleneck.KV_CACHE]

        def enough() -> bool:
            diagnoses.extend(kv.get("/api/v1/diagnosis").json()["engines"])
            return len(named()) >= 4

        # 200-token prompts asking for 200 more: each is cut short at its slot's 256 tokens (HTTP 200, truncated)
        statuses = load_until(server, enough, concurrency=2, prompt=200, n_predict=200)
        scrapes = kv.scrapes()[start:]
    assert statuses and set(statuses) == {200}  # each cut short at the slot's context, not refused
    kv_named = [i for i, s in enumerate(scrapes) if s["bottleneck"] == Bottleneck.KV_CACHE]
    assert len(kv_named) >= 4, f"kvwatch named the per-slot context in too few scrapes in {DEADLINE:.0f} s: {scrapes}"
    # once named, it stays named while the load goes on: never a healthy server in between
    assert kv_named == list(range(kv_named[0], kv_named[-1] + 1)), scrapes
    assert not (NEVER - {Bottleneck.KV_CACHE}) & {s["bottleneck"] for s in scrapes}, scrapes
    e = next(d for d in reversed(diagnoses) if d["bottleneck"] == Bottleneck.KV_CACHE)
    assert e["confidence"] == "high" and "slot's 256-token context" in e["evidence"][0], e["evidence"]
    assert not any(line.startswith("KV cache not judged") for line in e["evidence"]), e["evidence"]
    assert {r["flag"] for r in e["recommendations"]} == {
        "--cache-type-k q8_0 --cache-type-v q8_0",
        "--ctx-size",
        "--parallel",
    }


def test_with_kv_unified_a_request_filling_the_whole_context_is_named_too(model: Path, tmp_path: Path) -> None:
    """--kv-unified (llama-server's default without --parallel): every slot's n_ctx is the whole --ctx-size (512
    here, not 256), one pool the slots share. A request that fills all of it is cut short as in a slot of its own, and
    kvwatch names it the same way; one request at a time, so the pool itself never overflows (that, /slots cannot
    show)."""
    with (
        llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=512, kv_unified=True) as server,
        Kvwatch(server.url + "/metrics", tmp_path / "kvwatch.log") as kv,
    ):
        assert {s["n_ctx"] for s in server.slots()} == {512}
        start = len(kv.scrapes())
        diagnoses: list[dict] = []

        def enough() -> bool:
            diagnoses.extend(kv.get("/api/v1/diagnosis").json()["engines"])
            return sum(s["bottleneck"] == Bottleneck.KV_CACHE for s in kv.scrapes()[start:]) >= 2

        statuses = load_until(server, enough, concurrency=1, prompt=200, n_predict=400)
        scrapes = kv.scrapes()[start:]
    assert statuses and set(statuses) == {200}
    assert sum(s["bottleneck"] == Bottleneck.KV_CACHE for s in scrapes) >= 2, scrapes
    assert not (NEVER - {Bottleneck.KV_CACHE}) & {s["bottleneck"] for s in scrapes}, scrapes
    e = next(d for d in reversed(diagnoses) if d["bottleneck"] == Bottleneck.KV_CACHE)
    assert "slot's 512-token context" in e["evidence"][0], e["evidence"]
