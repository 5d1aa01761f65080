"""Every dashboard query returns data from a real Prometheus.

The stack a user runs, on loopback: the built-in vLLM simulator playing the ``tour`` scenario (every
bottleneck in turn), the kvwatch sidecar watching it, and the real Prometheus (Debian's) scraping both
every second with the labels Kubernetes service discovery would add (namespace, pod) and evaluating the
recording rules of alerts/. Each query of each panel is then run the way Grafana runs it: the variables
get the values their own ``label_values`` queries return, ``$__rate_interval`` is what Grafana computes
for a 1 s scrape interval, range queries over the run for time series / stat / state-timeline panels,
instant queries with ``$__range`` = the run for tables.

The test polls until every query has returned data (or the tour is over) and then asserts; a panel
that stays empty is a defect, reported with the series it needs that never appeared.
"""

from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import promql_parser
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import grafana  # noqa: E402  (the package grafana/generate.py runs)
from grafana import common  # noqa: E402
from tests.helpers.process import wait_for  # noqa: E402
from tests.helpers.prometheus import Kvwatch, Prometheus  # noqa: E402

pytestmark = [pytest.mark.pipeline, pytest.mark.slow, pytest.mark.timeout(900)]

SCRAPE_INTERVAL = 1  # seconds, Prometheus scrape and rule evaluation
STEP = 2  # seconds, range-query resolution (what a ~150 px wide panel asks for over a few minutes)
# Grafana: $__rate_interval = max($__interval + scrape interval, 4 × scrape interval), $__interval = step
RATE_INTERVAL = f"{max(STEP + SCRAPE_INTERVAL, 4 * SCRAPE_INTERVAL)}s"
SPEED = "4"  # the simulator's time warp: the tour's phases pass 4× faster
POD_LABELS = {"namespace": "kvwatch-e2e", "pod": "vllm-tour-0"}
SCOPE = ("namespace", "pod", "model_name")
TOUR_TIMEOUT = 600  # upper bound for the whole tour at SPEED on a slow CI machine; not a speed assertion


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


def variable_values(prom: Prometheus, dash: dict) -> dict[str, str]:
    """Resolve the scope variables in order, as Grafana does: each label_values() query with the
    variables before it substituted; the first value is selected."""
    values: dict[str, str] = {}
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"])
            assert m, var["query"]
            series = common.substitute(m.group(1), values)
            found = label_values(prom, m.group(2), series)
            assert found, f"variable {var['name']}: {var['query']} returned no values"
            values[var["name"]] = grafana_regex_escape(sorted(found)[0])
        elif var["type"] == "custom":
            values[var["name"]] = var["current"]["value"]
    return values


def has_data(result: list[dict]) -> bool:
    for series in result:
        samples = series.get("values") or [series.get("value")]
        for _, v in filter(None, samples):
            if not math.isnan(float(v)):
                return True
    return False


class Panels:
    """Every query of every dashboard, twice: with the first value each scope variable offers selected,
    and with the default "All" (``.*``); and whether each has returned data yet."""

    SELECTIONS = ("first value", "All")

    def __init__(self, prom: Prometheus, start: float):
        self.prom = prom
        self.start = start
        self.dashboards = grafana.build_all()
        self.pending: dict[str, tuple[str, str, dict]] = {}
        for name, dash in self.dashboards.items():
            for panel, target in common.panel_queries(dash):
                for selection in self.SELECTIONS:
                    key = f"{dash['title']} › {panel['title']} › {target['refId']} ({selection})"
                    self.pending[key] = (name, selection, target)
        self.total = len(self.pending)
        self.values: dict[str, dict[str, str]] = {}
        self.errors: dict[str, str] = {}  # queries Prometheus refused: fail at once, no point waiting

    def resolve_variables(self) -> bool:
        for name, dash in self.dashboards.items():
            if name not in self.values:
                try:
                    self.values[name] = variable_values(self.prom, dash)
                except AssertionError:
                    return False
        return True

    def expr(self, name: str, selection: str, target: dict, now: float) -> str:
        values = dict(self.values[name])
        if selection == "All":
            values |= {var: ".*" for var in SCOPE}
        values |= {"__rate_interval": RATE_INTERVAL, "__range": f"{int(now - self.start) + 1}s"}
        return common.substitute(target["expr"], values)

    def poll(self) -> bool:
        if not self.resolve_variables():
            return False
        now = time.time()
        for key, (name, selection, target) in list(self.pending.items()):
            expr = self.expr(name, selection, target, now)
            try:
                if target.get("instant"):
                    result = self.prom.query(expr, time=now)
                else:
                    result = self.prom.query_range(expr, self.start, now, STEP)
            except RuntimeError as exc:  # Prometheus answered with an error (bad_data, execution)
                self.errors[key] = f"{exc}\n    query: {expr}"
                continue
            if has_data(result):
                del self.pending[key]
        return not self.pending or bool(self.errors)

    def missing_series(self) -> list[str]:
        """For each query still without data, the selectors in it that match no series in the run."""
        now = time.time()
        lines = []
        for key, (name, selection, target) in self.pending.items():
            if name not in self.values:
                lines.append(f"{key}\n    the variables never resolved: {target['expr']}")
                continue
            expr = self.expr(name, selection, target, now)
            found: list[promql_parser.VectorSelector] = []
            promql_parser.walk(
                promql_parser.parse(expr),
                lambda n, found=found: found.append(n) if isinstance(n, promql_parser.VectorSelector) else None,
            )
            absent = [
                str(vs)
                for vs in found
                if not self.prom.query(f"count(last_over_time({vs}[{int(now - self.start) + 1}s]))", time=now)
            ]
            lines.append(f"{key}\n    query: {expr}\n    selectors with no series in the run: {absent or 'none'}")
        return lines


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("dashboards")
    sim = Kvwatch(
        ["sim", "--scenario", "tour", "--speed", SPEED],
        work / "sim",
        listen_flag="--port",
        ready_path="/metrics",
        name="sim",
    )
    with sim:
        kv = Kvwatch(["run", "--target", f"{sim.url}/metrics", "--interval", "1"], work / "kvwatch")
        with kv:
            config = {
                "global": {
                    "scrape_interval": f"{SCRAPE_INTERVAL}s",
                    "evaluation_interval": f"{SCRAPE_INTERVAL}s",
                    "scrape_timeout": f"{SCRAPE_INTERVAL}s",
                },
                "scrape_configs": [
                    {
                        "job_name": "kvwatch",
                        "static_configs": [{"targets": [f"127.0.0.1:{kv.port}"], "labels": POD_LABELS}],
                    },
                    {
                        "job_name": "vllm",
                        "static_configs": [{"targets": [f"127.0.0.1:{sim.port}"], "labels": POD_LABELS}],
                    },
                ],
            }
            with Prometheus(config, work / "prometheus", rule_files=recording_rule_files()) as prom:
                prom.wait_for(
                    lambda: len([t for t in prom.targets() if t["health"] == "up"]) == 2,
                    timeout=60,
                    what="both scrape targets up",
                )
                yield Stack(prom, sim, kv, time.time() - 1)


@dataclass
class Stack:
    prom: Prometheus
    sim: Kvwatch
    kv: Kvwatch
    start: float


def test_every_panel_query_returns_data(stack):
    prom, sim, kv = stack.prom, stack.sim, stack.kv
    start = time.time()
    panels = Panels(prom, stack.start)
    try:
        wait_for(panels.poll, timeout=TOUR_TIMEOUT, interval=3.0, what="every dashboard query to return data")
    except TimeoutError:
        pass
    elapsed = time.time() - start
    print(
        f"\n{panels.total - len(panels.pending)}/{panels.total} dashboard queries returned data "
        f"after {elapsed:.0f}s of the tour (speed {SPEED}, scrape {SCRAPE_INTERVAL}s, "
        f"$__rate_interval={RATE_INTERVAL}); variables: {panels.values.get('kvwatch-overview')}"
    )
    assert sim.running() and kv.running(), "the simulator or kvwatch died:\n" + sim.log_tail() + kv.log_tail()
    assert not panels.errors, "Prometheus refused these queries:\n" + "\n".join(
        f"{k}: {v}" for k, v in panels.errors.items()
    )
    assert not panels.pending, (
        f"{len(panels.pending)} of {panels.total} dashboard queries never returned data "
        f"in {elapsed:.0f}s:\n" + "\n".join(panels.missing_series())
    )


def test_variable_queries_return_the_pod_labels(stack):
    prom = stack.prom
    for name, dash in grafana.build_all().items():
        values = wait_for(lambda dash=dash: variable_values(prom, dash), timeout=120, what=f"{name} variables")
        assert values["namespace"] == grafana_regex_escape(POD_LABELS["namespace"])
        assert values["pod"] == grafana_regex_escape(POD_LABELS["pod"])
        assert values["model_name"]


def test_recording_rules_referenced_by_the_dashboards_are_loaded(stack):
    """Prometheus itself loaded every recording rule a dashboard reads (from alerts/), without errors."""
    loaded = {r["name"]: r for g in stack.prom.rules() for r in g["rules"] if r["type"] == "recording"}
    exprs = [t["expr"] for d in grafana.build_all().values() for _, t in common.panel_queries(d)]
    referenced = {n for n in common.metrics_in(exprs) if n.count(":") == 2 and not n.startswith("vllm:")}
    assert any(n.startswith("engine:vllm_") for n in referenced), "the Fleet dashboard reads the fleet rules"
    assert referenced <= set(loaded), f"not loaded by Prometheus: {sorted(referenced - set(loaded))}"
    unhealthy = {n: loaded[n].get("lastError") for n in referenced if loaded[n].get("health") != "ok"}
    assert not unhealthy, unhealthy


def range_values(stack: Stack, name: str, target: dict) -> list[float]:
    dash = grafana.build_all()[name]
    values = variable_values(stack.prom, dash) | {"__rate_interval": RATE_INTERVAL}
    result = stack.prom.query_range(common.substitute(target["expr"], values), stack.start, time.time(), STEP)
    return [float(v) for series in result for _, v in series["values"]]


def test_state_panels_only_show_mapped_states(stack):
    """The numeric state codes the state panels compute are all states their value mappings name, so the
    timelines read as words, never as bare numbers."""
    seen = {}
    for name, dash in grafana.build_all().items():
        for panel, target in common.panel_queries(dash):
            mappings = panel["fieldConfig"]["defaults"].get("mappings")
            if not mappings:
                continue
            names = mappings[0]["options"]
            values = range_values(stack, name, target)
            assert values, f"{panel['title']}: no data"
            texts = set()
            for v in values:
                assert v.is_integer() and str(int(v)) in names, f"{panel['title']}: {v} is not a mapped state"
                texts.add(names[str(int(v))]["text"])
            seen[f"{dash['title']} › {panel['title']} › {target['refId']}"] = sorted(texts)
    print("\nstates shown during the tour:\n" + "\n".join(f"  {k}: {v}" for k, v in seen.items()))
    assert len(seen) >= 5


def test_ratio_panels_stay_within_0_and_1(stack):
    """Panels drawn on a 0-100 % axis (KV usage, hit ratios, SLO attainment, shares of time) get ratios."""
    checked = 0
    for name, dash in grafana.build_all().items():
        for panel, target in common.panel_queries(dash):
            defaults = panel["fieldConfig"]["defaults"]
            if defaults.get("unit") != "percentunit" or panel["type"] == "table":
                continue
            for v in range_values(stack, name, target):
                assert -1e-9 <= v <= 1 + 1e-9, f"{panel['title']} {target['refId']}: {v} outside [0, 1]"
            checked += 1
    assert checked >= 8
