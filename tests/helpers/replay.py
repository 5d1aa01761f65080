"""Serve recorded vLLM ``/metrics`` snapshots over HTTP, in real time, looping, with counters kept monotonic.

A stand-in target for kvwatch and Prometheus built from real captures (``tests/fixtures/vllm-0.32.0-cpu``)::

    files = recording(FIXTURES / "kv_cache", start=1796120543.0, end=1796120566.0)  # tests.helpers.recordings
    with SnapshotServer(files) as vllm:                  # stdlib HTTP server in a thread, free port
        vllm.metrics_url                                 # "http://127.0.0.1:PORT/metrics"
        ...
        vllm.set_files(idle_files)                       # switch scenario (e.g. "recovered"); counters continue

Which snapshot is served depends only on the wall clock (the recorded spacing between file names, scaled by
``speed``), so every scraper sees the same stream. When the sequence wraps, each counter / histogram
``_bucket``/``_sum``/``_count`` / summary ``_sum``/``_count`` sample is offset by its increase over the
recording, and on ``set_files`` by the value it had reached, so ``rate()`` and kvwatch see a steady,
never-resetting server - as a vLLM under constant load would look. Gauges are served as recorded.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Sequence

__all__ = ["Snapshot", "SnapshotServer"]

_TYPE_RE = re.compile(r"^# TYPE (\S+) (\S+)")


class Snapshot:
    """One exposition body split into lines; ``values`` maps each monotonic sample's key to its value."""

    def __init__(self, text: str):
        types: dict[str, str] = {}
        for line in text.splitlines():
            m = _TYPE_RE.match(line)
            if m:
                types[m.group(1)] = m.group(2)
        self.lines: list[tuple[str, str | None]] = []  # (line, key if monotonic)
        self.values: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                self.lines.append((line, None))
                continue
            key, _, raw = line.rpartition(" ")
            name = key.split("{", 1)[0]
            if _monotonic(name, types):
                self.values[key] = float(raw)
                self.lines.append((line, key))
            else:
                self.lines.append((line, None))

    def render(self, offsets: dict[str, float]) -> str:
        out = []
        for line, key in self.lines:
            if key is not None and offsets.get(key):
                out.append(f"{key} {self.values[key] + offsets[key]!r}")
            else:
                out.append(line)
        return "\n".join(out) + "\n"


def _monotonic(name: str, types: dict[str, str]) -> bool:
    if types.get(name) == "counter":
        return True
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            family = name[: -len(suffix)]
            if types.get(family) in ("histogram", "summary") and not (
                suffix == "_bucket" and types.get(family) == "summary"
            ):
                return True
    return False


class _Phase:
    def __init__(self, files: Sequence[tuple[float, Path]], speed: float):
        if not files:
            raise ValueError("no snapshot files")
        self.snaps = [Snapshot(Path(f).read_text()) for _, f in files]
        times = [t for t, _ in files]
        gaps = [b - a for a, b in zip(times, times[1:])] or [1.0]
        gaps.append(sorted(gaps)[len(gaps) // 2])  # the last snapshot is held for a median gap
        self.starts = [0.0]
        for g in gaps[:-1]:
            self.starts.append(self.starts[-1] + g / speed)
        self.period = self.starts[-1] + gaps[-1] / speed
        first, last = self.snaps[0].values, self.snaps[-1].values
        self.increase = {k: last.get(k, v) - v for k, v in first.items()}


class SnapshotServer:
    """Threaded HTTP server answering GET ``/metrics`` with the snapshot due now (see module doc)."""

    def __init__(self, files: Sequence[tuple[float, Path]], speed: float = 1.0):
        self.speed = speed
        self._lock = threading.Lock()
        self._phase = _Phase(files, speed)
        self._t0 = time.monotonic()
        self._base: dict[str, float] = {}
        self.served = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - stdlib API
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                body = outer.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the scraper gave up (timeout, shutdown)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return self.url + "/metrics"

    def _position(self, now: float) -> tuple[int, int]:
        ph = self._phase
        elapsed = max(0.0, now - self._t0)
        wrap, within = divmod(elapsed, ph.period)
        return int(wrap), bisect.bisect_right(ph.starts, within) - 1

    def _offsets(self, wrap: int) -> dict[str, float]:
        inc = self._phase.increase
        keys = set(self._base) | set(inc)
        return {k: self._base.get(k, 0.0) + wrap * inc.get(k, 0.0) for k in keys}

    def current_index(self) -> int:
        with self._lock:
            return self._position(time.monotonic())[1]

    def render(self) -> str:
        with self._lock:
            wrap, idx = self._position(time.monotonic())
            self.served += 1
            return self._phase.snaps[idx].render(self._offsets(wrap))

    def set_files(self, files: Sequence[tuple[float, Path]]) -> None:
        """Switch to another sequence now; every monotonic sample continues from the value it had reached."""
        new = _Phase(files, self.speed)
        with self._lock:
            wrap, idx = self._position(time.monotonic())
            offsets = self._offsets(wrap)
            reached = {k: v + offsets.get(k, 0.0) for k, v in self._phase.snaps[idx].values.items()}
            # may be negative: new values = reached + (value - first value), never below what was served
            self._base = {k: reached[k] - v for k, v in new.snaps[0].values.items() if k in reached}
            self._phase = new
            self._t0 = time.monotonic()

    def start(self) -> "SnapshotServer":
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "SnapshotServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
