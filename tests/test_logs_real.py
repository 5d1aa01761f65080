"""`kvwatch logs` on the real vLLM 0.32 server logs, run as a user runs it: `python -m kvwatch logs ...`.

Each scenario folder of tests/fixtures/vllm-0.32.0-cpu/ holds the server's own log next to its /metrics
captures. vLLM prints a stats line every 10 s, so each run left only 2-4 records.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvwatch.catalog import Action, Bottleneck
from kvwatch.logs import main as logs_main

ACTIONS, BOTTLENECKS = list(Action), list(Bottleneck)

# Every test but one starts `python -m kvwatch logs` (many processes): outside the fast lane.
pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu"
KVWATCH = [sys.executable, "-m", "kvwatch", "logs"]
JSON_KEYS = {
    "line",
    "engine",
    "prompt_tokens_per_second",
    "generation_tokens_per_second",
    "requests_running",
    "requests_waiting",
    "requests_swapped",
    "kv_cache_usage_ratio",
    "bottleneck",
    "recommendations",
}


def env():
    return {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}


def kvwatch_logs(*args, stdin=None):
    return subprocess.run([*KVWATCH, *map(str, args)], input=stdin, capture_output=True, env=env(), timeout=60)


def records(*args, stdin=None):
    p = kvwatch_logs(*args, "--json", stdin=stdin)
    assert p.returncode == 0, p.stderr.decode()
    out = [json.loads(line) for line in p.stdout.decode().splitlines()]
    for r in out:
        assert JSON_KEYS <= set(r), r
        assert r["bottleneck"] in BOTTLENECKS
        assert {x["action"] for x in r["recommendations"]} <= set(ACTIONS)
    return out


def stats_lines_only(scenario, tmp_path):
    """The same log with every start-up line gone: only what `grep 'Engine 000'` would keep."""
    text = (FIXTURES / scenario / "server.log").read_text()
    f = tmp_path / f"{scenario}-stats-only.log"
    f.write_text("\n".join(line for line in text.splitlines() if "Engine 000:" in line) + "\n")
    return f


def test_kv_cache_run_is_diagnosed_kv_cache_with_the_logs_capacity():
    recs = records(FIXTURES / "kv_cache" / "server.log")
    assert [(r["line"], r["time"], r["requests_running"], r["requests_waiting"]) for r in recs] == [
        (195, "10:22:22", 7, 72),
        (223, "10:22:32", 4, 53),
        (234, "10:22:42", 4, 15),
        (247, "10:22:52", 0, 0),
    ]
    assert [r["kv_cache_usage_ratio"] for r in recs] == [1.0, 0.873, 0.937, 0.0]
    assert [r["prompt_tokens_per_second"] for r in recs] == [161.7, 1025.9, 975.1, 325.1]
    assert [r["bottleneck"] for r in recs] == ["kv_cache", "kv_cache", "kv_cache", "none"]
    assert all(r["engine"] == "000" and r["requests_swapped"] is None for r in recs)
    first = recs[0]
    actions = [x["action"] for x in first["recommendations"]]
    assert actions == sorted(actions, key=ACTIONS.index)
    assert "fp8_kv_cache" in actions  # kv_cache_dtype=auto in the engine config line
    assert "raise_kv_cache_memory_bytes" in actions  # 'kv_cache_memory_bytes': 8388608 in the start-up arguments
    assert "enable_prefix_caching" not in actions  # enable_prefix_caching=True
    notes = " ".join(first["notes"])
    assert "KV capacity 2,048 tokens from line 48" in notes
    assert first["preemptions"] is None and "preemptions unknown" in notes  # 0.32's log printed no Preemptions field
    assert "2048 -> ~4096 tokens" in " ".join(x["why"] for x in first["recommendations"])


def test_kv_cache_report_names_the_dominant_bottleneck():
    p = kvwatch_logs(FIXTURES / "kv_cache" / "server.log")
    assert p.returncode == 0 and p.stderr == b""
    out = p.stdout.decode()
    assert "vLLM 0.32.0 (V1 engine), model 'tiny-llama-dummy'" in out
    assert "KV cache 2,048 tokens (line 48" in out and "max_num_seqs 16 (line 12" in out
    assert "lines 195-234" in out and "kv_cache     x3" in out and "waiting 72->15" in out
    assert "Dominant bottleneck: kv_cache (3 of 4 records; 3 of the 3 records with requests waiting)" in out
    assert "Evidence (line 195, 10:22:22, engine 000, the longest queue):" in out
    assert "  - fp8_kv_cache: " in out
    assert "What the log could not tell:" in out and "sequence lengths" in out


def test_max_num_seqs_run_uses_the_logged_flag_else_infers_it(tmp_path):
    recs = records(FIXTURES / "max_num_seqs" / "server.log")
    assert [(r["line"], r["bottleneck"]) for r in recs] == [(160, "max_num_seqs"), (173, "none"), (204, "none")]
    assert recs[0]["max_num_seqs"] == {"value": 2, "source": "configured"}
    assert "max_num_seqs=2 from line 12, start-up arguments" in recs[0]["notes"]
    assert recs[0]["recommendations"][0]["action"] == "raise_max_num_seqs"
    assert "32047 tokens free" in " ".join(recs[0]["evidence"])  # 32,768 tokens x (1 - 0.022)

    bare = stats_lines_only("max_num_seqs", tmp_path)
    recs = records(bare)
    # One stats line with a queue, no flag: no plateau, so no ceiling (issue 14: it was inferred by elimination);
    # 22 wait, so undetermined, not "none", and it says what it needs (issue 25)
    assert recs[0]["bottleneck"] == "undetermined" and recs[0]["max_num_seqs"] is None
    assert "more samples of the queue until kvwatch can tell" in " ".join(recs[0]["evidence"])
    assert recs[0]["confidence"] == "low" and "requests wait, no limit identified" in recs[0]["evidence"][0]
    assert "max_num_seqs (pass --max-num-seqs)" in " ".join(recs[0]["evidence"])
    recs = records(bare, "--max-num-seqs", 2)
    assert recs[0]["bottleneck"] == "max_num_seqs" and recs[0]["confidence"] == "high"
    assert recs[0]["max_num_seqs"] == {"value": 2, "source": "configured"}
    assert "max_num_seqs=2 from the command line" in recs[0]["notes"]


def test_none_prefix_cache_run_is_none_with_the_hit_rate():
    recs = records(FIXTURES / "none_prefix_cache" / "server.log")
    assert [(r["line"], r["bottleneck"]) for r in recs] == [(150, "none"), (186, "none")]
    assert [r["prefix_cache_hit_ratio"] for r in recs] == [0.616, 0.64]
    assert all(r["recommendations"] == [] for r in recs)


@pytest.mark.parametrize("hint", [[], ["--max-num-batched-tokens", "256"]], ids=["no-hint", "hint-256"])
def test_token_budget_run_finished_its_queue_between_two_stats_lines(hint, tmp_path):
    """The whole burst (60 x 1800 prompt tokens, queued 10:27:35-10:27:42 in the /metrics captures) fell
    inside one 10 s logging interval: both stats lines read Running 0, Waiting 0. The core's rules cannot
    call that token_budget (nothing waits, no per-step tokens), with or without the hint; kvwatch says
    what the log shows and that the budget is the likely limit of that burst."""
    recs = records(FIXTURES / "token_budget" / "server.log", *hint)
    assert [(r["line"], r["requests_waiting"], r["bottleneck"]) for r in recs] == [(186, 0, "none"), (197, 0, "idle")]
    note = recs[0]["notes"][-1]
    assert "10767.6 prompt + 180 generation tokens/s" in note and "does not show in the log" in note
    assert "max_num_batched_tokens=256" in note and "the budget is the likely limit" in note
    source = "the command line" if hint else "line 16, the scheduler's start-up line"
    assert f"(from {source})" in note

    bare = stats_lines_only("token_budget", tmp_path)
    recs = records(bare, *hint)
    assert [r["bottleneck"] for r in recs] == ["none", "idle"]
    assert "likely limit" not in recs[0]["notes"][-1]  # the sentence needs max_model_len as well
    recs = records(bare, *hint, "--max-model-len", 2048)
    assert ("likely limit" in recs[0]["notes"][-1]) == bool(hint)


def test_stdin_dash_reads_a_pipe():
    text = (FIXTURES / "kv_cache" / "server.log").read_bytes()
    recs = records("-", stdin=text)
    assert [r["bottleneck"] for r in recs] == ["kv_cache", "kv_cache", "kv_cache", "none"]


def test_main_can_be_called_directly(capsys):
    assert logs_main([str(FIXTURES / "max_num_seqs" / "server.log")]) == 0
    out = capsys.readouterr().out
    assert "Dominant bottleneck: max_num_seqs" in out
    assert logs_main(["--json", str(FIXTURES / "kv_cache" / "server.log")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-num-seqs", "x", "f.log"], "argument --max-num-seqs: must be a positive integer, got 'x'"),
        (["--max-model-len", "0", "f.log"], "argument --max-model-len: must be a positive integer, got '0'"),
        ([], "the following arguments are required: FILE|-"),
        (["--nope", "f.log"], "unrecognized arguments: --nope"),
        (["/nonexistent/vllm.log"], "cannot read /nonexistent/vllm.log: No such file or directory"),
        ([str(FIXTURES)], "Is a directory"),
    ],
)
def test_bad_usage_exits_2_with_one_line(args, message):
    p = kvwatch_logs(*args)
    assert p.returncode == 2
    err = p.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("kvwatch logs: error: ") and message in err, err
    assert p.stdout == b""


def test_a_file_without_stats_lines_exits_1(tmp_path):
    f = tmp_path / "other.log"
    f.write_text('INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200 OK\n' * 3)
    p = kvwatch_logs(f)
    assert p.returncode == 1 and p.stdout == b""
    assert p.stderr.decode() == f"kvwatch logs: no vLLM stats line found in {f} (3 lines read)\n"


def test_help_lists_the_flags():
    p = kvwatch_logs("--help")
    assert p.returncode == 0
    out = p.stdout.decode()
    for flag in ("--json", "--follow", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "FILE|-"):
        assert flag in out


def test_no_record_with_requests_waiting_reads_none():
    """Issue 25: "none" says the server is fine. On every real log and every example log, a record with requests
    waiting names a limit or is undetermined, at low confidence, saying what it lacks (one request between arrival
    and admission, or arrivals between steps at the batch's scale, say so)."""
    logs = sorted(FIXTURES.glob("*/server.log")) + sorted((FIXTURES.parent / "logs").glob("*.log"))
    waited = 0
    for log in logs:
        for r in records(log):
            if not r["requests_waiting"]:
                continue
            waited += 1
            text = " ".join(r["evidence"])
            assert r["bottleneck"] != "none", (log.name, r["line"], text)
            if r["bottleneck"] == "undetermined":
                assert r["confidence"] == "low", (log.name, r["line"], text)
    assert waited >= 40
