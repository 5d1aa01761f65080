"""kvwatch / Capacity: how much the KV cache holds and how close it is to full."""

from __future__ import annotations

from grafana.common import (
    BY_ENGINE,
    ENGINE,
    ENGINE_LEGEND,
    JSON,
    NO_KV_GAUGE,
    NO_KV_SIZE,
    NO_LORA,
    NO_MAX_CONCURRENCY,
    NO_REJECTIONS,
    NO_SEQUENCE_LENGTH,
    NO_SLOTS,
    THRESHOLDS,
    TOKENS,
    Layout,
    dashboard,
    dashed_series,
    flags,
    kvwatch_variables,
    query,
    stat,
    state_timeline,
    thresholds,
    timeseries,
)
from kvwatch.catalog import Action, KvPressure

# -- the headline tiles -------------------------------------------------------------------------------


def capacity_tile() -> JSON:
    return stat(
        "KV cache capacity",
        "KV-cache size in tokens, summed over the selected engines (vLLM's `kv_cache_size_tokens`, "
        "else `num_gpu_blocks × block_size`).",
        "Small against your prompt + output lengths × desired concurrency: use `--kv-cache-dtype "
        "fp8` (halves KV per token), raise `--gpu-memory-utilization`, shard with more tensor "
        "parallelism, or add replicas.",
        ENGINE.agg("sum", "kvwatch_kv_cache_capacity_tokens"),
        unit=TOKENS,
        no_data=NO_KV_SIZE,
    )


def free_tile() -> JSON:
    return stat(
        "Free KV tokens",
        "KV-cache tokens not in use right now, summed over the selected engines.",
        "Near 0 while requests wait: new prefills cannot be admitted until running requests "
        "finish. See the Overview dashboard's recommendations.",
        ENGINE.agg("sum", "kvwatch_kv_cache_free_tokens"),
        unit=TOKENS,
        no_data=NO_KV_SIZE,
    )


def max_concurrency_tile() -> JSON:
    return stat(
        "Estimated max concurrency",
        "How many requests of the current mean length (prompt + output) the KV cache can hold at "
        "once, summed over the selected engines.",
        "Below the concurrency you need: shorter sequences (lower `--max-model-len`), FP8 KV cache, "
        "prefix caching, more GPU memory or more replicas. `--max-num-seqs` above this number only "
        "buys preemptions.",
        ENGINE.agg("sum", "kvwatch_estimated_max_concurrency"),
        unit="none",
        decimals=1,
        no_data=NO_MAX_CONCURRENCY,
    )


def headroom_tile() -> JSON:
    return stat(
        "Min concurrency headroom",
        "Estimated max concurrency minus the mean running requests, for the tightest selected "
        "engine. Negative: more requests run than the KV cache holds at the mean length.",
        "At or below 0 the engine is KV-bound and will queue or preempt on the next burst: add KV "
        "capacity or a replica before traffic grows.",
        ENGINE.agg("min", "kvwatch_concurrency_headroom"),
        unit="none",
        steps=thresholds(("red", None), ("orange", 0), ("green", 2)),
        decimals=1,
        no_data=NO_MAX_CONCURRENCY,
    )


def sequence_tile() -> JSON:
    return stat(
        "Mean sequence tokens",
        "Mean prompt + generation tokens of the requests that finished in kvwatch's window, across "
        "the selected engines.",
        "Much shorter than `--max-model-len`: lowering `--max-model-len` frees nothing by itself in "
        "vLLM V1, but it bounds the worst case; long sequences dominate KV use, so check prompts "
        "for waste and consider prefix caching.",
        ENGINE.agg("avg", "kvwatch_mean_sequence_tokens"),
        unit=TOKENS,
        no_data=NO_SEQUENCE_LENGTH,
    )


# Where each engine's ratio comes from (kvwatch/window.py throughput_signals, prefix_cache_hit_rate_mean).
PREFIX_SOURCES = (
    "vLLM: prefix-cache hits / queries; SGLang: `cached_tokens_total` / `prompt_tokens_total` (builds without "
    "them: its `cache_hit_rate`, the last prefill batch's, averaged); "
    "TensorRT-LLM: `prompt_cached_tokens_total` / `prompt_tokens_total` (else its `kv_cache_hit_rate`, averaged); "
    "llama.cpp: `prompt_tokens_cached_total` / all prompt tokens."
)


def prefix_tile() -> JSON:
    return stat(
        "Prefix cache hit ratio",
        f"Share of prompt tokens served from the engine's prefix cache over kvwatch's window (mean of the selected "
        f"engines). {PREFIX_SOURCES}",
        "Near 0 with workloads that share system prompts or few-shot examples: enable prefix caching "
        f"({flags(Action.ENABLE_PREFIX_CACHING)}) and put the shared part first in the prompt. 0 for unique "
        "prompts is expected.",
        ENGINE.agg("avg", "kvwatch_prefix_cache_hit_ratio"),
        unit="percentunit",
    )


# -- KV cache -------------------------------------------------------------------------------------------


def capacity_and_free() -> JSON:
    return timeseries(
        "KV cache capacity and free tokens",
        "Per engine: KV-cache capacity (dashed) and the tokens free right now.",
        "Free tokens falling to 0 while requests wait is a KV bound; check *Seconds until KV cache "
        "full* to see it coming. Capacity is fixed per engine config: to raise it use FP8 KV "
        "cache, more `--gpu-memory-utilization`, or more GPUs.",
        [
            query(
                ENGINE.agg("max", "kvwatch_kv_cache_capacity_tokens", by=BY_ENGINE),
                "capacity · " + ENGINE_LEGEND,
                no_data=NO_KV_SIZE,
            ),
            query(
                ENGINE.agg("max", "kvwatch_kv_cache_free_tokens", by=BY_ENGINE),
                "free · " + ENGINE_LEGEND,
                no_data=NO_KV_SIZE,
            ),
        ],
        unit=TOKENS,
        overrides=[dashed_series("^capacity.*")],
    )


def pressure() -> JSON:
    return state_timeline(
        "KV cache pressure",
        f"kvwatch's KV pressure state per engine: *ok*, *admission stall* (usage above "
        f"{THRESHOLDS.admission_stall:.0%} by default: new prefills wait) or *preemption risk* (above "
        f"{THRESHOLDS.preemption_risk:.0%}: running requests get evicted).",
        "Long orange or red stretches under normal traffic mean the engine is undersized for its "
        "load: add KV capacity (FP8 KV cache, more GPU memory) or a replica; short ones at "
        "bursts are expected.",
        [
            query(
                ENGINE.state_code("kvwatch_kv_cache_pressure", "state", KvPressure, BY_ENGINE),
                ENGINE_LEGEND,
                no_data=NO_KV_GAUGE,
            )
        ],
        states=KvPressure,
    )


def seconds_to_full() -> JSON:
    return timeseries(
        "Seconds until KV cache full (forecast)",
        "kvwatch's linear forecast of when KV usage reaches 100 % at its current rate of rise, per "
        "engine. No line while usage is flat or falling.",
        "Under a minute while requests keep arriving: expect an admission stall and preemptions "
        "shortly; shed or reroute load, or scale out now.",
        [
            query(
                ENGINE.agg("min", "kvwatch_kv_cache_seconds_to_full", by=BY_ENGINE), ENGINE_LEGEND, no_data=NO_KV_GAUGE
            )
        ],
        unit="s",
        steps=thresholds(("red", None), ("orange", 60), ("green", 300)),
        threshold_style="dashed",
    )


def slot_context() -> JSON:
    return timeseries(
        "Slot context used (llama.cpp)",
        "The most of its slot's own context a running request held over kvwatch's window, per engine: llama.cpp's "
        "`/slots` (`n_prompt_tokens` / `n_ctx`; each slot owns `--ctx-size` / `--parallel` tokens, or all of "
        "`--ctx-size` with `--kv-unified`). 100 % is a request cut short at its slot's end "
        "(`kvwatch_slot_context_full_requests` counts them); nothing waits for it, so no queue shows it.",
        f"Near 100 % (kvwatch names kv_cache once requests are cut short): more context per slot "
        f"({flags(Action.RAISE_KV_CACHE_MEMORY_BYTES)}, or fewer slots: {flags(Action.LOWER_MAX_NUM_SEQS)}), a "
        f"cheaper KV cache ({flags(Action.FP8_KV_CACHE)}), or bound clients' max_tokens.",
        [query(ENGINE.agg("max", "kvwatch_slot_context_used_ratio", by=BY_ENGINE), ENGINE_LEGEND, no_data=NO_SLOTS)],
        unit="percentunit",
        max_value=1,
        steps=thresholds(("green", None), ("orange", 0.9), ("red", 0.99)),
        threshold_style="dashed",
    )


def prefix_hits() -> JSON:
    return timeseries(
        "Prefix cache hit ratio",
        f"Share of prompt tokens found in the engine's prefix cache, per engine, over kvwatch's window. "
        f"{PREFIX_SOURCES}",
        f"Low while prompts share long prefixes (system prompt, RAG template): enable prefix caching "
        f"({flags(Action.ENABLE_PREFIX_CACHING)}), keep the shared text at the start of the prompt and identical "
        "byte for byte, and route a conversation's turns to the same pod.",
        [query(ENGINE.agg("max", "kvwatch_prefix_cache_hit_ratio", by=BY_ENGINE), ENGINE_LEGEND)],
        unit="percentunit",
        max_value=1,
    )


# -- Concurrency ----------------------------------------------------------------------------------------


def concurrency_vs_running() -> JSON:
    return timeseries(
        "Estimated max concurrency vs running",
        "Per engine: how many requests of the current mean length fit in the KV cache (dashed), "
        "against the requests actually running.",
        "Running at or above the estimate means the batch is KV-bound; a `--max-num-seqs` far "
        "above the estimate only produces preemptions. To raise the estimate, shrink sequences "
        "or KV per token, or add memory.",
        [
            query(
                ENGINE.agg("max", "kvwatch_estimated_max_concurrency", by=BY_ENGINE),
                "estimate · " + ENGINE_LEGEND,
                no_data=NO_MAX_CONCURRENCY,
            ),
            query(ENGINE.agg("max", "kvwatch_requests_running", by=BY_ENGINE), "running · " + ENGINE_LEGEND),
        ],
        unit="none",
        overrides=[dashed_series("^estimate.*")],
    )


def capacity_by_limit() -> JSON:
    return timeseries(
        "Capacity by limit vs demand",
        "Per engine: the sequences each limit lets it hold at the observed lengths (`kvwatch_capacity_sequences`: "
        "KV cache, max_num_seqs, token budget, LoRA slots while they are full), the smallest of them (the "
        "effective capacity, dashed) and the demand (Running + Waiting). What the autoscaling rules size "
        "replicas on.",
        "Demand above the effective capacity: requests queue on the limit named there. When that limit is "
        "`max_num_seqs` or `max_loras` and the next one is far higher, raise the flag before adding a GPU "
        "(KvwatchScaleOutNotNeeded); `kv_cache` or `token_budget`: add replicas or KV memory.",
        [
            query(
                ENGINE.agg("max", "kvwatch_capacity_sequences", by=BY_ENGINE + ", limit"),
                "{{limit}} · " + ENGINE_LEGEND,
            ),
            query(
                ENGINE.agg("max", "kvwatch_capacity_sequences_effective", by=BY_ENGINE), "effective · " + ENGINE_LEGEND
            ),
            query(ENGINE.agg("max", "kvwatch_demand_sequences", by=BY_ENGINE), "demand · " + ENGINE_LEGEND),
        ],
        unit="none",
        overrides=[dashed_series("^effective.*")],
    )


def headroom() -> JSON:
    return timeseries(
        "Concurrency headroom",
        "Estimated max concurrency minus mean running requests, per engine (dashed line at 0).",
        "Trending toward 0: the next burst will queue on the KV cache. Below 0: requests are "
        "already being held back or preempted. Scale out or add KV capacity before it crosses.",
        [
            query(
                ENGINE.agg("min", "kvwatch_concurrency_headroom", by=BY_ENGINE),
                ENGINE_LEGEND,
                no_data=NO_MAX_CONCURRENCY,
            )
        ],
        unit="none",
        min_value=None,
        steps=thresholds(("red", None), ("green", 0)),
        threshold_style="dashed",
    )


def sequence_tokens() -> JSON:
    return timeseries(
        "Mean sequence tokens",
        "Mean prompt + generation tokens of requests finished in kvwatch's window, per engine. The "
        "estimated max concurrency is the KV capacity divided by this.",
        "A jump (longer prompts, a client raising `max_tokens`) cuts concurrency in proportion: "
        "cap output with `max_tokens`, lower `--max-model-len`, or give the long-context traffic "
        "its own pool.",
        [
            query(
                ENGINE.agg("max", "kvwatch_mean_sequence_tokens", by=BY_ENGINE),
                ENGINE_LEGEND,
                no_data=NO_SEQUENCE_LENGTH,
            )
        ],
        unit=TOKENS,
    )


def lora_adapters() -> JSON:
    return timeseries(
        "LoRA adapters",
        "LoRA adapters with running and with waiting requests (vLLM's `lora_requests_info`; SGLang's "
        "`lora_pool_slots_used` as running only, it does not say which adapters wait), summed over the "
        "selected engines. Present only for servers started with LoRA enabled.",
        "Adapters waiting while fewer than `--max-loras` run, or SGLang's pool full: raise `--max-loras` "
        "(SGLang: `--max-loras-per-batch`; each slot costs "
        "memory, taken from the KV cache). Many distinct adapters in rotation: group traffic by "
        "adapter across pods.",
        [query(ENGINE.agg("sum", "kvwatch_lora_adapters", by="state"), "{{state}}", no_data=NO_LORA)],
        unit="none",
    )


def rejections() -> JSON:
    return timeseries(
        "Requests rejected (HTTP 503)",
        "Requests vLLM's frontend turned away per second because they would pass `--max-num-queued-reqs` "
        "or `--max-num-queued-tokens` (`admission_rejections_total`), by pod, model and reason. The "
        "frontend's count: the same on each engine of a model, so the panel takes the max, not the sum.",
        "Sustained above 0: the queue caps shed load that the limit behind the queue holds back (the "
        "Overview's bottleneck). Fix that limit or add replicas; raising a cap only trades 503s for TTFT.",
        [
            query(
                ENGINE.agg("max", "kvwatch_rejections_per_second", by="namespace, pod, model_name, reason"),
                "{{pod}} · {{model_name}} · {{reason}}",
                no_data=NO_REJECTIONS,
            )
        ],
        unit="reqps",
    )


def build() -> JSON:
    layout = Layout()
    tiles = (capacity_tile(), free_tile(), max_concurrency_tile(), headroom_tile(), sequence_tile(), prefix_tile())
    for panel in tiles:
        layout.add(panel, 4, 4)
    layout.row("KV cache")
    for panel in (capacity_and_free(), pressure(), seconds_to_full(), prefix_hits(), slot_context()):
        layout.add(panel, 12, 8)
    layout.row("Concurrency")
    for panel in (concurrency_vs_running(), capacity_by_limit(), headroom(), sequence_tokens(), lora_adapters()):
        layout.add(panel, 12, 8)
    layout.row("Admission")
    for panel in (rejections(),):
        layout.add(panel, 12, 8)
    return dashboard(
        "kvwatch-capacity",
        "kvwatch / Capacity",
        "How much the KV cache holds and how close it is to full: capacity and free tokens, estimated "
        "max concurrency and headroom, capacity by limit against demand, mean sequence length, the "
        "time-to-full forecast, prefix-cache "
        "hits, llama.cpp's slot context, LoRA adapters, and requests rejected by the queue caps.",
        layout,
        kvwatch_variables(),
    )
