"""``kvwatch report`` on the simulator's tour: ``kvwatch record`` and a ``kvwatch run`` watch one tour cycle side by
side; the report of the recording, and of the running kvwatch's ``/api/v1/history`` (``--from``), show every phase's
bottleneck in the strip, in the tour's order.

Real time: the tour at speed 4 (one cycle in ~27 s), scraped every 0.5 s with a 3-s window (12 simulated s, as the
status page's browser test does).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvwatch.sim.scenario import load_preset_doc
from tests.helpers.ports import free_ports
from tests.helpers.process import Process
from tests.helpers.sim_judge import CASES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

KVWATCH = [sys.executable, "-m", "kvwatch"]
SPEED = 4.0
ANALYSIS = ["--window", "3", "--stale-after", "3"]


def _expected_order() -> list[str]:
    """The tour's phases in order, each as the bottleneck the simulator judge expects of it."""
    expect = CASES["tour"][1]
    return [expect[p["name"]][0] for p in load_preset_doc("tour")["phases"]]


def _in_order(order: list[str], want: list[str]) -> bool:
    """``want`` is a subsequence of ``order``: the phases appear in the strip in the tour's order."""
    it = iter(order)
    return all(any(x == w for x in it) for w in want)


def _report(*args) -> dict:
    r = subprocess.run(
        [*KVWATCH, "report", *map(str, args), *ANALYSIS, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_every_tour_phase_is_in_the_strip_in_order(tmp_path):
    sim_port, kv_port = free_ports(2)
    cycle = sum(p["duration_s"] for p in load_preset_doc("tour")["phases"]) / SPEED
    url = f"http://127.0.0.1:{sim_port}/metrics"
    rec = tmp_path / "tour"
    with Process(
        [*KVWATCH, "sim", "--scenario", "tour", "--port", sim_port, "--speed", SPEED, "--seed", "1"],
        tmp_path / "sim.log",
        name="simulator",
    ) as sim:
        sim.wait_for_url(url, timeout=60)
        with Process(
            [*KVWATCH, "run", "--target", url, "--listen", f"127.0.0.1:{kv_port}", "--interval", "0.5", *ANALYSIS],
            tmp_path / "kvwatch.log",
            name="kvwatch",
        ) as kv:
            kv.wait_for_url(f"http://127.0.0.1:{kv_port}/readyz", timeout=60)
            recorder = Process(
                [*KVWATCH, "record", url, "--out", rec, "--duration", cycle + 4, "--interval", "0.5"],
                tmp_path / "record.log",
                name="record",
            ).start()
            assert recorder.wait(timeout=cycle + 60) == 0
            live = _report("--from", f"http://127.0.0.1:{kv_port}")
    want = _expected_order()
    assert len(set(want)) >= 4  # the tour still visits the states this test is about
    recorded = _report(rec)
    assert _in_order(recorded["strip"]["order"], want), (recorded["strip"], want)
    assert _in_order(live["strip"]["order"], want), (live["strip"], want)
    for name in set(want):
        assert recorded["strip"]["shares"][name] > 0
    assert recorded["source"]["skipped"] == 0 and recorded["restarts"] == []
    engine = load_preset_doc("tour")["engine"]
    assert recorded["limits"]["kv_capacity_tokens"] == engine["num_gpu_blocks"] * engine["block_size"]
    assert recorded["limits"]["max_num_seqs"]["value"] == engine["max_num_seqs"]  # inferred from the plateau
