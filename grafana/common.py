"""What every dashboard shares: PromQL scoped by the dashboard variables, panels, overrides, thresholds,
state codes, the grid layout, the variables and the dashboard frame.

Bottlenecks, KV-pressure states, their text and colours and the KV thresholds come from kvwatch.catalog, so
a new state shows in every dashboard without an edit here."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from kvwatch.catalog import Action, Bottleneck, KvPressure, Thresholds
from kvwatch.engines import ENGINES, by_name, llamacpp, sglang, trtllm

JSON = dict[str, Any]

DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
RANGE = "$__range"
TAG = "kvwatch"
GRID_WIDTH = 24
SCHEMA_VERSION = 39

# kvwatch's default thresholds: a deployment may set others by flag, which a dashboard cannot see.
THRESHOLDS = Thresholds()

# Labels that identify one engine of one scraped kvwatch (join key for the recommendations table).
ENGINE_KEY = "namespace, pod, job, instance, target, model_name, engine"
TARGET_KEY = "namespace, pod, job, instance, target"
BY_ENGINE = "namespace, pod, model_name, engine"
BY_POD = "namespace, pod"
ENGINE_LEGEND = "{{pod}} · {{model_name}} · engine {{engine}}"

TOKENS = "count:tok"
TOKENS_PER_S = "count:tok/s"

# State sets exported as one 0/1 series per state are shown as one numeric code per engine: a state's
# code is its position in the catalogue's enum, which lists states least severe first (for a Bottleneck
# it is its .severity), so ``max`` over several engines is the most severe state.
States = type[Bottleneck] | type[KvPressure]


# ---------------------------------------------------------------------------------------------------
# PromQL
# ---------------------------------------------------------------------------------------------------


def agg(op: str, expr: str, by: str = "") -> str:
    return f"{op} by ({by}) ({expr})" if by else f"{op}({expr})"


def divide(numerator: str, denominator: str) -> str:
    """numerator / denominator, dropping points whose denominator is 0 (idle periods give no NaN)."""
    return f"{numerator} / ({denominator} > 0)"


class Promql:
    """PromQL snippets whose every selector carries one label selector (the dashboard's scope variables)."""

    def __init__(self, selector: str) -> None:
        self.selector = selector

    def sel(self, metric: str, *matchers: str) -> str:
        return f"{metric}{{{', '.join((self.selector, *matchers))}}}"

    def agg(self, op: str, metric: str, *matchers: str, by: str = "") -> str:
        return agg(op, self.sel(metric, *matchers), by)

    def sum_rate(self, metric: str, *matchers: str, by: str = "") -> str:
        return agg("sum", f"rate({self.sel(metric, *matchers)}[{RATE}])", by)

    def state_code(self, metric: str, label: str, states: States, by: str = "", skip: tuple[str, ...] = ()) -> str:
        """One value per group: the code (position in ``states``) of the state whose series is 1.

        Each state's series is multiplied by its code; as exactly one state is 1 and codes rise with
        severity, the max per group is the active state (the most severe one across several engines).
        """
        parts = []
        for code, state in enumerate(states):
            if state not in skip:
                matcher = f'{label}="{state}"'
                parts.append(f"{self.sel(metric, matcher)} * {code}")
        return agg("max", " or ".join(parts), by)


# Prometheus adds namespace/pod (Kubernetes service discovery), job and instance to every series;
# kvwatch's per-engine series carry target, model_name and engine, vLLM's carry model_name and engine.
POD = Promql('namespace=~"$namespace", pod=~"$pod"')
ENGINE = Promql(POD.selector + ', model_name=~"$model_name"')


# ---------------------------------------------------------------------------------------------------
# Engines a query cannot show
# ---------------------------------------------------------------------------------------------------

# The engines every panel is run against on a real Prometheus (tests/test_dashboards_prometheus.py: a simulated
# engine of each, scraped by kvwatch and by Prometheus). A query that has no data for one of them says why, in its
# panel's description (``no_data``); the test fails on a query without data and without a reason, and on a reason
# given for a query that has data. docs/dashboards.md's table is made from the same declarations.
CHECKED_ENGINES = ("vllm", "sglang", "llamacpp")
NoData = Mapping[str, str]  # engine name -> why the query has no data for that engine's pods (a phrase, no period)
NO_DATA_HEADING = "**No data for:**"
_NO_DATA_KEY = "_no_data"  # where query() keeps a declaration until _panel() writes it into the description
_NO_DATA_LINE = re.compile(r"- (?P<engine>[^,:*]+?)(?:, (?P<names>\*[^*]+\*(?:, \*[^*]+\*)*))?: (?P<reason>.+)\.")

# What an engine's /metrics lacks (docs/engines.md, docs/alerts.md "Fleet rules per engine"), or what kvwatch does not
# read from it, as each panel that needs it states it.
NO_KV_GAUGE: NoData = {"llamacpp": "exports no KV-cache gauge (current builds removed it in May 2025)"}
NO_KV_SIZE: NoData = {"llamacpp": "exports no KV-cache size (`--ctx-size` is in `/slots` only) and no KV gauge"}
NEVER_PREEMPTS: NoData = {"llamacpp": "never preempts (each slot keeps its own share of the context)"}
NO_LATENCY_HISTOGRAMS: NoData = {"llamacpp": "exports no latency histograms"}
NO_LIVE_GENERATION: NoData = {
    "llamacpp": "counts generated tokens only as requests end (`tokens_predicted_total`): no throughput gap is judged"
}
NO_SEQUENCE_LENGTH: NoData = {
    "sglang": "exports request lengths only when started with `--collect-tokens-histogram`; the Fleet dashboard "
    "estimates the mean from its token counters",
    "llamacpp": "exports no request lengths",
}
NO_MAX_CONCURRENCY: NoData = {
    "sglang": "exports request lengths only when started with `--collect-tokens-histogram`, and without them "
    "there is no estimated max concurrency",
    "llamacpp": "exports no request lengths and no KV-cache size, so there is no estimated max concurrency",
}
NO_STEP_TOKENS: NoData = {
    "sglang": "exports no tokens per step (vLLM's `iteration_tokens_total`) and not its budget, "
    "`--chunked-prefill-size`",
    "llamacpp": "exports no tokens per step and not its batch size, `--batch-size`",
}
NO_LORA: NoData = {"llamacpp": "exports no LoRA metrics"}
NO_SLOTS: NoData = {
    engine: "has no per-slot context: its KV cache is one pool, in the panels above" for engine in ("vllm", "sglang")
}
NO_REJECTIONS: NoData = {
    "sglang": "kvwatch reads no rejection count from it (its `num_aborted_requests_total` counts aborts of any cause)",
    "llamacpp": "exports no count of requests turned away",
}


def flags(action: Action) -> str:
    """Every engine's spelling of ``action``, from its adapter: "vLLM `--max-num-seqs`, SGLang `...`, ..."."""
    return ", ".join(f"{e.title} `{e.flag(action)}`" for e in ENGINES if e.flag(action))


# ---------------------------------------------------------------------------------------------------
# Panels
# ---------------------------------------------------------------------------------------------------


def query(
    expr: str, legend: str = "__auto", *, instant: bool = False, table: bool = False, no_data: NoData | None = None
) -> JSON:
    """One target. ``no_data``: the engines (``CHECKED_ENGINES``) it has no data for, and why."""
    q: JSON = {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
    if table:
        q["format"] = "table"
    if instant:
        q |= {"instant": True, "range": False}
    else:
        q |= {"instant": False, "range": True}
    if no_data:
        for engine, reason in no_data.items():
            if engine not in CHECKED_ENGINES:
                raise ValueError(f"no_data: {engine!r} is not one of the checked engines {CHECKED_ENGINES}")
            if not reason or "\n" in reason or "*" in reason or reason.endswith("."):
                raise ValueError(f"no_data[{engine!r}]: one phrase without newline, '*' or final period: {reason!r}")
        q[_NO_DATA_KEY] = dict(no_data)
    return q


SAMPLE_SUFFIXES = ("", "_total", "_bucket", "_count", "_sum")
# The other engines' families as their adapters keep them (kvwatch/engines/*.py KEEP_FAMILIES), with their samples'
# suffixes (counters' _total, histograms' series). trtllm-serve's first builds' unprefixed spellings are left out:
# generic words (prompt_tokens) that no query reads.
_UNPREFIXED = {n for n in trtllm.KEEP_FAMILIES if trtllm.PREFIX + n in trtllm.KEEP_FAMILIES}
ENGINE_SAMPLES = frozenset(
    family + suffix
    for family in (sglang.KEEP_FAMILIES | trtllm.KEEP_FAMILIES | llamacpp.KEEP_FAMILIES) - _UNPREFIXED
    for suffix in SAMPLE_SUFFIXES
)
METRIC_RE = re.compile(
    r"\b((?:kvwatch_|vllm:)[A-Za-z0-9_:]+|"
    + "|".join(map(re.escape, sorted(ENGINE_SAMPLES, key=len, reverse=True)))
    + r"|[a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b"
)


def metrics_in(exprs: list[str]) -> list[str]:
    """Metric (and recording rule) names in the queries, in order of first appearance."""
    seen: dict[str, None] = {}
    for expr in exprs:
        for name in METRIC_RE.findall(expr):
            seen.setdefault(name, None)
    return list(seen)


def describe(what: str, todo: str, targets: list[JSON], no_data: str = "") -> str:
    names = metrics_in([t["expr"] for t in targets])
    label = "Metric" if len(names) == 1 else "Metrics"
    middle = f"\n\n{no_data}" if no_data else ""
    return f"{what}\n\n**If it looks bad:** {todo}{middle}\n\n{label}: " + ", ".join(f"`{n}`" for n in names)


def _legend_name(target: JSON) -> str:
    """How a reader finds a query in a panel: its legend's fixed text, else its query letter."""
    fixed = target["legendFormat"].split("{{")[0].strip(" ·")
    return fixed if fixed and fixed != "__auto" else f"query {target['refId']}"


def _no_data_paragraph(targets: list[JSON], names: list[str]) -> str:
    """The declarations of ``targets`` (taken out of them) as the description's "No data" paragraph: one line per
    engine and reason, naming the queries unless it is all of them."""
    lines: dict[tuple[str, str], list[str]] = {}
    for target, name in zip(targets, names, strict=True):
        for engine, reason in target.pop(_NO_DATA_KEY, {}).items():
            lines.setdefault((engine, reason), []).append(name)
    if not lines:
        return ""
    if len(set(names)) != len(names):
        raise ValueError(f"queries named alike, a declaration could not be read back: {names}")
    out = [NO_DATA_HEADING]
    for (engine, reason), which in sorted(lines.items(), key=lambda kv: CHECKED_ENGINES.index(kv[0][0])):
        queries = "" if len(which) == len(targets) else ", " + ", ".join(f"*{n}*" for n in which)
        out.append(f"- {by_name(engine).title}{queries}: {reason}.")
    return "\n".join(out)


def thresholds(*steps: tuple[str, float | None]) -> JSON:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for c, v in steps]}


NEUTRAL = thresholds(("blue", None))
KV_STEPS = thresholds(
    (KvPressure.OK.colour, None),
    (KvPressure.ADMISSION_STALL.colour, THRESHOLDS.admission_stall),
    (KvPressure.PREEMPTION_RISK.colour, THRESHOLDS.preemption_risk),
)
ANY_IS_BAD = thresholds(("green", None), ("red", 0.000001))
WAITING_STEPS = thresholds(("green", None), ("orange", 1))
SLO_STEPS = thresholds(("red", None), ("orange", 0.9), ("green", 0.99))


def _panel(
    kind: str, title: str, what: str, todo: str, targets: list[JSON], unit: str, names: list[str] | None = None
) -> JSON:
    """``names``: how the description names each query (a table's column names; default: ``_legend_name``)."""
    for i, t in enumerate(targets):
        t["refId"] = chr(ord("A") + i)
    no_data = _no_data_paragraph(targets, names or [_legend_name(t) for t in targets])
    return {
        "type": kind,
        "title": title,
        "description": describe(what, todo, targets, no_data),
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }


def override(name: str, *properties: tuple[str, Any]) -> JSON:
    return {
        "matcher": {"id": "byName", "options": name},
        "properties": [{"id": pid, "value": value} for pid, value in properties],
    }


def fixed_color(color: str) -> tuple[str, Any]:
    return ("color", {"fixedColor": color, "mode": "fixed"})


DASHED = ("custom.lineStyle", {"dash": [10, 10], "fill": "dash"})
NO_FILL = ("custom.fillOpacity", 0)


def dashed_series(regex: str) -> JSON:
    """Draw the series whose name matches ``regex`` as dashed reference lines (limits, capacities)."""
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [{"id": pid, "value": value} for pid, value in (DASHED, NO_FILL)],
    }


def throughput_gap_overrides(prompt_legend: str, gap_legend: str) -> list[JSON]:
    """Prompt blue, generation green, the gap count red as shaded steps on the right axis."""
    return [
        override(prompt_legend, fixed_color("blue")),
        override("generation", fixed_color("green")),
        override(
            gap_legend,
            fixed_color("red"),
            ("unit", "none"),
            ("decimals", 0),
            ("custom.axisPlacement", "right"),
            ("custom.lineInterpolation", "stepAfter"),
            ("custom.fillOpacity", 25),
            ("custom.lineWidth", 0),
        ),
    ]


def timeseries(
    title: str,
    what: str,
    todo: str,
    targets: list[JSON],
    *,
    unit: str,
    max_value: float | None = None,
    min_value: float | None = 0,
    steps: JSON | None = None,
    threshold_style: str = "off",
    overrides: list[JSON] | None = None,
    legend: str = "list",
    stepped: bool = False,
) -> JSON:
    panel = _panel("timeseries", title, what, todo, targets, unit)
    custom: JSON = {
        "drawStyle": "line",
        "fillOpacity": 10,
        "lineInterpolation": "stepAfter" if stepped else "linear",
        "lineWidth": 1,
        "showPoints": "never",
        "spanNulls": False,
        "thresholdsStyle": {"mode": threshold_style},
    }
    defaults = panel["fieldConfig"]["defaults"]
    defaults |= {"color": {"mode": "palette-classic"}, "custom": custom}
    if min_value is not None:
        defaults["min"] = min_value
    if max_value is not None:
        defaults["max"] = max_value
    if steps is not None:
        defaults["thresholds"] = steps
    panel["fieldConfig"]["overrides"] = overrides or []
    panel["options"] = {
        "legend": {
            "calcs": ["mean", "max", "lastNotNull"] if legend == "table" else [],
            "displayMode": "table" if legend == "table" else "list",
            "placement": "bottom",
            "showLegend": True,
        },
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel


def stat(
    title: str,
    what: str,
    todo: str,
    expr: str,
    *,
    unit: str,
    steps: JSON = NEUTRAL,
    no_value: str = "no data",
    mappings: list[JSON] | None = None,
    decimals: int | None = None,
    no_data: NoData | None = None,
) -> JSON:
    """The latest value of the selection with a sparkline. Coloured tiles carry a judgement."""
    panel = _panel("stat", title, what, todo, [query(expr, no_data=no_data)], unit)
    defaults = panel["fieldConfig"]["defaults"]
    defaults |= {"color": {"mode": "thresholds"}, "thresholds": steps, "noValue": no_value}
    if mappings:
        defaults["mappings"] = mappings
    if decimals is not None:
        defaults["decimals"] = decimals
    panel["options"] = {
        "colorMode": "none" if steps is NEUTRAL else "background",
        "graphMode": "none" if mappings else "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": "value",
    }
    return panel


def value_mappings(states: States) -> list[JSON]:
    """Each state's code shown as the state's label, in its colour."""
    members: list[Bottleneck | KvPressure] = list(states)
    options = {str(code): {"color": s.colour, "index": code, "text": s.label} for code, s in enumerate(members)}
    return [{"type": "value", "options": options}]


def state_timeline(
    title: str,
    what: str,
    todo: str,
    targets: list[JSON],
    *,
    states: States | None = None,
    unit: str = "none",
    steps: JSON | None = None,
    max_value: float | None = None,
) -> JSON:
    """One row per series. With ``states`` the values are state codes shown as text and colour; without,
    the row is coloured by ``steps`` (a heat strip)."""
    panel = _panel("state-timeline", title, what, todo, targets, unit)
    defaults = panel["fieldConfig"]["defaults"]
    if states:
        defaults |= {"color": {"fixedColor": "text", "mode": "fixed"}, "mappings": value_mappings(states)}
    else:
        defaults |= {"color": {"mode": "thresholds"}, "thresholds": steps or NEUTRAL, "min": 0}
        if max_value is not None:
            defaults["max"] = max_value
    defaults["custom"] = {"fillOpacity": 80, "lineWidth": 0}
    panel["options"] = {
        "alignValue": "left",
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": bool(states)},
        "mergeValues": True,
        "rowHeight": 0.85,
        "showValue": "never",
        "tooltip": {"mode": "single", "sort": "none"},
    }
    return panel


def table(
    title: str,
    what: str,
    todo: str,
    labels: dict[str, str],
    columns: list[tuple[str, str, str]],
    *,
    column_overrides: list[JSON] | None = None,
    sort_by: str | None = None,
    no_data: Mapping[str, NoData] | None = None,
) -> JSON:
    """A table of instant queries that share one label set, merged into one row per label set.

    ``labels`` maps each label to its column name; ``columns`` are (name, PromQL, unit); ``no_data`` by column name.
    """
    no_data = no_data or {}
    if unknown := set(no_data) - {name for name, _, _ in columns}:
        raise ValueError(f"no_data for columns the table does not have: {sorted(unknown)}")
    targets = [query(expr, instant=True, table=True, no_data=no_data.get(name)) for name, expr, _ in columns]
    panel = _panel("table", title, what, todo, targets, "none", names=[name for name, _, _ in columns])
    values = {f"Value #{chr(ord('A') + i)}": name for i, (name, _, _) in enumerate(columns)}
    order = list(labels) + list(values)
    panel["transformations"] = [
        {"id": "merge", "options": {}},
        {"id": "filterFieldsByName", "options": {"include": {"names": order}}},
        {
            "id": "organize",
            "options": {
                "indexByName": {name: i for i, name in enumerate(order)},
                "renameByName": labels | values,
            },
        },
    ]
    panel["fieldConfig"]["defaults"] |= {"custom": {"align": "auto", "cellOptions": {"type": "auto"}}}
    panel["fieldConfig"]["overrides"] = [
        override(name, ("unit", unit), ("decimals", 2)) for name, _, unit in columns
    ] + (column_overrides or [])
    panel["options"] = {
        "cellHeight": "sm",
        "footer": {"show": False},
        "showHeader": True,
        "sortBy": [{"desc": True, "displayName": sort_by}] if sort_by else [],
    }
    return panel


def color_cells(column: str, steps: JSON) -> JSON:
    return override(
        column,
        ("thresholds", steps),
        ("color", {"mode": "thresholds"}),
        ("custom.cellOptions", {"type": "color-background"}),
    )


# ---------------------------------------------------------------------------------------------------
# Layout, variables and the dashboard
# ---------------------------------------------------------------------------------------------------


class Layout:
    """Places panels left to right, top to bottom, on Grafana's 24-column grid."""

    def __init__(self) -> None:
        self.panels: list[JSON] = []
        self._id = 0
        self._x = self._y = self._row_h = 0

    def _next_id(self) -> int:
        self._id += 1
        return self._id

    def _newline(self) -> None:
        self._y += self._row_h
        self._x = self._row_h = 0

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": self._y},
                "id": self._next_id(),
                "panels": [],
            }
        )
        self._y += 1

    def add(self, panel: JSON, w: int, h: int) -> None:
        if self._x + w > GRID_WIDTH:
            self._newline()
        panel["gridPos"] = {"h": h, "w": w, "x": self._x, "y": self._y}
        panel["id"] = self._next_id()
        self.panels.append(panel)
        self._x += w
        self._row_h = max(self._row_h, h)


def datasource_variable() -> JSON:
    return {
        "current": {},
        "hide": 0,
        "includeAll": False,
        "label": "Data source",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "type": "datasource",
    }


def label_variable(name: str, label: str, metric: str, selector: str = "") -> JSON:
    """A multi-value variable over the values of label ``name`` on ``metric``. "All" is ``.*``, which also
    matches series that lack the label (kvwatch outside Kubernetes has no namespace / pod)."""
    series = f"{metric}{{{selector}}}" if selector else metric
    q = f"label_values({series}, {name})"
    return {
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": DATASOURCE,
        "definition": q,
        "hide": 0,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "options": [],
        "query": q,
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "type": "query",
    }


def scope_variables(pod_metric: str, engine_metric: str) -> list[JSON]:
    return [
        datasource_variable(),
        label_variable("namespace", "Namespace", pod_metric),
        label_variable("pod", "Pod", pod_metric, 'namespace=~"$namespace"'),
        label_variable("model_name", "Model", engine_metric, POD.selector),
    ]


def kvwatch_variables() -> list[JSON]:
    return scope_variables("kvwatch_up", "kvwatch_requests_running")


def custom_variable(name: str, label: str, options: list[str], default: str, description: str) -> JSON:
    return {
        "current": {"selected": True, "text": default, "value": default},
        "description": description,
        "hide": 0,
        "includeAll": False,
        "label": label,
        "multi": False,
        "name": name,
        "options": [{"selected": v == default, "text": v, "value": v} for v in options],
        "query": ",".join(options),
        "type": "custom",
    }


def dashboard(uid: str, title: str, description: str, layout: Layout, variables: list[JSON]) -> JSON:
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": True,
                "keepTime": True,
                "tags": [TAG],
                "targetBlank": False,
                "title": "kvwatch dashboards",
                "type": "dashboards",
            }
        ],
        "panels": layout.panels,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": [TAG, *(e.name for e in ENGINES)],
        "templating": {"list": variables},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


# ---------------------------------------------------------------------------------------------------
# Reading dashboards back (the tests)
# ---------------------------------------------------------------------------------------------------


def iter_panels(dash: JSON) -> Iterator[JSON]:
    """Every panel, including those nested in (collapsed) rows; rows themselves too."""
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def panel_queries(dash: JSON) -> Iterator[tuple[JSON, JSON]]:
    """(panel, target) for every query of every panel."""
    for panel in iter_panels(dash):
        for target in panel.get("targets", []):
            yield panel, target


def query_names(panel: JSON) -> dict[str, str]:
    """refId -> how the panel's description names that query (a table's column, else ``_legend_name``)."""
    renamed: dict[str, str] = {}
    for step in panel.get("transformations", []):
        if step["id"] == "organize":
            renamed = step["options"]["renameByName"]
    return {t["refId"]: renamed.get(f"Value #{t['refId']}") or _legend_name(t) for t in panel["targets"]}


def no_data_of(panel: JSON) -> dict[tuple[str, str], str]:
    """(engine name, refId) -> why that query has no data for that engine: the panel's declarations, read back from
    its description (what a Grafana user reads too)."""
    paragraphs = [p for p in panel.get("description", "").split("\n\n") if p.startswith(NO_DATA_HEADING)]
    if not paragraphs:
        return {}
    titles = {by_name(e).title: e for e in CHECKED_ENGINES}
    refs = {name: ref for ref, name in query_names(panel).items()}
    out: dict[tuple[str, str], str] = {}
    for line in paragraphs[0].splitlines()[1:]:
        m = _NO_DATA_LINE.fullmatch(line)
        if m is None or m["engine"] not in titles:
            raise ValueError(f"{panel['title']}: not a declaration: {line!r}")
        names = re.findall(r"\*([^*]+)\*", m["names"] or "") or list(refs)
        for name in names:
            out[(titles[m["engine"]], refs[name])] = m["reason"]
    return out


VARIABLE_RE = re.compile(r"\$\{(\w+)(?::[\w]+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def variables_in(text: str) -> set[str]:
    """Names of the Grafana variables (``$x``, ``${x}``, ``${x:fmt}``, ``[[x]]``) used in ``text``."""
    return {next(g for g in m.groups() if g) for m in VARIABLE_RE.finditer(text)}


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace Grafana variables by ``values`` as Grafana would interpolate them (already formatted:
    the caller escapes regex values). A variable without a value raises ``KeyError``."""
    return VARIABLE_RE.sub(lambda m: values[next(g for g in m.groups() if g)], text)
