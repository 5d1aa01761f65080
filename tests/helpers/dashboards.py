"""Running the dashboards' queries against a real Prometheus as Grafana runs them.

Shared by tests/test_dashboards_prometheus.py (every dashboard, kvwatch and simulated engines) and
tests/test_fleet_engines_prometheus.py (the Fleet dashboard on SGLang and llama.cpp pods)::

    recording_rule_files()                      # the rule files of alerts/ (what Prometheus loads)
    variable_values(prom, dash, pod="vllm-0")   # the scope variables as Grafana resolves them with that pod
    variable_values(prom, dash)                 # ... with every scope variable at its default, "All"
    run(prom, target, values, start, now)       # the target's query, instant or range over [start, now]
    has_data(result)                            # a non-NaN sample in a query result

A panel's stated reasons why a query has no data for an engine: ``grafana.common.no_data_of(panel)``.

Grafana's ``$__rate_interval`` for a 1 s scrape interval and a range step of ``STEP`` is ``RATE_INTERVAL``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import httpx
import yaml

from grafana import common
from tests.helpers.prometheus import Prometheus

__all__ = [
    "RATE_INTERVAL",
    "SCOPE",
    "SCRAPE_INTERVAL",
    "STEP",
    "grafana_regex_escape",
    "has_data",
    "label_values",
    "recording_rule_files",
    "run",
    "variable_values",
]

REPO = Path(__file__).resolve().parents[2]
SCRAPE_INTERVAL = 1  # seconds, Prometheus scrape and rule evaluation
STEP = 2  # seconds, range-query resolution (what a ~150 px wide panel asks for over a few minutes)
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 × scrape interval), $__interval = step
RATE_INTERVAL = f"{max(STEP + SCRAPE_INTERVAL, 4 * SCRAPE_INTERVAL)}s"
SCOPE = ("namespace", "pod", "model_name")
ALL = ".*"  # the scope variables' "All" (allValue)


def grafana_regex_escape(value: str) -> str:
    """How Grafana interpolates one selected value of a multi-value variable into a Prometheus regex."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*{}\[\]'+?.()|]", lambda m: "\\\\" + m.group(0), value)


def recording_rule_files() -> list[Path]:
    files = []
    for path in sorted((REPO / "alerts").glob("*.y*ml")):
        doc = yaml.safe_load(path.read_text()) or {}
        if isinstance(doc, dict) and "groups" in doc:
            files.append(path)
    return files


def label_values(prom: Prometheus, label: str, match: str) -> list[str]:
    """/api/v1/label/<label>/values?match[]=... (what Grafana's label_values() calls). A thin wrapper: the
    shared harness has no such method."""
    resp = httpx.get(f"{prom.url}/api/v1/label/{label}/values", params={"match[]": match}, timeout=10)
    body = resp.json()
    if body.get("status") != "success":
        raise RuntimeError(f"label values {label} {match}: {body.get('error')}")
    return body["data"]


def variable_values(prom: Prometheus, dash: dict, pod: str | None = None) -> dict[str, str]:
    """The dashboard's variables as Grafana resolves them. With ``pod``: each label_values() query in order, with the
    variables before it substituted; ``pod`` selected (it must be offered), the first value of the others, "All" for
    one that offers none (llama.cpp's series have no model_name). Without: every scope variable at "All" (the
    default). Custom variables at their default. ``AssertionError`` while a variable is not offered yet."""
    values: dict[str, str] = {}
    for var in dash["templating"]["list"]:
        if var["type"] == "query" and pod is None:
            values[var["name"]] = ALL
        elif var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
            assert m, var["query"]
            found = sorted(label_values(prom, m.group(2), common.substitute(m.group(1), values)))
            if var["name"] == "pod":
                assert pod in found, f"variable pod: {var['query']} does not offer {pod} (yet): {found}"
                found = [pod]
            assert found or var["name"] == "model_name", f"variable {var['name']}: {var['query']} returned no values"
            values[var["name"]] = grafana_regex_escape(found[0]) if found else ALL
        elif var["type"] == "custom":
            values[var["name"]] = var["current"]["value"]
    return values


def run(prom: Prometheus, target: dict, values: dict[str, str], start: float, now: float) -> list[dict[str, Any]]:
    """The target's query with ``values`` for its variables, ``$__rate_interval`` and ``$__range`` = [start, now]:
    instant at ``now`` for a table, else a range query over [start, now] at ``STEP``."""
    values = values | {"__rate_interval": RATE_INTERVAL, "__range": f"{int(now - start) + 1}s"}
    expr = common.substitute(target["expr"], values)
    if target.get("instant"):
        return prom.query(expr, time=now)
    return prom.query_range(expr, start, now, STEP)


def has_data(result: list[dict]) -> bool:
    for series in result:
        samples = series.get("values") or [series.get("value")]
        for _, v in filter(None, samples):
            if not math.isnan(float(v)):
                return True
    return False
