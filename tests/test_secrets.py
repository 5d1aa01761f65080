"""Secrets never leave: a target's credentials (userinfo, credential-like query parameters), the bearer token
and the environment that carries them appear in no label, page, API document, log line or command output."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import sys

import httpx
import pytest

from kvwatch.app import serve
from kvwatch.config import ConfigError, load_settings
from kvwatch.logformat import formatter
from kvwatch.redact import REDACTED, SecretFilter, redact_text, redact_url
from tests.helpers.fake_vllm import FakeVllm as Upstream
from tests.helpers.ports import free_port

PASSWORD, QUERY_TOKEN, BEARER = "hunter2-pw", "s3cr3t-query", "tok-bearer-XYZ"


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://user:pw@h:8000/metrics", "http://<secret>@h:8000/metrics"),
        ("http://TOKEN@h/metrics", "http://<secret>@h/metrics"),
        ("https://h/metrics?token=abc&x=1", "https://h/metrics?token=<secret>&x=1"),
        (
            "https://h/m?Api_Key=abc&SIGNATURE=z&auth=&keep=key",
            "https://h/m?Api_Key=<secret>&SIGNATURE=<secret>&auth=<secret>&keep=key",
        ),
        ("http://h:1/metrics", "http://h:1/metrics"),
        ("http://h/m?passwd=a%20b#frag", "http://h/m?passwd=<secret>#frag"),
    ],
)
def test_redacted_form_is_documented_and_stable(url, shown):
    assert redact_url(url) == shown == redact_url(url)


def test_urls_in_free_text_are_redacted_by_structure():
    # Was a scrub of every occurrence of each secret (raw and percent-decoded) anywhere in the text: that is
    # what mangled "listening" with a one-letter password (issue 25). Now every URL is redacted as a URL.
    text = "GET http://bob:p%40ss@h/m?token=abc%2F&x=1 failed; see 'https://h2/x?api_key=k' (retrying)"
    assert redact_text(text) == (
        "GET http://<secret>@h/m?token=<secret>&x=1 failed; see 'https://h2/x?api_key=<secret>' (retrying)"
    )
    label = redact_url("http://bob:e@h/m?token=e")
    assert redact_text(f"GET {label} listening") == f"GET {label} listening"  # a label redacts to itself


def test_targets_that_differ_only_in_credentials_are_refused():
    with pytest.raises(ConfigError, match="differ only in their credentials"):
        load_settings(target=["http://a:1@h/metrics", "http://a:2@h/metrics"])
    with pytest.raises(ConfigError) as e:
        load_settings(target=[f"ftp://u:{PASSWORD}@h/metrics"])
    assert PASSWORD not in str(e.value)


def test_the_log_filter_scrubs_other_libraries_records(caplog):
    record = logging.LogRecord(
        "httpx", logging.INFO, __file__, 1, "HTTP Request: GET %s", (f"http://u:{PASSWORD}@h/",), None
    )
    SecretFilter().filter(record)
    assert PASSWORD not in record.getMessage() and REDACTED in record.getMessage()
    # kvwatch's own lines name labels, and pass as written (a URL-shaped scan would take the comma for the
    # last query value's)
    labels = ", ".join(redact_url(f"http://u:e@h{i}/m?token=e") for i in (1, 2))
    ours = logging.LogRecord("kvwatch", logging.INFO, __file__, 1, "watching %s", (labels,), None)
    SecretFilter().filter(ours)
    assert ours.getMessage() == f"watching {labels}"


async def _get(client: httpx.AsyncClient, url: str) -> str:
    try:
        return (await client.get(url, timeout=5)).text
    except httpx.HTTPError as e:
        return f"<{type(e).__name__}>"


async def _wait(pred, what: str, timeout: float = 60.0):
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if await pred():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_json_log_lines_are_scrubbed_too():
    """--log-format json: the filter rewrites the record before the formatter, message, exception and target alike."""
    url = f"http://u:{PASSWORD}@h/m?token={QUERY_TOKEN}"
    try:
        raise RuntimeError(f"connect to {url} failed")
    except RuntimeError:
        exc = sys.exc_info()
    record = logging.LogRecord("httpx", logging.WARNING, __file__, 1, "GET %s", (url,), exc)
    record.target = url  # a caller that passed the raw URL by mistake
    handler = logging.StreamHandler()
    handler.addFilter(SecretFilter())
    handler.setFormatter(formatter("json"))
    assert handler.filter(record)
    line = handler.format(record)
    doc = json.loads(line)
    assert "\n" not in line and set(doc) == {"time", "level", "message", "target", "logger", "exception"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["time"])
    assert (doc["level"], doc["logger"]) == ("warning", "httpx")
    assert doc["message"] == f"GET {redact_url(url)}" and doc["target"] == redact_url(url)
    assert "RuntimeError: connect to" in doc["exception"]
    for secret in (PASSWORD, QUERY_TOKEN):
        assert secret not in line


def test_a_bad_log_format_is_one_line_naming_the_setting():
    with pytest.raises(ConfigError) as e:
        load_settings(log_format="yaml")
    assert str(e.value) == "invalid setting --log-format (env KVWATCH_LOG_FORMAT): 'yaml' is not one of text, json"


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_no_secret_in_any_output_through_success_failure_and_reconnect(tmp_path, log_format):
    token_file = tmp_path / "token"
    token_file.write_text(BEARER + "\n")
    async with Upstream() as up:
        up.serve_dir("kv_cache")
        # userinfo is basic auth, which a bearer token cannot go with: the query and the token file here,
        # userinfo in the diagnose/record test below
        target = f"http://127.0.0.1:{up.port}/metrics?token={QUERY_TOKEN}&x=1"
        label = f"http://127.0.0.1:{up.port}/metrics?token=<secret>&x=1"
        port = free_port()
        env = {
            **os.environ,
            "KVWATCH_TARGET": target,
            "KVWATCH_BEARER_TOKEN_FILE": str(token_file),
            "KVWATCH_LOG_LEVEL": "debug",
            "KVWATCH_LISTEN": f"127.0.0.1:{port}",
            "KVWATCH_INTERVAL": "0.5",
            "KVWATCH_LOG_FORMAT": log_format,
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kvwatch",
            "run",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        pages: list[str] = []
        base = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient() as c:

                async def metrics_say(text):
                    body = await _get(c, base + "/metrics")
                    pages.append(body)
                    return text in body

                async def http_errors_counted():
                    # at least one: at 0.5-s scrapes a starved test polls after the second error as often as
                    # before it (ciB, session 7: waiting for exactly 1.0 timed out)
                    body = await _get(c, base + "/metrics")
                    pages.append(body)
                    key = f'kvwatch_scrape_errors_total{{reason="http_status",target="{label}"}} '
                    return any(line.startswith(key) and float(line[len(key) :]) >= 1 for line in body.splitlines())

                await _wait(lambda: metrics_say(f'kvwatch_up{{target="{label}"}} 1.0'), "a good scrape")
                up.mode = "status"  # HTTP 500
                await _wait(http_errors_counted, "an HTTP error")
                await up.stop()  # connection refused
                await _wait(lambda: metrics_say(f'kvwatch_up{{target="{label}"}} 0.0'), "the target down")
                await asyncio.sleep(1.5)
                up.mode = "ok"
                await up.start()
                await _wait(lambda: metrics_say(f'kvwatch_up{{target="{label}"}} 1.0'), "the reconnect")
                for path in ("/", "/api/v1/diagnosis", "/metrics"):
                    pages.append(await _get(c, base + path))
        finally:
            proc.terminate()
            out, err = await asyncio.wait_for(proc.communicate(), 30)
    log = err.decode() + out.decode()
    assert len(up.auth_headers) >= 3 and all(h == f"Bearer {BEARER}" for h in up.auth_headers)  # the token was sent
    assert f"scraping {label}" in log and f"scrape of {label} failed" in log  # the log names the target...
    assert ("DEBUG" if log_format == "text" else '"level": "debug"') in log  # ...at debug level, libraries' too
    for secret in (PASSWORD, QUERY_TOKEN, BEARER):
        assert secret not in log, f"{secret} in the log"
        for page in pages:
            assert secret not in page, f"{secret} in {page[:200]}"
    assert any(label in p for p in pages[-3:-1])  # the landing page and the JSON name the redacted target
    if log_format == "json":  # one object per line, every line; the target's records name it in a field
        docs = [json.loads(line) for line in err.decode().splitlines()]
        assert docs and all({"time", "level", "message", "logger"} <= set(d) for d in docs)
        assert {d["level"] for d in docs} >= {"debug", "info", "warning"}
        about = [d for d in docs if d["message"].startswith(("scraping ", "scrape of "))]
        assert len(about) >= 3 and all(d["target"] == label and d["logger"] == "kvwatch" for d in about), about


async def _probe(url: str) -> bool:
    """The fake answers a GET of its /metrics right now (judged apart from kvwatch)."""
    try:
        async with httpx.AsyncClient() as c:
            return (await c.get(url, timeout=10)).status_code == 200
    except httpx.HTTPError:
        return False


async def _kvwatch(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvwatch", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode() + err.decode()


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_no_secret_in_diagnose_and_record_output(tmp_path):
    # Once under a loaded CI-like machine (test-all at -n 3 beside the e2e lane) the 2nd and 3rd runs here failed
    # with "All connection attempts failed" to this fake while the 1st had scraped it. A run is therefore judged
    # only if the fake answered a probe just before and just after it; a run bracketed by a failed probe is the
    # fake's (or the machine's) failure and is run again against a fresh fake, at most twice. A kvwatch that
    # cannot reach a reachable upstream still fails, as does one that prints a secret in any attempt.
    outputs = []
    debug = {**os.environ, "KVWATCH_LOG_LEVEL": "debug"}
    runs = (
        ["diagnose", "--duration", "3", "--json", "--interval", "0.5"],
        ["diagnose", "--duration", "2", "--interval", "0.5"],
        ["record", "--out", str(tmp_path / "rec"), "--duration", "2", "--interval", "0.5"],
    )
    auth_headers: list[str | None] = []
    for args in runs:
        for _attempt in range(3):
            with Upstream() as up:  # in a thread of its own: the test's loop cannot hold it up
                up.serve_dir("kv_cache")
                target = f"http://kv:{PASSWORD}@127.0.0.1:{up.port}/metrics?api_key={QUERY_TOKEN}"
                before = await _probe(up.url)
                rc, text = await _kvwatch(args[0], target, *args[1:], env=debug)
                judged = before and await _probe(up.url)
                outputs.append((args[0], rc, text))  # every attempt's output is searched for secrets
                auth_headers += [h for h in up.auth_headers if h is not None]
                shown = f"http://<secret>@127.0.0.1:{up.port}/metrics?api_key=<secret>"
            if judged:
                break
        assert judged, f"the fake upstream itself did not answer around {args[0]} in 3 attempts"
        assert rc == 0, (args[0], text[-600:])
        if args[1:3] == ["--duration", "3"]:
            assert shown in text, text[-600:]
    # and the failure path: nothing to scrape (a port nobody listens on)
    target = f"http://kv:{PASSWORD}@127.0.0.1:{free_port()}/metrics?api_key={QUERY_TOKEN}"
    rc, text = await _kvwatch("diagnose", target, "--duration", "2", "--interval", "0.5")
    assert rc == 1, text[-600:]
    outputs.append(("diagnose (down)", rc, text))
    for name, _, text in outputs:
        assert PASSWORD not in text and QUERY_TOKEN not in text, f"{name}: {text[:300]}"
    assert len(list((tmp_path / "rec").glob("*.prom"))) >= 2
    assert auth_headers and all(h.startswith("Basic ") for h in auth_headers)  # userinfo is basic auth


def test_userinfo_and_a_bearer_token_are_refused_together(tmp_path):
    token = tmp_path / "t"
    token.write_text(BEARER)
    with pytest.raises(ConfigError, match="basic auth") as e:
        load_settings(target=[f"http://u:{PASSWORD}@h/metrics"], bearer_token_file=str(token))
    assert PASSWORD not in str(e.value)


@pytest.mark.parametrize("secret", ["e", "s", "secret", REDACTED])
async def test_short_and_placeholder_like_secrets_mangle_nothing(secret):
    """A one-letter or placeholder-like password: every line reads as written, the label is exact, the log's
    ``target`` is the metric label byte for byte (a substring scrub made "list<secret>ning" and "<<secret>>")."""
    async with Upstream() as up:
        up.mode, up.status = "status", 404
        target = f"http://u:{secret}@127.0.0.1:{up.port}/metrics?token={secret}&x=1"
        label = f"http://<secret>@127.0.0.1:{up.port}/metrics?token=<secret>&x=1"
        port = free_port()
        settings = load_settings(target=[target], listen=f"127.0.0.1:{port}", interval=0.5)
        out = io.StringIO()
        handler = logging.StreamHandler(out)
        handler.addFilter(SecretFilter())
        handler.setFormatter(formatter("json"))
        root, httpx_log = logging.getLogger(), logging.getLogger("httpx")
        levels = root.level, httpx_log.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        httpx_log.setLevel(logging.INFO)  # its request line carries the whole URL, userinfo included
        stop = asyncio.Event()
        task = asyncio.create_task(serve(settings, stop))
        try:
            async with httpx.AsyncClient() as c:
                await _wait(lambda: _says(c, f"http://127.0.0.1:{port}/metrics", "kvwatch_scrape_errors"), "an error")
                metrics = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
            await _wait(lambda: _true("scrape of" in out.getvalue()), "the warning")
        finally:
            stop.set()
            await task
            root.removeHandler(handler)
            root.setLevel(levels[0])
            httpx_log.setLevel(levels[1])
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    ours = [d for d in docs if d["logger"] == "kvwatch"]
    assert ours[0]["message"] == f"kvwatch 0.1.0 listening on http://127.0.0.1:{port}, watching {label}", ours
    assert ours[1]["message"] == f"scrape of {label} failed (http_status): HTTP 404 — is the path /metrics?"
    assert ours[1]["target"] == label and f'target="{label}"' in metrics  # the log's target is the label, exactly
    requests = [d["message"] for d in docs if d["logger"] == "httpx" and f":{up.port}/" in d["message"]]
    assert requests and all(r == f'HTTP Request: GET {label} "HTTP/1.1 404 Not Found"' for r in requests), requests


async def _says(client: httpx.AsyncClient, url: str, text: str) -> bool:
    return text in await _get(client, url)


async def _true(value: bool) -> bool:
    return value
