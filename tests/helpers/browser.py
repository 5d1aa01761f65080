"""``Browser``: Debian's headless Chromium driven over the Chrome DevTools Protocol, for the page tests.

    with Browser(tmp_path) as browser:           # starts /usr/bin/chromium --headless on a free port
        page = browser.new_page()
        page.set_viewport(1280, 800)
        page.goto("http://127.0.0.1:9847/")
        page.wait_for("document.querySelector('h1') !== null", timeout=30)
        page.evaluate("document.title"), page.screenshot(path), page.console_errors

No downloaded browser and no new dependency: the protocol is JSON over a websocket, spoken with aiohttp
(kvwatch's own dependency) in an event loop on a thread of its own, so console messages and exceptions are
collected as they happen while the test's thread waits. The flags keep Chromium off the network (no
component updates, sync, QUIC or first-run calls): the tests run where only loopback is reachable.
``wait_for`` polls a JavaScript condition until a deadline: the tests wait on the DOM, never sleep on it.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from tests.helpers.ports import free_port
from tests.helpers.process import Process, wait_for

__all__ = ["Browser", "BrowserError", "Page", "chromium_path"]

FLAGS = (
    "--headless",
    "--no-sandbox",  # root in CI containers: Chromium's sandbox needs user namespaces it may not get
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--hide-scrollbars",
    "--mute-audio",
    "--remote-allow-origins=*",
)


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    """Chromium answered a command with an error, or a page script threw."""


class _Loop:
    """An asyncio loop on a daemon thread; ``run(coro)`` runs a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="cdp", daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class Page:
    """One tab: commands, and the console errors / exceptions it has logged since it opened."""

    def __init__(self, loop: _Loop, ws_url: str, target_id: str):
        self._loop = loop
        self.ws_url = ws_url
        self.target_id = target_id
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self.console_errors: list[str] = []  # console.error, uncaught exceptions, failed loads
        self.console: list[str] = []  # every console message, for failure reports
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None

    async def _open(self) -> None:
        self._session = aiohttp.ClientSession()
        self._ws = await self._session.ws_connect(self.ws_url, max_msg_size=256 * 1024 * 1024)
        self._reader = asyncio.ensure_future(self._read())
        for domain in ("Runtime.enable", "Log.enable", "Page.enable"):
            await self._send(domain)

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(msg.data)
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            else:
                self._event(data.get("method", ""), data.get("params", {}))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BrowserError("the DevTools connection closed"))

    def _event(self, method: str, params: dict) -> None:
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"{params.get('type')}: {text}")
            if params.get("type") in ("error", "assert"):
                self.console_errors.append(f"console.{params.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            d = params.get("exceptionDetails", {})
            desc = d.get("exception", {}).get("description") or d.get("text", "")
            self.console_errors.append(f"exception: {desc} ({d.get('url', '')}:{d.get('lineNumber')})")
        elif method == "Log.entryAdded":
            e = params.get("entry", {})
            self.console.append(f"log {e.get('level')}: {e.get('text')} {e.get('url', '')}")
            if e.get("level") == "error":
                self.console_errors.append(f"{e.get('source')}: {e.get('text')} {e.get('url', '')}".strip())

    async def _send(self, method: str, **params: Any) -> dict:
        assert self._ws is not None
        i = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[i] = fut
        await self._ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
        data = await fut
        if "error" in data:
            raise BrowserError(f"{method}: {data['error']}")
        return data.get("result", {})

    def send(self, method: str, timeout: float = 60.0, **params: Any) -> dict:
        """One DevTools command (e.g. ``Page.navigate``), its result."""
        return self._loop.run(self._send(method, **params), timeout)

    def evaluate(self, expression: str, timeout: float = 60.0) -> Any:
        """The JSON value of a JavaScript expression (promises are awaited); a thrown error is BrowserError."""
        r = self.send("Runtime.evaluate", timeout, expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise BrowserError(d.get("exception", {}).get("description") or d.get("text", "evaluation failed"))
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 60.0, what: str | None = None, interval: float = 0.2) -> Any:
        """Poll ``expression`` until it is truthy (returned). A generous upper bound, never a speed test."""
        return wait_for(
            lambda: self.evaluate(expression),
            timeout,
            what or expression,
            interval,
            on_timeout=lambda: "console:\n" + "\n".join(self.console[-20:]),
        )

    def set_viewport(self, width: int, height: int, mobile: bool = False) -> None:
        self.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=mobile)

    def goto(self, url: str, timeout: float = 60.0) -> None:
        """Navigate and wait until the document has loaded (its deferred scripts have run)."""
        r = self.send("Page.navigate", url=url)
        if r.get("errorText"):
            raise BrowserError(f"navigating to {url}: {r['errorText']}")
        self.wait_for("document.readyState === 'complete'", timeout, f"{url} to load")

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page (all of it by default) at ``path``."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        if full_page:
            w, h = self.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": w, "height": h, "scale": 1}
        data = self.send("Page.captureScreenshot", **params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    async def _close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.wait([self._reader], timeout=5)
        if self._session is not None:
            await self._session.close()

    def close(self) -> None:
        self._loop.run(self._close(), 15)


class Browser:
    """Headless Chromium in a session of its own (tests/helpers/process.py), with a throwaway profile."""

    def __init__(self, log_dir: Path, binary: str | None = None):
        self.binary = binary or chromium_path()
        if self.binary is None:
            raise FileNotFoundError("chromium is not installed (bash .ci/install-tools.sh installs it)")
        self.log_dir = Path(log_dir)
        self.port = 0
        self.profile: tempfile.TemporaryDirectory | None = None
        self.proc: Process | None = None
        self._loop: _Loop | None = None
        self.pages: list[Page] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Browser:
        self.profile = tempfile.TemporaryDirectory(prefix="kvwatch-chromium-")
        self.port = free_port()
        assert self.binary is not None, "no Chromium"
        argv = [
            self.binary,
            *FLAGS,
            f"--user-data-dir={self.profile.name}",
            "--remote-debugging-address=127.0.0.1",
            f"--remote-debugging-port={self.port}",
            "about:blank",
        ]
        self.proc = Process(argv, self.log_dir / "chromium.log", name="chromium").start()
        self.proc.wait_for_url(self.base + "/json/version", timeout=60, what="Chromium's DevTools endpoint")
        self._loop = _Loop()
        return self

    def new_page(self) -> Page:
        assert self._loop is not None, "not started"
        with httpx.Client(timeout=30, trust_env=False) as c:
            info = c.put(self.base + "/json/new?about:blank").json()
        page = Page(self._loop, info["webSocketDebuggerUrl"], info["id"])
        self._loop.run(page._open(), 30)
        self.pages.append(page)
        return page

    def stop(self) -> None:
        for page in self.pages:
            try:
                page.close()
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self.pages.clear()
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        if self.proc is not None:
            self.proc.stop(grace=5)
            self.proc = None
        if self.profile is not None:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # Chromium's children may still be writing the profile
                try:
                    self.profile.cleanup()
                    break
                except OSError:
                    time.sleep(0.2)
            self.profile = None

    def __enter__(self) -> Browser:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
