"""Render a :class:`~kvwatch.sim.simulator.Simulator` as vLLM's ``/metrics`` text.

``render(sim, version)`` builds the Prometheus text format (0.0.4) the way vLLM's
``prometheus_client`` registry prints it — family order, HELP text, label names and order (sorted,
as ``prometheus_client`` prints them), ``_created`` companions as separate ``gauge`` families,
``floatToGoString`` number formatting, every line ending in ``\\n``:

* ``"0.32"`` (default): vLLM 0.32 V1, copied from real captures (tests/fixtures/vllm-0.32.0-cpu).
  ``engine`` and ``model_name`` on every per-engine series; ``cache_config_info`` with 0.32's 38
  labels; ``lora_requests_info{max_lora,running_lora_adapters,waiting_lora_adapters}`` only when
  the engine has ``max_loras > 0`` (vLLM only registers it with a LoRA config).
* ``"0.10"``: the same plus the deprecated aliases the 0.9–0.11 V1 engine also exported:
  ``vllm:gpu_cache_usage_perc`` (= ``kv_cache_usage_perc``), ``vllm:gpu_prefix_cache_queries_total``
  and ``vllm:gpu_prefix_cache_hits_total``.
* ``"v0"``: the V0 engine (vllm/engine/metrics.py, 0.6–0.8): ``num_requests_swapped``,
  ``gpu_cache_usage_perc``, ``cpu_cache_usage_perc``, ``gpu_prefix_cache_hit_rate``,
  ``cpu_prefix_cache_hit_rate``, ``time_per_output_token_seconds``; only a ``model_name`` label (no
  ``engine``); served in multiprocess mode, so no ``_created`` series and no python/process
  families, histogram ``_sum`` printed before the buckets; one engine only.

Example (0.32, abridged)::

    # HELP vllm:num_requests_running Number of requests in model execution batches.
    # TYPE vllm:num_requests_running gauge
    vllm:num_requests_running{engine="0",model_name="tiny-llama-dummy"} 5.0
    # HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
    # TYPE vllm:num_preemptions_total counter
    vllm:num_preemptions_total{engine="0",model_name="tiny-llama-dummy"} 78.0
    # HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
    # TYPE vllm:num_preemptions_created gauge
    vllm:num_preemptions_created{engine="0",model_name="tiny-llama-dummy"} 1.7961205316861255e+09
"""

from __future__ import annotations

import gc
import math
import os
import platform
import time

__all__ = ["METRICS_VERSIONS", "float_to_go", "render"]

METRICS_VERSIONS = ("0.32", "0.10", "v0")
_VERSION_ALIASES = {
    "0.32": "0.32",
    "v1": "0.32",
    "0.32.0": "0.32",
    "0.10": "0.10",
    "0.9": "0.10",
    "0.11": "0.10",
    "v0": "v0",
    "0": "v0",
}

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def normalize_version(v: str) -> str:
    try:
        return _VERSION_ALIASES[str(v).strip().lower()]
    except KeyError:
        raise ValueError(f"metrics-version: {v!r} is not one of {', '.join(METRICS_VERSIONS)}") from None


def float_to_go(d: float) -> str:
    """prometheus_client's ``floatToGoString`` (Go switches to exponents sooner than Python)."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def _esc(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(d: dict) -> str:
    if not d:
        return ""
    return "{" + ",".join(f'{k}="{_esc(str(v))}"' for k, v in sorted(d.items())) + "}"


# --------------------------------------------------------------------------- help texts (vLLM 0.32)

H = {
    "estimated_flops_per_gpu": "Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).",
    "estimated_read_bytes_per_gpu": "Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).",
    "estimated_write_bytes_per_gpu": "Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).",
    "num_requests_running": "Number of requests in model execution batches.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "num_requests_waiting_by_reason": "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    "num_requests_kv_fetch_by_stage": "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = needs an async KV load that has not started; 'in_progress' = load started and not yet reported finished; 'completed_waiting' = load finished, request not running yet.",
    "engine_sleep_state": "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    "gpu_cache_usage_perc_010": "GPU KV-cache usage. 1 means 100 percent usage.DEPRECATED: Use vllm:kv_cache_usage_perc instead.",
    "gpu_prefix_cache_queries_010": "GPU prefix cache queries, in terms of number of queriedtokens. DEPRECATED: Use vllm:prefix_cache_queries instead.",
    "gpu_prefix_cache_hits_010": "GPU prefix cache hits, in terms of number of cached tokens. DEPRECATED: Use vllm:prefix_cache_hits instead.",
    "kv_cache_usage_perc": "KV-cache usage. 1 means 100 percent usage.",
    "prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
    "external_prefix_cache_queries": "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
    "external_prefix_cache_hits": "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
    "mm_cache_queries": "Multi-modal cache queries, in terms of number of queried items.",
    "mm_cache_hits": "Multi-modal cache hits, in terms of number of cached items.",
    "num_preemptions": "Cumulative number of preemption from the engine.",
    "prompt_tokens": "Number of prefill tokens processed.",
    "prompt_tokens_by_source": "Number of prompt tokens by source.",
    "prompt_tokens_cached": "Number of cached prompt tokens (local + external).",
    "prompt_tokens_cached_by_source": "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
    "generation_tokens": "Number of generation tokens processed.",
    "request_success": "Count of successfully processed requests.",
    "admission_rejections": "Number of admission attempts rejected by a queue limit, by reason.",
    "request_prompt_tokens": "Number of prefill tokens processed.",
    "request_generation_tokens": "Number of generation tokens processed.",
    "iteration_tokens_total": "Histogram of number of tokens per engine_step.",
    "request_max_num_generation_tokens": "Histogram of maximum number of requested generation tokens.",
    "request_params_n": "Histogram of the n request parameter.",
    "request_params_max_tokens": "Histogram of the max_tokens request parameter.",
    "time_to_first_token_seconds": "Histogram of time to first token in seconds.",
    "inter_token_latency_seconds": "Histogram of inter-token latency in seconds.",
    "request_time_per_output_token_seconds": "Histogram of time_per_output_token_seconds per request.",
    "e2e_request_latency_seconds": "Histogram of e2e request latency in seconds.",
    "request_queue_time_seconds": "Histogram of time spent in WAITING phase for request.",
    "request_inference_time_seconds": "Histogram of time spent in RUNNING phase for request.",
    "request_prefill_time_seconds": "Histogram of time spent in PREFILL phase for request.",
    "request_decode_time_seconds": "Histogram of time spent in DECODE phase for request.",
    "request_num_preemptions": "Histogram of the number of times a request was preempted.",
    "request_prefill_kv_computed_tokens": "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    "cache_config_info": "Information of the LLMEngine CacheConfig",
    "lora_requests_info": "Running stats on lora requests.",
}

HTTP_HELP = {
    "http_requests": "Total number of requests by method, status and handler.",
    "http_request_size_bytes": "Content length of incoming requests by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. ",
    "http_response_size_bytes": "Content length of outgoing responses by handler. Only value of header is respected. Otherwise ignored. No percentile calculated. ",
    "http_request_duration_highr_seconds": "Latency with many buckets but no API specific labels. Made for more accurate percentile calculations. ",
    "http_request_duration_seconds": "Latency with only few buckets by handler. Made to be only used if aggregation by handler is important. ",
}

V0_HELP = {
    "num_requests_running": "Number of requests currently running on GPU.",
    "num_requests_swapped": "Number of requests swapped to CPU.",
    "num_requests_waiting": "Number of requests waiting to be processed.",
    "gpu_cache_usage_perc": "GPU KV-cache usage. 1 means 100 percent usage.",
    "cpu_cache_usage_perc": "CPU KV-cache usage. 1 means 100 percent usage.",
    "cpu_prefix_cache_hit_rate": "CPU prefix cache block hit rate.",
    "gpu_prefix_cache_hit_rate": "GPU prefix cache block hit rate.",
    "time_per_output_token_seconds": "Histogram of time per output token in seconds.",
    "e2e_request_latency_seconds": "Histogram of end to end request latency in seconds.",
}

FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class _Out:
    """Accumulates lines; knows whether ``_created`` companions are printed."""

    __slots__ = ("parts", "created")

    def __init__(self, created: bool):
        self.parts: list[str] = []
        self.created = created

    def head(self, name: str, help_: str, typ: str) -> None:
        self.parts.append(f"# HELP {name} {help_}\n# TYPE {name} {typ}\n")

    def sample(self, name: str, labels: str, value) -> None:
        self.parts.append(f"{name}{labels} {float_to_go(value)}\n")

    def simple(self, name: str, help_: str, typ: str, rows) -> None:
        """``rows``: iterable of (labels dict, value, created)."""
        rows = list(rows)
        base = name[:-6] if typ == "counter" and name.endswith("_total") else name
        self.head(name, help_, typ)
        for lab, val, _ in rows:
            self.sample(name, _labels(lab), val)
        if typ == "counter" and self.created:
            self.head(base + "_created", help_, "gauge")
            for lab, _, cr in rows:
                self.sample(base + "_created", _labels(lab), cr)

    def hist(self, name: str, help_: str, rows, v0: bool = False) -> None:
        """``rows``: iterable of (labels dict, Hist)."""
        rows = list(rows)
        self.head(name, help_, "histogram")
        ap = self.parts.append
        for lab, h in rows:
            tail = _labels(lab)
            items = sorted(lab.items())
            pre = "".join(f'{k}="{_esc(str(v))}",' for k, v in items if k < "le")
            post = "".join(f',{k}="{_esc(str(v))}"' for k, v in items if k > "le")
            if v0:
                ap(f"{name}_sum{tail} {float_to_go(h.sum)}\n")
            acc = 0
            counts = h.counts
            for j, bound in enumerate(h.les):
                acc += counts[j]
                ap(f'{name}_bucket{{{pre}le="{bound}"{post}}} {float_to_go(acc)}\n')
            ap(f"{name}_count{tail} {float_to_go(h.count)}\n")
            if not v0:
                ap(f"{name}_sum{tail} {float_to_go(h.sum)}\n")
        if self.created:
            self.head(name + "_created", help_, "gauge")
            for lab, h in rows:
                self.sample(name + "_created", _labels(lab), h.created)

    def text(self) -> str:
        return "".join(self.parts)


# --------------------------------------------------------------------------- process / python


def _process_families(out: _Out, start_time: float) -> None:
    stats = gc.get_stats()
    for fam, key, help_ in (
        ("python_gc_objects_collected_total", "collected", "Objects collected during gc"),
        ("python_gc_objects_uncollectable_total", "uncollectable", "Uncollectable objects found during GC"),
        ("python_gc_collections_total", "collections", "Number of times this generation was collected"),
    ):
        out.head(fam, help_, "counter")
        for gen, st in enumerate(stats):
            out.sample(fam, f'{{generation="{gen}"}}', st[key])
    impl = platform.python_implementation()
    major, minor, patch = platform.python_version_tuple()
    out.head("python_info", "Python platform information", "gauge")
    out.sample(
        "python_info",
        _labels(
            {
                "implementation": impl,
                "major": major,
                "minor": minor,
                "patchlevel": patch,
                "version": platform.python_version(),
            }
        ),
        1.0,
    )
    try:
        with open("/proc/self/statm", "rb") as f:
            parts = f.read().split()
        page = os.sysconf("SC_PAGE_SIZE")
        vmem, rss = float(parts[0]) * page, float(parts[1]) * page
        fds = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError, IndexError):
        return  # like prometheus_client's ProcessCollector off Linux: no process_* families
    import resource

    t = os.times()
    out.head("process_virtual_memory_bytes", "Virtual memory size in bytes.", "gauge")
    out.sample("process_virtual_memory_bytes", "", vmem)
    out.head("process_resident_memory_bytes", "Resident memory size in bytes.", "gauge")
    out.sample("process_resident_memory_bytes", "", rss)
    out.head("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge")
    out.sample("process_start_time_seconds", "", round(start_time, 2))
    out.head("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "counter")
    out.sample("process_cpu_seconds_total", "", t.user + t.system)
    out.head("process_open_fds", "Number of open file descriptors.", "gauge")
    out.sample("process_open_fds", "", fds)
    out.head("process_max_fds", "Maximum number of open file descriptors.", "gauge")
    out.sample("process_max_fds", "", resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _http_families(out: _Out, sim) -> None:
    h = sim.http
    handler = {"handler": "/v1/completions"}
    done = h.requests > 0
    hc = h.handler_created or h.created
    out.simple(
        "http_requests_total",
        HTTP_HELP["http_requests"],
        "counter",
        [({**handler, "method": "POST", "status": "2xx"}, h.requests, hc)] if done else [],
    )
    for fam, total in (("http_request_size_bytes", h.request_bytes), ("http_response_size_bytes", 0)):
        out.head(fam, HTTP_HELP[fam], "summary")
        if done:
            out.sample(fam + "_count", _labels(handler), h.requests)
            out.sample(fam + "_sum", _labels(handler), total)
        if out.created:
            out.head(fam + "_created", HTTP_HELP[fam], "gauge")
            if done:
                out.sample(fam + "_created", _labels(handler), hc)
    out.hist("http_request_duration_highr_seconds", HTTP_HELP["http_request_duration_highr_seconds"], [({}, h.h_highr)])
    rows = []
    if done:
        h.h_duration.created = hc
        rows = [({**handler, "method": "POST"}, h.h_duration)]
    out.hist("http_request_duration_seconds", HTTP_HELP["http_request_duration_seconds"], rows)


# --------------------------------------------------------------------------- cache_config_info


def cache_config_labels(cfg, engine: int | None, version: str) -> dict:
    bs = cfg.block_size
    tokens = cfg.kv_cache_size_tokens
    if version == "v0":
        block_bytes = bs * cfg.kv_bytes_per_token
        return {
            "block_size": str(bs),
            "cache_dtype": cfg.cache_dtype,
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": str(cfg.enable_prefix_caching),
            "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
            "is_attention_free": "False",
            "num_cpu_blocks": str(4 * 1024**3 // block_bytes),
            "num_gpu_blocks": str(cfg.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "sliding_window": "None",
            "swap_space_bytes": str(4 * 1024**3),
        }
    return {
        "_block_size_resolved": "True",
        "block_size": str(bs),
        "cache_dtype": cfg.cache_dtype,
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(bs),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "engine": str(engine),
        "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(tokens / cfg.max_model_len),
        "kv_cache_memory_bytes": str(tokens * cfg.kv_bytes_per_token),
        "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(cfg.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "True",
    }


# --------------------------------------------------------------------------- main entry


def render(sim, version: str = "0.32", process_start: float | None = None) -> str:
    """The full ``/metrics`` body for ``sim`` as vLLM ``version`` prints it."""
    version = normalize_version(version)
    if version == "v0":
        return _render_v0(sim)
    out = _Out(created=True)
    _process_families(out, sim.wall_start if process_start is None else process_start)
    pe = _PerEngine(out, sim.engines, sim.rejected)
    # Families in the order a real 0.32 capture prints them (tests/test_sim_format.py checks it).
    _scheduler_families(pe)
    if version == "0.10":
        _deprecated_010_families(pe)
    _cache_families(pe)
    _token_and_request_counters(pe)
    for name, key, attr in _V1_HISTOGRAMS:
        out.hist(name, H[key], [(pe.lab[i], getattr(s, attr)) for i, s in enumerate(pe.st)])
    _lora_family(out, sim)
    out.simple(
        "vllm:cache_config_info",
        H["cache_config_info"],
        "gauge",
        [(cache_config_labels(e.cfg, e.index, version), 1.0, 0.0) for e in sim.engines],
    )
    _http_families(out, sim)
    return out.text()


# vLLM 0.33 v1/metrics/stats.py KV_FETCH_STAGES, in the order its log line prints them
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")


class _PerEngine:
    """Rows of the per-engine V1 families: each engine's labels, stats and ``_created`` time."""

    __slots__ = ("out", "model", "lab", "st", "cr", "zeros", "rejected", "kv_consumer")

    def __init__(self, out: _Out, engines, rejected: dict[str, int] | None = None):
        self.out = out
        self.rejected = rejected or {}  # the frontend's admission rejections by reason (no engine label)
        self.kv_consumer = engines[0].cfg.kv_transfer_tokens_per_s is not None  # a P/D decode engine
        self.model = engines[0].cfg.model_name
        self.lab = [{"engine": str(e.index), "model_name": self.model} for e in engines]
        self.st = [e.stats for e in engines]
        self.cr = [s.created for s in self.st]
        self.zeros = [0.0] * len(engines)  # families vLLM registers but the simulator never moves

    def series(self, name: str, key: str, values, typ: str) -> None:
        """One series per engine: ``values[i]`` is engine i's."""
        self.out.simple(name, H[key], typ, [(self.lab[i], values[i], self.cr[i]) for i in range(len(self.st))])

    def split(self, name: str, key: str, typ: str, label: str, pairs) -> None:
        """Per engine, one series per value of ``label``: ``pairs(stats)`` -> [(label value, value), ...]."""
        rows = [({**self.lab[i], label: c}, v, self.cr[i]) for i, s in enumerate(self.st) for c, v in pairs(s)]
        self.out.simple(name, H[key], typ, rows)


def _scheduler_families(pe: _PerEngine) -> None:
    """MFU estimates (always 0 here), queue and batch sizes, and the sleep state."""
    pe.series("vllm:estimated_flops_per_gpu_total", "estimated_flops_per_gpu", pe.zeros, "counter")
    pe.series("vllm:estimated_read_bytes_per_gpu_total", "estimated_read_bytes_per_gpu", pe.zeros, "counter")
    pe.series("vllm:estimated_write_bytes_per_gpu_total", "estimated_write_bytes_per_gpu", pe.zeros, "counter")
    pe.series("vllm:num_requests_running", "num_requests_running", [s.running for s in pe.st], "gauge")
    pe.series("vllm:num_requests_waiting", "num_requests_waiting", [s.waiting for s in pe.st], "gauge")
    pe.split(
        "vllm:num_requests_waiting_by_reason",
        "num_requests_waiting_by_reason",
        "gauge",
        "reason",
        lambda s: (("capacity", s.waiting - s.waiting_deferred), ("deferred", s.waiting_deferred)),
    )
    if pe.kv_consumer:  # registered only with a kv_transfer_config that is_kv_consumer (0.33 loggers.py)
        pe.split(
            "vllm:num_requests_kv_fetch_by_stage",
            "num_requests_kv_fetch_by_stage",
            "gauge",
            "stage",
            lambda s: tuple(zip(KV_FETCH_STAGES, map(float, s.kv_fetch), strict=True)),
        )
    pe.split(
        "vllm:engine_sleep_state",
        "engine_sleep_state",
        "gauge",
        "sleep_state",
        _sleep_state,
    )


def _sleep_state(s) -> tuple[tuple[str, float], ...]:
    """vLLM's record_sleep_state (v1/metrics/loggers.py): awake 1 and the rest 0, or awake 0 and the level's 1."""
    level = s.sleep_level
    return ("awake", float(level == 0)), ("weights_offloaded", float(level == 1)), ("discard_all", float(level == 2))


def _deprecated_010_families(pe: _PerEngine) -> None:
    """The old names 0.9-0.11 still exported next to the new ones (same values)."""
    pe.series("vllm:gpu_cache_usage_perc", "gpu_cache_usage_perc_010", [s.kv_usage for s in pe.st], "gauge")
    pe.series(
        "vllm:gpu_prefix_cache_queries_total",
        "gpu_prefix_cache_queries_010",
        [s.prefix_queries for s in pe.st],
        "counter",
    )
    pe.series(
        "vllm:gpu_prefix_cache_hits_total", "gpu_prefix_cache_hits_010", [s.prefix_hits for s in pe.st], "counter"
    )


def _cache_families(pe: _PerEngine) -> None:
    """KV cache usage and the prefix / external / multi-modal cache counters."""
    st = pe.st
    pe.series("vllm:kv_cache_usage_perc", "kv_cache_usage_perc", [s.kv_usage for s in st], "gauge")
    pe.series("vllm:prefix_cache_queries_total", "prefix_cache_queries", [s.prefix_queries for s in st], "counter")
    pe.series("vllm:prefix_cache_hits_total", "prefix_cache_hits", [s.prefix_hits for s in st], "counter")
    pe.series("vllm:external_prefix_cache_queries_total", "external_prefix_cache_queries", pe.zeros, "counter")
    pe.series("vllm:external_prefix_cache_hits_total", "external_prefix_cache_hits", pe.zeros, "counter")
    pe.series("vllm:mm_cache_queries_total", "mm_cache_queries", pe.zeros, "counter")
    pe.series("vllm:mm_cache_hits_total", "mm_cache_hits", pe.zeros, "counter")


def _token_and_request_counters(pe: _PerEngine) -> None:
    """Preemptions, prompt tokens (by source, cached), generation tokens, finished and rejected requests."""
    st = pe.st
    pe.series("vllm:num_preemptions_total", "num_preemptions", [s.preemptions for s in st], "counter")
    pe.series("vllm:prompt_tokens_total", "prompt_tokens", [s.prompt_tokens for s in st], "counter")
    pe.split(
        "vllm:prompt_tokens_by_source_total",
        "prompt_tokens_by_source",
        "counter",
        "source",
        lambda s: (
            ("local_compute", s.prompt_local_compute),
            ("local_cache_hit", s.prompt_local_cache_hit),
            ("external_kv_transfer", s.prompt_external),
        ),
    )
    pe.series("vllm:prompt_tokens_cached_total", "prompt_tokens_cached", [s.prompt_cached for s in st], "counter")
    # Only the device tier exists in the simulator (no KV offloading or connectors).
    pe.split(
        "vllm:prompt_tokens_cached_by_source_total",
        "prompt_tokens_cached_by_source",
        "counter",
        "source",
        lambda s: [
            (src, s.cached_device if src == "device" else 0)
            for src in ("device", "host", "p2p", "disk", "external_unspecified")
        ],
    )
    pe.series("vllm:generation_tokens_total", "generation_tokens", [s.gen_tokens for s in st], "counter")
    pe.split(
        "vllm:request_success_total",
        "request_success",
        "counter",
        "finished_reason",
        lambda s: [(r, s.success[r]) for r in FINISH_REASONS],
    )
    # Labelled by model and reason only, as in the 0.32 captures: no engine label. The frontend counts a request
    # it answers 503 because the unfinished requests would pass --max-num-queued-reqs (AsyncLLM.check_admission).
    pe.out.simple(
        "vllm:admission_rejections_total",
        H["admission_rejections"],
        "counter",
        [
            ({"model_name": pe.model, "reason": r}, float(pe.rejected.get(r, 0)), pe.cr[0])
            for r in ("max_num_queued_reqs", "max_num_queued_tokens")
        ],
    )


# (family, help key, EngineStats attribute), in vLLM 0.32's order
_V1_HISTOGRAMS = (
    ("vllm:request_prompt_tokens", "request_prompt_tokens", "h_prompt"),
    ("vllm:request_generation_tokens", "request_generation_tokens", "h_generation"),
    ("vllm:iteration_tokens_total", "iteration_tokens_total", "h_iteration"),
    ("vllm:request_max_num_generation_tokens", "request_max_num_generation_tokens", "h_max_gen"),
    ("vllm:request_params_n", "request_params_n", "h_n"),
    ("vllm:request_params_max_tokens", "request_params_max_tokens", "h_max_tokens"),
    ("vllm:time_to_first_token_seconds", "time_to_first_token_seconds", "h_ttft"),
    ("vllm:inter_token_latency_seconds", "inter_token_latency_seconds", "h_itl"),
    ("vllm:request_time_per_output_token_seconds", "request_time_per_output_token_seconds", "h_tpot"),
    ("vllm:e2e_request_latency_seconds", "e2e_request_latency_seconds", "h_e2e"),
    ("vllm:request_queue_time_seconds", "request_queue_time_seconds", "h_queue"),
    ("vllm:request_inference_time_seconds", "request_inference_time_seconds", "h_inference"),
    ("vllm:request_prefill_time_seconds", "request_prefill_time_seconds", "h_prefill"),
    ("vllm:request_decode_time_seconds", "request_decode_time_seconds", "h_decode"),
    ("vllm:request_num_preemptions", "request_num_preemptions", "h_preemptions"),
    ("vllm:request_prefill_kv_computed_tokens", "request_prefill_kv_computed_tokens", "h_prefill_kv"),
)


def _lora_family(out: _Out, sim) -> None:
    """Only with a LoRA config (vLLM registers it then): one series per adapter combination seen."""
    engines = sim.engines
    if not any(e.cfg.max_loras for e in engines):
        return
    max_lora = str(max(e.cfg.max_loras for e in engines))
    rows = [
        ({"max_lora": max_lora, "running_lora_adapters": r, "waiting_lora_adapters": w}, t, 0.0)
        for (r, w), t in sim.lora_info.items()
    ]
    out.simple("vllm:lora_requests_info", H["lora_requests_info"], "gauge", rows)


def _render_v0(sim) -> str:
    if len(sim.engines) != 1:
        raise ValueError("metrics-version v0: the V0 engine has no data parallelism (use --engines 1)")
    out = _Out(created=False)
    e = sim.engines[0]
    s = e.stats
    cfg = e.cfg
    lab = {"model_name": cfg.model_name}
    out.simple(
        "vllm:cache_config_info", H["cache_config_info"], "gauge", [(cache_config_labels(cfg, None, "v0"), 1.0, 0.0)]
    )
    hit_rate = -1.0
    if cfg.enable_prefix_caching:
        hit_rate = s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0
    for name, key, val in (
        ("vllm:num_requests_running", "num_requests_running", s.running),
        ("vllm:num_requests_swapped", "num_requests_swapped", 0.0),
        ("vllm:num_requests_waiting", "num_requests_waiting", s.waiting),
        ("vllm:gpu_cache_usage_perc", "gpu_cache_usage_perc", s.kv_usage),
        ("vllm:cpu_cache_usage_perc", "cpu_cache_usage_perc", 0.0),
        ("vllm:cpu_prefix_cache_hit_rate", "cpu_prefix_cache_hit_rate", -1.0),
        ("vllm:gpu_prefix_cache_hit_rate", "gpu_prefix_cache_hit_rate", hit_rate),
    ):
        out.simple(name, V0_HELP[key], "gauge", [(lab, val, 0.0)])
    _v0_lora_and_counters(out, sim, e, lab)
    _v0_histograms(out, s, lab)
    _http_families(out, sim)
    return out.text()


def _v0_lora_and_counters(out, sim, e, lab: dict) -> None:
    s, cfg = e.stats, e.cfg
    # V0 always registered lora_requests_info and set it on every logging pass.
    t_last = sim.wall_start + (e.prev_end if e.prev_end >= 0 else 0.0)
    out.simple(
        "vllm:lora_requests_info",
        H["lora_requests_info"],
        "gauge",
        [
            (
                {
                    "max_lora": str(cfg.max_loras),
                    "running_lora_adapters": ",".join(s.running_loras),
                    "waiting_lora_adapters": ",".join(s.waiting_loras),
                },
                t_last,
                0.0,
            )
        ],
    )
    out.simple("vllm:num_preemptions_total", H["num_preemptions"], "counter", [(lab, s.preemptions, 0.0)])
    out.simple("vllm:prompt_tokens_total", H["prompt_tokens"], "counter", [(lab, s.prompt_tokens, 0.0)])
    out.simple("vllm:generation_tokens_total", H["generation_tokens"], "counter", [(lab, s.gen_tokens, 0.0)])
    out.simple(
        "vllm:request_success_total",
        H["request_success"],
        "counter",
        [({**lab, "finished_reason": r}, s.success[r], 0.0) for r in FINISH_REASONS if s.success[r]],
    )


def _v0_histograms(out, s, lab: dict) -> None:
    it = s.h_iteration_v0
    for name, key, h in (
        ("vllm:iteration_tokens_total", H["iteration_tokens_total"], it),
        ("vllm:time_to_first_token_seconds", H["time_to_first_token_seconds"], s.h_ttft),
        ("vllm:time_per_output_token_seconds", V0_HELP["time_per_output_token_seconds"], s.h_itl),
        ("vllm:e2e_request_latency_seconds", V0_HELP["e2e_request_latency_seconds"], s.h_e2e),
        ("vllm:request_queue_time_seconds", H["request_queue_time_seconds"], s.h_queue),
        ("vllm:request_inference_time_seconds", H["request_inference_time_seconds"], s.h_inference),
        ("vllm:request_prefill_time_seconds", H["request_prefill_time_seconds"], s.h_prefill),
        ("vllm:request_decode_time_seconds", H["request_decode_time_seconds"], s.h_decode),
        ("vllm:request_prompt_tokens", H["request_prompt_tokens"], s.h_prompt),
        ("vllm:request_generation_tokens", H["request_generation_tokens"], s.h_generation),
        ("vllm:request_max_num_generation_tokens", H["request_max_num_generation_tokens"], s.h_max_gen),
        ("vllm:request_params_n", H["request_params_n"], s.h_n),
        ("vllm:request_params_max_tokens", H["request_params_max_tokens"], s.h_max_tokens),
    ):
        out.hist(name, key, [(lab, h)], v0=True)


def process_start_time() -> float:
    """Best effort: this process's start (unix time), as prometheus_client's ProcessCollector reports it."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1]) + int(fields[19]) / ticks
    except (OSError, ValueError, IndexError):
        pass
    return time.time()
