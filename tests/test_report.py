"""``kvwatch report`` on real vLLM 0.32 captures (tests/fixtures/vllm-0.32.0-cpu) and vLLM-shaped benchmark
results: the stage's binding limit, the knee, the cautions, bad input (exit 2, one line, no traceback), and a
self-contained HTML file. (In a browser: tests/test_report_browser.py; on the simulator: test_report_sim.py.)
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvwatch.catalog import Bottleneck, ReportThresholds
from kvwatch.diagnose import Hints
from kvwatch.history import TargetHistory
from kvwatch.report.bench import Stage, read_stage
from kvwatch.report.model import Slo, build_report, stage_verdict
from kvwatch.report.render import MAX_POINTS, downsample, render_markdown
from kvwatch.report.source import Timeline, from_history, from_recording
from kvwatch.state import Target
from tests.helpers.bench_results import vllm_result, write_result
from tests.helpers.recordings import FIXTURES, recording

KVWATCH = [sys.executable, "-m", "kvwatch"]


def _timeline(folder: Path, **target):
    return from_recording(folder, Target(str(folder), **target))


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([*KVWATCH, "report", *map(str, args)], capture_output=True, text=True, timeout=120)


def _queue_span(folder: Path) -> tuple[float, float]:
    """The capture's busy part: from the first to the last snapshot with a request running or waiting."""
    tl = _timeline(folder)
    s = tl.engines[0]["series"]
    busy = [
        t for t, r, w in zip(s["t"], s["requests_running"], s["requests_waiting"], strict=True) if (r or 0) + (w or 0)
    ]
    return busy[0], busy[-1]


# ------------------------------------------------------------------------------------------ benchmark results


def test_a_vllm_result_is_a_stage_ending_at_its_date(tmp_path):
    end = 1796120700.0
    f = write_result(tmp_path / "c2.json", vllm_result(end, 30.0, 2, 900.0, 40.0))
    s = read_stage(f)
    assert (s.start, s.end, s.timed_by) == (end - 30.0, end, "date field")
    assert s.concurrency == 2 and s.request_rate is None and s.completed == 40
    assert s.latency_ms["ttft"] == {"mean": 300.0, "median": 225.0, "p99": 900.0} and s.p99_seconds("itl") == 0.04
    # Without a date: the file's modification time (vLLM writes it right after the run); --stage-start wins.
    doc = vllm_result(end, 30.0, 2, 900.0, 40.0)
    del doc["date"]
    g = write_result(tmp_path / "nodate.json", doc)
    assert read_stage(g).timed_by == "file mtime" and read_stage(g).end == pytest.approx(g.stat().st_mtime)
    assert (read_stage(g, start=100.0).start, read_stage(g, start=100.0).end) == (100.0, 130.0)


@pytest.mark.parametrize(
    "doc,field",
    [
        ({"benchmarks": [{"metrics": {}}], "args": {}}, "duration"),  # guidellm's report: another tool
        ({"duration": 10, "completed": 3, "request_throughput": 0.3}, "output_throughput"),  # a pooling run, say
    ],
)
def test_another_tools_file_is_refused_in_one_line_naming_the_field(tmp_path, doc, field):
    f = write_result(tmp_path / "other.json", doc)
    with pytest.raises(ValueError, match=f"other.json: no '{field}' field"):
        read_stage(f)
    rec = tmp_path / "rec"
    shutil.copytree(FIXTURES / "max_num_seqs", rec)
    r = _run(rec, "--bench", f)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and f"no '{field}' field" in r.stderr


# ------------------------------------------------------------------------------------------ stages and the knee


def _stages(tmp_path, folder: Path, pieces) -> list:
    """Stages laid over the capture: (name, start, end, concurrency, ttft p99 ms, itl p99 ms)."""
    out = []
    for name, start, end, conc, ttft, itl in pieces:
        out.append(read_stage(write_result(tmp_path / name, vllm_result(end, end - start, conc, ttft, itl)), start))
    return out


def test_the_stage_under_a_queue_names_max_num_seqs_and_the_idle_one_none(tmp_path):
    folder = FIXTURES / "max_num_seqs"  # real vLLM at --max-num-seqs 2, 40 requests at once
    tl = _timeline(folder, hints=Hints(max_num_seqs=2))
    t0, t1 = _queue_span(folder)
    files = [t for t, _ in recording(folder)]
    stages = _stages(
        tmp_path, folder, [("light.json", files[0], t0 - 1, 1, 100.0, 20.0), ("heavy.json", t0, t1, 40, 5000.0, 30.0)]
    )
    model = build_report(tl, stages, Slo(ttft_p99=1.0))
    light, heavy = model["stages"]  # lightest load first
    assert (light["name"], heavy["name"]) == ("light.json", "heavy.json")
    assert heavy["binding"] == "max_num_seqs" and heavy["binding_share"] >= ReportThresholds().binding_share
    assert heavy["verdicts"]["max_num_seqs"] == heavy["binding_share"]
    assert "raise_max_num_seqs" in [r["action"] for r in heavy["recommendations"]]
    assert any("max_num_seqs" in e for e in heavy["evidence"])
    assert light["binding"] == "none" and light["recommendations"] == []
    assert heavy["observed"]["requests_waiting_max"] > 0 and heavy["observed"]["kv_cache_usage_ratio_max"] < 0.5
    k = model["knee"]
    assert (k["highest_met"], k["binding_there"], k["first_broken"]) == ("light.json", "none", "heavy.json")
    assert k["broken_by"] == "TTFT p99 5 s > 1 s"
    # Both SLOs, and one the results cannot judge: no knee is guessed.
    assert build_report(tl, stages, Slo(ttft_p99=10.0, itl_p99=0.025))["knee"]["first_broken"] == "heavy.json"
    assert build_report(tl, stages, Slo(ttft_p99=10.0))["knee"]["highest_met"] == "heavy.json"
    assert build_report(tl, stages)["knee"] is None


def test_a_stage_outside_the_recording_is_said_not_guessed(tmp_path):
    folder = FIXTURES / "max_num_seqs"
    tl = _timeline(folder)
    stages = _stages(
        tmp_path,
        folder,
        [
            ("later.json", tl.end + 3600, tl.end + 3660, 4, 100.0, 20.0),
            ("half.json", tl.end - 10, tl.end + 30, 2, 100.0, 20.0),
        ],
    )
    model = build_report(tl, stages)
    by = {r["name"]: r for r in model["stages"]}
    assert by["later.json"]["binding"] is None and by["later.json"]["snapshots"] == 0
    assert by["half.json"]["coverage"] < ReportThresholds().min_coverage
    said = {(c["kind"], c["stage"]) for c in model["cautions"]}
    assert {("outside", "later.json"), ("outside", "half.json")} <= said
    assert "unknown (outside the recording)" in render_markdown(model)


def test_prefix_cache_hits_and_shared_seeds_are_cautions(tmp_path):
    folder = FIXTURES / "none_prefix_cache"  # 200 shared prefix tokens in every prompt: about half are hits
    tl = _timeline(folder)
    t0, t1 = _queue_span(folder)
    stages = _stages(tmp_path, folder, [("a.json", t0, t1, 4, 100.0, 20.0)])
    seeded = [
        read_stage(write_result(tmp_path / n, vllm_result(t1, t1 - t0, 4, 1.0, 1.0, seed="7")), t0)
        for n in ("s1.json", "s2.json")
    ]
    hit = build_report(tl, stages)["stages"][0]["observed"]["prefix_cache_hit_ratio_mean"]
    assert 0.3 < hit < 0.9
    kinds = lambda m: [c["kind"] for c in m["cautions"]]  # noqa: E731
    assert "prefix_cache" in kinds(build_report(tl, stages, th=ReportThresholds(prefix_cache_caution=hit - 0.01)))
    assert "prefix_cache" not in kinds(build_report(tl, stages, th=ReportThresholds(prefix_cache_caution=hit + 0.01)))
    shared = [c for c in build_report(tl, seeded)["cautions"] if c["kind"] == "shared_seed"]
    assert len(shared) == 1 and "s1.json, s2.json share seed 7" in shared[0]["text"]


# ------------------------------------------------------------------------------------------ the recording


def test_a_restart_and_the_gap_before_it_are_cautions(tmp_path):
    rec = tmp_path / "rec"  # two real vLLM servers, one after the other: counters start again
    shutil.copytree(FIXTURES / "max_num_seqs", rec)
    second = recording(FIXTURES / "none_prefix_cache")
    for _, f in second:
        shutil.copy(f, rec)
    model = build_report(_timeline(rec), [])
    assert model["restarts"] == [second[0][0]]
    assert [c["kind"] for c in model["cautions"]] == ["gap", "restart"]
    assert model["gaps"][0]["end"] == second[0][0]


def test_corrupt_snapshots_are_skipped_and_counted(tmp_path):
    rec = tmp_path / "rec"
    shutil.copytree(FIXTURES / "max_num_seqs", rec)
    files = recording(rec)
    files[3][1].write_bytes(b"\x00\xff garbage {{{")
    files[7][1].write_text("<html>a login page</html>\n")
    model = build_report(_timeline(rec), [])
    assert model["source"]["skipped"] == 2 and model["source"]["snapshots"] == len(files) - 2
    assert [c for c in model["cautions"] if c["kind"] == "skipped"][0]["text"].startswith("2 snapshot(s)")
    r = _run(rec, "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["source"]["skipped"] == 2


@pytest.mark.parametrize(
    "case", ["missing", "empty", "all_corrupt", "both_sources", "no_source", "stage_start", "from_unreachable"]
)
def test_bad_input_exits_2_in_one_line(tmp_path, case):
    rec = tmp_path / "rec"
    rec.mkdir()
    if case == "all_corrupt":
        (rec / "1796120649.163.prom").write_text("not metrics\n")
    args = {
        "missing": [tmp_path / "nope"],
        "empty": [rec],
        "all_corrupt": [rec],
        "no_source": [],
        "both_sources": [rec, "--from", "http://127.0.0.1:1"],
        "stage_start": [FIXTURES / "max_num_seqs", "--stage-start", "1796120649"],
        "from_unreachable": ["--from", "http://admin:hunter2@127.0.0.1:1/"],
    }[case]
    r = _run(*args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "hunter2" not in r.stderr
    assert r.stderr.startswith("kvwatch: error: ") and r.stdout == ""


def test_the_history_of_a_running_kvwatch_reads_as_the_recording_does():
    folder = FIXTURES / "max_num_seqs"
    target = Target("http://vllm:8000/metrics", window_seconds=10, stale_after_seconds=5)
    hist = TargetHistory(3600, 4000)
    for t, f in recording(folder):
        target.observe_body(t, f.read_text())
        hist.record(target.diagnose(t))
    files = recording(folder)
    doc = {"interval": 1.0, "targets": [hist.as_dict(target.target, files[-1][0], 3600)]}
    live = build_report(from_history(json.loads(json.dumps(doc))), [])
    replayed = build_report(_timeline(folder), [])
    assert live["strip"]["order"] == replayed["strip"]["order"]
    assert "max_num_seqs" in live["strip"]["order"] and live["limits"]["max_num_seqs"]["value"] == 2
    assert [c["kind"] for c in live["cautions"]] == ["history"]  # what it cannot see, said


# ------------------------------------------------------------------------------------------ output


def test_downsampling_keeps_every_peak_and_the_figures_come_from_everything():
    n = 3600
    cols = {"t": [float(i) for i in range(n)], "kv_cache_usage_ratio": [0.1] * n, "bottleneck": ["none"] * n}
    cols["kv_cache_usage_ratio"][1234] = 0.99
    small = downsample(cols)
    assert len(small["t"]) == MAX_POINTS and max(small["kv_cache_usage_ratio"]) == 0.99
    assert downsample({"t": [1.0], "x": [2.0]}) == {"t": [1.0], "x": [2.0]}


def test_the_html_is_one_self_contained_file_and_target_text_stays_text(tmp_path):
    evil = tmp_path / 'rec</script><script>alert(1)</script><b>"x'
    shutil.copytree(FIXTURES / "max_num_seqs", evil)
    files = recording(evil)
    bench = write_result(
        tmp_path / "c40.json",
        vllm_result(files[-1][0], files[-1][0] - files[0][0], 40, 900.0, 30.0, model_id="<i>m</i>"),
    )
    out = tmp_path / "report.html"
    r = _run(evil, "--bench", bench, "--stage-start", files[0][0], "--slo-ttft-p99", "1", "--out", out)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "<script>alert(1)" not in html and "<b>" not in html and "<i>m" not in html
    assert "rec&lt;/script&gt;" in html  # the label, as text
    # Nothing fetched: no src or href but data:, no stylesheet link, no URL but the SVG namespace.
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert all(u.startswith("data:") for u in refs), refs
    assert not [u for u in re.findall(r"https?://[^\s\"')<]+", html) if u != "http://www.w3.org/2000/svg"]
    # Every inline script and style is allowed by its hash, and nothing else is.
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', html).group(1).replace("&#x27;", "'")
    sha = lambda t: "'sha256-" + base64.b64encode(hashlib.sha256(t.encode()).digest()).decode() + "'"  # noqa: E731
    scripts = re.findall(r"<script>(.*?)</script>", html, re.S)
    styles = re.findall(r"<style>(.*?)</style>", html, re.S)
    assert len(scripts) == 2 and len(styles) == 1
    assert all(sha(s) in csp for s in scripts + styles) and "unsafe-inline" not in csp and "default-src 'none'" in csp
    assert 'data-role="knee"' in html and "Benchmark stages" in html and "c40.json" in html


def test_markdown_and_json_carry_the_same_verdicts(tmp_path):
    folder = FIXTURES / "kv_cache"
    r = _run(folder, "--format", "json")
    model = json.loads(r.stdout)
    assert r.returncode == 0 and model["kvwatch_version"] and model["limits"]["kv_capacity_tokens"] == 2048
    assert "kv_cache" in model["strip"]["order"] and abs(sum(model["strip"]["shares"].values()) - 1) < 1e-3
    md = _run(folder, "--format", "md").stdout
    assert md.startswith("# kvwatch report") and Bottleneck.KV_CACHE.label in md and "KV capacity: 2,048 tokens" in md


# ------------------------------------------------------------------------------------------ a real sweep


def test_a_real_vllm_bench_serve_sweep(monkeypatch):
    """The e2e lane's ``vllm bench serve`` results (tests/e2e/test_report.py, vLLM 0.32 CPU, --max-num-seqs 4) and
    its recording around the heaviest stage: 16 clients bound by max_num_seqs, the two lighter stages said to lie
    outside this cut of the recording. vLLM wrote ``date`` in the lane's local time, UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        folder = FIXTURES / "bench_sweep"
        results = sorted((folder / "results").glob("*.json"))
        stages = [read_stage(f) for f in results]
        assert {s.concurrency: s.seed for s in stages} == {1: "1", 2: "2", 16: "3"}  # --metadata seed=N
        model = build_report(_timeline(folder), stages, Slo(ttft_p99=1.0))
    finally:
        monkeypatch.undo()
        time.tzset()
    by = {r["concurrency"]: r for r in model["stages"]}
    assert by[16]["binding"] == "max_num_seqs" and by[16]["coverage"] == 1.0
    assert by[16]["latency_ms"]["ttft"]["p99"] > 1000 and by[16]["completed"] == 160
    assert by[1]["binding"] is None and by[2]["binding"] is None
    assert sorted(c["stage"] for c in model["cautions"] if c["kind"] == "outside") == [
        "vllm-bench-c1.json",
        "vllm-bench-c2.json",
    ]
    k = model["knee"]
    assert (k["highest_met"], k["binding_there"], k["first_broken"]) == (
        "vllm-bench-c2.json",
        None,
        "vllm-bench-c16.json",
    )
    assert model["limits"]["max_num_seqs"] == {"value": 4, "source": "inferred"}


def test_a_stage_where_requests_waited_but_no_one_limit_held_is_undetermined_never_none():
    """A stage whose snapshots split between limits, none reaching a quarter, while requests waited in over a quarter
    of them: no limit binds it, and since requests waited it is undetermined (with the waiting share), not "none"."""

    def stage(bottlenecks: list[str]) -> dict:
        n = len(bottlenecks)
        tl = Timeline(
            "t", "recording", 1.0, {"t": [float(i) for i in range(n)], "up": [1.0] * n, "bottleneck": bottlenecks}
        )
        st = Stage("s", 0.0, n - 1.0, "date field", 1, None, 1, 1, None, 1.0, 1.0, None)
        return stage_verdict(tl, st, ReportThresholds())

    mixed = stage(["kv_cache"] * 2 + ["max_num_seqs"] * 2 + ["undetermined"] * 2 + ["none"] * 4)  # 20 % each
    assert (mixed["binding"], mixed["binding_share"]) == ("undetermined", 0.6), mixed
    calm = stage(["kv_cache"] * 2 + ["none"] * 8)
    assert (calm["binding"], calm["binding_share"]) == ("none", 0.8), calm
    held = stage(["kv_cache"] * 3 + ["max_num_seqs"] * 2 + ["none"] * 5)
    assert (held["binding"], held["binding_share"]) == ("kv_cache", 0.3), held
    # undetermined (no limit named: a queue too young to tell) never outvotes a limit named in a quarter of them; the
    # shares of a real vLLM sweep's 16-client stage (tests/e2e/test_report.py)
    named = stage(["undetermined"] * 7 + ["max_num_seqs"] * 6 + ["none"] * 2)
    assert (named["binding"], named["binding_share"]) == ("max_num_seqs", 0.4), named
