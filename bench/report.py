"""``kvwatch report`` of a long recording against a plain ``kvwatch diagnose --replay`` of the same directory.

The recording is the simulator's tour (``Simulator`` + ``render``: exact, no server, no real time), one
``<unix_time>.prom`` per simulated second, written by ``kvwatch.recording.write_snapshot`` as ``kvwatch record``
does; three ``vllm bench serve``-shaped results lie over it. Both commands run in this process
(``kvwatch.cli.main``, output to /dev/null), alternating which goes first each round, so a burst of load from other
processes falls on both sides of a round's ratio; the figure is the median of the per-round ratios (goal <= 1.5),
and the HTML's size (goal < 2 MiB).

    python -m bench --only report            # 3,600 snapshots (1 h at 1 Hz), 3 rounds
"""

from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

T0 = 1_796_000_000.0
GOAL_RATIO = 1.5
GOAL_HTML_BYTES = 2 * 1024 * 1024


def make_recording(directory: Path, snapshots: int, seed: int = 1) -> None:
    from kvwatch.recording import write_snapshot
    from kvwatch.sim import Simulator, load_scenario, render

    sim = Simulator(load_scenario("tour"), seed=seed)
    for i in range(snapshots):
        sim.advance_to(float(i))
        write_snapshot(directory, T0 + i, render(sim, "0.32"))


def make_stages(directory: Path, snapshots: int) -> list[Path]:
    from tests.helpers.bench_results import vllm_result, write_result

    third = snapshots / 3
    return [
        write_result(directory / f"c{c}.json", vllm_result(T0 + (i + 1) * third, third - 1, c, 200.0 * c, 30.0))
        for i, c in enumerate((2, 8, 32))
    ]


def _quiet(argv: list[str]) -> float:
    from kvwatch.cli import main

    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        start = time.perf_counter()
        rc = main(argv)
        took = time.perf_counter() - start
    if rc != 0:
        raise RuntimeError(f"kvwatch {' '.join(argv[:2])} exited {rc}")
    return took


def measure(snapshots: int = 3600, rounds: int = 3) -> dict:
    with tempfile.TemporaryDirectory(prefix="kvwatch-bench-report-") as tmp:
        rec, extra = Path(tmp) / "rec", Path(tmp) / "bench"
        rec.mkdir()
        extra.mkdir()
        t = time.perf_counter()
        make_recording(rec, snapshots)
        generated = time.perf_counter() - t
        stages = [a for f in make_stages(extra, snapshots) for a in ("--bench", str(f))]
        html = Path(tmp) / "report.html"
        replay = ["diagnose", "--replay", str(rec)]
        report = ["report", str(rec), *stages, "--slo-ttft-p99", "2", "--out", str(html)]
        _quiet(replay)  # warm-up: imports, page cache
        times: dict[str, list[float]] = {"replay": [], "report": []}
        ratios = []
        for r in range(rounds):
            order = (("replay", replay), ("report", report)) if r % 2 == 0 else (("report", report), ("replay", replay))
            took = {name: _quiet(argv) for name, argv in order}
            for name, s in took.items():
                times[name].append(s)
            ratios.append(took["report"] / took["replay"])
        size = html.stat().st_size
    return {
        "snapshots": snapshots,
        "rounds": rounds,
        "generate_s": generated,
        "replay_s": statistics.median(times["replay"]),
        "report_s": statistics.median(times["report"]),
        "ratio": statistics.median(ratios),
        "ratio_max": max(ratios),
        "html_bytes": size,
        "ok": statistics.median(ratios) <= GOAL_RATIO and size < GOAL_HTML_BYTES,
    }
