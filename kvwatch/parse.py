"""Parse the Prometheus text exposition format (0.0.4) as vLLM serves it.

Why not ``prometheus_client.parser``: it costs ~15 ms for one real vLLM payload and it is lenient
(a body cut off mid-number parses as a smaller number). This parser is strict where it matters and
skips, without tokenising them, the families the caller does not want: the body is walked by
position, and the lines of a skipped family are passed over by one regular-expression match per
256 Ki characters (a 100k-series payload of unrelated families costs a few C-level scans, and the
GIL is released between slices, so a worker-thread parse does not stall the event loop). A kept
family's block is read by one ``findall`` when every line of it is a well-formed sample; any other
line takes the general line-by-line path, which decides membership and reports errors.

OpenMetrics 1.0 (vLLM's Rust frontend serves only that) is read by the same walk: a counter's ``# TYPE`` names
the family without ``_total`` (as prometheus_client names it anyway), ``# UNIT`` is a comment, and ``# EOF``
ends the body (``tests/test_vllm_033_and_openmetrics.py`` proves the parse equal to prometheus_client's OpenMetrics parser).

Strictness:
- the body must end with a newline (or, OpenMetrics, with ``# EOF``): a body truncated mid-line is an error,
  not a smaller number; nothing may follow ``# EOF``;
- every kept sample line must parse completely (name, labels, float value, optional timestamp);
- a ``# TYPE`` line must name a known type.
Lines of skipped families are not validated beyond that (they are never read).

``tests/test_parse.py`` proves this parser equal to ``prometheus_client`` on every fixture and on
generated exposition text; ``tests/test_parse_equivalence.py`` proves the fast paths equal to the
general path (and the filtered parse equal to ``prometheus_client``) on generated text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Family", "ParseError", "Sample", "parse"]

_TYPES = frozenset(
    {"counter", "gauge", "histogram", "summary", "untyped", "info", "stateset", "gaugehistogram", "unknown"}
)
# Suffixes a sample may add to its family name, by family type.
_SUFFIXES = {
    "counter": ("_total", "_created", ""),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("_sum", "_count", "_created", ""),
    "info": ("_info", ""),
}

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# The format separates tokens by blanks and tabs only (str.split() would also split on U+0085, U+3000, ...).
_BLANKS = re.compile(r"[ \t]+")
_NAME_TOKEN = re.compile(r"[^{ \t]*")
_LABEL_SET = re.compile(r'\{((?:[^"}\n]|"(?:[^"\\\n]|\\.)*")*)\}')
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,?)')
_ESCAPE = re.compile(r"\\(.)")
_HELP_ESCAPE = re.compile(r"\\([\\n])")
# Fast path for the common label set (no escapes, no spaces): validated and split in C.
# (A trailing comma is the first group's; "a,," or a lone "," goes to the slow path, which refuses it.)
_PLAIN_LABELSET = re.compile(r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*",)*(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")?')
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
        pairs = _PLAIN_PAIR.findall(text)
        labels = dict(pairs)
        if len(labels) != len(pairs) or "__name__" in labels:
            raise ParseError(lineno, f"duplicate label name in {{{text}}}")
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
        if m.group(1) in labels or m.group(1) == "__name__":  # the name is given before the braces
            raise ParseError(lineno, f"duplicate label name in {{{text}}}")
        labels[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
        if not m.group(3) and text[pos:].strip():
            raise ParseError(lineno, f"missing comma in label set {{{text}}}")
    return labels


def _parse_float(text: str, lineno: int) -> float:
    # float() also takes "1_000", "١٢" (any Unicode digits) and surrounding Unicode whitespace; Prometheus's
    # parser (Go's ParseFloat) takes none of them.
    if "_" in text or not text.isascii() or text != text.strip():
        raise ParseError(lineno, f"bad value {text!r}")
    try:
        return float(text)
    except ValueError:
        raise ParseError(lineno, f"bad value {text!r}") from None


def _seconds(text: str, value: float | None = None, lineno: int = 0) -> float:
    """An exposition timestamp (milliseconds, an integer by the format) in seconds: int / 1000 is rounded once,
    float(text) / 1000 twice, and differs past 2**53 ms (found by the fuzz). An integer too large for a float
    is an error (a ParseError, so the fast paths hand the line to the general one), as in prometheus_client."""
    try:
        return int(text) / 1000
    except OverflowError:
        raise ParseError(lineno, f"bad timestamp {text[:40]!r}") from None
    except ValueError:
        return (float(text) if value is None else value) / 1000.0


def _parse_sample(line: str, lineno: int) -> Sample:
    line = line.strip()  # leading and trailing whitespace is ignored (a CRLF line's \r too)
    name = _NAME_TOKEN.match(line).group()  # type: ignore[union-attr]  # the pattern matches "" at least
    if not _NAME.fullmatch(name):
        raise ParseError(lineno, f"bad metric name {name!r}")
    pos = len(name)
    while line[pos : pos + 1] in (" ", "\t"):
        pos += 1
    labels: dict[str, str] = {}
    if line.startswith("{", pos):
        # The label set ends at the first '}' outside a quoted value (an exemplar's may follow).
        m = _LABEL_SET.match(line, pos)
        if m is None:
            raise ParseError(lineno, "unclosed label set")
        labels = _parse_labels(m.group(1), lineno)
        pos = m.end()
    rest = [t for t in _BLANKS.split(line[pos:]) if t]
    if len(rest) not in (1, 2):
        raise ParseError(lineno, "expected a value and an optional timestamp")
    value = _parse_float(rest[0], lineno)
    ts = None
    if len(rest) == 2:
        ts = _seconds(rest[1], _parse_float(rest[1], lineno), lineno)
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


# A value or timestamp token: printable ASCII but '{', '}' and '_' ([!-^`-z|~]); anything else takes the
# general path, which refuses it.
# One well-formed sample line in one C-level match: name, optional {labels} (up to the line's last
# '}': when that text is a valid label set it has no '}' outside quotes, so it ends where _parse_sample's
# does), a value and an optional timestamp separated by spaces or tabs.
# Any line this does not match (other spacing, a malformed line) goes through _parse_sample, which
# decides exactly as before and reports the error with its line number.
_SAMPLE_LINE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^\n]*)\})?[ \t]+([!-^`-z|~]+)(?:[ \t]+([!-^`-z|~]+))?[ \t]*\n"
)
# Per skipped family (name, type): a pattern that consumes, in C, the run of lines that belong to
# it (and blank or whitespace-only lines). A line belongs when its name token -- the text before its
# first '{', else before its first ' ', else all but its last character, as the per-line check reads
# it -- is the family name or the name plus a suffix of the type. Names that could confuse that
# reading get None (the per-line check is used).
_SKIP_CACHE: dict[tuple[str, str], re.Pattern | None] = {}
_SKIP_CACHE_MAX = 4096
_CHUNK = 1 << 18  # characters per regular-expression call (~1 ms): the GIL is released between calls


def _skipper(fam: Family) -> re.Pattern | None:
    key = (fam.name, fam.type)
    try:
        return _SKIP_CACHE[key]
    except KeyError:
        pass
    pat = None
    if not any(c in fam.name for c in "{} \t\r\n"):
        names = sorted({fam.name, *(fam.name + s for s in _SUFFIXES.get(fam.type, ()))}, key=len, reverse=True)
        alt = "|".join(re.escape(n) for n in names)
        pat = re.compile(r"(?:(?:" + alt + r")(?:\{[^\n]*|[ ][^{\n]*|[^{ \n])\n|[^\S\n]*\n)*")
    if len(_SKIP_CACHE) >= _SKIP_CACHE_MAX:
        _SKIP_CACHE.clear()  # endless family names from a hostile upstream must not grow memory
    _SKIP_CACHE[key] = pat
    return pat


# Per kept family (name, type): _SAMPLE_LINE restricted to the family's sample names, and a pattern
# for a whole run of such lines. A block (the lines up to the next comment) that is such a run is
# read by one findall; any other block is read line by line.
_BLOCK_CACHE: dict[tuple[str, str], tuple[re.Pattern, re.Pattern] | None] = {}


def _block_patterns(fam: Family) -> tuple[re.Pattern, re.Pattern] | None:
    key = (fam.name, fam.type)
    try:
        return _BLOCK_CACHE[key]
    except KeyError:
        pass
    pats = None
    if _NAME.fullmatch(fam.name):
        names = sorted({fam.name, *(fam.name + s for s in _SUFFIXES.get(fam.type, ()))}, key=len, reverse=True)
        alt = "|".join(re.escape(n) for n in names)
        pats = (
            re.compile("(" + alt + r")(?:\{([^\n]*)\})?[ \t]+([!-^`-z|~]+)(?:[ \t]+([!-^`-z|~]+))?[ \t]*\n"),
            re.compile("(?:(?:" + alt + r")(?:\{[^\n]*\})?[ \t]+[!-^`-z|~]+(?:[ \t]+[!-^`-z|~]+)?[ \t]*\n)+"),
        )
    if len(_BLOCK_CACHE) >= _SKIP_CACHE_MAX:
        _BLOCK_CACHE.clear()
    _BLOCK_CACHE[key] = pats
    return pats


def _read_block(pats: tuple[re.Pattern, re.Pattern], block: str) -> list[Sample] | None:
    """The samples of ``block`` if every line of it is a well-formed sample of the family, else None."""
    line, run = pats
    if run.fullmatch(block) is None:
        return None
    cache = _LABEL_CACHE
    try:
        return [
            Sample(n, ((cache.get(t) or _parse_labels(t, 0)) if t else {}), float(v), _seconds(ts) if ts else None)
            for n, t, v, ts in line.findall(block)
        ]
    except ValueError:
        return None  # a bad value or label set: the line-by-line path reports it


def _lineno(body: str, pos: int) -> int:
    return body.count("\n", 0, pos) + 1


# OpenMetrics 1.0 ends every exposition with this line; vLLM's Rust frontend (VLLM_USE_RUST_FRONTEND=1) sends
# OpenMetrics whatever the Accept header says (gpustack/gpustack#6215). To the text format it is a comment.
_EOF = "# EOF"


def _check_eof(body: str, after: int, start: int) -> None:
    """Nothing but blank lines may follow ``# EOF`` (OpenMetrics: it is the last line): a body that goes on is
    two bodies run together or a proxy's mistake, and its tail must not be read as part of this scrape."""
    if body[after:].strip():
        raise ParseError(_lineno(body, start), "data after '# EOF' (OpenMetrics ends there)")


# Exempt from the 60-line limit (tests/test_code_shape.py), for speed: this loop runs once per line
# of bodies of 100k+ series, and as one function its state (pos, current, kept, the bound matchers)
# stays in fast locals, with no call per line. Before changing it, run `python -m bench --only cycle`
# (before and after, ratios to the same run's baseline) and tests/test_parse_equivalence.py.
def parse(body: str, keep: Callable[[str], bool] | None = None) -> dict[str, Family]:
    """Parse ``body`` into families keyed by family name.

    ``keep(name)`` decides per family whether its samples are read at all (``None`` keeps all).
    Family names follow ``prometheus_client``: a counter declared ``# TYPE x_total counter`` is
    family ``x``; its samples keep their own names.

    The body is walked by position, not split into lines: a skipped family's lines are passed over
    by one regular-expression match, and a well-formed sample line is read by one match.
    """
    if body and not body.endswith("\n"):
        if not (body == _EOF or body.endswith("\n" + _EOF)):  # OpenMetrics: the LF after "# EOF" is optional
            raise ParseError(body.count("\n") + 1, "body does not end with a newline (truncated?)")
        body += "\n"
    families: dict[str, Family] = {}
    current: Family | None = None
    kept = True  # current is one of ``families`` (not a skipped family's stand-in)
    help_name, help_text = "", ""  # HELP precedes TYPE and does not know the type yet
    match_sample = _SAMPLE_LINE.match
    label_cache = _LABEL_CACHE
    pos, end = 0, len(body)
    tried = 0  # the block fast path was tried up to here (never twice on one block)
    while pos < end:
        ch = body[pos]
        if ch == "\n":
            pos += 1
            continue
        if ch == " " or ch == "\t":
            # "#" as the first non-blank character makes a comment too (rare: a cheap look ahead).
            j = pos + 1
            while j < end and body[j] in " \t":
                j += 1
            if j < end and body[j] == "#":
                pos, ch = j, "#"
        if ch == "#":
            nl = body.index("\n", pos)
            line = body[pos:nl]
            start, pos = pos, nl + 1
            if line == _EOF:
                _check_eof(body, pos, start)
                break
            parts = _BLANKS.split(line.strip(), 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE") or parts[0] != "#":
                if parts[1:] == ["TYPE"] and parts[0] == "#":
                    raise ParseError(_lineno(body, start), "a TYPE line without a metric name")
                continue  # a plain comment (also "#x TYPE ...": HELP/TYPE must be the first token after "#")
            if not _NAME.fullmatch(parts[2]):
                raise ParseError(_lineno(body, start), f"bad metric name {parts[2]!r} in a {parts[1]} line")
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
            typ = parts[3] if len(parts) > 3 else ""  # the line is stripped: no .strip() of U+3000 here
            if typ not in _TYPES:
                raise ParseError(_lineno(body, start), f"unknown type {typ!r}")
            if typ == "untyped":
                typ = "unknown"
            raw = name = parts[2]
            if typ == "counter" and name.endswith("_total"):
                name = name[:-6]
            if (
                current is not None
                and current.name == raw
                and raw != name
                and not current.samples
                and families.get(raw) is current
            ):
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
            # Skipped family: pass over the lines that still belong to it, unread.
            skip = _skipper(current)
            if skip is not None:
                # In slices of _CHUNK characters: one C call never holds the GIL for long, so the
                # event loop keeps running while a huge body is parsed in a worker thread.
                while True:
                    stop = min(end, pos + _CHUNK)
                    run = skip.match(body, pos, stop)
                    assert run is not None  # the pattern is a (...)*: it matches, if only the empty string
                    moved = run.end()
                    done = moved == pos or stop == end
                    pos = moved
                    if done:
                        break
                if pos >= end or body[pos] == "#":
                    continue
                if body.find("\n", pos, stop) < 0 and stop < end:
                    skip = None  # a line longer than a slice: decide it by the per-line check below
            if skip is None:
                nl = body.index("\n", pos)
                line = body[pos:nl]
                if not line.strip():
                    pos = nl + 1  # whitespace only: a blank line
                    continue
                cut = line.find("{")
                if cut < 0:
                    cut = line.find(" ")
                if _family_of(line[:cut], current):
                    pos = nl + 1
                    continue
            j = pos
            while j < end and body[j] in " \t":
                j += 1
            if j < end and body[j] == "#":
                pos = j  # an indented comment line: read as a comment by the loop's next turn
                continue
            current = None  # fell out of the skipped family into an undeclared one
        elif current is not None and pos >= tried:
            # A kept family: read its block (up to the next comment line) at once if it is well-formed.
            nxt = body.find("\n#", pos)
            tried = end if nxt < 0 else nxt + 1
            pats = _block_patterns(current) if tried - pos <= _CHUNK else None
            if pats is not None:
                got = _read_block(pats, body[pos:tried])
                if got is not None:
                    current.samples.extend(got)
                    pos = tried
                    continue
        m = match_sample(body, pos)
        sample = None
        if m is not None:
            name, text, value, ts = m.groups()
            try:
                labels: dict[str, str] | None
                if text is None:
                    labels = {}
                else:
                    labels = label_cache.get(text)
                    if labels is None:
                        labels = _parse_labels(text, 0)
                sample = Sample(name, labels, float(value), None if ts is None else _seconds(ts))
                pos = m.end()
            except ValueError:
                sample = None  # the general path below raises the error with its line number
        if sample is None:
            nl = body.index("\n", pos)
            line = body[pos:nl]
            if not line.strip():
                pos = nl + 1  # whitespace only: a blank line, as prometheus_client reads it
                continue
            sample = _parse_sample(line, _lineno(body, pos))
            pos = nl + 1
        if current is None or not (sample.name == current.name or _family_of(sample.name, current)):
            current = families.get(sample.name)
            if current is None:
                if keep is not None and not keep(sample.name):
                    continue
                current = families[sample.name] = Family(sample.name)
            kept = True
        current.samples.append(sample)
    return families
