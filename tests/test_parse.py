"""The parser equals prometheus_client on real data and on generated text, and is strict where it must be."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from kvwatch.engines.vllm import keep_family
from kvwatch.parse import ParseError, parse
from tests.helpers.recordings import FIXTURES

ALL_CAPTURES = sorted(FIXTURES.glob("*/*.prom")) + sorted((FIXTURES.parent / "vllm-old").glob("*/*.prom"))


def _ours(body, keep=None):
    fams = parse(body, keep)
    meta = {(f.name, f.type, f.help) for f in fams.values() if f.samples}
    samples = sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value)) for f in fams.values() for s in f.samples)
    return meta, samples


def _reference(body, keep=None, parsed=None):
    """prometheus_client's view of ``body``; ``parsed``: its families of this body, when already at hand."""
    if parsed is None:
        parsed = text_string_to_metric_families(body)
    fams = [f for f in parsed if keep is None or keep(f.name)]
    meta = {(f.name, f.type, f.documentation) for f in fams if f.samples}
    samples = sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value)) for f in fams for s in f.samples)
    return meta, samples


def test_there_are_captures():
    assert len(ALL_CAPTURES) > 100


@pytest.mark.slow  # 192 captures through prometheus_client's pure-Python parser
@pytest.mark.parametrize("path", ALL_CAPTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_equal_to_prometheus_client_on_every_capture(path):
    body = path.read_text()
    parsed = list(text_string_to_metric_families(body))  # the reference parses each capture once, for both checks
    assert _ours(body) == _reference(body, parsed=parsed)
    # The filtered parse keeps exactly the wanted families, unchanged.
    assert _ours(body, keep_family) == _reference(body, keep_family, parsed=parsed)


def test_filter_skips_unwanted_families():
    body = (FIXTURES / "kv_cache").glob("*.prom").__next__().read_text()
    fams = parse(body, keep_family)
    assert "vllm:num_requests_running" in fams
    assert "python_gc_objects_collected" not in fams
    assert all(keep_family(n) for n in fams)


def test_counter_family_name_drops_total_and_keeps_help():
    body = "# HELP vllm:num_preemptions_total Cumulative.\n# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total 3.0\n"
    fams = parse(body)
    assert list(fams) == ["vllm:num_preemptions"]
    fam = fams["vllm:num_preemptions"]
    assert (fam.type, fam.help, fam.samples[0].name, fam.samples[0].value) == (
        "counter",
        "Cumulative.",
        "vllm:num_preemptions_total",
        3.0,
    )


@pytest.mark.parametrize(
    "body, what",
    [
        ('vllm:num_requests_running{engine="0"} 4', "newline"),  # cut off mid-line
        ('vllm:num_requests_running{engine="0"} 4.0.1\n', "bad value"),
        ('vllm:num_requests_running{engine="0} 4\n', "label"),
        ('vllm:num_requests_running{engine="0" model="x"} 4\n', "comma"),
        ("vllm:num_requests_running\n", "value"),
        ("# TYPE vllm:x wibble\n", "unknown type"),
        ("1badname 3\n", "metric name"),
        ("vllm:x 1 2 3\n", "value"),
    ],
)
def test_strict_on_malformed_input(body, what):
    with pytest.raises(ParseError, match=what):
        parse(body)


def test_truncated_real_body_is_an_error_not_a_smaller_number():
    body = next(iter((FIXTURES / "kv_cache").glob("*.prom"))).read_text()
    cut = body.index("vllm:kv_cache_usage_perc{") + len(
        'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama-dummy"} 0.'
    )
    with pytest.raises(ParseError):
        parse(body[:cut], keep_family)
    # prometheus_client would have returned a value here: that is the leniency we refuse.
    assert list(text_string_to_metric_families(body[:cut]))


def test_escapes_and_special_values():
    body = (
        '# HELP m A \\\\ help\n# TYPE m gauge\nm{a="x\\"y",b="line\\nbreak",c="}{,"} +Inf\n'
        'm{a="1"} NaN\nm{a="2"} -1.5e-3 1700000000000\n'
    )
    samples = parse(body)["m"].samples
    assert samples[0].labels == {"a": 'x"y', "b": "line\nbreak", "c": "}{,"}
    assert math.isinf(samples[0].value) and math.isnan(samples[1].value)
    assert samples[2].value == -0.0015 and samples[2].timestamp == 1700000000.0
    assert _ours(body)[1] == _reference(body)[1]


# --- property test: generated exposition text ------------------------------------------------

_name = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,12}", fullmatch=True)
_label_name = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: n not in ("le", "quantile"))
_label_value = st.text(
    st.characters(codec="utf-8", exclude_characters="\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=10
)
_value = st.one_of(
    st.floats(allow_nan=False, width=64),
    st.integers(-(10**12), 10**12).map(float),
    st.sampled_from([math.inf, -math.inf]),
)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def exposition(draw):
    lines = []
    names = draw(st.lists(_name, min_size=1, max_size=5, unique_by=lambda n: n.removesuffix("_total")))
    for name in names:
        typ = draw(st.sampled_from(["gauge", "counter", "untyped"]))
        if typ == "counter" and not name.endswith("_total"):
            name += "_total"
        help_ = draw(st.text(st.characters(codec="ascii", min_codepoint=32, max_codepoint=126), max_size=20)).strip()
        lines.append(f"# HELP {name} {help_}".rstrip() if help_ else f"# HELP {name}")
        lines.append(f"# TYPE {name} {typ}")
        label_names = draw(st.lists(_label_name, max_size=3, unique=True))
        seen = set()
        for _ in range(draw(st.integers(1, 4))):
            values = tuple(draw(_label_value) for _ in label_names)
            if values in seen:
                continue
            seen.add(values)
            labels = ",".join(f'{k}="{_esc(v)}"' for k, v in zip(label_names, values, strict=False))
            value = draw(_value)
            lines.append(f"{name}{{{labels}}} {value!r}" if labels else f"{name} {value!r}")
    return "\n".join(lines) + "\n"


@pytest.mark.slow  # hypothesis: hundreds of generated examples
@settings(max_examples=300, deadline=None)
@given(exposition())
def test_equal_to_prometheus_client_on_generated_text(body):
    assert _ours(body) == _reference(body)


@pytest.mark.slow  # hypothesis: hundreds of generated examples
@settings(max_examples=200, deadline=None)
@given(exposition(), st.integers(1, 200))
def test_a_cut_body_never_parses_as_different_numbers(body, cut):
    """Cut anywhere but at a line end: an error, never silently different samples."""
    cut = min(cut, len(body) - 1)
    if body[cut - 1] == "\n":
        return
    with pytest.raises(ParseError):
        parse(body[:cut])
