"""The engine contract's data: one typed snapshot per engine instance, the only thing an adapter fills and the only
thing ``window`` and ``diagnose`` read.

Every engine adapter (``kvwatch/engines/<engine>.py``) and the log reader (``kvwatch/logs``) map what their engine
exports onto these fields; nothing downstream knows an engine's own family names. The keys are ``StrEnum`` members:
a typo is an ``AttributeError`` at import, not a silent ``None`` that makes the rules answer "none"
(tests/test_code_shape.py refuses a bare string key). They stay strings underneath, so recordings and the history's
JSON keep their names.

A snapshot is sparse: an engine fills what it exports (llama.cpp has no KV gauge in current builds, SGLang no
per-step histogram), and every rule reads a missing key as unknown, never as zero.

An engine may also serve a second path beside ``/metrics`` (llama.cpp's ``/slots``, kvwatch.engines.ExtraSource): its
adapter turns that body into the same snapshot, here ``slots`` (each sequence slot's own context) and
``Gauge.CONTEXT_USED_MAX_RATIO``; without it (not served, failed) they are simply absent.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "CacheConfig",
    "Counter",
    "EngineSnapshot",
    "Gauge",
    "Hist",
    "Histogram",
    "KV_FETCH_STAGES",
    "MAX_LABEL_CHARS",
    "MAX_REJECTION_REASONS",
    "OVERFLOW",
    "REJECTIONS",
    "SLEEP_LEVEL_UNKNOWN",
    "SlotContext",
    "kv_fetch_gauge",
    "rejection_counter",
    "short_label",
]


class Gauge(StrEnum):
    """Instantaneous values, as of the scrape (or the log record)."""

    KV_CACHE_USAGE_RATIO = "kv_cache_usage_ratio"  # 0-1: KV blocks (or tokens) in use over the pool
    REQUESTS_RUNNING = "requests_running"  # requests in the running batch (slots busy)
    REQUESTS_WAITING = "requests_waiting"  # the whole queue, deferred included
    REQUESTS_WAITING_CAPACITY = "requests_waiting_capacity"  # the part waiting for capacity (vLLM 0.12+)
    REQUESTS_WAITING_DEFERRED = "requests_waiting_deferred"  # the part held by transient constraints (LoRA budget)
    REQUESTS_SWAPPED = "requests_swapped"  # vLLM V0's swapped-out requests
    PREFIX_CACHE_HIT_RATE = "prefix_cache_hit_rate"  # 0-1, where an engine exports a ratio, not counters
    KV_FETCH_WAITING_TO_START = "kv_fetch_waiting_to_start"  # requests: a P/D decode engine's KV load stages
    KV_FETCH_IN_PROGRESS = "kv_fetch_in_progress"
    KV_FETCH_COMPLETED_WAITING = "kv_fetch_completed_waiting"
    KV_OFFLOAD_PINNED_RATIO = "kv_offload_pinned_ratio"  # 0-1: the CPU KV tier's share pinned by transfers
    # 0-1: the fullest running request's tokens (prompt + generated so far) over the context its slot may hold
    # (llama.cpp's /slots: n_prompt_tokens / n_ctx of the slots processing; 0 with none processing)
    CONTEXT_USED_MAX_RATIO = "context_used_max_ratio"


class Counter(StrEnum):
    """Cumulative counts since the engine started (a decrease is a restart: ``window`` corrects it)."""

    PREEMPTIONS = "preemptions"  # requests preempted (SGLang: retracted)
    PROMPT_TOKENS = "prompt_tokens"  # prompt tokens processed, cached ones included
    PROMPT_TOKENS_COMPUTED = "prompt_tokens_computed"  # prompt tokens actually prefilled
    PROMPT_TOKENS_EXTERNAL = "prompt_tokens_external"  # prompt tokens whose KV came over KV transfer
    GENERATION_TOKENS = "generation_tokens"
    PREFIX_CACHE_QUERIES = "prefix_cache_queries"  # tokens looked up in the prefix cache
    PREFIX_CACHE_HITS = "prefix_cache_hits"  # ... and found
    REQUESTS_FINISHED = "requests_finished"
    KV_OFFLOAD_STORES_SKIPPED = "kv_offload_stores_skipped"
    ENGINE_STEPS = "engine_steps"  # forward passes (llama.cpp's n_decode_total): moves while tokens flow


class Hist(StrEnum):
    """Cumulative histograms (bounds ascending, the last +Inf)."""

    ITERATION_TOKENS = "iteration_tokens"  # tokens per engine step
    REQUEST_PROMPT_TOKENS = "request_prompt_tokens"
    REQUEST_GENERATION_TOKENS = "request_generation_tokens"
    TIME_TO_FIRST_TOKEN_SECONDS = "time_to_first_token_seconds"
    INTER_TOKEN_LATENCY_SECONDS = "inter_token_latency_seconds"
    QUEUE_TIME_SECONDS = "queue_time_seconds"


# vLLM 0.33's KV load stages (v1/metrics/stats.py), the stage label of kvwatch_kv_fetch_requests.
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")


def kv_fetch_gauge(stage: str) -> Gauge:
    return Gauge("kv_fetch_" + stage)


# The frontend's admission rejections, one counter per reason: REJECTIONS + reason. Reasons are the engine's own
# words, so these are the snapshot's only keys not in the enums above; MAX_REJECTION_REASONS bounds them.
REJECTIONS = "admission_rejections:"
MAX_REJECTION_REASONS = 4


def rejection_counter(reason: str) -> str:
    return REJECTIONS + reason


OVERFLOW = "_overflow"
# model_name / engine values longer than this are shortened before kvwatch keeps or exports them: a hostile or
# broken upstream's 1 MB label would otherwise be copied into every kvwatch series, the JSON API and the page.
# vLLM's model_name is the served name (a Hugging Face id or a path), engine an index: far shorter.
MAX_LABEL_CHARS = 128
_DIGEST_CHARS = 16
# Asleep at a level not known (vLLM's log says it fell asleep, not at which level).
SLEEP_LEVEL_UNKNOWN = -1


def short_label(value: str) -> str:
    """``value`` if at most MAX_LABEL_CHARS long, else its start, "...", and 16 hex digits of its SHA-256: stable
    (the same value, the same label on every scrape) and distinct (two long values sharing a start differ)."""
    if len(value) <= MAX_LABEL_CHARS:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST_CHARS]
    return f"{value[: MAX_LABEL_CHARS - _DIGEST_CHARS - 3]}...{digest}"


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]  # bucket upper bounds, ascending, last is +Inf
    counts: Sequence[float]  # cumulative counts per bound (a list, or an array('d') in the window's history)
    sum: float = 0.0
    count: float = 0.0


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The engine's KV cache as configured (vLLM's cache_config_info; other engines fill what they export)."""

    block_size: int | None = None  # tokens per block
    num_gpu_blocks: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None  # sequences of max_model_len the cache holds
    cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    gpu_memory_utilization: float | None = None  # 0-1
    kv_cache_memory_bytes: int | None = None  # set when --kv-cache-memory-bytes overrides gpu_memory_utilization

    @property
    def capacity_tokens(self) -> int | None:
        if self.kv_cache_size_tokens:
            return self.kv_cache_size_tokens
        if self.num_gpu_blocks and self.block_size:
            return self.num_gpu_blocks * self.block_size
        return None

    @property
    def max_model_len(self) -> int | None:
        """vLLM reports concurrency at max_model_len, so capacity / concurrency recovers it."""
        cap = self.capacity_tokens
        if cap and self.kv_cache_max_concurrency:
            return round(cap / self.kv_cache_max_concurrency)
        return None


@dataclass(frozen=True, slots=True)
class SlotContext:
    """One sequence slot with a context of its own (llama.cpp's ``/slots``, one object a slot): what its request holds
    of it. A slot keeps its last request's figures once it is idle (its KV stays cached for the next prompt)."""

    slot: int  # the slot's id
    n_ctx: int  # tokens: the context the slot's request may fill (llama.cpp: --ctx-size / --parallel, or all of it)
    tokens: int  # tokens its request holds: prompt + generated so far (0: never used, or cleared)
    busy: bool  # a request is processing in it now
    task: int | None  # the request's id, current or last (None: the slot never ran one)
    full: bool  # its request reached the end of the context (the engine's own stop rule: the request is cut short)


@dataclass(slots=True)
class EngineSnapshot:
    """One engine instance at one scrape, keyed by (model_name, engine): vLLM's ``engine``, SGLang's ``dp_rank``."""

    model_name: str
    engine: str
    gauges: dict[str, float] = field(default_factory=dict)  # Gauge -> value
    counters: dict[str, float] = field(default_factory=dict)  # Counter (or a rejection_counter) -> value
    histograms: dict[str, Histogram] = field(default_factory=dict)  # Hist -> histogram
    cache: CacheConfig | None = None
    lora_running: int | None = None  # adapters
    lora_waiting: int | None = None
    max_lora: int | None = None  # LoRA slots per batch
    # 0 awake, 1 weights offloaded, 2 weights discarded (vLLM's engine_sleep_state); SLEEP_LEVEL_UNKNOWN asleep
    sleep_level: int | None = None
    # Configured limits the engine itself exports (TensorRT-LLM's max_num_active_requests, max_num_tokens;
    # llama.cpp's slot count): the rules use them as vLLM's hints are used.
    max_running_requests: int | None = None
    max_step_tokens: int | None = None
    # Its token counters move only when a request finishes (TensorRT-LLM's, SGLang's tokenizer-side ones without
    # realtime_tokens_total, llama.cpp's generated tokens): rates hold over long windows, not step by step, so
    # prefill pace and the throughput gap cannot be read from them.
    tokens_at_request_end: bool = False
    # Each sequence slot's context (an engine's extra path: llama.cpp's /slots), in slot order; None: not read
    slots: tuple[SlotContext, ...] | None = None
    folded: int = 0  # the overflow snapshot: how many (model_name, engine) pairs beyond max_engines it holds
