"""Command line: ``kvwatch [run|diagnose|record|report|sim|demo|logs|plan] ...``.

Flags are parsed as strings and validated by ``kvwatch.config.Settings`` together with the
``KVWATCH_*`` environment, so a bad flag and a bad env var fail the same way: exit 2, one line.
``plan`` reads no ``KVWATCH_*`` environment (its flags describe a deployment, not this process), only vLLM's
own ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``, as the server would: ``kvwatch.plan`` validates them, with the same exit 2
and one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from kvwatch import __version__
from kvwatch.catalog import Bottleneck
from kvwatch.config import ConfigError, Settings, check_target, load_settings
from kvwatch.engines import AUTO
from kvwatch.engines import names as engine_names
from kvwatch.logformat import TEXT_FORMAT, formatter
from kvwatch.parse import ParseError
from kvwatch.plan import DEFAULT_BLOCK_SIZE, Deployment, PlanError, as_dict, model_from_config, plan
from kvwatch.plan import render_text as render_plan
from kvwatch.recording import check_writable, read_recorded, recording_files, write_extra, write_snapshot
from kvwatch.redact import SecretFilter, redact_url
from kvwatch.scrape import ScrapeError
from kvwatch.state import NoEngineMetrics, Target, TargetDiagnosis

SUBCOMMANDS = ("run", "diagnose", "record", "report", "sim", "demo", "logs", "plan")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the whole usage first)
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def _env_and_default(p: argparse.ArgumentParser) -> None:
    """Ends each settings flag's help with its environment variable and default, from ``Settings`` itself."""
    for action in p._actions:
        field = Settings.model_fields.get(action.dest)
        if field is None or not action.option_strings or action.help is None:
            continue
        extra = f"env KVWATCH_{action.dest.upper()}"
        if "default" not in action.help:
            extra += f", default {_shown(field.get_default(call_default_factory=True))}"
        action.help += f" ({extra})"


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(value)
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def _scrape_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--interval", help="seconds between scrapes")
    p.add_argument("--timeout", help="per-scrape timeout in seconds (default 0.8 x interval)")
    p.add_argument("--max-body-bytes", help="refuse larger /metrics bodies (default 16 MiB)")
    p.add_argument("--bearer-token-file", help="file holding the bearer token for /metrics")
    p.add_argument("--tls-verify", action=argparse.BooleanOptionalAction, default=None, help="verify TLS (default on)")


def _analysis_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--window", help="seconds of history the diagnosis uses")
    p.add_argument("--stale-after", help="withdraw derived series after this many seconds without a good scrape")
    p.add_argument(
        "--max-num-seqs",
        help="the running-request ceiling: vLLM's --max-num-seqs, SGLang's --max-running-requests, ... (optional hint)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        help="the per-step token budget: vLLM's --max-num-batched-tokens, SGLang's --chunked-prefill-size, ... (optional hint)",
    )
    p.add_argument(
        "--max-model-len",
        help="the context length: vLLM's --max-model-len, SGLang's --context-length, ... (optional hint)",
    )
    p.add_argument("--admission-stall-threshold", help="KV usage at which prefills stall")
    p.add_argument("--preemption-risk-threshold", help="KV usage at which preemption starts")
    p.add_argument("--max-engines", help="(model, engine) pairs per target before folding into _overflow")
    p.add_argument("--engine", help=f"how to read the target: {', '.join((AUTO, *engine_names()))} (default auto)")
    _log_flags(p)


def _log_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", help="debug, info, warning or error")
    p.add_argument("--log-format", help="text or json (one JSON object per line)")


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or not v > 0 or v != v or v == float("inf"):
            raise argparse.ArgumentTypeError(
                f"must be a positive {'integer' if kind is int else 'number'}, got {text!r}"
            )
        return v

    return parse


def _plan_flags(p: argparse.ArgumentParser) -> None:
    count, number = _positive(int), _positive(float)
    p.add_argument("--model-config", type=Path, required=True, help="the model's Hugging Face config.json (required)")
    p.add_argument(
        "--gpu-memory-gib", type=number, help="one GPU's memory in GiB, with --gpu-memory-utilization (default: none)"
    )
    p.add_argument("--gpu-memory-utilization", type=number, help="vLLM's --gpu-memory-utilization (default 0.9)")
    p.add_argument(
        "--weights-gib",
        type=number,
        help="the model's weights in GiB (default: estimated for dense Llama-style models)",
    )
    p.add_argument(
        "--kv-cache-memory-bytes", type=count, help="vLLM's --kv-cache-memory-bytes, KV memory per GPU (default: none)"
    )
    p.add_argument("--tensor-parallel-size", type=count, default=1, help="vLLM's --tensor-parallel-size (default 1)")
    p.add_argument(
        "--kv-cache-dtype", choices=("auto", "fp8"), default="auto", help="vLLM's --kv-cache-dtype (default auto)"
    )
    p.add_argument("--block-size", type=count, default=DEFAULT_BLOCK_SIZE, help="vLLM's --block-size (default 16)")
    p.add_argument(
        "--prompt-tokens", type=count, help="prompt tokens per request, with --output-tokens (default: none)"
    )
    p.add_argument(
        "--output-tokens", type=count, help="output tokens per request, with --prompt-tokens (default: none)"
    )
    p.add_argument("--max-model-len", type=count, help="vLLM's --max-model-len (default: config.json's)")
    p.add_argument("--max-num-seqs", type=count, help="vLLM's --max-num-seqs (default: none)")
    p.add_argument(
        "--max-num-batched-tokens", type=count, help="vLLM's --max-num-batched-tokens, the token budget (default: none)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kvwatch",
        description="Which limit binds your LLM-serving engine (vLLM, SGLang, TensorRT-LLM, llama.cpp), and what to change.",
    )
    parser.add_argument("--version", action="version", version=f"kvwatch {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    run = sub.add_parser(
        "run", help="the sidecar (default)", description="Scrape the serving engine and serve kvwatch's metrics."
    )
    run.add_argument(
        "--target", action="append", help="the engine's Prometheus URL, e.g. http://HOST:8000/metrics (repeatable)"
    )
    run.add_argument("--listen", help="HOST:PORT to serve on")
    run.add_argument("--web-config-file", help="exporter-toolkit web config: TLS and basic auth on --listen")
    run.add_argument("--history", help="seconds of history the status page at / charts")
    _scrape_flags(run)
    _analysis_flags(run)

    diag = sub.add_parser("diagnose", help="scrape for a while (or replay a recording) and print the diagnosis")
    diag.add_argument("url", nargs="?", help="the engine's Prometheus URL (default: env KVWATCH_TARGET)")
    diag.add_argument("--duration", type=float, default=15.0, help="seconds to watch (default 15)")
    diag.add_argument("--replay", type=Path, help="directory of recorded <unix_time>.prom files (default: none)")
    diag.add_argument("--json", action="store_true", help="print JSON")
    diag.add_argument("--timeline", action="store_true", help="one JSON object per snapshot")
    _scrape_flags(diag)
    _analysis_flags(diag)

    rec = sub.add_parser("record", help="save every scrape as DIR/<unix_time>.prom")
    rec.add_argument("url", help="the engine's Prometheus URL")
    rec.add_argument("--out", type=Path, required=True, help="directory to write to (required, no default)")
    rec.add_argument("--duration", type=float, required=True, help="seconds to record (required, no default)")
    _scrape_flags(rec)
    _log_flags(rec)

    for p in (run, diag, rec):
        _env_and_default(p)
    sub.add_parser("report", help="an HTML/Markdown report of a recording and benchmark runs", add_help=False)
    sub.add_parser(
        "sim", help="the built-in engine simulator, vLLM or --engine's exposition (kvwatch sim --help)", add_help=False
    )
    sub.add_parser("demo", help="simulator + sidecar + live view (kvwatch demo --help)", add_help=False)
    sub.add_parser("logs", help="diagnose from vLLM's own log (kvwatch logs --help)", add_help=False)
    _plan_flags(
        sub.add_parser(
            "plan",
            help="KV capacity and concurrency before deployment, from a config.json",
            description="vLLM's KV-cache arithmetic for a model and GPU: KV bytes per token, cache size, "
            "maximum concurrency, the limit that binds first, and what-ifs.",
            epilog="None of these flags has an environment variable.",
        )
    )
    return parser


def _url_argument(url: str | None) -> list[str] | None:
    """The URL argument, checked under its own name; without one, the targets of KVWATCH_TARGET (as ``run``)."""
    if url is None:
        if not os.environ.get("KVWATCH_TARGET"):
            raise ConfigError("invalid setting: give a URL (or env KVWATCH_TARGET), or --replay DIR")
        if len(load_settings().target) > 1:
            raise ConfigError("invalid setting KVWATCH_TARGET: lists several targets; give one URL")
        return None
    try:
        check_target(url)
    except ValueError as e:
        raise ConfigError(f"invalid argument URL: {e}") from None
    return [url]


def _settings(args: argparse.Namespace, **extra) -> Settings:
    fields = set(Settings.model_fields)
    given = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    given.update({k: v for k, v in extra.items() if v is not None})
    return load_settings(**given)


def _setup_logging(settings: Settings) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format=TEXT_FORMAT, stream=sys.stderr)
    # Whoever logs (us, httpx, aiohttp, asyncio), no target credential is written, in either format: the
    # filter redacts every URL of a record before any formatter sees it. Nothing logs the bearer token's header.
    for handler in logging.getLogger().handlers:
        handler.addFilter(SecretFilter())
        handler.setFormatter(formatter(settings.log_format))
    # httpx logs every request at INFO: one line per scrape per target is noise, not news.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))


# ---------------------------------------------------------------------------------------- output


def _headline(d: TargetDiagnosis) -> str:
    if d.up:
        return d.bottleneck
    if d.bottleneck == Bottleneck.UNREACHABLE and d.error:
        return d.error  # its reason's own words: "unreachable" only when the network is to blame
    return f"{d.bottleneck} ({d.error or 'not scraped'})"


def render_text(d: TargetDiagnosis) -> str:
    lines = [f"{d.target}: {_headline(d)}"]
    for e in d.engines:
        lines.append(f"  model {e.model_name!r} engine {e.engine}: {e.bottleneck} (confidence {e.confidence})")
        for ev in e.evidence:
            lines.append(f"    - {ev}")
        for r in e.recommendations:
            lines.append(f"    => {r.action}: {r.why}")
    return "\n".join(lines)


class _History:
    """Diagnoses over a run, to summarise what was seen (not just how it ended)."""

    def __init__(self):
        self.seen: Counter[str] = Counter()
        self.worst: TargetDiagnosis | None = None
        self.first: float | None = None  # the first diagnosis' time: the worst moment is told as an offset

    @staticmethod
    def _badness(d: TargetDiagnosis) -> tuple[int, float]:
        # The most severe state; among equals, the moment with the longest queue.
        return Bottleneck(d.bottleneck).severity, sum((e.signals.queue.waiting or 0) for e in d.engines)

    def add(self, d: TargetDiagnosis) -> None:
        self.first = d.timestamp if self.first is None else self.first
        self.seen[d.bottleneck] += 1
        if self.worst is None or self._badness(d) > self._badness(self.worst):
            self.worst = d

    def summary(self) -> dict:
        return {
            "bottlenecks_seen": dict(self.seen),
            "worst": self.worst.as_dict() if self.worst else None,
        }


def _moment(t: float, first: float | None, what: str) -> str:
    """A time as a reader takes it: UTC, and how far into the recording (or run) it came."""
    when = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{when}, {t - (t if first is None else first):.1f} s into the {what}"


def _print_result(final: TargetDiagnosis, hist: _History, as_json: bool, what: str = "run") -> None:
    if as_json:
        doc = final.as_dict()
        doc["summary"] = hist.summary()
        print(json.dumps(doc, indent=1))
        return
    print(render_text(final))
    seen = ", ".join(f"{b} x{n}" for b, n in hist.seen.most_common())
    print(f"\nseen over the run: {seen}")
    if hist.worst is not None and hist.worst is not final and hist.worst.bottleneck != final.bottleneck:
        print(f"\nworst moment ({_moment(hist.worst.timestamp, hist.first, what)}):")
        print(render_text(hist.worst))


# ---------------------------------------------------------------------------------------- commands


def _replay(args, settings: Settings) -> int:
    d = args.replay
    if not d.is_dir():
        raise ConfigError(f"invalid setting --replay: {str(d)!r} is not a directory")
    files = recording_files(d)
    if not files:
        raise ConfigError(f"invalid setting --replay: no <unix_time>.prom files in {str(d)!r}")
    state = Target.from_settings(str(d), settings)
    hist = _History()
    final = None
    for t, f in files:
        try:
            state.observe_body(t, *read_recorded(f))
        except (ParseError, NoEngineMetrics) as e:
            err = ScrapeError("parse" if isinstance(e, ParseError) else "no_vllm_metrics", str(e))
            state.observe_failure(t, f"{f.name}: {err}", err.reason)
        final = state.diagnose(t)
        hist.add(final)
        if args.timeline:
            print(json.dumps(final.as_dict()), flush=True)
    if not args.timeline:
        assert final is not None  # files is not empty
        _print_result(final, hist, args.json, "recording")
    return 0


async def _diagnose_live(args, settings: Settings) -> int:
    from kvwatch.app import Monitor

    monitor = Monitor(settings)
    hist = _History()
    await monitor.start()
    status = monitor.targets[settings.target[0]]
    try:
        end = time.monotonic() + args.duration
        seen = 0
        while time.monotonic() < end:
            await asyncio.sleep(min(0.1, max(0.0, end - time.monotonic())))
            if monitor.scrapes != seen and status.diagnosis is not None:
                seen = monitor.scrapes
                hist.add(status.diagnosis)
                if args.timeline:
                    print(json.dumps(status.diagnosis.as_dict()), flush=True)
    finally:
        await monitor.stop()
    final = status.diagnosis
    if final is None:
        print(f"{status.target}: no scrape completed in {args.duration:g}s", file=sys.stderr)
        return 1
    if not args.timeline:
        _print_result(final, hist, args.json)
    return 0 if final.bottleneck != Bottleneck.UNREACHABLE else 1


async def _record(args, settings: Settings) -> int:
    from kvwatch.scrape import FetchConfig, Fetcher, ScrapeError

    try:
        check_writable(args.out)
    except OSError as e:  # the user's directory: a bad setting, exit 2
        raise ConfigError(f"invalid setting --out: cannot write to {str(args.out)!r}: {e.strerror or e}") from None
    fetcher = Fetcher(
        FetchConfig(settings.scrape_timeout, settings.max_body_bytes, settings.bearer_token_file, settings.tls_verify),
        user_agent=f"kvwatch/{__version__}",
    )
    label = redact_url(settings.target[0])
    state = Target.from_settings(settings.target[0], settings)  # only to know the engine and its extra path's URL
    saved = failed = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    tick = start
    try:
        while loop.time() - start < args.duration:
            t = time.time()
            started = loop.time()
            try:
                body = await fetcher.fetch(settings.target[0])
            except ScrapeError as e:
                failed += 1
                logging.getLogger("kvwatch").warning("scrape failed: %s", e, extra={"target": label})
            else:
                try:
                    left = settings.scrape_timeout - (loop.time() - started)
                    await _record_extra(fetcher, state, args.out, t, body, left)
                    write_snapshot(args.out, t, body)
                except OSError as e:  # a full disk, a file system gone read-only: stop, nothing partial is left
                    print(
                        f"kvwatch record: error: cannot write a snapshot to {args.out}: {e.strerror or e}; stopped after "
                        f"{saved} snapshots (each complete, no partial file left)",
                        file=sys.stderr,
                    )
                    return 1
                saved += 1
            tick += settings.interval
            await asyncio.sleep(max(0.0, tick - loop.time()))
    finally:
        await fetcher.aclose()
    print(f"recorded {saved} snapshots to {args.out} ({failed} failed scrapes)")
    return 0 if saved else 1


async def _record_extra(fetcher, state: Target, out: Path, t: float, body: str, left: float) -> None:
    """Beside the scrape at ``t``, what kvwatch reads of the engine's extra path (llama.cpp's /slots), fetched as the
    scrape loop does (while the engine serves, within what is left of the deadline), in the form its adapter keeps for
    recordings; nothing when the engine has none, is idle, or it failed or was unreadable (the replay then judges
    without it, as the loop would have). ``state`` follows the scrapes, to tell when the engine serves. Raises OSError
    (the write)."""
    from kvwatch.parse import parse

    try:
        families = parse(body, state.keep_family)
    except ParseError:
        return
    engine = state.engine_for(families)
    parsed = None
    if engine is not None and engine.extra is not None and state.serving(engine, families):
        url = engine.extra_url(state.url)
        try:
            parsed = engine.extra.parse(await fetcher.fetch_extra(url, left)) if url else None
        except ScrapeError:
            parsed = None
    try:
        state.observe(t, families, body, parsed)
    except NoEngineMetrics:
        return
    if parsed is not None and engine is not None and engine.extra is not None:
        write_extra(out, t, engine.extra.suffix, engine.extra.record(parsed))


def _plan(args) -> int:
    try:
        model = model_from_config(json.loads(args.model_config.read_text(encoding="utf-8")))
    except (OSError, ValueError, RecursionError) as e:  # PlanError, JSONDecodeError, UnicodeDecodeError: ValueErrors
        reason = e.strerror if isinstance(e, OSError) and e.strerror else (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"invalid setting --model-config ({str(args.model_config)!r}): {reason}") from None
    flags = {f: getattr(args, f) for f in Deployment.__dataclass_fields__ if hasattr(args, f)}
    try:
        p = plan(model, Deployment(**flags, allow_long_max_model_len=_vllm_allows_long_max_model_len()))
    except PlanError as e:
        raise ConfigError(str(e)) from None
    print(json.dumps(as_dict(p), indent=1) if args.json else render_plan(p))
    return 0


def _vllm_allows_long_max_model_len() -> bool:
    """vLLM's own reading of the variable (vllm/envs.py): "1" or "true", any case, spaces stripped."""
    return os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "0").strip().lower() in ("1", "true")


async def _run(settings: Settings) -> int:
    from kvwatch.app import serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await serve(settings, stop)
    except OSError as e:  # e.g. the port is taken
        print(f"kvwatch run: error: cannot listen on {settings.listen}: {e.strerror or e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        from kvwatch.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "demo":
        from kvwatch.demo import main as demo_main

        return demo_main(argv[1:])
    if argv and argv[0] == "report":
        from kvwatch.report import main as report_main

        return report_main(argv[1:])
    if argv and argv[0] == "logs":
        from kvwatch.logs import main as logs_main

        return logs_main(argv[1:])
    if not argv or (argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "run")
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would word it as the top-level parser's: name the command, as every error does
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        if args.command == "run":
            settings = _settings(args)
            _setup_logging(settings)
            return asyncio.run(_run(settings))
        if args.command == "diagnose":
            if args.replay is not None:
                settings = _settings(args)
                _setup_logging(settings)
                return _replay(args, settings)
            if args.duration <= 0:
                raise ConfigError("invalid setting --duration: must be > 0")
            settings = _settings(args, target=_url_argument(args.url))
            _setup_logging(settings)
            return asyncio.run(_diagnose_live(args, settings))
        if args.command == "plan":
            return _plan(args)
        if args.command == "record":
            if args.duration <= 0:
                raise ConfigError("invalid setting --duration: must be > 0")
            settings = _settings(args, target=_url_argument(args.url))
            _setup_logging(settings)
            return asyncio.run(_record(args, settings))
    except ConfigError as e:
        print(f"kvwatch {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. piped into head
        return 0
    build_parser().print_help()
    return 2
