#!/usr/bin/env python3
"""Copy the generated monitoring manifests into deploy/monitoring/, where kustomize can load them.

kustomize's default load restrictor only reads files inside (or below) a kustomization's own directory, so
`kubectl kustomize deploy/overlays/example` cannot load ../../alerts/prometheusrule.yaml. It can load another
*kustomization directory* anywhere, though. So for each source this script writes into
deploy/monitoring/kustomization.yaml either

- a reference to the source's directory, when that directory has its own kustomization.yaml listing the file
  (no copy, nothing to keep in sync), or else
- a verbatim copy of the file beside it:

    alerts/prometheusrule.yaml  ->  deploy/monitoring/prometheusrule.yaml     (the PrometheusRule)
    grafana/configmaps.yaml     ->  deploy/monitoring/grafana-dashboards.yaml (dashboard ConfigMaps)

A source that does not exist (yet) is left out. Both are generated (alerts/, grafana/generate.py): whoever
regenerates one runs this script too, until its directory has a kustomization.yaml.

    python3 deploy/sync.py           # write the copies
    python3 deploy/sync.py --check   # change nothing; exit 1 naming every stale file (tests/test_deploy.py)

Standard library only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
REPO = DEPLOY.parent
OUT = DEPLOY / "monitoring"

# source (relative to the repository) -> copy (relative to deploy/monitoring/), in kustomization order
SOURCES = {
    Path("alerts/prometheusrule.yaml"): Path("prometheusrule.yaml"),
    Path("grafana/configmaps.yaml"): Path("grafana-dashboards.yaml"),
}

HEADER = "# Copied by deploy/sync.py{source}. Do not edit: change the source and run `python3 deploy/sync.py`.\n"


def expected(repo: Path = REPO) -> dict[Path, str]:
    """Every file deploy/monitoring/ should hold (path relative to it -> text)."""
    files: dict[Path, str] = {}
    resources = []
    for source, copy in SOURCES.items():
        if (repo / source.parent / "kustomization.yaml").is_file():
            resources.append(f"../../{source.parent.as_posix()}")
        elif (repo / source).is_file():
            files[copy] = HEADER.format(source=f" from {source.as_posix()}") + (repo / source).read_text(
                encoding="utf-8"
            )
            resources.append(copy.as_posix())
    resources = "".join(f"  - {r}\n" for r in resources)
    files[Path("kustomization.yaml")] = (
        HEADER.format(source="")
        + "# kvwatch's PrometheusRule and Grafana dashboard ConfigMaps (label grafana_dashboard: \"1\"), whichever\n"
        + "# exist. Apply it where your Prometheus and Grafana look, or list it in an overlay (deploy/overlays/example).\n"
        + "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        + "kind: Kustomization\n"
        + ("resources:\n" + resources if resources else "resources: []\n")
    )
    return files


def stale(out: Path = OUT, repo: Path = REPO) -> list[str]:
    """What differs between deploy/monitoring/ and expected(): missing, outdated or extra files."""
    want = expected(repo)
    problems = []
    for rel, text in want.items():
        path = out / rel
        if not path.is_file():
            problems.append(f"missing  {rel.as_posix()}")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"outdated {rel.as_posix()}")
    if out.is_dir():
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            if path.relative_to(out) not in want:
                problems.append(f"extra    {path.relative_to(out).as_posix()}")
    return problems


def write(out: Path = OUT, repo: Path = REPO) -> list[str]:
    """Bring deploy/monitoring/ up to date; returns what was stale."""
    problems = stale(out, repo)
    want = expected(repo)
    if out.is_dir():
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            if path.relative_to(out) not in want:
                path.unlink()
    for rel, text in want.items():
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Copy alerts/ and grafana/ manifests into deploy/monitoring/.")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if deploy/monitoring/ is stale")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale()
        for p in problems:
            print(f"deploy/monitoring: {p}")
        if problems:
            print("deploy/monitoring/ is out of date: run `python3 deploy/sync.py` and commit it", file=sys.stderr)
            return 1
        print("deploy/monitoring/ is up to date")
        return 0
    for p in write():
        print(f"deploy/monitoring: {p} (fixed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
