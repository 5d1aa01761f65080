"""``kvwatch demo``: the built-in simulator, the sidecar watching it, and a live view. One command, no GPU.

The simulator (``kvwatch.sim``) serves vLLM-compatible /metrics; the sidecar is the real thing
(``kvwatch.app``: scrape loop + HTTP server), talking to the simulator over loopback HTTP exactly as it
would to vLLM. On a TTY the view redraws every second; otherwise (or with ``--plain``) it prints one
line per change of state.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time

from aiohttp import web

from kvwatch.app import LISTEN_BACKLOG, Monitor, make_app, make_runner
from kvwatch.catalog import Bottleneck
from kvwatch.config import ConfigError, load_settings
from kvwatch.diagnose import Diagnosis

BAR = 30


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"kvwatch demo: error: {message}\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="kvwatch demo",
        description="Simulated vLLM + kvwatch + a live view.",
        epilog="None of these flags has an environment variable.",
    )
    p.add_argument("--scenario", default="tour", help="simulator preset (default tour: every state in turn)")
    p.add_argument(
        "--engine",
        default="vllm",
        help="the engine the simulator speaks: vllm, sglang, trtllm, triton-trtllm, llamacpp (default vllm)",
    )
    p.add_argument("--speed", type=float, default=4.0, help="simulated seconds per real second (default 4)")
    p.add_argument("--seed", type=int, default=1, help="the simulator's random seed: same seed, same run (default 1)")
    p.add_argument("--listen", default="127.0.0.1:9847", help="where kvwatch serves (default 127.0.0.1:9847)")
    p.add_argument("--interval", default="0.5", help="kvwatch scrape interval in seconds (default 0.5)")
    p.add_argument("--window", default="3", help="kvwatch window in seconds (default 3: the sim runs fast)")
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--plain", action="store_true", help="one line per change of state (default without a TTY)")
    return p


def _bar(ratio: float | None, stall: float, risk: float) -> str:
    if ratio is None:
        return "[" + "?" * BAR + "]"
    filled = round(max(0.0, min(1.0, ratio)) * BAR)
    cells = ["#" if i < filled else "." for i in range(BAR)]
    for th, mark in ((stall, "|"), (risk, "!")):
        i = min(BAR - 1, int(th * BAR))
        cells[i] = mark if cells[i] == "." else cells[i]
    return "[" + "".join(cells) + f"] {ratio * 100:5.1f}%"


def _num(x, fmt="{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def preemptions_text(d: Diagnosis) -> str:
    """The preemption rate the diagnosis reads (its last samples, not the window's average), and "recovering" when
    the window still holds preemptions the diagnosis no longer blames (the tour's recovery read "none, high" beside
    a window average of 85.6/s)."""
    t = d.signals.throughput
    recent = (
        t.preemptions_recent_per_second if t.preemptions_recent_per_second is not None else t.preemptions_per_second
    )
    if recent is None:
        return "-"
    if d.bottleneck is Bottleneck.KV_CACHE or not t.preemptions_per_second:
        return f"{recent:.1f}"
    return f"{recent:.1f} recent, {t.preemptions_per_second:.1f} over the window: recovering"


def gap_text(d: Diagnosis) -> str:
    """The throughput gap as the diagnosis weighs it: the share of the window's intervals with prefill ~0 while
    generation went on, beside KV-bound evidence; the rates printed beside it are the window's averages."""
    share = d.signals.throughput.gap_fraction
    if d.bottleneck is not Bottleneck.KV_CACHE or not share:
        return ""
    return f"<- THROUGHPUT GAP: prefill ~0 in {share:.0%} of intervals"


def render_engine(d: Diagnosis, stall: float, risk: float) -> list[str]:
    s = d.signals
    lines = [
        f"  engine {d.engine} ({d.model_name}): bottleneck = {d.bottleneck.upper()} (confidence {d.confidence})",
        f"    KV cache   {_bar(s.kv.usage_ratio, stall, risk)}   (| {stall:.0%} admission stall, ! {risk:.0%} preemption)",
        f"    requests   running {_num(s.queue.running)}  waiting {_num(s.queue.waiting)}"
        f"  est. max concurrency {_num(s.capacity.estimated_max_concurrency, '{:.1f}')}"
        + (f"  max_num_seqs {d.max_num_seqs[0]} ({d.max_num_seqs[1]})" if d.max_num_seqs else ""),
        f"    tokens/s   prompt {_num(s.throughput.prompt_tokens_per_second)}  generation "
        f"{_num(s.throughput.generation_tokens_per_second)}  (window averages)  {gap_text(d)}",
        f"    preemptions/s {preemptions_text(d)}   tokens/step {_num(s.throughput.engine_step_tokens)}",
    ]
    for e in d.evidence:
        lines.append(f"    - {e}")
    for r in d.recommendations:
        lines.append(f"    => {r.action}: {r.why}")
    return lines


def plain_line(elapsed: float, phase: str, d: Diagnosis) -> str:
    s = d.signals
    top = f" -> {d.recommendations[0].action}" if d.recommendations else ""
    kv = "-" if s.kv.usage_ratio is None else f"{s.kv.usage_ratio:.0%}"
    return (
        f"[{elapsed:6.1f}s] sim phase {phase:<14} engine {d.engine}: {d.bottleneck:<13} {d.confidence:<6} "
        f"KV {kv:>4}, running {_num(s.queue.running)}, waiting {_num(s.queue.waiting)}, "
        f"preemptions/s {preemptions_text(d)}{top}"
    )


def _print_addresses(args, sim_url: str, base: str) -> None:
    # The status page first: the one address to open.
    print(f"kvwatch demo: open {base}/ in a browser: the live status page")
    from kvwatch.sim.expositions import by_name

    print(f"  simulated {by_name(args.engine).title} ({args.scenario}, speed x{args.speed:g}) at {sim_url}")
    print(f"  kvwatch metrics:   {base}/metrics")
    print(f"  kvwatch diagnosis: {base}/api/v1/diagnosis")
    print("  Ctrl-C to stop.\n", flush=True)


async def run_demo(args) -> int:
    from kvwatch.sim import SimServer

    try:
        sim = SimServer(args.scenario, host="127.0.0.1", port=0, seed=args.seed, speed=args.speed, engine=args.engine)
    except (ValueError, OSError) as e:
        raise ConfigError(f"invalid setting --scenario/--speed/--engine: {e}") from None
    async with sim:
        settings = load_settings(target=[sim.url], listen=args.listen, interval=args.interval, window=args.window)
        monitor = Monitor(settings)
        runner = make_runner(make_app(monitor))
        await runner.setup()
        try:
            await web.TCPSite(runner, settings.listen_host, settings.listen_port, backlog=LISTEN_BACKLOG).start()
        except OSError as e:
            raise ConfigError(f"invalid setting --listen: cannot listen on {args.listen} ({e.strerror})") from None
        host, port = runner.addresses[0][:2]  # the bound port, also when --listen asked for :0
        base = f"http://{settings.listen_host if settings.listen_host != '0.0.0.0' else '127.0.0.1'}:{port}"
        _print_addresses(args, sim.url, base)

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        tty = sys.stdout.isatty() and not args.plain
        th = settings.admission_stall_threshold, settings.preemption_risk_threshold
        started = time.monotonic()
        last_state: dict[str, str] = {}
        seen: set[str] = set()
        try:
            while not stop.is_set():
                if args.duration is not None and time.monotonic() - started >= args.duration:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0 if tty else settings.interval)
                diag = monitor.targets[sim.url].diagnosis
                if diag is None:
                    continue
                elapsed = time.monotonic() - started
                if tty:
                    out = [
                        "\x1b[H\x1b[2J",
                        f"kvwatch demo  t={elapsed:5.0f}s  sim phase: {sim.phase}  target: {diag.bottleneck}",
                    ]
                    out.append(f"  status page {base}/   {base}/metrics   {base}/api/v1/diagnosis\n")
                    for d in diag.engines:
                        out.extend(render_engine(d, *th))
                    print("\n".join(out), flush=True)
                for d in diag.engines:
                    seen.add(d.bottleneck)
                    if not tty and last_state.get(d.engine) != d.bottleneck:
                        last_state[d.engine] = d.bottleneck
                        print(plain_line(elapsed, sim.phase, d), flush=True)
        finally:
            await runner.cleanup()
        print(f"\nbottlenecks seen: {', '.join(sorted(seen)) or 'none yet'}")
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.duration is not None and args.duration <= 0:
        print("kvwatch demo: error: invalid setting --duration: must be > 0", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run_demo(args))
    except ConfigError as e:
        print(f"kvwatch demo: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
