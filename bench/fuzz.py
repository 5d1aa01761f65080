"""The parser under fuzzing: ``python -m bench fuzz --cases N [--seed S]``.

Every case is a body built from ``(seed, case number)`` alone (``random.Random(f"{seed}:{i}")``), so a
run is deterministic and any one case can be rebuilt (``--case I``). A body is either a mutated real
vLLM ``/metrics`` capture (``tests/fixtures/``: a few consecutive families, or a whole capture; one in five
rendered as OpenMetrics, ``to_openmetrics``) or generated exposition text, then 0-4 mutations: truncation anywhere, byte flips, inserted junk,
NaN / +-Inf / huge / denormal / malformed values, escapes, duplicate labels, label values of up to
1 MiB, CRLF, a BOM, invalid UTF-8, OpenMetrics ``# EOF`` / ``# UNIT`` / exemplars, timestamps, and
line-level damage (duplicated, dropped, reordered lines, retyped families, renamed samples).

Each case goes to three parsers:

- kvwatch's (``kvwatch.parse.parse`` with ``engines.vllm.keep_family``, as ``kvwatch.app`` calls it);
- ``prometheus_client.parser.text_string_to_metric_families`` (the 0.0.4 text format: the reference);
- ``prometheus_client.openmetrics.parser.text_string_to_metric_families`` (OpenMetrics).

The invariants:

1. kvwatch raises nothing but ``ParseError``; anything else is a *crash*, and the input is saved.
2. Where kvwatch and the text parser both accept a body, the samples of the families kvwatch keeps are
   equal (``samples_key``: sample name, label set, value with NaN == NaN and -0 == 0, timestamp).
3. Every other disagreement with the text parser is *stricter* (kvwatch rejects what it accepts),
   *laxer* (kvwatch accepts what it rejects) or *different samples*, and is *explained* by one of the
   deliberate differences of ``EXPLANATIONS`` (each checked mechanically, not by pattern), else it is
   *unexplained* and counted as a failure.
4. The pipeline: every ``PIPELINE_EVERY``-th case is a whole real capture mutated, fed to a
   ``kvwatch.state.Target`` after two clean captures of the same run, diagnosed, rendered by kvwatch's
   own collector and as the JSON API's document (strict JSON), then a clean capture after it: nothing
   but the scrape's own errors (``ParseError``, ``NoEngineMetrics``, a body that is not UTF-8) may escape.

The OpenMetrics parser is a second opinion, not the reference: vLLM serves the 0.0.4 text format to
kvwatch (which asks for it in ``Accept``), and OpenMetrics differs on purpose (``# EOF``, timestamps
in seconds, counters' ``_total``). Its verdicts are counted (``om_*``), and where both accept an
OpenMetrics body (one ending in ``# EOF``) and their samples differ without a reason in
``OM_EXPLANATIONS``, that counts as unexplained too.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics import parser as om_parser
from prometheus_client.parser import _split_quoted, text_string_to_metric_families

from kvwatch.engines.vllm import KEEP_FAMILIES, keep_family
from kvwatch.export import KvwatchCollector
from kvwatch.parse import _NAME as _METRIC_NAME
from kvwatch.parse import ParseError, parse
from kvwatch.state import NoEngineMetrics, Target

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
CAPTURES = ("vllm-0.32.0-cpu", "vllm-old")  # the real captures (tests/fixtures/fuzz holds the findings)
PIPELINE_EVERY = 32
HUGE = 1 << 20  # the largest label value a case carries (1 MiB)

__all__ = ["Case", "make_case", "judge", "run", "samples_key"]


# ------------------------------------------------------------------------------------------ corpus

_CORPUS: list[tuple[str, list[str]]] | None = None  # (folder, bodies in time order) per capture run


def corpus() -> list[tuple[str, list[str]]]:
    """Every real vLLM capture under tests/fixtures, per run (folder), in time order."""
    global _CORPUS
    if _CORPUS is None:
        from kvwatch.recording import recording_files

        runs = []
        for release in CAPTURES:
            for folder in sorted({p.parent for p in (FIXTURES / release).glob("*/*.prom")}):
                bodies = [p.read_text() for _, p in recording_files(folder)]
                if bodies:
                    runs.append((str(folder.relative_to(FIXTURES)), bodies))
        if not runs:
            raise SystemExit(f"bench fuzz: no captures under {FIXTURES}")
        _CORPUS = runs
    return _CORPUS


def _blocks(body: str) -> list[str]:
    """A body's family blocks (its comment lines and the sample lines after them), each ending in a newline."""
    out: list[list[str]] = []
    prev_sample = True
    for line in body.splitlines():
        is_comment = line.startswith("#")
        if not out or (is_comment and prev_sample):
            out.append([])
        out[-1].append(line)
        prev_sample = not is_comment
    return ["\n".join(b) + "\n" for b in out]


_BLOCK_CACHE: dict[tuple[int, int], list[str]] = {}


def _capture_blocks(run: int, k: int) -> list[str]:
    key = (run, k)
    if key not in _BLOCK_CACHE:
        _BLOCK_CACHE[key] = _blocks(corpus()[run][1][k])
    return _BLOCK_CACHE[key]


def to_openmetrics(body: str) -> str:
    """A 0.0.4 capture as an OpenMetrics exposition of the same samples: a counter family is declared without
    ``_total`` (its samples keep it), the separate ``_created`` gauges of 0.0.4 go, and ``# EOF`` ends it."""
    out: list[str] = []
    for block in _blocks(body):
        lines = block.rstrip("\n").split("\n")
        decl = next((ln.split() for ln in lines if ln.startswith("# TYPE ")), [])
        if len(decl) > 3:
            name, typ = decl[2], decl[3]
            if typ == "gauge" and name.endswith("_created"):
                continue
            if typ == "counter" and name.endswith("_total"):
                pat = re.compile(r"^# (HELP|TYPE) " + re.escape(name) + r"(?= |$)")
                lines = [pat.sub(rf"# \1 {name[:-6]}", ln) for ln in lines]  # a metric name has no backslash
        out += lines
    return "\n".join(out) + "\n# EOF\n"


# --------------------------------------------------------------------------------------- generated

_KEPT = sorted(KEEP_FAMILIES)
_OTHER = ["app_requests", "process_cpu_seconds", "a", "b_c", "vllm:unused", "ray_vllm:num_requests_running", "x:y_z"]
_TYPES = ["gauge", "counter", "histogram", "summary", "untyped"]
_HELPS = ["", "help", "a \\\\ b \\n c", 'q \\" r', "é ☃", "trailing \\"]
_CHARS = 'abcXYZ019 _-.:/,={}#"\\\n\té☃\u2028\x85\x1c\x00\U0001f600'


def _gen_value(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.15:
        return rng.choice(_SPECIAL_VALUES)
    if r < 0.5:
        return str(rng.randint(0, 10 ** rng.randint(0, 12)))
    if r < 0.8:
        return repr(rng.uniform(-1, 1) * 10 ** rng.randint(-12, 12))
    return repr(float(rng.randint(0, 100)))


def _gen_label_value(rng: random.Random) -> str:
    raw = "".join(rng.choice(_CHARS) for _ in range(rng.randint(0, 8)))
    return raw.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gen_labels(rng: random.Random, extra: str = "") -> str:
    names = rng.sample(
        ["engine", "model_name", "l", "source", "reason", "a_b", "running_lora_adapters"], rng.randint(0, 3)
    )
    pairs = [f'{n}="{_gen_label_value(rng)}"' for n in names]
    if extra:
        pairs.append(extra)
    return "{" + ",".join(pairs) + "}" if pairs else ""


def _gen_family(rng: random.Random) -> list[str]:
    name = rng.choice(_KEPT) if rng.random() < 0.6 else rng.choice(_OTHER)
    typ = rng.choice(_TYPES)
    base = name.removesuffix("_total")
    declared = base + "_total" if typ == "counter" and rng.random() < 0.8 else base
    lines = []
    if rng.random() < 0.7:
        lines.append(f"# HELP {declared} {rng.choice(_HELPS)}")
    if rng.random() < 0.9:
        lines.append(f"# TYPE {declared} {typ}")
    for _ in range(rng.randint(1, 4)):
        lab = _gen_labels(rng)
        if typ == "histogram":
            inner = lab[1:-1]
            for le in ("0.5", "1.0", "+Inf"):
                sep = "," if inner else ""
                lines.append(f'{base}_bucket{{{inner}{sep}le="{le}"}} {_gen_value(rng)}')
            lines.append(f"{base}_sum{lab} {_gen_value(rng)}")
            lines.append(f"{base}_count{lab} {_gen_value(rng)}")
        elif typ == "summary":
            inner = lab[1:-1]
            sep = "," if inner else ""
            lines.append(f'{base}{{{inner}{sep}quantile="0.5"}} {_gen_value(rng)}')
            lines.append(f"{base}_sum{lab} {_gen_value(rng)}")
            lines.append(f"{base}_count{lab} {_gen_value(rng)}")
        else:
            lines.append(f"{declared}{lab} {_gen_value(rng)}")
    if rng.random() < 0.2:
        lines.append(f"{rng.choice(_KEPT + _OTHER)}{_gen_labels(rng)} {_gen_value(rng)}")  # undeclared
    if rng.random() < 0.2:
        lines.append("")
    return lines


def generated(rng: random.Random) -> str:
    """Exposition text as a client library might write it (and a little worse)."""
    lines: list[str] = []
    for _ in range(rng.randint(1, 6)):
        lines += _gen_family(rng)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------- mutations

# fmt: off
_SPECIAL_VALUES = [
    "NaN", "nan", "+NaN", "-nan", "+Inf", "-Inf", "Inf", "inf", "+inf", "Infinity", "-infinity", "INF",
    "1e308", "1.7976931348623157e308", "1e309", "-1e400", "5e-324", "4.9e-324", "1e-320", "2.2250738585072014e-308",
    "-0", "-0.0", "0", "0x1p3", "0x10", "1_000", "1e", ".", "+", "-", "1.5e+", "00001", ".5", "5.", "1E+05",
    "9007199254740993", "1" + "0" * 400, "١٢", "１", "1.0.1", "1,5", "+-1", "0b1", "1e-400", "−1",
]
_TIMESTAMPS = [
    "1700000000000", "-1", "0", "1.5", "1e3", "9223372036854775807", "9223372036854775808", "1_0", "NaN",
    "x", "1700000000000 1", "+Inf", "00017", "1796120533326", "123456789012345678901234567890",
]
_JUNK = [
    "{", "}", '"', "\\", "#", "\n", " ", "\t", "=", ",", "\r", "\x00", "# TYPE ", "# HELP ", " NaN", 'le="', "\ufeff",
    "\x85", "\u2028", "\x1c", "\x0b", "\x0c", " # {a=\"b\"} 1", "}}", "{{", "\\\"", "# EOF\n", "\n\n", "_total",
]
_ESCAPES = ["\\\\", '\\"', "\\n", "\\t", "\\x", "\\u00e9", "\\", "\n", '"', "é", "\\\\\\", "}", "{", ",", "=", "\r"]
_INVALID_UTF8 = [b"\xff", b"\xfe", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"\xe2\x82", b"\x80"]
_NEW_TYPES = ["gauge", "counter", "histogram", "summary", "untyped", "info", "stateset", "gaugehistogram", "unknown",
              "wibble", "", "Gauge", "counter counter"]
# fmt: on


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _sample_line_indexes(lines: list[str], kept_first: bool, rng: random.Random) -> list[int]:
    idx = [i for i, ln in enumerate(lines) if ln and not ln.startswith("#")]
    if kept_first and idx and rng.random() < 0.7:
        kept = [i for i in idx if lines[i].startswith(("vllm:", "ray_vllm:"))]
        return kept or idx
    return idx


def m_truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randint(0, len(data))] if data else data


def m_flip(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return data
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def m_junk(rng: random.Random, data: bytes) -> bytes:
    for _ in range(rng.randint(1, 4)):
        pos = rng.randint(0, len(data))
        piece = rng.randbytes(rng.randint(1, 6)) if rng.random() < 0.25 else rng.choice(_JUNK).encode()
        data = data[:pos] + piece + data[pos:]
    return data


def m_invalid_utf8(rng: random.Random, data: bytes) -> bytes:
    pos = rng.randint(0, len(data))
    return data[:pos] + rng.choice(_INVALID_UTF8) + data[pos:]


def m_bom(rng: random.Random, data: bytes) -> bytes:
    if rng.random() < 0.7:
        return b"\xef\xbb\xbf" + data
    nl = [i + 1 for i, c in enumerate(data) if c == 10]
    pos = rng.choice(nl) if nl else 0
    return data[:pos] + b"\xef\xbb\xbf" + data[pos:]


def m_crlf(rng: random.Random, text: str) -> str:
    if rng.random() < 0.5:
        return text.replace("\n", "\r\n")
    lines = _lines(text)
    return "\n".join(ln + "\r" if rng.random() < 0.3 else ln for ln in lines)


def _replace_token(line: str, rng: random.Random, which: str, new: str) -> str:
    """The line with its value (which="value") replaced, or a timestamp appended."""
    close = line.rfind("}")
    head, tail = (line[: close + 1], line[close + 1 :]) if close >= 0 else ("", line)
    parts = tail.split(" ")
    if close < 0:
        head, parts = parts[0], parts[1:]
    if not parts:
        return line
    if which == "value":
        parts[-1 if len(parts) == 1 else 1 if parts[0] == "" else 0] = new
    else:
        parts.append(new)
    return head + " ".join(parts) if close >= 0 else head + " " + " ".join(parts)


def m_value(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    idx = _sample_line_indexes(lines, True, rng)
    for i in rng.sample(idx, min(len(idx), rng.randint(1, 3))):
        lines[i] = _replace_token(lines[i], rng, "value", rng.choice(_SPECIAL_VALUES))
    return "\n".join(lines)


def m_timestamp(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    idx = _sample_line_indexes(lines, True, rng)
    for i in rng.sample(idx, min(len(idx), rng.randint(1, 4))):
        lines[i] = _replace_token(lines[i], rng, "ts", rng.choice(_TIMESTAMPS))
    return "\n".join(lines)


def _with_labels(lines: list[str], rng: random.Random) -> list[int]:
    idx = [i for i in _sample_line_indexes(lines, True, rng) if '="' in lines[i]]
    return idx or [i for i in _sample_line_indexes(lines, False, rng) if '="' in lines[i]]


def m_escape(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    idx = _with_labels(lines, rng)
    for i in rng.sample(idx, min(len(idx), rng.randint(1, 2))):
        ln = lines[i]
        q = [k for k, c in enumerate(ln) if c == '"']
        if q:
            k = rng.choice(q)
            lines[i] = ln[:k] + rng.choice(_ESCAPES) + ln[k:]
    return "\n".join(lines)


def m_duplicate_label(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    idx = _with_labels(lines, rng)
    if idx:
        i = rng.choice(idx)
        ln = lines[i]
        brace, close = ln.find("{"), ln.rfind("}")
        if 0 <= brace < close:
            pairs = ln[brace + 1 : close].rstrip(",").split('",')
            pair = rng.choice(pairs)
            pair = pair if pair.endswith('"') else pair + '"'
            if rng.random() < 0.5:
                pair = pair.split("=", 1)[0] + '="other"'
            lines[i] = ln[: brace + 1] + pair + "," + ln[brace + 1 :]
    return "\n".join(lines)


def m_huge_label(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    idx = _with_labels(lines, rng) or _sample_line_indexes(lines, True, rng)
    if not idx:
        return text
    i = rng.choice(idx)
    size = HUGE if rng.random() < 0.05 else rng.randint(1000, 65536)
    value = rng.choice("abcxyz") * size
    if rng.random() < 0.3:  # a few escapes in it
        for _ in range(8):
            k = rng.randrange(len(value))
            value = value[:k] + rng.choice(["\\\\", '\\"', "\\n"]) + value[k:]
    ln = lines[i]
    brace = ln.find("{")
    if brace >= 0:
        lines[i] = ln[: brace + 1] + f'huge="{value}",' + ln[brace + 1 :]
    else:
        name, _, rest = ln.partition(" ")
        lines[i] = f'{name}{{huge="{value}"}} {rest}'
    return "\n".join(lines)


def m_openmetrics(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    r = rng.random()
    if r < 0.4:  # an OpenMetrics body: # EOF at the end (and # UNIT lines)
        while lines and lines[-1] == "":
            lines.pop()
        lines.append("# EOF")
        lines.append("")
        if rng.random() < 0.5:
            types = [i for i, ln in enumerate(lines) if ln.startswith("# TYPE ")]
            for i in sorted(rng.sample(types, min(len(types), 2)), reverse=True):
                name = (lines[i].split() + ["", "", ""])[2]
                lines.insert(i + 1, f"# UNIT {name} {rng.choice(['seconds', 'bytes', 'tokens', ''])}")
    elif r < 0.6:
        pos = rng.randint(0, len(lines))
        lines.insert(pos, "# EOF")
    elif r < 0.8:
        idx = _sample_line_indexes(lines, True, rng)
        if idx:
            i = rng.choice(idx)
            lines[i] += rng.choice([' # {trace_id="abc"} 1.0', ' # {trace_id="abc"} 1.0 1700000000.5', " # {} 2"])
    else:
        types = [i for i, ln in enumerate(lines) if ln.startswith("# TYPE ")]
        if types:
            i = rng.choice(types)
            lines.insert(i + 1, f"# UNIT {(lines[i].split() + ['', '', ''])[2]} seconds")
    return "\n".join(lines)


def m_lines(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    if len(lines) < 2:
        return text
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    r = rng.random()
    if r < 0.3:
        lines.insert(j, lines[i])  # duplicated (a repeated series, a second TYPE or HELP)
    elif r < 0.55:
        del lines[i]
    elif r < 0.8:
        lines[i], lines[j] = lines[j], lines[i]  # reordered (a TYPE after its samples, a sample elsewhere)
    else:
        lines.insert(
            j, rng.choice(["", " ", "\t", "#", "# ", "# HELP", "# TYPE x", "#TYPE x gauge", "# plain comment"])
        )
    return "\n".join(lines)


def m_type(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    types = [i for i, ln in enumerate(lines) if ln.startswith("# TYPE ")]
    if types:
        i = rng.choice(types)
        parts = lines[i].split(" ")
        lines[i] = " ".join(parts[:3] + [rng.choice(_NEW_TYPES)])
    return "\n".join(lines)


def m_name(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    idx = [i for i, ln in enumerate(lines) if ln and (not ln.startswith("#") or ln.startswith(("# TYPE ", "# HELP ")))]
    if not idx:
        return text
    i = rng.choice(idx)
    ln = lines[i]
    start = 7 if ln.startswith("#") else 0
    end = start
    while end < len(ln) and ln[end] not in " {\t":
        end += 1
    name = ln[start:end]
    new = rng.choice(
        [
            name + rng.choice(["_total", "_bucket", "_sum", "_count", "_created", "_info", "x"]),
            name.removesuffix("_total"),
            "1" + name,
            name + "-x",
            name + "é",
            name.replace(":", "."),
            "",
            name.upper(),
            rng.choice(_KEPT),
            '"' + name + '"',
            name[: len(name) // 2],
        ]
    )
    lines[i] = ln[:start] + new + ln[end:]
    return "\n".join(lines)


def m_space(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        ln = lines[i]
        if not ln:
            continue
        pos = rng.randint(0, len(ln))
        lines[i] = ln[:pos] + rng.choice([" ", "\t", "  ", " \t ", "\u00a0", "\u3000"]) + ln[pos:]
    return "\n".join(lines)


def m_label_syntax(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    idx = _with_labels(lines, rng)
    if not idx:
        return text
    i = rng.choice(idx)
    ln = lines[i]
    r = rng.random()
    if r < 0.2:
        ln = ln.replace(",", "", 1)
    elif r < 0.4:
        ln = ln.replace("}", ",}", 1)
    elif r < 0.55:
        ln = ln.replace('"', "", 1)
    elif r < 0.7:
        ln = ln.replace("=", " = ", 1)
    elif r < 0.85:
        brace = ln.find("{")
        ln = (
            ln[: brace + 1]
            + rng.choice(['1x="a",', 'é="a",', '__name__="n",', ",", '="a",', '"q"="a",'])
            + ln[brace + 1 :]
        )
    else:
        ln = ln.replace("{", "{}", 1)
    lines[i] = ln
    return "\n".join(lines)


# fmt: off
_BYTE_MUTATORS: dict[str, Callable[[random.Random, bytes], bytes]] = {
    "truncate": m_truncate, "flip": m_flip, "junk": m_junk, "invalid_utf8": m_invalid_utf8, "bom": m_bom,
}
_TEXT_MUTATORS: dict[str, Callable[[random.Random, str], str]] = {
    "crlf": m_crlf, "value": m_value, "timestamp": m_timestamp, "escape": m_escape,
    "duplicate_label": m_duplicate_label, "huge_label": m_huge_label, "openmetrics": m_openmetrics,
    "lines": m_lines, "type": m_type, "name": m_name, "space": m_space, "label_syntax": m_label_syntax,
}
# (name, weight): truncation, values and lines most often; the costly 1 MiB values least.
_WEIGHTS = [
    ("truncate", 8), ("flip", 5), ("junk", 6), ("invalid_utf8", 2), ("bom", 1), ("crlf", 3), ("value", 10),
    ("timestamp", 5), ("escape", 6), ("duplicate_label", 3), ("huge_label", 1), ("openmetrics", 4),
    ("lines", 8), ("type", 3), ("name", 4), ("space", 4), ("label_syntax", 5),
]
# fmt: on
_NAMES = [n for n, _ in _WEIGHTS]
_W = [w for _, w in _WEIGHTS]


def mutate(rng: random.Random, data: bytes, ops: list[str], pipeline: bool = False) -> bytes:
    for _ in range(rng.choices([0, 1, 2, 3, 4], [1, 4, 3, 2, 1])[0]):
        op = rng.choices(_NAMES, _W)[0]
        if pipeline and op in ("truncate", "flip", "junk", "invalid_utf8") and rng.random() < 0.7:
            op = rng.choice(["value", "value", "timestamp", "duplicate_label", "lines", "escape"])
        ops.append(op)
        if op in _BYTE_MUTATORS:
            data = _BYTE_MUTATORS[op](rng, data)
        else:
            text = data.decode("utf-8", "surrogateescape")
            data = _TEXT_MUTATORS[op](rng, text).encode("utf-8", "surrogateescape")
    return data


# ------------------------------------------------------------------------------------------- cases


class Case:
    __slots__ = ("seed", "index", "data", "base", "ops", "prev")

    def __init__(self, seed: int, index: int, data: bytes, base: str, ops: list[str], prev: list[str]):
        self.seed, self.index, self.data, self.base, self.ops, self.prev = seed, index, data, base, ops, prev

    @property
    def pipeline(self) -> bool:
        return bool(self.prev)

    def text(self) -> str:
        """What a parser is given: the body decoded as kvwatch's replay reads files (invalid bytes become
        U+FFFD), or, on odd cases, with the invalid bytes as lone surrogates (a str no decoder makes, but a str)."""
        return self.data.decode("utf-8", "replace" if self.index % 2 == 0 else "surrogateescape")


def make_case(seed: int, index: int) -> Case:
    """Case ``index`` of the run with ``seed``: the same bytes on every machine and every run."""
    rng = random.Random(f"{seed}:{index}")
    runs = corpus()
    ops: list[str] = []
    prev: list[str] = []
    pipeline = index % PIPELINE_EVERY == 0
    r = rng.random()
    if pipeline or r < 0.02:  # whole captures are 10x a slice's cost: pipeline cases and 2 % of the rest
        run = rng.randrange(len(runs))
        bodies = runs[run][1]
        k = rng.randrange(len(bodies))
        text = bodies[k]
        base = f"{runs[run][0]}[{k}]"
        if pipeline:
            prev = [bodies[(k + j) % len(bodies)] for j in (-2, -1, 1)]
    elif r < 0.62:
        run = rng.randrange(len(runs))
        k = rng.randrange(len(runs[run][1]))
        blocks = _capture_blocks(run, k)
        kept = [i for i, b in enumerate(blocks) if b.startswith(("# HELP vllm:", "# HELP ray_vllm:"))]
        start = rng.choice(kept) if kept and rng.random() < 0.6 else rng.randrange(len(blocks))
        n = rng.randint(1, 6)
        text = "".join(blocks[start : start + n])
        base = f"{runs[run][0]}[{k}] families {start}..{start + n - 1}"
    else:
        text = generated(rng)
        base = "generated"
    if base != "generated" and rng.random() < 0.2:
        text = to_openmetrics(text)
        base += " as OpenMetrics"
    data = mutate(rng, text.encode(), ops, pipeline)
    return Case(seed, index, data, base, ops, prev)


# ----------------------------------------------------------------------------------------- judging


def _canon(v) -> object:
    if v is None:
        return None
    try:
        f = float(v)
    except OverflowError:  # prometheus_client reads integers exactly: 10**400 is +Inf as a float
        f = math.inf if v > 0 else -math.inf
    return "NaN" if math.isnan(f) else f + 0.0  # NaN == NaN; -0.0 == 0.0


def samples_key(families) -> list[tuple]:
    """The samples as a sorted list of (name, sorted labels, value, timestamp): the equality of the fuzz."""
    out = []
    for f in families:
        for s in f.samples:
            out.append((s.name, tuple(sorted(s.labels.items())), _canon(s.value), _canon(s.timestamp)))
    out.sort(key=repr)
    return out


def ours(text: str):
    """("ok", samples) or ("reject", ParseError); any other exception propagates (a crash)."""
    try:
        fams = parse(text, keep_family)
    except ParseError as e:
        return "reject", e
    return "ok", samples_key(fams.values())


def reference(text: str, om: bool = False):
    """prometheus_client's verdict: ("ok", samples of the families kvwatch keeps) or ("reject", exception).
    Whatever it raises counts as a rejection (it raises ValueError mostly, sometimes other types)."""
    fn = om_parser.text_string_to_metric_families if om else text_string_to_metric_families
    try:
        fams = [f for f in fn(text) if keep_family(f.name)]
    except Exception as e:  # noqa: BLE001 - the reference's verdict, whatever its type
        return "reject", e
    return "ok", samples_key(fams)


def judge(text: str) -> dict:
    """One body through the three parsers: the verdicts, the class of disagreement and its explanation."""
    mine = ours(text)
    ref = reference(text)
    om = reference(text, om=True)
    out = {"ours": mine[0], "ref": ref[0], "om": om[0], "class": None, "why": None}
    if mine[0] == "ok" and ref[0] == "ok":
        if mine[1] != ref[1]:
            out["class"] = "different"
    elif mine[0] == "reject" and ref[0] == "ok":
        out["class"] = "stricter"
    elif mine[0] == "ok" and ref[0] == "reject":
        out["class"] = "laxer"
    if out["class"]:
        out["why"] = explain(text, out["class"], mine, ref)
    if mine[0] == "ok" and om[0] == "ok" and mine[1] != om[1]:
        out["om_class"] = "different"
        out["om_why"] = explain_om(text, mine, om)
    return out


# Each deliberate difference from prometheus_client's text parser, and the check that proves a case is it.
EXPLANATIONS = {
    "no_final_newline": "stricter: the body does not end with a newline. The format says the last line must end "
    "with one; a body cut off mid-line would otherwise read as a smaller number (prometheus_client reads it).",
    "extra_tokens": "stricter: a sample line has more than a value and a timestamp after its name and labels "
    "(e.g. an OpenMetrics exemplar); prometheus_client takes the first token as the value and the last as the "
    "timestamp.",
    "invalid_metric_name": "stricter: a metric name that is not [a-zA-Z_:][a-zA-Z0-9_:]* (in a sample, HELP or TYPE "
    "line); prometheus_client does not check the name of a sample with labels, and reads quoted UTF-8 names "
    "(a newer format than the 0.0.4 vLLM serves).",
    "quoted_label_name": 'stricter: a quoted label name ({"a.b"="c"}), the UTF-8 names of a newer format '
    "than the 0.0.4 vLLM serves.",
    "invalid_label_name": "stricter: a label name that is not [a-zA-Z_][a-zA-Z0-9_]* (e.g. a:b); prometheus_client "
    "reads the UTF-8 label names of a newer format than the 0.0.4 vLLM serves.",
    "leading_comma": 'stricter: a label set that starts with a comma ({,a="b"}); the format allows a trailing '
    "comma only.",
    "non_blank_whitespace": "stricter (or laxer): tokens separated (or lines indented) by whitespace other than blanks and tabs "
    "(\\r, \\v, \\f, U+0085, U+3000, ...); prometheus_client splits on any ASCII whitespace and strips any Unicode "
    "whitespace from a line's ends.",
    "no_value": "stricter: a line that is one token (a name, no value): prometheus_client reads `Infinity` as the "
    "sample Infinit with value +Inf (it takes all but the last character as the name, and the whole line as the "
    "value).",
    "non_ascii_number": "stricter: a value or timestamp in digits other than ASCII (١٢, １): Python's float() reads "
    "them, Go's ParseFloat (the format's definition of a value) does not.",
    "unknown_type": "stricter: a TYPE line whose type is not one of the format's words (counter, gauge, histogram, "
    "summary, untyped; kvwatch also knows OpenMetrics' info, stateset, gaugehistogram, unknown); prometheus_client "
    "checks only the last TYPE line of a name.",
    "hash_glued_to_keyword": 'laxer (or different): a "#x TYPE ..." line: HELP and TYPE count only as the first '
    'token after "# ", so kvwatch reads it as a plain comment; prometheus_client as a TYPE (or HELP) line, and '
    "refuses the body when that line is malformed.",
    "skipped_family": "laxer: the only malformed lines are in families kvwatch does not read (keep_family), "
    "which it passes over unparsed; unfiltered, kvwatch rejects the body too.",
    "family_grouping": "different: the same samples, grouped into other families: kvwatch groups a declared "
    "family's samples by the suffixes its type has in OpenMetrics (counter x: x_total, x_created; histogram: "
    "_bucket, _sum, _count, _created; ...), prometheus_client's 0.0.4 parser makes each unexpected name an "
    "untyped family of its own (and the samples after it too); of every sample named like a kept family's, both "
    "read the same ones.",
    "counter_total_added": "different: a counter declared without _total (# TYPE x counter, samples x): "
    "prometheus_client renames its samples x_total (its OpenMetrics model; every sample of the family, x_sum too "
    "when a second TYPE line retypes a summary); kvwatch keeps the names written, as Prometheus does.",
}


def _unfiltered(text: str) -> ParseError | None:
    try:
        parse(text)
    except ParseError as e:
        return e
    return None


def _line(text: str, lineno: int) -> str:
    lines = text.split("\n")
    return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


def _after_labels(line: str) -> str | None:
    """What follows a sample's name and label set (the closing brace found outside quotes), or None."""
    line = line.strip(" \t")
    brace = line.find("{")
    if brace < 0:
        name_end = min((k for k in (line.find(" "), line.find("\t")) if k >= 0), default=-1)
        return None if name_end < 0 else line[name_end:]
    quoted = escaped = False
    for k in range(brace + 1, len(line)):
        c = line[k]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = quoted
        elif c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return line[k + 1 :]
    return None


def _name_token(line: str) -> str:
    """The metric name of a sample, HELP or TYPE line as prometheus_client reads it (a sample's: the text
    before its first '{', stripped, else its first token)."""
    line = line.strip(" \t")
    if line.startswith("#"):
        parts = re.split(r"[ \t]+", line, maxsplit=3)
        return parts[2] if len(parts) > 2 else ""
    if "{" in line:
        return line.split("{", 1)[0].strip()
    return re.split(r"[ \t]", line, maxsplit=1)[0]


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_PAIR = re.compile(r'([^=",{}]*)=[ \t]*"(?:[^"\\]|\\.)*"[ \t]*,?')


def _label_names(line: str) -> list[str]:
    """The label names of a sample line's label set (unquoted ones), as written."""
    brace = line.find("{")
    return [] if brace < 0 else _PAIR.findall(line, brace + 1)


_SPEC_TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
_NON_BLANK_SPACE = re.compile(r"[^\S \t\n]")


def _type_token(line: str) -> str:
    """The type a TYPE line gives: everything after its name (\"counter counter\" is no type)."""
    parts = re.split(r"[ \t]+", line.strip(" \t"), maxsplit=3)
    return parts[3] if len(parts) > 3 and parts[1] == "TYPE" else ""


def _python_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _stricter_why(text: str, err: ParseError) -> str | None:
    msg = str(err)
    line = _line(text, err.line)
    if text and not text.endswith("\n") and "does not end with a newline" in msg:
        return "no_final_newline"
    if _NON_BLANK_SPACE.search(line):
        lines = text.split("\n")
        lines[err.line - 1] = _NON_BLANK_SPACE.sub(" ", line)  # this line, not an equal one before it
        fixed = "\n".join(lines)
        again = ours(fixed)
        if again[0] == "ok" or again[1].line > err.line:
            return "non_blank_whitespace"
        if again[1].line == err.line and not _NON_BLANK_SPACE.search(_line(fixed, err.line)):
            return _stricter_why(fixed, again[1])  # the line has a second reason too
    if "expected a value and an optional timestamp" in msg:
        rest = _after_labels(line)
        tokens = [] if rest is None else [t for t in re.split(r"[ \t]+", rest) if t]
        if len(tokens) > 2:
            return "extra_tokens"
        if not tokens and "{" not in line:
            return "no_value"
    if not _METRIC_NAME.fullmatch(_name_token(line)):
        return "invalid_metric_name"
    if re.search(r'[{,][ \t]*"[^"]*"[ \t]*=', line):
        return "quoted_label_name"
    if "bad label set" in msg and any(not _LABEL_NAME.fullmatch(n.strip(" \t")) for n in _label_names(line)):
        return "invalid_label_name"
    if "bad label set {" in msg and line[line.find("{") + 1 :].lstrip(" \t").startswith(","):
        return "leading_comma"
    m = re.search(r"bad value '(.*)'$", msg)
    if m and not m.group(1).isascii() and _python_float(m.group(1)):
        return "non_ascii_number"
    if "unknown type" in msg and _type_token(line) not in _SPEC_TYPES:
        return "unknown_type"
    return None


_GLUED = re.compile(r"^[ \t]*#[^ \t\n]+[ \t]+(?:HELP|TYPE)[ \t][^\n]*\n?", re.M)


def _ref_view(text: str, keep: Callable[[str], bool] | None = None) -> list[tuple] | None:
    """prometheus_client's samples (of the families ``keep`` keeps) under the names the body gives them: its
    renaming of a counter declared without _total (# TYPE x counter: samples x -> x_total, and with a second TYPE
    line retyping a summary, x_sum -> x_sum_total too) undone. None if it rejects the body."""
    try:
        fams = list(text_string_to_metric_families(text))
    except Exception:  # noqa: BLE001 - the reference's verdict, whatever its type
        return None
    decls = _counter_declarations(text)
    out = []
    for f in fams:
        renamed = False
        if f.type == "counter":  # the declaration that made this family, in body order
            k = next((i for i, d in enumerate(decls) if d in (f.name, f.name + "_total")), None)
            renamed = k is not None and decls.pop(k) == f.name
        if keep is not None and not keep(f.name):
            continue
        for smp in f.samples:
            name = smp.name[:-6] if renamed and smp.name.endswith("_total") else smp.name
            out.append((name, tuple(sorted(smp.labels.items())), _canon(smp.value), _canon(smp.timestamp)))
    out.sort(key=repr)
    return out


def _counter_declarations(text: str) -> list[str]:
    """The names of the body's counter TYPE lines, in order, tokenised as prometheus_client does."""
    out = []
    for line in text.split("\n"):
        line = line.strip()
        if line.startswith("#") and "TYPE" in line:
            parts = _split_quoted(line, None, 3)
            if len(parts) == 4 and parts[1] == "TYPE" and parts[3] == "counter":
                out.append(parts[2].strip('"'))
    return out


def _broad_view(text: str, mine) -> tuple[str, list[tuple]] | None:
    """kvwatch's samples named like a kept family's, from every family that could hold one (``_broad_keep``).
    Lines of those families that kvwatch's real (narrower) parse never reads may be malformed: up to five such
    lines are dropped, as long as kvwatch's real result stays the same without them. (body, samples) or None."""
    body = text
    for _ in range(6):
        try:
            return body, _by_name(samples_key(parse(body, _broad_keep).values()))
        except ParseError as e:
            lines = body.split("\n")
            del lines[e.line - 1]
            body = "\n".join(lines)
            if ours(body) != mine:
                return None
    return None


def _why_different(text: str, mine, ref) -> str | None:
    """Which deliberate difference makes the samples differ, tried on the reference's view of the body as it
    is and without the "#x TYPE" lines it reads as TYPE lines (kvwatch reads them as comments)."""
    for why, body in [("", text), ("hash_glued_to_keyword", _GLUED.sub("", text))]:
        if why and body == text:
            continue
        if _ref_view(body, keep_family) == mine[1]:
            return why or "counter_total_added"
        broad = _broad_view(body, mine)
        theirs = None if broad is None else _ref_view(broad[0])
        if broad is not None and theirs is not None and broad[1] == _by_name(theirs):
            return why or "family_grouping"
    return None


_MEMBER_SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count", "_info")


def _kept_name(name: str) -> bool:
    """A kept family's name, or that name with a member suffix."""
    return keep_family(name) or any(name.endswith(x) and keep_family(name[: -len(x)]) for x in _MEMBER_SUFFIXES)


def _broad_keep(family: str) -> bool:
    """Every family that could hold a sample named like a kept family's (x_total's family is x)."""
    return _kept_name(family) or any(_kept_name(family + x) for x in _MEMBER_SUFFIXES)


def _by_name(samples: list[tuple]) -> list[tuple]:
    """The samples named like a kept family's: the same set, whichever family a parser filed each one under."""
    return [s for s in samples if _kept_name(s[0])]


def explain(text: str, cls: str, mine, ref) -> str | None:
    """The name of the deliberate difference this case is (EXPLANATIONS), or None: unexplained."""
    if cls == "stricter":
        return _stricter_why(text, mine[1])
    if cls == "laxer":
        if _unfiltered(text) is not None:
            return "skipped_family"
        spaced = _NON_BLANK_SPACE.sub(" ", text)
        again = ours(spaced)
        if spaced != text and again[0] == "reject" and _NON_BLANK_SPACE.search(_line(text, again[1].line)):
            return "non_blank_whitespace"  # read with those characters as blanks, kvwatch rejects the line too
        glued = _GLUED.sub("", text)
        return "hash_glued_to_keyword" if glued != text and reference(glued)[0] == "ok" else None
    return _why_different(text, mine, ref)


OM_EXPLANATIONS = {
    "om_duplicate_series": "a series repeated in one body (invalid in both formats): the OpenMetrics parser keeps "
    "the first, kvwatch keeps every one, as prometheus_client's text parser does.",
    "om_timestamp_seconds": "OpenMetrics timestamps are seconds, 0.0.4 text timestamps milliseconds: kvwatch reads "
    "the 0.0.4 format it asks vLLM for.",
    "om_no_space_before_value": 'a value right after the label set (x{a="b"}12): the text format allows it, '
    "OpenMetrics wants one space, and prometheus_client's OpenMetrics parser drops the value's first character.",
    "om_hash_glued_to_keyword": 'a "#x TYPE ..." line (e.g. # and U+3000): kvwatch reads it as a comment, the '
    "OpenMetrics parser as a TYPE (or HELP) line.",
}


def _first_of_each_series(samples: list[tuple]) -> list[tuple]:
    seen, out = set(), []
    for s in samples:
        if s[:2] not in seen:
            seen.add(s[:2])
            out.append(s)
    return out


def _same_but_ts_unit(ours_: list[tuple], om_: list[tuple]) -> bool:
    """Equal when kvwatch's timestamps (text: ms / 1000) are read as OpenMetrics seconds (x 1000)."""
    if len(ours_) != len(om_):
        return False
    a = sorted(ours_, key=lambda s: repr(s[:3]))
    b = sorted(om_, key=lambda s: repr(s[:3]))
    for x, y in zip(a, b, strict=True):
        if x[:3] != y[:3] or (x[3] is None) != (y[3] is None):
            return False
        if x[3] is not None and not (x[3] == y[3] == "NaN" or math.isclose(x[3] * 1000, y[3], rel_tol=1e-12)):
            return False
    return True


def samples_key_order(text: str) -> list[tuple] | None:
    """kvwatch's kept samples in body order (samples_key sorts them)."""
    try:
        fams = parse(text, keep_family)
    except ParseError:
        return None
    return [
        (s.name, tuple(sorted(s.labels.items())), _canon(s.value), _canon(s.timestamp))
        for f in fams.values()
        for s in f.samples
    ]


def explain_om(text: str, mine, om) -> str | None:
    """Why kvwatch's samples differ from the OpenMetrics parser's on a body both accept, or None."""
    order = samples_key_order(text)
    if order is None:
        return None
    first = _first_of_each_series(order)
    if sorted(first, key=repr) == om[1]:
        return "om_duplicate_series"
    if _same_but_ts_unit(order, om[1]) or _same_but_ts_unit(first, om[1]):
        return "om_timestamp_seconds"
    spaced = re.sub(r"\}(?=[^ \t\n])", "} ", text)
    if spaced != text:
        again = reference(spaced, om=True)
        if again[0] == "ok" and again[1] in (mine[1], sorted(first, key=repr)):
            return "om_no_space_before_value"
    glued = _GLUED.sub("", text)
    if glued != text:
        again = reference(glued, om=True)
        if again[0] == "ok" and again[1] in (mine[1], sorted(first, key=repr)):
            return "om_hash_glued_to_keyword"
    return None


# ---------------------------------------------------------------------------------------- pipeline

_REGISTRY_TARGETS: list[Target] = []
_REGISTRY: CollectorRegistry | None = None


def _render(target: Target) -> bytes:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = CollectorRegistry(auto_describe=False)
        _REGISTRY.register(KvwatchCollector(lambda: list(_REGISTRY_TARGETS)))
    _REGISTRY_TARGETS[:] = [target]
    return generate_latest(_REGISTRY)


def _observe(target: Target, t: float, data: bytes) -> None:
    """What kvwatch.app's scrape_once does with a body: decode (the fetcher's), parse, observe; its errors count."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        target.observe_failure(t, f"decode: body is not UTF-8 (byte {e.start})")
        return
    try:
        target.observe_body(t, text)
    except (ParseError, NoEngineMetrics) as e:
        target.observe_failure(t, str(e))


def pipeline(case: Case) -> None:
    """The case through Target.observe / diagnose / export / JSON, between clean captures. Raises on a crash."""
    target = Target("http://fuzz/metrics", window_seconds=10.0, stale_after_seconds=5.0, max_engines=8)
    t = 1_000_000.0
    for body in case.prev[:2]:
        _observe(target, t, body.encode())
        target.diagnosis = target.diagnose(t)
        t += 1.0
    for data in (case.data, case.prev[2].encode()):
        _observe(target, t, data)
        target.diagnosis = target.diagnose(t + 0.25)
        _render(target)
        json.dumps(target.diagnosis.as_dict(), allow_nan=False)  # the JSON API must stay JSON
        t += 1.0


# -------------------------------------------------------------------------------------------- run


def _save(case: Case, save_dir: Path, kind: str, detail: str) -> Path:
    save_dir.mkdir(parents=True, exist_ok=True)
    path = save_dir / f"{kind}-seed{case.seed}-case{case.index}.prom"
    path.write_bytes(case.data)
    path.with_suffix(".txt").write_text(
        f"seed {case.seed} case {case.index}\nbase {case.base}\nmutations {' '.join(case.ops) or '-'}\n\n{detail}\n"
    )
    return path


def run(
    cases: int,
    seed: int = 0,
    budget_s: float | None = None,
    save_dir: Path | None = None,
    start: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Cases start..start+cases-1 (or fewer, if ``budget_s`` of wall-clock time runs out first)."""
    counts: Counter[str] = Counter()
    why: Counter[str] = Counter()
    examples: list[dict] = []
    started = time.monotonic()
    last_log = started
    done = 0
    for i in range(start, start + cases):
        if budget_s is not None and time.monotonic() - started > budget_s:
            break
        case = make_case(seed, i)
        _one(case, counts, why, examples, save_dir)
        done += 1
        if log is not None and time.monotonic() - last_log > 30:
            last_log = time.monotonic()
            log(f"fuzz: {done} cases, {counts['crashes']} crashes, {counts['unexplained']} unexplained")
    counts["cases"] = done
    return {
        "seed": seed,
        "start": start,
        "cases": done,
        "requested": cases,
        "seconds": time.monotonic() - started,
        "counts": dict(counts),
        "explained": dict(why),
        "examples": examples,
    }


def _one(case: Case, counts: Counter, why: Counter, examples: list, save_dir: Path | None) -> None:
    text = case.text()
    try:
        verdict = judge(text)
    except Exception:  # noqa: BLE001 - judge lets only kvwatch's own non-ParseError exceptions through
        counts["crashes"] += 1
        detail = traceback.format_exc()
        examples.append(
            {"kind": "crash", "case": case.index, "ops": case.ops, "base": case.base, "error": detail[-2000:]}
        )
        if save_dir is not None:
            examples[-1]["file"] = str(_save(case, save_dir, "crash", detail))
        return
    counts[f"ours_{verdict['ours']}"] += 1
    counts[f"om_{verdict['om']}"] += 1
    if verdict["ours"] == verdict["ref"] and not verdict["class"]:
        counts["agree"] += 1
    for prefix in ("", "om_"):
        cls = verdict.get(prefix + "class")
        if not cls:
            continue
        counts[prefix + "disagreements"] += 1
        counts[prefix + cls] += 1
        reason = verdict.get(prefix + "why")
        if reason:
            why[reason] += 1
        else:
            counts["unexplained"] += 1
            examples.append(
                {
                    "kind": prefix + cls,
                    "case": case.index,
                    "ops": case.ops,
                    "base": case.base,
                    "ours": verdict["ours"],
                    "ref": verdict["ref"],
                    "om": verdict["om"],
                }
            )
            if save_dir is not None:
                examples[-1]["file"] = str(_save(case, save_dir, prefix + cls, json.dumps(examples[-1], indent=1)))
    if case.pipeline:
        counts["pipeline_cases"] += 1
        try:
            pipeline(case)
        except Exception:  # noqa: BLE001 - anything but the scrape's own errors is a crash
            counts["crashes"] += 1
            counts["pipeline_crashes"] += 1
            detail = traceback.format_exc()
            examples.append(
                {
                    "kind": "pipeline_crash",
                    "case": case.index,
                    "ops": case.ops,
                    "base": case.base,
                    "error": detail[-2000:],
                }
            )
            if save_dir is not None:
                examples[-1]["file"] = str(_save(case, save_dir, "pipeline-crash", detail))


# ---------------------------------------------------------------------------------------- command


def table(res: dict) -> str:
    c = res["counts"]
    g = c.get
    lines = [
        f"fuzz: seed {res['seed']}, {res['cases']:,} cases (of {res['requested']:,} asked) in {res['seconds']:.0f} s",
        "",
        "| figure | count |",
        "|---|---:|",
        f"| cases | {res['cases']:,} |",
        f"| crashes (kvwatch raised something other than ParseError, or the pipeline something other than a scrape error) | {g('crashes', 0):,} |",
        f"| kvwatch accepted / rejected | {g('ours_ok', 0):,} / {g('ours_reject', 0):,} |",
        f"| agreed with prometheus_client's text parser | {g('agree', 0):,} |",
        f"| disagreements with it | {g('disagreements', 0):,} |",
        f"| - stricter (kvwatch rejects, prometheus_client accepts) | {g('stricter', 0):,} |",
        f"| - laxer (kvwatch accepts, prometheus_client rejects) | {g('laxer', 0):,} |",
        f"| - different samples (both accept) | {g('different', 0):,} |",
        f"| OpenMetrics parser accepted / rejected | {g('om_ok', 0):,} / {g('om_reject', 0):,} |",
        f"| different samples from the OpenMetrics parser (both accept) | {g('om_different', 0):,} |",
        f"| pipeline cases (Target.observe / diagnose / export / JSON) | {g('pipeline_cases', 0):,} |",
        f"| **unexplained disagreements** | **{g('unexplained', 0):,}** |",
        "",
    ]
    if res["explained"]:
        lines += ["explained disagreements (deliberate differences, bench/fuzz.py EXPLANATIONS):", ""]
        lines += [f"- {k}: {v:,}" for k, v in sorted(res["explained"].items())]
        lines.append("")
    for ex in res["examples"][:10]:
        lines.append(
            f"{ex['kind']}: case {ex['case']} ({ex['base']}; {' '.join(ex['ops']) or 'no mutation'})"
            + (f" -> {ex['file']}" if ex.get("file") else "")
        )
        if "error" in ex:
            lines.append("    " + ex["error"].strip().splitlines()[-1])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(
        prog="python -m bench fuzz", description="Fuzz kvwatch's parser against prometheus_client."
    )
    p.add_argument("--cases", type=int, default=10_000, help="number of cases (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="the run's seed (default 0)")
    p.add_argument("--start", type=int, default=0, help="first case number (default 0)")
    p.add_argument("--case", type=int, help="run this one case only, and print it")
    p.add_argument("--budget", type=float, help="stop after this many seconds of wall-clock time")
    p.add_argument("--save", type=Path, default=ROOT / "artifacts" / "fuzz", help="where crashing inputs go")
    p.add_argument("--json", action="store_true", help="print JSON on stdout (the table on stderr)")
    args = p.parse_args(argv)
    if args.case is not None:
        case = make_case(args.seed, args.case)
        print(f"base {case.base}; mutations {' '.join(case.ops) or '-'}; {len(case.data)} bytes", file=sys.stderr)
        print(repr(case.data[:4000]), file=sys.stderr)
        args.start, args.cases = args.case, 1
    res = run(
        args.cases, args.seed, args.budget, args.save, args.start, log=lambda m: print(m, file=sys.stderr, flush=True)
    )
    text = table(res)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps(res, indent=1, default=str))
    else:
        print(text)
    c = res["counts"]
    return 1 if c.get("crashes") or c.get("unexplained") else 0
