"""What `kvwatch demo` prints beside a diagnosis agrees with it (issue 25 point 10): the tour replayed in process at
the demo's own settings (a 3-s window, 0.5-s scrapes, the simulator at x4), every moment rendered as the demo does."""

from __future__ import annotations

import functools
import re

from kvwatch.catalog import Bottleneck
from kvwatch.demo import plain_line, render_engine
from kvwatch.sim.exposition import render
from kvwatch.sim.scenario import load_scenario
from kvwatch.sim.simulator import Simulator
from kvwatch.state import Target

SPEED, INTERVAL, WINDOW = 4.0, 0.5, 3.0  # kvwatch demo's defaults


@functools.cache
def tour() -> list[tuple[str, object]]:
    sim = Simulator(load_scenario("tour"), seed=1, wall_start=1.8e9)
    target = Target("sim://tour", window_seconds=WINDOW)
    out = []
    for k in range(1, int(100 / INTERVAL)):
        t = k * INTERVAL
        sim.advance_to(t * SPEED)
        target.observe_body(t, render(sim))
        (d,) = target.diagnose(t).engines
        out.append((sim.phase_name, d))
    return out


def test_a_preemption_rate_is_printed_beside_kv_cache_or_says_recovering():
    """The demo printed "none, high" beside "preemptions/s 85.6", a window average of preemptions that had stopped."""
    recovering = 0
    for phase, d in tour():
        line = plain_line(0.0, phase, d)
        shown = re.search(r"preemptions/s ([\d.]+|-)", line).group(1)
        rate = 0.0 if shown == "-" else float(shown)  # "-": the first scrape, no rate yet
        if "recovering" in line:
            recovering += 1
            assert d.bottleneck is not Bottleneck.KV_CACHE, line
        elif rate > 0:
            assert d.bottleneck is Bottleneck.KV_CACHE, line
    assert recovering >= 3


def test_the_throughput_gap_is_shown_only_as_the_diagnosis_weighs_it():
    """The demo marked "THROUGHPUT GAP" (the last interval's flag) beside window averages of 3,104 prompt vs 3,029
    generation tokens/s: now it shows the share of intervals the kv_cache evidence cites, and nothing else."""
    shown = 0
    for _, d in tour():
        text = "\n".join(render_engine(d, 0.9, 0.95))
        cited = next((e for e in d.evidence if "(the throughput gap)" in e), None)
        if "THROUGHPUT GAP" not in text:
            assert cited is None or d.bottleneck is not Bottleneck.KV_CACHE, text
            continue
        shown += 1
        assert d.bottleneck is Bottleneck.KV_CACHE and cited is not None, text
        share = re.search(r"THROUGHPUT GAP: prefill ~0 in (\d+%) of intervals", text).group(1)
        assert f"prompt throughput was 0 in {share} of intervals" in cited, (text, cited)
    assert shown >= 5
