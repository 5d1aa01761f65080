"""Every dashboard query returns data from a real Prometheus, for each engine, or its panel says why it cannot.

The stack a user runs, on loopback, once per engine of ``grafana.common.CHECKED_ENGINES`` (vLLM, SGLang, llama.cpp):
the built-in simulator speaking that engine's /metrics (``kvwatch sim --engine``) and playing the ``tour`` scenario
(every bottleneck in turn), and a kvwatch sidecar watching it; the real Prometheus (Debian's) scrapes every sidecar
and every engine every second with the labels Kubernetes service discovery would add (namespace, one pod per
engine) and evaluates the recording rules of alerts/ (the fleet rules read the engines' own series). Each query of
each panel is then run the way Grafana runs it: the variables get the values their own ``label_values`` queries
return, ``$__rate_interval`` is what Grafana computes for a 1 s scrape interval, range queries over the run for time
series / stat / state-timeline panels, instant queries with ``$__range`` = the run for tables.

Each query is run with each engine's pod selected (the model: the first one offered, "All" for llama.cpp, whose
series have no model_name) and with every variable at "All". With a pod selected it must return data, or its panel
states why that engine cannot fill it (``no_data`` in grafana/*.py, the description's "No data for" list, read back
by ``grafana.common.no_data_of``). A query without data and without a reason fails, and so does a reason given for a
query that returned data: the reasons stay true. The test polls until every query that should have data has it and
every simulator has played the whole tour while scraped (bounded), then asserts.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import promql_parser
import pytest

import grafana
from grafana import common
from kvwatch.engines import by_name
from kvwatch.sim.scenario import load_scenario
from tests.helpers.dashboards import (
    RATE_INTERVAL,
    SCRAPE_INTERVAL,
    grafana_regex_escape,
    has_data,
    recording_rule_files,
    run,
    variable_values,
)
from tests.helpers.process import wait_for
from tests.helpers.prometheus import Kvwatch, Prometheus

pytestmark = [pytest.mark.pipeline, pytest.mark.slow, pytest.mark.timeout(900)]

SPEED = "4"  # the simulator's time warp: the tour's phases pass 4× faster
NAMESPACE = "kvwatch-e2e"
PODS = {engine: f"{engine}-tour-0" for engine in common.CHECKED_ENGINES}
ALL = "All"  # the selection with every scope variable at "All"
TOUR = load_scenario("tour")
TOUR_PHASES, MODEL = len(TOUR.phases), TOUR.engine.model_name
TOUR_TIMEOUT = 600  # upper bound for the whole run at SPEED on a slow CI machine; not a speed assertion


@dataclass
class Stack:
    prom: Prometheus
    sims: dict[str, Kvwatch]
    sidecars: dict[str, Kvwatch]
    start: float
    phases_at_start: dict[str, int] = field(default_factory=dict)

    def processes(self) -> list[Kvwatch]:
        return [*self.sims.values(), *self.sidecars.values()]

    def phases_logged(self, engine: str) -> int:
        """The phases the simulator has begun (it logs "phase <name> (t=...)" at each)."""
        log = self.sims[engine].log_path
        assert log is not None
        return sum(line.startswith("phase ") for line in log.read_text().splitlines())

    def phases_since_start(self, engine: str) -> int:
        return self.phases_logged(engine) - self.phases_at_start[engine]

    def whole_tour_scraped(self) -> bool:
        """Every simulator has begun TOUR_PHASES + 1 phases since Prometheus scraped it: every phase ran whole."""
        return all(self.phases_since_start(e) > TOUR_PHASES for e in self.sims)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("dashboards")
    with contextlib.ExitStack() as running:
        sims, sidecars, jobs = {}, {}, []
        for engine, pod in PODS.items():
            sim = Kvwatch(
                ["sim", "--scenario", "tour", "--speed", SPEED, "--engine", engine],
                work / f"sim-{engine}",
                listen_flag="--port",
                ready_path=by_name(engine).metrics_path,
                name="sim",
            )
            sims[engine] = running.enter_context(sim)
            target = f"{sim.url}{by_name(engine).metrics_path}"
            kv = running.enter_context(Kvwatch(["run", "--target", target, "--interval", "1"], work / f"kv-{engine}"))
            sidecars[engine] = kv
            labels = {"namespace": NAMESPACE, "pod": pod}
            for job, port, path in ((f"kvwatch-{engine}", kv.port, "/metrics"), (engine, sim.port, sim.ready_path)):
                static = [{"targets": [f"127.0.0.1:{port}"], "labels": labels}]
                jobs.append({"job_name": job, "metrics_path": path, "static_configs": static})
        config = {
            "global": {
                "scrape_interval": f"{SCRAPE_INTERVAL}s",
                "evaluation_interval": f"{SCRAPE_INTERVAL}s",
                "scrape_timeout": f"{SCRAPE_INTERVAL}s",
            },
            "scrape_configs": jobs,
        }
        prom = running.enter_context(Prometheus(config, work / "prometheus", rule_files=recording_rule_files()))
        prom.wait_for(
            lambda: len([t for t in prom.targets() if t["health"] == "up"]) == len(jobs),
            timeout=60,
            what="every scrape target up",
        )
        stack = Stack(prom, sims, sidecars, time.time() - 1)
        stack.phases_at_start = {e: stack.phases_logged(e) for e in sims}
        yield stack


@dataclass
class Query:
    dashboard: str
    panel: dict
    target: dict
    selection: str  # an engine name (its pod selected) or ALL
    reason: str | None  # why it has no data for that engine, as its panel states it (None: it must have data)

    def __str__(self) -> str:
        engine = self.selection if self.selection == ALL else f"{by_name(self.selection).title} pod"
        return f"{self.dashboard} › {self.panel['title']} (id {self.panel['id']}) › {self.target['refId']} ({engine})"


def every_query() -> list[Query]:
    """Every query of every dashboard with each engine's pod selected and with "All"; with "All" it must have data
    unless no engine can fill it."""
    queries = []
    for name, dash in grafana.build_all().items():
        for panel in common.iter_panels(dash):
            reasons = common.no_data_of(panel) if panel.get("targets") else {}
            for target in panel.get("targets", []):
                for engine in common.CHECKED_ENGINES:
                    queries.append(Query(name, panel, target, engine, reasons.get((engine, target["refId"]))))
                cannot = all((e, target["refId"]) in reasons for e in common.CHECKED_ENGINES)
                queries.append(Query(name, panel, target, ALL, "no engine can fill it" if cannot else None))
    return queries


class Panels:
    """Polls the queries that must have data until they all have; then checks the others have none."""

    def __init__(self, stack: Stack):
        self.stack = stack
        self.prom = stack.prom
        self.queries = every_query()
        self.dashboards = grafana.build_all()
        self.pending = [q for q in self.queries if q.reason is None]
        self.values: dict[tuple[str, str], dict[str, str]] = {}
        self.errors: dict[str, str] = {}  # queries Prometheus refused: fail at once, no point waiting

    def variables(self, query: Query) -> dict[str, str] | None:
        key = (query.dashboard, query.selection)
        if key not in self.values:
            pod = None if query.selection == ALL else PODS[query.selection]
            try:
                self.values[key] = variable_values(self.prom, self.dashboards[query.dashboard], pod)
            except AssertionError:
                return None  # not offered yet: the engine's series are not scraped yet
        return self.values[key]

    def has_data(self, query: Query, now: float) -> bool:
        values = self.variables(query)
        if values is None:
            return False
        try:
            return has_data(run(self.prom, query.target, values, self.stack.start, now))
        except RuntimeError as exc:  # Prometheus answered with an error (bad_data, execution)
            self.errors[str(query)] = f"{exc}\n    query: {query.target['expr']}"
            return False

    def poll(self) -> bool:
        now = time.time()
        self.pending = [q for q in self.pending if not self.has_data(q, now)]
        return bool(self.errors) or (not self.pending and self.stack.whole_tour_scraped())

    def stated_but_filled(self) -> list[str]:
        """The queries whose panel says they cannot have data for an engine, that had data in the run."""
        now = time.time()
        return [f"{q}: {q.reason}" for q in self.queries if q.reason is not None and self.has_data(q, now)]

    def missing_series(self) -> list[str]:
        """For each query still without data, the selectors in it that match no series in the run."""
        now = time.time()
        lines = []
        for q in self.pending:
            values = self.variables(q)
            if values is None:
                lines.append(f"{q}\n    the variables never resolved: {q.target['expr']}")
                continue
            expr = common.substitute(q.target["expr"], values | {"__rate_interval": RATE_INTERVAL, "__range": "1s"})
            found: list[promql_parser.VectorSelector] = []
            promql_parser.walk(
                promql_parser.parse(expr),
                lambda n, found=found: found.append(n) if isinstance(n, promql_parser.VectorSelector) else None,
            )
            window = f"{int(now - self.stack.start) + 1}s"
            absent = [str(vs) for vs in found if not self.prom.query(f"count(last_over_time({vs}[{window}]))")]
            lines.append(f"{q}\n    query: {expr}\n    selectors with no series in the run: {absent or 'none'}")
        return lines


def test_every_panel_query_returns_data_or_says_why_not(stack):
    start = time.time()
    panels = Panels(stack)
    with contextlib.suppress(TimeoutError):
        wait_for(panels.poll, timeout=TOUR_TIMEOUT, interval=3.0, what="every dashboard query to return data")
    elapsed = time.time() - start
    total = len([q for q in panels.queries if q.reason is None])
    print(
        f"\n{total - len(panels.pending)}/{total} dashboard queries that must have data returned data after "
        f"{elapsed:.0f}s ({len(panels.queries) - total} without, each with its reason; speed {SPEED}, scrape "
        f"{SCRAPE_INTERVAL}s, $__rate_interval={RATE_INTERVAL}); variables: {panels.values}"
    )
    dead = [p for p in stack.processes() if not p.running()]
    assert not dead, "died:\n" + "".join(p.log_tail() for p in dead)
    assert not panels.errors, "Prometheus refused these queries:\n" + "\n".join(
        f"{k}: {v}" for k, v in panels.errors.items()
    )
    missing = panels.missing_series()
    assert not missing, (
        f"{len(missing)} dashboard queries never returned data in {elapsed:.0f}s, and their panels state no reason "
        "(grafana/*.py, no_data=...):\n" + "\n".join(missing)
    )
    assert stack.whole_tour_scraped(), {e: stack.phases_since_start(e) for e in stack.sims}
    filled = panels.stated_but_filled()
    assert not filled, "these queries returned data though their panels say they cannot (drop the reason):\n" + (
        "\n".join(filled)
    )
    print(f"and none of the {len(panels.queries) - total} queries whose panels say they cannot had data")


def test_variable_queries_return_each_engines_pod(stack):
    prom = stack.prom
    for name, dash in grafana.build_all().items():
        for engine, pod in PODS.items():
            values = wait_for(
                lambda dash=dash, pod=pod: variable_values(prom, dash, pod), timeout=120, what=f"{name} variables"
            )
            assert values["namespace"] == grafana_regex_escape(NAMESPACE)
            assert values["pod"] == grafana_regex_escape(pod)
            # llama.cpp's series carry no model_name: the variable offers no model and stays at "All".
            model = ".*" if engine == "llamacpp" else grafana_regex_escape(MODEL)
            assert values["model_name"] == model, (name, engine, values)


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
    """The target's values over the run with every variable at "All": every engine's pods."""
    values = variable_values(stack.prom, grafana.build_all()[name])
    result = run(stack.prom, target, values, stack.start, time.time())
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
            # bounded wait: run alone (or first), the sidecars may not have diagnosed anything yet
            values = wait_for(
                lambda name=name, target=target: range_values(stack, name, target),
                timeout=180,
                interval=2.0,
                what=f"{panel['title']}: data",
            )
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
