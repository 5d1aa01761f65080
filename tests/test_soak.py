"""A short soak as a generous leak check: a real ``kvwatch run`` scrapes the simulator's tour at 10 Hz for a
minute (bench/soak.py, the same code as ``python -m bench soak``); its fds and asyncio tasks must stay flat and its
RSS slope far under an absurd bound. The check is proven to bite on a kvwatch patched, in its own process, to leak
one task per scrape (nothing leaks in the shipped code). No duration or speed is asserted: a loaded machine
scrapes late, not more.
"""

from __future__ import annotations

import pytest

from bench.soak import FLAT_RANGE, leaks, measure

pytestmark = pytest.mark.slow  # 90 s of real time

# kvwatch with a leak: every scrape starts a task that never ends and is kept (as a forgotten background job is).
LEAKY = """
import asyncio
import kvwatch.app as app
LEAKED = []
real = app.Monitor.scrape_once
async def scrape_once(self, target):
    LEAKED.append(asyncio.get_running_loop().create_task(asyncio.Event().wait()))
    await real(self, target)
app.Monitor.scrape_once = scrape_once
from kvwatch.cli import main
raise SystemExit(main())
"""


def test_a_minute_at_10_hz_leaks_nothing():
    r = measure(minutes=1.0, hz=10.0, sample_s=2.0)
    assert r["scrapes"] >= 100, r["scrapes"]  # it did scrape (at least a sixth of the ticks, on any machine)
    assert leaks(r) == [], leaks(r)
    assert r["tasks"][0] >= 2  # the count was read (main task, the scrape loop, the request being served)


def test_the_leak_check_catches_a_task_leaked_per_scrape():
    r = measure(minutes=0.5, hz=10.0, sample_s=2.0, entry=("-c", LEAKY))
    found = leaks(r)
    assert any(f.startswith("tasks moved") for f in found), (found, r["tasks"])
    assert r["tasks_range_second_half"] > 10 * FLAT_RANGE  # ~150 at 10 Hz: far past the flat range
