"""``kvwatch sim``: serve a simulated vLLM server's /metrics.

    kvwatch sim [--scenario NAME | --scenario-file F] [--host H] [--port P] [--seed S]
                [--speed X] [--engines N] [--engine {vllm,sglang,trtllm,triton-trtllm,llamacpp}]
                [--metrics-version {0.32,0.10,v0}] [--duration S]
                [--log-file F] [--list-scenarios]

Exit status: 0 on a clean stop (SIGINT/SIGTERM or ``--duration`` elapsed), 2 on a bad setting
(one line naming it), 1 when it cannot listen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import signal
import sys

from .exposition import METRICS_VERSIONS, normalize_version
from .expositions import EXPOSITIONS
from .scenario import ScenarioError, list_presets, load_scenario
from .server import SimServer

__all__ = ["main", "build_parser"]


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise _UsageError(message)


def _positive_float(name):
    def conv(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {s!r} is not a number") from None
        if not v > 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"{name}: must be > 0")
        return v

    return conv


def _int_range(name, lo, hi):
    def conv(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: {s!r} is not an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{name}: must be between {lo} and {hi}")
        return v

    return conv


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kvwatch sim",
        description="A simulated vLLM 0.32 server (V1 scheduler model) serving /metrics.",
        epilog="None of these flags has an environment variable.",
    )
    p.add_argument(
        "--scenario", default=None, metavar="NAME", help="preset: " + ", ".join(list_presets()) + " (default: tour)"
    )
    p.add_argument(
        "--scenario-file", default=None, metavar="F", help="a scenario JSON file of your own (default: none)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=_int_range("port", 0, 65535),
        default=8000,
        help="port to bind, 0 = any free port (default 8000, vLLM's)",
    )
    p.add_argument("--seed", type=_int_range("seed", 0, 2**63 - 1), default=0, help="random seed (default 0)")
    p.add_argument(
        "--speed",
        type=_positive_float("speed"),
        default=1.0,
        help="simulated seconds per wall-clock second (default 1)",
    )
    p.add_argument(
        "--engines",
        type=_int_range("engines", 1, 256),
        default=None,
        help="data-parallel engines (default: the scenario's)",
    )
    p.add_argument(
        "--engine",
        default="vllm",
        metavar="E",
        help="the engine whose metrics it serves: " + ", ".join(EXPOSITIONS) + " (default vllm; the same simulation)",
    )
    p.add_argument(
        "--metrics-version",
        default="0.32",
        metavar="V",
        help="exposition to imitate: " + ", ".join(METRICS_VERSIONS) + " (default 0.32)",
    )
    p.add_argument(
        "--duration",
        type=_positive_float("duration"),
        default=None,
        metavar="S",
        help="stop after S wall-clock seconds (default: run until interrupted)",
    )
    p.add_argument(
        "--log-file",
        default=None,
        metavar="F",
        help="append vLLM's own server log lines to F (the KV-cache size line, then a stats line per engine "
        "every 10 simulated seconds), for `kvwatch logs` (default: none)",
    )
    p.add_argument("--list-scenarios", action="store_true", help="print the presets and exit")
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # --help
            return int(e.code or 0)
        if args.list_scenarios:
            for name in list_presets():
                sc = load_scenario(name)
                print(f"{name:14s} {sc.description}")
            return 0
        if args.scenario and args.scenario_file:
            raise _UsageError("give --scenario or --scenario-file, not both")
        version = normalize_version(args.metrics_version)
        if args.scenario_file:
            scenario = load_scenario(path=args.scenario_file)
        else:
            scenario = load_scenario(args.scenario or "tour")
        if args.engines is not None:
            scenario = scenario.with_engines(args.engines)
        if version == "v0" and scenario.engines != 1:
            raise _UsageError("metrics-version v0: the V0 engine has no data parallelism (use --engines 1)")
        if args.engine not in EXPOSITIONS:
            raise _UsageError(f"--engine: {args.engine!r} is not one of {', '.join(EXPOSITIONS)}")
        speaks = EXPOSITIONS[args.engine]
        if speaks.one_engine and scenario.engines != 1:
            raise _UsageError(f"--engine {args.engine}: {speaks.one_engine} (use --engines 1)")
        if args.engine != "vllm" and args.metrics_version != "0.32":
            raise _UsageError(f"--metrics-version: vLLM's only; --engine {args.engine} speaks one version")
        if args.engine != "vllm" and args.log_file:
            raise _UsageError(f"--log-file: the simulator writes vLLM's log only, not {speaks.title}'s")
    except (_UsageError, ScenarioError, ValueError) as e:
        print(f"kvwatch sim: error: {e}", file=sys.stderr)
        return 2
    try:
        log = open(args.log_file, "a", encoding="utf-8") if args.log_file else None  # noqa: SIM115
    except OSError as e:
        print(f"kvwatch sim: error: --log-file: cannot write {args.log_file}: {e.strerror or e}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(scenario, args, version, log))
    except KeyboardInterrupt:  # pragma: no cover - signal handlers normally catch it first
        return 0
    finally:
        if log is not None:
            log.close()


async def _serve(scenario, args, version, log) -> int:
    def on_phase(name: str, t: float) -> None:
        print(f"phase {name} (t={t:.1f}s simulated)", flush=True)

    server = SimServer(
        scenario,
        host=args.host,
        port=args.port,
        seed=args.seed,
        speed=args.speed,
        metrics_version=version,
        on_phase=on_phase,
        log_stream=log,
        engine=args.engine,
    )
    try:
        await server.start()
    except OSError as e:
        reason = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
        print(f"kvwatch sim: error: cannot listen on {args.host}:{args.port}: {reason}", file=sys.stderr)
        return 1
    speaks = f"vLLM {version}" if args.engine == "vllm" else EXPOSITIONS[args.engine].title
    print(
        f"kvwatch sim: scenario {scenario.name} ({scenario.engines} engine{'s' if scenario.engines > 1 else ''}), "
        f"{speaks} metrics at {server.url} (seed {args.seed}, speed {args.speed:g}x)",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        if args.duration is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=args.duration)
        else:
            await stop.wait()
    finally:
        await server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
