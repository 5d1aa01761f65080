#!/usr/bin/env python3
"""Write the documentation's generated tables: from ``kvwatch/catalog.py`` the exported metrics, bottlenecks,
actions, confidence levels and scrape-error reasons; each action's flag in every engine's words (``flags_<action>``,
one per fix in docs/alerts.md) from ``kvwatch/engines``; the fault table from ``tests/fault_table.py`` (the tests' own
cases); kvwatch's own /metrics worst case from ``kvwatch.export.worst_case``; the alert table from
``alerts/kvwatch-alerts.yaml``; which dashboard panels have data for which engine from the panels' ``no_data``
(``grafana/*.py``).

Each table sits between ``<!-- BEGIN catalog:NAME -->`` and ``<!-- END catalog:NAME -->`` in README.md or a page of
docs/, wherever the topic's page is; the rest of each page is left as it is. Every table appears somewhere.

    python docs/generate.py           # rewrite the tables in README.md and docs/*.md
    python docs/generate.py --check   # exit 1 if a page's tables differ from their sources
"""

from __future__ import annotations

import argparse
import functools
import re
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

import grafana  # noqa: E402
from grafana import common  # noqa: E402
from kvwatch.app import MAX_CONNECTIONS, REQUEST_DEADLINE_SECONDS  # noqa: E402
from kvwatch.catalog import ENGINE, FAMILIES, Action, Bottleneck, Confidence, Family, ScrapeReason  # noqa: E402
from kvwatch.config import Settings  # noqa: E402
from kvwatch.engines import ENGINES, by_name  # noqa: E402
from kvwatch.export import worst_case  # noqa: E402
from kvwatch.snapshot import MAX_LABEL_CHARS  # noqa: E402
from tests.fault_table import ALL  # noqa: E402

PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
BLOCK = re.compile(r"(<!-- BEGIN catalog:(\w+) -->\n).*?(<!-- END catalog:\2 -->)", re.S)


def _metric_name(f: Family) -> str:
    # Per-engine families carry target, model_name and engine (said once above the table); show the rest.
    labels = [x for x in f.labels if x not in ENGINE] if f.labels[: len(ENGINE)] == ENGINE else list(f.labels)
    return f"`{f.sample_name}" + (f"{{{','.join(labels)}}}`" if labels else "`")


def metrics_table() -> str:
    rows = ["| metric | type | unit | meaning |", "|---|---|---|---|"]
    rows += [f"| {_metric_name(f)} | {f.type} | {f.unit} | {f.meaning} |" for f in FAMILIES]
    return "\n".join(rows)


def bottlenecks_table() -> str:
    rows = ["| bottleneck | meaning |", "|---|---|"]
    rows += [f"| `{b}` | {b.meaning} |" for b in Bottleneck]
    return "\n".join(rows)


def actions_table() -> str:
    rows = [
        "| action (cheapest first) | " + " | ".join(e.title for e in ENGINES) + " | what it does |",
        "|---|" + "---|" * len(ENGINES) + "---|",
    ]
    rows += [f"| `{a}` | " + " | ".join(f"`{e.flag(a)}`" for e in ENGINES) + f" | {a.meaning} |" for a in Action]
    return "\n".join(rows)


def flags_table(action: Action) -> str:
    """One action's flag in each engine's own words (the Engine registry's FLAGS, what kvwatch's advice and the alerts
    say): the table at the top of the action's fix in docs/alerts.md (block ``flags_<action>``)."""
    rows = ["| " + " | ".join(e.title for e in ENGINES) + " |", "|" + "---|" * len(ENGINES)]
    rows.append("| " + " | ".join(f"`{e.flag(action)}`" if e.flag(action) != "-" else "none" for e in ENGINES) + " |")
    return "\n".join(rows)


def engines_table() -> str:
    """What each engine's metrics can show: the limits kvwatch may name for it, and what it cannot tell."""
    rows = [
        "| engine | `--engine` | metrics path (and the one read after it) | limits kvwatch can name | cannot tell |",
        "|---|---|---|---|---|",
    ]
    named = [b for b in Bottleneck if b not in (Bottleneck.IDLE, Bottleneck.NONE, Bottleneck.UNREACHABLE)]
    for e in ENGINES:
        shows = ", ".join(f"`{b}`" for b in named if b in e.shows)
        paths = f"`{e.metrics_path}`" + (f" (`{e.extra.path}`: {e.extra.enable})" if e.extra else "")
        rows.append(f"| {e.title} | `{e.name}` | {paths} | {shows} | {e.cannot_tell or '-'} |")
    return "\n".join(rows)


def confidence_table() -> str:
    rows = ["| confidence | pages | meaning |", "|---|---|---|"]
    rows += [f"| `{c}` | {'yes' if c.pages else 'no'} | {c.meaning} |" for c in Confidence]
    return "\n".join(rows)


def faults_table(root: str = "") -> str:
    """``root``: the repository's root seen from the page (``../`` from docs/), for the links to the tests."""
    rows = ["| fault | what kvwatch does | `reason` | test |", "|---|---|---|---|"]
    for f in ALL:
        path, _, name = f.test.partition("::")
        test = f"`{name}[{f.id}]`" if name == "test_fault_sets_up_0_counts_reason_and_recovers" else f"`{name}`"
        rows.append(
            f"| {f.fault} | {f.does} | {f'`{f.reason}`' if f.reason else '-'} | [{path}]({root}{path}) {test} |"
        )
    return "\n".join(rows)


def alerts_table() -> str:
    """One row per alert of alerts/kvwatch-alerts.yaml, its rules' severities and ``for`` in file order, and its
    runbook: the section of docs/alerts.md its runbook_url names."""
    alerts: dict[str, list[dict]] = {}
    for group in yaml.safe_load((REPO / "alerts" / "kvwatch-alerts.yaml").read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                alerts.setdefault(rule["alert"], []).append(rule)
    rows = ["| alert | severity | for | runbook |", "|---|---|---|---|"]
    for name, rules in alerts.items():
        severity = " / ".join(r["labels"]["severity"] for r in rules)
        wait = " / ".join(r.get("for", "–") for r in rules)
        anchor = rules[0]["annotations"]["runbook_url"].rpartition("#")[2]
        rows.append(f"| `{name}` | {severity} | {wait} | [runbook](#{anchor}) |")
    return "\n".join(rows)


def dashboard_engines_table() -> str:
    """One row per dashboard panel, one column per engine the panels are checked against on a real Prometheus: "yes"
    where every query of the panel has data for that engine, else what is missing and why (the panel's ``no_data``)."""
    engines = common.CHECKED_ENGINES
    rows = [
        "| dashboard | panel | " + " | ".join(by_name(e).title for e in engines) + " |",
        "|---|---|" + "---|" * len(engines),
    ]
    for dash in grafana.build_all().values():
        panels = [p for p in common.iter_panels(dash) if p.get("targets")]
        titles = [p["title"] for p in panels]
        for panel in panels:
            title = panel["title"] + (" (tile)" if titles.count(panel["title"]) > 1 and panel["type"] == "stat" else "")
            missing = common.no_data_of(panel)
            names = common.query_names(panel)
            cells = []
            for engine in engines:
                by_reason: dict[str, list[str]] = {}
                for (e, ref), reason in missing.items():
                    if e == engine:
                        by_reason.setdefault(reason, []).append(names[ref])
                if not by_reason:
                    cells.append("yes")
                elif len(by_reason) == 1 and len(next(iter(by_reason.values()))) == len(names):
                    cells.append(f"no: {next(iter(by_reason))}")
                else:
                    parts = [", ".join(f"*{n}*" for n in which) + f": {why}" for why, which in by_reason.items()]
                    cells.append("partly, no " + "; no ".join(parts))
            rows.append(f"| {dash['title']} | {title} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def reasons_table() -> str:
    rows = ["| `reason` | meaning |", "|---|---|"]
    rows += [f"| `{r}` | {r.meaning} |" for r in ScrapeReason]
    return "\n".join(rows)


def worst_case_text() -> str:
    engines = Settings.model_fields["max_engines"].default
    target = len("http://vllm-0.vllm.inference.svc:8000/metrics")
    one = worst_case(1, engines, target)
    return (
        f"At the default `--max-engines {engines}`, one target with a {target}-character URL: at most "
        f"**{one[0]:,} series, {one[1] / 2**20:.1f} MiB** per kvwatch `/metrics` response (`kvwatch.export.worst_case`: "
        f"every family at its most series, {engines} + 1 engines, every `model_name` / `engine` value "
        f"{MAX_LABEL_CHARS} characters and every character escaped). "
        f"It grows linearly with targets and `--max-engines`. The port serves {MAX_CONNECTIONS} connections at once "
        f"and drops one that has not sent a complete request within {REQUEST_DEADLINE_SECONDS:g} s."
    )


TABLES: dict[str, Callable[[], str]] = {
    "metrics": metrics_table,
    "bottlenecks": bottlenecks_table,
    "actions": actions_table,
    "engines": engines_table,
    "confidence": confidence_table,
    "faults": faults_table,
    "reasons": reasons_table,
    "worst_case": worst_case_text,
    "alerts": alerts_table,
    **{f"flags_{a}": functools.partial(flags_table, a) for a in Action},
    "dashboard_engines": dashboard_engines_table,
}


def render(text: str, root: str = "") -> str:
    """The page with each generated block rewritten; ``root`` is the repository root seen from the page."""

    def block(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in TABLES:
            raise SystemExit(f"unknown generated block catalog:{name} (known: {', '.join(TABLES)})")
        table = faults_table(root) if name == "faults" else TABLES[name]()
        return m.group(1) + table + "\n" + m.group(3)

    return BLOCK.sub(block, text)


def missing(pages: dict[Path, str]) -> list[str]:
    """Tables no page holds."""
    found = {m.group(2) for text in pages.values() for m in BLOCK.finditer(text)}
    return [name for name in TABLES if name not in found]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a page's tables are out of date")
    args = ap.parse_args(argv)
    current = {page: page.read_text() for page in PAGES}
    if absent := missing(current):
        print(
            f"no page holds the generated block(s) {', '.join(absent)}: add <!-- BEGIN catalog:NAME --> ... "
            "<!-- END catalog:NAME --> where the topic is documented",
            file=sys.stderr,
        )
        return 1
    wanted = {page: render(text, "" if page.parent == REPO else "../") for page, text in current.items()}
    stale = [page for page in PAGES if current[page] != wanted[page]]
    if args.check:
        for page in stale:
            print(
                f"{page.relative_to(REPO)}: generated tables are out of date: run python docs/generate.py",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for page in stale:
        page.write_text(wanted[page])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
