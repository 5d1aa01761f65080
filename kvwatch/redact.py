"""Secrets never leave: a target URL's credentials are replaced by ``<secret>`` wherever kvwatch writes it.

A target such as ``http://user:pw@host:8000/metrics?token=abc`` is shown everywhere (metric labels, the
JSON API, the landing page, logs, error messages, ``kvwatch diagnose`` / ``record`` output) as
``http://<secret>@host:8000/metrics?token=<secret>``: the whole userinfo goes (a bare ``TOKEN@host`` is a
credential too), and so does the value of every query parameter whose name is credential-like. The form is
stable (the same target always gets the same label) and idempotent (a label redacts to itself).

Redaction goes by structure, never by replacing a secret's text wherever it occurs: with a password ``e``,
replacing every ``e`` would turn "listening" into "list<secret>ning" and tell the reader the password.
kvwatch's own lines are built from labels; ``SecretFilter`` redacts every URL in what other libraries log
(httpx logs each request's full URL, userinfo included) and in every traceback.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["REDACTED", "SECRET_PARAMS", "SecretFilter", "redact_text", "redact_url"]

REDACTED = "<secret>"
# Query parameters that carry credentials (compared case-insensitively), as exporters and proxies name them.
SECRET_PARAMS = frozenset(
    {"password", "passwd", "token", "access_token", "key", "api_key", "apikey", "secret", "auth", "signature"}
)
# A URL inside free text: a scheme, "://", then everything up to white space or a quote (httpx writes
# "GET http://u:pw@h/metrics \"HTTP/1.1 200 OK\"", exceptions quote URLs in '' or "").
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]*")
# The logger kvwatch's own lines go to: they name targets by their labels, never by their URLs.
OWN_LOGGER = "kvwatch"


def _query_pairs(query: str) -> list[tuple[str, str, str]]:
    """(name, separator, value) of each ``&``-separated piece, kept verbatim."""
    out = []
    for piece in query.split("&"):
        name, sep, value = piece.partition("=")
        out.append((name, sep, value))
    return out


def _is_secret_param(name: str) -> bool:
    return unquote(name).lower() in SECRET_PARAMS


def redact_url(url: str) -> str:
    """``url`` with its userinfo and credential-like query values replaced by ``<secret>``."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rpartition("@")[2]
    query = (
        "&".join(
            f"{n}{sep}{REDACTED}" if sep and _is_secret_param(n) else f"{n}{sep}{v}"
            for n, sep, v in _query_pairs(parts.query)
        )
        if parts.query
        else ""
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def _redact_found_url(url: str) -> str:
    try:
        return redact_url(url)
    except ValueError:  # not a URL urlsplit reads (e.g. "http://[::1"): nothing after the scheme is safe
        return url.partition("://")[0] + "://" + REDACTED


def redact_text(text: str) -> str:
    """``text`` with every URL in it redacted (``redact_url``); every other character kept as it is."""
    return _URL_IN_TEXT.sub(lambda m: _redact_found_url(m.group()), text)


class SecretFilter(logging.Filter):
    """Redacts every URL in other libraries' records (httpx, httpcore, aiohttp, asyncio), in every traceback
    and in a record's ``target`` field, whoever logged it. kvwatch's own messages name labels already."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != OWN_LOGGER:
            msg = record.getMessage()
            clean = redact_text(msg)
            if clean != msg:
                record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        target = getattr(record, "target", None)  # --log-format json writes it as a field of its own
        if isinstance(target, str):
            record.target = _redact_found_url(target)  # a label redacts to itself, byte for byte
        return True
