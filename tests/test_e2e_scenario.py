"""The real-vLLM lane's judging helpers (tests/e2e/scenario.py), on hand-made rows: they decide which samples a
verdict rests on, so they are held to their meaning here, where no vLLM is needed."""

from __future__ import annotations

from tests.e2e.scenario import Row, after_timeout, detection_latency, saturated_rows, vllm_preempted_between


def row(t, waiting=0.0, kv=0.0, preemptions=0.0, up=1.0, bottleneck="none", timeouts=0.0) -> Row:
    return Row(t=t, up=up, bottleneck=bottleneck, target_bottleneck=bottleneck, running=4.0, waiting=waiting,
               kv=kv, preemptions=preemptions, kw={"timeouts": timeouts})


def test_saturated_rows_need_a_queue_kvwatch_up_and_the_warmup_of_their_own_round():
    rows = [row(-1), row(2, waiting=5), row(6, waiting=5), row(7, waiting=5, up=0.0), row(9, waiting=None),
            row(12), row(13, waiting=4), row(18, waiting=4)]
    assert [r.t for r in saturated_rows(rows, [0.0], 5.0)] == [6, 13, 18]
    # a second round from t=12: its first 5 s are warm-up again
    assert [r.t for r in saturated_rows(rows, [0.0, 12.0], 5.0)] == [6, 18]


def test_preempted_between_compares_the_last_reads_at_or_before_each_end():
    rows = [row(0, preemptions=3), row(2, preemptions=3), row(4, preemptions=7), row(5, preemptions=None)]
    assert vllm_preempted_between(rows, 2.5, 5.0)
    assert not vllm_preempted_between(rows, 0.0, 3.0)
    assert not vllm_preempted_between(rows, -1.0, 5.0)  # nothing read before the start: cannot tell


def test_after_timeout_lets_off_only_samples_after_a_counted_timeout():
    rows = [row(0, timeouts=1), row(1, up=0.0, timeouts=2), row(2, up=0.0, timeouts=2), row(3, up=0.0, timeouts=1)]
    assert after_timeout(rows, rows[1]) and after_timeout(rows, rows[2])  # both since the last sample read up
    assert not after_timeout(rows, rows[3])


def test_detection_latency_is_judged_only_when_vllm_was_still_kv_bound_two_intervals_after_the_onset():
    base = [row(-1, preemptions=2)]
    seen = base + [row(0.5, waiting=40, kv=0.95, preemptions=2), row(1.0, waiting=40, kv=0.97, bottleneck="kv_cache"),
                   row(3.0, waiting=30, kv=0.5, preemptions=5, bottleneck="kv_cache")]
    d = detection_latency(seen)
    assert (d["onset_s"], d["detected_s"], d["latency_s"], d["read_gap_s"], d["judged"]) == (0.5, 1.0, 0.5, 0.5, True)

    # vLLM still KV-bound (preempting, requests waiting) 2.5 s after the onset and kvwatch never said so: a miss
    missed = base + [row(0.5, waiting=40, kv=0.95), row(3.0, waiting=30, kv=0.5, preemptions=5)]
    d = detection_latency(missed)
    assert d["detected_s"] is None and d["judged"]

    # the next read came after the queue had drained: nothing to judge kvwatch by
    sparse = base + [row(0.5, waiting=40, kv=0.95), row(9.0)]
    d = detection_latency(sparse)
    assert d["detected_s"] is None and not d["judged"]

    assert detection_latency(base + [row(1.0, waiting=3, kv=0.4)])["onset_s"] is None
