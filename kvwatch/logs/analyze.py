"""Stats records -> the core's ``Signals`` -> the core's diagnosis, one record at a time.

Each record becomes an ``EngineSnapshot`` (gauges as logged; counters rebuilt from the 10 s averages
times the logging interval) fed to the core's ``EngineHistory``; ``summarize`` gives the window
(KV usage and Running maxima over the last 3 records, a Running plateau while requests wait, stalls),
and ``diagnose_engine`` the bottleneck and the advice. Nothing here decides a bottleneck: it only says,
in evidence sentences appended to the core's, what a log could not show.

What a stats line is: prompt and generation throughput are averages over the logging interval
(``VLLM_LOG_STATS_INTERVAL``, 10 s, in V1; V0 logged after the first step >= 5 s since the last line);
Running, Waiting, Swapped and KV usage are the scheduler's state at that moment. V1 logs on a timer and
hides idle lines, so a gap between two records is idle time; V0 logs only from a step, so its averages
run over the whole gap.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from kvwatch.catalog import VLLM_SLEEP_TAGS, Bottleneck, Source, Thresholds
from kvwatch.diagnose import Diagnosis, Hints, diagnose_engine
from kvwatch.logs.records import Event, StatsRecord
from kvwatch.snapshot import (
    KV_FETCH_STAGES,
    OVERFLOW,
    SLEEP_LEVEL_UNKNOWN,
    CacheConfig,
    Counter,
    EngineSnapshot,
    Gauge,
    kv_fetch_gauge,
)
from kvwatch.window import RECENT, EngineHistory, Measured, summarize

__all__ = ["LogAnalyzer", "RecordResult", "ServerConfig"]

V1_INTERVAL = 10.0  # VLLM_LOG_STATS_INTERVAL's default
V0_INTERVAL = 5.0  # V0's _LOCAL_LOGGING_INTERVAL_SEC

T = TypeVar("T")


@dataclass(slots=True)
class Known(Generic[T]):
    """A value read from the log, and the line it came from."""

    value: T
    line: int
    how: str  # "start-up arguments", "engine config", ...


MAX_KEYS = 1024  # start-up settings, or DP ranks, one server run remembers


def _put_rank(table: dict, rank: int | None, value: Known) -> None:
    if rank in table or len(table) < MAX_KEYS:
        table[rank] = value


@dataclass
class ServerConfig:
    """What the start-up lines of one server run said."""

    version: str | None = None
    engine_version: str | None = None  # "0" / "1" from "Initializing a V1 LLM engine"
    model_name: str | None = None
    known: dict[str, Known[Any]] = field(default_factory=dict)  # max_num_seqs, max_num_batched_tokens, ...
    kv_size: dict[int | None, Known[int]] = field(default_factory=dict)  # per DP rank (None: not tagged)
    concurrency: dict[int | None, Known[tuple[int, float]]] = field(default_factory=dict)  # (max_model_len, x)
    blocks: dict[int | None, Known[int]] = field(default_factory=dict)
    start_line: int | None = None

    def get(self, key: str):
        k = self.known.get(key)
        return None if k is None else k.value

    def put(self, key: str, value, line: int, how: str, overwrite: bool = True) -> None:
        if value is None or (not overwrite and key in self.known):
            return
        if key not in self.known and len(self.known) >= MAX_KEYS:
            return  # a hostile log's endless argument names must not grow memory
        self.known[key] = Known(value, line, how)

    def _per_rank(self, table: dict[int | None, Known[T]], rank: int | None) -> Known[T] | None:
        if rank in table:
            return table[rank]
        if None in table:
            return table[None]
        return next(iter(table.values()), None)

    def max_model_len(self, rank: int | None = None) -> Known[Any] | None:
        c = self._per_rank(self.concurrency, rank)
        if c is not None:
            return Known(c.value[0], c.line, c.how)
        for key in ("max_model_len", "max_seq_len"):
            if key in self.known:
                return self.known[key]
        return None

    def cache(self, rank: int | None) -> tuple[CacheConfig, Known[Any] | None, str | None]:
        """The engine's cache config, the line its capacity came from, and how it was worked out."""
        size = self._per_rank(self.kv_size, rank)
        conc = self._per_rank(self.concurrency, rank)
        blocks = self._per_rank(self.blocks, rank)
        block_size = self.get("block_size")
        num_blocks = blocks.value if blocks else None
        cap_from: Known[Any] | None  # Known[int] or the concurrency line's Known[tuple[int, float]]
        cap_from, how = None, None
        kv_tokens = None
        if size is not None:
            kv_tokens, cap_from, how = size.value, size, "KV cache size line"
        elif num_blocks and block_size:
            cap_from, how = blocks, f"{num_blocks} blocks x block_size {block_size}"
        elif num_blocks and conc is not None:
            # V0 prints blocks and the concurrency (blocks x block_size / max_model_len): recover block_size.
            est = conc.value[1] * conc.value[0] / num_blocks
            if est > 0:
                block_size = 2 ** round(math.log2(est))
                cap_from, how = blocks, f"{num_blocks} blocks x block_size {block_size} (from the concurrency line)"
        elif conc is not None:
            kv_tokens = round(conc.value[1] * conc.value[0])
            cap_from, how = conc, "max_model_len x maximum concurrency (+/- 0.5%)"
        memory_bytes = self.get("kv_cache_memory_bytes")
        util = self.get("gpu_memory_utilization")
        prefix = self.get("enable_prefix_caching")
        cfg = CacheConfig(
            block_size=int(block_size) if block_size else None,
            num_gpu_blocks=int(num_blocks) if num_blocks else None,
            kv_cache_size_tokens=int(kv_tokens) if kv_tokens else None,
            kv_cache_max_concurrency=float(conc.value[1]) if conc is not None else None,
            cache_dtype=str(self.get("kv_cache_dtype")) if self.get("kv_cache_dtype") is not None else None,
            enable_prefix_caching=prefix if isinstance(prefix, bool) else None,
            gpu_memory_utilization=float(util) if isinstance(util, (int, float)) else None,
            kv_cache_memory_bytes=int(memory_bytes) if isinstance(memory_bytes, int) else None,
        )
        return cfg, cap_from, how


@dataclass(slots=True)
class RecordResult:
    record: StatsRecord
    diagnosis: Diagnosis
    interval: float
    t: float
    preemptions: int | None  # in this record's interval, as far as the log tells
    notes: list[str]  # what the log said that the core does not phrase, and what it could not say

    def as_dict(self) -> dict:
        r, d = self.record, self.diagnosis
        out = {
            "line": r.line,
            "engine": r.engine,
            "time": r.clock,
            "format": r.fmt,
            "prompt_tokens_per_second": r.prompt_tokens_per_second,
            "generation_tokens_per_second": r.generation_tokens_per_second,
            "requests_running": r.requests_running,
            "requests_waiting": r.requests_waiting,
            "requests_swapped": r.requests_swapped,
            "requests_deferred": r.requests_deferred,
            "kv_cache_usage_ratio": None if r.kv_cache_usage_ratio is None else round(r.kv_cache_usage_ratio, 4),
            "prefix_cache_hit_ratio": None if r.prefix_cache_hit_ratio is None else round(r.prefix_cache_hit_ratio, 4),
            "preemptions": self.preemptions,
            "bottleneck": d.bottleneck,
            "confidence": d.confidence,
            "confidence_reason": d.confidence_reason,
            "kv_cache_pressure": d.kv_pressure,
            "recommendations": [{"action": x.action, "why": x.why} for x in d.recommendations],
            "evidence": list(d.evidence),
            "notes": list(self.notes),
            "max_num_seqs": None
            if d.max_num_seqs is None
            else {"value": d.max_num_seqs[0], "source": d.max_num_seqs[1]},
            "max_num_batched_tokens": None
            if d.max_num_batched_tokens is None
            else {"value": d.max_num_batched_tokens[0], "source": d.max_num_batched_tokens[1]},
        }
        if r.kv_fetch is not None:
            out["kv_fetch"] = dict(
                zip(("waiting_to_start", "in_progress", "completed_waiting"), r.kv_fetch, strict=False)
            )
        return out


@dataclass
class _Engine:
    history: EngineHistory
    prompt: float = 0.0
    generation: float = 0.0
    steps: float = 0.0
    step_tokens: float = 0.0
    has_steps: bool = False
    steps_at_last: float = 0.0
    step_tokens_at_last: float = 0.0
    last_t: float | None = None
    gaps: list[float] = field(default_factory=list)
    v0_counter_at_last: int = 0


def _fmt_int(n) -> str:
    return f"{int(n):,}"


class LogAnalyzer:
    """Feed events and records in log order; each record comes back diagnosed."""

    KEPT_RUNS = 6  # server runs whose start is remembered (the report names five, then the last)
    MAX_ENGINES = 1024  # engines with a history of their own; later ones share one (a hostile log)

    def __init__(self, hints: Hints = Hints(), thresholds: Thresholds = Thresholds(), keep_results: bool = True):
        self.cli_hints = hints
        # A stats line stands for 10 s, far longer than the step by which KV usage lags admission:
        # one line with a queue is enough to name a limit, and two lines at Running's maximum are a plateau
        # (the history holds three).
        self.thresholds = replace(thresholds, min_queue_samples=1, plateau_samples=2)
        self.config = ServerConfig()
        self.configs: list[ServerConfig] = [self.config]  # the first KEPT_RUNS server runs (and self.config, the last)
        self.runs = 1  # server runs seen (a start-up after records begins a new one)
        self.engines: dict[str, _Engine] = {}
        self.records_since_start = 0
        self.v0_counter = 0  # highest total_num_cumulative_preemption seen since the server started
        self.v0_counter_line = 0
        self.v0_swap_preemption = False
        # Sleeping tags by data-parallel rank (None: a line with no EngineCore_DP prefix, every engine), from the
        # executor's sleep / wake-up lines: asleep until every tag is woken (vLLM resumes scheduling only then).
        self.sleeping: dict[int | None, frozenset[str]] = {}
        self.clock: str | None = None  # "collector" or "vllm": which timestamps this log's records carry
        self.keep_results = keep_results
        self.results: list[RecordResult] = []  # every record's result, if keep_results (a library caller's)

    # ------------------------------------------------------------------ events

    def event(self, ev: Event) -> None:
        if ev.kind in ("config", "nondefault", "namespace", "api_version") and self.records_since_start:
            self._restart(ev.line)
        c = self.config
        if c.start_line is None and ev.kind in ("config", "nondefault", "namespace", "api_version"):
            c.start_line = ev.line
        d = ev.data
        if ev.kind == "config":
            c.engine_version = d.get("engine_version") or "0"
            c.version = d.get("version") or c.version
        elif ev.kind == "api_version":
            c.version = c.version or d["version"]
        elif ev.kind in ("nondefault", "namespace"):
            how = "start-up arguments"
            for key, value in d.items():
                if key in ("served_model_name", "model"):
                    name = value[0] if isinstance(value, list) and value else value
                    if isinstance(name, str) and (key == "served_model_name" or c.model_name is None):
                        c.model_name = name
                    continue
                c.put(key, value, ev.line, how)
        elif ev.kind == "config_key":
            ((key, value),) = d.items()
            if key == "served_model_name":
                c.model_name = value
            elif key == "max_seq_len":
                c.put("max_seq_len", int(value), ev.line, "engine config", overwrite=False)
            elif key == "enable_prefix_caching":
                c.put("enable_prefix_caching", value == "True", ev.line, "engine config")
            elif key == "kv_cache_dtype":
                c.put("kv_cache_dtype", value, ev.line, "engine config")
        elif ev.kind == "chunked":
            c.put("max_num_batched_tokens", d["max_num_batched_tokens"], ev.line, "the scheduler's start-up line")
        elif ev.kind == "defaulting":
            for key, value in d.items():
                c.put(key, value, ev.line, "vLLM's default for this usage context", overwrite=False)
        elif ev.kind == "kv_size":
            _put_rank(c.kv_size, ev.dp_rank, Known(d["tokens"], ev.line, f"{d['device'] or 'GPU'} KV cache size line"))
        elif ev.kind == "concurrency":
            _put_rank(
                c.concurrency, ev.dp_rank, Known((d["max_model_len"], d["concurrency"]), ev.line, "concurrency line")
            )
        elif ev.kind in ("blocks", "override_blocks"):
            _put_rank(c.blocks, ev.dp_rank, Known(d["num_gpu_blocks"], ev.line, "blocks line"))
        elif ev.kind == "num_gpu_blocks":
            rank = int(d["engine"]) if d.get("engine") else ev.dp_rank
            _put_rank(c.blocks, rank, Known(d["num_gpu_blocks"], ev.line, "num_gpu_blocks line"))
        elif ev.kind == "preemption":
            if d["counter"] > self.v0_counter:
                self.v0_counter, self.v0_counter_line = d["counter"], ev.line
            if d.get("mode") == "SWAP":
                self.v0_swap_preemption = True
        elif ev.kind in ("sleep", "wake"):
            self._sleep_event(ev)
        elif ev.kind == "iteration":
            key = d["engine"] if d.get("engine") is not None else "000"
            e = self._engine(key)
            e.steps += 1
            e.step_tokens += d["context_tokens"] + d["generation_tokens"]
            e.has_steps = True

    @property
    def runs_started(self) -> int:
        """Server runs whose start-up lines were seen (the first run's may precede the log)."""
        return self.runs - (1 if self.configs[0].start_line is None else 0)

    def _restart(self, line: int) -> None:
        self.config = ServerConfig(start_line=line)
        self.runs += 1
        if len(self.configs) < self.KEPT_RUNS:
            self.configs.append(self.config)
        self.engines = {}
        self.records_since_start = 0
        self.v0_counter = 0
        self.v0_swap_preemption = False
        self.sleeping = {}

    def _engine(self, key: str) -> _Engine:
        e = self.engines.get(key)
        if e is None:
            if len(self.engines) >= self.MAX_ENGINES:
                key = OVERFLOW  # endless engine numbers must not grow memory: the rest share one history
                e = self.engines.get(key)
            if e is None:
                e = self.engines[key] = self._new_engine(key)
        return e

    def _new_engine(self, key: str) -> _Engine:
        return _Engine(
            EngineHistory(self.config.model_name or "unknown", key, keep_seconds=math.inf, max_points=RECENT)
        )

    # ------------------------------------------------------------------ records

    def _time(self, rec: StatsRecord, e: _Engine, typical: float) -> float:
        if self.clock is None:
            # vLLM's own header time belongs to the record even when records are glued to other lines;
            # a collector's time is per physical line. One clock for the whole log: they differ in zone.
            self.clock = (
                "vllm" if rec.vllm_time is not None else ("collector" if rec.collector_time is not None else "none")
            )
        t = rec.collector_time if self.clock == "collector" else rec.vllm_time if self.clock == "vllm" else None
        if t is not None and e.last_t is not None and self.clock == "vllm":
            while t < e.last_t - 86400:  # vLLM prints no year: a log across New Year
                t += 365 * 86400
        if t is None or (e.last_t is not None and t <= e.last_t - 1):
            t = (e.last_t + typical) if e.last_t is not None else 0.0
        return t

    def record(self, rec: StatsRecord) -> RecordResult:
        c = self.config
        self.records_since_start += 1
        e = self._engine(rec.engine)
        e.history.model_name = c.model_name or e.history.model_name
        t, interval, typical = self._timing(rec, e)
        e.prompt += rec.prompt_tokens_per_second * interval
        e.generation += rec.generation_tokens_per_second * interval
        rank = int(rec.engine) if rec.engine.isdigit() and rec.fmt == "v1" else None
        cache, cap_from, cap_how = c.cache(rank)
        e.history.add(t, self._snapshot(rec, e, cache))
        preemptions = self._preemptions(rec, e)
        # Up to RECENT records, and none from before an idle gap longer than two intervals.
        window = (RECENT - 0.5) * max(typical, interval)
        s = summarize(e.history, t, window_seconds=window, measured=self._measured(rec, e, interval, preemptions))
        assert s is not None  # the point just added at t is in the window
        hints = self._hints(rec)
        d = diagnose_engine(s, hints, self.thresholds)
        notes = self._notes(rec, d, hints, preemptions, interval, cap_from, cap_how, e)
        res = RecordResult(rec, d, interval, t, preemptions, notes)
        if self.keep_results:
            self.results.append(res)
        return res

    def _timing(self, rec: StatsRecord, e: _Engine) -> tuple[float, float, float]:
        """The record's time, the interval its averages cover, and this engine's typical interval."""
        default = V0_INTERVAL if rec.fmt == "v0" else V1_INTERVAL
        typical = statistics.median(e.gaps) if e.gaps else default
        t = self._time(rec, e, typical)
        gap = None if e.last_t is None else t - e.last_t
        if gap is not None and 0 < gap <= 120:
            e.gaps.append(gap)
            e.gaps = e.gaps[-20:]
        if rec.fmt == "v0":
            interval = gap if gap and gap > 0 else typical  # V0's averages run since its last line
        else:
            interval = gap if gap and 0 < gap < 1.5 * typical else typical  # V1's, over one timer tick
        e.last_t = t
        return t, interval, typical

    def _sleep_event(self, ev: Event) -> None:
        if ev.kind == "sleep":
            self.sleeping[ev.dp_rank] = VLLM_SLEEP_TAGS
        else:
            woken, tags = ev.data["tags"], self.sleeping.get(ev.dp_rank, frozenset())
            self.sleeping[ev.dp_rank] = frozenset() if woken is None else tags - woken

    def _asleep(self, engine: str) -> bool:
        """The engine's executor fell asleep and has not woken every tag since (its rank's lines, else the
        unprefixed ones)."""
        rank = int(engine) if engine.isdigit() else None
        tags = self.sleeping.get(rank) if rank in self.sleeping else self.sleeping.get(None)
        return bool(tags)

    def _snapshot(self, rec: StatsRecord, e: _Engine, cache) -> EngineSnapshot:
        """The record as the core's snapshot: its instants as gauges, its averages summed into counters."""
        gauges: dict[str, float] = {
            Gauge.REQUESTS_RUNNING: float(rec.requests_running),
            Gauge.REQUESTS_WAITING: float(rec.requests_waiting),
        }
        if rec.kv_cache_usage_ratio is not None:
            gauges[Gauge.KV_CACHE_USAGE_RATIO] = rec.kv_cache_usage_ratio
        if rec.requests_swapped is not None:
            gauges[Gauge.REQUESTS_SWAPPED] = float(rec.requests_swapped)
        if rec.requests_deferred is not None:
            gauges[Gauge.REQUESTS_WAITING_DEFERRED] = float(rec.requests_deferred)
        if rec.kv_fetch is not None:  # the /metrics gauges (vLLM: num_requests_kv_fetch_by_stage)
            gauges.update((kv_fetch_gauge(k), float(v)) for k, v in zip(KV_FETCH_STAGES, rec.kv_fetch, strict=True))
        counters: dict[str, float] = {Counter.PROMPT_TOKENS: e.prompt, Counter.GENERATION_TOKENS: e.generation}
        snap = EngineSnapshot(e.history.model_name, rec.engine, gauges=gauges, counters=counters, cache=cache)
        if self._asleep(rec.engine):
            snap.sleep_level = SLEEP_LEVEL_UNKNOWN
        return snap

    def _preemptions(self, rec: StatsRecord, e: _Engine) -> int | None:
        """Preemptions in this record's interval, as far as the log tells (None: unknown)."""
        if rec.fmt == "v1":
            return rec.preemptions
        if rec.fmt == "v0" and self.v0_counter > e.v0_counter_at_last:
            n = self.v0_counter - e.v0_counter_at_last
            e.v0_counter_at_last = self.v0_counter
            return n
        return None

    def _measured(self, rec: StatsRecord, e: _Engine, interval: float, preemptions: int | None) -> Measured:
        """The record's own 10 s averages (and the iteration-detail lines since this engine's last record),
        not rates of the history's counters."""
        total_steps, total_tokens = self._step_totals(rec, e)
        steps = total_steps - e.steps_at_last
        step_tokens = total_tokens - e.step_tokens_at_last
        e.steps_at_last, e.step_tokens_at_last = total_steps, total_tokens
        return Measured(
            prompt_tokens_per_second=rec.prompt_tokens_per_second,
            generation_tokens_per_second=rec.generation_tokens_per_second,
            preemptions_per_second=None if preemptions is None else preemptions / interval,
            prefix_cache_hit_ratio=rec.prefix_cache_hit_ratio,
            engine_step_tokens=step_tokens / steps if steps > 0 else None,
            steps_per_second=steps / interval if steps > 0 else None,
            log_averages=True,
        )

    def _step_totals(self, rec: StatsRecord, e: _Engine) -> tuple[float, float]:
        """Steps and their tokens from the iteration-detail lines so far: this engine's, or with
        --aggregate-engine-logging every engine's (vLLM prefixes each step line with its own engine,
        loggers.py _log_iteration_details, while the stats line sums them)."""
        if rec.engine != "aggregated":
            return e.steps, e.step_tokens
        per = [x for key, x in self.engines.items() if key.isdigit()]
        return sum(x.steps for x in per), sum(x.step_tokens for x in per)

    def _hints(self, rec: StatsRecord) -> Hints:
        c, cli = self.config, self.cli_hints
        seqs = cli.max_num_seqs or c.get("max_num_seqs")
        budget = cli.max_num_batched_tokens or c.get("max_num_batched_tokens")
        known_mml = c.max_model_len()
        mml = cli.max_model_len or (known_mml.value if known_mml else None)
        if rec.aggregated_engines and seqs:
            seqs = int(seqs) * rec.aggregated_engines  # Running and Waiting are summed over the engines
        return Hints(
            max_num_seqs=int(seqs) if seqs else None,
            max_num_batched_tokens=int(budget) if budget else None,
            max_model_len=int(mml) if mml else None,
        )

    def hint_source(self, key: str) -> str | None:
        """Where a hint came from, for people: 'the command line' or 'line 12, start-up arguments'."""
        if getattr(self.cli_hints, key):
            return "the command line"
        k = self.config.known.get(key)
        if key == "max_model_len" and k is None:
            k = self.config.max_model_len()
        return None if k is None else f"line {k.line}, {k.how}"

    def _notes(self, rec, d: Diagnosis, hints: Hints, preemptions, interval, cap_from, cap_how, e) -> list[str]:
        """What the log said that the core does not phrase, and what it could not say."""
        notes = self._kv_notes(rec, d, preemptions, cap_from, cap_how) if d.bottleneck == Bottleneck.KV_CACHE else []
        notes += self._limit_notes(rec, d, hints)
        notes += self._unseen_notes(rec, d, hints, interval)
        return notes

    def _kv_notes(self, rec, d: Diagnosis, preemptions, cap_from, cap_how) -> list[str]:
        """Where the KV capacity came from, and what the log says (or not) of preemptions."""
        notes: list[str] = []
        s = d.signals
        if s.capacity.capacity_tokens:
            notes.append(
                f"KV capacity {_fmt_int(s.capacity.capacity_tokens)} tokens from line {cap_from.line} ({cap_how})"
            )
        else:
            notes.append(
                "KV capacity in tokens unknown: the log has no start-up capacity line "
                "(KV cache size / # GPU blocks / Maximum concurrency)"
            )
        if preemptions is None:
            if rec.fmt == "v1":
                notes.append(
                    "preemptions unknown for this interval: vLLM V1 prints 'Preemptions: N' only when it "
                    "counted some, and not every release prints it"
                )
            else:
                notes.append(
                    "no preemption warning in this interval (vLLM V0 warns only at the 1st, 51st, 101st ... preemption)"
                )
        if rec.fmt == "v0" and preemptions:
            notes.append(
                f"preemptions from vLLM's warning total_num_cumulative_preemption={self.v0_counter} "
                f"(line {self.v0_counter_line}); V0 warns at the 1st, 51st, 101st ... preemption, so the "
                "count since the previous warning is put in this interval"
            )
        if rec.fmt == "v0" and self.v0_swap_preemption:
            notes.append("vLLM warned of preemption by SWAP: requests were moved to CPU swap space")
        return notes

    def _limit_notes(self, rec, d: Diagnosis, hints: Hints) -> list[str]:
        """KV transfer in flight, and where a named limit's value came from."""
        notes: list[str] = []
        s = d.signals
        if rec.kv_fetch is not None and any(rec.kv_fetch):
            a, b, c3 = rec.kv_fetch
            notes.append(
                f"KV fetch: {a} waiting to start, {b} in progress, {c3} completed waiting "
                "(requests waiting on remote KV transfer, not on this engine's limits)"
            )
        if d.bottleneck in (Bottleneck.KV_CACHE, Bottleneck.MAX_NUM_SEQS) and s.capacity.mean_sequence_tokens is None:
            notes.append(
                "sequence lengths are not in the log: how many sequences the KV cache holds, and so "
                "how far max_num_seqs or max_model_len could move, cannot be estimated"
            )
        if d.bottleneck == Bottleneck.MAX_NUM_SEQS and d.max_num_seqs and d.max_num_seqs[1] == Source.CONFIGURED:
            src = self.hint_source("max_num_seqs")
            if rec.aggregated_engines:
                per = d.max_num_seqs[0] // rec.aggregated_engines
                notes.append(
                    f"Running and Waiting are summed over {rec.aggregated_engines} engines "
                    f"(--aggregate-engine-logging): max_num_seqs={per} per engine from {src}, "
                    f"{d.max_num_seqs[0]} in all"
                )
            elif src:
                notes.append(f"max_num_seqs={d.max_num_seqs[0]} from {src}")
        if d.bottleneck == Bottleneck.MAX_NUM_SEQS and d.max_num_seqs and d.max_num_seqs[1] == Source.INFERRED:
            notes.append(
                "the log shows no --max-num-seqs (no start-up arguments, or it was left at its default): "
                "inferred from Running; pass --max-num-seqs to confirm"
            )
        if d.bottleneck == Bottleneck.TOKEN_BUDGET and hints.max_num_batched_tokens and s.throughput.engine_step_tokens:
            src = self.hint_source("max_num_batched_tokens")
            notes.append(
                f"tokens per step from vLLM's iteration-detail lines; max_num_batched_tokens="
                f"{hints.max_num_batched_tokens} from {src}"
            )
        return notes

    def _unseen_notes(self, rec, d: Diagnosis, hints: Hints, interval) -> list[str]:
        """What a 10 s average cannot show: steps, queues inside one interval, V0 swap space."""
        notes: list[str] = []
        s = d.signals
        waiting = rec.requests_waiting
        busy = rec.prompt_tokens_per_second > 0 or rec.generation_tokens_per_second > 0
        if (
            waiting > 0
            and d.bottleneck in (Bottleneck.NONE, Bottleneck.UNDETERMINED)
            and s.throughput.engine_step_tokens is None
            and (rec.requests_deferred or 0) < waiting
        ):
            budget = hints.max_num_batched_tokens
            notes.append(
                "the log has no tokens per engine step, so whether max_num_batched_tokens"
                + (f"={budget}" if budget else "")
                + " holds requests back cannot be seen (vLLM prints steps with --enable-logging-iteration-details)"
            )
        if waiting == 0 and rec.requests_running == 0 and busy:
            total = rec.prompt_tokens_per_second + rec.generation_tokens_per_second
            share = rec.prompt_tokens_per_second / total if total else 0.0
            text = (
                f"the {rec.prompt_tokens_per_second:g} prompt + {rec.generation_tokens_per_second:g} generation "
                f"tokens/s of this ~{interval:.0f} s interval were served and finished between two stats lines: "
                "a queue inside the interval does not show in the log"
            )
            budget, budget_src = hints.max_num_batched_tokens, self.hint_source("max_num_batched_tokens")
            mml = hints.max_model_len
            if budget and share >= 0.9 and mml and budget < mml:
                text += (
                    f"; {share:.0%} of those tokens were prefill and max_num_batched_tokens={budget} (from {budget_src}) "
                    f"is below max_model_len={mml}, so a long prompt needs {math.ceil(mml / budget)}+ steps to "
                    "prefill: if requests queued in that burst, the budget is the likely limit"
                )
            notes.append(text)
        if rec.fmt == "v0" and rec.requests_swapped:
            notes.append(
                f"{rec.requests_swapped} requests in CPU swap space"
                + (f" (CPU swap {rec.cpu_swap_usage_ratio:.0%} used)" if rec.cpu_swap_usage_ratio is not None else "")
            )
        return notes

    # ------------------------------------------------------------------ for the report

    def limits(self) -> list[str]:
        """What this log could not tell, for the whole run."""
        out = []
        c = self.config
        if not c.kv_size and not c.blocks and not c.concurrency:
            out.append(
                "KV capacity in tokens: no start-up line (KV cache size / # GPU blocks / Maximum "
                "concurrency) in the log, so free KV is known only as a percentage"
            )
        for key, flag in (("max_num_seqs", "--max-num-seqs"), ("max_num_batched_tokens", "--max-num-batched-tokens")):
            if not getattr(self.cli_hints, key) and c.get(key) is None:
                out.append(f"{key}: not in the log's start-up lines and not given ({flag})")
        if not any(e.has_steps for e in self.engines.values()):
            out.append(
                "tokens per engine step: stats lines do not carry them, so a binding max_num_batched_tokens "
                "is inferred only from prefill steady at its maximum while requests wait with KV and sequence "
                "room, confidence low (vLLM logs steps with --enable-logging-iteration-details)"
            )
        out.append("sequence lengths: not in stats lines, so the KV cache's capacity in sequences is not estimated")
        out.append(
            "throughput is averaged over each logging interval (10 s by default); Running, Waiting and KV "
            "usage are instants, so a burst that starts and ends between two lines leaves no queue in the log"
        )
        return out

    def describe_config(self) -> list[str]:
        c = self.config
        parts = []
        if c.version or c.engine_version:
            eng = f"V{c.engine_version} engine" if c.engine_version else None
            parts.append("vLLM " + " ".join(x for x in (c.version, f"({eng})" if eng else None) if x))
        if c.model_name:
            parts.append(f"model {c.model_name!r}")
        head = ", ".join(parts)
        lines = [head] if head else []
        facts = []
        cache, cap_from, how = c.cache(None)
        if cache.capacity_tokens:
            assert cap_from is not None  # c.cache() names the line of any capacity it found
            facts.append(f"KV cache {_fmt_int(cache.capacity_tokens)} tokens (line {cap_from.line}, {how})")
        mml = c.max_model_len()
        if self.cli_hints.max_model_len:
            facts.append(f"max_model_len {_fmt_int(self.cli_hints.max_model_len)} (command line)")
        elif mml:
            facts.append(f"max_model_len {_fmt_int(mml.value)} (line {mml.line})")
        for key in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self.cli_hints, key) or c.get(key)
            facts.append(f"{key} {v} ({self.hint_source(key)})" if v else f"{key} unknown")
        if cache.cache_dtype:
            facts.append(f"kv_cache_dtype {cache.cache_dtype}")
        if cache.enable_prefix_caching is not None:
            facts.append(f"prefix caching {'on' if cache.enable_prefix_caching else 'off'}")
        if facts:
            lines.append("; ".join(facts))
        return lines
