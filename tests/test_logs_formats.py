"""Every stats-line and start-up-line format `kvwatch logs` reads, built from vLLM's own format strings.

The format strings below are copied from vLLM's source (the file and release named with each); the
tests fill them with ``%`` exactly as vLLM's logger does, put vLLM's line header in front, and check
what comes out. tests/fixtures/logs/*.log are whole example logs in the same formats.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.diagnose import Hints
from kvwatch.logs import LogSession

LOGS = Path(__file__).parent / "fixtures" / "logs"

# vllm/engine/llm_engine.py, _log_system_stats (0.2 - 0.3): f-string, no trailing period.
V0_LLM_ENGINE = (
    "Avg prompt throughput: {:.1f} tokens/s, Avg generation throughput: {:.1f} tokens/s, "
    "Running: {} reqs, Swapped: {} reqs, Pending: {} reqs, GPU KV cache usage: {:.1f}%, CPU KV cache usage: {:.1f}%"
)
# vllm/engine/metrics.py, LoggingStatLogger.log (0.4 - 0.10): trailing period, then the prefix-cache line.
V0_METRICS = (
    "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, "
    "Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: %.1f%%."
)
V0_PREFIX = "Prefix cache hit rate: GPU: %.2f%%, CPU: %.2f%%"
# vllm/core/scheduler.py, _preempt: printed when num_cumulative_preemption % 50 == 0, with the count + 1.
V0_PREEMPT = (
    "Sequence group %s is preempted by %s mode because there is not enough KV cache space. This can affect "
    "the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more KV "
    "cache memory. total_num_cumulative_preemption=%d"
)
# vllm/v1/metrics/loggers.py (0.7): no KV field, a trailing space.
V1_07 = "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs "
# vllm/v1/metrics/loggers.py (0.8 - 0.10).
V1_08 = (
    "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
    "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%"
)


# vllm/v1/metrics/loggers.py LoggingStatLogger._log_iteration_details (0.33, commit 00ec631b), with
# --enable-logging-iteration-details: prefix, index, context requests/tokens, generation requests/tokens, elapsed
# ms, " (dummy)" or "", the KV device, KV usage, and the encoder suffix or "".
ITERATION = (
    "%sIteration(%d): %d context requests, %d context tokens, %d generation requests, %d generation tokens, "
    "iteration elapsed time: %.2f ms%s, %s KV cache usage: %.1f%%%s"
)
ENCODER = ", encoder inputs: %d, encoder output embeddings: %d"


def v1_032(
    engine,
    prompt,
    gen,
    running,
    waiting,
    kv,
    *,
    deferred=0,
    kv_fetch=None,
    preemptions=0,
    device="GPU",
    prefix=None,
    external=None,
    mm=None,
):
    """vllm/v1/metrics/loggers.py LoggingStatLogger.log in 0.32: optional parts in their order."""
    parts = [
        "Avg prompt throughput: %.1f tokens/s",
        "Avg generation throughput: %.1f tokens/s",
        "Running: %d reqs",
        "Waiting: %d reqs",
    ]
    args = [prompt, gen, running, waiting + deferred]
    if deferred > 0:
        parts.append("Deferred: %d reqs")
        args.append(deferred)
    if kv_fetch and any(kv_fetch):
        parts.append("KV fetch: %d waiting to start, %d in progress, %d completed waiting")
        args.extend(kv_fetch)
    if preemptions > 0:
        parts.append("Preemptions: %d")
        args.append(preemptions)
    parts.append("%s KV cache usage: %.1f%%")
    args.extend([device, kv * 100])
    if prefix is not None:
        parts.append("Prefix cache hit rate: %.1f%%")
        args.append(prefix * 100)
    if external is not None:
        parts.append("External prefix cache hit rate: %.1f%%")
        args.append(external * 100)
    if mm is not None:
        parts.append("MM cache hit rate: %.1f%%")
        args.append(mm * 100)
    return (f"Engine {engine:03d}: " + ", ".join(parts)) % tuple(args)


def v1(t, msg, proc="APIServer pid=1", where="loggers.py:335"):
    """vllm/logger.py's format (0.8+): '%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s'."""
    m, s = divmod(t, 60)
    return f"({proc}) INFO 12-01 10:{m:02d}:{s:02d} [{where}] {msg}"


def v0(t, msg, where="metrics.py:349", level="INFO"):
    """vllm/logger.py's format before 0.8: '%(levelname)s %(asctime)s %(filename)s:%(lineno)d] %(message)s'."""
    m, s = divmod(t, 60)
    return f"{level} 03-12 09:{m:02d}:{s:02d} {where}] {msg}"


def read(lines, hints=Hints()):
    s = LogSession(hints)
    for i, line in enumerate(lines, 1):
        s.feed(line, i)
    s.finish()
    return s


# ------------------------------------------------------------------------------------------- V0


def test_v0_llm_engine_format_without_period():
    s = read([v0(5, V0_LLM_ENGINE.format(2104.5, 88.2, 21, 0, 3, 61.3, 0.0), "llm_engine.py:624")])
    (r,) = s.results
    rec = r.record
    assert (rec.engine, rec.fmt, rec.clock) == ("0", "v0", "09:00:05")
    assert (rec.prompt_tokens_per_second, rec.generation_tokens_per_second) == (2104.5, 88.2)
    assert (rec.requests_running, rec.requests_swapped, rec.requests_waiting) == (21, 0, 3)
    assert rec.kv_cache_usage_ratio == pytest.approx(0.613) and rec.cpu_swap_usage_ratio == 0.0


def test_v0_metrics_format_with_period_and_its_prefix_cache_line():
    lines = [
        v0(5, V0_METRICS % (4821.7, 96.0, 64, 0, 0, 58.2, 0.0)),
        'INFO:     10.1.0.4:41822 - "POST /v1/chat/completions HTTP/1.1" 200 OK',  # between the two lines
        v0(5, V0_PREFIX % (37.5, 0.0), "metrics.py:365"),
        v0(10, V0_METRICS % (2210.4, 1402.6, 96, 3, 61, 99.2, 12.5)),
        v0(10, V0_PREFIX % (41.25, 0.0), "metrics.py:365"),
    ]
    s = read(lines)
    a, b = (r.record for r in s.results)
    assert a.prefix_cache_hit_ratio == pytest.approx(0.375) and b.prefix_cache_hit_ratio == pytest.approx(0.4125)
    assert b.requests_swapped == 3 and b.cpu_swap_usage_ratio == pytest.approx(0.125)
    d = s.results[1].diagnosis
    assert d.bottleneck == "kv_cache"
    assert "3 requests swapped out to CPU for lack of KV blocks" in d.evidence
    assert "3 requests in CPU swap space (CPU swap 12% used)" in s.results[1].notes  # the log's, beside the evidence
    assert not set(s.results[1].notes) & set(d.evidence)


def test_v0_preemptions_come_from_the_warnings_counter_not_their_number():
    stats = lambda t, w: v0(t, V0_METRICS % (100.0, 900.0, 40, 0, w, 99.0, 0.0))  # noqa: E731

    def warn(t, n, mode="RECOMPUTE"):
        return v0(
            t,
            V0_PREEMPT % ("cmpl-1", f"PreemptionMode.{mode}", n),  # noqa: E731
            "scheduler.py:1481",
            "WARNING",
        )

    lines = [
        stats(0, 5),
        warn(2, 1),
        stats(5, 9),
        stats(10, 12),
        warn(13, 51),
        warn(14, 101),
        stats(15, 20),
        warn(17, 151, "SWAP"),
        stats(20, 25),
    ]
    s = read(lines)
    assert [r.preemptions for r in s.results] == [None, 1, None, 100, 50]
    assert s.results[3].diagnosis.signals.throughput.preemptions_per_second == pytest.approx(
        20.0
    )  # 100 in a 5 s interval
    notes = " ".join(s.results[3].notes)
    assert "total_num_cumulative_preemption=101 (line 6)" in notes
    assert "no preemption warning in this interval" in " ".join(s.results[2].notes)
    assert "requests were moved to CPU swap space" in " ".join(s.results[4].notes)
    assert "lower_max_num_seqs" in [x.action for x in s.results[3].diagnosis.recommendations]


# ------------------------------------------------------------------------------------------- V1


def test_v1_07_line_without_kv_field():
    s = read(
        [v0(0, V1_07 % (100.0, 50.0, 3, 0), "loggers.py:78"), v0(5, V1_07 % (800.0, 120.5, 8, 2), "loggers.py:78")]
    )
    a, b = (r.record for r in s.results)
    assert (a.fmt, a.engine, a.kv_cache_usage_ratio, b.requests_waiting) == ("v1", "000", None, 2)
    assert b.requests_swapped is None


def test_v1_08_line():
    s = read([v1(0, V1_08 % (0, 3012.4, 212.9, 48, 12, 21.4, 8.2))])
    rec = s.results[0].record
    assert (rec.engine, rec.kv_device, rec.kv_cache_usage_ratio, rec.prefix_cache_hit_ratio) == (
        "000",
        "GPU",
        0.214,
        0.082,
    )
    assert rec.preemptions is None and rec.requests_deferred is None


def test_v1_032_optional_fields_in_their_order():
    line = v1_032(
        0,
        1532.8,
        2210.4,
        58,
        27,
        0.991,
        deferred=3,
        kv_fetch=(3, 1, 0),
        preemptions=7,
        prefix=0.402,
        external=0.9,
        mm=0.5,
    )
    assert "Waiting: 30 reqs, Deferred: 3 reqs, KV fetch: 3 waiting to start" in line  # deferred count in Waiting
    rec = read([v1(0, line)]).results[0].record
    assert (rec.requests_waiting, rec.requests_deferred, rec.kv_fetch, rec.preemptions) == (30, 3, (3, 1, 0), 7)
    assert rec.kv_cache_usage_ratio == 0.991 and rec.prefix_cache_hit_ratio == pytest.approx(0.402)  # not External's


@pytest.mark.parametrize("device", ["CPU", "XPU", "GPU", "TPU"])
def test_v1_device_named_kv_field_and_omitted_prefix_field(device):
    rec = read([v1(0, v1_032(0, 10.0, 20.0, 1, 0, 0.5, device=device))]).results[0].record
    assert (rec.kv_device, rec.kv_cache_usage_ratio, rec.prefix_cache_hit_ratio) == (device, 0.5, None)


def test_v1_preemptions_per_interval_feed_the_core():
    lines = [
        v1(10 * i, v1_032(0, 100.0, 900.0, 50, 20, 0.97, preemptions=p, prefix=0.0)) for i, p in enumerate((0, 6, 0))
    ]
    s = read(lines, Hints(max_num_seqs=256))
    assert [r.preemptions for r in s.results] == [None, 6, None]  # no field: not "0", unknown
    d = s.results[1].diagnosis
    assert (
        d.bottleneck == "kv_cache"
        and "0.6 preemptions/s: running requests lose their KV blocks and recompute" in d.evidence
    )


def test_all_deferred_waiting_is_not_a_capacity_limit():
    s = read([v1(0, v1_032(0, 0.0, 400.0, 9, 0, 0.31, deferred=4, device="XPU"))])
    d = s.results[0].diagnosis
    assert d.bottleneck == "undetermined" and d.confidence == "low"  # 4 wait: not "none" (issue 25)
    assert any("all 4 waiting requests are deferred" in e for e in d.evidence)


def test_deferred_waiting_for_remote_kv_is_kv_transfer_as_on_metrics():
    """The same queue with 0.32's `KV fetch` field: every deferred request waits on a remote KV load, which the
    /metrics path (num_requests_kv_fetch_by_stage) names kv_transfer; the log now says the same."""
    s = read([v1(0, v1_032(0, 0.0, 400.0, 9, 0, 0.31, deferred=4, kv_fetch=(3, 1, 0), device="XPU"))])
    d = s.results[0].diagnosis
    assert d.bottleneck == "kv_transfer", d.evidence
    assert [r.action for r in d.recommendations] == ["scale_prefill_side"]
    assert any("KV fetch: 3 waiting to start, 1 in progress, 0 completed waiting" in e for e in s.results[0].notes)


def test_engines_are_separate_series():
    lines = []
    for i in range(3):
        lines.append(v1(10 * i, v1_032(0, 500.0, 900.0, 32, 10 + i, 0.40, prefix=0.0)))  # pinned at 32
        lines.append(v1(10 * i, v1_032(1, 500.0, 900.0, 20 + 4 * i, 0, 0.30, prefix=0.0)))
    s = read(lines)
    by = {}
    for r in s.results:
        by.setdefault(r.record.engine, []).append(r.diagnosis)
    # one record is no plateau (issue 14: no ceiling by elimination), but Running at a round 32 with KV room is the
    # likely ceiling, named at low confidence and not exported as inferred (issue 25); two at Running's maximum are
    assert [d.bottleneck for d in by["000"]] == ["max_num_seqs", "max_num_seqs", "max_num_seqs"]
    assert by["000"][0].confidence == "low" and "a round number" in by["000"][0].evidence[0]
    assert by["000"][0].max_num_seqs is None
    assert by["000"][2].max_num_seqs == (32, "inferred") and "inferred max_num_seqs=32" in by["000"][2].evidence[0]
    assert "in 2 of the last 2 samples" in by["000"][2].evidence[0] and by["000"][2].confidence == "medium"
    assert [d.bottleneck for d in by["001"]] == ["none"] * 3


def test_aggregated_engines_compare_running_with_the_sum_of_ceilings():
    s = read([line for line in (LOGS / "v1_aggregated.log").read_text().splitlines()])
    d = s.results[0].diagnosis
    assert s.results[0].record.engine == "aggregated"
    assert d.bottleneck == "max_num_seqs" and d.max_num_seqs == (32, "configured")
    assert any("max_num_seqs=16 per engine" in e for e in s.results[0].notes)


# ------------------------------------------------------------------------------------------- start-up lines


@pytest.mark.parametrize(
    "startup, capacity, max_model_len",
    [
        # V1 0.8 - 0.10, vllm/v1/core/kv_cache_utils.py: two lines
        (
            ["GPU KV cache size: 145,648 tokens", "Maximum concurrency for 32,768 tokens per request: 4.44x"],
            145648,
            32768,
        ),
        # V1 0.30+: one line, named after the device ("GPU + host" with a host KV tier)
        (["CPU KV cache size: 2,048 tokens, Maximum concurrency for 1,024 tokens per request: 2.00x"], 2048, 1024),
        (
            ["GPU + host KV cache size: 9,999 tokens, Maximum concurrency for 4,096 tokens per request: 2.44x"],
            9999,
            4096,
        ),
        # V0 executors: blocks, and from 0.6 the concurrency (max_model_len without separators) gives block_size
        (
            ["# GPU blocks: 12287, # CPU blocks: 2048", "Maximum concurrency for 8192 tokens per request: 24.00x"],
            196592,
            8192,
        ),
        (
            ["# cuda blocks: 1000, # CPU blocks: 512", "Maximum concurrency for 4096 tokens per request: 7.81x"],
            32000,
            4096,
        ),
        # only the concurrency: max_model_len x concurrency (+/- 0.5%)
        (["Maximum concurrency for 10,000 tokens per request: 3.50x"], 35000, 10000),
        # V1 'num_gpu_blocks is' with the block size from the start-up arguments
        (
            [
                "non-default args: {'block_size': 32}",
                "Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: 100",
            ],
            3200,
            None,
        ),
    ],
)
def test_capacity_from_start_up_lines(startup, capacity, max_model_len):
    lines = [v1(i, msg, where="kv_cache_utils.py:1") for i, msg in enumerate(startup)]
    lines.append(v1(30, V1_08 % (0, 10.0, 10.0, 4, 9, 50.0, 0.0)))
    s = read(lines)
    sig = s.results[0].diagnosis.signals
    assert sig.capacity.capacity_tokens == capacity
    assert sig.capacity.free_tokens == pytest.approx(capacity * 0.5)
    mml = s.analyzer.config.max_model_len()
    assert (mml.value if mml else None) == max_model_len


def test_each_data_parallel_engine_gets_its_own_capacity():
    s = read((LOGS / "v1_dp2_preemptions.log").read_text().splitlines())
    caps = {r.record.engine: r.diagnosis.signals.capacity.capacity_tokens for r in s.results}
    assert caps == {"000": 301248, "001": 296640}


def test_start_up_arguments_give_hints_and_cache_config():
    lines = [
        v1(
            0,
            "non-default args: {'model': 'Qwen/Qwen3-8B', 'max_model_len': 4096, 'kv_transfer_config': "
            "KVTransferConfig(kv_connector='NixlConnector'), 'max_num_seqs': 32, 'kv_cache_dtype': 'fp8', "
            "'gpu_memory_utilization': 0.85, 'enable_prefix_caching': False}",
            where="api_utils.py:286",
        ),
        v1(1, "Chunked prefill is enabled with max_num_batched_tokens=2048.", where="scheduler.py:307"),
        v1(30, V1_08 % (0, 10.0, 10.0, 20, 9, 97.0, 0.0)),
    ]
    s = read(lines)
    c = s.analyzer.config
    assert (c.get("max_num_seqs"), c.get("max_num_batched_tokens"), c.get("max_model_len")) == (32, 2048, 4096)
    assert c.model_name == "Qwen/Qwen3-8B"
    d = s.results[0].diagnosis
    actions = [x.action for x in d.recommendations]
    assert "fp8_kv_cache" not in actions  # already fp8
    assert "enable_prefix_caching" in actions
    assert "raise_gpu_memory_utilization" in actions


def test_namespace_arguments_of_older_servers():
    lines = [
        v0(
            0,
            "args: Namespace(host=None, port=8000, model='m', max_model_len=None, block_size=16, "
            "gpu_memory_utilization=0.9, max_num_batched_tokens=None, max_num_seqs=256)",
            "api_server.py:727",
        ),
        v0(1, "# GPU blocks: 1862, # CPU blocks: 327", "llm_engine.py:337"),
        v0(5, V0_METRICS % (10.0, 10.0, 256, 0, 40, 30.0, 0.0)),
    ]
    s = read(lines)
    d = s.results[0].diagnosis
    assert s.analyzer.config.get("max_num_batched_tokens") is None  # None in the Namespace: not known
    assert d.signals.capacity.capacity_tokens == 1862 * 16
    assert d.bottleneck == "max_num_seqs" and d.max_num_seqs == (256, "configured")


def test_engine_config_line_gives_version_model_dtype_and_prefix_caching():
    line = v1(
        0,
        "Initializing a V1 LLM engine (v0.32.0) with config: model='tiny-llama-dummy', dtype=torch.bfloat16, "
        "max_seq_len=1024, kv_cache_dtype=fp8_e4m3, device_config=cpu, served_model_name=tiny, "
        "enable_prefix_caching=False, enable_chunked_prefill=True",
        proc="EngineCore pid=2",
        where="core.py:133",
    )
    s = read([line, v1(30, V1_08 % (0, 10.0, 10.0, 4, 0, 5.0, 0.0))])
    c = s.analyzer.config
    assert (c.version, c.engine_version, c.model_name) == ("0.32.0", "1", "tiny")
    assert (c.get("max_seq_len"), c.get("kv_cache_dtype"), c.get("enable_prefix_caching")) == (1024, "fp8_e4m3", False)


# ------------------------------------------------------------------------------------------- whole example logs


EXPECTED = {
    "v0_llm_engine.log": ["none", "kv_cache", "kv_cache", "kv_cache"],
    "v0_metrics.log": ["none", "kv_cache", "kv_cache", "kv_cache", "kv_cache"],
    # one record with a queue: no plateau (was max_num_seqs by elimination), no KV field: undetermined (was none)
    "v1_0.7.log": ["none", "undetermined"],
    # the first queued record: no plateau yet, but Running at a round 48 with KV room: the likely ceiling (was none)
    "v1_0.8.log": ["max_num_seqs"] * 4 + ["none"],
    # 12 wait at 64 running with KV 88 %: too full to call the round 64 the ceiling, undetermined (was none)
    "v1_dp2_preemptions.log": ["undetermined", "none", "kv_cache", "none", "kv_cache", "none"],
    # a kv_consumer whose whole queue waits on remote KV loads (0.32's KV fetch field): kv_transfer, as /metrics says
    "v1_0.32_xpu_kv_fetch.log": ["kv_transfer", "none", "none"],
    "v1_0.32_iteration_details.log": ["token_budget"] * 3,
    "v1_aggregated.log": ["max_num_seqs"] * 3,
    "v1_0.33_aggregated_pd.log": ["kv_cache"] * 3 + ["kv_transfer"],  # the last: every waiting request in a KV fetch
    "v1_stalled_restart.log": ["none", "undetermined", "stalled", "stalled", "stalled", "none", "none"],
    "messy_cri_node.log": ["kv_cache"] * 3 + ["none"],
    "messy_terminal_copy.log": ["kv_cache"] * 3,
    "messy_wrapper_glued.log": ["kv_cache"] * 3 + ["none"],
}


def test_every_example_log_is_listed():
    assert sorted(EXPECTED) == sorted(p.name for p in LOGS.glob("*.log"))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_logs_through_the_cli(name):
    p = subprocess.run(
        [sys.executable, "-m", "kvwatch", "logs", "--json", str(LOGS / name)], capture_output=True, timeout=60
    )
    assert p.returncode == 0, p.stderr.decode()
    assert [json.loads(line)["bottleneck"] for line in p.stdout.decode().splitlines()] == EXPECTED[name]


def test_iteration_details_give_tokens_per_step():
    """With --enable-logging-iteration-details (0.32) the log has what token_budget needs."""
    lines = (LOGS / "v1_0.32_iteration_details.log").read_text().splitlines()
    d = read(lines).results[0].diagnosis
    assert d.signals.throughput.engine_step_tokens == 256 and d.max_num_batched_tokens == (256, "configured")
    assert d.recommendations[0].action == "raise_max_num_batched_tokens"
    bare = [line for line in lines if "non-default args" not in line and "Chunked prefill" not in line]
    d = read(bare).results[0].diagnosis
    assert d.bottleneck == "token_budget" and d.max_num_batched_tokens == (256, "inferred")


def test_iteration_detail_lines_of_033_dummy_steps_and_encoder_inputs():
    """Every variant _log_iteration_details prints: a DP padding step (dummy) schedules nothing and is not a
    step; the encoder suffix of a multimodal step does not hide the line."""
    steps = [
        ITERATION % ("Engine 000: ", 1, 1, 2000, 3, 3, 61.5, "", "GPU", 40.0, ""),
        ITERATION % ("Engine 000: ", 2, 1, 1900, 3, 3, 60.1, "", "GPU", 41.0, ENCODER % (2, 1152)),
        ITERATION % ("Engine 000: ", 3, 0, 0, 0, 0, 0.40, " (dummy)", "GPU", 41.0, ""),
    ]
    lines = [v1(1, m, where="loggers.py:254") for m in steps]
    lines.append(v1(10, v1_032(0, 400.0, 30.0, 4, 12, 0.41, prefix=0.0)))
    d = read(lines, Hints(max_num_batched_tokens=2048)).results[0].diagnosis
    assert d.signals.throughput.engine_step_tokens == (2003 + 1903) / 2  # two steps: the dummy one is not counted
    assert d.bottleneck == "token_budget" and d.confidence == "high"


def test_iteration_detail_lines_feed_an_aggregated_stats_line():
    """--aggregate-engine-logging sums the engines in one stats line while each step line names its engine
    (_log_prefix_for_engine): the record gets every engine's steps."""
    lines = []
    for i in range(4):
        for eng in (0, 1):
            lines.append(
                v1(
                    1,
                    ITERATION % (f"Engine {eng:03d}: ", i, 1, 1020, 8, 8, 30.0, "", "GPU", 30.0, ""),
                    where="loggers.py:254",
                )
            )
    lines.append(
        v1(
            10,
            "2 Engines Aggregated: Avg prompt throughput: 800.0 tokens/s, Avg generation throughput: "
            "64.0 tokens/s, Running: 20 reqs, Waiting: 9 reqs, GPU KV cache usage: 30.0%",
        )
    )
    r = read(lines, Hints(max_num_batched_tokens=1024)).results[0]
    assert r.record.engine == "aggregated"
    assert r.diagnosis.signals.throughput.engine_step_tokens == 1028
    assert r.diagnosis.signals.throughput.steps_per_second == pytest.approx(8 / 10)
    assert r.diagnosis.bottleneck == "token_budget"


def test_stalled_engine_then_restart():
    s = read((LOGS / "v1_stalled_restart.log").read_text().splitlines())
    stalled = [r for r in s.results if r.diagnosis.bottleneck == "stalled"]
    assert stalled[0].diagnosis.recommendations[0].action == "restart_engine"
    assert "no token produced for 10 s" in stalled[0].diagnosis.evidence[0]
    assert len(s.analyzer.configs) == 2  # the second 'non-default args' line started a new run
    assert s.results[-1].diagnosis.signals.queue.running_recent_max == 30  # history restarted: the stall is forgotten


# ------------------------------------------------------------------------------------------- sleep mode


def _sleep(t, rank=0, woke=None):
    """The engine core's executor lines (vllm/v1/executor/abstract.py, 0.32 as installed by the e2e lane)."""
    msg = (
        "It took 0.512340 seconds to fall asleep."
        if woke is None
        else f"It took 0.301200 seconds to wake up tags {woke}."
    )
    return v1(
        t, msg, proc=f"EngineCore_DP{rank} pid=7{rank}", where="abstract.py:391" if woke is None else "abstract.py:409"
    )


def test_sleep_and_wake_up_lines_put_the_engine_to_sleep_until_every_tag_is_awake():
    """Issue 14: a sleeping engine's gauges freeze with requests on it, which would read as stalled; its log
    says it fell asleep. A partial wake-up (weights first, for an RLHF weight update) keeps it asleep: vLLM
    resumes scheduling only once every tag is resident (EngineCore.wake_up)."""
    stats = lambda t, gen: v1(t, v1_032(0, 0.0, gen, 4, 9, 0.0 if gen == 0 else 0.4))  # noqa: E731
    lines = [
        stats(0, 120.0),
        _sleep(5),
        stats(10, 0.0),
        stats(20, 0.0),
        _sleep(25, woke="['weights']"),
        stats(30, 0.0),
        _sleep(35, woke="['kv_cache']"),
        stats(40, 80.0),
    ]
    got = [(r.diagnosis.bottleneck, r.diagnosis.evidence[0]) for r in read(lines).results]
    # 9 wait before it sleeps and after it wakes: undetermined, not "none" (issue 25)
    assert [b for b, _ in got] == ["undetermined", "asleep", "asleep", "asleep", "undetermined"], got
    assert (
        "vLLM's log ('It took ... seconds to fall asleep', no wake-up since) says the engine sleeps (level not printed)"
        in got[1][1]
    )
    # another rank's sleep line is not this engine's; a wake-up with no tags named ({...}: all of them) wakes it
    other = [stats(0, 120.0), _sleep(5, rank=1), stats(10, 0.0), stats(20, 0.0)]
    assert "asleep" not in [r.diagnosis.bottleneck for r in read(other).results]
    whole = [stats(0, 120.0), _sleep(5), stats(10, 0.0), _sleep(15, woke="{'kv_cache', 'weights'}"), stats(20, 90.0)]
    assert [r.diagnosis.bottleneck for r in read(whole).results] == ["undetermined", "asleep", "undetermined"]
