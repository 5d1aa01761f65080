"""Secrets never leave: a target URL's credentials are replaced by ``<secret>`` wherever kvwatch writes it.

A target such as ``http://user:pw@host:8000/metrics?token=abc`` is shown everywhere (metric labels, the
JSON API, the landing page, logs, error messages, ``kvwatch diagnose`` / ``record`` output) as
``http://<secret>@host:8000/metrics?token=<secret>``: the whole userinfo goes (a bare ``TOKEN@host`` is a
credential too), and so does the value of every query parameter whose name is credential-like. The form is
stable: the same target always gets the same label. ``SecretFilter`` scrubs what a library might log.
"""

from __future__ import annotations

import logging
from urllib.parse import unquote, urlsplit, urlunsplit

__all__ = ["REDACTED", "SECRET_PARAMS", "SecretFilter", "redact_url", "scrub", "url_secrets"]

REDACTED = "<secret>"
# Query parameters that carry credentials (compared case-insensitively), as exporters and proxies name them.
SECRET_PARAMS = frozenset(
    {"password", "passwd", "token", "access_token", "key", "api_key", "apikey", "secret", "auth", "signature"}
)


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


def url_secrets(url: str) -> list[str]:
    """Every secret string in ``url``, raw and percent-decoded, longest first (for ``scrub``)."""
    parts = urlsplit(url)
    found: set[str] = set()
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        user, colon, password = userinfo.partition(":")
        found.update((userinfo, password) if colon else (userinfo,))  # a user name alone is no secret
    for n, sep, v in _query_pairs(parts.query):
        if sep and _is_secret_param(n):
            found.add(v)
    found |= {unquote(s) for s in found}
    return sorted((s for s in found if s), key=len, reverse=True)


def scrub(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, REDACTED)
    return text


class SecretFilter(logging.Filter):
    """Scrubs known secrets from every record a handler emits, whoever logged it (httpx, aiohttp, us)."""

    def __init__(self, secrets: list[str]):
        super().__init__()
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            msg = record.getMessage()
            clean = scrub(msg, self.secrets)
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = scrub(record.exc_text, self.secrets)
            if clean != msg:
                record.msg, record.args = clean, None
            target = getattr(record, "target", None)  # --log-format json writes it as a field of its own
            if isinstance(target, str):
                record.target = scrub(target, self.secrets)
        return True
