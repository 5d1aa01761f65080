"""``kvwatch report``: what happened, in one file: a recording (or a running kvwatch's history) and optional
``vllm bench serve --save-result`` stages, with the limit that bound at each load level.

    kvwatch report REC_DIR --bench c1.json --bench c8.json --slo-ttft-p99 2 --out report.html
    kvwatch report --from http://kvwatch:9847 --format md

``source`` reads the recording or history into a ``Timeline``, ``bench`` reads the stages, ``model`` builds
the report as data (pure), ``render`` writes HTML, Markdown or JSON. Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

from kvwatch.config import ConfigError
from kvwatch.redact import redact_url

__all__ = ["main"]


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return v


def _instant(text: str) -> float:
    """Unix seconds, or ISO 8601 (without a zone: this machine's local time)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be unix seconds or an ISO 8601 time, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    from kvwatch.cli import _analysis_flags, _env_and_default, _Parser

    p = _Parser(
        prog="kvwatch report",
        description="One self-contained report of a recording (or a running "
        "kvwatch's history) and benchmark runs: the limit that bound at each load level, and what to change.",
    )
    p.add_argument("recording", nargs="?", type=Path, help="a `kvwatch record --out` directory")
    p.add_argument(
        "--from", dest="from_url", metavar="URL", help="a running kvwatch (its /api/v1/history; default: none)"
    )
    p.add_argument(
        "--bench",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="a `vllm bench serve --save-result` JSON file: one stage (repeatable; default: none)",
    )
    p.add_argument(
        "--stage-start",
        action="append",
        type=_instant,
        default=[],
        metavar="TIME",
        help="start of the matching --bench stage (unix seconds or ISO 8601), instead of its file's "
        "`date` field (local time, end of run) minus its duration (default)",
    )
    p.add_argument(
        "--slo-ttft-p99", type=_seconds, metavar="S", help="TTFT p99 objective in seconds (the knee; default: none)"
    )
    p.add_argument(
        "--slo-itl-p99", type=_seconds, metavar="S", help="ITL p99 objective in seconds (the knee; default: none)"
    )
    p.add_argument("--format", choices=("html", "md", "json"), default="html", help="html (default), md or json")
    p.add_argument("--out", "-o", type=Path, help="file to write (default: standard output)")
    _analysis_flags(p)
    _env_and_default(p)
    return p


def _history_url(url: str) -> str:
    base = url.split("?", 1)[0].rstrip("/")
    return url if base.endswith("/api/v1/history") else base + "/api/v1/history"


def _timeline(args, settings):
    from kvwatch.report.source import ReportError, from_history, from_recording, parse_history
    from kvwatch.state import Target

    if args.from_url:
        import httpx

        url = _history_url(args.from_url)
        try:
            r = httpx.get(url, timeout=30, verify=settings.tls_verify)
        except httpx.HTTPError as e:
            raise ReportError(f"cannot read {redact_url(url)}: {type(e).__name__}") from None
        if r.status_code != 200:
            raise ReportError(f"{redact_url(url)} answered HTTP {r.status_code}")
        return from_history(parse_history(r.text))
    return from_recording(args.recording, Target.from_settings(str(args.recording), settings))


def _stages(args) -> list:
    from kvwatch.report.bench import read_stage

    if args.stage_start and len(args.stage_start) != len(args.bench):
        raise ConfigError(
            f"invalid setting --stage-start: {len(args.stage_start)} given for {len(args.bench)} --bench "
            "files (one per file, in the same order)"
        )
    starts = args.stage_start or [None] * len(args.bench)
    try:
        return [read_stage(f, s) for f, s in zip(args.bench, starts, strict=True)]
    except ValueError as e:
        raise ConfigError(f"invalid setting --bench: {e}") from None


def _report(args) -> int:
    from kvwatch.cli import _settings, _setup_logging
    from kvwatch.report.model import Slo, build_report
    from kvwatch.report.render import render_html, render_json, render_markdown
    from kvwatch.report.source import ReportError

    if (args.recording is None) == (args.from_url is None):
        raise ConfigError("invalid setting: report needs a recording directory or --from URL (one of them)")
    settings = _settings(args)
    _setup_logging(settings)
    stages = _stages(args)
    try:
        tl = _timeline(args, settings)
    except ReportError as e:
        raise ConfigError(f"invalid setting {'--from' if args.from_url else 'recording'}: {e}") from None
    th = settings.thresholds
    model = build_report(
        tl,
        stages,
        Slo(args.slo_ttft_p99, args.slo_itl_p99),
        thresholds={"admission_stall": th.admission_stall, "preemption_risk": th.preemption_risk},
    )
    if args.format == "json":
        text = render_json(model)
    elif args.format == "md":
        text = render_markdown(model)
    else:
        text = render_html(model, tl, settings)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        args.out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"invalid setting --out: cannot write {str(args.out)!r}: {e.strerror or e}") from None
    print(f"wrote {args.out} ({len(text.encode()):,} bytes, {len(stages)} stages)", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _report(args)
    except ConfigError as e:
        print(f"kvwatch: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
