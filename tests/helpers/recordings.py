"""Recordings: directories of ``<unix_time>.prom`` files, the format ``kvwatch record`` writes.

The files are listed by the product's own reader (``kvwatch.recording``, the one ``kvwatch diagnose --replay``
uses), so the tests read a recording the way kvwatch does::

    recording(FIXTURES / "kv_cache")                    # [(unix_time, path), ...] sorted by time
    recording(folder, start=1796120543.0, end=...)      # only the files within [start, end]
    captures("kv_cache")                                # the bodies of FIXTURES / "kv_cache", in time order

``FIXTURES`` is the real vLLM 0.32 CPU captures (tests/fixtures/vllm-0.32.0-cpu, one folder per scenario).
"""

from __future__ import annotations

from pathlib import Path

from kvwatch.recording import recording_files

__all__ = ["FIXTURES", "captures", "recording"]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-cpu"


def recording(folder: Path | str, start: float | None = None, end: float | None = None) -> list[tuple[float, Path]]:
    """``(unix_time, path)`` of the ``<unix_time>.prom`` files of ``folder`` sorted by time, optionally within
    [start, end]."""
    return [(t, p) for t, p in recording_files(folder) if (start is None or t >= start) and (end is None or t <= end)]


def captures(scenario: str) -> list[str]:
    """The bodies of the real capture ``FIXTURES / scenario``, in time order."""
    return [p.read_text() for _, p in recording(FIXTURES / scenario)]
