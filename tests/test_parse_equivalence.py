"""The performance work changed how kvwatch computes, never what: each fast path equals the code it
stands in for.

- ``parse``: its C-level fast paths (a skipped family passed over by one match, a kept family's block
  read by one findall, a sample line read by one match, in slices of ``_CHUNK``) give exactly what
  the general line-by-line path gives -- the same families, or the same error on the same line -- on
  generated text full of odd spacing, malformed lines, undeclared samples and name prefixes; and
  with a family filter the result equals ``prometheus_client`` (filtered) on generated text and on
  the benchmark's payloads (8 engines x 2 models, 100k series).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

import kvwatch.parse as P
from bench.payloads import big, real_bodies, relabel
from kvwatch.engines.vllm import keep_family


def _dump(families):
    return [
        (f.name, f.type, f.help, [(s.name, sorted(s.labels.items()), repr(s.value), s.timestamp) for s in f.samples])
        for f in families.values()
    ]


def _outcome(body, keep):
    try:
        return "ok", _dump(P.parse(body, keep))
    except P.ParseError as e:
        return "error", str(e)


def _general(body, keep, monkeypatch):
    """The line-by-line path alone: every fast path switched off."""
    with monkeypatch.context() as mp:
        mp.setattr(P, "_SAMPLE_LINE", P.re.compile(r"(?!)"))
        mp.setattr(P, "_skipper", lambda fam: None)
        mp.setattr(P, "_block_patterns", lambda fam: None)
        return _outcome(body, keep)


# --- parse: fast paths == general path ---------------------------------------------------------

_NAMES = ["a", "a_total", "a_created", "a_bucket", "a_sum", "a_count", "ab", "vllm:x", "vllm:x_total", "b", "a{b"]
_TYPES = ["gauge", "counter", "histogram", "summary", "untyped", "info", "wibble", ""]
_SEP = st.sampled_from([" ", " ", " ", "\t", "  ", " \t", ""])
_VALUE = st.sampled_from(["1", "0.5", "-2e-3", "NaN", "+Inf", "-Inf", "1_0", "x", "}", "1{", "0x10", "1.0.1", ""])
_HELP_TEXTS = ["", "text", "a \\\\ b", 'q \\" n \\n']
_LABELS = st.sampled_from(
    [
        "",
        "{}",
        '{l="v"}',
        '{l="v",m="w"}',
        '{l="v",}',
        '{l="a\\"b"}',
        '{l="}{,"}',
        '{ l = "v" }',
        '{l="v" m="w"}',
        '{l="v}',
        "{l=v}",
        '{l="x\\ny"}',
        '{le="0.5"}',
        '{le="+Inf",engine="0"}',
    ]
)


@st.composite
def _line(draw):
    kind = draw(st.sampled_from(["sample", "sample", "sample", "help", "type", "comment", "blank"]))
    if kind == "blank":
        return draw(st.sampled_from(["", " ", "\t"]))
    if kind == "comment":
        return draw(st.sampled_from(["# plain", "#", "# HELP", "#HELP a x", "# TYPE a"]))
    name = draw(st.sampled_from(_NAMES))
    if kind == "help":
        text = draw(st.sampled_from(_HELP_TEXTS))
        return f"#{draw(_SEP) or ' '}HELP {name}{draw(_SEP)}{text}"
    if kind == "type":
        return f"# TYPE{draw(_SEP) or ' '}{name}{draw(_SEP) or ' '}{draw(st.sampled_from(_TYPES))}{draw(_SEP)}"
    ts = draw(st.sampled_from(["", "", " 1700000000000", "\t12", " x"]))
    lead = draw(st.sampled_from(["", "", "", " "]))
    tail = draw(st.sampled_from(["", "", "", " ", "\t", "\r"]))
    return f"{lead}{name}{draw(_LABELS)}{draw(_SEP)}{draw(_VALUE)}{ts}{tail}"


@pytest.mark.slow  # hypothesis: hundreds of generated examples
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(_line(), max_size=25),
    kept=st.sets(st.sampled_from(_NAMES + ["a_x"]), max_size=4),
    chunk=st.sampled_from([8, 40, 1 << 18]),
    truncate=st.booleans(),
)
def test_fast_paths_equal_the_general_path(lines, kept, chunk, truncate, monkeypatch):
    body = "\n".join(lines) + ("" if truncate and lines else "\n")
    for keep in (None, kept.__contains__):
        with monkeypatch.context() as mp:
            mp.setattr(P, "_CHUNK", chunk)
            fast = _outcome(body, keep)
        assert fast == _general(body, keep, monkeypatch)


def test_long_lines_and_long_skipped_families_in_slices(monkeypatch):
    skipped = "# TYPE junk gauge\n" + "".join(f'junk{{i="{i}"}} {i}\n' for i in range(500))
    long_line = 'junk{pad="' + "p" * 3000 + '"} 1\n'
    kept = "# TYPE vllm:x gauge\n" + "".join(f'vllm:x{{i="{i}"}} {i}\n' for i in range(300))
    bodies = [
        skipped + kept,
        skipped + long_line + skipped[18:] + kept,
        skipped + "vllm:x 7\n" + skipped[18:] + kept,  # an undeclared kept sample inside a skipped run
        skipped + "junk{i=1} 2\n" + kept,  # malformed, but a member: never read
        skipped + "junkx 1 2 3\n" + kept,  # not a member, and malformed: an error on its line
    ]
    for body in bodies:
        for chunk in (64, 1000, 1 << 18):
            with monkeypatch.context() as mp:
                mp.setattr(P, "_CHUNK", chunk)
                fast = _outcome(body, lambda n: n.startswith("vllm:"))
            assert fast == _general(body, lambda n: n.startswith("vllm:"), monkeypatch)
    assert _outcome(bodies[4], lambda n: n.startswith("vllm:"))[0] == "error"


def test_undeclared_samples_after_a_skipped_family_are_all_kept():
    """prometheus_client makes every undeclared sample its own family; with a filter, none is lost."""
    body = "# TYPE skipped gauge\nskipped 1\nkept 2\nkept 4\nother 3\n"
    ours = {n: [s.value for s in f.samples] for n, f in P.parse(body, lambda n: n != "skipped").items()}
    theirs = {}
    for f in text_string_to_metric_families(body):
        if f.name != "skipped":
            theirs.setdefault(f.name, []).extend(s.value for s in f.samples)
    assert ours == theirs == {"kept": [2.0, 4.0], "other": [3.0]}


# --- parse with a filter == prometheus_client ------------------------------------------------------


def _ours(body, keep=None):
    fams = P.parse(body, keep)
    meta = {(f.name, f.type, f.help) for f in fams.values() if f.samples}
    samples = sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value)) for f in fams.values() for s in f.samples)
    return meta, samples


def _reference(body, keep=None):
    fams = [f for f in text_string_to_metric_families(body) if keep is None or keep(f.name)]
    meta = {(f.name, f.type, f.documentation) for f in fams if f.samples}
    samples = sorted((s.name, tuple(sorted(s.labels.items())), repr(s.value)) for f in fams for s in f.samples)
    return meta, samples


_fam_name = st.from_regex(r"[a-z][a-z0-9_:]{0,6}", fullmatch=True).filter(
    lambda n: not n.endswith(("_total", "_created", "_bucket", "_sum", "_count"))
)
_label_value = st.text(
    st.characters(codec="utf-8", exclude_characters="\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=6
)
_float = st.one_of(st.floats(allow_nan=False, width=64), st.sampled_from([math.inf, -math.inf]))


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def _exposition(draw):
    """Valid text as client libraries write it: gauges, counters (x_total), histograms, untyped, with
    undeclared samples and blank lines between families."""
    names = draw(st.lists(_fam_name, min_size=1, max_size=6, unique=True))
    lines = []
    for i, name in enumerate(names):
        typ = draw(st.sampled_from(["gauge", "counter", "histogram", "untyped"]))
        declared = name + "_total" if typ == "counter" else name
        if draw(st.booleans()):
            lines.append(f"# HELP {declared} help of {name}")
        lines.append(f"# TYPE {declared} {typ}")
        for j in range(draw(st.integers(1, 3))):
            lab = f'l="{_esc(draw(_label_value))}",j="{j}"'
            if typ == "histogram":
                for le in ("0.5", "+Inf"):
                    lines.append(f'{name}_bucket{{{lab},le="{le}"}} {draw(_float)!r}')
                lines.append(f"{name}_sum{{{lab}}} {draw(_float)!r}")
                lines.append(f"{name}_count{{{lab}}} {draw(_float)!r}")
            else:
                lines.append(f"{declared}{{{lab}}} {draw(_float)!r}")
        if draw(st.booleans()):
            lines.append(f"undeclared_{i} {draw(_float)!r}")
        if draw(st.booleans()):
            lines.append("")
    return "\n".join(lines) + "\n", names


@pytest.mark.slow  # hypothesis: hundreds of generated examples
@settings(max_examples=300, deadline=None)
@given(_exposition(), st.data())
def test_filtered_parse_equals_prometheus_client_on_generated_text(case, data):
    body, names = case
    kept = data.draw(st.sets(st.sampled_from(names + [f"undeclared_{i}" for i in range(len(names))])))
    assert _ours(body, kept.__contains__) == _reference(body, kept.__contains__)
    assert _ours(body) == _reference(body)


@pytest.fixture(scope="module")
def bodies():
    return real_bodies()


@pytest.mark.slow
def test_filtered_parse_equals_prometheus_client_on_the_benchmark_payloads(bodies):
    dp = relabel(bodies[20], 8, 2)
    assert _ours(dp, keep_family) == _reference(dp, keep_family)
    assert _ours(dp) == _reference(dp)
    large = big([bodies[20]])[0]
    assert _ours(large, keep_family) == _reference(large, keep_family)
