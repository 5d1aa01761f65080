"""kvwatch's own port under abuse: oversized requests, slow-header clients, more connections than it serves, 1,000
concurrent /metrics requests. The server is the real one (``kvwatch.app.serve``, in this process), scraping a fake
vLLM on loopback (tests/helpers/fake_vllm.py); the clients are raw sockets and aiohttp. The limits are
kvwatch.app's named constants; two tests lower one (the deadline, the connection cap) to keep the test short.
Scrape lateness under abuse is measured by ``python -m bench abuse`` (bench/RESULTS.md), not asserted here.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import pytest

import kvwatch.app as app_mod
from kvwatch.app import serve
from kvwatch.config import load_settings
from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.ports import HOST, free_port

HEAD = b"GET /healthz HTTP/1.1\r\nHost: kvwatch\r\n\r\n"


async def _until(pred, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll until ``pred()`` (a coroutine function): a bound for a loaded machine, not a measurement."""
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout:g} s"
        await asyncio.sleep(0.05)


@pytest.fixture
async def upstream():
    async with FakeVllm() as up:
        up.serve_dir("kv_cache")
        yield up


@pytest.fixture
async def kvwatch(upstream):
    """``serve()`` on a free port, scraping ``upstream`` every 0.2 s; yields the port."""
    port = free_port()
    settings = load_settings(target=[upstream.url], listen=f"{HOST}:{port}", interval=0.2)
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop))

    async def healthy():
        return (await _exchange(port, HEAD, wait=2.0)).startswith(b"HTTP/1.1 200")

    await _until(healthy, what="kvwatch listening")
    yield port
    stop.set()
    await task


async def _exchange(port: int, data: bytes, wait: float = 10.0) -> bytes:
    """Send ``data`` on a new connection, return what comes back until the server closes (or ``wait`` s)."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError:
        return b""
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1 << 16), wait)
    except (OSError, TimeoutError):
        return b""
    finally:
        writer.close()


async def _scrapes_continue(upstream, n: int = 3) -> None:
    start = upstream.requests

    async def more():
        return upstream.requests >= start + n

    await _until(more, what=f"{n} more scrapes of vLLM")


async def test_oversized_requests_get_400(kvwatch, upstream, caplog):
    caplog.set_level(logging.DEBUG)
    long_url = b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: kvwatch\r\n\r\n"  # past MAX_REQUEST_LINE_BYTES
    big_header = b"GET /healthz HTTP/1.1\r\nHost: kvwatch\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    many = b"GET /healthz HTTP/1.1\r\nHost: kvwatch\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(70)) + b"\r\n"
    for request in (long_url, big_header, many):
        answer = await _exchange(kvwatch, request)
        assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request"), answer[:200]
    assert not [r for r in caplog.records if r.exc_info], "a client's bad request logged a traceback"
    assert (await _exchange(kvwatch, HEAD)).startswith(b"HTTP/1.1 200")
    await _scrapes_continue(upstream)


async def test_a_slow_header_client_is_dropped_at_the_deadline(upstream, monkeypatch):
    monkeypatch.setattr(app_mod, "REQUEST_DEADLINE_SECONDS", 1.0)  # read by serve(): 10 s in production
    async for port in kvwatch.__wrapped__(upstream):  # the fixture's body, after the patch
        reader, writer = await asyncio.open_connection(HOST, port)
        head = HEAD[:-2] + b"X-Slow: " + b"x" * 10_000  # never complete: a byte every 0.1 s
        dropped_at = None
        started = time.monotonic()
        for byte in head:
            if reader.at_eof() or writer.is_closing():
                dropped_at = time.monotonic() - started
                break
            try:
                writer.write(bytes([byte]))
                await writer.drain()
                if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                    dropped_at = time.monotonic() - started
                    break
            except TimeoutError:
                pass
            except OSError:
                dropped_at = time.monotonic() - started
                break
            assert time.monotonic() - started < 30, "a client trickling its request head was never dropped"
        writer.close()
        assert dropped_at is not None and dropped_at >= 1.0  # not before the deadline
        await _scrapes_continue(upstream)


async def test_connections_past_the_cap_get_503(upstream, monkeypatch):
    monkeypatch.setattr(app_mod, "MAX_CONNECTIONS", 4)  # 128 in production
    async for port in kvwatch.__wrapped__(upstream):
        held = []
        for _ in range(4):  # kept alive after one request each: counted, idle
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(HEAD)
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            held.append(writer)
        assert (await _exchange(port, HEAD)).startswith(b"HTTP/1.1 503")
        for w in held:
            w.close()

        async def served(port=port):
            return (await _exchange(port, HEAD, wait=2.0)).startswith(b"HTTP/1.1 200")

        await _until(served, what="a request served once the held connections closed")


@pytest.mark.slow  # 1,000 sockets and up to 20 s of the machine
async def test_1000_concurrent_requests_get_served_or_503_and_scraping_goes_on(kvwatch, upstream):
    outcomes: dict[str, int] = {}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    # Past the listen backlog (32) Linux drops the handshake's last ACK: such a client believes it is connected
    # and waits for an answer that never comes, until its own timeout. Prometheus has one (its scrape timeout).
    timeout = aiohttp.ClientTimeout(total=20)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one():
            try:
                async with session.get(f"http://{HOST}:{kvwatch}/metrics") as resp:
                    body = await resp.read()
                    if resp.status == 200:
                        assert b"kvwatch_up{" in body
                    return str(resp.status)
            except (aiohttp.ClientConnectionError, OSError, TimeoutError) as e:
                return type(e).__name__  # refused, reset or left unanswered by the kernel: the caps at work

        scrapes_before = upstream.requests
        for result in await asyncio.gather(*(one() for _ in range(1000))):
            outcomes[result] = outcomes.get(result, 0) + 1
    assert sum(outcomes.values()) == 1000
    assert outcomes.get("200", 0) >= 1, outcomes
    refused = {
        "ServerDisconnectedError",
        "ClientOSError",
        "ClientConnectorError",
        "ConnectionResetError",
        "TimeoutError",
        "ServerTimeoutError",
        "ConnectionTimeoutError",
        "SocketTimeoutError",
    }
    assert set(outcomes) - {"200", "503"} <= refused, outcomes
    assert upstream.requests > scrapes_before  # vLLM was scraped meanwhile
    await _scrapes_continue(upstream)
    assert (await _exchange(kvwatch, HEAD)).startswith(b"HTTP/1.1 200")
