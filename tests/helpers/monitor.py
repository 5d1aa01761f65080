"""A Monitor driven by hand: a clock the test moves, one scrape at a time, and kvwatch's own log lines."""

from __future__ import annotations

import logging

from kvwatch.app import Monitor
from kvwatch.config import load_settings


class Clock:
    """The Monitor's clock, moved only by the test (a scrape's rates and staleness then do not depend on the machine)."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def open_monitor(url: str, **settings) -> Monitor:
    """A Monitor of one target, 1-s interval, 0.5-s deadline, stale after 5 s (settings override any of them)."""
    m = Monitor(
        load_settings(**{"target": [url], "interval": 1.0, "timeout": 0.5, "stale_after": 5.0, **settings}),
        clock=Clock(),
    )
    m.open()
    return m


async def scrape(m: Monitor, n: int = 1) -> None:
    """n scrapes of the first target, each a second after the one before."""
    for _ in range(n):
        m.clock.t += 1
        await m.scrape_once(m.settings.target[0])


def kvwatch_lines(caplog, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kvwatch" and r.levelno == level]


async def scraped(url: str, n: int, **settings):
    """The target's state after n scrapes of a Monitor opened and stopped around them."""
    m = open_monitor(url, **settings)
    try:
        await scrape(m, n)
        return m.targets[url]
    finally:
        await m.stop()
