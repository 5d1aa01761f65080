#!/usr/bin/env python3
"""Write the README's vocabulary tables from ``kvwatch/catalog.py``: exported metrics, bottlenecks, actions,
confidence levels; the fault table from ``tests/fault_table.py`` (the tests' own cases) and kvwatch's own
/metrics worst case from ``kvwatch.export.worst_case``.

Each table sits between ``<!-- BEGIN catalog:NAME -->`` and ``<!-- END catalog:NAME -->``; the rest of the
README is left as it is.

    python docs/generate.py           # rewrite the tables in README.md
    python docs/generate.py --check   # exit 1 if README.md's tables differ from the catalogue
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvwatch.app import MAX_CONNECTIONS, REQUEST_DEADLINE_SECONDS  # noqa: E402
from kvwatch.catalog import ENGINE, FAMILIES, Action, Bottleneck, Confidence, Family, ScrapeReason  # noqa: E402
from kvwatch.config import Settings  # noqa: E402
from kvwatch.engines import ENGINES  # noqa: E402
from kvwatch.export import worst_case  # noqa: E402
from kvwatch.snapshot import MAX_LABEL_CHARS  # noqa: E402
from tests.fault_table import ALL  # noqa: E402

README = REPO / "README.md"


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


def confidence_table() -> str:
    rows = ["| confidence | pages | meaning |", "|---|---|---|"]
    rows += [f"| `{c}` | {'yes' if c.pages else 'no'} | {c.meaning} |" for c in Confidence]
    return "\n".join(rows)


def faults_table() -> str:
    rows = ["| fault | what kvwatch does | `reason` | test |", "|---|---|---|---|"]
    for f in ALL:
        path, _, name = f.test.partition("::")
        test = f"`{name}[{f.id}]`" if name == "test_fault_sets_up_0_counts_reason_and_recovers" else f"`{name}`"
        rows.append(f"| {f.fault} | {f.does} | {f'`{f.reason}`' if f.reason else '-'} | [{path}]({path}) {test} |")
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


TABLES = {
    "metrics": metrics_table,
    "bottlenecks": bottlenecks_table,
    "actions": actions_table,
    "confidence": confidence_table,
    "faults": faults_table,
    "reasons": reasons_table,
    "worst_case": worst_case_text,
}


def render(text: str) -> str:
    for name, table in TABLES.items():
        pattern = re.compile(rf"(<!-- BEGIN catalog:{name} -->\n).*?(<!-- END catalog:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"README.md has no <!-- BEGIN catalog:{name} --> ... <!-- END catalog:{name} --> block")
        text = pattern.sub(lambda m: m.group(1) + table() + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if README.md's tables are out of date")
    args = ap.parse_args(argv)
    current = README.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print("README.md's catalogue tables are out of date: run python docs/generate.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
