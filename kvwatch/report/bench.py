"""Benchmark stages: ``vllm bench serve --save-result`` JSON files (one file, one stage).

The fields are those of vLLM's ``vllm/benchmarks/serve.py`` (``main``: ``date``, ``backend``, ``model_id``,
``num_prompts``, ``request_rate`` ("inf" when unset), ``max_concurrency``, then ``benchmark``'s result:
``duration``, ``completed``, ``failed``, ``request_throughput``, ``output_throughput``,
``total_token_throughput`` and ``{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms`` for the
``--percentile-metrics`` asked, ttft,tpot,itl by default); the older ``benchmarks/benchmark_serving.py`` wrote
the same names. A result has no absolute start: ``start_times`` are ``time.perf_counter()`` readings, and
``date`` is ``datetime.now().strftime("%Y%m%d-%H%M%S")`` taken after the run, in the benchmarking machine's
local time. So a stage ends at ``date`` (read in this machine's time zone: run the report where the benchmark
ran, or pass ``--stage-start``), and starts ``duration`` seconds before; without ``date`` it ends at the file's
modification time (vLLM writes the file right after the run). The seed is not saved: ``--metadata seed=N``
(vLLM's own way to add fields) lets the report see two stages sharing one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

__all__ = ["LATENCIES", "REQUIRED", "Stage", "read_stage"]

# What a stage cannot be reported without: one missing names the file as another tool's or version's.
REQUIRED = ("duration", "completed", "request_throughput", "output_throughput")
LATENCIES = ("ttft", "tpot", "itl")
_STATS = ("mean", "median", "p99")
_DATE_FORMAT = "%Y%m%d-%H%M%S"


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    start: float
    end: float
    timed_by: str  # how start/end were found: "date field", "file mtime" or "--stage-start"
    concurrency: int | None
    request_rate: float | None  # None: "inf" (every request at once, paced by concurrency)
    num_prompts: int | None
    completed: int
    failed: int | None
    request_throughput: float
    output_throughput: float
    total_token_throughput: float | None
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # ttft -> {mean, median, p99}
    seed: str | None = None
    model_id: str | None = None
    backend: str | None = None

    @property
    def load(self) -> tuple[float, float]:
        """Ordering by offered load: concurrency, then request rate (unbounded last)."""
        c = self.concurrency if self.concurrency is not None else math.inf
        r = self.request_rate if self.request_rate is not None else math.inf
        return (c, r)

    @property
    def load_label(self) -> str:
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.request_rate is not None:
            parts.append(f"{self.request_rate:g} req/s")
        return ", ".join(parts) or "unbounded rate"

    def p99_seconds(self, metric: str) -> float | None:
        v = self.latency_ms.get(metric, {}).get("p99")
        return None if v is None else v / 1000.0


def _number(doc: dict, key: str, name: str) -> float:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{name}: field {key!r} is not a number ({str(v)[:40]!r})")
    return float(v)


def _optional(doc: dict, key: str) -> float | None:
    v = doc.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _end_time(doc: dict, path: Path) -> tuple[float, str]:
    raw = doc.get("date")
    if isinstance(raw, str):
        try:
            return datetime.strptime(raw, _DATE_FORMAT).timestamp(), "date field"  # naive: local time
        except ValueError:
            pass
    return path.stat().st_mtime, "file mtime"


def read_stage(path: Path, start: float | None = None) -> Stage:
    """One stage from one result file. ``start``: the stage's start (unix seconds), overriding the file's.

    Raises ValueError with one line (the file and the field) for another tool's or version's file."""
    name = path.name
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"{name}: cannot read: {e.strerror or e}") from None
    except ValueError:
        raise ValueError(f"{name}: not JSON (expected `vllm bench serve --save-result` output)") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{name}: not a `vllm bench serve --save-result` result (not a JSON object)")
    for key in REQUIRED:
        if key not in doc:
            raise ValueError(
                f"{name}: no {key!r} field: not a `vllm bench serve --save-result` result this kvwatch reads"
            )
    duration = _number(doc, "duration", name)
    if start is not None:
        timed_by, begin = "--stage-start", start
    else:
        end, timed_by = _end_time(doc, path)
        begin = end - duration
    latency = {}
    for metric in LATENCIES:
        stats = {s: v for s in _STATS if (v := _optional(doc, f"{s}_{metric}_ms")) is not None}
        if stats:
            latency[metric] = stats
    rate = doc.get("request_rate")
    conc = doc.get("max_concurrency")
    seed = doc.get("seed")
    return Stage(
        name=name,
        start=begin,
        end=begin + duration,
        timed_by=timed_by,
        concurrency=int(conc) if isinstance(conc, (int, float)) and not isinstance(conc, bool) else None,
        request_rate=float(rate) if isinstance(rate, (int, float)) and math.isfinite(rate) else None,
        num_prompts=int(doc["num_prompts"]) if isinstance(doc.get("num_prompts"), int) else None,
        completed=int(_number(doc, "completed", name)),
        failed=int(f) if (f := _optional(doc, "failed")) is not None else None,
        request_throughput=_number(doc, "request_throughput", name),
        output_throughput=_number(doc, "output_throughput", name),
        total_token_throughput=_optional(doc, "total_token_throughput"),
        latency_ms=latency,
        seed=None if seed is None else str(seed),
        model_id=str(doc["model_id"]) if doc.get("model_id") is not None else None,
        backend=str(doc["backend"]) if doc.get("backend") is not None else None,
    )
