"""Run the real Prometheus, Alertmanager and kvwatch as subprocesses on free loopback ports.

Shared by the alert, dashboard and deploy tests. Synchronous and small; each server is a ``Process``
(tests/helpers/process.py: its own session, stopped and reaped on ``stop()`` / context exit, and at
interpreter exit as a last resort) logging to a file in its work dir. Missing binaries raise
``BinaryMissing`` (the tests *fail*: CI installs them with ``.ci/install-tools.sh``).

API::

    find_binary("promtool") -> str              # absolute path or BinaryMissing
                                                # ("alertmanager" also finds Debian's "prometheus-alertmanager")

    with Prometheus(config, workdir, rule_files=[...]) as prom:
        # config: dict (dumped as YAML) or YAML text; rule_files are added to config["rule_files"].
        prom.url                                # "http://127.0.0.1:PORT"
        prom.query("up")                        # instant query -> list of {"metric": {...}, "value": [t, "v"]}
        prom.query_range("up", start, end, step)  # -> list of {"metric": {...}, "values": [[t, "v"], ...]}
        prom.value("sum(up)")                   # first sample as float, or None when the result is empty
        prom.alerts()                           # /api/v1/alerts -> list of alert dicts (state pending|firing)
        prom.rules()                            # /api/v1/rules  -> list of groups
        prom.targets()                          # /api/v1/targets -> active targets
        prom.wait_for(lambda: prom.value("up") == 1, timeout=60, what="target up")

    with Alertmanager(config, workdir) as am:    # cluster listener disabled
        am.url
        am.alerts(active=True, silenced=..., inhibited=...)   # /api/v2/alerts -> list

    with Kvwatch(["run", "--target", url, "--interval", "1"], workdir) as kv:
        kv.url, kv.port                         # "--listen 127.0.0.1:PORT" is added for you; waits for /readyz
        kv.get("/metrics") -> str
    Kvwatch([..., "--web-config-file", f], workdir, ca_file=ca)  # served over TLS: kv.url is https://, verified
                                                                 # against ca (the probes need no credentials)

    with WebhookReceiver() as rx:               # stdlib HTTP server in a thread recording every POST
        rx.url                                  # "http://127.0.0.1:PORT"
        rx.requests                             # list of Received(path, headers, body, json)
        rx.wait_for(lambda reqs: ..., timeout=60, what="...")

``wait_for`` polls (0.25 s) until the predicate returns something truthy and returns it, raising
``TimeoutError`` with ``what`` and the tail of the process log otherwise. Timeouts are generous upper bounds
for slow CI machines, not assertions about speed.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from tests.helpers.ports import free_port
from tests.helpers.process import Process, ProcessExited, wait_for

__all__ = [
    "Alertmanager",
    "BinaryMissing",
    "Kvwatch",
    "ManagedProcess",
    "Prometheus",
    "Received",
    "WebhookReceiver",
    "find_binary",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

_ALIASES = {"alertmanager": ("alertmanager", "prometheus-alertmanager")}


class BinaryMissing(RuntimeError):
    """A required program is not on PATH."""


def find_binary(name: str) -> str:
    """Absolute path of ``name`` on PATH (Alertmanager under either of its names) or ``BinaryMissing``."""
    for candidate in _ALIASES.get(name, (name,)):
        path = shutil.which(candidate)
        if path:
            return path
    raise BinaryMissing(f"{name!r} not found on PATH; install it with `bash .ci/install-tools.sh` (as root)")


class ManagedProcess(Process):
    """A server on a free port: a ``Process`` (tests/helpers/process.py) whose command names the port, in
    ``workdir``, logging to ``workdir/<name>.log``; ready when ``ready_path`` answers 200."""

    name = "process"
    ready_path = "/-/ready"
    start_timeout = 60.0

    def __init__(self, workdir: Path | str, env: Mapping[str, str] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.env = dict(env) if env is not None else None
        self.port = 0
        self._http = httpx.Client(timeout=10.0, trust_env=False)
        super().__init__(log_path=self.workdir / f"{self.name}.log", cwd=self.workdir, env=self.env)

    # -- to override ---------------------------------------------------------------------------
    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ManagedProcess:
        """Start on a free port and wait until ``ready_path`` answers 200. Retries if the port was taken."""
        for attempt in range(3):
            self.port = free_port()
            self.argv = self.command(self.port)
            super().start()
            try:
                self.wait_for_url(
                    self.url + self.ready_path, timeout=self.start_timeout, what=f"{self.name} ready on {self.url}"
                )
                return self
            except (TimeoutError, ProcessExited):
                exited = not self.running()
                self.stop()
                if exited and "address already in use" in self.log_tail().lower() and attempt < 2:
                    continue
                raise
        raise AssertionError("unreachable")

    def get(self, path: str, **params: Any) -> str:
        resp = self._http.get(self.url + path, params=params or None)
        resp.raise_for_status()
        return resp.text

    def wait_for(self, predicate: Callable[[], T], timeout: float = 60.0, what: str = "condition") -> T:
        return wait_for(predicate, timeout, what, on_timeout=self.log_tail)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._http.close()


def _dump_config(config: Mapping[str, Any] | str) -> str:
    return config if isinstance(config, str) else yaml.safe_dump(dict(config), sort_keys=False)


class Prometheus(ManagedProcess):
    """The real ``prometheus`` server with a temp TSDB; ``--web.enable-lifecycle`` for ``reload()``."""

    name = "prometheus"

    def __init__(
        self,
        config: Mapping[str, Any] | str,
        workdir: Path | str,
        rule_files: Iterable[Path | str] = (),
        extra_args: Sequence[str] = (),
    ):
        super().__init__(workdir)
        cfg = yaml.safe_load(_dump_config(config)) or {}
        rules = [str(Path(p).resolve()) for p in rule_files]
        if rules:
            cfg["rule_files"] = list(cfg.get("rule_files") or []) + rules
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.extra_args = list(extra_args)
        self.binary = find_binary("prometheus")

    def command(self, port: int) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
            "--log.level=info",
            *self.extra_args,
        ]

    def _api(self, path: str, **params: Any) -> Any:
        resp = self._http.get(f"{self.url}/api/v1/{path}", params=params or None)
        body = resp.json()
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, time: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if time is not None:
            params["time"] = time
        data = self._api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return self._api("query_range", query=expr, start=start, end=end, step=step)["result"]

    def value(self, expr: str, time: float | None = None) -> float | None:
        result = self.query(expr, time)
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict[str, Any]]:
        return self._api("alerts")["alerts"]

    def rules(self) -> list[dict[str, Any]]:
        return self._api("rules")["groups"]

    def targets(self) -> list[dict[str, Any]]:
        return self._api("targets")["activeTargets"]

    def reload(self) -> None:
        self._http.post(self.url + "/-/reload").raise_for_status()


class Alertmanager(ManagedProcess):
    """The real Alertmanager, single node (``--cluster.listen-address=`` disables gossip)."""

    name = "alertmanager"

    def __init__(self, config: Mapping[str, Any] | str, workdir: Path | str, extra_args: Sequence[str] = ()):
        super().__init__(workdir)
        self.config_path = self.workdir / "alertmanager.yml"
        self.config_path.write_text(_dump_config(config))
        self.extra_args = list(extra_args)
        self.binary = find_binary("alertmanager")

    def command(self, port: int) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=debug",
            *self.extra_args,
        ]

    def alerts(
        self, active: bool = True, silenced: bool = True, inhibited: bool = True, filters: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        params: list[tuple[str, str]] = [
            ("active", str(active).lower()),
            ("silenced", str(silenced).lower()),
            ("inhibited", str(inhibited).lower()),
        ] + [("filter", f) for f in filters]
        resp = self._http.get(self.url + "/api/v2/alerts", params=params)
        resp.raise_for_status()
        return resp.json()


class Kvwatch(ManagedProcess):
    """``python -m kvwatch <args> --listen 127.0.0.1:PORT`` from this checkout; ready when /readyz is 200.

    For other subcommands that serve HTTP (e.g. ``sim``) pass ``listen_flag`` (``"--port"`` gets just the
    port, ``"--listen"`` gets ``127.0.0.1:PORT``) and ``ready_path``.
    """

    name = "kvwatch"

    def __init__(
        self,
        args: Sequence[str],
        workdir: Path | str,
        env: Mapping[str, str] | None = None,
        listen_flag: str = "--listen",
        ready_path: str = "/readyz",
        name: str | None = None,
        ca_file: Path | str | None = None,
    ):
        if name:
            self.name = name
        base_env = dict(os.environ)
        base_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), base_env.get("PYTHONPATH")]))
        base_env.update(env or {})
        super().__init__(workdir, env=base_env)
        self.args = list(args)
        self.listen_flag = listen_flag
        self.ready_path = ready_path
        # With a web config that turns TLS on: https, verified against this CA.
        self.tls = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
        if self.tls is not None:
            self._http.close()
            self._http = httpx.Client(timeout=10.0, trust_env=False, verify=self.tls)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def wait_for_url(self, url: str, timeout: float = 60.0, what: str | None = None, interval: float = 0.25) -> None:
        if self.tls is None:
            return super().wait_for_url(url, timeout, what, interval)
        with httpx.Client(timeout=2.0, trust_env=False, verify=self.tls) as client:
            self.wait_until(
                lambda: client.get(url).status_code == 200, timeout, what or f"{url} to answer 200", interval
            )

    def command(self, port: int) -> list[str]:
        value = str(port) if self.listen_flag == "--port" else f"127.0.0.1:{port}"
        return [sys.executable, "-m", "kvwatch", *self.args, self.listen_flag, value]


# -- local stand-ins for Slack / PagerDuty / heartbeat endpoints -------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any = None
    at: float = field(default_factory=time.time)


class WebhookReceiver:
    """Records every POST (any path) and answers 200 ``{"ok": true}`` - enough for Slack, PagerDuty v2
    (which wants 202; Alertmanager accepts any 2xx) and generic webhooks."""

    def __init__(self, status: int = 200):
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - stdlib API
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    parsed = json.loads(body) if body else None
                except ValueError:
                    parsed = None
                with outer._lock:
                    outer.requests.append(Received(self.path, dict(self.headers), body, parsed))
                payload = b'{"ok": true, "status": "success"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.requests)

    def wait_for(self, predicate: Callable[[list[Received]], T], timeout: float = 60.0, what: str = "request") -> T:
        return wait_for(
            lambda: predicate(self.snapshot()),
            timeout,
            what,
            on_timeout=lambda: f"received so far: {[r.json for r in self.snapshot()]}",
        )

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
