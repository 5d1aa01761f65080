"""kvwatch's performance benchmark, in one command.

    python -m bench                   # everything (~15 min on 2 cores); prints a table
    python -m bench --quick           # tiny configuration (~1 min), for the smoke test
    python -m bench --json            # the same figures as JSON on stdout (the table goes to stderr)
    python -m bench --only cycle,engines,memory,fanin --check
                                      # CI (make bench-check): exit 1 if a figure is past its gate (GATES)

Sections (bench/README.md explains each method): cycle (cycle / parse-baseline on three payloads),
scaling (1x / 4x / 16x), memory (RSS of a real ``kvwatch run``), fanin (targets polled on schedule at
1 Hz on one core), detect (KV-bound onset to kvwatch_bottleneck{bottleneck="kv_cache"} == 1), logs (peak RSS of
``kvwatch logs -`` on a 1 GiB log through a pipe vs a tenth of it), report (``kvwatch report`` of a 1-hour recording
at 1 Hz vs a plain ``diagnose --replay`` of it, and its HTML's size).

    python -m bench fuzz --cases N [--seed S]   # the parser under fuzzing (bench/fuzz.py), not a timed section
    python -m bench soak --minutes M --hz H     # RSS slope, fds, tasks and lateness over a long run (bench/soak.py)
    python -m bench abuse [--seconds S]         # scrape lateness while kvwatch's port is abused (bench/abuse.py)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import sys
import time
from collections.abc import Callable

SECTIONS = ("cycle", "scaling", "engines", "memory", "fanin", "detect", "logs", "report")
GOALS = {"ratio": 0.2, "peak_rss_mib": 64.0, "fanin": 200, "detect_intervals": 2.0, "report_ratio": 1.5}
# What --check (make bench-check, on this project's shared 2-core machines) fails on: each goal with its margin.
# - ratio: the cycle and its baseline alternate body by body in one process, so the machine's load moves the ratio
#   little (+-0.03). THE GOAL IS MISSED TODAY: (a) reads 0.26-0.30 where the code of cedbb0a read 0.14-0.15 in the
#   same minutes (parse 1.0-1.2 ms against 0.82: more families kept; kvwatch's own /metrics 1.3 ms against 0.9: 140
#   lines against 113, through prometheus_client's OpenMetrics writer; the rest 0.6 ms). The gate, 0.35, is the
#   worst reading plus 0.05: it holds today's cost and fails one a sixth dearer, until the goal is met again. (The
#   old gate, 0.4, let the doubling through.)
# - peak RSS: a process's memory is the same on a busy machine, except that scrapes time out under load (at the
#   memory run's 25-ms deadline: 50-640 of them at loads of 5-11), and each timeout replaces the target's httpx
#   client. Under those loads the run read 64.6-65.0 MiB (2,000 and 10,000 cycles; flat from half way; 0.1.0 read
#   59.0 on a quiet machine, and an idle `kvwatch run` has grown from ~50 to 55.5 MiB since). 4 MiB over the goal
#   covers that churn; a kvwatch holding 8 MiB more reads 72 and fails.
# - targets per core: on schedule (the goal) is a quiet machine's figure, since lateness on a shared core is the
#   machine's; the check gates kvwatch's cost instead: the scrapes answered per second of kvwatch's CPU time at 1 Hz,
#   at the goal's 200 targets, must cover 200 targets (<= 5 ms of CPU a scrape). A starved kvwatch batches its
#   work and read cheaper per scrape, not dearer (298 per core at load 5-6, 414 at 7-11); on a quiet core 200
#   targets took 79 % of it at 0.1.0 (253 per core). A kvwatch spending 6 ms more a scrape reads 14 and fails.
# - engines (bench/engines.py): each adapter on its engine's payloads reads 0.12-0.18 (>= 100 samples) and 0.18-0.41
#   (llama.cpp's and Triton's 15-16 samples, two comment lines each) in the same minutes; the gates are the goal, 0.2,
#   and 0.5, each with 0.05 over the worst reading. No engine's cycle may cost more than vLLM's (today 0.3-0.6x):
#   the fan-in gate, measured on vLLM, then holds for every engine.
GATES = {
    "ratio": 0.35,
    "peak_rss_mib": GOALS["peak_rss_mib"] + 4.0,
    "targets_per_core": GOALS["fanin"],
    "engine_adapter_ratio": 0.25,
    "engine_adapter_ratio_small": 0.5,
    "engine_cycle_vs_vllm": 1.0,
}


def _machine() -> dict:
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import prometheus_client

    from kvwatch import __version__

    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "kvwatch": __version__,
        "prometheus_client": prometheus_client.__version__
        if hasattr(prometheus_client, "__version__")
        else _dist("prometheus_client"),
        "loadavg_start": os.getloadavg(),
    }


def _dist(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_cycle(quick: bool) -> dict:
    from bench.cycle import run
    from bench.payloads import big, real_bodies, relabel

    real = real_bodies()
    out = {}
    _log("cycle (a): real vLLM 0.32 payload")
    out["a_real"] = run(real, rounds=20 if quick else 300)
    _log("cycle (b): 8 engines x 2 models")
    dp = [relabel(b, 8, 2) for b in (real[:6] if quick else real)]
    out["b_8x2"] = run(dp, rounds=4 if quick else 60)
    series = 10_000 if quick else 100_000
    _log(f"cycle (c): {series} series, mostly irrelevant")
    # captures from the middle of the run (KV-bound), so the diagnosis has work to do
    large = big(real[16:20], series)
    out["c_100k"] = run(large, rounds=2 if quick else 9, warmup=4)
    out["c_100k"]["series_requested"] = series
    return out


def run_scaling(quick: bool) -> dict:
    from bench.cycle import run
    from bench.payloads import real_bodies, relabel

    real = real_bodies()
    out = {}
    for k, rounds in ((1, 10 if quick else 200), (4, 4 if quick else 60), (16, 2 if quick else 24)):
        _log(f"scaling {k}x")
        bodies = real if k == 1 else [relabel(b, k, 1) for b in (real[:6] if quick else real[:24])]
        out[f"{k}x"] = run(bodies, rounds=rounds)
    base = out["1x"]
    for key in ("1x", "4x", "16x"):
        r = out[key]
        r["size_factor"] = r["samples"] / base["samples"]
        r["cost_factor"] = r["cycle_ms"] / base["cycle_ms"]
        # cost per sample relative to 1x: <= 1 means no worse than linear
        r["cost_per_sample_vs_1x"] = r["cost_factor"] / r["size_factor"]
    return out


def run_memory(quick: bool, check: bool = False) -> dict:
    from bench.memory import measure

    # the check's peak: the history rings are allocated at start and the window is bounded, so the peak is
    # reached early; the slope (reported, not gated) wants the full run
    cycles = 200 if quick else 2_000 if check else 10_000
    _log(f"memory: kvwatch run, {cycles} cycles of (a) + (b)")
    return measure(cycles=cycles)


def run_fanin(quick: bool, check: bool = False) -> dict:
    from bench.fanin import measure
    from bench.procs import payload_server

    ladder = [20] if quick else [int(GOALS["fanin"])] if check else [100, 200, 300, 400, 500, 600, 700, 800]
    seconds, warmup = (4.0, 3.0) if quick else (20.0, 6.0)
    levels = []
    with payload_server(fanin=max(ladder), cpu=0) as srv:
        for n in ladder:
            _log(f"fan-in: {n} targets")
            try:
                res = measure(srv, n, seconds=seconds, warmup=warmup, cpu=1 if (os.cpu_count() or 1) > 1 else 0)
            except Exception as e:  # a level that could not be measured is not on schedule
                _log(f"fan-in: {n} targets: {type(e).__name__}: {e}")
                res = {"targets": n, "on_schedule": False, "error": f"{type(e).__name__}: {e}"}
            levels.append(res)
            if not res["on_schedule"] and len(levels) >= 2 and not levels[-2]["on_schedule"]:
                break  # two levels in a row off schedule: no point going higher
    ok = [r["targets"] for r in levels if r["on_schedule"]]
    return {"levels": levels, "max_on_schedule": max(ok) if ok else 0, "seconds_per_level": seconds}


def run_detect(quick: bool) -> dict:
    from bench.detect import measure

    if quick:
        _log("detection: 1 trial, speed 4, interval 0.25 s")
        return measure(trials=1, speed=4.0, interval=0.25, warmup_s=8.0, timeout_s=20.0)
    _log("detection: 5 trials, real time, interval 1 s")
    return measure(trials=5, speed=1.0, interval=1.0, warmup_s=20.0, timeout_s=30.0)


def run_logs(quick: bool) -> dict:
    from bench.logmem import measure

    big, json_big = (4 << 20, 4 << 20) if quick else (1 << 30, 256 << 20)
    _log(f"logs: kvwatch logs - on {big >> 20} MiB and {big >> 20} / 10 MiB of log through a pipe (and --json)")
    return measure(big, json_big)


def run_engines(quick: bool) -> dict:
    from bench.engines import run

    _log("engines: each adapter on its engine's payloads")
    return run(quick)


def run_report(quick: bool) -> dict:
    from bench.report import measure

    snapshots, rounds = (300, 1) if quick else (3600, 3)
    _log(f"report: kvwatch report vs diagnose --replay of {snapshots} snapshots, {rounds} rounds")
    return measure(snapshots, rounds)


def _fmt(x, nd=3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def table(res: dict) -> str:
    m = res["machine"]
    lines = [
        f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, kvwatch {m['kvwatch']}, "
        f"prometheus_client {m['prometheus_client']}; load average {', '.join(f'{x:.2f}' for x in m['loadavg_start'])} "
        f"at start, {', '.join(f'{x:.2f}' for x in res.get('loadavg_end', ()))} at end",
        "",
    ]
    if "cycle" in res:
        lines += [
            "cycle / parse-baseline (median of per-round ratios; goal <= 0.2)",
            "",
            "| payload | bytes | samples | engines | rounds | baseline ms | cycle ms | ratio | p90 ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        names = {"a_real": "(a) real vLLM 0.32", "b_8x2": "(b) 8 engines x 2 models", "c_100k": "(c) {n} series"}
        for key, label in names.items():
            r = res["cycle"][key]
            label = label.format(n=f"{r['samples']:,}")
            lines.append(
                f"| {label} | {r['bytes']} | {r['samples']} | {r['engines']} | {r['rounds']} | {_fmt(r['baseline_ms'], 2)} "
                f"| {_fmt(r['cycle_ms'], 2)} | **{_fmt(r['ratio'])}** | {_fmt(r['ratio_p90'])} |"
            )
        lines.append("")
    if "scaling" in res:
        lines += [
            "scaling (engines by relabelling; cost per sample vs 1x <= 1 means linear or better)",
            "",
            "| payload | samples | rounds | cycle ms | ratio | size x | cost x | cost per sample vs 1x |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for k, r in res["scaling"].items():
            lines.append(
                f"| {k} | {r['samples']} | {r['rounds']} | {_fmt(r['cycle_ms'], 2)} | {_fmt(r['ratio'])} | {_fmt(r['size_factor'], 1)} "
                f"| {_fmt(r['cost_factor'], 1)} | {_fmt(r['cost_per_sample_vs_1x'], 2)} |"
            )
        lines.append("")
    if "engines" in res:
        lines += [
            "engines (each adapter on its engine's payloads; gates: adapter <= 0.25 from 100 samples, <= 0.5 below; "
            "cycle <= vLLM's)",
            "",
            "| payload | engine | bytes | samples | adapter / parse-baseline | cycle ms | cycle / parse-baseline "
            "| cycle / vLLM's |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, r in res["engines"].items():
            lines.append(
                f"| {name} | {r['engine']} | {r['bytes']} | {r['samples']} | {_fmt(r['adapter']['ratio'])} "
                f"| {_fmt(r['cycle_ms'], 2)} | {_fmt(r['cycle_ratio'])} | {_fmt(r['cycle_vs_vllm'], 2)} |"
            )
        lines.append("")
    if "memory" in res:
        r = res["memory"]
        lines += [
            f"memory: kvwatch run, {r['cycles_b']} cycles of (b) and {r['cycles_a']} of (a) in {r['seconds']:.0f} s "
            f"(--interval {r['interval_s']}), {r['scrape_errors']:.0f} failed scrapes: peak RSS **{r['peak_rss_mib']:.1f} MiB** "
            f"(goal <= 64), RSS {_fmt(r['rss_at_half_mib'], 1)} MiB at half way, {r['final_rss_mib']:.1f} MiB at the end, "
            f"slope over the second half {_fmt(r['slope_kib_per_1000_cycles'], 1)} KiB per 1000 cycles",
            "",
        ]
    if "fanin" in res:
        r = res["fanin"]
        lines += [
            f"fan-in at 1 Hz on one core: **{r['max_on_schedule']} targets** on schedule (goal >= 200); "
            f"{r['seconds_per_level']:.0f} s measured per level",
            "",
            "| targets | on schedule | missed ticks | errors | lateness p50 ms | p99 ms | max ms | CPU (of one core) "
            "| targets per core | peak RSS MiB |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for lv in r["levels"]:
            if "error" in lv:
                lines.append(f"| {lv['targets']} | no: {lv['error']} | | | | | | | | |")
                continue
            lines.append(
                f"| {lv['targets']} | {'yes' if lv['on_schedule'] else 'no'} | {lv['missed_ticks']} | {lv['errors']:.0f} "
                f"| {_fmt(lv['jitter_p50_ms'], 1)} | {_fmt(lv['jitter_p99_ms'], 1)} | {_fmt(lv['jitter_max_ms'], 1)} "
                f"| {lv['cpu_core_fraction']:.0%} | {_fmt(lv['targets_per_core'], 0)} | {lv['peak_rss_mib']:.1f} |"
            )
        lines.append("")
    if "detect" in res:
        r = res["detect"]
        lines += [
            f"detection latency (simulator kv_cache, --interval {r['interval_s']:g}, speed {r['speed']:g}): median "
            f"**{_fmt(r['median_intervals'], 2)} intervals** ({_fmt(r['median_s'], 2)} simulated s), max {_fmt(r['max_intervals'], 2)} "
            f"(goal <= 2); detected {r['detected']} of {len(r['trials'])}, false alarms {r['false_alarms']}",
            "",
        ]
    if "logs" in res:
        r, j = res["logs"]["report"], res["logs"]["json"]
        lines += [
            f"logs: kvwatch logs - on a generated vLLM log through a pipe: peak RSS **{r['big_peak_rss_mib']:.1f} MiB** "
            f"at {r['big_bytes'] / 2**20:.0f} MiB of log, {r['small_peak_rss_mib']:.1f} MiB at {r['small_bytes'] / 2**20:.1f} "
            f"MiB: ratio **{r['ratio']:.3f}** (goal ~1: memory does not grow with the log; {r['big_mib_per_second']:.1f} "
            f"MiB/s); --json: {j['big_peak_rss_mib']:.1f} MiB at {j['big_bytes'] / 2**20:.0f} MiB, "
            f"{j['small_peak_rss_mib']:.1f} MiB at {j['small_bytes'] / 2**20:.1f} MiB, ratio **{j['ratio']:.3f}**",
            "",
        ]
    if "report" in res:
        r = res["report"]
        lines += [
            f"report: kvwatch report of {r['snapshots']} snapshots (3 stages) vs diagnose --replay of the same directory: "
            f"{r['report_s']:.2f} s vs {r['replay_s']:.2f} s, ratio **{r['ratio']:.3f}** (max {r['ratio_max']:.3f} over "
            f"{r['rounds']} rounds; goal <= 1.5), HTML **{r['html_bytes'] / 2**20:.2f} MiB** (goal < 2)",
            "",
        ]
    for section, err in res.get("errors", {}).items():
        lines += [f"{section}: not measured ({err})", ""]
    return "\n".join(lines)


def gate_failures(res: dict, gates: dict = GATES) -> list[str]:
    """The figures of a run past their gates (GATES), one sentence each; a gated section that could not be measured
    fails too."""
    out = []
    ratios = {k: v["ratio"] for k, v in res.get("cycle", {}).items()}
    ratios.update({f"scaling {k}": v["ratio"] for k, v in res.get("scaling", {}).items()})
    over = {k: round(v, 3) for k, v in ratios.items() if not v <= gates["ratio"]}
    if over:
        out.append(f"cycle/parse-baseline above {gates['ratio']:g} (goal {GOALS['ratio']:g}): {over}")
    if "memory" in res and not res["memory"]["peak_rss_mib"] <= gates["peak_rss_mib"]:
        out.append(
            f"peak RSS of kvwatch run {res['memory']['peak_rss_mib']:.1f} MiB, above {gates['peak_rss_mib']:g} "
            f"(goal {GOALS['peak_rss_mib']:g})"
        )
    if "fanin" in res:
        level: dict = next((lv for lv in res["fanin"]["levels"] if lv["targets"] == GOALS["fanin"]), {})
        per_core = level.get("targets_per_core")
        if per_core is None or not per_core >= gates["targets_per_core"]:
            out.append(
                f"targets per core at 1 Hz, measured at {GOALS['fanin']} targets: {per_core or level.get('error')}, "
                f"below {gates['targets_per_core']} (goal {GOALS['fanin']} on schedule)"
            )
    if "engines" in res:
        from bench.engines import gate_failures as engine_failures

        out += engine_failures(res["engines"], gates)
    for section, err in res.get("errors", {}).items():
        out.append(f"{section}: not measured ({err})")
    return out


def soak_main(argv: list[str]) -> int:
    from bench.soak import leaks, measure, table

    p = argparse.ArgumentParser(
        prog="python -m bench soak", description="kvwatch run on the simulator's tour, for long"
    )
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--hz", type=float, default=10.0, help="kvwatch's scrape rate (--interval 1/HZ)")
    p.add_argument("--json", action="store_true", help="print JSON on stdout (the table on stderr)")
    args = p.parse_args(argv)
    if not (args.minutes > 0 and args.hz > 0):
        p.error("--minutes and --hz must be > 0")
    res: dict = {"machine": _machine(), "soak": measure(args.minutes, args.hz, log=_log)}
    res["loadavg_end"] = os.getloadavg()
    text = table(res["soak"])
    print(text, file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res, indent=1))
    return 1 if leaks(res["soak"]) else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fuzz"]:  # a correctness run of its own, not a timed section (bench/fuzz.py)
        from bench.fuzz import main as fuzz_main

        return fuzz_main(argv[1:])
    if argv[:1] == ["soak"]:
        return soak_main(argv[1:])
    if argv[:1] == ["abuse"]:  # kvwatch's own port under hostile clients (bench/abuse.py)
        from bench.abuse import main as abuse_main

        return abuse_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny configuration (smoke test)")
    p.add_argument("--json", action="store_true", help="print JSON on stdout (the table on stderr)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections: {', '.join(SECTIONS)}")
    p.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a figure is past its gate (GATES: each goal with a shared machine's margin); "
        "memory runs 2,000 cycles and fan-in the goal's 200 targets only",
    )
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in SECTIONS]
    if bad:
        p.error(f"unknown section(s): {', '.join(bad)}")
    res: dict = {"machine": _machine(), "quick": args.quick}
    started = time.monotonic()
    runners: dict[str, Callable[[bool], dict]] = {
        "cycle": run_cycle,
        "scaling": run_scaling,
        "engines": run_engines,
        "memory": functools.partial(run_memory, check=args.check),
        "fanin": functools.partial(run_fanin, check=args.check),
        "detect": run_detect,
        "logs": run_logs,
        "report": run_report,
    }
    for section in SECTIONS:
        if section in only:
            try:
                res[section] = runners[section](args.quick)
            except Exception as e:  # report what could be measured; name what could not
                _log(f"{section}: {type(e).__name__}: {e}")
                res.setdefault("errors", {})[section] = f"{type(e).__name__}: {e}"
    res["loadavg_end"] = os.getloadavg()
    res["seconds"] = time.monotonic() - started
    text = table(res)
    failed = bool(res.get("errors"))
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps(res, indent=1))
    else:
        print(text)
    if args.check:
        failures = gate_failures(res)
        for f in failures:
            print(f"bench: {f}", file=sys.stderr)
        if failures:
            return 1
        if "report" in res and not res["report"]["ok"]:  # the report's own goals (bench/report.py)
            r = res["report"]
            print(
                f"bench: report/replay {r['ratio']:.3f} (goal <= 1.5) or HTML {r['html_bytes']} bytes (< 2 MiB)",
                file=sys.stderr,
            )
            return 1
        print(f"bench: every figure measured is within its gate: {GATES}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
