"""The benchmark's helper processes (the payload server, ``kvwatch run``), each a ``tests.helpers.process.Process``
(a session of its own, always stopped and reaped); RSS and CPU time of a process from /proc."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.helpers.ports import free_port
from tests.helpers.process import Process

ROOT = Path(__file__).resolve().parent.parent


def _pin(cpu: int | None):
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


@contextlib.contextmanager
def payload_server(fanin: int = 0, b_captures: int = 48, cpu: int | None = None):
    """``bench.server`` in its own process; yields its base URL."""
    cmd = [sys.executable, "-m", "bench.server", "--fanin", str(fanin), "--b-captures", str(b_captures)]
    with Process(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=_pin(cpu)) as proc:
        assert proc.proc is not None and proc.proc.stdout is not None  # started, with a pipe
        line = proc.proc.stdout.readline()
        if not line.startswith("listening "):
            raise RuntimeError(f"bench: payload server did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"


@contextlib.contextmanager
def kvwatch_run(targets: list[str], *flags: str, cpu: int | None = None, entry: tuple[str, ...] = ("-m", "kvwatch")):
    """A real ``kvwatch run`` process (``python -m kvwatch``); yields (process, its base URL).
    Targets go in KVWATCH_TARGET (comma-separated), as docs/configuration.md documents. ``entry`` replaces
    ``-m kvwatch`` (a test runs a deliberately leaking kvwatch through ``-c``)."""
    port = free_port()
    env = dict(os.environ, KVWATCH_TARGET=",".join(targets), KVWATCH_LOG_LEVEL="error")
    cmd = [sys.executable, *entry, "run", "--listen", f"127.0.0.1:{port}", *flags]
    url = f"http://127.0.0.1:{port}"
    with Process(cmd, cwd=ROOT, env=env, preexec_fn=_pin(cpu), name="bench: kvwatch run") as proc:
        proc.wait_for_url(url + "/readyz", timeout=30, interval=0.05)
        yield proc, url


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, KiB."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
