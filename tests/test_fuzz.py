"""The parser under fuzzing (bench/fuzz.py): what it found stays fixed, its classes stay honest, the harness can
fail, and a bounded run in CI finds no crash and no unexplained disagreement.

The findings are small files under tests/fixtures/fuzz/ (its README says what each one was).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench import fuzz as F
from kvwatch.engines.vllm import keep_family
from kvwatch.export import KvwatchCollector
from kvwatch.parse import ParseError, parse
from kvwatch.recording import recording_files
from kvwatch.state import NoEngineMetrics, Target

ROOT = Path(__file__).resolve().parent.parent
FUZZ = ROOT / "tests" / "fixtures" / "fuzz"

# kvwatch's bugs the fuzz found, fixed: kvwatch's verdict now (the same as prometheus_client's), and its error.
FIXED = {
    "value_underscore.prom": ("reject", "bad value '1_000'"),
    "duplicate_label.prom": ("reject", "duplicate label name"),
    "name_label.prom": ("reject", "duplicate label name"),
    "help_bad_name.prom": ("reject", "bad metric name 'process]cpu_seconds_total' in a HELP line"),
    "help_unicode_space.prom": ("reject", "in a HELP line"),
    "type_unicode_space.prom": ("reject", "unknown type"),
    "indented_comment.prom": ("ok", None),
    "double_trailing_comma.prom": ("reject", "bad label set"),
    "type_without_name.prom": ("reject", "a TYPE line without a metric name"),
    "timestamp_rounding.prom": ("ok", None),
    "timestamp_overflow.prom": ("reject", "bad timestamp"),
}
# Deliberate differences from prometheus_client's text parser: (class, the EXPLANATIONS name the fuzz gives it).
DELIBERATE = {
    "no_final_newline.prom": ("stricter", "no_final_newline"),
    "exemplar.prom": ("stricter", "extra_tokens"),
    "three_tokens.prom": ("stricter", "extra_tokens"),
    "name_with_space.prom": ("stricter", "invalid_metric_name"),
    "quoted_label_name.prom": ("stricter", "quoted_label_name"),
    "invalid_label_name.prom": ("stricter", "invalid_label_name"),
    "leading_comma.prom": ("stricter", "leading_comma"),
    "carriage_return_separator.prom": ("stricter", "non_blank_whitespace"),
    "value_unicode_space.prom": ("stricter", "non_blank_whitespace"),
    "unknown_type_overridden.prom": ("stricter", "unknown_type"),
    "name_only_line.prom": ("stricter", "no_value"),
    "value_non_ascii_digits.prom": ("stricter", "non_ascii_number"),
    "bad_line_in_skipped_family.prom": ("laxer", "skipped_family"),
    "counter_suffix_grouping.prom": ("different", "family_grouping"),
    "counter_without_total.prom": ("different", "counter_total_added"),
    "retyped_summary.prom": ("different", "counter_total_added"),
    "hash_glued_type.prom": ("laxer", "hash_glued_to_keyword"),
}
# Against the OpenMetrics parser, on bodies both accept.
OPENMETRICS = {
    "om_duplicate_series.prom": "om_duplicate_series",
    "om_timestamp.prom": "om_timestamp_seconds",
    "om_hash_glued_type.prom": "om_hash_glued_to_keyword",
    "om_value_glued.prom": "om_no_space_before_value",
}
PIPELINE = sorted(p for p in (FUZZ / "pipeline").iterdir() if p.is_dir())


def _body(name: str) -> str:
    return (FUZZ / "parser" / name).read_bytes().decode("utf-8")  # bytes as written: no newline translation


def test_every_finding_is_listed_and_every_explanation_has_one():
    files = {p.name for p in (FUZZ / "parser").glob("*.prom")}
    assert files == set(FIXED) | set(DELIBERATE) | set(OPENMETRICS)
    assert {why for _, why in DELIBERATE.values()} == set(F.EXPLANATIONS)
    assert set(OPENMETRICS.values()) == set(F.OM_EXPLANATIONS)
    assert {p.name for p in PIPELINE} == {
        "inconsistent_histogram_count",
        "infinite_histogram_bucket",
        "infinite_histogram_sum",
        "overflowing_deltas",
        "overflowing_gauges",
    }


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_findings_now_agree_with_prometheus_client(name):
    text = _body(name)
    want, error = FIXED[name]
    verdict = F.judge(text)
    assert (verdict["ours"], verdict["ref"], verdict["class"]) == (want, want, None), verdict
    if error is not None:
        with pytest.raises(ParseError, match=error.replace("[", r"\[").replace("]", r"\]")):
            parse(text, keep_family)


def test_a_timestamp_past_2_to_the_53_is_rounded_once():
    (sample,) = parse(_body("timestamp_rounding.prom"), keep_family)["vllm:num_requests_running"].samples
    assert sample.timestamp == 34433789083589074 / 1000 != float("34433789083589074") / 1000


def test_an_indented_comment_is_a_comment():
    fam = parse(_body("indented_comment.prom"), keep_family)["vllm:num_requests_running"]
    assert (fam.type, fam.help, [s.value for s in fam.samples]) == ("gauge", "Number of requests.", [4.0])


@pytest.mark.parametrize("name", sorted(DELIBERATE))
def test_deliberate_differences_are_classified_and_explained(name):
    cls, why = DELIBERATE[name]
    verdict = F.judge(_body(name))
    assert (verdict["class"], verdict["why"]) == (cls, why), verdict


@pytest.mark.parametrize("name", sorted(OPENMETRICS))
def test_openmetrics_differences_are_explained(name):
    verdict = F.judge(_body(name))
    assert (verdict["ours"], verdict["om"]) == ("ok", "ok")
    assert (verdict.get("om_class"), verdict.get("om_why")) == ("different", OPENMETRICS[name]), verdict


def _replay(directory: Path) -> list[dict]:
    """The recording through Target.observe / diagnose, the collector and the JSON API's document."""
    target = Target("http://fuzz/metrics")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(KvwatchCollector(lambda: [target]))
    docs = []
    for t, path in recording_files(directory):
        try:
            target.observe_body(t, path.read_text())
        except (ParseError, NoEngineMetrics) as e:
            target.observe_failure(t, str(e))
        target.diagnosis = target.diagnose(t + 0.25)
        assert generate_latest(registry)
        docs.append(json.loads(json.dumps(target.diagnosis.as_dict(), allow_nan=False)))
    return docs


@pytest.mark.parametrize("directory", PIPELINE, ids=lambda p: p.name)
def test_pipeline_findings_neither_crash_nor_break_the_json(directory):
    docs = _replay(directory)
    assert len(docs) == 4 and all(d["up"] for d in docs)  # every scrape was read: the hostile one too
    hostile = docs[2]["engines"][0]["signals"]
    assert hostile["requests_waiting"] == 2.0  # the rest of the hostile scrape still counts


def test_a_histogram_with_a_non_finite_number_is_unusable_not_poison():
    docs = _replay(FUZZ / "pipeline" / "infinite_histogram_sum")
    assert "mean_sequence_tokens" in docs[1]["engines"][0]["signals"]
    assert "mean_sequence_tokens" not in docs[2]["engines"][0]["signals"]  # -1e400 is no length


@pytest.mark.slow  # five `kvwatch diagnose --replay` processes
@pytest.mark.parametrize("directory", PIPELINE, ids=lambda p: p.name)
def test_pipeline_findings_through_the_real_command(directory):
    proc = subprocess.run(
        [sys.executable, "-m", "kvwatch", "diagnose", "--replay", str(directory), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]

    def no_constant(c):
        raise AssertionError(f"{c} in the JSON")

    doc = json.loads(proc.stdout, parse_constant=no_constant)
    assert doc["up"] and doc["engines"]


# --- the harness ---------------------------------------------------------------------------------


def test_cases_are_deterministic_given_the_seed():
    a = [F.make_case(7, i).data for i in range(40)]
    assert a == [F.make_case(7, i).data for i in range(40)]
    assert a != [F.make_case(8, i).data for i in range(40)]
    assert len(set(a)) > 30  # and they vary


def test_a_short_run_finds_nothing_and_counts_every_case():
    res = F.run(300, seed=11)
    c = res["counts"]
    assert res["cases"] == 300 and c.get("crashes", 0) == 0 and c.get("unexplained", 0) == 0, res["examples"][:3]
    assert c["ours_ok"] + c["ours_reject"] == 300
    assert c["agree"] + c.get("disagreements", 0) == 300
    assert c.get("stricter", 0) + c.get("laxer", 0) + c.get("different", 0) == c.get("disagreements", 0)
    assert c["pipeline_cases"] == 300 // F.PIPELINE_EVERY + 1
    assert c.get("disagreements", 0) == sum(v for k, v in res["explained"].items() if not k.startswith("om_"))


def test_the_harness_catches_a_crash_and_saves_the_input(tmp_path, monkeypatch):
    real = F.parse

    def buggy(text, keep=None):
        if "vllm:" in text:
            raise KeyError("a bug")
        return real(text, keep)

    monkeypatch.setattr(F, "parse", buggy)
    res = F.run(40, seed=3, save_dir=tmp_path)
    assert res["counts"]["crashes"] > 0
    crash = next(e for e in res["examples"] if e["kind"] == "crash")
    assert "KeyError: 'a bug'" in crash["error"]
    assert Path(crash["file"]).read_bytes() == F.make_case(3, crash["case"]).data


def test_the_harness_counts_a_disagreement_it_cannot_explain(monkeypatch):
    monkeypatch.setattr(F, "explain", lambda *a: None)
    res = F.run(200, seed=5)
    assert res["counts"]["unexplained"] == res["counts"]["disagreements"] > 0


@pytest.mark.slow  # up to ~60 s of fuzzing
@pytest.mark.timeout(600)
def test_fuzz_in_ci_no_crash_no_unexplained_disagreement(tmp_path):
    """10^5 cases or 60 s of wall-clock time, whichever comes first (the count is reported, never asserted)."""
    res = F.run(100_000, seed=0, budget_s=60.0, save_dir=tmp_path)
    print(f"\n{F.table(res)}")
    c = res["counts"]
    assert res["cases"] > 0
    assert c.get("crashes", 0) == 0, res["examples"][:5]
    assert c.get("unexplained", 0) == 0, res["examples"][:5]
