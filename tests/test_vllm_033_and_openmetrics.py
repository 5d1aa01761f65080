"""vLLM 0.33 and its Rust frontend: the 0.33 fixtures (tests/fixtures/vllm-0.33, written from 0.33's source) are
diagnosed as the 0.32 captures they were written from, the OpenMetrics form exactly as the text form, and the
parser reads OpenMetrics as prometheus_client's OpenMetrics parser does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from kvwatch.diagnose import Hints
from kvwatch.parse import ParseError, parse
from kvwatch.scrape import FetchConfig, Fetcher, ScrapeError
from kvwatch.state import Target
from tests.helpers.fake_vllm import OPENMETRICS, FakeVllm
from tests.helpers.recordings import FIXTURES, recording
from tests.helpers.v033 import SOURCE, fixtures
from tests.test_diagnose import EXPECTED, HINTS

V033 = fixtures()  # written from the 0.32 captures by make.py (tests/helpers/v033.py)
SCENARIOS = ("kv_cache", "max_num_seqs", "token_budget", "none_prefix_cache")
OPENMETRICS_FILES = sorted((V033 / "openmetrics").glob("*/*.prom"))


def _replay(folder: Path, hints: Hints) -> list[dict]:
    state = Target("fixture", hints=hints)
    out = []
    for t, f in recording(folder):
        state.observe_body(t, f.read_text())
        out.append(state.diagnose(t).as_dict())
    return out


def _verdicts(timeline: list[dict]) -> list[tuple]:
    """What a user acts on: per moment and engine, the bottleneck, how sure, and the actions advised."""
    return [
        tuple(
            (e["bottleneck"], e["confidence"], tuple(r["action"] for r in e["recommendations"])) for e in d["engines"]
        )
        for d in timeline
    ]


def test_make_writes_every_capture_in_both_forms_and_the_committed_examples():
    written = sorted(p.relative_to(V033) for p in V033.rglob("*.prom"))
    assert len(written) == 2 * sum(len(recording(FIXTURES / s)) for s in SCENARIOS)
    # one body of each form is committed for people to read (examples/); it is what make.py writes
    for form in ("text", "openmetrics"):
        (example,) = (SOURCE / "examples" / form).glob("*.prom")
        assert (V033 / form / "kv_cache" / example.name).read_bytes() == example.read_bytes()


@pytest.mark.parametrize("with_hints", [False, True], ids=["no-hints", "hints"])
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_033_diagnoses_as_the_032_capture_it_was_written_from(scenario, with_hints):
    hints = HINTS[scenario] if with_hints else Hints()
    old = _replay(FIXTURES / scenario, hints)
    text = _replay(V033 / "text" / scenario, hints)
    assert _verdicts(text) == _verdicts(old)
    assert EXPECTED.get(scenario, scenario) in {e["bottleneck"] for d in text for e in d["engines"]}  # not all idle
    # The Rust frontend's OpenMetrics of the same state: the same diagnosis, evidence and figures included.
    assert _replay(V033 / "openmetrics" / scenario, hints) == text


def test_custom_bucket_layouts_are_read_from_the_body():
    # 0.33's custom_histogram_buckets: the fixtures' TTFT layout is not the default one.
    body = (V033 / "text" / "kv_cache" / recording(FIXTURES / "kv_cache")[20][1].name).read_text()
    edges = [s.labels["le"] for s in parse(body)["vllm:time_to_first_token_seconds"].samples if "le" in s.labels]
    assert edges == ["0.01", "0.1", "0.5", "1.0", "5.0", "10.0", "40.0", "160.0", "2560.0", "+Inf"]

    # The quantiles come from the layout served: present, and not those of the 0.32 default layout.
    def ttft(folder):
        state, out = Target("fixture"), []
        for t, f in recording(folder):
            state.observe_body(t, f.read_text())
            out += [e.signals.latency.quantiles.get("time_to_first_token_seconds") for e in state.diagnose(t).engines]
        return out

    both = [
        (a, b) for a, b in zip(ttft(V033 / "text" / "kv_cache"), ttft(FIXTURES / "kv_cache"), strict=False) if a and b
    ]
    assert both and any(a != b for a, b in both)


def _as_reference(body: str) -> dict:
    return {
        f.name: (f.type, f.documentation, [(s.name, s.labels, repr(float(s.value)), s.timestamp) for s in f.samples])
        for f in openmetrics_families(body)
    }


def _as_ours(body: str) -> dict:
    return {
        f.name: (f.type, f.help, [(s.name, s.labels, repr(s.value), s.timestamp) for s in f.samples])
        for f in parse(body).values()
    }


def test_there_are_openmetrics_fixtures():
    assert len(OPENMETRICS_FILES) == len(list((V033 / "text").glob("*/*.prom"))) > 100


@pytest.mark.slow  # 148 bodies through prometheus_client's pure-Python OpenMetrics parser
@pytest.mark.parametrize("path", OPENMETRICS_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_openmetrics_fixture_parses_as_prometheus_client_reads_it(path):
    body = path.read_text()
    assert _as_ours(body) == _as_reference(body)


@pytest.mark.parametrize("path", OPENMETRICS_FILES[::37], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_openmetrics_fixture_sample_parses_as_prometheus_client_reads_it(path):
    body = path.read_text()
    assert _as_ours(body) == _as_reference(body)


# Generated OpenMetrics (the subset vLLM's families use: counters, gauges, histograms, labels, no timestamps):
# prometheus_client's OpenMetrics parser is the reference.
_LABEL_VALUES = st.sampled_from(["0", "1", "tiny-llama", 'a"b', "a\\b", "x\ny", "", "{},="])


def _labels(draw, extra=()):
    names = draw(st.lists(st.sampled_from(["engine", "model_name", "reason"]), unique=True, max_size=3))
    pairs = [(n, draw(_LABEL_VALUES)) for n in names] + list(extra)
    return pairs


def _render(pairs) -> str:
    if not pairs:
        return ""
    esc = [(k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')) for k, v in pairs]
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc) + "}"


_HELP_TEXTS = ["Text.", "a \\\\ b", "say \\n twice"]
_VALUES = st.sampled_from(["0", "1.0", "2.5e3", "-1.5", "NaN", "+Inf", "1e-07", "34567503"])


@st.composite
def _openmetrics(draw):
    lines: list[str] = []
    for i in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["counter", "gauge", "histogram"]))
        name = f"vllm:fam_{i}"
        help_text = draw(st.sampled_from(_HELP_TEXTS))
        lines.append(f"# HELP {name} {help_text}".rstrip())
        lines.append(f"# TYPE {name} {kind}")
        if draw(st.booleans()):
            lines.append(f"# UNIT {name} ")
        for j in range(draw(st.integers(1, 3))):
            pairs = _labels(draw) + [("series", str(j))]
            if kind == "gauge":
                lines.append(f"{name}{_render(pairs)} {draw(_VALUES)}")
            elif kind == "counter":
                lines.append(f"{name}_total{_render(pairs)} {draw(st.sampled_from(['0', '1.0', '34567503', '2.5e3']))}")
            else:
                total = 0
                for le in draw(st.sampled_from([["1.0", "+Inf"], ["0.5", "2.0", "8.0", "+Inf"], ["+Inf"]])):
                    total += draw(st.integers(0, 3))
                    lines.append(f"{name}_bucket{_render(pairs + [('le', le)])} {total}")
                lines.append(f"{name}_count{_render(pairs)} {total}")
                lines.append(f"{name}_sum{_render(pairs)} {draw(st.sampled_from(['0.0', '1.5', '12']))}")
    return "\n".join(lines + ["# EOF"]) + draw(st.sampled_from(["\n", ""]))


@settings(max_examples=300, deadline=None)
@given(_openmetrics())
def test_generated_openmetrics_parses_as_prometheus_client_reads_it(body):
    assert _as_ours(body) == _as_reference(body)


def test_nothing_may_follow_eof():
    body = "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total 1.0\n# EOF\n"
    assert parse(body)["vllm:prompt_tokens"].samples[0].value == 1.0
    assert list(parse(body.rstrip("\n"))) == ["vllm:prompt_tokens"]  # the LF after # EOF is optional
    with pytest.raises(ParseError, match="line 3: data after '# EOF'"):
        parse(body + "vllm:prompt_tokens_total 2.0\n")
    with pytest.raises(ParseError, match="does not end with a newline"):
        parse(body[:-8])  # cut inside the last sample


def _scrape(upstream: FakeVllm) -> str:
    async def go():
        async with upstream:
            fetcher = Fetcher(FetchConfig(timeout=5.0, max_body_bytes=16 << 20), "test")
            try:
                return await fetcher.fetch(upstream.url)
            finally:
                await fetcher.aclose()

    return asyncio.run(go())


def test_the_rust_frontend_over_http_is_scraped_and_a_cut_body_refused():
    body = OPENMETRICS_FILES[10].read_text()
    got = _scrape(FakeVllm(content_type=OPENMETRICS).serve(body))
    assert got == body and "vllm:prompt_tokens" in parse(got)
    # Cut at a line end, a text body looks whole; OpenMetrics' missing "# EOF" gives it away.
    cut = body[: body.rindex("\n", 0, len(body) // 2) + 1]
    with pytest.raises(ScrapeError, match="without '# EOF'") as e:
        _scrape(FakeVllm(content_type=OPENMETRICS).serve(cut))
    assert e.value.reason == "parse"


def test_033_aggregated_log_line_with_every_optional_field():
    # vllm/v1/metrics/loggers.py at 00ec631b: AggregatedLoggingStatLogger's prefix "%d Engines Aggregated: " before
    # LoggingStatLogger.log's parts (Deferred, KV fetch, Preemptions each only when non-zero; the device's KV field).
    from kvwatch.logs import LogSession

    s = LogSession(Hints())
    for i, line in enumerate((Path(__file__).parent / "fixtures" / "logs" / "v1_0.33_aggregated_pd.log").open(), 1):
        s.feed(line.rstrip("\n"), i)
    s.finish()
    recs = [r.record for r in s.results]
    assert {r.engine for r in recs} == {"aggregated"} and {r.kv_device for r in recs} == {"GPU"}
    assert [(r.requests_waiting, r.requests_deferred, r.kv_fetch, r.preemptions) for r in recs] == [
        (35, 6, (4, 2, 0), None),
        (41, 5, (3, 2, 0), 9),
        (47, 7, (5, 2, 0), 12),
        (6, 6, (4, 2, 0), None),
    ]
    # the last: every waiting request deferred and each in a KV fetch (4 + 2 of 6): waiting on the P/D connector
    assert [r.diagnosis.bottleneck for r in s.results] == ["kv_cache"] * 3 + ["kv_transfer"]


@pytest.mark.slow  # two kvwatch processes
def test_replaying_a_recording_of_the_rust_frontend_gives_the_text_forms_timeline():
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}

    def timeline(form):
        args = [sys.executable, "-m", "kvwatch", "diagnose", "--replay", str(V033 / form / "kv_cache"), "--timeline"]
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return [{k: v for k, v in json.loads(line).items() if k != "target"} for line in r.stdout.splitlines()]

    text = timeline("text")
    assert len(text) == len(recording(FIXTURES / "kv_cache")) and "kv_cache" in {d["bottleneck"] for d in text}
    assert timeline("openmetrics") == text
