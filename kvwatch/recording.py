"""Recordings: a directory of ``<unix_time>.prom`` files, one scraped ``/metrics`` body each.

``kvwatch record`` writes them (``write_snapshot``: whole or not at all); ``kvwatch diagnose --replay``
reads them back through ``recording_files``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = ["SUFFIX", "check_writable", "recording_files", "write_snapshot"]

SUFFIX = ".prom"
_TMP_PREFIX, _TMP_SUFFIX = ".kvwatch-", ".tmp"  # never "*.prom": a leftover is no snapshot to a replay


def recording_files(directory: Path | str) -> list[tuple[float, Path]]:
    """``(unix_time, path)`` of every ``<unix_time>.prom`` file in ``directory``, sorted by time.

    Other files (a ``server.log``, a ``.prom`` file whose name is not a number) are passed over.
    """
    files = []
    for f in Path(directory).glob("*" + SUFFIX):
        try:
            files.append((float(f.name[: -len(SUFFIX)]), f))
        except ValueError:
            continue  # not a <unix_time>.prom file
    files.sort()
    return files


def _write_atomically(final: Path, data: bytes) -> None:
    """``data`` at ``final``, or, on any error, nothing: a temporary file in the same directory (so the rename
    stays on one file system), fsync'd, then renamed over ``final``; the directory is fsync'd after the rename
    so the new name survives a power cut. The temporary file is removed on failure."""
    fd, tmp = tempfile.mkstemp(dir=final.parent, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_snapshot(directory: Path, t: float, body: str) -> Path:
    """Save one scraped body as ``directory/<t>.prom``, atomically. Raises OSError (ENOSPC, EROFS, ...)."""
    final = directory / f"{t:.3f}{SUFFIX}"
    _write_atomically(final, body.encode("utf-8"))
    return final


def check_writable(directory: Path) -> None:
    """Create ``directory`` if needed and prove a snapshot can be written there (a byte, written and removed):
    a read-only or full file system shows at start, not at the first scrape. Raises OSError."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f"{_TMP_PREFIX}probe{_TMP_SUFFIX}"
    try:
        _write_atomically(probe, b"\n")
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
