"""A short soak as a generous leak check: a real ``kvwatch run`` scrapes the simulator's tour at 10 Hz for a
minute (bench/soak.py, the same code as ``python -m bench soak``); its fds and asyncio tasks must stay flat and its
RSS slope under 1 MiB a minute. The check is proven to bite on a kvwatch patched, in its own process, to leak one
task per scrape, and on one patched to leak 3 MiB a minute (nothing leaks in the shipped code). No duration or speed
is asserted: a loaded machine scrapes late, not more.
"""

from __future__ import annotations

import pytest

from bench.soak import FLAT_RANGE, RSS_SLOPE_BOUND_MIB_PER_H, leaks, measure

pytestmark = pytest.mark.slow  # 2 minutes of real time

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

# kvwatch with a memory leak of a few MiB a minute: each scrape keeps what it adds up to at 3 MiB a minute of wall
# time since the last (a loaded machine that scrapes late leaks as much), written so its pages count in RSS.
LEAK_MIB_PER_MINUTE = 3
LEAKY_MEMORY = f"""
import time
import kvwatch.app as app
LEAKED = []
last = [time.monotonic()]
real = app.Monitor.scrape_once
async def scrape_once(self, target):
    now = time.monotonic()
    LEAKED.append(b"x" * int((now - last[0]) * {LEAK_MIB_PER_MINUTE * 2**20 / 60}))
    last[0] = now
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


def test_the_leak_check_catches_a_few_mib_a_minute():
    assert LEAK_MIB_PER_MINUTE * 60 > RSS_SLOPE_BOUND_MIB_PER_H  # the leak is over the bound, 3 times
    r = measure(minutes=0.5, hz=10.0, sample_s=2.0, entry=("-c", LEAKY_MEMORY))
    found = leaks(r)
    assert any(f.startswith("RSS slope") for f in found), (found, r["rss_slope_mib_per_h"], r["scrapes"])
