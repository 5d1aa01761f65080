"""kvwatch / Latency: TTFT, inter-token latency and queue time quantiles, and SLO attainment."""

from __future__ import annotations

from grafana.common import (
    BY_ENGINE,
    DASHED,
    ENGINE,
    ENGINE_LEGEND,
    JSON,
    NO_FILL,
    NO_LATENCY_HISTOGRAMS,
    RATE,
    SLO_STEPS,
    Layout,
    NoData,
    agg,
    custom_variable,
    dashboard,
    divide,
    fixed_color,
    kvwatch_variables,
    override,
    query,
    stat,
    timeseries,
)
from kvwatch.engines import sglang, trtllm
from kvwatch.snapshot import Hist

# Latency SLO thresholds offered by the Latency dashboard. They must be bucket bounds of vLLM's
# histograms, spelled as vLLM spells its `le` labels.
TTFT_SLO_OPTIONS = ["0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0"]
TTFT_SLO_DEFAULT = "2.5"
ITL_SLO_OPTIONS = ["0.025", "0.05", "0.075", "0.1", "0.15", "0.2", "0.3", "0.5"]
ITL_SLO_DEFAULT = "0.1"

QUANTILES = [("0.5", "p50", "light-blue"), ("0.9", "p90", "blue"), ("0.99", "p99", "dark-blue")]

# The TTFT SLO of the alerts (alerts/kvwatch-rules.yaml, group kvwatch.config / kvwatch.slo): a time-slice
# SLO on kvwatch's p99, with its threshold and objective as label-less constants.
SLO_THRESHOLD = "kvwatch:slo_ttft_p99_threshold:seconds"
SLO_OBJECTIVE = "kvwatch:slo_ttft_objective:ratio"
SLO_ERRORS = "engine:kvwatch_ttft_slo_errors:ratio_avg{}"
NO_TTFT_P99: NoData = {"llamacpp": "exports no TTFT histogram: kvwatch has no p99 TTFT for the SLO rules to judge"}


def p99(metric: str, by: str = "") -> str:
    return ENGINE.agg("max", metric, 'quantile="0.99"', by=by)


def engine_histograms(vllm_name: str, hist: Hist) -> list[str]:
    """The histogram of ``hist`` in every engine that exports one, as its adapter names it (kvwatch/engines/*.py):
    vLLM, SGLang, trtllm-serve. llama.cpp exports no histograms, Triton's TensorRT-LLM backend none of these."""
    return (
        [vllm_name]
        + [name for name, h in sglang.HISTOGRAMS.items() if h is hist]
        + [trtllm.PREFIX + name for name, h in trtllm.HISTOGRAMS.items() if h is hist]
    )


def slo_attainment(histograms: list[str], variable: str) -> str:
    """Share of observations at or under ``$variable`` seconds (a bucket bound) over the rate interval, over the
    engines' histograms that have that bound (the engines' buckets differ: one without it is left out, not
    counted as all-late)."""
    bound = f'le="${variable}"'
    within = agg("sum", " or ".join(f"rate({ENGINE.sel(f'{h}_bucket', bound)}[{RATE}])" for h in histograms))
    observed = agg(
        "sum",
        " or ".join(
            f"(rate({ENGINE.sel(f'{h}_count')}[{RATE}]) and ignoring (le) {ENGINE.sel(f'{h}_bucket', bound)})"
            for h in histograms
        ),
    )
    return divide(within, observed)


TTFT_SLO = slo_attainment(
    engine_histograms("vllm:time_to_first_token_seconds", Hist.TIME_TO_FIRST_TOKEN_SECONDS), "ttft_slo"
)
ITL_SLO = slo_attainment(
    engine_histograms("vllm:inter_token_latency_seconds", Hist.INTER_TOKEN_LATENCY_SECONDS), "itl_slo"
)


def quantile_panel(title: str, metric: str, what: str, todo: str, extra: tuple[tuple[str, str, str], ...] = ()) -> JSON:
    """Quantiles of the worst engine; ``extra`` adds dashed reference lines (PromQL, legend, colour)."""
    return timeseries(
        title,
        what + " Worst engine of the selection, over kvwatch's window.",
        todo,
        [
            query(ENGINE.agg("max", metric, f'quantile="{q}"'), legend, no_data=NO_LATENCY_HISTOGRAMS)
            for q, legend, _ in QUANTILES
        ]
        + [query(expr, legend) for expr, legend, _ in extra],
        unit="s",
        overrides=[override(legend, fixed_color(color)) for _, legend, color in QUANTILES]
        + [override(legend, fixed_color(color), DASHED, NO_FILL) for _, legend, color in extra],
    )


# -- the headline tiles ---------------------------------------------------------------------------------


def quantile_tiles() -> list[JSON]:
    return [
        stat(
            "TTFT p99",
            "99th percentile time to first token of the worst selected engine, over kvwatch's window: "
            "queueing + prefill + the first decode step.",
            "High with requests waiting: the cause is the queue, see *Queue time* and the Overview "
            "bottleneck. High without a queue: long prompts, raise `--max-num-batched-tokens` or "
            "enable chunked prefill / prefix caching.",
            p99("kvwatch_time_to_first_token_seconds"),
            unit="s",
            no_data=NO_LATENCY_HISTOGRAMS,
        ),
        stat(
            "Inter-token latency p99",
            "99th percentile time between streamed tokens of the worst selected engine.",
            "High when prefills of new requests interleave with decoding: lower "
            "`--max-num-batched-tokens`, or fewer concurrent sequences (`--max-num-seqs`).",
            p99("kvwatch_inter_token_latency_seconds"),
            unit="s",
            no_data=NO_LATENCY_HISTOGRAMS,
        ),
        stat(
            "Queue time p99",
            "99th percentile time requests spent in the engine's waiting queue (worst selected engine).",
            "Seconds of queueing mean a limit binds: the Overview dashboard's bottleneck says which "
            "(KV cache, max_num_seqs or token budget) and what to change.",
            p99("kvwatch_queue_time_seconds"),
            unit="s",
            no_data=NO_LATENCY_HISTOGRAMS,
        ),
    ]


def slo_tiles() -> list[JSON]:
    return [
        stat(
            "TTFT SLO attainment",
            "Share of requests whose time to first token was within the *TTFT SLO* variable, across "
            "the selected engines (from the engines' own histograms: vLLM, SGLang, TensorRT-LLM; an engine whose "
            "buckets lack that bound is left out; llama.cpp exports none).",
            "Under target: find the cause in *Queue time* (queueing) vs prefill time; queueing is "
            "fixed on the Overview dashboard, slow prefill by prefix caching or a larger token budget.",
            TTFT_SLO,
            unit="percentunit",
            steps=SLO_STEPS,
            no_data=NO_LATENCY_HISTOGRAMS,
        ),
        stat(
            "ITL SLO attainment",
            "Share of inter-token gaps within the *ITL SLO* variable, across the selected engines "
            "(from the engines' own histograms: vLLM, SGLang, TensorRT-LLM; an engine whose buckets lack that bound "
            "is left out; llama.cpp exports none).",
            "Under target: decoding is slowed by large batches or long prefills mixed into decode "
            "steps; lower `--max-num-batched-tokens` or `--max-num-seqs`, or add replicas.",
            ITL_SLO,
            unit="percentunit",
            steps=SLO_STEPS,
            no_data=NO_LATENCY_HISTOGRAMS,
        ),
    ]


# -- Quantiles ------------------------------------------------------------------------------------------


def quantile_panels() -> list[JSON]:
    return [
        quantile_panel(
            "Time to first token",
            "kvwatch_time_to_first_token_seconds",
            "TTFT quantiles (p50, p90, p99), and (dashed) the p99 threshold of the TTFT SLO the alerts page on.",
            "p99 above the dashed line burns the SLO's error budget. p99 far above p50 with a queue: "
            "requests wait for admission (see *Queue time*). All quantiles high: prefill itself is "
            "slow (long prompts; enable prefix caching, raise the token budget).",
            extra=((agg("max", SLO_THRESHOLD), "SLO threshold", "red"),),
        ),
        quantile_panel(
            "Inter-token latency",
            "kvwatch_inter_token_latency_seconds",
            "Inter-token latency quantiles (p50, p90, p99).",
            "p99 spikes while new requests prefill: long prompts are chunked into decode steps; "
            "lower `--max-num-batched-tokens` to shorten those steps. Steadily high: the batch is too "
            "large for the GPU, lower `--max-num-seqs` or scale out.",
        ),
        quantile_panel(
            "Queue time",
            "kvwatch_queue_time_seconds",
            "Time in the engine's waiting queue, quantiles (p50, p90, p99).",
            "Any sustained queue time is a capacity problem: the Overview dashboard says which limit "
            "binds. Raising `--max-num-seqs` helps only when that limit is *max_num_seqs*.",
        ),
    ]


# -- SLO ------------------------------------------------------------------------------------------------


def slo_attainment_panel() -> JSON:
    return timeseries(
        "SLO attainment",
        "Share of requests within the *TTFT SLO* and of inter-token gaps within the *ITL SLO* "
        "(dashboard variables; they must be bucket bounds of vLLM's histograms), from the engines' own "
        "histograms across the selected engines (vLLM, SGLang, TensorRT-LLM; an engine whose buckets lack the "
        "bound is left out; llama.cpp exports no histograms). No line while there is no traffic.",
        "Dips line up with queueing (see *Queue time* and the Overview bottleneck): fix the "
        "binding limit, or add replicas if every limit is already tuned.",
        [
            query(TTFT_SLO, "TTFT ≤ ${ttft_slo}s", no_data=NO_LATENCY_HISTOGRAMS),
            query(ITL_SLO, "ITL ≤ ${itl_slo}s", no_data=NO_LATENCY_HISTOGRAMS),
        ],
        unit="percentunit",
        max_value=1,
        steps=SLO_STEPS,
    )


def ttft_by_engine() -> JSON:
    return timeseries(
        "TTFT p99 by engine",
        "99th percentile time to first token of each engine, to find the outlier.",
        "One engine far above the others: check its bottleneck on the Overview dashboard (one "
        "replica can be KV-bound while others idle: fix the routing / load balancing).",
        [query(p99("kvwatch_time_to_first_token_seconds", by=BY_ENGINE), ENGINE_LEGEND, no_data=NO_LATENCY_HISTOGRAMS)],
        unit="s",
        legend="table",
    )


def alerted_slo() -> JSON:
    return timeseries(
        "TTFT SLO as alerted: time within the p99 threshold",
        "The alerts' TTFT SLO per engine: the share of time kvwatch's p99 TTFT stayed under the "
        "threshold, over the last 5 minutes and the last hour, against the objective (dashed). "
        "Threshold and objective are set once in alerts/kvwatch-rules.yaml (group kvwatch.config).",
        "The 5-minute line well under the objective pages fast (a fast burn); the 1-hour line under "
        "it means the error budget is going. Find the cause with the Overview dashboard's "
        "bottleneck and queue time, then apply its recommendation.",
        [
            query(f"1 - {ENGINE.sel(SLO_ERRORS.format('5m'))}", "5m · " + ENGINE_LEGEND, no_data=NO_TTFT_P99),
            query(f"1 - {ENGINE.sel(SLO_ERRORS.format('1h'))}", "1h · " + ENGINE_LEGEND, no_data=NO_TTFT_P99),
            query(agg("max", SLO_OBJECTIVE), "objective"),
        ],
        unit="percentunit",
        max_value=1,
        overrides=[override("objective", fixed_color("red"), DASHED, NO_FILL)],
    )


def variables() -> list[JSON]:
    return kvwatch_variables() + [
        custom_variable(
            "ttft_slo",
            "TTFT SLO (s)",
            TTFT_SLO_OPTIONS,
            TTFT_SLO_DEFAULT,
            "Time-to-first-token objective in seconds; one of vLLM's histogram bucket bounds (SGLang's TTFT "
            "buckets share 0.1, 1.0 and 10.0).",
        ),
        custom_variable(
            "itl_slo",
            "ITL SLO (s)",
            ITL_SLO_OPTIONS,
            ITL_SLO_DEFAULT,
            "Inter-token latency objective in seconds; one of vLLM's histogram bucket bounds.",
        ),
    ]


def build() -> JSON:
    layout = Layout()
    for panel, w in zip(quantile_tiles() + slo_tiles(), [5, 5, 5, 5, 4], strict=False):
        layout.add(panel, w, 4)
    layout.row("Quantiles")
    for panel in quantile_panels():
        layout.add(panel, 8, 8)
    layout.row("SLO")
    for panel in (slo_attainment_panel(), ttft_by_engine(), alerted_slo()):
        layout.add(panel, 12, 8)
    return dashboard(
        "kvwatch-latency",
        "kvwatch / Latency",
        "Time to first token, inter-token latency and queue time quantiles (kvwatch), and SLO attainment "
        "(the engines' histograms).",
        layout,
        variables(),
    )
