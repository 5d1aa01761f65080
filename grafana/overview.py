"""kvwatch / Overview: which limit binds now and what to change, then the evidence."""

from __future__ import annotations

from grafana.common import (
    ANY_IS_BAD,
    BY_ENGINE,
    BY_POD,
    DASHED,
    ENGINE,
    ENGINE_KEY,
    ENGINE_LEGEND,
    JSON,
    KV_STEPS,
    NEVER_PREEMPTS,
    NO_FILL,
    NO_KV_GAUGE,
    NO_LIVE_GENERATION,
    NO_MAX_CONCURRENCY,
    NO_STEP_TOKENS,
    POD,
    RANGE,
    TARGET_KEY,
    THRESHOLDS,
    TOKENS,
    TOKENS_PER_S,
    WAITING_STEPS,
    Layout,
    agg,
    color_cells,
    dashboard,
    dashed_series,
    fixed_color,
    flags,
    kvwatch_variables,
    override,
    query,
    stat,
    state_timeline,
    table,
    thresholds,
    throughput_gap_overrides,
    timeseries,
    value_mappings,
)
from kvwatch.catalog import Action, Bottleneck


def engine_bottleneck() -> str:
    return ENGINE.state_code("kvwatch_bottleneck", "bottleneck", Bottleneck, BY_ENGINE)


def target_bottleneck(by: str = BY_POD + ", target") -> str:
    return POD.state_code("kvwatch_target_bottleneck", "bottleneck", Bottleneck, by)


def evidence(op: str, metric: str) -> str:
    """``op``_over_time of a per-engine ``metric`` over the dashboard's range, attached to each
    recommendation the engine had in that range (one row per engine and action)."""
    active = f"count_over_time({ENGINE.sel('kvwatch_recommendation')}[{RANGE}]) > bool 0"
    return f"{op}_over_time({ENGINE.sel(metric)}[{RANGE}]) * on ({ENGINE_KEY}) group_right () ({active})"


# -- the headline tiles: the diagnosis first, and how bad the symptoms are ------------------------------


def worst_bottleneck() -> JSON:
    # An unreachable target has no per-engine series: its target-level state joins the engines'.
    target_unreachable = POD.sel("kvwatch_target_bottleneck", f'bottleneck="{Bottleneck.UNREACHABLE}"')
    worst = agg(
        "max",
        f"{ENGINE.state_code('kvwatch_bottleneck', 'bottleneck', Bottleneck)} or "
        f"{target_unreachable} * {Bottleneck.UNREACHABLE.severity}",
    )
    return stat(
        "Worst bottleneck now",
        "The most severe limit binding across the selected engines, as kvwatch diagnoses it: "
        "*KV cache* (free KV blocks cannot hold the next prefill), *max_num_seqs* (the sequence "
        "ceiling is full with KV room to spare), *token budget* (prefill pinned at "
        "`max_num_batched_tokens`), *max_loras* (requests wait for a LoRA slot), *asleep* (vLLM's "
        "sleep mode), *stalled* (requests present, no token progress), *unreachable* (kvwatch cannot scrape the engine).",
        "Read the *Recommendations* table below for the change to make (each flag in the engine's own words), "
        "and *Bottleneck by pod and model* for which engine it is. KV cache: FP8 KV cache, prefix caching, a "
        "shorter context, more memory for the KV cache, or another replica. "
        f"max_num_seqs: raise the running-request ceiling ({flags(Action.RAISE_MAX_NUM_SEQS)}). Token budget: "
        f"raise the step budget ({flags(Action.RAISE_MAX_NUM_BATCHED_TOKENS)}). "
        f"max_loras: raise the LoRA slots ({flags(Action.RAISE_MAX_LORAS)}). Asleep: wake it (`POST /wake_up`), do "
        "not restart it.",
        worst,
        unit="none",
        mappings=value_mappings(Bottleneck),
        steps=thresholds(("text", None)),
        no_value="no kvwatch data",
    )


def requests_waiting() -> JSON:
    return stat(
        "Requests waiting",
        "Requests in the engine's waiting queue across the selected engines (llama.cpp: deferred, no slot "
        "free). A queue that persists "
        "means new requests pay queueing time on top of TTFT.",
        "Look at *Worst bottleneck now*: it says which limit keeps them waiting. Do not raise the "
        "running-request ceiling (`--max-num-seqs` and its kin) unless the bottleneck is *max_num_seqs*: when "
        "the KV cache is full it "
        "only adds preemptions.",
        ENGINE.agg("sum", "kvwatch_requests_waiting"),
        unit="none",
        steps=WAITING_STEPS,
    )


def max_kv_usage() -> JSON:
    return stat(
        "Max KV cache usage",
        f"KV-cache usage of the fullest selected engine. Above {THRESHOLDS.admission_stall:.0%} new prefills "
        f"stall (admission stall); above {THRESHOLDS.preemption_risk:.0%} running requests get preempted "
        "(kvwatch's default thresholds).",
        "If it sits in orange or red while requests wait, the KV cache is the bottleneck: "
        "shrink KV per token (`--kv-cache-dtype fp8`), reuse prefixes "
        "(`--enable-prefix-caching`), cap `--max-model-len`, raise `--gpu-memory-utilization` "
        "or add a replica.",
        ENGINE.agg("max", "kvwatch_kv_cache_usage_ratio"),
        unit="percentunit",
        steps=KV_STEPS,
        no_data=NO_KV_GAUGE,
    )


def preemptions() -> JSON:
    return stat(
        "Preemptions / s",
        "Running requests evicted per second to free KV blocks, summed over the selected "
        "engines. Each preemption throws away computed KV that must be recomputed.",
        "Any sustained value means the KV cache is over-committed: lower `--max-num-seqs` so "
        "fewer sequences compete for blocks, or add KV capacity (FP8 KV cache, more GPU memory, "
        "another replica).",
        ENGINE.agg("sum", "kvwatch_preemptions_per_second"),
        unit="reqps",
        steps=ANY_IS_BAD,
        no_data=NEVER_PREEMPTS,
    )


def unreachable_targets() -> JSON:
    return stat(
        "Unreachable targets",
        "Engine `/metrics` endpoints that kvwatch failed to scrape on its last attempt.",
        "Check that the engine is up (a loading model is not yet serving `/metrics`), the `--target` "
        "URL, and `--bearer-token-file` when the engine requires an API key (vLLM `--api-key`). *Scrape errors by "
        "reason* below says why.",
        agg("sum", f"1 - {POD.sel('kvwatch_up')}"),
        unit="none",
        steps=ANY_IS_BAD,
    )


# -- Diagnosis ------------------------------------------------------------------------------------------


def bottleneck_timeline() -> JSON:
    return state_timeline(
        "Bottleneck by pod and model",
        "kvwatch's diagnosis over time: one row per engine (pod · model · engine), plus one row per "
        "pod with the most severe state across its engines (*unreachable* shows there when the "
        "engine cannot be scraped).",
        "Hover a red (KV cache), orange (max_num_seqs) or yellow (token budget) stretch and compare "
        "with the panels below: KV usage near the dashed thresholds and a throughput gap confirm "
        "a KV bound; Running flat at `max_num_seqs` with KV room confirms the sequence ceiling. "
        "*Recommendations* gives the fix.",
        [
            query(target_bottleneck(), "{{pod}} · all engines"),
            query(engine_bottleneck(), ENGINE_LEGEND),
        ],
        states=Bottleneck,
    )


def recommendations() -> JSON:
    share_active = (
        f"count_over_time({ENGINE.sel('kvwatch_recommendation')}[{RANGE}]) / on ({TARGET_KEY}) group_left () "
        f"count_over_time({POD.sel('kvwatch_up')}[{RANGE}])"
    )
    return table(
        "Recommendations in the time range, with evidence",
        "Every change kvwatch recommended for an engine during the selected time range: *Active* is "
        "the share of the range it was recommended, the other columns are the evidence over the same "
        "range (peak KV usage, peak queue, peak preemption rate, share of time in the throughput gap, "
        "lowest concurrency headroom). The full reasoning is in kvwatch's `/api/v1/diagnosis`.",
        "Apply the top recommendation of the engine that is red in *Bottleneck by pod and model*: "
        "`fp8_kv_cache` → `--kv-cache-dtype fp8`; `enable_prefix_caching` → `--enable-prefix-caching`; "
        "`reduce_max_model_len` → lower `--max-model-len`; `raise_gpu_memory_utilization`; "
        "`raise_max_num_seqs` / `lower_max_num_seqs` → `--max-num-seqs`; "
        "`raise_max_num_batched_tokens` → `--max-num-batched-tokens`; `add_replica`; `restart_engine`.",
        {"pod": "Pod", "model_name": "Model", "engine": "Engine", "action": "Recommendation"},
        [
            ("Active", share_active, "percentunit"),
            ("Peak KV usage", evidence("max", "kvwatch_kv_cache_usage_ratio"), "percentunit"),
            ("Peak waiting", evidence("max", "kvwatch_requests_waiting"), "none"),
            ("Peak preemptions / s", evidence("max", "kvwatch_preemptions_per_second"), "reqps"),
            ("Throughput gap", evidence("avg", "kvwatch_throughput_gap"), "percentunit"),
            ("Min headroom", evidence("min", "kvwatch_concurrency_headroom"), "none"),
        ],
        column_overrides=[color_cells("Peak KV usage", KV_STEPS), color_cells("Peak preemptions / s", ANY_IS_BAD)],
        sort_by="Active",
        no_data={
            "Peak KV usage": NO_KV_GAUGE,
            "Peak preemptions / s": NEVER_PREEMPTS,
            "Throughput gap": NO_LIVE_GENERATION,
            "Min headroom": NO_MAX_CONCURRENCY,
        },
    )


# -- Why requests wait ----------------------------------------------------------------------------------


def kv_usage() -> JSON:
    return timeseries(
        "KV cache usage",
        f"Share of KV-cache blocks in use per engine. Dashed lines: admission stall at "
        f"{THRESHOLDS.admission_stall:.0%} (new prefills stop being admitted) and preemption risk at "
        f"{THRESHOLDS.preemption_risk:.0%} (running requests get evicted), kvwatch's default thresholds.",
        "Usage pinned above the first line while requests wait is a KV-cache bound: FP8 KV cache, "
        "prefix caching, a lower `--max-model-len`, more `--gpu-memory-utilization`, or another "
        "replica. If you changed `--admission-stall-threshold` / `--preemption-risk-threshold`, the "
        "lines show the defaults, not your values.",
        [query(ENGINE.agg("max", "kvwatch_kv_cache_usage_ratio", by=BY_ENGINE), ENGINE_LEGEND, no_data=NO_KV_GAUGE)],
        unit="percentunit",
        max_value=1,
        steps=KV_STEPS,
        threshold_style="dashed",
    )


def throughput_gap() -> JSON:
    gap = "throughput gap (engines)"
    return timeseries(
        "Throughput gap: prompt vs generation tokens / s",
        "Prefill (prompt) tokens computed per second against generated tokens per second. The "
        "*throughput gap* is prompt throughput dropping to ~0 while generation continues and "
        "requests wait: the scheduler admits no new prefill. The shaded series (right axis) counts "
        "engines in the gap.",
        "A gap together with high KV usage means admission is gated by free KV blocks (fix the KV "
        "cache). A gap with low KV usage and Running at `max_num_seqs` is the sequence ceiling "
        "(raise `--max-num-seqs`). Prompt throughput alone alternating 0 / bursts at 1 s "
        "resolution is normal when admission is gated either way.",
        [
            query(ENGINE.agg("sum", "kvwatch_prompt_tokens_per_second"), "prompt (prefill)"),
            query(ENGINE.agg("sum", "kvwatch_generation_tokens_per_second"), "generation"),
            query(ENGINE.agg("sum", "kvwatch_throughput_gap"), gap, no_data=NO_LIVE_GENERATION),
        ],
        unit=TOKENS_PER_S,
        overrides=throughput_gap_overrides("prompt (prefill)", gap),
    )


def running_vs_ceilings() -> JSON:
    return timeseries(
        "Running / waiting vs max_num_seqs and estimated max concurrency",
        "Requests running and waiting, summed over the selected engines, against the two ceilings: "
        "`max_num_seqs` (configured, or inferred by kvwatch from a plateau) and the estimated max "
        "concurrency the KV cache holds at the current mean sequence length.",
        "Running flat at `max_num_seqs` while requests wait and the KV line is well above it: raise "
        "`--max-num-seqs`. Running flat at the estimated max concurrency, below `max_num_seqs`: the "
        "KV cache is the limit, raising `--max-num-seqs` would only add preemptions.",
        [
            query(ENGINE.agg("sum", "kvwatch_requests_running"), "running"),
            query(ENGINE.agg("sum", "kvwatch_requests_waiting"), "waiting"),
            query(agg("sum", ENGINE.agg("max", "kvwatch_max_num_seqs", by=BY_ENGINE)), "max_num_seqs"),
            query(
                ENGINE.agg("sum", "kvwatch_estimated_max_concurrency"),
                "estimated max concurrency",
                no_data=NO_MAX_CONCURRENCY,
            ),
        ],
        unit="none",
        overrides=[
            override("running", fixed_color("blue")),
            override("waiting", fixed_color("orange")),
            override("max_num_seqs", fixed_color("purple"), DASHED, NO_FILL),
            override("estimated max concurrency", fixed_color("red"), DASHED, NO_FILL),
        ],
    )


def preemptions_by_engine() -> JSON:
    return timeseries(
        "Preemptions / s",
        "Requests preempted per second on each engine (their KV blocks were freed and must be "
        "recomputed when they resume).",
        "Preemptions mean the running batch outgrew the KV cache: lower `--max-num-seqs`, shorten "
        "`--max-model-len`, use an FP8 KV cache, or add a replica. Occasional single spikes at "
        "saturation are tolerable; a steady rate wastes compute.",
        [
            query(
                ENGINE.agg("max", "kvwatch_preemptions_per_second", by=BY_ENGINE), ENGINE_LEGEND, no_data=NEVER_PREEMPTS
            )
        ],
        unit="reqps",
    )


def step_tokens() -> JSON:
    return timeseries(
        "Tokens per engine step vs max_num_batched_tokens",
        "Mean tokens scheduled per engine step on each engine (dashed: the per-step token budget "
        "`max_num_batched_tokens`, configured or inferred).",
        "Steps pinned at the budget while requests wait, with KV and sequence room to spare, mean "
        "prefill is throttled by the budget: raise `--max-num-batched-tokens` (at the cost of "
        "inter-token latency of running requests while long prompts prefill).",
        [
            query(ENGINE.agg("max", "kvwatch_engine_step_tokens", by=BY_ENGINE), ENGINE_LEGEND, no_data=NO_STEP_TOKENS),
            query(
                ENGINE.agg("max", "kvwatch_max_num_batched_tokens", by=BY_ENGINE),
                "budget · {{pod}} · engine {{engine}}",
                no_data=NO_STEP_TOKENS,
            ),
        ],
        unit=TOKENS,
        overrides=[dashed_series("^budget.*")],
    )


# -- kvwatch itself -------------------------------------------------------------------------------------


def scrape_success() -> JSON:
    by = f"{BY_POD}, target"
    up = POD.agg("min", "kvwatch_up", by=by)
    # The engine each target is read as (kvwatch_target_info, absent until one is recognised: then no engine_type).
    info = POD.agg("max", "kvwatch_target_info", by=f"{by}, engine_type")
    up_by_engine = f"{up} * on ({by}) group_left (engine_type) {info} or ({up} unless on ({by}) {info})"
    return timeseries(
        "Scrape success",
        "1 while kvwatch's last scrape of each target succeeded, 0 while it fails; the legend names the engine "
        "kvwatch reads the target as (`engine_type`: vllm, sglang, trtllm, llamacpp; none until recognised).",
        "0 for longer than a model load: check the engine's health, the `--target` URL (trtllm-serve serves "
        "Prometheus text at `/prometheus/metrics`) and the bearer token; kvwatch withdraws the derived series "
        "after `--stale-after` so the other panels go blank rather than freeze.",
        [query(up_by_engine, "{{pod}} · {{target}} · {{engine_type}}")],
        unit="bool",
        max_value=1,
        stepped=True,
    )


def scrape_errors() -> JSON:
    return timeseries(
        "Scrape errors by reason",
        "Failed scrapes per second by reason: `connect`, `timeout`, `http_status`, `too_large`, "
        "`decode`, `parse`, `no_vllm_metrics`.",
        "`connect`: the engine is down or still loading. `timeout`: raise `--timeout` (it must stay "
        "below `--interval`). `http_status` 401/403: set `--bearer-token-file`. `too_large`: raise "
        "`--max-body-bytes`. `no_vllm_metrics`: the URL serves no metrics of an engine kvwatch reads "
        "(or not `--engine`'s).",
        [query(POD.sum_rate("kvwatch_scrape_errors_total", by="pod, reason"), "{{pod}} · {{reason}}")],
        unit="reqps",
    )


def scrape_duration() -> JSON:
    return timeseries(
        "Scrape duration",
        "How long kvwatch's last fetch + parse of each target's `/metrics` took.",
        "Durations approaching `--timeout` (default 0.8 s) lead to `timeout` errors and gaps: an "
        "overloaded API server answers `/metrics` slowly too. Raise `--interval` and "
        "`--timeout` together, or investigate the API server.",
        [query(POD.agg("max", "kvwatch_scrape_duration_seconds", by=f"{BY_POD}, target"), "{{pod}} · {{target}}")],
        unit="s",
    )


def build() -> JSON:
    layout = Layout()
    for panel, w in [
        (worst_bottleneck(), 6),
        (requests_waiting(), 4),
        (max_kv_usage(), 5),
        (preemptions(), 5),
        (unreachable_targets(), 4),
    ]:
        layout.add(panel, w, 4)
    layout.row("Diagnosis")
    layout.add(bottleneck_timeline(), 24, 8)
    layout.add(recommendations(), 24, 7)
    layout.row("Why requests wait")
    for panel in (kv_usage(), throughput_gap(), running_vs_ceilings(), preemptions_by_engine(), step_tokens()):
        layout.add(panel, 12, 8)
    layout.row("kvwatch itself")
    for panel in (scrape_success(), scrape_errors(), scrape_duration()):
        layout.add(panel, 8, 7)
    return dashboard(
        "kvwatch-overview",
        "kvwatch / Overview",
        "Why are requests waiting? kvwatch's diagnosis first (which limit binds, what to change), "
        "then the evidence: KV usage against the admission-stall and preemption thresholds, the "
        "throughput gap, running vs the ceilings, preemptions.",
        layout,
        kvwatch_variables(),
    )
