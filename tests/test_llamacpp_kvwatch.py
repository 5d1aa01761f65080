"""kvwatch against a real llama.cpp server under real load (issue 24): llama.cpp's own HTTP server from the pinned
xllamacpp wheel on a tiny random model (tests/helpers/llamacpp.py), and a real ``kvwatch run`` scraping it with
``--engine auto``.

Judged on kvwatch's own record of its successful scrapes (``/api/v1/history``), as the preset judges are: a slow
machine stretches the load, it does not change what a correct kvwatch says in each scrape.
"""

from __future__ import annotations

import sys
import threading
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
# Not a limit: what a correct kvwatch may say of a llama.cpp server in any scrape of these runs.
NEVER = {
    Bottleneck.KV_CACHE,
    Bottleneck.TOKEN_BUDGET,
    Bottleneck.MAX_LORAS,
    Bottleneck.KV_TRANSFER,
    Bottleneck.ASLEEP,
    Bottleneck.STALLED,
    Bottleneck.UNREACHABLE,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("llamacpp") / "tiny.gguf")


class Kvwatch:
    def __init__(self, target: str, log: Path):
        self.url = f"http://{HOST}:{free_port()}"
        argv = [
            sys.executable,
            "-m",
            "kvwatch",
            "run",
            "--target",
            target,
            "--listen",
            self.url.removeprefix("http://"),
        ]
        self.proc = Process(argv, log, name="kvwatch")

    def __enter__(self) -> Kvwatch:
        self.proc.start()
        self.proc.wait_for_url(self.url + "/healthz", timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()

    def get(self, path: str):
        r = httpx.get(self.url + path, trust_env=False, timeout=10)
        r.raise_for_status()
        return r

    def scrapes(self) -> list[dict]:
        """kvwatch's successful scrapes of the one engine: {requests_waiting, requests_running, bottleneck}."""
        (target,) = self.get("/api/v1/history").json()["targets"]
        engines = target["engines"]
        if not engines:
            return []
        (engine,) = engines
        series = engine["series"]
        return [dict(zip(series, row, strict=True)) for row in zip(*series.values(), strict=True)]


def run_load(server, n_requests: int, concurrency: int, prompt: int, n_predict: int) -> list[int]:
    with ThreadPoolExecutor(concurrency) as pool:
        return list(
            pool.map(lambda i: server.complete(prompt_of_tokens(prompt, i), n_predict).status_code, range(n_requests))
        )


def test_more_requests_than_slots_name_the_slot_ceiling(model: Path, tmp_path: Path) -> None:
    with (
        llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=1024) as server,
        Kvwatch(server.url + "/metrics", tmp_path / "kvwatch.log") as kv,
    ):
        kv.proc.wait_until(lambda: kv.scrapes(), timeout=30, what="a first successful scrape")
        # 32 requests of 384 tokens through 2 slots, 16 at a time: ~14 s of deferral at ~900 tokens/s (longer on a
        # busy machine), so a dozen 1-s scrapes or more see requests deferred.
        assert run_load(server, 32, 16, 64, 384) == [200] * 32
        diag = kv.get("/api/v1/diagnosis").json()
        scrapes = kv.scrapes()
    assert diag["engine_type"] == "llamacpp"
    deferred = [s for s in scrapes if (s["requests_waiting"] or 0) >= 2]
    assert len(deferred) >= 5, f"kvwatch saw too few scrapes with requests deferred: {scrapes}"
    named = [s["bottleneck"] for s in deferred]
    # Every scrape with requests deferred names the slot ceiling, read from the busy slots, bar a queue's first.
    assert named.count(Bottleneck.MAX_NUM_SEQS) >= len(named) - 1, named
    assert not NEVER & {s["bottleneck"] for s in scrapes}, scrapes
    assert all(s["max_num_seqs"] in (None, PARALLEL) for s in scrapes)


def test_one_request_at_a_time_names_no_limit(model: Path, tmp_path: Path) -> None:
    with (
        llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=1024) as server,
        Kvwatch(server.url + "/metrics", tmp_path / "kvwatch.log") as kv,
    ):
        kv.proc.wait_until(lambda: kv.scrapes(), timeout=30, what="a first successful scrape")
        assert run_load(server, 6, 1, 64, 384) == [200] * 6
        scrapes = kv.scrapes()
    assert len(scrapes) >= 3
    assert {s["bottleneck"] for s in scrapes} <= {Bottleneck.IDLE, Bottleneck.NONE}, scrapes


def test_a_context_too_small_is_never_called_a_healthy_kv_cache(model: Path, tmp_path: Path) -> None:
    """The server refuses a prompt longer than a slot's context and cuts generations short, and its /metrics shows
    neither: kvwatch must say it did not judge the KV cache, never imply it is fine."""
    with (
        llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=512) as server,
        Kvwatch(server.url + "/metrics", tmp_path / "kvwatch.log") as kv,
    ):
        kv.proc.wait_until(lambda: kv.scrapes(), timeout=30, what="a first successful scrape")
        done = threading.Event()
        seen: list[dict] = []

        def load() -> None:
            try:
                statuses = run_load(server, 8, 2, 200, 200)  # each cut short at the slot's 256 tokens
                assert statuses == [200] * 8
            finally:
                done.set()

        thread = threading.Thread(target=load)
        thread.start()
        while not done.wait(0.5):
            seen.append(kv.get("/api/v1/diagnosis").json())
        thread.join()
    serving = [e for d in seen for e in d["engines"] if e["signals"].get("requests_running")]
    assert serving, seen
    for e in serving:
        assert e["bottleneck"] not in NEVER
        assert any(line.startswith("KV cache not judged") for line in e["evidence"]), e["evidence"]
