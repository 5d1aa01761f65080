"""Capacity and demand in sequences (kvwatch/capacity.py) on the real vLLM 0.32 captures, and its arithmetic.

On every capture with its server's flags as hints, whenever a queue has persisted, the limit that admits the
fewest sequences is the bottleneck the diagnosis names from other evidence (KV usage, Running at the ceiling,
full steps), and the demand exceeds that capacity: the two views of one engine agree.
"""

from __future__ import annotations

import statistics

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.capacity import capacity_sequences, demand_sequences, effective_capacity
from kvwatch.catalog import Bottleneck
from kvwatch.export import KvwatchCollector
from kvwatch.plan import budget_sequences
from kvwatch.state import Target
from kvwatch.window import Signals
from tests.helpers.recordings import FIXTURES, recording
from tests.test_diagnose import HINTS, replay

BOUND = ["kv_cache", "max_num_seqs", "max_num_seqs_running_dips", "token_budget"]


@pytest.mark.parametrize("scenario", BOUND)
def test_the_binding_capacity_is_the_diagnosed_bottleneck_on_real_captures(scenario):
    queued = [
        e
        for d in replay(scenario, HINTS[scenario])
        for e in d.engines
        if e.signals.queue.waiting and e.signals.queue.waiting_streak >= 2 and e.bottleneck != "none"
    ]
    assert len(queued) >= 5, scenario
    for e in queued:
        assert e.capacity_limit == e.bottleneck, (e.signals.t, e.capacity_sequences, e.evidence)
        assert e.as_dict()["capacity"]["binding_limit"] == e.bottleneck
    # demand over capacity while bound: the median, as single 1-s samples of real vLLM dip
    ratios = [e.demand_sequences / e.capacity_sequences_effective for e in queued]
    assert statistics.median(ratios) > 1.0, ratios


def test_each_limit_in_sequences():
    s = Signals("m", "0", 0.0, 10, 9.0)
    s.capacity.capacity_tokens, s.capacity.estimated_max_concurrency = 16384, 16.384
    s.capacity.mean_prompt_tokens, s.capacity.mean_sequence_tokens = 900.0, 1000.0
    limits = capacity_sequences(s, max_num_seqs=32, max_num_batched_tokens=256)
    # 256 tokens a step, each sequence 900 computed prompt + 100 output tokens over ~100 steps: 25.6 in flight
    assert limits == {Bottleneck.KV_CACHE: 16.384, Bottleneck.MAX_NUM_SEQS: 32.0, Bottleneck.TOKEN_BUDGET: 25.6}
    assert limits[Bottleneck.TOKEN_BUDGET] == budget_sequences(256, 900, 100)  # kvwatch plan's arithmetic
    assert effective_capacity(limits) == (Bottleneck.KV_CACHE, 16.384)
    # half the prompt tokens from the prefix cache (vLLM's by-source counters): half the budget per sequence
    s.throughput.prompt_tokens_all_per_second, s.throughput.prompt_tokens_per_second = 1000.0, 500.0
    assert capacity_sequences(s, None, 256)[Bottleneck.TOKEN_BUDGET] == pytest.approx(256 * 100 / 550)
    assert effective_capacity(capacity_sequences(s, 8, None)) == (Bottleneck.MAX_NUM_SEQS, 8.0)


def test_unknown_inputs_name_no_capacity():
    s = Signals("m", "0", 0.0, 1, 0.0)
    assert capacity_sequences(s, None, 256) == {} and effective_capacity({}) is None
    assert demand_sequences(s) is None
    s.queue.running, s.queue.waiting, s.queue.running_mean, s.queue.waiting_mean = 3, 0, 2.5, 1.5
    assert demand_sequences(s) == 4.0  # window means, not the latest sample


def test_the_collector_exports_capacity_and_demand_per_engine():
    t = Target("http://x:1/metrics", hints=HINTS["max_num_seqs"])
    for tt, f in recording(FIXTURES / "max_num_seqs"):
        t.observe_body(tt, f.read_text())
        t.up, t.diagnosis = True, t.diagnose(tt)
        (e,) = t.diagnosis.engines
        if e.signals.queue.waiting_streak >= 5:
            break
    reg = CollectorRegistry(auto_describe=False)
    reg.register(KvwatchCollector(lambda: [t]))
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(reg).decode())}
    per_limit = {s.labels["limit"]: s.value for s in fams["kvwatch_capacity_sequences"].samples}
    assert per_limit["max_num_seqs"] == 2.0 and per_limit["kv_cache"] > 10
    (eff,) = fams["kvwatch_capacity_sequences_effective"].samples
    (dem,) = fams["kvwatch_demand_sequences"].samples
    assert eff.value == 2.0 and dem.value > eff.value


def test_the_worst_case_counts_every_limit_capacity_can_report():
    """Issue 25 point 5: export.worst_case counted 3 capacity limits by hand while kvwatch.capacity reports 4 (LoRA
    slots too). An engine with every limit known reports each one, and the worst case counts them all."""
    from kvwatch.catalog import CAPACITY_LIMITS, family
    from kvwatch.export import _series_per_key

    s = Signals(model_name="m", engine="0", t=0.0, samples=2, span_seconds=1.0)
    s.capacity.estimated_max_concurrency, s.capacity.mean_prompt_tokens, s.capacity.mean_sequence_tokens = (
        40.0,
        300.0,
        500.0,
    )
    s.capacity.max_lora, s.capacity.lora_running, s.capacity.lora_waiting, s.queue.running = 2, 2, 3, 12.0
    reported = capacity_sequences(s, 32, 2048)
    assert set(reported) == set(CAPACITY_LIMITS)
    assert _series_per_key(family("kvwatch_capacity_sequences")) == len(reported)
