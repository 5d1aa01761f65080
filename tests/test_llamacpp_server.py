"""The real llama.cpp server harness works (tests/helpers/llamacpp.py): llama.cpp's own HTTP server from the pinned
xllamacpp wheel, on a tiny random model written here, under real load.

These read the server's raw /metrics and /slots, not kvwatch: they prove in CI that the harness the llama.cpp
adapter's tests stand on starts, serves llama.cpp's families, and shows the slot ceiling and a too-small context
the way tests/fixtures/engines/llamacpp/captures/README.md says.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.llamacpp import llamacpp_server, make_tiny_gguf, prompt_of_tokens

pytestmark = pytest.mark.slow

PARALLEL = 2
N_PREDICT = 384


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_gguf(tmp_path_factory.mktemp("llamacpp") / "tiny.gguf")


def samples(text: str) -> dict[str, float]:
    """``{name: value}`` of llama.cpp's exposition as served: one unlabelled ``name value`` line a family. (Read
    raw: prometheus_client's parser would rename ``llamacpp:n_tokens_max``, a counter without ``_total``, to
    ``llamacpp:n_tokens_max_total``.)"""
    lines = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert all(len(fields) == 2 and fields[0].startswith("llamacpp:") for fields in lines), text
    return {name: float(value) for name, value in lines}


def scrape_during(server, load) -> list[dict[str, float]]:
    """/metrics every 0.2 s while ``load()`` runs in a thread, then once after; the parsed samples."""
    done = threading.Event()

    def run() -> None:
        try:
            load()
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    seen = []
    while not done.wait(0.2):
        seen.append(samples(server.metrics()))
    thread.join()
    seen.append(samples(server.metrics()))
    return seen


def test_more_requests_than_slots_are_deferred_while_every_slot_is_busy(model: Path, tmp_path: Path) -> None:
    n_requests = 8
    with llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=1024) as server:
        assert samples(server.metrics())["llamacpp:requests_processing"] == 0

        def load() -> None:
            with ThreadPoolExecutor(n_requests) as pool:
                statuses = list(
                    pool.map(
                        lambda i: server.complete(prompt_of_tokens(64, i), N_PREDICT).status_code, range(n_requests)
                    )
                )
            assert statuses == [200] * n_requests

        seen = scrape_during(server, load)
        overloaded = [s for s in seen if s["llamacpp:requests_deferred"] > 0]
        assert overloaded, f"no scrape saw a deferred request: {seen}"
        # A request waits in the deferred queue only while every slot is taken: the slot ceiling is seen. Not in every
        # such scrape: /metrics' task goes to the front of the server's queue, so it can land between a slot's release
        # and the deferred request it re-queued taking it (kvwatch/engines/llamacpp.py; a CI run saw 1 busy slot).
        assert any(s["llamacpp:requests_processing"] == PARALLEL for s in overloaded), overloaded
        assert all(s["llamacpp:requests_processing"] <= PARALLEL for s in seen), seen
        assert max(s["llamacpp:requests_deferred"] for s in seen) <= n_requests - PARALLEL
        final = seen[-1]
        assert final["llamacpp:requests_processing"] == 0 and final["llamacpp:requests_deferred"] == 0
        assert final["llamacpp:tokens_predicted_total"] == n_requests * N_PREDICT  # ignore_eos: full length
        assert final["llamacpp:prompt_tokens_total"] + final["llamacpp:prompt_tokens_cached_total"] == n_requests * 64
        # Two slots decoded together for most steps: the lifetime average is well above one busy slot.
        assert 1.2 < final["llamacpp:n_busy_slots_per_decode"] <= PARALLEL


def test_one_request_at_a_time_is_never_deferred(model: Path, tmp_path: Path) -> None:
    with llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=1024) as server:

        def load() -> None:
            for i in range(4):
                assert server.complete(prompt_of_tokens(64, i), N_PREDICT).status_code == 200

        seen = scrape_during(server, load)
        assert all(s["llamacpp:requests_deferred"] == 0 for s in seen), seen
        assert max(s["llamacpp:requests_processing"] for s in seen) <= 1
        assert seen[-1]["llamacpp:n_busy_slots_per_decode"] == 1
        assert seen[-1]["llamacpp:tokens_predicted_total"] == 4 * N_PREDICT


def test_a_context_too_small_refuses_long_prompts_and_cuts_long_generations(model: Path, tmp_path: Path) -> None:
    # 512 tokens of context shared by 2 slots: 256 a slot (llama.cpp's smallest per-slot context as well).
    with llamacpp_server(model, tmp_path / "llama.log", parallel=PARALLEL, ctx_size=512) as server:
        assert [slot["n_ctx"] for slot in server.slots()] == [256, 256]
        refused = server.complete(prompt_of_tokens(300), 8)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert (error["type"], error["n_prompt_tokens"], error["n_ctx"]) == ("exceed_context_size_error", 300, 256)

        cut = server.complete(prompt_of_tokens(200, 1), 200)
        assert cut.status_code == 200  # context shift is off by default: the generation stops at the slot's end
        body = cut.json()
        assert body["truncated"] is True and body["tokens_evaluated"] == 200
        assert body["tokens_predicted"] < 200 and body["tokens_evaluated"] + body["tokens_predicted"] <= 256

        final = samples(server.metrics())
        # /metrics keeps no trace of the refusal: the refused prompt's 300 tokens are not counted anywhere.
        assert final["llamacpp:prompt_tokens_total"] + final["llamacpp:prompt_tokens_cached_total"] == 200
        assert final["llamacpp:n_tokens_max"] <= 256
        # /slots does: the slot that ran is full to its n_ctx (the last token sampled is not stored).
        slot_tokens = sorted(slot.get("n_prompt_tokens", 0) for slot in server.slots())
        assert slot_tokens[-1] == 255, server.slots()
