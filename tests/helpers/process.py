"""``Process``: the one way the tests and the benchmark run a child process. Always stopped, always reaped.

    with Process([sys.executable, "-m", "kvwatch", "run", ...], tmp_path / "kvwatch.log", env=env) as kv:
        kv.wait_for_url(f"http://127.0.0.1:{port}/readyz", timeout=30)   # or kv.wait_until(predicate)
        kv.pid, kv.running(), kv.log_tail()
    # on exit: stop(): SIGTERM to the process, then SIGKILL to its whole process group; reaped

- A session of its own (``start_new_session=True``), so a process group of its own: ``stop()`` reaches every
  child it started (vLLM's engine core and workers). Under autogroup scheduling (a Linux default) CPU is
  shared between sessions first, so a busy test process does not starve it, nor it the test: the e2e lane
  relies on this.
- ``log_path``: stdout and stderr are appended to that file, after a ``### start <time>: <argv>`` line.
  Without it they go where the Popen keyword arguments say (``stdout=subprocess.PIPE``, ...), else to ours.
  Every other keyword argument (``env``, ``cwd``, ``stdin``, ``text``, ``preexec_fn``) goes to Popen as is;
  stdin is /dev/null unless given.
- ``wait_until(predicate)`` / ``wait_for_url(url)`` poll until the predicate holds / the URL answers 200;
  they fail at once with ``ProcessExited`` if the process ends first, and with ``TimeoutError`` (and the
  tail of the log) after ``timeout``. Timeouts are generous upper bounds, not assertions about speed.
- ``stop(grace, sig)``: ``sig`` (SIGTERM) to the process only, so a server shuts its children down in
  order; after it ends, ``grace`` s for the rest of its group to follow, then SIGKILL to the whole group
  (SIGKILL, ``sig=signal.SIGKILL``, goes to the whole group at once). Safe to call twice; returns the exit
  status. Every process still running at interpreter exit is stopped too.

``wait_for(predicate)`` is the same poll for anything else (a server's state, a file, a receiver).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

__all__ = ["Process", "ProcessExited", "wait_for"]

T = TypeVar("T")

_LIVE: weakref.WeakSet[Process] = weakref.WeakSet()


class ProcessExited(RuntimeError):
    """The process ended while something waited for it."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 60.0,
    what: str = "condition",
    interval: float = 0.25,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned). Exceptions count as "not yet", except
    ``ProcessExited``, which ends the wait at once."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except ProcessExited:
            raise
        except Exception as exc:  # noqa: BLE001 - polling: report the last one on timeout
            last_exc = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}")
        time.sleep(interval)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Process:
    """A child process in a session of its own, logging to ``log_path`` (see the module doc)."""

    name = "process"

    def __init__(
        self, argv: Sequence[str] = (), log_path: Path | str | None = None, *, name: str | None = None, **popen: Any
    ):
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path) if log_path is not None else None
        if name:
            self.name = name
        self.popen = popen
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        """Start ``argv`` (again, after a stop) and return at once."""
        popen = {"stdin": subprocess.DEVNULL, **self.popen}
        log = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")
            log.write(f"\n### start {time.time():.3f}: {' '.join(self.argv)}\n".encode())
            log.flush()
            popen.setdefault("stdout", log)
            popen.setdefault("stderr", subprocess.STDOUT)
        try:
            self.proc = subprocess.Popen(self.argv, start_new_session=True, **popen)
        finally:
            if log is not None:
                log.close()  # the child has its own descriptor
        _LIVE.add(self)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to end by itself (``subprocess.TimeoutExpired`` after ``timeout``); its exit status."""
        assert self.proc is not None, "not started"
        return self.proc.wait(timeout)

    def wait_until(
        self, predicate: Callable[[], T], timeout: float = 60.0, what: str = "condition", interval: float = 0.25
    ) -> T:
        """``wait_for(predicate)``, ending with ``ProcessExited`` as soon as the process has ended."""

        def check() -> T:
            if not self.running():
                status = self.proc.returncode if self.proc is not None else "(never started)"
                raise ProcessExited(
                    f"{self.name} exited with status {status} while waiting for {what}\n{self.log_tail()}"
                )
            return predicate()

        return wait_for(check, timeout, what, interval, on_timeout=self.log_tail)

    def wait_for_url(self, url: str, timeout: float = 60.0, what: str | None = None, interval: float = 0.25) -> None:
        """Poll GET ``url`` until it answers 200."""
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            self.wait_until(
                lambda: client.get(url).status_code == 200, timeout, what or f"{url} to answer 200", interval
            )

    def stop(self, grace: float = 15.0, sig: int = signal.SIGTERM) -> int | None:
        """``sig`` to the process, up to ``grace`` s for it and then for its group, SIGKILL to the group; reaped.
        Returns its exit status (None if it never started)."""
        proc = self.proc
        if proc is None:
            return None
        _LIVE.discard(self)
        pgid = proc.pid  # start_new_session: the child leads its own process group
        if proc.poll() is None:
            try:
                if sig == signal.SIGKILL:
                    os.killpg(pgid, sig)
                else:
                    proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is not None:  # children (vLLM's engine core, workers) may outlive it: let them end
            deadline = time.monotonic() + grace
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
        _kill_group(pgid)
        proc.wait(30)  # SIGKILL cannot be caught: only a process stuck in the kernel outlasts this
        deadline = time.monotonic() + 10
        while _group_alive(pgid) and time.monotonic() < deadline:  # killed children, reaped by init
            time.sleep(0.1)
        return proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Process:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_all() -> None:
    for proc in list(_LIVE):
        proc.stop()


atexit.register(_stop_all)
