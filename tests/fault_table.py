"""The faults kvwatch is tested against, one row each: docs/faults.md's fault table is generated from this list
(docs/generate.py, ``make check-generated``), and the tests read their cases from it, so the two cannot drift.

``UPSTREAM`` parametrises tests/test_faults.py::test_fault_sets_up_0_counts_reason_and_recovers (``mode`` is the
fake upstream's, tests/helpers/fake_vllm.py; ``reason`` the ``kvwatch_scrape_errors_total`` reason it must count).
``OTHER`` names a test function each; tests/test_faults.py checks that every one exists and that every scrape
error reason of the catalogue has a row.
"""

from __future__ import annotations

from dataclasses import dataclass

PARAMETRISED = "tests/test_faults.py::test_fault_sets_up_0_counts_reason_and_recovers"


@dataclass(frozen=True)
class Fault:
    id: str  # the fake's mode (UPSTREAM) or a short name
    fault: str  # what the upstream or the client does
    does: str  # what kvwatch does
    reason: str | None = None  # the scrape error reason counted, if any
    test: str = PARAMETRISED  # file::function


# Every UPSTREAM case checks it: kvwatch_up 0, that one reason counted, the last good values kept (one bad
# scrape is within --stale-after), and the next good scrape recovers (docs/faults.md says it once).
_RECOVERS = "the reason counted"

UPSTREAM = [
    Fault("status", "HTTP 500", _RECOVERS, "http_status"),
    Fault(
        "redirect",
        "302 to another URL (with credentials in it)",
        "not followed (one request); the error names the Location, credentials redacted",
        "redirect",
    ),
    Fault("login", "200 with a text/html login page", "named an HTML page in the error", "html"),
    Fault("html", "200 with an HTML page served as text/plain", "sniffed as HTML", "html"),
    Fault("slow", "headers after 30 s", "gives up at `--timeout`", "timeout"),
    Fault("drip", "200 bytes over 30 s", "gives up at `--timeout` (one deadline, connect to last byte)", "timeout"),
    Fault("trickle", "a body at 1 byte/s", "gives up at `--timeout`", "timeout"),
    Fault("endless", "a chunked body of valid lines that never ends", "gives up at `--timeout`", "timeout"),
    Fault("flood", "an endless chunked body as fast as the socket goes", "stops at `--max-body-bytes`", "too_large"),
    Fault("huge", "a 20 MB body", "stops at `--max-body-bytes`", "too_large"),
    Fault(
        "bomb",
        "256 MiB of zeros in 250 KiB of gzip",
        "stops at `--max-body-bytes`, counted after decompression",
        "too_large",
    ),
    Fault("garbage", "binary bytes", _RECOVERS, "decode"),
    Fault("truncate", "a body cut in the middle of a line", _RECOVERS, "parse"),
    Fault("metadata_only", "HELP and TYPE lines only", _RECOVERS, "no_vllm_metrics"),
]

OTHER = [
    Fault(
        "bad_location",
        "a redirect to an unparseable or 100 KB Location, or none",
        "a `redirect` error all the same, its message under 300 characters",
        "redirect",
        "tests/test_faults.py::test_a_hostile_redirect_location_is_a_redirect_error_kept_short",
    ),
    Fault(
        "down",
        "vLLM down (connection refused), then back",
        "series withdrawn after `--stale-after`, target `unreachable`; recovers",
        "connect",
        "tests/test_faults.py::test_down_then_stale_series_are_withdrawn_then_recover",
    ),
    Fault(
        "timeouts",
        "deadlines landing at every point of a fetch",
        "never wedges the target's connection pool",
        "timeout",
        "tests/test_faults.py::test_timeouts_at_any_point_of_a_fetch_never_wedge_the_target",
    ),
    Fault(
        "slots",
        "llama.cpp's `/slots` (read after `/metrics`) answers 501 (no `--slots`), slowly, garbage, HTML, 20 MB, a gzip "
        "bomb, or JSON of another shape",
        "the scrape succeeds, both paths within one `--timeout`; that scrape lacks each slot's context (the KV cache "
        "not judged per slot), and the log says why once",
        None,
        "tests/test_slots_faults.py::test_a_broken_slots_never_fails_the_scrape",
    ),
    Fault(
        "restart",
        "counters jump back (vLLM restarted)",
        "no negative rate; a reset counted",
        None,
        "tests/test_faults.py::test_counter_reset_on_vllm_restart_gives_no_negative_rate",
    ),
    Fault(
        "renamed",
        "a metric renamed or missing",
        "exports what is still valid; the unknown stays absent",
        None,
        "tests/test_faults.py::test_renamed_or_missing_metric_exports_what_is_still_valid",
    ),
    Fault(
        "100k",
        "100,000 irrelevant series (5 MB)",
        "parsed off the event loop; skipped cheaply",
        None,
        "tests/test_faults.py::test_100k_series_are_skipped_cheaply_and_do_not_block_the_loop",
    ),
    Fault(
        "10k_engines",
        "10,000 distinct `model_name` x `engine` pairs",
        "the first `--max-engines` kept, the rest "
        "folded into `_overflow` and counted in `kvwatch_folded_engines`; own /metrics within its worst case",
        None,
        "tests/test_faults.py::test_10000_engines_fold_into_overflow_and_own_metrics_stay_bounded",
    ),
    Fault(
        "1mb_labels",
        "`model_name` and `engine` values of 1 MB",
        "shortened to 128 characters (start, `...`, 16 hex digits of SHA-256), stable across scrapes",
        None,
        "tests/test_faults.py::test_1mb_label_values_are_shortened_stably",
    ),
    Fault(
        "schedule",
        "vLLM slow for several ticks",
        "missed ticks skipped, never bunched",
        "timeout",
        "tests/test_faults.py::test_the_scrape_loop_keeps_schedule_through_faults",
    ),
    Fault(
        "concurrent",
        "1,000 concurrent requests to kvwatch's port",
        "serves 128 connections at once, answers "
        "the rest 503 or the kernel refuses them; keeps scraping; serves normally after",
        None,
        "tests/test_own_port.py::test_1000_concurrent_requests_get_served_or_503_and_scraping_goes_on",
    ),
    Fault(
        "slow_headers",
        "a client sending its request head a byte at a time",
        "drops the connection 10 s after accept (the request deadline)",
        None,
        "tests/test_own_port.py::test_a_slow_header_client_is_dropped_at_the_deadline",
    ),
    Fault(
        "oversized",
        "a 5 KB URL, a 9 KB header, 70 headers",
        "400 and the connection closed, nothing read further, no traceback logged",
        None,
        "tests/test_own_port.py::test_oversized_requests_get_400",
    ),
    Fault(
        "busy",
        "more than 128 open connections",
        "a new one gets 503 unread; served again once they close",
        None,
        "tests/test_own_port.py::test_connections_past_the_cap_get_503",
    ),
]

ALL = UPSTREAM + OTHER
