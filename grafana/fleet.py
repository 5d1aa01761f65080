"""kvwatch / Fleet: every engine pod at once (vLLM, SGLang, TensorRT-LLM, llama.cpp), from the engines' own metrics
through the fleet recording rules (no sidecar needed)."""

from __future__ import annotations

from grafana.common import (
    ANY_IS_BAD,
    DASHED,
    ENGINE,
    JSON,
    KV_STEPS,
    NEVER_PREEMPTS,
    NO_FILL,
    NO_KV_GAUGE,
    NO_LIVE_GENERATION,
    THRESHOLDS,
    TOKENS,
    TOKENS_PER_S,
    WAITING_STEPS,
    Layout,
    NoData,
    agg,
    dashboard,
    fixed_color,
    flags,
    override,
    query,
    scope_variables,
    stat,
    state_timeline,
    throughput_gap_overrides,
    timeseries,
)
from kvwatch.catalog import Action, Bottleneck


class Fleet:
    """Per-engine recording rules of alerts/kvwatch-rules.yaml (group ``vllm.fleet*``), computed by
    Prometheus from each engine's raw metrics (``vllm:*``, ``sglang:*``, ``trtllm_*`` / ``nv_trt_llm_*``,
    ``llamacpp:*``). Each keeps the scrape's labels (namespace, pod, job, instance) plus the engine's own
    (vLLM's model_name and engine, SGLang's model_name and dp_rank; llama.cpp has no model_name), so the scope
    variables filter them like any other series."""

    kv_usage_max = "engine:vllm_kv_cache_usage:max1m"
    running = "engine:vllm_num_requests_running:avg1m"
    waiting = "engine:vllm_num_requests_waiting:avg1m"
    preemptions = "engine:vllm_num_preemptions:rate1m"
    prompt_tokens = "engine:vllm_prompt_tokens_computed:rate1m"
    generation_tokens = "engine:vllm_generation_tokens:rate1m"
    throughput_gap = "engine:vllm_throughput_gap:last"
    capacity_tokens = "engine:vllm_kv_cache_capacity:tokens"
    max_concurrency = "engine:vllm_estimated_max_concurrency:requests"
    bottleneck = "engine:vllm_bottleneck:approx"


# The rules' approximation knows no `unreachable` (a pod that cannot be scraped has no engine series).
FLEET_BOTTLENECKS = [b for b in Bottleneck if b is not Bottleneck.UNREACHABLE]


# What the fleet rules cannot read for some engines (docs/alerts.md, "Fleet rules per engine").
NOT_ALL_ENGINES = (
    "llama.cpp exports no KV gauge (since May 2025) and no context size, TensorRT-LLM and llama.cpp no "
    "preemptions: their rows and sums leave those out."
)
BY_POD_MODEL = "namespace, pod, model_name"
# The fleet rules' own gaps for llama.cpp (docs/alerts.md, "Fleet rules per engine").
NO_CAPACITY: NoData = {"llamacpp": "exports no KV-cache size (`--ctx-size` is in `/slots` only)"}
NO_MAX_CONCURRENCY: NoData = {
    "llamacpp": "exports no KV-cache size and no finished-request count: no estimated max concurrency"
}
POD_MODEL_LEGEND = "{{pod}} · {{model_name}}"


# -- the headline tiles ---------------------------------------------------------------------------------


def engine_tiles() -> list[JSON]:
    return [
        stat(
            "Engines reporting",
            "Engines (vLLM, SGLang, TensorRT-LLM, llama.cpp: one per vLLM engine, SGLang data-parallel rank, "
            "server) whose metrics Prometheus scrapes in the selection.",
            "Fewer than the replicas you run: a pod is down, still loading its model, or not scraped; "
            "check the Prometheus targets page and the pod's events.",
            ENGINE.agg("count", Fleet.running),
            unit="none",
        ),
        stat(
            "Engines KV-bound",
            "Engines the fleet rules classify as KV-cache bound over the last minute: a queue while KV "
            f"usage reached {THRESHOLDS.admission_stall:.0%} or requests were preempted (retracted, in SGLang). "
            "Never llama.cpp without a KV gauge: its KV cache cannot be judged from /metrics.",
            "Some KV-bound while others idle: the load balancer ignores KV pressure; route by queue "
            "length or KV usage. All KV-bound: add replicas or KV capacity (FP8 KV cache, more GPU "
            "memory).",
            ENGINE.agg("sum", Fleet.bottleneck, f'bottleneck="{Bottleneck.KV_CACHE}"'),
            unit="none",
            steps=ANY_IS_BAD,
        ),
        stat(
            "Requests waiting",
            "Requests waiting across the selected engines (1-minute mean per engine, summed).",
            "A fleet-wide queue means too few replicas for the load, or a limit binding on every pod: "
            "*Engines by bottleneck* says which; the kvwatch sidecar's Overview dashboard says what to "
            "change.",
            ENGINE.agg("sum", Fleet.waiting),
            unit="none",
            steps=WAITING_STEPS,
            decimals=1,
        ),
    ]


def kv_tiles() -> list[JSON]:
    return [
        stat(
            "Max KV cache usage",
            "KV-cache usage of the fullest selected engine (its maximum over the last minute). " + NOT_ALL_ENGINES,
            f"Above {THRESHOLDS.admission_stall:.0%} on one pod while the others are low: uneven routing. High "
            "everywhere: add replicas or KV capacity.",
            ENGINE.agg("max", Fleet.kv_usage_max),
            unit="percentunit",
            steps=KV_STEPS,
            no_data=NO_KV_GAUGE,
        ),
        stat(
            "Preemptions / s",
            "Requests preempted (SGLang: retracted) per second across the selected engines (1-minute rate). "
            "TensorRT-LLM pauses requests instead and llama.cpp never preempts: they add nothing here.",
            "Sustained preemptions waste compute on recomputing KV: lower the running-request ceiling on the "
            f"preempting pods ({flags(Action.LOWER_MAX_NUM_SEQS)}) or add KV capacity.",
            ENGINE.agg("sum", Fleet.preemptions),
            unit="reqps",
            steps=ANY_IS_BAD,
            no_data=NEVER_PREEMPTS,
        ),
        stat(
            "KV cache capacity",
            "KV-cache tokens of all selected engines together (vLLM's `cache_config_info`, SGLang's "
            "`max_total_num_tokens`, TensorRT-LLM's KV blocks × tokens per block; llama.cpp exports none).",
            "Compare with *Capacity vs demand*: if demand outgrows what this capacity holds, add "
            f"replicas or use an FP8 KV cache (twice the tokens in the same memory: {flags(Action.FP8_KV_CACHE)}).",
            ENGINE.agg("sum", Fleet.capacity_tokens),
            unit=TOKENS,
            no_data=NO_CAPACITY,
        ),
    ]


# -- Pods -----------------------------------------------------------------------------------------------


def kv_heat_map() -> JSON:
    return state_timeline(
        "KV cache usage by pod (heat map)",
        f"One row per pod · model, coloured by its KV-cache usage (maximum over the last minute): "
        f"green below {THRESHOLDS.admission_stall:.0%}, orange above (admission stall), red above "
        f"{THRESHOLDS.preemption_risk:.0%} (preemption risk). llama.cpp pods without a KV gauge have no row.",
        "Rows red while others stay green: the load balancer ignores KV pressure; route by queue "
        "length or KV usage. All rows red: the fleet is short of KV capacity; add replicas.",
        [query(ENGINE.agg("max", Fleet.kv_usage_max, by=BY_POD_MODEL), POD_MODEL_LEGEND, no_data=NO_KV_GAUGE)],
        unit="percentunit",
        steps=KV_STEPS,
        max_value=1,
    )


def engines_by_bottleneck() -> JSON:
    return timeseries(
        "Engines by bottleneck",
        "How many engines are in each state, as the fleet recording rules approximate kvwatch's "
        "diagnosis from the engines' own metrics (without kvwatch's `max_num_seqs` / token-budget hints): "
        "*KV cache*, *max_num_seqs* (the running-request ceiling), *token budget*, *stalled*, *none* (serving, "
        "no queue), *idle*. Only vLLM shows the token budget; llama.cpp without a KV gauge is never KV-bound "
        "here; engines whose token counters move as requests finish (trtllm-serve, SGLang without "
        "`realtime_tokens_total`) are never called stalled.",
        f"KV cache: add KV capacity or replicas. max_num_seqs: raise {flags(Action.RAISE_MAX_NUM_SEQS)} on "
        f"those pods. Token budget: raise {flags(Action.RAISE_MAX_NUM_BATCHED_TOKENS)}. Stalled: restart the "
        "engine. Confirm with the kvwatch sidecar on one of the pods.",
        [query(ENGINE.agg("sum", Fleet.bottleneck, by="bottleneck"), "{{bottleneck}}")],
        unit="none",
        overrides=[override(str(b), fixed_color(b.colour)) for b in FLEET_BOTTLENECKS],
        stepped=True,
    )


def bottleneck_by_pod() -> JSON:
    codes = ENGINE.state_code(Fleet.bottleneck, "bottleneck", Bottleneck, BY_POD_MODEL, skip=(Bottleneck.UNREACHABLE,))
    return state_timeline(
        "Bottleneck by pod",
        "The fleet rules' bottleneck per pod · model (the most severe across its engines, in "
        "kvwatch's order of severity).",
        "Follow a red (KV cache), orange (max_num_seqs) or yellow (token budget) row to that pod's "
        "kvwatch Overview for the evidence and the recommended change.",
        [query(codes, POD_MODEL_LEGEND)],
        states=Bottleneck,
    )


def capacity_vs_demand() -> JSON:
    return timeseries(
        "Capacity vs demand",
        "Demand (requests running + waiting, 1-minute means) against capacity: how many requests "
        "of the observed mean length (prompt + output) the selected engines' KV caches hold "
        "together (no llama.cpp: it exports neither its context size nor finished requests).",
        "Demand above capacity: requests queue on the KV cache; add replicas, use an FP8 KV cache, "
        "or shorten sequences. Demand far below capacity on every pod: the fleet is over-provisioned.",
        [
            query(
                agg("sum", f"{ENGINE.sel(Fleet.running)} + {ENGINE.sel(Fleet.waiting)}"), "demand (running + waiting)"
            ),
            query(ENGINE.agg("sum", Fleet.running), "running"),
            query(
                ENGINE.agg("sum", Fleet.max_concurrency),
                "capacity (estimated max concurrency)",
                no_data=NO_MAX_CONCURRENCY,
            ),
        ],
        unit="none",
        overrides=[
            override("demand (running + waiting)", fixed_color("orange")),
            override("running", fixed_color("blue")),
            override("capacity (estimated max concurrency)", fixed_color("red"), DASHED, NO_FILL),
        ],
    )


def tokens() -> JSON:
    gap = "engines in throughput gap"
    return timeseries(
        "Prompt vs generation tokens / s",
        "Prefill tokens computed (cached prompt tokens excluded) and tokens generated per second "
        "across the selected engines; the shaded series (right axis) counts engines in the "
        "throughput gap (prefill ~0 while generation goes on and requests wait). TensorRT-LLM and llama.cpp "
        "count tokens as requests finish (lumpy; no gap from them); Triton's backend counts none.",
        "Engines in the gap have admission gated: by free KV blocks if they are KV-bound, by the "
        "sequence ceiling otherwise. See *Engines by bottleneck*.",
        [
            query(ENGINE.agg("sum", Fleet.prompt_tokens), "prompt (computed)"),
            query(ENGINE.agg("sum", Fleet.generation_tokens), "generation"),
            query(ENGINE.agg("sum", Fleet.throughput_gap), gap, no_data=NO_LIVE_GENERATION),
        ],
        unit=TOKENS_PER_S,
        overrides=throughput_gap_overrides("prompt (computed)", gap),
    )


def build() -> JSON:
    layout = Layout()
    for panel in engine_tiles() + kv_tiles():
        layout.add(panel, 4, 4)
    layout.row("Pods")
    layout.add(kv_heat_map(), 24, 8)
    for panel in (engines_by_bottleneck(), bottleneck_by_pod(), capacity_vs_demand(), tokens()):
        layout.add(panel, 12, 8)
    return dashboard(
        "kvwatch-fleet",
        "kvwatch / Fleet",
        "All engine pods at once (vLLM, SGLang, TensorRT-LLM, llama.cpp), from the engines' own metrics through "
        "the fleet recording rules of alerts/kvwatch-rules.yaml (no sidecar needed): KV usage heat map, engines "
        "by bottleneck, capacity vs demand.",
        layout,
        # The rules' series, not one engine's raw family: every engine's pods and models are offered.
        scope_variables(Fleet.running, Fleet.running),
    )
