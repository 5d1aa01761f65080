"""From what a log collector hands over to the lines vLLM wrote.

A line of vLLM's log reaches us framed in many ways; this module undoes the framing and nothing else:
- ``kubectl logs --timestamps`` / ``docker logs -t``: ``2024-05-20T14:33:02.123456789Z <line>``;
- the CRI file format of a Kubernetes node (``/var/log/pods/...``): ``<time> stdout F <line>``, where a
  line longer than the runtime's buffer arrives as ``P`` (partial) chunks followed by an ``F`` chunk;
- Docker's json-file driver: ``{"log":"<line>\\n","stream":"stdout","time":"..."}``, a long line split
  into several objects of which only the last ends in ``\\n``;
- ANSI colour codes (vLLM colours its level names on a terminal);
- tqdm progress bars, which redraw with ``\\r`` and so share a physical line with the next log line.

What is left are *logical lines*: text, the physical line number it started on, and the collector's own
timestamp when it gave one. Re-joining lines that a terminal or a paste hard-wrapped, and splitting
records glued together without a newline, is the record parser's job (it knows what a complete record is).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

__all__ = ["Logical", "Unframer", "parse_timestamp"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CRI = re.compile(r"^(\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)?) (?:stdout|stderr) ([PF])(?: (.*))?$", re.DOTALL)
_RFC3339_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?) (.*)$", re.DOTALL)
# A wrapper's own timestamp at the start of a line: "2024-05-20 14:33:02,123", "[2024/05/20 14:33:02]".
_WRAPPER_TS = re.compile(r"^\W{0,3}(\d{4})[-/](\d\d)[-/](\d\d)[ T](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?")


def parse_timestamp(text: str | None) -> float | None:
    """Seconds since the epoch from an RFC 3339 / ISO 8601 time (nanoseconds allowed), else None."""
    if not text:
        return None
    m = re.match(r"(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?$", text.strip())
    if not m:
        return None
    y, mo, d, h, mi, s = (int(m[i]) for i in range(1, 7))
    frac = float("0." + m[7]) if m[7] else 0.0
    tz = UTC
    if m[8] and m[8] != "Z":
        sign = 1 if m[8][0] == "+" else -1
        hh, mm = int(m[8][1:3]), int(m[8][-2:])
        tz = timezone(sign * timedelta(hours=hh, minutes=mm))
    try:
        return datetime(y, mo, d, h, mi, s, tzinfo=tz).timestamp() + frac
    except ValueError:
        return None


def _wrapper_timestamp(text: str) -> float | None:
    m = _WRAPPER_TS.match(text)
    if not m:
        return None
    y, mo, d, h, mi, s = (int(m[i]) for i in range(1, 7))
    try:
        t = datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp()
    except ValueError:
        return None
    return t + (float("0." + m[7]) if m[7] else 0.0)


@dataclass(slots=True)
class Logical:
    text: str
    line: int  # 1-based physical line number where this logical line starts
    ts: float | None = None  # the collector's timestamp (kubectl/docker/CRI/wrapper), seconds since the epoch
    framed: bool = False  # the collector marked it as a line of its own (a timestamp prefix, a CRI or JSON record)


class Unframer:
    """Feed physical lines (without their ``\\n``) in order; get logical lines back."""

    MAX_PARTIAL = 1 << 20  # CRI/JSON partial chunks are joined up to this many characters, then given out

    def __init__(self):
        self._partial: Logical | None = None

    def feed(self, raw: str, line: int) -> list[Logical]:
        raw = raw.removesuffix("\r")  # CRLF files
        ts = None
        partial = False
        framed = False
        text = raw
        if raw.startswith("{") and '"log"' in raw:
            try:
                obj = json.loads(raw)
            except ValueError:
                obj = None
            if isinstance(obj, dict) and isinstance(obj.get("log"), str):
                text = obj["log"]
                framed = True
                partial = not text.endswith("\n")
                text = text.rstrip("\n")
                ts = parse_timestamp(obj.get("time")) if isinstance(obj.get("time"), str) else None
        else:
            m = _CRI.match(raw)
            if m:
                ts, partial, text, framed = parse_timestamp(m[1]), m[2] == "P", m[3] or "", True
            else:
                m = _RFC3339_PREFIX.match(raw)
                if m and (t := parse_timestamp(m[1])) is not None:
                    ts, text, framed = t, m[2], True
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        if ts is None:
            ts = _wrapper_timestamp(text)
        if self._partial is not None:
            first = self._partial
            self._partial = None
            text, line, ts = first.text + text, first.line, first.ts if first.ts is not None else ts
        if partial and len(text) < self.MAX_PARTIAL:  # an endless run of partial chunks must not grow memory
            self._partial = Logical(text, line, ts, framed)
            return []
        # A progress bar redraws itself with \r; whatever follows the last \r is what a terminal shows,
        # but a log line may also sit between two redraws, so every piece is kept.
        return [Logical(piece, line, ts, framed) for piece in text.split("\r") if piece.strip()]

    def flush(self) -> list[Logical]:
        """At the end of input: a partial chunk never completed is still text."""
        if self._partial is None:
            return []
        first, self._partial = self._partial, None
        return [Logical(piece, first.line, first.ts, first.framed) for piece in first.text.split("\r") if piece.strip()]
