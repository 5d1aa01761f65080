"""The real-vLLM lane's judging helpers (tests/e2e/scenario.py), on hand-made rows: they decide which samples a
verdict rests on, so they are held to their meaning here, where no vLLM is needed."""

from __future__ import annotations

import math

from tests.e2e.harness import MODEL_NAME, Sample, Snapshot
from tests.e2e.scenario import (
    KVWATCH_TIMEOUT,
    MAX_FAILED_SCRAPE_SHARE,
    Row,
    Scrape,
    after_timeout,
    detection_in_scrapes,
    detection_latency,
    evaluated_since,
    failed_scrapes,
    kvwatch_scrapes,
    kvwatch_window,
    make_rows,
    saturated_rows,
    vllm_rose_within,
    vllm_step_tokens_bounds,
    vllm_step_tokens_over,
)


def row(t, waiting=0.0, kv=0.0, preemptions=0.0, up=1.0, bottleneck="none", timeouts=0.0) -> Row:
    return Row(
        t=t,
        up=up,
        bottleneck=bottleneck,
        target_bottleneck=bottleneck,
        running=4.0,
        waiting=waiting,
        kv=kv,
        preemptions=preemptions,
        kw={"timeouts": timeouts},
    )


def test_saturated_rows_need_a_queue_kvwatch_up_and_the_warmup_of_their_own_round():
    rows = [
        row(-1),
        row(2, waiting=5),
        row(6, waiting=5),
        row(7, waiting=5, up=0.0),
        row(9, waiting=None),
        row(12),
        row(13, waiting=4),
        row(18, waiting=4),
    ]
    assert [r.t for r in saturated_rows(rows, [0.0], 5.0)] == [6, 13, 18]
    # a second round from t=12: its first 5 s are warm-up again
    assert [r.t for r in saturated_rows(rows, [0.0, 12.0], 5.0)] == [6, 18]


def read(t, preemptions=None, steps=None, tokens=None, took=0.05) -> Row:
    """A row whose read of vLLM was asked at ``t`` and answered ``took`` later."""
    r = row(t, preemptions=preemptions)
    r.read, r.steps, r.step_tokens = (t, t + took), steps, tokens
    return r


def test_kvwatch_window_only_when_the_diagnosis_is_the_same_scrape_as_the_gauge():
    r = row(20)
    r.window, r.kw["step_tokens"], r.signals = (10.0, 19.0), 261.285714, {"engine_step_tokens": 261.2857}
    assert kvwatch_window(r, "step_tokens") == (10.0, 19.0)
    r.signals = {"engine_step_tokens": 244.1667}  # the diagnosis came from kvwatch's next scrape
    assert kvwatch_window(r, "step_tokens") is None
    r.signals = {}
    assert kvwatch_window(r, "step_tokens") is None


def test_rose_within_needs_two_reads_inside_the_window():
    rows = [read(t, preemptions=p) for t, p in [(9.0, 3), (11.0, 3), (14.0, 7), (18.5, 7), (21.0, 9)]]
    assert vllm_rose_within(rows, 10.0, 19.0)  # 3 at 11 s -> 7 at 14 s, both inside
    # kvwatch's first scrape began at 10.5 s and may have read vLLM up to a scrape timeout later, after the
    # test's read at 11 s: the rise may predate kvwatch's window; inside it, 7 -> 7
    assert 10.5 + KVWATCH_TIMEOUT > 11.0 and not vllm_rose_within(rows, 10.5, 19.0)
    assert not vllm_rose_within(rows, 11.5, 20.9)  # 7 -> 9 at 21 s: answered after kvwatch's last scrape began
    assert not vllm_rose_within(rows, 14.5, 20.0)  # one read inside: nothing to compare


def test_step_tokens_over_the_window_and_what_the_counters_allow():
    # 1 read a second; each second 3 steps of 5 tokens, and a prefill's end (1805) in the 4th, 8th, ...
    rows, steps, tokens = [], 0, 0
    for t in range(30):
        rows.append(read(float(t), steps=steps, tokens=tokens))
        steps += 4
        tokens += 15 + 1805 if t % 4 == 3 else 20
    start, end = 10.1, 19.1  # kvwatch's first and last scrape, each just after a read of the test's
    same = vllm_step_tokens_over(rows, start, end)
    assert same == (rows[19].step_tokens - rows[10].step_tokens) / 36
    lo, hi = vllm_step_tokens_bounds(rows, start, end)
    # kvwatch read vLLM between 10.1 and 10.9 s, and between 19.1 and 19.9 s: its sums lie between the reads
    # at 11 s and 19 s (at least) and at 10 s and 20 s (at most), its counts likewise
    assert lo == (rows[19].step_tokens - rows[11].step_tokens) / (rows[20].steps - rows[10].steps)
    assert hi == (rows[20].step_tokens - rows[10].step_tokens) / (rows[19].steps - rows[11].steps)
    assert lo <= same <= hi
    assert vllm_step_tokens_bounds(rows, -0.5, 19.0) is None  # no read before kvwatch's first scrape
    assert vllm_step_tokens_bounds(rows, 10.0, 29.5) is None  # none after its last
    idle = [read(float(t), steps=5, tokens=900) for t in range(5)]
    assert vllm_step_tokens_over(idle, 1.0, 3.0) is None
    short = vllm_step_tokens_bounds(rows, 10.02, 10.5)  # a window shorter than a read period
    assert short[0] == 0.0 and short[1] == math.inf


def test_after_timeout_lets_off_only_samples_after_a_counted_timeout():
    rows = [row(0, timeouts=1), row(1, up=0.0, timeouts=2), row(2, up=0.0, timeouts=2), row(3, up=0.0, timeouts=1)]
    assert after_timeout(rows, rows[1]) and after_timeout(rows, rows[2])  # both since the last sample read up
    assert not after_timeout(rows, rows[3])


def test_detection_latency_is_judged_only_when_vllm_was_still_kv_bound_two_intervals_after_the_onset():
    base = [row(-1, preemptions=2)]
    seen = base + [
        row(0.5, waiting=40, kv=0.95, preemptions=2),
        row(1.0, waiting=40, kv=0.97, bottleneck="kv_cache"),
        row(3.0, waiting=30, kv=0.5, preemptions=5, bottleneck="kv_cache"),
    ]
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


def test_make_rows_takes_the_window_from_the_diagnosis_and_the_read_times_from_the_observer():
    target = "http://127.0.0.1:1/metrics"
    eng = f'engine="0",model_name="{MODEL_NAME}"'
    kv = (
        f'kvwatch_up{{target="{target}"}} 1.0\n'
        f'kvwatch_engine_step_tokens{{{eng},target="{target}"}} 261.2857142857143\n'
    )
    vllm = (
        f"vllm:iteration_tokens_total_count{{{eng}}} 84.0\nvllm:iteration_tokens_total_sum{{{eng}}} 21948.0\n"
        f"vllm:num_requests_waiting{{{eng}}} 107.0\n"
    )
    diagnosis = {
        "engines": [
            {
                "model_name": MODEL_NAME,
                "engine": "0",
                "signals": {"t": 1033.9, "span_seconds": 9.0, "engine_step_tokens": 261.2857},
            }
        ]
    }
    s = Sample(
        1034.2,
        Snapshot(1034.2, kv),
        Snapshot(1034.2, vllm),
        diagnosis,
        {"kvwatch": 0.004, "diagnosis": 0.02, "vllm": 0.04},
    )
    (r,) = make_rows([s], target, 1000.0)
    assert r.window == (24.9, 33.9) and r.read == (34.22, 34.24)
    assert (r.steps, r.step_tokens, r.waiting) == (84.0, 21948.0, 107.0)
    assert kvwatch_window(r, "step_tokens") == (24.9, 33.9)


def test_evaluated_since_goes_by_kvwatchs_clock_from_the_diagnosis_read_before():
    rows = [row(t) for t in (9.0, 10.0, 14.0, 15.0)]
    for r, ev in zip(rows, (8.5, 9.6, 9.6, 14.7), strict=False):  # kvwatch stalled: no evaluation from 9.6 s to 14.7 s
        r.evaluated = ev
    # the read at 14 s came 4 s after 10 s, yet kvwatch had not evaluated since 9.6 s
    assert [evaluated_since(rows, r, 9.5) for r in rows] == [False, False, True, True]
    assert [evaluated_since(rows, r, 11.0) for r in rows] == [False, False, False, False]
    rows[2].evaluated = None
    assert not evaluated_since(rows, rows[3], 9.5)


# -- the detection promise, in kvwatch's own scrapes ----------------------------------------------------------------


def burst_reads(bound_until: float = 12.0) -> list[Row]:
    """The test's reads of vLLM every 0.25 s, each answered 0.05 s after it was asked: idle before t=1, then KV-bound
    (40 waiting, KV 0.95) until ``bound_until``, then drained."""
    rows = []
    for k in range(-8, 52):
        t = k * 0.25
        bound = 1.0 <= t < bound_until
        r = read(t)
        r.waiting, r.kv, r.preemptions = (40.0, 0.95, 0.0) if bound else (0.0, 0.1, 0.0)
        rows.append(r)
    return rows


def scrapes(named_from: float | None, failed: tuple[float, ...] = (), start: float = -2.7) -> list[Scrape]:
    """kvwatch's record: a scrape stamped at 0.3 s past each second, kv_cache from ``named_from`` on."""
    out = []
    for k in range(15):
        t = round(start + k, 3)
        kv = named_from is not None and t >= named_from
        out.append(Scrape(t, t not in failed, "unreachable" if t in failed else "kv_cache" if kv else "none"))
    return out


def test_detection_counts_kvwatchs_successful_scrapes_after_the_onset_read():
    rows = burst_reads()
    # onset read at 1.0 s (answered 1.05 s); kvwatch's scrapes after it at 1.3, 2.3, 3.3 s may name it
    d = detection_in_scrapes(rows, scrapes(named_from=2.3))  # the first scrape after still 'none' (mid-step)
    assert (d["onset_s"], d["onset_read_s"], d["allowed_scrapes"]) == (1.0, 1.05, 3)
    assert (d["named_at_scrape"], d["named"], d["judged"]) == (2, True, True)
    assert d["scrapes"][:2] == [(1.3, "none"), (2.3, "kv_cache")]
    d = detection_in_scrapes(rows, scrapes(named_from=3.3))
    assert (d["named_at_scrape"], d["named"]) == (3, True)


def test_a_late_kvwatch_fails():
    d = detection_in_scrapes(burst_reads(), scrapes(named_from=4.3))  # its 4th scrape: 3.3 s after the onset
    assert (d["named_at_scrape"], d["named"], d["judged"]) == (4, False, True)
    d = detection_in_scrapes(burst_reads(), scrapes(named_from=None))  # never
    assert (d["named_at_scrape"], d["named"], d["judged"]) == (None, False, True)


def test_a_slow_machine_cannot_fail_a_correct_kvwatch():
    # kvwatch's scrapes time out on a starved machine: its successful ones after the onset come at 1.3, 5.3, 7.3 s,
    # and it names the onset at the second of them, 4.3 s after the onset read
    d = detection_in_scrapes(burst_reads(), scrapes(named_from=5.3, failed=(2.3, 3.3, 4.3, 6.3)))
    assert (d["named_at_scrape"], d["named"], d["judged"]) == (2, True, True)
    # the same kvwatch a scrape later still names it in time; one more is late
    d = detection_in_scrapes(burst_reads(), scrapes(named_from=7.3, failed=(2.3, 3.3, 4.3, 6.3)))
    assert (d["named_at_scrape"], d["named"]) == (3, True)
    d = detection_in_scrapes(burst_reads(), scrapes(named_from=8.3, failed=(2.3, 3.3, 4.3, 6.3)))
    assert (d["named_at_scrape"], d["named"], d["judged"]) == (4, False, True)


def test_a_scrape_between_the_last_idle_read_and_the_onset_read_may_name_it_first():
    rows = burst_reads()
    early = [Scrape(-0.2, True, "none"), Scrape(0.8, True, "kv_cache"), Scrape(1.8, True, "kv_cache")]
    d = detection_in_scrapes(rows, early)  # 0.8 s: after the read at 0.75 s that found vLLM idle
    assert (d["named_at_scrape"], d["named"], d["judged"]) == (0, True, True)
    stale = [Scrape(0.7, True, "kv_cache"), *[Scrape(t, True, "none") for t in (1.7, 2.7, 3.7, 4.7)]]
    assert not detection_in_scrapes(rows, stale)["named"]  # before that read: not this onset's


def test_a_queue_that_drains_before_kvwatchs_allowed_scrapes_is_not_judged():
    # KV-bound from 1.0 to 3.5 s: kvwatch's 3rd scrape after the onset (3.3 s) may have read vLLM up to 4.1 s
    d = detection_in_scrapes(burst_reads(bound_until=3.5), scrapes(named_from=None))
    assert (d["named"], d["judged"]) == (False, False)
    d = detection_in_scrapes(burst_reads(bound_until=4.5), scrapes(named_from=None))  # read KV-bound at 4.25 s
    assert (d["named"], d["judged"]) == (False, True)
    assert detection_in_scrapes([row(0.5, waiting=3, kv=0.4)], scrapes(None))["onset_s"] is None


def test_kvwatch_scrapes_reads_the_targets_series_of_its_history():
    target = "http://127.0.0.1:1/metrics"
    history = {
        "targets": [
            {"target": "http://other/metrics", "series": {"t": [1001.0], "up": [1.0], "bottleneck": ["none"]}},
            {
                "target": target,
                "series": {
                    "t": [1000.5, 1001.5, 1002.5],
                    "up": [1.0, 0.0, 1.0],
                    "bottleneck": ["none", "unreachable", "kv_cache"],
                },
                "engines": [],
            },
        ]
    }
    assert kvwatch_scrapes(history, target, 1000.0) == [
        Scrape(0.5, True, "none"),
        Scrape(1.5, False, "unreachable"),
        Scrape(2.5, True, "kv_cache"),
    ]
    assert kvwatch_scrapes(history, "http://absent/metrics", 1000.0) == []


def test_failed_scrapes_are_bounded_to_a_fifth_of_the_load():
    assert MAX_FAILED_SCRAPE_SHARE == 0.2
    ten = [Scrape(float(t), t not in (3, 7), "none") for t in range(10)]
    assert failed_scrapes(ten, 0.0, 9.0) is None  # 2 of 10
    most = [Scrape(float(t), t % 4 == 0, "none") for t in range(-5, 15)]  # 3 in 4 time out
    assert failed_scrapes(most, -4.0, -4.0) is None  # one good scrape, before the load
    msg = failed_scrapes(most, 0.0, 9.0)
    assert msg.startswith("7 of kvwatch's 10 scrapes failed from 0.0 s to 9.0 s of the load (bound 20%")
    assert "load average " in msg
    assert failed_scrapes([], 0.0, 9.0).startswith("0 of kvwatch's 0 scrapes")  # no scrape at all fails too
