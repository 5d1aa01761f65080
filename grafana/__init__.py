"""kvwatch's Grafana dashboards, one module per dashboard, built on :mod:`grafana.common`.

The JSON in grafana/dashboards/ is generated from these modules: edit the panels here and run
``python grafana/generate.py``, never the JSON (CI runs ``--check``). grafana/kustomization.yaml makes the
Kubernetes ConfigMaps from that JSON.

Standard library and kvwatch.catalog only (no dashboard SDK): a dashboard is a dict, a panel is a dict,
and the helpers in :mod:`grafana.common` keep every panel on the same conventions, which
tests/test_dashboards*.py check:

- every panel queries the ``datasource`` template variable (``${datasource}``); no ``__inputs`` and no
  ``${DS_PROMETHEUS}``, which break file provisioning;
- ``namespace`` / ``pod`` / ``model_name`` variables (multi-value, "All" = ``.*`` so series without the
  label, e.g. outside Kubernetes, still match);
- stable readable uids (``kvwatch-overview`` ...), ``$__rate_interval`` for rates;
- only ``timeseries`` / ``stat`` / ``state-timeline`` / ``table`` panels (no Angular ``graph``);
- a unit and a description on every panel; the description says what the panel shows, what to do when
  it looks bad, and which metrics it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana import capacity, fleet, latency, overview
from grafana.common import JSON

HERE = Path(__file__).resolve().parent
DASHBOARD_DIR = HERE / "dashboards"

DASHBOARDS: dict[str, Callable[[], JSON]] = {
    "kvwatch-overview": overview.build,
    "kvwatch-capacity": capacity.build,
    "kvwatch-latency": latency.build,
    "kvwatch-fleet": fleet.build,
}


def build_all() -> dict[str, JSON]:
    return {name: build() for name, build in DASHBOARDS.items()}


def render_json(dash: JSON) -> str:
    return json.dumps(dash, indent=2, ensure_ascii=False) + "\n"


def outputs() -> dict[Path, str]:
    return {DASHBOARD_DIR / f"{name}.json": render_json(d) for name, d in build_all().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate kvwatch's Grafana dashboards.")
    parser.add_argument(
        "--check", action="store_true", help="fail if the committed files differ from the generated ones"
    )
    args = parser.parse_args(argv)

    errors = []
    files = outputs()
    for path, content in files.items():
        rel = path.relative_to(HERE.parent)
        if args.check:
            if not path.exists():
                errors.append(f"{rel} is missing")
            elif path.read_text(encoding="utf-8") != content:
                errors.append(f"{rel} is out of date")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content, encoding="utf-8")
    stray = sorted(p.name for p in DASHBOARD_DIR.glob("*.json") if p not in files)
    if stray:
        errors.append(f"grafana/dashboards/ has files this script does not generate: {stray}")
    for error in errors:
        print(error, file=sys.stderr)
    if errors and args.check:
        print("Run: python grafana/generate.py", file=sys.stderr)
    if not errors and not args.check:
        print(f"wrote {len(files)} files")
    return 1 if errors else 0
