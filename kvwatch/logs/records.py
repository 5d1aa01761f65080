"""vLLM's periodic stats lines and the start-up lines that give capacity, as vLLM prints them.

Stats lines (format strings from vLLM's source; ``%%`` shown as ``%``):
- V0, early releases, ``vllm/engine/llm_engine.py`` ``_log_system_stats``::

    Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs,
    Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%, CPU KV cache usage: %.1f%

- V0, later releases up to 0.10, ``vllm/engine/metrics.py``: the same with a trailing period, then on its
  own line ``Prefix cache hit rate: GPU: %.2f%, CPU: %.2f%``. ``vllm/core/scheduler.py`` warns at every
  50th preemption (the 1st, 51st, ...): ``Sequence group %s is preempted by PreemptionMode.RECOMPUTE|SWAP
  mode because there is not enough KV cache space. ... total_num_cumulative_preemption=%d``.
- V1, ``vllm/v1/metrics/loggers.py``: first ``Avg prompt throughput: ..., Running: %d reqs, Waiting: %d
  reqs `` (no KV field); then ``Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation
  throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%, Prefix cache
  hit rate: %.1f%``; by 0.32, between Waiting and the KV field, ``Deferred: %d reqs`` (also counted in
  Waiting), ``KV fetch: %d waiting to start, %d in progress, %d completed waiting`` and ``Preemptions: %d``
  (each only when non-zero), the KV field named after the device (``CPU``, ``XPU``, ``GPU``), the prefix
  field left out until the prefix cache has seen a query, then optional ``External prefix cache hit
  rate``, ``MM cache hit rate``, ``Corrupted``. ``--aggregate-engine-logging`` prefixes ``%d Engines
  Aggregated: ``. ``--enable-logging-iteration-details`` (0.32) logs each step, from
  ``LoggingStatLogger._log_iteration_details`` (vllm/v1/metrics/loggers.py, read at commit 00ec631b, 0.33)::

    "%sIteration(%d): %d context requests, %d context tokens, %d generation requests, %d generation tokens, "
    "iteration elapsed time: %.2f ms%s, %s KV cache usage: %.1f%%%s"

  with the prefix ``Engine %03d: `` of the engine that ran the step (also under ``--aggregate-engine-logging``,
  whose stats line sums the engines), `` (dummy)`` after the time for a DP padding step, the device name before
  ``KV cache usage``, and ``, encoder inputs: %d, encoder output embeddings: %d`` at the end for a multimodal
  step. The counts are the scheduler's for that step (``SchedulerIterationDetails``, vllm/v1/metrics/stats.py):
  context tokens are the prefill chunk scheduled, generation tokens the decodes: the only per-step token
  counts a log has, and exact ones (/metrics' iteration_tokens_total counts a prompt whole at its last chunk).
  (The real 0.32 CPU log in tests/fixtures printed no ``Preemptions`` field in a run whose /metrics
  counted 78 preemptions: a missing field is read as "unknown", not as 0.)

Start-up lines: ``# GPU blocks: %d, # CPU blocks: %d`` (V0; ``# cuda blocks`` later) and, in later V0,
``Maximum concurrency for %s tokens per request: %.2fx`` (max_model_len without separators); V1's ``GPU
KV cache size: %s tokens`` and ``Maximum concurrency for %s tokens per request: %.2fx`` (thousands
separators; one line named after the device by 0.32: ``CPU KV cache size: 2,048 tokens, Maximum
concurrency for 1,024 tokens per request: 2.00x``); ``... num_gpu_blocks is: %d``; the engine config line
``Initializing a V1 LLM engine (v%s) with config: ... max_seq_len=..., kv_cache_dtype=...,
enable_prefix_caching=...``; the API server's ``non-default args: {...}`` or, in older releases,
``args: Namespace(...)``; and ``Chunked prefill is enabled with max_num_batched_tokens=%d.``

Real logs are messy. The ``Assembler`` first puts each log line back together (pieces that do not start
a log line of their own are joined to the line before), then finds records by their anchor (``Avg prompt
throughput:``) wherever they sit, several per line if they were glued together. Every literal space in
a pattern may be missing (a paste re-wrapped the text at a space). A record is complete when its
mandatory fields parse, each with its terminator (``tokens/s``, ``reqs``, ``%``), so a cut-off number is
never read as a smaller one.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kvwatch.logs.lines import Logical

__all__ = ["Assembler", "Event", "StatsRecord", "parse_segment"]

_NUM = r"(\d+(?:\.\d+)?)"


def _words(phrase: str) -> str:
    """A phrase whose spaces may be missing or newlines: 'Avg prompt' -> 'Avg\\s*prompt'."""
    return r"\s*".join(re.escape(w) for w in phrase.split(" "))


ANCHOR = re.compile(
    r"(?:Engine\s*(?P<engine>\d+)\s*:\s*|(?P<n>\d+)\s*Engines\s*Aggregated\s*:\s*)?"
    + _words("Avg prompt throughput")
    + r"\s*:"
)
_F = {
    "prompt": re.compile(_words("Avg prompt throughput") + r"\s*:\s*" + _NUM + r"\s*tokens\s*/\s*s"),
    "generation": re.compile(_words("Avg generation throughput") + r"\s*:\s*" + _NUM + r"\s*tokens\s*/\s*s"),
    "running": re.compile(r"Running\s*:\s*(\d+)\s*reqs"),
    "waiting": re.compile(r"Waiting\s*:\s*(\d+)\s*reqs"),
    "pending": re.compile(r"Pending\s*:\s*(\d+)\s*reqs"),
    "swapped": re.compile(r"Swapped\s*:\s*(\d+)\s*reqs"),
    "deferred": re.compile(r"Deferred\s*:\s*(\d+)\s*reqs"),
    "kv_fetch": re.compile(
        _words("KV fetch")
        + r"\s*:\s*(\d+)\s*"
        + _words("waiting to start")
        + r"\s*,\s*(\d+)\s*"
        + _words("in progress")
        + r"\s*,\s*(\d+)\s*"
        + _words("completed waiting")
    ),
    # "Preemptions: %d" is never the last field: demand the comma, so "Preemptions: 1" cut from 12 is not read.
    "preemptions": re.compile(r"Preemptions\s*:\s*(\d+)(?=\s*,)"),
    "kv": re.compile(r"(?:\b([A-Z]{2,5})\s*)?" + _words("KV cache usage") + r"\s*:\s*" + _NUM + r"\s*%"),
    # Case matters: V1's optional "External prefix cache hit rate" is lower-case and is not this field.
    "prefix": re.compile(_words("Prefix cache hit rate") + r"\s*:\s*" + _NUM + r"\s*%"),
}
_ASCTIME = re.compile(
    r"(?:INFO|WARNING|WARN|DEBUG|ERROR|CRITICAL)\s*(\d\d)-(\d\d)\s*(\d\d):(\d\d):(\d\d)(?:[.,](\d+))?"
)
_PROC = re.compile(r"\((\w+?)(?:_DP(\d+))?\s+pid=\d+\)")


# Events: everything that is not a stats record but changes how the next records read.
def _rx(pattern: str) -> re.Pattern:
    """A pattern whose literal spaces may be missing (a paste re-wrapped the line and the join lost them)."""
    return re.compile(pattern.replace(" ", r"\s*"))


_E = {
    "config": _rx(r"Initializing\s*(?:a\s*V(\d)\s*|an\s*)LLM\s*engine\s*(?:\(v([^)\s]+)\)\s*)?with\s*config:"),
    "nondefault": _rx(r"non-default args:\s*(\{.*)"),
    "namespace": _rx(r"\bargs:\s*Namespace\((.*)"),
    "api_version": _rx(r"vLLM API server version\s*([\w.+-]+)"),
    "chunked": _rx(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)"),
    "defaulting": _rx(r"Defaulting (max_num_batched_tokens|max_num_seqs) to (\d+)"),
    "kv_size": _rx(r"(?:\b([A-Z]{2,5})(?:\s*\+\s*host)?\s*)?KV cache size:\s*([\d,]+)\s*tokens"),
    "concurrency": _rx(r"Maximum concurrency for\s*([\d,]+)\s*tokens per request:\s*" + _NUM + r"\s*x"),
    "blocks": _rx(r"#\s*(\w+)\s*blocks:\s*(\d+),\s*#\s*CPU\s*blocks:\s*(\d+)"),
    "num_gpu_blocks": _rx(
        r"(?:Engine\s*(\d+)\s*:\s*)?(?:\d+ Engines: )?vllm cache_config_info with initialization after num_gpu_blocks is:\s*(\d+)"
    ),
    "override_blocks": _rx(r"Overriding num_gpu_blocks=(\d+) with num_gpu_blocks_override=(\d+)"),
    "preemption": _rx(r"(?:preempted by PreemptionMode\.(\w+) mode.*?)?total_num_cumulative_preemption=(\d+)(?!\d)"),
    "iteration": _rx(
        r"(?:Engine\s*(\d+)\s*:\s*)?Iteration\((\d+)\):\s*(\d+) context requests, (\d+) context tokens, "
        r"(\d+) generation requests, (\d+) generation tokens, iteration elapsed time: ([\d.]+) ms( \(dummy\))?"
    ),
    # vllm/v1/executor/abstract.py (0.32) Executor.sleep / wake_up, in the engine core's log (EngineCore_DP<n>):
    # "It took %.6f seconds to fall asleep." and "It took %.6f seconds to wake up tags %s." (the tags woken, or
    # every sleeping tag; V0 and early V1: "... to wake up."). Sleep levels 1 and 2 both; the level is not printed.
    "sleep": _rx(r"It took " + _NUM + r" seconds to fall asleep"),
    "wake": _rx(r"It took " + _NUM + r" seconds to wake up(?: tags ([\[{][^\]}]*[\]}]))?"),
    "v0_prefix": _rx(
        _words("Prefix cache hit rate") + r"\s*:\s*GPU\s*:\s*" + _NUM + r"\s*%\s*,\s*CPU\s*:\s*" + _NUM + r"\s*%"
    ),
}
# Keys of vLLM's engine config line that matter here; searched on every line because the config line is
# thousands of characters long and a terminal wraps it.
_CONFIG_KEYS = {
    "max_seq_len": re.compile(r"\bmax_seq_len=(\d+)(?=[,\s)])"),
    "kv_cache_dtype": re.compile(r"\bkv_cache_dtype=([\w.]+)(?=[,\s)])"),
    "enable_prefix_caching": re.compile(r"\benable_prefix_caching=(True|False)\b"),
    "served_model_name": re.compile(r"\bserved_model_name=([^,\s]+)(?=[,\s])"),
    "device_config": re.compile(r"\bdevice_config=(\w+)"),
}
START_KINDS = frozenset({"config", "nondefault", "namespace", "api_version"})
ARG_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "block_size",
    "kv_cache_dtype",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "num_gpu_blocks_override",
    "served_model_name",
    "model",
    "data_parallel_size",
    "aggregate_engine_logging",
)


@dataclass(slots=True)
class StatsRecord:
    line: int
    engine: str  # "000", "001" (V1), "0" (V0 has no engine index), "aggregated"
    fmt: str  # "v0" | "v1"
    prompt_tokens_per_second: float
    generation_tokens_per_second: float
    requests_running: int
    requests_waiting: int
    requests_swapped: int | None = None
    requests_deferred: int | None = None
    kv_cache_usage_ratio: float | None = None
    kv_device: str | None = None
    cpu_swap_usage_ratio: float | None = None  # V0's "CPU KV cache usage": the swap space
    prefix_cache_hit_ratio: float | None = None
    preemptions: int | None = None  # V1 "Preemptions: N" in the interval; None when not printed
    kv_fetch: tuple[int, int, int] | None = None
    aggregated_engines: int | None = None
    vllm_time: float | None = None  # vLLM's own "MM-DD HH:MM:SS" (no year: seconds in the year 2000)
    clock: str | None = None  # "HH:MM:SS" as printed
    collector_time: float | None = None  # kubectl/docker/CRI/wrapper timestamp, seconds since the epoch


@dataclass(slots=True)
class Event:
    kind: str
    line: int
    data: dict = field(default_factory=dict)
    dp_rank: int | None = None  # from an "(EngineCore_DP1 pid=...)" prefix


@dataclass(slots=True)
class Parsed:
    fields: dict
    end: int  # end of the last field read, in the segment
    text: str

    @property
    def fmt(self) -> str:
        return "v0" if ("pending" in self.fields or "swapped" in self.fields) else "v1"

    @property
    def complete(self) -> bool:
        f = self.fields
        if not all(k in f for k in ("prompt", "generation", "running")) or not ("waiting" in f or "pending" in f):
            return False
        if "kv" in f:
            return True
        # V1 0.7 printed nothing after "Waiting: %d reqs ": a comma or a KV fragment there is a cut field.
        tail = self.text[self.end :].strip()
        return self.fmt == "v1" and not tail.startswith(",") and "KV" not in tail


def parse_segment(seg: str) -> Parsed:
    """Read the fields of one stats record from ``seg`` (which starts at its anchor)."""
    fields: dict = {}
    end = 0
    for name, rx in _F.items():
        if name == "kv":
            kvs = list(rx.finditer(seg))
            if not kvs:
                continue
            # V0 prints GPU then CPU (the swap space); V1 one field, named after the device.
            gpu = next((m for m in kvs if m[1] == "GPU"), None)
            main = gpu if (gpu is not None and len(kvs) > 1) else kvs[0]
            fields["kv"] = (float(main[2]), main[1])
            end = max(end, main.end())
            for k in kvs:
                if k is not main and k[1] == "CPU":
                    fields["cpu_kv"] = float(k[2])
                end = max(end, k.end())
            continue
        m = rx.search(seg)
        if m is None:
            continue
        fields[name] = m.groups() if name == "kv_fetch" else m[1]
        end = max(end, m.end())
    return Parsed(fields, end, seg)


def _asctime(text: str) -> tuple[float | None, str | None, int | None]:
    """vLLM's header time nearest before a record: seconds (in the year 2000: vLLM prints no year),
    'HH:MM:SS', and where the header starts in ``text``."""
    ms = list(_ASCTIME.finditer(text))
    if not ms:
        return None, None, None
    m = ms[-1]
    try:
        t = datetime(2000, int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), tzinfo=UTC).timestamp()
    except ValueError:
        return None, None, None
    return t + (float("0." + m[6]) if m[6] else 0.0), f"{m[3]}:{m[4]}:{m[5]}", m.start()


def _dp_rank(text: str) -> int | None:
    matches = list(_PROC.finditer(text))
    m = matches[-1] if matches else None  # the last one names the process that logged the line
    if m is not None and m[2] is not None:
        return int(m[2])
    return None


def _literal(value: str):
    value = value.strip().rstrip(",)")
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value.strip("'\"")


def parse_args_text(kind: str, body: str) -> dict:
    """vLLM's ``non-default args: {...}`` dict or ``args: Namespace(...)``, the keys that matter here."""
    out: dict = {}
    if kind == "nondefault":
        try:
            obj = ast.literal_eval(body.strip())
            if isinstance(obj, dict):
                return {k: v for k, v in obj.items() if k in ARG_KEYS and v is not None}
        except (ValueError, SyntaxError):
            pass  # a repr that is not a literal, or a wrapped line: read key by key
        pairs = re.finditer(r"'(\w+)':\s*('[^']*'|\"[^\"]*\"|[^,}]+)", body)
    else:
        pairs = re.finditer(r"\b(\w+)=('[^']*'|\"[^\"]*\"|[^,\s)]+)", body)
    for m in pairs:
        if m[1] in ARG_KEYS:
            v = _literal(m[2])
            if v is not None and v != "None":
                out[m[1]] = v
    return out


def _tags(text: str | None) -> frozenset[str] | None:
    """The tags of a wake-up line (``['weights']``, ``{'kv_cache', 'weights'}``); None: every tag."""
    if not text:
        return None
    return frozenset(re.findall(r"'(\w+)'", text)) or None


def _num(s: str) -> int:
    return int(s.replace(",", ""))


# Every event pattern contains one of these: most lines (access logs) are dismissed by one search.
_EVENT_HINT = re.compile(
    r"args|Initializing|version|Chunked|Defaulting|size|concurrency|blocks|preempt|Iteration|GPU|took|"
    r"_len=|dtype=|caching=|model_name=|device_config="
)


def _events(text: str, line: int, skip: frozenset = frozenset()) -> list[tuple[int, Event]]:
    """Every non-record event in ``text``, with its position."""
    if _EVENT_HINT.search(text) is None:
        return []
    rank = _dp_rank(text)
    found: list[tuple[int, Event]] = []
    for kind, rx in _E.items():
        if kind in skip:
            continue
        for m in rx.finditer(text):
            data: dict
            if kind == "config":
                data = {"engine_version": m[1], "version": m[2]}
            elif kind in ("nondefault", "namespace"):
                data = parse_args_text(kind, m[1])
            elif kind == "api_version":
                data = {"version": m[1]}
            elif kind == "chunked":
                data = {"max_num_batched_tokens": int(m[1])}
            elif kind == "defaulting":
                data = {m[1]: int(m[2])}
            elif kind == "kv_size":
                data = {"tokens": _num(m[2]), "device": m[1]}
            elif kind == "concurrency":
                data = {"max_model_len": _num(m[1]), "concurrency": float(m[2])}
            elif kind == "blocks":
                data = {"num_gpu_blocks": int(m[2]), "device": m[1], "num_cpu_blocks": int(m[3])}
            elif kind == "num_gpu_blocks":
                data = {"num_gpu_blocks": int(m[2]), "engine": m[1]}
            elif kind == "override_blocks":
                data = {"num_gpu_blocks": int(m[2])}
            elif kind == "preemption":
                data = {"counter": int(m[2]), "mode": m[1]}
            elif kind == "sleep":
                data = {}
            elif kind == "wake":
                data = {"tags": _tags(m[2])}
            elif kind == "iteration":
                if m[8]:
                    continue  # dummy steps (DP padding) schedule nothing
                data = {
                    "engine": m[1],
                    "context_tokens": int(m[4]),
                    "generation_tokens": int(m[6]),
                    "requests": int(m[3]) + int(m[5]),
                    "elapsed_ms": float(m[7]),
                }
            elif kind == "v0_prefix":
                data = {"gpu": float(m[1]), "cpu": float(m[2])}
            else:  # pragma: no cover - every kind is handled above
                continue
            found.append((m.start(), Event(kind, line, data, rank)))
    for key, rx in _CONFIG_KEYS.items():
        for m in rx.finditer(text):
            found.append((m.start(), Event("config_key", line, {key: m[1]}, rank)))
    found.sort(key=lambda x: x[0])
    return found


# A line that starts a log line of its own. Anything else (a piece of a line that a terminal or a paste
# wrapped, a CRI/JSON chunk already joined, stray output without a header) belongs to the line before.
_LOG_START = re.compile(
    r"^\s*(?:\(\w+\s+pid=\d+\)|(?:INFO|WARNING|WARN|DEBUG|ERROR|CRITICAL)(?::|\s*\d\d-\d\d)"
    r"|\d{4}-\d\d-\d\d[T ]\d\d:|\[\d{4}-|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d )"
)


def _continues(text: str) -> bool:
    return bool(text.strip()) and _LOG_START.match(text) is None


@dataclass(slots=True)
class _Block:
    """One log line as vLLM wrote it, put back together from the pieces it reached us in."""

    text: str
    ts: float | None
    pieces: list[tuple[int, int]]  # (offset in text, physical line number)

    def line_at(self, pos: int) -> int:
        line = self.pieces[0][1]
        for off, n in self.pieces:
            if off > pos:
                break
            line = n
        return line


@dataclass(slots=True)
class _Held:
    text: str
    line: int
    lg_ts: float | None
    engine: str | None
    aggregated: int | None
    vllm_time: float | None
    clock: str | None
    parsed: Parsed
    waited: int = 0
    v0_prefix: float | None = None


class Assembler:
    """Logical lines in, stats records and events out, in log order.

    Lines are first put back together: a line that does not start a log line of its own (no vLLM header,
    no uvicorn ``INFO:``, no timestamp) is the rest of the line before it, cut by a terminal or a paste,
    and is joined to it (its leading blanks dropped). Then records are found by their anchor anywhere in
    the line (several when they were glued together), and events by their patterns.

    The last record is *held* until the next line: V0's ``Prefix cache hit rate: GPU: ...`` line that
    follows it (within a few lines) is attached to it. Incomplete records are dropped and their line
    numbers kept in ``skipped``.
    """

    MAX_BLOCK_PIECES = 200  # a ~4000-character start-up config line wrapped at 35 columns is ~115
    MAX_BLOCK_CHARS = 1 << 16
    V0_PATIENCE = 3  # lines a V0 record waits for its prefix-cache line
    SKIPPED_KEPT = 100  # the report names the first ten; the count is exact

    def __init__(self):
        self.block: _Block | None = None
        self.held: _Held | None = None
        self.pending: list[Event] = []  # events after the held record, emitted after it
        self.skipped: list[int] = []  # line numbers of the first SKIPPED_KEPT incomplete records
        self.skipped_count = 0

    # ------------------------------------------------------------------ public

    def feed(self, lg: Logical) -> list[StatsRecord | Event]:
        b = self.block
        if (
            b is not None
            and not lg.framed
            and _continues(lg.text)
            and len(b.pieces) < self.MAX_BLOCK_PIECES
            and len(b.text) < self.MAX_BLOCK_CHARS
        ):
            piece = lg.text.lstrip()
            b.pieces.append((len(b.text), lg.line))
            b.text += piece
            if b.ts is None:
                b.ts = lg.ts
            return []
        out = self._take_block()
        self.block = _Block(lg.text, lg.ts, [(0, lg.line)])
        return out

    def flush(self) -> list[StatsRecord | Event]:
        """End of input, or a pause in a stream: give out everything held."""
        return self._take_block() + self._finalize()

    @property
    def holding(self) -> bool:
        return self.held is not None or self.block is not None

    # ------------------------------------------------------------------ internals

    def _take_block(self) -> list[StatsRecord | Event]:
        b, self.block = self.block, None
        return [] if b is None else self._line(b)

    def _line(self, b: _Block) -> list[StatsRecord | Event]:
        out: list[StatsRecord | Event] = []
        h = self.held
        if h is not None and h.parsed.fmt == "v0" and h.v0_prefix is None:
            first = ANCHOR.search(b.text)
            has_anchor = first is not None
            m = _E["v0_prefix"].search(b.text)
            if m is not None and (first is None or m.start() < first.start()):
                h.v0_prefix = float(m[1])
                out += self._finalize()
                return out + self._fresh(b, skip=frozenset({"v0_prefix"}))
            if (
                h.waited < self.V0_PATIENCE
                and not has_anchor
                and not any(e.kind in START_KINDS or e.kind == "preemption" for _, e in _events(b.text, 0))
            ):
                h.waited += 1
                self.pending += [e for _, e in _events(b.text, b.pieces[0][1])]
                return out
        out += self._finalize()
        return out + self._fresh(b)

    def _fresh(self, b: _Block, skip: frozenset = frozenset()) -> list[StatsRecord | Event]:
        """A line's events, and its records (the last one is held)."""
        out: list[StatsRecord | Event] = []
        text = b.text
        anchors = list(ANCHOR.finditer(text))
        events = [(pos, ev) for pos, ev in _events(text, 0, skip)]
        for pos, ev in events:
            ev.line = b.line_at(pos)
        bounds = [a.start() for a in anchors] + [len(text)]
        for pos, ev in events:
            if anchors and pos >= bounds[0]:
                break
            out.append(ev)
        prev_end = 0
        for i, a in enumerate(anchors):
            out += self._finalize()
            seg = text[a.start() : bounds[i + 1]]
            parsed = parse_segment(seg)
            head = text[prev_end : a.start()]
            vt, clock, at = _asctime(head)
            line = b.line_at(prev_end + at if at is not None else a.start())
            self.held = _Held(seg, line, b.ts, a["engine"], int(a["n"]) if a["n"] else None, vt, clock, parsed)
            prev_end = a.start() + parsed.end
            mine = [ev for pos, ev in events if bounds[i] <= pos < bounds[i + 1]]
            for ev in mine:
                if ev.kind == "v0_prefix" and parsed.fmt == "v0":  # V0's prefix-cache line, glued on
                    self.held.v0_prefix = ev.data["gpu"]
            self.pending += [ev for ev in mine if not (ev.kind == "v0_prefix" and parsed.fmt == "v0")]
        return out

    def _finalize(self) -> list[StatsRecord | Event]:
        h, self.held = self.held, None
        out: list[StatsRecord | Event] = []
        if h is not None:
            if h.parsed.complete:
                out.append(_record(h))
            else:
                self.skipped_count += 1
                if len(self.skipped) < self.SKIPPED_KEPT:
                    self.skipped.append(h.line)
        out += self.pending
        self.pending = []
        return out


def _record(h: _Held) -> StatsRecord:
    f = h.parsed.fields
    fmt = h.parsed.fmt
    if h.aggregated is not None:
        engine = "aggregated"
    elif h.engine is not None:
        engine = h.engine
    else:
        engine = "0" if fmt == "v0" else "000"
    kv = f.get("kv")
    fetch = f.get("kv_fetch")  # the three groups of _F["kv_fetch"]
    rec = StatsRecord(
        line=h.line,
        engine=engine,
        fmt=fmt,
        prompt_tokens_per_second=float(f["prompt"]),
        generation_tokens_per_second=float(f["generation"]),
        requests_running=int(f["running"]),
        requests_waiting=int(f["waiting"] if "waiting" in f else f["pending"]),
        requests_swapped=int(f["swapped"]) if "swapped" in f else (0 if fmt == "v0" else None),
        requests_deferred=int(f["deferred"]) if "deferred" in f else None,
        kv_cache_usage_ratio=round(kv[0] / 100.0, 6) if kv else None,
        kv_device=kv[1] if kv else None,
        cpu_swap_usage_ratio=round(f["cpu_kv"] / 100.0, 6) if fmt == "v0" and "cpu_kv" in f else None,
        prefix_cache_hit_ratio=round(float(f["prefix"]) / 100.0, 6) if "prefix" in f else None,
        preemptions=int(f["preemptions"]) if "preemptions" in f else None,
        kv_fetch=(int(fetch[0]), int(fetch[1]), int(fetch[2])) if fetch else None,
        aggregated_engines=h.aggregated,
        vllm_time=h.vllm_time,
        clock=h.clock,
        collector_time=h.lg_ts,
    )
    if fmt == "v0" and h.v0_prefix is not None:
        rec.prefix_cache_hit_ratio = round(h.v0_prefix / 100.0, 6)
    return rec
