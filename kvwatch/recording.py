"""Recordings: a directory of ``<unix_time>.prom`` files, one scraped ``/metrics`` body each, and beside each, for an
engine with an extra path, ``<unix_time><suffix>`` (llama.cpp's ``<unix_time>.slots.json``: what kvwatch reads of its
``/slots`` at that scrape).

``kvwatch record`` writes them (``write_snapshot``, ``write_extra``: whole or not at all); ``kvwatch diagnose --replay``
reads them back through ``recording_files`` and ``extra_file``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

__all__ = [
    "SUFFIX",
    "check_writable",
    "extra_file",
    "read_recorded",
    "recording_files",
    "write_extra",
    "write_snapshot",
]

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


def extra_file(prom: Path, suffix: str) -> Path:
    """The extra path's file recorded with ``<unix_time>.prom`` (it may not exist: not read at that scrape)."""
    return prom.with_name(prom.name[: -len(SUFFIX)] + suffix)


def read_recorded(prom: Path) -> tuple[str, bytes | None]:
    """One recorded scrape: the ``/metrics`` body (undecodable bytes replaced) and, if one was recorded with it, the
    extra path's body of any engine that has one (the replay reads it as the engine the body is read as). Raises
    OSError."""
    from kvwatch.engines import ENGINES  # here: kvwatch.engines needs nothing of this module, keep it that way

    body = prom.read_text(encoding="utf-8", errors="replace")
    for suffix in dict.fromkeys(e.extra.suffix for e in ENGINES if e.extra):
        f = extra_file(prom, suffix)
        if f.is_file():
            return body, f.read_bytes()
    return body, None


def write_extra(directory: Path, t: float, suffix: str, data: bytes) -> Path:
    """Save an engine's extra path's body of the scrape at ``t`` as ``directory/<t><suffix>``, atomically: written
    before its ``<t>.prom``, so that a snapshot is never replayed without what was read with it."""
    final = directory / f"{t:.3f}{suffix}"
    _write_atomically(final, data)
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
