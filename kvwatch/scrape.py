"""Fetch one ``/metrics`` body from vLLM, defensively.

A sidecar must survive whatever the upstream does: the whole fetch (connect to last byte) runs under
one deadline shorter than the scrape interval, the body is capped *after* decompression (a gzip bomb
stops at the cap, not in memory), and every failure becomes a ``ScrapeError`` with a short ``reason``
that ends up in ``kvwatch_scrape_errors_total{reason}``. The bearer token is read from its file on
every scrape (so rotation works) and never logged.

The client is aiohttp's (already kvwatch's server): the benchmark (bench/fanin.py) found httpx's
connection pool spending seconds per round once ~100 targets were polled at once, where aiohttp's
takes milliseconds. TLS trust is built exactly as httpx builds it (``httpx.create_ssl_context``:
certifi, or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``), and proxies come from the environment
(``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY``), as with httpx's defaults. No cookies are kept.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx

__all__ = ["Fetcher", "ScrapeError", "REASONS"]

REASONS = ("connect", "timeout", "http_status", "too_large", "decode", "parse", "no_vllm_metrics")


class ScrapeError(Exception):
    def __init__(self, reason: str, detail: str):
        assert reason in REASONS
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class FetchConfig:
    timeout: float
    max_body_bytes: int
    bearer_token_file: Path | None = None
    tls_verify: bool = True


class Fetcher:
    """One shared client session (connection reuse) for all targets, opened on the first fetch."""

    def __init__(self, cfg: FetchConfig, user_agent: str):
        self.cfg = cfg
        self.headers = {
            "User-Agent": user_agent,
            # We decompress ourselves, capped; say what we accept explicitly.
            "Accept-Encoding": "gzip",
            "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
        }
        self._ssl = httpx.create_ssl_context(verify=cfg.tls_verify)
        self.session: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(
                # Idle connections are dropped after 4 s, before uvicorn's (vLLM's) 5 s: never reuse one it is closing.
                connector=aiohttp.TCPConnector(limit=1000, ssl=self._ssl, keepalive_timeout=4.0),
                headers=self.headers,
                auto_decompress=False,  # the body is inflated by _fetch, under the cap
                cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None),  # the deadline is fetch()'s, whole
                trust_env=True,
            )
        return self.session

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()

    def _headers(self) -> dict[str, str]:
        if self.cfg.bearer_token_file is None:
            return {}
        try:
            token = self.cfg.bearer_token_file.read_text().strip()
        except OSError as e:
            raise ScrapeError("connect", f"cannot read bearer token file: {e.strerror}") from None
        return {"Authorization": f"Bearer {token}"}

    async def fetch(self, url: str) -> str:
        try:
            async with asyncio.timeout(self.cfg.timeout):
                return await self._fetch(url)
        except TimeoutError:
            raise ScrapeError("timeout", f"no complete response within {self.cfg.timeout:g}s") from None
        except aiohttp.ClientError as e:
            # Exception text may carry the URL but never our headers.
            raise ScrapeError("connect", type(e).__name__ + (f": {e}" if str(e) else "")) from None

    async def _fetch(self, url: str) -> str:
        cap = self.cfg.max_body_bytes
        async with self._session().get(url, headers=self._headers(), allow_redirects=False) as resp:
            if resp.status != 200:
                raise ScrapeError("http_status", f"HTTP {resp.status}")
            encoding = resp.headers.get("content-encoding", "identity").lower().strip()
            if encoding not in ("identity", "gzip", ""):
                raise ScrapeError("decode", f"unsupported Content-Encoding {encoding!r}")
            length = resp.headers.get("content-length")
            if encoding != "gzip" and length and length.isdigit() and int(length) > cap:
                raise ScrapeError("too_large", f"Content-Length {length} exceeds the {cap}-byte cap")
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
            parts: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_any():
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
        try:
            return b"".join(parts).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ScrapeError("decode", f"body is not UTF-8 (byte {e.start})") from None
