"""Fetch one ``/metrics`` body from vLLM (or another engine), defensively; and an engine's extra path after it.

A sidecar must survive whatever the upstream does: the whole fetch (connect to last byte) runs under
one deadline shorter than the scrape interval, the body is capped *after* decompression (a gzip bomb
stops at the cap, not in memory), and every failure becomes a ``ScrapeError`` with a short ``reason``
that ends up in ``kvwatch_scrape_errors_total{reason}`` (an engine's extra path, llama.cpp's ``/slots``, is fetched
the same way within what is left of that deadline, its failures never a failed scrape). The bearer token is read from its file on
every scrape (so rotation works) and never logged.

The client is ``httpx.AsyncClient``, one per target: a target is one origin, so a pool of its own
costs nothing, and it keeps hundreds of targets polled from one process out of each other's way
(one pool shared by ~100 concurrent fetches spent seconds per round in httpcore's bookkeeping,
bench/fanin.py). TLS trust is httpx's (certifi, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), built once
and shared; redirects are not followed; proxies come from the environment, as httpx's defaults do.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from pathlib import Path

import httpx

from kvwatch.catalog import ScrapeReason
from kvwatch.redact import REDACTED, redact_text, redact_url

__all__ = ["Fetcher", "ScrapeError", "REASONS"]

# The content type of OpenMetrics 1.0, as vLLM's Rust frontend sends it: "application/openmetrics-text;
# version=1.0.0; charset=utf-8" (gpustack/gpustack#6215; not found in vLLM's Python source).
OPENMETRICS = "application/openmetrics-text"
REASONS = tuple(ScrapeReason)  # the catalogue's, with what each means
# Enough of a redirect's Location to act on; a hostile one may be kilobytes long.
MAX_LOCATION_CHARS = 200
# httpx builds the redirect's request even when it will not follow it (_client.py, _send_handling_redirects ->
# _build_redirect_request), and raises this for a Location it cannot parse (a bad port, a URL over 64 KB).
_BAD_LOCATION = "Invalid URL in location header"
# The start of an HTML document (a login page, a proxy's error page) after optional whitespace: no metrics
# exposition begins with "<" (a line is a comment, blank, or a metric name).
_HTML_START = ("<!doctype html", "<html", "<head", "<body", "<?xml")


class ScrapeError(Exception):
    """A failed scrape: its ``reason`` (the metric label) and what a user reads (``str``: the reason's words)."""

    def __init__(self, reason: str, detail: str, *, text: str | None = None):
        self.reason = ScrapeReason(reason)  # a reason the catalogue does not list is a bug: ValueError
        super().__init__(text or self.reason.text.format(detail=detail))
        self.detail = detail


@dataclass(frozen=True, slots=True)
class FetchConfig:
    timeout: float
    max_body_bytes: int
    bearer_token_file: Path | None = None
    tls_verify: bool = True


class Fetcher:
    """One ``httpx.AsyncClient`` per target (connection reuse), opened on its first fetch."""

    def __init__(self, cfg: FetchConfig, user_agent: str):
        self.cfg = cfg
        self.headers = {
            "User-Agent": user_agent,
            # We decompress ourselves, capped; say what we accept explicitly. (vLLM's Rust frontend answers
            # OpenMetrics whatever we ask, gpustack/gpustack#6215; the parser reads both.)
            "Accept-Encoding": "gzip",
            "Accept": "text/plain;version=0.0.4;q=1,application/openmetrics-text;version=1.0.0;q=0.5,*/*;q=0.1",
        }
        # Built once: loading the CA bundle per client would cost ~20 ms each.
        self._ssl = httpx.create_ssl_context(verify=cfg.tls_verify)
        self.clients: dict[str, httpx.AsyncClient] = {}
        self._closing: set[asyncio.Future] = set()

    def _client(self, url: str) -> httpx.AsyncClient:
        client = self.clients.get(url)
        if client is None:  # first fetch, or the last one failed and _discard dropped it
            client = self.clients[url] = httpx.AsyncClient(
                verify=self._ssl,
                timeout=None,  # the deadline is fetch()'s, over the whole fetch
                follow_redirects=False,
                headers=self.headers,
                # Idle connections are dropped after 4 s, before uvicorn's (vLLM's) 5 s: never
                # reuse one the server is closing.
                limits=httpx.Limits(max_connections=4, max_keepalive_connections=1, keepalive_expiry=4.0),
            )
        return client

    def _discard(self, url: str) -> None:
        client = self.clients.pop(url, None)
        if client is not None:
            task = asyncio.ensure_future(asyncio.wait_for(client.aclose(), self.cfg.timeout))
            self._closing.add(task)  # a reference until done, so the close is not garbage-collected
            task.add_done_callback(self._closed)

    def _closed(self, task: asyncio.Future) -> None:
        self._closing.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a failed close of a discarded client is not worth a log line

    async def aclose(self) -> None:
        clients, self.clients = list(self.clients.values()), {}
        for client in clients:
            await client.aclose()
        await asyncio.gather(*self._closing, return_exceptions=True)

    def _headers(self) -> dict[str, str]:
        if self.cfg.bearer_token_file is None:
            return {}
        try:
            token = self.cfg.bearer_token_file.read_text().strip()
        except OSError as e:
            raise _token_error(f"cannot read the bearer token file: {e.strerror}") from None
        if not all(" " <= c <= "~" for c in token):
            # h11 refuses such a header with its value in the message ("Illegal header value b'Bearer ...'"):
            # refused here instead, the token is never in an error.
            raise _token_error("the bearer token file holds a character a header cannot carry (a line break?)")
        return {"Authorization": f"Bearer {token}"}

    async def fetch(self, url: str) -> str:
        """The metrics body at ``url``, decoded and sniffed. Raises ScrapeError."""
        data, content_type = await self._get(url, self.cfg.timeout)
        openmetrics = content_type.lower().startswith(OPENMETRICS)
        try:
            body = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ScrapeError("decode", f"not UTF-8 (byte {e.start})") from None
        if openmetrics and not body.rstrip("\n").endswith("# EOF"):
            # OpenMetrics ends with "# EOF": without it the body was cut (a text body cut at a line end looks whole).
            raise ScrapeError("parse", "OpenMetrics body without '# EOF' (truncated?)")
        if body[:200].lstrip().lower().startswith(_HTML_START):
            raise ScrapeError("html", "the body starts with an HTML tag (a login or proxy page?)")
        return body

    async def fetch_extra(self, url: str, timeout: float) -> bytes:
        """An engine's extra path (llama.cpp's ``/slots``, kvwatch.engines.ExtraSource) right after its metrics, under
        ``timeout`` (what is left of the scrape's deadline) and the same body cap: the raw bytes, for the engine's
        adapter to read. Raises ScrapeError as ``fetch`` does (a 501 of a server started without it is
        ``http_status``); its own client, so a failing extra path never touches the metrics' connections."""
        if timeout <= 0:
            raise ScrapeError("timeout", "no time left in the scrape's deadline")
        data, _ = await self._get(url, timeout)
        return data

    async def _get(self, url: str, timeout: float) -> tuple[bytes, str]:
        """(body, Content-Type) of a GET of ``url``: the whole fetch (connect to last byte) within ``timeout``."""
        headers = self._headers()
        try:
            async with asyncio.timeout(timeout):
                return await self._fetch(url, headers)
        except TimeoutError:
            # httpcore can leave a cancelled request's connection slot taken (NEW/ACTIVE forever): a
            # few such timeouts would block this target's pool for good. Start it afresh.
            self._discard(url)
            raise ScrapeError("timeout", f"no complete response within {timeout:.3g}s") from None
        except httpx.HTTPError as e:
            self._discard(url)  # a transport failure: nothing in this pool is worth keeping
            if isinstance(e, httpx.RemoteProtocolError) and str(e).startswith(_BAD_LOCATION):
                raise ScrapeError("redirect", "a redirect whose Location is not a valid URL (not followed)") from None
            raise ScrapeError("connect", _error_text(e, headers)) from None

    async def _fetch(self, url: str, headers: dict[str, str]) -> tuple[bytes, str]:
        cap = self.cfg.max_body_bytes
        async with self._client(url).stream("GET", url, headers=headers) as resp:
            _check_status(resp)
            encoding = resp.headers.get("content-encoding", "identity").lower().strip()
            if encoding not in ("identity", "gzip", ""):
                raise ScrapeError("decode", f"unsupported Content-Encoding {encoding!r}")
            length = resp.headers.get("content-length")
            if encoding != "gzip" and length and length.isdigit() and int(length) > cap:
                raise ScrapeError("too_large", f"Content-Length {length} exceeds the {cap}-byte cap")
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
            parts: list[bytes] = []
            size = 0
            async for chunk in resp.aiter_raw():
                if inflater is not None:
                    data = chunk
                    while True:
                        try:
                            # max_length bounds memory per step, whatever the compression ratio.
                            out = inflater.decompress(data, cap - size + 1)
                        except zlib.error as e:
                            raise ScrapeError("decode", f"bad gzip stream: {e}") from None
                        parts.append(out)
                        size += len(out)
                        if size > cap:
                            raise ScrapeError("too_large", f"body exceeds the {cap}-byte cap after decompression")
                        data = inflater.unconsumed_tail
                        if not data:
                            break
                else:
                    parts.append(chunk)
                    size += len(chunk)
                if size > cap:
                    raise ScrapeError("too_large", f"body exceeds the {cap}-byte cap")
            if inflater is not None and not inflater.eof:
                raise ScrapeError("decode", "gzip stream ended early (truncated body)")
            return b"".join(parts), resp.headers.get("content-type", "")


def _token_error(detail: str) -> ScrapeError:
    # Counted as ``connect`` (nothing was sent), worded as what it is: the network is not to blame.
    return ScrapeError("connect", detail, text=detail)


def _error_text(e: httpx.HTTPError, headers: dict[str, str]) -> str:
    """An httpx error's name and text: every URL in it redacted, and the Authorization header's exact value
    (never sent by us into a message, but a library error could echo it) replaced."""
    text = redact_text(str(e))
    auth = headers.get("Authorization")
    if auth:
        text = text.replace(auth, "Bearer " + REDACTED)
    return type(e).__name__ + (f": {text}" if text else "")


def _check_status(resp: httpx.Response) -> None:
    """A redirect is not followed (Prometheus' default too): it is named, with where it points (redacted,
    shortened), so the operator can fix --target. A 200 declared text/html is a login or proxy page."""
    if resp.is_redirect:
        try:
            where = redact_url(resp.headers.get("location", ""))
        except ValueError:  # not a URL urlsplit reads (e.g. "http://[::1"): nothing safe to show
            where = "an unparseable Location"
        if len(where) > MAX_LOCATION_CHARS:
            where = where[:MAX_LOCATION_CHARS] + "..."
        raise ScrapeError("redirect", f"HTTP {resp.status_code} to {where!r} (not followed)")
    if resp.status_code != 200:
        raise ScrapeError("http_status", f"HTTP {resp.status_code}")
    if resp.headers.get("content-type", "").lower().startswith(("text/html", "application/xhtml")):
        raise ScrapeError("html", "HTTP 200 with Content-Type text/html (a login or proxy page?)")
