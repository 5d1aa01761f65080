"""vLLM's adapter (kvwatch/engines/vllm.py): every release's names onto one snapshot; window: rate() semantics and histogram quantiles."""

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.engines.vllm import keep_family
from kvwatch.engines.vllm import read as read_vllm
from kvwatch.parse import parse
from kvwatch.snapshot import OVERFLOW
from kvwatch.window import EngineHistory, histogram_quantile, summarize
from tests.helpers.recordings import FIXTURES, captures, recording

OLD = FIXTURES.parent / "vllm-old"


def snaps_of(body, **kw):
    return read_vllm(parse(body, keep_family), **kw)


def test_real_032_capture_maps_every_signal():
    body = captures("kv_cache")[19]
    ((key, s),) = snaps_of(body).items()
    assert key == ("tiny-llama-dummy", "0")
    assert s.gauges["requests_running"] == 4 and s.gauges["requests_waiting"] == 53
    assert s.gauges["requests_waiting_capacity"] == 53 and s.gauges["requests_waiting_deferred"] == 0
    assert s.gauges["kv_cache_usage_ratio"] == pytest.approx(0.95238, abs=1e-5)
    assert s.counters["preemptions"] == 41 and s.counters["prompt_tokens_computed"] == 12009
    assert set(s.histograms) == {
        "iteration_tokens",
        "request_prompt_tokens",
        "request_generation_tokens",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "queue_time_seconds",
    }
    assert s.cache.capacity_tokens == 2048 and s.cache.block_size == 32 and s.cache.num_gpu_blocks == 64
    assert s.cache.max_model_len == 1024  # 2048 tokens / concurrency 2.0
    assert s.cache.cache_dtype == "auto" and s.cache.enable_prefix_caching is True
    h = s.histograms["time_to_first_token_seconds"]
    assert h.count == 48 and h.bounds[-1] == math.inf and h.counts[-1] == 48


def test_every_032_capture_agrees_with_prometheus_client_values():
    """The canonical gauges equal what prometheus_client reads for the same vLLM samples."""
    for body in captures("token_budget"):
        (s,) = snaps_of(body).values()
        ref = {
            smp.name: smp.value
            for fam in text_string_to_metric_families(body)
            for smp in fam.samples
            if smp.name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:generation_tokens_total")
        }
        assert s.gauges["requests_running"] == ref["vllm:num_requests_running"]
        assert s.gauges["kv_cache_usage_ratio"] == ref["vllm:kv_cache_usage_perc"]
        assert s.counters["generation_tokens"] == ref["vllm:generation_tokens_total"]


def test_v0_names_without_engine_label():
    body = recording(OLD / "v0_0.6")[0][1].read_text()
    ((key, s),) = snaps_of(body).items()
    assert key == ("meta-llama/Llama-3.1-8B", "0")
    assert s.gauges["kv_cache_usage_ratio"] == 0.97  # from gpu_cache_usage_perc
    assert s.gauges["requests_swapped"] == 0
    assert "inter_token_latency_seconds" in s.histograms  # from time_per_output_token_seconds
    assert s.cache.capacity_tokens == 800 * 16  # no kv_cache_size_tokens in V0: blocks x block size
    assert s.cache.enable_prefix_caching is False


def test_v1_010_exports_both_kv_names_and_we_take_one_never_the_sum():
    body = recording(OLD / "v1_0.10")[0][1].read_text()
    assert "vllm:gpu_cache_usage_perc" in body and "vllm:kv_cache_usage_perc" in body
    (s,) = snaps_of(body).values()
    assert s.gauges["kv_cache_usage_ratio"] == 0.96
    assert s.counters["prefix_cache_queries"] == 20000 and s.counters["prefix_cache_hits"] == 5000


def test_ray_prefix_is_the_same_as_plain():
    plain = snaps_of(recording(OLD / "v1_0.10")[1][1].read_text())
    ray = snaps_of(recording(OLD / "ray")[1][1].read_text())
    (a,), (b,) = plain.values(), ray.values()
    assert a.gauges == b.gauges and a.counters == b.counters and a.cache == b.cache


def test_unknown_and_missing_families_are_not_fatal():
    body = '# TYPE something_else gauge\nsomething_else 1\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0",model_name="m"} 3\n'
    (s,) = snaps_of(body).values()
    assert s.gauges == {"requests_running": 3.0} and s.cache is None
    assert snaps_of("# TYPE other gauge\nother 1\n") == {}


def test_engines_beyond_the_cap_fold_into_overflow():
    lines = ["# TYPE vllm:num_requests_running gauge"]
    lines += [f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1' for i in range(10)]
    snaps = snaps_of("\n".join(lines) + "\n", max_engines=4)
    assert len(snaps) == 5
    assert snaps[(OVERFLOW, OVERFLOW)].gauges["requests_running"] == 6


def test_multi_engine_and_lora_info():
    body = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2\nvllm:num_requests_running{engine="1",model_name="m"} 5\n'
        "# TYPE vllm:lora_requests_info gauge\n"
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 100.0\n'
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b,c",waiting_lora_adapters="d"} 200.0\n'
    )
    snaps = snaps_of(body)
    assert snaps[("m", "1")].gauges["requests_running"] == 5
    assert (snaps[("m", "0")].lora_running, snaps[("m", "0")].lora_waiting, snaps[("m", "0")].max_lora) == (3, 1, 4)


# --- window ---------------------------------------------------------------------------------


def _snap(t, gen, hist_counts, waiting=1.0, running=1.0):
    body = (
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {gen}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        + "".join(
            f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{le}",model_name="m"}} {c}\n'
            for le, c in zip(("0.1", "1.0", "+Inf"), hist_counts, strict=False)
        )
        + f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {hist_counts[-1]}\n'
        + f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {hist_counts[-1] * 0.5}\n'
    )
    return t, snaps_of(body)[("m", "0")]


def test_counter_reset_is_an_increase_from_zero_never_negative():
    h = EngineHistory("m", "0", keep_seconds=100)
    for t, gen in [(0, 1000), (1, 1100), (2, 1200), (3, 50), (4, 150)]:  # vLLM restarted at t=3
        h.add(*_snap(t, gen, (0, 0, 0)))
    s = summarize(h, 4, 10)
    # 100 + 100 + 50 (from zero) + 100 tokens over 4 s
    assert s.throughput.generation_tokens_per_second == pytest.approx(350 / 4)
    assert h.resets == 1
    for a, b in zip(list(h.points), list(h.points)[1:], strict=False):
        assert b.counters["generation_tokens"] >= a.counters["generation_tokens"]


def test_histogram_window_delta_and_reset():
    h = EngineHistory("m", "0", keep_seconds=100)
    h.add(*_snap(0, 0, (10, 20, 20)))
    h.add(*_snap(1, 0, (10, 20, 30)))  # 10 new observations, all in (1, +Inf]
    h.add(*_snap(2, 0, (2, 2, 2)))  # reset: 2 observations <= 0.1 since restart
    s = summarize(h, 2, 10)
    q = s.latency.quantiles["time_to_first_token_seconds"]
    # window delta: 2 in (0, 0.1], 10 in (1, +Inf]; p50 lands in +Inf -> highest finite bound
    assert q[0.5] == 1.0 and q[0.99] == 1.0
    assert summarize(h, 2, 1.5).latency.quantiles["time_to_first_token_seconds"][0.5] == pytest.approx(0.05)


@pytest.mark.parametrize(
    "q, counts, want",
    [
        (0.5, [0, 10, 10], 0.55),  # linear inside (0.1, 1.0]
        (0.5, [10, 10, 10], 0.05),
        (0.99, [0, 0, 5], 1.0),  # +Inf bucket -> highest finite bound
        (0.5, [0, 0, 0], None),
    ],
)
def test_histogram_quantile_matches_prometheus(q, counts, want):
    got = histogram_quantile(q, (0.1, 1.0, math.inf), counts)
    assert got == (pytest.approx(want) if want is not None else None)


def test_window_is_bounded_in_time_and_count():
    h = EngineHistory("m", "0", keep_seconds=5, max_points=50)
    for t in range(1000):
        h.add(*_snap(t, t, (0, 0, 0)))
    assert len(h.points) <= 7 and h.points[-1].t == 999


def test_stall_is_measured_from_the_last_token():
    h = EngineHistory("m", "0", keep_seconds=100)
    for t in range(10):
        h.add(*_snap(t, 500 if t >= 3 else 100 * t, (0, 0, 0), waiting=3, running=2))
    s = summarize(h, 9, 20)
    assert s.throughput.stalled_seconds == 6  # last token at t=3


def test_no_step_ended_in_the_window_is_zero_steps_and_no_tokens_per_step():
    """vLLM observes vllm:iteration_tokens_total only for a step that emits output (a chunked prefill emits
    none before its last chunk): a window with the histogram and no new observation has 0 steps/s and no
    tokens per step; a source without the histogram has neither."""
    h = EngineHistory("tiny-llama-dummy", "0", keep_seconds=100)
    for t, body in enumerate(captures("token_budget")[:5]):  # before the load: exported, never observed
        h.add(t, snaps_of(body)[("tiny-llama-dummy", "0")])
    s = summarize(h, 4, 10)
    assert (
        s.throughput.steps_per_second == 0.0
        and s.throughput.engine_step_tokens is None
        and s.throughput.step_tokens_max is None
    )
    bare = EngineHistory("m", "0", keep_seconds=100)
    for t in range(3):
        bare.add(*_snap(t, 100 * t, (0, 0, 0)))
    s = summarize(bare, 2, 10)
    assert s.throughput.steps_per_second is None and s.throughput.engine_step_tokens is None


def test_step_tokens_max_is_the_bound_of_the_bucket_that_holds_every_step():
    # real vLLM 0.32, 1800-token prompts in 256-token chunks: decode steps read ~5 tokens, a prefill's end ~1805
    h = EngineHistory("tiny-llama-dummy", "0", keep_seconds=100)
    for t, body in enumerate(captures("token_budget")[10:16]):
        h.add(t, snaps_of(body)[("tiny-llama-dummy", "0")])
    s = summarize(h, 5, 10)
    assert s.throughput.step_tokens_max == 2048.0 and 200 < s.throughput.engine_step_tokens < 300


def test_waiting_streak_counts_only_the_latest_samples_in_a_row():
    # Stray arrivals two samples apart are not a queue that persisted: the streak restarts at every empty sample.
    h = EngineHistory("m", "0", keep_seconds=100)
    for t, waiting in enumerate([2, 0, 2, 0, 2]):
        h.add(*_snap(t, 100 * t, (0, 0, 0), waiting=waiting, running=6))
    s = summarize(h, 4, 10)
    assert (s.queue.waiting_samples, s.queue.waiting_streak) == (3, 1)
    h.add(*_snap(5, 500, (0, 0, 0), waiting=3, running=6))
    assert summarize(h, 5, 10).queue.waiting_streak == 2


def test_kv_usage_that_moves_is_progress_for_the_stall_detector():
    # e2e token_budget with two busy loops: one 1800-token prompt in 256-token chunks for 5.5 s, no token
    # counted (vLLM counts it when the prefill completes), KV usage 0.012 -> 0.036. Not a stall.
    def snap(t, kv):
        body = (
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 0\n'
            'vllm:generation_tokens_total{engine="0",model_name="m"} 0\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 1\n'
            'vllm:num_requests_waiting{engine="0",model_name="m"} 119\n'
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}\n'
        )
        return t, snaps_of(body)[("m", "0")]

    prefilling = EngineHistory("m", "0", keep_seconds=100)
    for t in range(8):
        prefilling.add(*snap(t, 0.012 + 0.004 * (t // 2)))  # a chunk every other sample
    assert (
        summarize(prefilling, 7, 10).throughput.stalled_seconds == 1
    )  # since the last chunk, not the last token (none)
    hung = EngineHistory("m", "0", keep_seconds=100)
    for t in range(8):
        hung.add(*snap(t, 0.036))
    assert summarize(hung, 7, 10).throughput.stalled_seconds == 7
