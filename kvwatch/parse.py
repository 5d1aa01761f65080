"""Parse the Prometheus text exposition format (0.0.4) as vLLM serves it.

Why not ``prometheus_client.parser``: it costs ~15 ms for one real vLLM payload and it is lenient
(a body cut off mid-number parses as a smaller number). This parser is strict where it matters and
skips, without tokenising them, the families the caller does not want: a 100k-series payload of
unrelated families costs one ``startswith`` per line.

Strictness:
- the body must end with a newline: a body truncated mid-line is an error, not a smaller number;
- every kept sample line must parse completely (name, labels, float value, optional timestamp);
- a ``# TYPE`` line must name a known type.
Lines of skipped families are not validated beyond that (they are never read).

``tests/test_parse.py`` proves this parser equal to ``prometheus_client`` on every fixture and on
generated exposition text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["Family", "ParseError", "Sample", "parse"]

_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "info", "stateset", "gaugehistogram", "unknown"})
# Suffixes a sample may add to its family name, by family type.
_SUFFIXES = {
    "counter": ("_total", "_created", ""),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("_sum", "_count", "_created", ""),
    "info": ("_info", ""),
}

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,?)')
_ESCAPE = re.compile(r"\\(.)")
_HELP_ESCAPE = re.compile(r"\\([\\n])")
# Fast path for the common label set (no escapes, no spaces): validated and split in C.
_PLAIN_LABELSET = re.compile(r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*",)*(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")?,?')
_PLAIN_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
# The same label sets recur on every scrape; parsed dicts are shared, so callers must not mutate them.
_LABEL_CACHE: dict[str, dict[str, str]] = {}
_LABEL_CACHE_MAX = 16384


class ParseError(ValueError):
    """The body is not valid exposition text (with the 1-based line number)."""

    def __init__(self, line: int, msg: str):
        super().__init__(f"line {line}: {msg}")
        self.line = line


@dataclass(slots=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(slots=True)
class Family:
    name: str
    type: str = "unknown"  # prometheus_client's name for untyped
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: {"n": "\n", "\\": "\\", '"': '"'}.get(m.group(1), "\\" + m.group(1)), value)


def _unescape_help(text: str) -> str:
    """HELP text knows only two escapes, ``\\\\`` and ``\\n`` (``\\"`` stays as written), as in prometheus_client."""
    if "\\" not in text:
        return text
    return _HELP_ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else "\\", text)


def _parse_labels(text: str, lineno: int) -> dict[str, str]:
    labels = _LABEL_CACHE.get(text)
    if labels is not None:
        return labels
    if _PLAIN_LABELSET.fullmatch(text):
        labels = dict(_PLAIN_PAIR.findall(text))
    else:
        labels = _parse_labels_slow(text, lineno)
    if len(_LABEL_CACHE) >= _LABEL_CACHE_MAX:
        _LABEL_CACHE.clear()  # a hostile upstream with endless label sets must not grow memory
    _LABEL_CACHE[text] = labels
    return labels


def _parse_labels_slow(text: str, lineno: int) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos, end = 0, len(text)
    while pos < end:
        m = _LABEL.match(text, pos)
        if m is None:
            if text[pos:].strip() == "":
                break
            raise ParseError(lineno, f"bad label set {{{text}}}")
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
        if not m.group(3) and text[pos:].strip():
            raise ParseError(lineno, f"missing comma in label set {{{text}}}")
    return labels


def _parse_float(text: str, lineno: int) -> float:
    try:
        return float(text)
    except ValueError:
        raise ParseError(lineno, f"bad value {text!r}") from None


def _parse_sample(line: str, lineno: int) -> Sample:
    brace = line.find("{")
    if brace >= 0:
        name = line[:brace].strip()
        # Label values may contain '}', so find the closing brace after the last quote.
        close = line.rfind("}")
        if close < brace:
            raise ParseError(lineno, "unclosed label set")
        labels = _parse_labels(line[brace + 1 : close], lineno)
        rest = line[close + 1 :].split()
    else:
        parts = line.split()
        name, rest, labels = parts[0], parts[1:], {}
    if not _NAME.fullmatch(name):
        raise ParseError(lineno, f"bad metric name {name!r}")
    if len(rest) not in (1, 2):
        raise ParseError(lineno, "expected a value and an optional timestamp")
    value = _parse_float(rest[0], lineno)
    ts = None
    if len(rest) == 2:
        ts = _parse_float(rest[1], lineno) / 1000.0  # exposition timestamps are milliseconds
    return Sample(name, labels, value, ts)


def _family_of(sample_name: str, fam: Family | None) -> bool:
    """Whether the sample belongs to the family declared just before it."""
    if fam is None:
        return False
    if sample_name == fam.name:
        return True
    if not sample_name.startswith(fam.name):
        return False
    return sample_name[len(fam.name) :] in _SUFFIXES.get(fam.type, ())


def parse(body: str, keep: Callable[[str], bool] | None = None) -> dict[str, Family]:
    """Parse ``body`` into families keyed by family name.

    ``keep(name)`` decides per family whether its samples are read at all (``None`` keeps all).
    Family names follow ``prometheus_client``: a counter declared ``# TYPE x_total counter`` is
    family ``x``; its samples keep their own names.
    """
    if body and not body.endswith("\n"):
        raise ParseError(body.count("\n") + 1, "body does not end with a newline (truncated?)")
    families: dict[str, Family] = {}
    current: Family | None = None
    kept = True
    help_name, help_text = "", ""  # HELP precedes TYPE and does not know the type yet
    for lineno, line in enumerate(body.split("\n"), 1):
        if not line or not line.strip():
            continue  # blank, or whitespace only (prometheus_client reads both as blank)
        if line[0] == "#":
            parts = line.rstrip().split(None, 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                continue  # a plain comment
            if parts[1] == "HELP":
                help_name, help_text = parts[2], (_unescape_help(parts[3]) if len(parts) > 3 else "")
                if current is not None and help_name in (current.name, current.name + "_total"):
                    if kept:
                        current.help = help_text
                    continue
                current, kept = None, keep is None or keep(help_name)
                if kept:
                    current = families.setdefault(help_name, Family(help_name, help=help_text))
                continue
            typ = parts[3].strip() if len(parts) > 3 else ""
            if typ not in _TYPES:
                raise ParseError(lineno, f"unknown type {typ!r}")
            if typ == "untyped":
                typ = "unknown"
            raw = name = parts[2]
            if typ == "counter" and name.endswith("_total"):
                name = name[:-6]
            if current is not None and current.name == raw and raw != name and not current.samples:
                del families[raw]  # created by HELP under the sample name; rename to the family
            kept = keep is None or keep(name)
            if not kept:
                current = Family(name, typ)
                continue
            current = families.setdefault(name, Family(name))
            current.type = typ
            if help_name == raw:
                current.help = help_text
            continue
        if current is not None and not kept:
            # Skipped family: only check that the line still belongs to it, cheaply.
            end = line.find("{")
            if end < 0:
                end = line.find(" ")
            if _family_of(line[:end], current):
                continue
            current = None  # fell out of the skipped family into an undeclared one
        sample = _parse_sample(line, lineno)
        if not _family_of(sample.name, current):
            current = families.get(sample.name)
            if current is None:
                if keep is not None and not keep(sample.name):
                    continue
                current = families[sample.name] = Family(sample.name)
        current.samples.append(sample)
    return families


def family_names(families: Iterable[Family]) -> list[str]:
    return [f.name for f in families]
