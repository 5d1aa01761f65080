"""kvwatch's one vocabulary: bottlenecks, actions, KV-pressure states, default thresholds, exported families.

Everything else derives from here: the diagnosis returns these enums, the collector builds these families,
``grafana/`` colours and orders panels by them, ``alerts/generate.py --check`` and ``docs/generate.py --check``
refuse rule files and README tables that disagree with them. Adding a bottleneck is one member here plus its
rule in ``kvwatch/diagnose.py``; a test fails if a bottleneck or action name is spelled as a string literal
anywhere else in ``kvwatch/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "Action",
    "Bottleneck",
    "CAPACITY_LIMITS",
    "Confidence",
    "Family",
    "FAMILIES",
    "FLAG_LIMITS",
    "KvPressure",
    "ReportThresholds",
    "ScrapeReason",
    "Source",
    "Thresholds",
    "family",
    "most_severe",
]


class Bottleneck(StrEnum):
    """Which limit binds an engine, least to most severe: a target's bottleneck is its worst engine's."""

    IDLE = "idle"
    NONE = "none"
    UNDETERMINED = "undetermined"
    ASLEEP = "asleep"
    TOKEN_BUDGET = "token_budget"
    KV_TRANSFER = "kv_transfer"
    MAX_LORAS = "max_loras"
    MAX_NUM_SEQS = "max_num_seqs"
    KV_CACHE = "kv_cache"
    UNREACHABLE = "unreachable"
    STALLED = "stalled"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]

    @property
    def label(self) -> str:
        return _BOTTLENECK_INFO[self][0]

    @property
    def colour(self) -> str:
        """Grafana colour name of the state in every dashboard."""
        return _BOTTLENECK_INFO[self][1]

    @property
    def meaning(self) -> str:
        return _BOTTLENECK_INFO[self][2]


# (label, colour, meaning) of each bottleneck
_BOTTLENECK_INFO: dict[Bottleneck, tuple[str, str, str]] = {
    Bottleneck.IDLE: ("idle", "text", "nothing running or waiting"),
    Bottleneck.NONE: (
        "serving, no queue",
        "green",
        "serving, nothing waits",
    ),
    # Not a limit: it never pages (alerts/generate.py --check), and its confidence is always low.
    Bottleneck.UNDETERMINED: (
        "undetermined",
        "light-blue",
        "requests wait and no limit can be named: too little history (the evidence says what is missing and how "
        "long until kvwatch can tell), a request caught between arrival and admission, arrivals between steps at the "
        "batch's scale, or no limit shows; never pages",
    ),
    Bottleneck.ASLEEP: (
        "asleep",
        "blue",
        "vLLM's engine_sleep_state says the engine sleeps (sleep mode: weights offloaded or discarded): it serves "
        "nothing until woken; never read as stalled",
    ),
    Bottleneck.TOKEN_BUDGET: (
        "token budget",
        "yellow",
        "prefill paces admission: steps full at the per-step token budget, or without step data prompt "
        "throughput steady at its maximum; KV and sequence room to spare",
    ),
    Bottleneck.KV_TRANSFER: (
        "KV transfer",
        "dark-yellow",
        "a P/D decode engine's requests wait for their KV from the prefill side (num_requests_kv_fetch_by_stage): "
        "the prefill engines or the KV connector pace it, not this engine's flags",
    ),
    Bottleneck.MAX_LORAS: (
        "max_loras",
        "light-orange",
        "requests wait for a LoRA slot: the running adapters fill `max_lora` (lora_requests_info) while other "
        "adapters wait, their requests deferred",
    ),
    Bottleneck.MAX_NUM_SEQS: (
        "max_num_seqs",
        "orange",
        "running pinned at the sequence ceiling (configured, or a Running plateau) with KV room to spare",
    ),
    Bottleneck.KV_CACHE: (
        "KV cache",
        "red",
        "requests wait because free KV blocks cannot hold the next prefill: high KV usage, the throughput gap, "
        "preemptions, or less free KV than one running request holds; or (llama.cpp's /slots) requests reach the end "
        "of their slot's context and are cut short",
    ),
    Bottleneck.UNREACHABLE: ("unreachable", "purple", "no successful scrape for `--stale-after` seconds (default 5)"),
    Bottleneck.STALLED: ("stalled", "dark-red", "requests present, no token progress"),
}
_SEVERITY = {b: i for i, b in enumerate(Bottleneck)}


def most_severe(bottlenecks) -> Bottleneck:
    return max((Bottleneck(b) for b in bottlenecks), key=_SEVERITY.__getitem__, default=Bottleneck.IDLE)


class Action(StrEnum):
    """What to change, cheapest first: recommendations are listed in this order."""

    FP8_KV_CACHE = "fp8_kv_cache"
    ENABLE_PREFIX_CACHING = "enable_prefix_caching"
    REDUCE_MAX_MODEL_LEN = "reduce_max_model_len"
    RAISE_GPU_MEMORY_UTILIZATION = "raise_gpu_memory_utilization"
    RAISE_KV_CACHE_MEMORY_BYTES = "raise_kv_cache_memory_bytes"
    RAISE_MAX_NUM_SEQS = "raise_max_num_seqs"
    LOWER_MAX_NUM_SEQS = "lower_max_num_seqs"
    RAISE_MAX_NUM_BATCHED_TOKENS = "raise_max_num_batched_tokens"
    RAISE_MAX_LORAS = "raise_max_loras"
    SCALE_PREFILL_SIDE = "scale_prefill_side"
    ADD_REPLICA = "add_replica"
    RESTART_ENGINE = "restart_engine"

    @property
    def meaning(self) -> str:
        return _ACTION_INFO[self]


# What each action does, in any engine's words; each engine spells the flag its own way (kvwatch/engines).
_ACTION_INFO: dict[Action, str] = {
    Action.FP8_KV_CACHE: "halve the bytes per cached token",
    Action.ENABLE_PREFIX_CACHING: "store shared prompt prefixes once",
    Action.REDUCE_MAX_MODEL_LEN: "stop a few long requests holding most of the KV cache",
    Action.RAISE_GPU_MEMORY_UTILIZATION: "give the KV cache more of the device memory",
    Action.RAISE_KV_CACHE_MEMORY_BYTES: "a larger KV cache where a flag pins its size in bytes",
    Action.RAISE_MAX_NUM_SEQS: "more sequences per step when KV has room",
    Action.LOWER_MAX_NUM_SEQS: "fewer sequences, so each has room to grow (no preemption)",
    Action.RAISE_MAX_NUM_BATCHED_TOKENS: "a larger per-step budget admits prefills faster",
    Action.RAISE_MAX_LORAS: "more LoRA slots per batch; each reserves GPU memory for an adapter",
    Action.SCALE_PREFILL_SIDE: "remote KV arrives slower than the decode engine takes it: more prefill engines, "
    "or a faster connector path",
    Action.ADD_REPLICA: "another engine: more KV cache and compute, another GPU",
    Action.RESTART_ENGINE: "the engine makes no progress although it has work",
}


class KvPressure(StrEnum):
    """KV usage against the two thresholds (``kvwatch_kv_cache_pressure``), least to most severe."""

    OK = "ok"
    ADMISSION_STALL = "admission_stall"
    PREEMPTION_RISK = "preemption_risk"

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")

    @property
    def colour(self) -> str:
        return _PRESSURE_COLOUR[self]


_PRESSURE_COLOUR = {KvPressure.OK: "green", KvPressure.ADMISSION_STALL: "orange", KvPressure.PREEMPTION_RISK: "red"}


class Confidence(StrEnum):
    """How sure a diagnosis is that its bottleneck binds (``kvwatch_diagnosis_confidence``), surest first.
    Every verdict says why in ``confidence_reason``; alerts that page require ``pages``."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"

    @property
    def meaning(self) -> str:
        return _CONFIDENCE_MEANING[self]

    @property
    def pages(self) -> bool:
        """Whether a critical alert may page on a diagnosis this sure (alerts/kvwatch-alerts.yaml)."""
        return self is not Confidence.LOW


_CONFIDENCE_MEANING = {
    Confidence.HIGH: (
        "the limit was seen binding: Running at a configured ceiling, full engine steps counted, KV usage past the "
        "admission threshold, preemptions, a prompt larger than the free KV; or nothing waits"
    ),
    Confidence.MEDIUM: (
        "inferred from a pattern the named limit explains: a Running plateau (ceiling inferred), prefill steady at "
        "its maximum without step data, a budget inferred from the step size, KV room from the prompt's share or from what one request holds"
    ),
    Confidence.LOW: (
        "a likely limit, or undetermined: the pattern rests on a log's 10-s averages or on one sample of a young "
        "queue, the next request is assumed as large as a running one, or requests wait and no limit was identified"
    ),
}


class ScrapeReason(StrEnum):
    """Why a scrape of vLLM failed (``kvwatch_scrape_errors_total{reason}``); kvwatch/scrape.py raises them."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"
    REDIRECT = "redirect"
    HTML = "html"
    TOO_LARGE = "too_large"
    DECODE = "decode"
    PARSE = "parse"
    NO_VLLM_METRICS = "no_vllm_metrics"

    @property
    def meaning(self) -> str:
        return _REASON_MEANING[self]

    @property
    def network(self) -> bool:
        """The network is to blame (refused, reset, DNS, TLS, no answer in time): the only reasons that say
        "unreachable"."""
        return self in (ScrapeReason.CONNECT, ScrapeReason.TIMEOUT)

    @property
    def text(self) -> str:
        """How the CLI, the page and the JSON word it, around the error's ``{detail}``: "unreachable" only
        for the network (connect, timeout, TLS); a wrong address says what came back instead."""
        return _REASON_TEXT[self]


_REASON_TEXT = {
    ScrapeReason.CONNECT: "unreachable: {detail}",
    ScrapeReason.TIMEOUT: "unreachable: {detail}",
    ScrapeReason.HTTP_STATUS: "{detail} — is the path /metrics?",
    ScrapeReason.REDIRECT: "{detail}: point the target at the final URL",
    ScrapeReason.HTML: "an HTML page, not metrics: {detail}",
    ScrapeReason.TOO_LARGE: "too large: {detail} (--max-body-bytes)",
    ScrapeReason.DECODE: "unreadable body: {detail}",
    ScrapeReason.PARSE: "not Prometheus metrics: {detail}",
    ScrapeReason.NO_VLLM_METRICS: "metrics, but none from a serving engine ({detail})",
}
_REASON_MEANING = {
    ScrapeReason.CONNECT: "no connection (refused, reset, DNS, TLS) or the bearer token file unreadable",
    ScrapeReason.TIMEOUT: "no complete response within `--timeout` (connect to last byte: slow, dripping, endless)",
    ScrapeReason.HTTP_STATUS: "an HTTP status other than 200 (and not a redirect)",
    ScrapeReason.REDIRECT: "a 3xx redirect: not followed (point `--target` at the final URL); the error names it",
    ScrapeReason.HTML: "a 200 carrying an HTML page (a login page or a proxy's), not metrics",
    ScrapeReason.TOO_LARGE: "the body exceeds `--max-body-bytes`, counted after decompression (a gzip bomb stops at "
    "the cap)",
    ScrapeReason.DECODE: "not UTF-8, an unsupported or broken Content-Encoding",
    ScrapeReason.PARSE: "not the Prometheus text format (a truncated body, a bad line)",
    ScrapeReason.NO_VLLM_METRICS: "parsed, but no serving engine's series in it (wrong URL, metadata only), or another "
    "engine's than `--engine` names (the label keeps its first name, from when vLLM was the only engine)",
}


class Source(StrEnum):
    """Where a limit's value came from (the ``source`` label)."""

    CONFIGURED = "configured"
    INFERRED = "inferred"


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Every cut-off the rules use, with why. ``Settings.thresholds`` sets the first three from flags."""

    # vLLM's scheduler admits a prefill only if its blocks fit (kv_cache_manager.allocate_slots); our
    # captures stall admission from ~0.9 and preempt from ~0.95 (tests/fixtures/README.md, kv_cache).
    admission_stall: float = 0.90
    preemption_risk: float = 0.95
    # No token progress with requests present for this long = stalled (Settings: max(5 s, 3 intervals)).
    stall_seconds: float = 5.0
    # Samples in a row with a queue before a limit other than KV is named: at 1-s scrapes the first
    # sample of a KV-bound queue often shows KV usage a step behind admission, and Poisson traffic
    # leaves an odd sample with a couple of requests not yet admitted.
    min_queue_samples: int = 2
    # A Running plateau (the inferred max_num_seqs): the latest plateau_samples samples all have a queue, at
    # least plateau_share of them read Running's window maximum (within plateau_tolerance of it), Running
    # neither falls over them nor rises to a new maximum (a rise back to one it held earlier in the same queue
    # is a return from a dip), and requests were admitted meanwhile. Real vLLM's 1-s Running
    # reads a slot or three low while a finished request's successor is not yet counted
    # (max_num_seqs_running_dips: 4 4 3 4 4 1 4 at a ceiling of 4; the simulator's tour 30-32 of 32), so 3
    # of 5 near the maximum is a plateau. 5 samples fit a 10-s window at 1-s scrapes; kvwatch logs use 2
    # records (one stats line stands for 10 s).
    plateau_samples: int = 5
    plateau_share: float = 0.6
    plateau_tolerance: float = 0.1
    # ... or within this many requests of it, whichever is more: at a small ceiling one slot turning over is more
    # than a tenth (real vLLM at --max-num-seqs 4 with 100-200-token outputs read Running 3 in half its 1-s
    # samples with 300 waiting, and 4 in the rest: e2e test_max_num_seqs).
    plateau_slack_requests: float = 1.0
    # Running rises (or falls) when its least-squares change over the samples exceeds the larger of
    # trend_band_requests and plateau_tolerance of its maximum, and the later half's highest and lowest
    # samples are both above the earlier half's (below, for a fall). Those dips move Running by a request
    # or three between samples at any ceiling, and a dip first or last moves only one of the two; a climb
    # (200 230 240 250 256) moves both.
    trend_band_requests: float = 2.0
    # Sequence room without a hint: Running rising while Waiting falls (admission in progress), or Running
    # at its window maximum in at most unpinned_share of the latest plateau_samples (slots stayed free while
    # requests waited, so the ceiling did not hold them back). Between the two shares nothing is named.
    unpinned_share: float = 0.2
    # Prefill-paced admission without step data: prompt throughput over every span of the queue (intervals
    # merged to at least prefill_span_seconds: vLLM counts a prompt whole when its prefill completes, so
    # 1-s intervals of long prompts read 0 or a prompt's worth) at least prefill_steady_share of the
    # spans' maximum, over at least prefill_min_spans spans. The token_budget capture reads 0.81 over
    # 2-s spans, the max_num_seqs capture 0.40 (completions pace it there, in bursts).
    prefill_span_seconds: float = 2.0
    prefill_steady_share: float = 0.7
    prefill_min_spans: int = 2
    # A P/D decode engine is paced by remote KV when at least this share of its queue waits for a KV load to start
    # or finish (num_requests_kv_fetch_by_stage waiting_to_start + in_progress): most of the queue, not a straggler.
    kv_transfer_share: float = 0.5
    # With every LoRA slot taken and adapters waiting, at least this share of the queue deferred (the rest waits
    # a step for the budget right after a slot turns over: the gpu_max_loras preset read 174 of 313 "capacity"
    # for a sample) names max_loras, when KV is also below the admission stall.
    lora_deferred_share: float = 0.5
    # A running request holding this many times the mean sequence's tokens of KV holds pages whatever its length
    # (hybrid models: MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#122, ~90k pool tokens per 2.4k-token request): the
    # next request needs that much free, not its prompt.
    fixed_footprint_ratio: float = 4.0
    # A young queue (fewer samples than a pattern rule needs) already names its likely limit, at low confidence,
    # where one sample shows it: Running at a round number (a multiple of one of round_ceiling_multiples, at least
    # round_ceiling_min: what people pass as --max-num-seqs, 256 and 1024 vLLM's defaults) with KV usage at most
    # guess_kv_room (a quarter of the cache free: a KV-bound ramp reads ~0.88 the record before it preempts,
    # tests/fixtures/logs/v1_dp2_preemptions.log); or prefill filling the steps while Running climbs.
    round_ceiling_min: int = 16
    round_ceiling_multiples: tuple[int, ...] = (16, 50)
    guess_kv_room: float = 0.75
    # A single request caught between arrival and admission is not a queue.
    brief_queue_requests: float = 2.0
    # Nor, at GPU scale, a queue this small a share of Running when no rule above names a limit: ~60 running at
    # 20 requests/s catch 1-2 arrivals between steps in most samples (the gpu_healthy preset's log read
    # token_budget and "no limit identified" on them). Transient waiting is ~step time / request time of
    # Running (~0.5 %): this is ten times that.
    small_queue_share: float = 0.05
    # Steps carrying at least this share of --max-num-batched-tokens are full: chunked prefill fills the
    # budget minus the decodes' tokens (token_budget capture: ~250 of 256).
    full_step_budget_share: float = 0.75
    # Without the budget hint: decoding alone puts about one token per running request in a step, so steps
    # this many times fuller than Running (and at least min_prefill_step_tokens) are prefill chunks.
    prefill_tokens_per_running: float = 8.0
    min_prefill_step_tokens: float = 64.0
    # Running's peak while requests waited at this share of a configured ceiling still names it: real
    # vLLM's 1-s Running samples read low (one request finishing, the next not yet counted).
    near_ceiling_share: float = 0.75
    # Requests seen reaching the end of their slot's own context over the window (llama.cpp's /slots) before that
    # context is named: llama.cpp cuts such a request short (truncated), so one is a request already failed, seen, not
    # inferred.
    context_full_requests: int = 1
    # Advice: raise max_num_seqs toward the KV's concurrency only if it is this much above the ceiling,
    # and suggest this share of it (headroom for longer sequences).
    raise_seqs_margin: float = 1.2
    raise_seqs_target_share: float = 0.9
    # Advice: sequences under this share of max_model_len make a lower limit worth it.
    short_sequence_share: float = 0.25
    # Advice: one running request holding this share of the KV cache while others wait is a sequence the limits
    # let grow too long (intel/llm-scaler#391: Running 1, Waiting 14, KV 76 % and rising for an hour).
    single_request_kv_share: float = 0.5
    # Advice: gpu_memory_utilization below this leaves memory to give the KV cache (activations and
    # CUDA graphs need the rest).
    gpu_memory_utilization_ceiling: float = 0.95


@dataclass(frozen=True, slots=True)
class Family:
    """One exported metric family: what the collector builds and the README documents."""

    name: str
    type: str  # "gauge" or "counter" (exposed with _total)
    labels: tuple[str, ...]
    unit: str  # for people: the README's unit column
    help: str
    signal: str | None = None  # for plain per-engine gauges: the ``Signals`` attribute path it reads
    doc: str | None = None  # the README's meaning, when it says more than the help

    @property
    def sample_name(self) -> str:
        return self.name + "_total" if self.type == "counter" else self.name

    @property
    def meaning(self) -> str:
        if self.doc:
            return self.doc
        h = self.help.rstrip(".")
        return h[0].lower() + h[1:] if h[1:2].islower() else h


ENGINE = ("target", "model_name", "engine")
# The limits kvwatch_capacity_sequences reports (its `limit` label), in kvwatch.capacity.
CAPACITY_LIMITS = (Bottleneck.KV_CACHE, Bottleneck.MAX_NUM_SEQS, Bottleneck.TOKEN_BUDGET, Bottleneck.MAX_LORAS)
# Limits a flag lifts for free (no GPU): what KvwatchScaleOutNotNeeded looks for.
FLAG_LIMITS = (Bottleneck.MAX_NUM_SEQS, Bottleneck.MAX_LORAS)
# vLLM's own sleep tags (vllm/v1/executor/abstract.py SLEEP_TAGS, 0.32), what its log's wake-up lines name: an
# engine is asleep until every one is woken. Spelled here, the one place for names, because vLLM's "kv_cache" tag is
# spelled like kvwatch's bottleneck (it is not that bottleneck).
VLLM_SLEEP_TAGS = frozenset(("weights", "kv_cache"))


def _engine(name: str, unit: str, help_: str, signal: str, doc: str | None = None) -> Family:
    return Family(name, "gauge", ENGINE, unit, help_, signal, doc)


def _states(values) -> str:
    return ", ".join(f"`{v}`" for v in values)


FAMILIES: tuple[Family, ...] = (
    Family("kvwatch_up", "gauge", ("target",), "0/1", "1 if the last scrape of the target succeeded."),
    Family(
        "kvwatch_scrape_duration_seconds", "gauge", ("target",), "s", "Duration of the last scrape (fetch + parse)."
    ),
    Family(
        "kvwatch_scrape_errors",
        "counter",
        ("target", "reason"),
        "errors",
        "Failed scrapes of the target, by reason.",
        doc=f"failed scrapes by `reason`: {_states(ScrapeReason)} (see Faults)",
    ),
    Family(
        "kvwatch_folded_engines",
        "gauge",
        ("target",),
        "engines",
        "(model_name, engine) pairs beyond --max-engines folded into _overflow in the last good scrape.",
        doc="`(model_name, engine)` pairs beyond `--max-engines` in the last good scrape, folded into one "
        '`model_name="_overflow"` engine; 0 normally',
    ),
    Family("kvwatch_build_info", "gauge", ("version",), "1", "kvwatch version."),
    Family(
        "kvwatch_target_info",
        "gauge",
        ("target", "engine_type"),
        "1",
        "The serving engine the target's metrics are read as (always 1).",
        doc="the engine the target is read as (`engine_type`: `vllm`, `sglang`, `trtllm`, `llamacpp`; see Engines), 1; "
        "absent until one is recognised. The only series that names the engine: join on `target` to split any "
        "other family by engine",
    ),
    Family(
        "kvwatch_asyncio_tasks",
        "gauge",
        (),
        "tasks",
        "Asyncio tasks alive in kvwatch's event loop.",
        doc="asyncio tasks alive in kvwatch's event loop: flat over time (one scrape loop per target plus the "
        "requests being served); a climb is a leak (`python -m bench soak` watches it)",
    ),
    Family(
        "kvwatch_target_bottleneck",
        "gauge",
        ("target", "bottleneck"),
        "state set",
        "Most severe bottleneck across the target's engines (state set).",
        doc="the most severe bottleneck across the target's engines; `unreachable` when the target cannot be scraped",
    ),
    _engine(
        "kvwatch_kv_cache_usage_ratio",
        "ratio",
        "Fraction of KV-cache blocks in use (0-1).",
        "kv.usage_ratio",
        "KV-cache blocks in use (vLLM's `kv_cache_usage_perc`, 0–1)",
    ),
    _engine(
        "kvwatch_kv_cache_capacity_tokens",
        "tokens",
        "KV cache size in tokens.",
        "capacity.capacity_tokens",
        "KV cache size in tokens (`kv_cache_size_tokens`, else `num_gpu_blocks × block_size`)",
    ),
    _engine(
        "kvwatch_kv_cache_free_tokens",
        "tokens",
        "KV-cache tokens free: capacity x (1 - usage).",
        "capacity.free_tokens",
        "capacity × (1 − usage)",
    ),
    _engine("kvwatch_requests_running", "requests", "Requests in the running batch.", "queue.running"),
    _engine("kvwatch_requests_waiting", "requests", "Requests in the waiting queue.", "queue.waiting"),
    _engine(
        "kvwatch_prompt_tokens_per_second",
        "tokens/s",
        "Prefill tokens computed per second over the window.",
        "throughput.prompt_tokens_per_second",
        "prefill tokens computed per second over the window (cached prompt tokens excluded when vLLM reports them)",
    ),
    _engine(
        "kvwatch_generation_tokens_per_second",
        "tokens/s",
        "Generated tokens per second over the window.",
        "throughput.generation_tokens_per_second",
    ),
    _engine(
        "kvwatch_preemptions_per_second",
        "1/s",
        "Preemptions per second over the window.",
        "throughput.preemptions_per_second",
    ),
    Family(
        "kvwatch_rejections_per_second",
        "gauge",
        (*ENGINE, "reason"),
        "1/s",
        "Requests vLLM's frontend rejected with HTTP 503 per second over the window, by reason.",
        doc="requests vLLM's frontend answered HTTP 503 per second over the window (`admission_rejections_total`), by "
        "`reason`: `max_num_queued_reqs`, `max_num_queued_tokens`; the model's frontend count, the same on each of its "
        "engines (do not sum over engines)",
    ),
    Family(
        "kvwatch_kv_fetch_requests",
        "gauge",
        (*ENGINE, "stage"),
        "requests",
        "Waiting requests of a P/D decode engine by remote KV load stage.",
        doc="a P/D decode engine's waiting requests by KV load stage (`num_requests_kv_fetch_by_stage`): "
        "`waiting_to_start`, `in_progress`, `completed_waiting`; absent on other engines",
    ),
    _engine(
        "kvwatch_kv_transfer_tokens_per_second",
        "tokens/s",
        "Prompt tokens whose KV arrived over KV transfer per second over the window.",
        "throughput.kv_transfer_tokens_per_second",
        "prompt tokens whose KV came from another instance per second over the window "
        '(`prompt_tokens_by_source{source="external_kv_transfer"}`)',
    ),
    _engine(
        "kvwatch_engine_step_tokens",
        "tokens",
        "Mean of vLLM's tokens-per-engine-step histogram (iteration_tokens_total) over the window; vLLM counts a "
        "chunked prompt whole in the step that finishes it, so a window can read above max_num_batched_tokens.",
        "throughput.engine_step_tokens",
    ),
    _engine(
        "kvwatch_mean_sequence_tokens",
        "tokens",
        "Mean prompt + generation tokens of finished requests.",
        "capacity.mean_sequence_tokens",
        "mean prompt + generation tokens of requests finished in the window",
    ),
    _engine(
        "kvwatch_estimated_max_concurrency",
        "requests",
        "Sequences the KV cache holds at the observed mean length: capacity / mean sequence tokens.",
        "capacity.estimated_max_concurrency",
        "capacity tokens / mean sequence tokens",
    ),
    _engine(
        "kvwatch_concurrency_headroom",
        "requests",
        "Estimated max concurrency minus mean running requests.",
        "capacity.concurrency_headroom",
        "estimated max concurrency − mean running requests",
    ),
    _engine(
        "kvwatch_kv_cache_seconds_to_full",
        "s",
        "Linear forecast of seconds until KV usage reaches 1 (absent when not rising).",
        "kv.seconds_to_full",
        "linear forecast of time until KV usage reaches 1; absent when not rising",
    ),
    _engine(
        "kvwatch_slot_context_used_ratio",
        "ratio",
        "The most of its slot's context a running request held over the window (llama.cpp's /slots).",
        "kv.context_used_max_ratio",
        "the most of its slot's own context a running request held over the window (llama.cpp's `/slots`: "
        "`n_prompt_tokens` / `n_ctx`); 1 is a request cut short; absent where the engine shows no slots",
    ),
    _engine(
        "kvwatch_slot_context_tokens",
        "tokens",
        "Each slot's context in tokens (llama.cpp's /slots n_ctx: --ctx-size / --parallel, or all of it unified).",
        "kv.slot_context_tokens",
        "each slot's context in tokens (llama.cpp's `/slots` `n_ctx`: `--ctx-size` / `--parallel`, or all of "
        "`--ctx-size` with `--kv-unified`), from the last scrape that read `/slots`; absent where the engine shows no slots",
    ),
    _engine(
        "kvwatch_slot_context_full_requests",
        "requests",
        "Requests seen reaching the end of their slot's context over the window: cut short (llama.cpp's /slots).",
        "kv.context_full_requests",
        "requests seen reaching the end of their slot's context over the window, so cut short (a lower bound: a "
        "request that starts and ends between two scrapes is not seen); absent where the engine shows no slots",
    ),
    _engine(
        "kvwatch_prefix_cache_hit_ratio",
        "ratio",
        "Prefix-cache hit tokens / queried tokens over the window.",
        "throughput.prefix_cache_hit_ratio",
        "prefix-cache hit tokens / queried tokens over the window (vLLM's `prefix_cache_hits` / `_queries`; SGLang's "
        "`cached_tokens_total` / `prompt_tokens_total`, live from `realtime_tokens_total` where exported; TensorRT-LLM's "
        "`prompt_cached_tokens_total` / `prompt_tokens_total`; llama.cpp's `prompt_tokens_cached_total` / all prompt "
        "tokens); where an engine exports only a ratio, its window mean (SGLang `cache_hit_rate`, TensorRT-LLM "
        "`kv_cache_hit_rate`, vLLM V0 `gpu_prefix_cache_hit_rate`)",
    ),
    Family(
        "kvwatch_time_to_first_token_seconds",
        "gauge",
        (*ENGINE, "quantile"),
        "s",
        "Time to first token, quantiles over the window.",
        doc="TTFT quantiles (0.5, 0.9, 0.99) over the window",
    ),
    Family(
        "kvwatch_inter_token_latency_seconds",
        "gauge",
        (*ENGINE, "quantile"),
        "s",
        "Inter-token latency, quantiles over the window.",
    ),
    Family(
        "kvwatch_queue_time_seconds",
        "gauge",
        (*ENGINE, "quantile"),
        "s",
        "Time requests spent waiting, quantiles over the window.",
        doc="time in the waiting queue, quantiles over the window",
    ),
    Family(
        "kvwatch_throughput_gap",
        "gauge",
        ENGINE,
        "0/1",
        "1 while prompt throughput is ~0, generation continues and requests wait (last interval).",
    ),
    Family(
        "kvwatch_kv_cache_pressure",
        "gauge",
        (*ENGINE, "state"),
        "state set",
        "KV-cache pressure state set: ok, admission_stall, preemption_risk.",
        doc=f"exactly one of {_states(KvPressure)} is 1",
    ),
    Family(
        "kvwatch_max_num_seqs",
        "gauge",
        (*ENGINE, "source"),
        "requests",
        "The max_num_seqs ceiling, configured or inferred.",
        doc='the `max_num_seqs` ceiling, `source="configured"` or `"inferred"`; absent if unknown',
    ),
    Family(
        "kvwatch_max_num_batched_tokens",
        "gauge",
        (*ENGINE, "source"),
        "tokens",
        "The per-step token budget, configured or inferred.",
        doc="the per-step token budget, configured or inferred; absent if unknown",
    ),
    Family(
        "kvwatch_lora_adapters",
        "gauge",
        (*ENGINE, "state"),
        "adapters",
        "LoRA adapters running / waiting.",
        doc="LoRA adapters `running` / `waiting` (vLLM's `lora_requests_info`); SGLang's `lora_pool_slots_used` as "
        "`running` only (it does not say which adapters wait: no `waiting` series)",
    ),
    _engine(
        "kvwatch_engine_asleep",
        "0/1",
        "1 while vLLM's engine_sleep_state says the engine sleeps (sleep mode), 0 while awake.",
        "capacity.asleep",
        "1 while vLLM's `engine_sleep_state` says the engine sleeps (`weights_offloaded` or `discard_all`), 0 awake; "
        "absent when vLLM exports no sleep state",
    ),
    Family(
        "kvwatch_diagnosis_confidence",
        "gauge",
        (*ENGINE, "confidence"),
        "state set",
        "How sure the engine's diagnosis is (state set: high, medium, low).",
        doc=f"exactly one of {_states(Confidence)} is 1 (see Diagnosis confidence); alerts that page require "
        + " or ".join(f"`{c}`" for c in Confidence if c.pages),
    ),
    Family(
        "kvwatch_bottleneck",
        "gauge",
        (*ENGINE, "bottleneck"),
        "state set",
        "Which limit binds the engine (state set: exactly one is 1).",
        doc=f"exactly one of {_states(Bottleneck)} is 1",
    ),
    Family(
        "kvwatch_capacity_sequences",
        "gauge",
        (*ENGINE, "limit"),
        "sequences",
        f"Sequences the engine holds at the observed lengths, per limit ({', '.join(CAPACITY_LIMITS)}).",
        doc=f"sequences each limit ({_states(CAPACITY_LIMITS)}) lets the engine hold at the observed lengths "
        "(see Autoscaling); a limit whose inputs are unknown is absent",
    ),
    Family(
        "kvwatch_capacity_sequences_effective",
        "gauge",
        ENGINE,
        "sequences",
        "The smallest of kvwatch_capacity_sequences: what the engine holds now.",
        doc="the smallest `kvwatch_capacity_sequences`; the diagnosis' `capacity.binding_limit` names that limit",
    ),
    Family(
        "kvwatch_demand_sequences",
        "gauge",
        ENGINE,
        "sequences",
        "Sequences that want a slot: Running + Waiting (+ Swapped), means over the window.",
        doc="Running + Waiting (every reason) + Swapped, means over the window; requests refused before the "
        "engine are not counted",
    ),
    Family(
        "kvwatch_recommendation",
        "gauge",
        (*ENGINE, "action"),
        "1",
        "1 per active recommendation for the engine.",
        doc="one series per active recommendation",
    ),
)

_BY_NAME = {f.name: f for f in FAMILIES}


def family(name: str) -> Family:
    return _BY_NAME[name]


@dataclass(frozen=True, slots=True)
class ReportThresholds:
    """The cut-offs ``kvwatch report`` judges a benchmark stage by."""

    # A limit binds a stage when it is the verdict for at least this share of the stage's snapshots: a
    # stage's ramp-up and drain read "serving, no queue" for a few seconds at any load.
    binding_share: float = 0.25
    # Mean prefix-cache hit ratio over a stage from which reused prompts inflate its throughput (vLLM's
    # benchmark guide: a repeated run against one server reuses cached prompts; vary --seed or restart).
    prefix_cache_caution: float = 0.5
    # Scrapes further apart than this many intervals are a gap in the recording (failed or missed scrapes).
    gap_intervals: float = 2.5
    # A stage less covered than this by the recording is said to lie (partly) outside it.
    min_coverage: float = 0.8
