"""Real vLLM with a small per-step token budget and long prompts: chunked prefill runs ~250 tokens per engine
step with ~5 of 64 sequences and KV ≈ 0.13 while the rest wait — the token budget binds (token_budget),
diagnosed with and without the ``--max-num-batched-tokens`` hint.
"""

from __future__ import annotations

import pytest

from .harness import Sample, counts, log
from .scenario import MIN_SAMPLES, brief, describe, run_scenario

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

BUDGET = 256
SERVER_ARGS = ["--max-model-len", "2048", "--kv-cache-memory-bytes", str(256 * 1024 * 1024),
               "--max-num-seqs", "64", "--max-num-batched-tokens", str(BUDGET)]
#: 120 requests of 1800 prompt + 30 generated tokens, all at once (~27 s on 2 cores)
BURST = dict(num_requests=120, input_len=1800, output_len=30, max_seconds=90)
WARMUP = 5.0
SHARE = 0.8


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory("token_budget", SERVER_ARGS)


def vllm_step_tokens(samples: list[Sample], saturated_at: set[float], t0: float) -> float | None:
    """Mean tokens per engine step from vLLM's own iteration_tokens_total histogram, over the spans between
    consecutive reads of vLLM that both saw requests waiting (``saturated_at``: their times less ``t0``), so
    the drain at the end of a round of load never counts. None if there is no such span."""
    read = [s for s in samples if s.vllm]
    tokens = steps = 0.0
    for a, b in zip(read, read[1:]):
        if round(a.t - t0, 2) in saturated_at and round(b.t - t0, 2) in saturated_at:
            tokens += b.vllm.value("vllm:iteration_tokens_total_sum", engine="0") - \
                a.vllm.value("vllm:iteration_tokens_total_sum", engine="0")
            steps += b.vllm.value("vllm:iteration_tokens_total_count", engine="0") - \
                a.vllm.value("vllm:iteration_tokens_total_count", engine="0")
    return tokens / steps if steps else None


async def test_token_budget(server, scenario_dir, vocab_size):
    variants = {"hint": ["--max-num-batched-tokens", str(BUDGET)], "nohint": []}
    run = await run_scenario("token_budget", scenario_dir, server, load=BURST, vocab_size=vocab_size,
                             variants=variants, record_seconds=40, min_saturated=MIN_SAMPLES, warmup=WARMUP)
    assert run.load.failed == 0, run.load.failure(server)
    assert run.record_rc == 0 and run.record_files >= 20, (run.record_rc, run.record_files)
    sats = {v: run.saturated(v, WARMUP) for v in variants}
    # ground truth while requests waited, from vLLM's own counters as the test read them
    step = vllm_step_tokens(run.samples["nohint"], {r.t for r in sats["nohint"]}, run.t_load_start)
    run.write_summary(saturated={v: describe(s) for v, s in sats.items()}, vllm_mean_step_tokens=step)
    log(f"[token_budget] vLLM mean step tokens while waiting: {step}")
    assert step is not None, f"no two reads of vLLM in a row saw requests waiting: {brief(describe(sats['nohint']))}"
    # the scenario itself: steps are full, sequences and KV have room
    # (vLLM counts the token sampled when a prefill completes on top of the scheduled ones, so a full step can
    # read a little above the budget)
    assert 0.8 * BUDGET <= step <= 1.1 * BUDGET, step
    for v, sat in sats.items():
        info = describe(sat)
        log(f"[token_budget/{v}] saturated: {brief(info)}")
        assert len(sat) >= MIN_SAMPLES, f"{v}: too few saturated samples: {brief(info)}"
        assert info["vllm_kv"]["max"] < 0.5 and info["vllm_running"]["max"] < 32, brief(info)
        bn = counts(r.bottleneck for r in sat)
        assert bn.get("token_budget", 0) >= SHARE * len(sat), f"{v}: bottleneck while waiting: {bn}"
        assert "kv_cache" not in bn and "max_num_seqs" not in bn, f"{v}: wrong limit named: {bn}"
        steps = [r.kw.get("step_tokens") for r in sat if r.kw.get("step_tokens") is not None]
        assert steps and all(abs(x - step) <= 0.2 * step for x in steps), \
            f"{v}: kvwatch_engine_step_tokens {steps} vs vLLM's {step:.1f}"
    configured = [r.kw.get("budget_configured") for r in run.rows["hint"] if r.up == 1]
    assert set(configured) == {BUDGET}, f"kvwatch_max_num_batched_tokens{{source=configured}}: {counts(configured)}"
