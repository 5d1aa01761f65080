"""Abuse: kvwatch's own port under hostile clients while it scrapes the simulator; does the scrape loop keep time?

    python -m bench abuse [--seconds S] [--hz H]

A real ``kvwatch run`` scrapes the simulator's ``tour`` (in a thread of this process, recording each scrape's
arrival: bench/soak.py) at ``hz``. Three phases of ``seconds`` each: *baseline* (nothing else), *abuse* (a client
process of its own, ``python -m bench.abuse --client URL``, runs waves of 1,000 concurrent ``/metrics`` requests on
new connections, 50 slow-header clients sending a byte a second, and a loop of oversized requests: a 5 KB URL, a
9 KB header, 70 headers), *after* (nothing else again), and *abuse again* (bounded memory peaks where the first
abuse left it; a leak climbs further). Per phase: scrape lateness p50 / p99 / max (as
bench/soak.py), ticks missed and failed scrapes; kvwatch's RSS at the start and end of each phase and its peak;
the abuser's outcome counts (200, 503, 400, refused or unanswered, slow clients dropped). The client shares the
machine's two cores with kvwatch: the figure is an upper bound on what remote abusers would cost it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

import aiohttp

from bench.procs import ROOT, kvwatch_run, rss_kib
from bench.soak import lateness, own_metrics, quantiles_ms, simulator

CONCURRENT = 1000
SLOW_CLIENTS = 50


async def _wave(session: aiohttp.ClientSession, url: str, counts: dict[str, int]) -> None:
    async def one():
        try:
            async with session.get(url) as resp:
                await resp.read()
                return str(resp.status)
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            return type(e).__name__

    for outcome in await asyncio.gather(*(one() for _ in range(CONCURRENT))):
        counts[outcome] = counts.get(outcome, 0) + 1


async def _slow_client(host: str, port: int, until: float, counts: dict[str, int]) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: kvwatch\r\n")
            while time.monotonic() < until:
                writer.write(b"X")
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                        counts["slow_dropped"] = counts.get("slow_dropped", 0) + 1
                        break
                except TimeoutError:
                    pass
            writer.close()
        except OSError:
            counts["slow_refused"] = counts.get("slow_refused", 0) + 1
            await asyncio.sleep(0.5)


async def _oversized(host: str, port: int, until: float, counts: dict[str, int]) -> None:
    requests = [
        b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: kvwatch\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: kvwatch\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: kvwatch\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(70)) + b"\r\n",
    ]
    i = 0
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(requests[i % 3])
            status = (await asyncio.wait_for(reader.read(64), 10)).split(b" ", 2)[1:2]
            key = "oversized_" + (status[0].decode() if status else "closed")
            writer.close()
        except (OSError, TimeoutError, IndexError):
            key = "oversized_refused"
        counts[key] = counts.get(key, 0) + 1
        i += 1
        await asyncio.sleep(0.01)


async def abuse(base: str, seconds: float) -> dict[str, int]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    until = time.monotonic() + seconds
    counts: dict[str, int] = {"waves": 0}
    side = [asyncio.create_task(_slow_client(host, int(port), until, counts)) for _ in range(SLOW_CLIENTS)]
    side.append(asyncio.create_task(_oversized(host, int(port), until, counts)))
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.monotonic() < until:
            await _wave(session, base + "/metrics", counts)
            counts["waves"] += 1
    await asyncio.gather(*side)
    return counts


def _phase(name: str, seconds: float, pid: int, kv: str, arrivals: list[float], interval: float, client=None):
    start_rss, errors0 = rss_kib(pid)[0], own_metrics(kv)["errors"]
    t0 = time.monotonic()
    proc = None
    if client:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.abuse", "--client", kv, "--seconds", str(seconds)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
    time.sleep(seconds)
    out = json.loads(proc.communicate(timeout=120)[0]) if proc else None
    t1 = t0 + seconds
    late, missed = lateness([t for t in arrivals if t0 <= t < t1], interval)
    rss, hwm = rss_kib(pid)
    return {
        "phase": name,
        "scrapes": len(late),
        "missed_ticks": missed,
        "scrape_errors": own_metrics(kv)["errors"] - errors0,
        "rss_start_mib": start_rss / 1024,
        "rss_end_mib": rss / 1024,
        "peak_rss_mib": hwm / 1024,
        **quantiles_ms(late),
        "abuser": out,
    }


def measure(seconds: float = 20.0, hz: float = 10.0) -> dict:
    interval = 1.0 / hz
    with simulator() as (sim, arrivals):
        with kvwatch_run([sim.url], "--interval", f"{interval:g}") as (proc, kv):
            time.sleep(3.0)  # warm-up: imports done, first scrapes in
            phases = [
                _phase("baseline", seconds, proc.pid, kv, arrivals, interval),
                _phase("abuse", seconds, proc.pid, kv, arrivals, interval, client=True),
                _phase("after", seconds, proc.pid, kv, arrivals, interval),
                # Again: memory that is bounded peaks where the first abuse left it; a leak climbs further.
                _phase("abuse again", seconds, proc.pid, kv, arrivals, interval, client=True),
            ]
            still = own_metrics(kv)
    return {"seconds_per_phase": seconds, "hz": hz, "phases": phases, "tasks_at_end": still["tasks"]}


def table(r: dict) -> str:
    lines = [
        f"abuse: kvwatch run scraping the simulator at {r['hz']:g} Hz; {r['seconds_per_phase']:g} s per phase; "
        f"asyncio tasks at the end {r['tasks_at_end']:g}",
        "",
        "| phase | scrapes | missed ticks | failed | lateness p50 ms | p99 ms | max ms | RSS start MiB | end MiB | peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in r["phases"]:
        lines.append(
            f"| {p['phase']} | {p['scrapes']} | {p['missed_ticks']} | {p['scrape_errors']:.0f} | {_f(p['p50_ms'])} "
            f"| {_f(p['p99_ms'])} | {_f(p['max_ms'])} | {p['rss_start_mib']:.1f} | {p['rss_end_mib']:.1f} "
            f"| {p['peak_rss_mib']:.1f} |"
        )
    abuser: dict = next((p["abuser"] for p in r["phases"] if p["abuser"]), {})
    lines += ["", "abuser's outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(abuser.items()))]
    return "\n".join(lines)


def _f(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench abuse", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0, help="per phase")
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # the abusing process itself
    args = p.parse_args(argv)
    if args.client:
        print(json.dumps(asyncio.run(abuse(args.client, args.seconds))))
        return 0
    res = measure(args.seconds, args.hz)
    print(table(res), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
