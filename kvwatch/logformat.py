"""How kvwatch's log lines look: ``--log-format text`` (the default) or ``json``.

``json`` writes one object per line for Loki, Elasticsearch and the like::

    {"time": "2026-05-20T14:33:02.123Z", "level": "warning", "message": "scrape of http://... failed: ...",
     "target": "http://127.0.0.1:8000/metrics", "logger": "kvwatch"}

``time`` is RFC 3339 in UTC (milliseconds), ``level`` is the ``--log-level`` word, ``target`` is there when
the record concerns one target (its redacted label, as in the metrics: kvwatch's call sites pass
``extra={"target": ...}``), and ``exception`` holds a traceback when there is one. The handler's
``SecretFilter`` (kvwatch.redact) runs before either formatter, so what it scrubs is scrubbed in both.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["FORMATS", "JsonFormatter", "TEXT_FORMAT", "formatter"]

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a message's newlines are escaped by JSON)."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        doc: dict[str, str] = {
            "time": when.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "message": record.getMessage(),
        }
        target = getattr(record, "target", None)
        if target is not None:
            doc["target"] = str(target)
        doc["logger"] = record.name
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False)


def formatter(name: str) -> logging.Formatter:
    return JsonFormatter() if name == "json" else logging.Formatter(TEXT_FORMAT)
