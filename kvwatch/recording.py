"""Recordings: a directory of ``<unix_time>.prom`` files, one scraped ``/metrics`` body each.

``kvwatch record`` writes them; ``kvwatch diagnose --replay`` reads them back through ``recording_files``.
"""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".prom"


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
