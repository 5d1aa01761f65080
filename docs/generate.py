#!/usr/bin/env python3
"""Write the README's vocabulary tables from ``kvwatch/catalog.py``: exported metrics, bottlenecks, actions,
confidence levels.

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

from kvwatch.catalog import ENGINE, FAMILIES, Action, Bottleneck, Confidence, Family  # noqa: E402

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
    rows = ["| action (cheapest first) | flag | what it does |", "|---|---|---|"]
    rows += [f"| `{a}` | `{a.flag}` | {a.meaning} |" for a in Action]
    return "\n".join(rows)


def confidence_table() -> str:
    rows = ["| confidence | pages | meaning |", "|---|---|---|"]
    rows += [f"| `{c}` | {'yes' if c.pages else 'no'} | {c.meaning} |" for c in Confidence]
    return "\n".join(rows)


TABLES = {
    "metrics": metrics_table,
    "bottlenecks": bottlenecks_table,
    "actions": actions_table,
    "confidence": confidence_table,
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
