"""``--web-config-file`` in process: the exporter-toolkit web config parsed as strictly as the toolkit, basic auth
with bcrypt, and kvwatch's real aiohttp app serving TLS on loopback (certificates made with openssl at test time).

The real programs (a real Prometheus scraping kvwatch over HTTPS with basic auth; a certificate rotated under a
running kvwatch; SIGHUP) are in tests/test_webconfig_process.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import socket
import ssl
import textwrap
from pathlib import Path

import bcrypt
import httpx
import pytest
from aiohttp import web

from kvwatch.app import Monitor, make_app
from kvwatch.config import ConfigError, load_settings
from kvwatch.webconfig import (
    CACHE_SIZE,
    MAX_PENDING,
    POLL_SECONDS,
    SETTING,
    BasicAuth,
    WebConfigError,
    WebConfigWatcher,
    load,
)
from tests.helpers.certs import Ca, run_openssl
from tests.helpers.ports import free_port

PASSWORD = b"correct horse battery staple"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 (serial 1), another (serial 2), a client certificate, a second
    CA and its client; a bcrypt hash of PASSWORD (cost 4: the tests check logic, not bcrypt's speed)."""
    d = tmp_path_factory.mktemp("pki")
    ca, other = Ca(d / "ca"), Ca(d / "other", name="another CA")
    return {
        "ca": ca,
        "server": ca.issue(d / "server", serial=1),
        "server2": ca.issue(d / "server2", serial=2),
        "client": ca.issue(d / "client", cn="prometheus", client=True),
        "stranger": other.issue(d / "stranger", cn="stranger", client=True),
        "hash": bcrypt.hashpw(PASSWORD, bcrypt.gensalt(4)).decode(),
    }


def write(directory: Path, text: str, name: str = "web.yml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def tls_config(pki, directory: Path, extra: str = "", users: bool = True) -> Path:
    """A web config with TLS (the server cert copied next to it, named by relative paths) and one user."""
    (directory / "tls.crt").write_bytes(pki["server"].cert.read_bytes())
    (directory / "tls.key").write_bytes(pki["server"].key.read_bytes())
    text = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n" + extra
    if users:
        text += f"basic_auth_users:\n  prometheus: {pki['hash']}\n"
    return write(directory, text)


# -- the parser: every field's error is one line naming the file and the field ------------------------------

BAD = [
    # (file text, the field named, what the line says)
    ("a: [1,\n", "", "not valid YAML (line 2"),
    ("- tls_server_config\n", "", "the top level must be a mapping"),
    ("basic_auth_users:\n  alice: {h}\n  alice: {h}\n", "", "duplicate key 'alice'"),
    ("tls_config: {{}}\n", "tls_config", "unknown field"),
    ("tls_server_config:\n  cert_fle: a.crt\n", "tls_server_config.cert_fle", "unknown field"),
    ("http_server_config:\n  http3: true\n", "http_server_config.http3", "unknown field"),
    ("tls_server_config: a.crt\n", "tls_server_config", "must be a mapping"),
    (
        "tls_server_config:\n  cert_file: {cert}\n",
        "tls_server_config.key_file",
        "missing: TLS needs cert_file and key_file (cert_file is set)",
    ),
    (
        "tls_server_config:\n  key_file: {key}\n",
        "tls_server_config.cert_file",
        "missing: TLS needs cert_file and key_file (key_file is set)",
    ),
    ("tls_server_config:\n  client_auth_type: NoClientCert\n", "tls_server_config.cert_file", "missing"),
    (
        "tls_server_config:\n  cert_file: [a]\n  key_file: {key}\n",
        "tls_server_config.cert_file",
        "must be a string, not list",
    ),
    ("tls_server_config:\n  cert_file: nope.crt\n  key_file: {key}\n", "tls_server_config.cert_file", "cannot read"),
    (
        "tls_server_config:\n  cert_file: {key}\n  key_file: {key}\n",
        "tls_server_config.cert_file",
        "no PEM certificate",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {cert}\n",
        "tls_server_config.key_file",
        "is not a PEM private key",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {other_key}\n",
        "tls_server_config.key_file",
        "does not match cert_file",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {encrypted_key}\n",
        "tls_server_config.key_file",
        "the key is encrypted",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_ca_file: nope.crt\n",
        "tls_server_config.client_ca_file",
        "cannot read",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_ca_file: {key}\n",
        "tls_server_config.client_ca_file",
        "no PEM certificate",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_ca_file: {ca}\n",
        "tls_server_config.client_ca_file",
        "without a client_auth_type that verifies",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_auth_type: VerifyAlways\n",
        "tls_server_config.client_auth_type",
        "unknown value 'VerifyAlways'",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_auth_type: RequireAnyClientCert\n",
        "tls_server_config.client_auth_type",
        "cannot be enforced",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS14\n",
        "tls_server_config.min_version",
        "unknown TLS version 'TLS14'",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  max_version: 1.3\n",
        "tls_server_config.max_version",
        "must be a string",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS13\n  max_version: TLS12\n",
        "tls_server_config.min_version",
        "is above max_version",
    ),
    (
        "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  prefer_server_cipher_suites: maybe\n",
        "tls_server_config.prefer_server_cipher_suites",
        "must be true or false",
    ),
    (
        "tls_server_config:\n  cert: '-----BEGIN CERTIFICATE-----'\n",
        "tls_server_config.cert",
        "inline PEM is not supported",
    ),
    (
        "tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
        "tls_server_config.cipher_suites",
        "not supported by kvwatch",
    ),
    (
        "tls_server_config:\n  curve_preferences: [X25519]\n",
        "tls_server_config.curve_preferences",
        "not supported by kvwatch",
    ),
    (
        "tls_server_config:\n  client_allowed_sans: [a]\n",
        "tls_server_config.client_allowed_sans",
        "not supported by kvwatch",
    ),
    ("rate_limit:\n  interval: 1s\n  burst: 5\n", "rate_limit", "not supported by kvwatch"),
    ("http_server_config:\n  http2: sometimes\n", "http_server_config.http2", "must be true or false"),
    ("http_server_config:\n  headers: [X-Frame-Options]\n", "http_server_config.headers", "must be a mapping"),
    (
        "http_server_config:\n  headers:\n    Server: evil\n",
        "http_server_config.headers.Server",
        "can not be configured",
    ),
    (
        "http_server_config:\n  headers:\n    x-frame-options: deny\n",
        "http_server_config.headers.x-frame-options",
        "can not be configured",
    ),
    (
        "http_server_config:\n  headers:\n    X-Frame-Options: allow-from\n",
        "http_server_config.headers.X-Frame-Options",
        "must be one of deny, sameorigin",
    ),
    (
        "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
        "http_server_config.headers.X-Content-Type-Options",
        "must be one of nosniff",
    ),
    (
        "http_server_config:\n  headers:\n    Content-Security-Policy: 1\n",
        "http_server_config.headers.Content-Security-Policy",
        "must be a string",
    ),
    ("basic_auth_users: [alice]\n", "basic_auth_users", "must be a mapping"),
    ("basic_auth_users:\n  alice: plaintext-password\n", "basic_auth_users.alice", "not a bcrypt hash"),
    ("basic_auth_users:\n  alice: 12345\n", "basic_auth_users.alice", "not a bcrypt hash"),
    ("basic_auth_users:\n  alice: {h_cost3}\n", "basic_auth_users.alice", "bcrypt cost 3 is outside 4..31"),
    ("basic_auth_users:\n  '': {h}\n", "basic_auth_users", "must be a non-empty string"),
    ("basic_auth_users:\n  1: {h}\n", "basic_auth_users", "must be a non-empty string"),
]


@pytest.fixture(scope="module")
def files(pki, tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    encrypted = d / "encrypted.key"
    run_openssl(
        "pkey", "-in", str(pki["server"].key), "-aes256", "-passout", "pass:secret", "-out", str(encrypted), cwd=d
    )
    return {
        "cert": pki["server"].cert,
        "key": pki["server"].key,
        "other_key": pki["client"].key,
        "encrypted_key": encrypted,
        "ca": pki["ca"].cert,
        "h": pki["hash"],
        "h_cost3": "$2b$03$" + pki["hash"][7:],
    }


@pytest.mark.parametrize("text, where, says", BAD, ids=[f"{w or 'top'}:{s[:30]}" for _, w, s in BAD])
def test_a_bad_file_is_one_line_naming_the_file_and_the_field(text, where, says, files, tmp_path):
    path = write(tmp_path, text.format(**{k: str(v) for k, v in files.items()}))
    with pytest.raises(WebConfigError) as err:
        load(path)
    line = str(err.value)
    assert isinstance(err.value, ConfigError), "exits 2 through the CLI's ConfigError path"
    assert "\n" not in line, line
    assert line.startswith(f"invalid setting {SETTING}: {path}: " + (f"{where}: " if where else "")), line
    assert says in line, line
    assert files["h"] not in line and files["h"][7:] not in line, "a hash is a secret: never repeated"


def test_a_missing_unreadable_or_binary_file_is_one_line(tmp_path):
    for path, says in ((tmp_path / "absent.yml", "cannot read"), (tmp_path, "cannot read")):
        with pytest.raises(WebConfigError, match=says) as err:
            load(path)
        assert "\n" not in str(err.value)
    binary = tmp_path / "bin.yml"
    binary.write_bytes(b"\xff\xfe\x00tls")
    with pytest.raises(WebConfigError, match="not UTF-8 text"):
        load(binary)


def test_the_setting_refuses_a_path_that_is_not_a_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_settings(web_config_file=str(tmp_path / "absent.yml"))
    assert str(err.value).startswith(f"invalid setting {SETTING}:") and "is not a readable file" in str(err.value)


def test_good_files(pki, tmp_path):
    assert load(write(tmp_path, "")).tls is None
    empty = load(write(tmp_path, "# nothing but a comment\n"))
    assert (empty.tls, dict(empty.users), dict(empty.headers), empty.context) == (None, {}, {}, None)
    # min_version alone does not turn TLS on (the toolkit's rule), an empty unsupported list is no use of it
    assert load(write(tmp_path, "tls_server_config:\n  min_version: TLS13\n  cipher_suites: []\n")).tls is None
    path = tls_config(
        pki,
        tmp_path,
        extra=textwrap.dedent("""\
          client_auth_type: VerifyClientCertIfGiven
          client_ca_file: ca.crt
          min_version: TLS13
          prefer_server_cipher_suites: false
        http_server_config:
          http2: false
          headers:
            X-Frame-Options: sameorigin
            X-Content-Type-Options: nosniff
            Content-Security-Policy: default-src 'self'
            X-XSS-Protection: ""
        """),
    )
    (tmp_path / "ca.crt").write_bytes(pki["ca"].cert.read_bytes())
    cfg = load(path)
    assert cfg.tls is not None and cfg.context is not None
    assert cfg.tls.cert_file == tmp_path / "tls.crt", "relative to the file's directory, as the toolkit"
    assert cfg.tls.client_ca_file == tmp_path / "ca.crt"
    assert cfg.tls.min_version == ssl.TLSVersion.TLSv1_3 and cfg.tls.max_version == ssl.TLSVersion.TLSv1_3
    assert cfg.context.verify_mode == ssl.CERT_OPTIONAL
    assert not cfg.context.options & ssl.OP_CIPHER_SERVER_PREFERENCE
    assert dict(cfg.users) == {"prometheus": pki["hash"].encode()}
    assert dict(cfg.headers) == {
        "X-Frame-Options": "sameorigin",
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'self'",
    }, "blank: unset"
    assert cfg.http2 is False
    assert cfg.files() == (path, tmp_path / "tls.crt", tmp_path / "tls.key", tmp_path / "ca.crt")


@pytest.mark.parametrize(
    "auth, mode",
    [
        ("NoClientCert", ssl.CERT_NONE),
        ("RequestClientCert", ssl.CERT_NONE),
        ("VerifyClientCertIfGiven", ssl.CERT_OPTIONAL),
        ("RequireAndVerifyClientCert", ssl.CERT_REQUIRED),
    ],
)
def test_client_auth_types(auth, mode, pki, tmp_path):
    (tmp_path / "ca.crt").write_bytes(pki["ca"].cert.read_bytes())
    ca = "  client_ca_file: ca.crt\n" if mode != ssl.CERT_NONE else ""
    cfg = load(tls_config(pki, tmp_path, extra=f"  client_auth_type: {auth}\n{ca}"))
    assert cfg.context is not None and cfg.context.verify_mode == mode


# -- basic auth ----------------------------------------------------------------------------------------------


class Bcrypt:
    """``run`` for BasicAuth.check that records every bcrypt call (and runs it)."""

    def __init__(self):
        self.calls: list[bytes] = []

    async def __call__(self, f, password, hashed):
        self.calls.append(hashed)
        return f(password, hashed)


def basic(user: bytes | str, password: bytes | str) -> str:
    raw = (
        (user.encode() if isinstance(user, str) else user)
        + b":"
        + (password.encode() if isinstance(password, str) else password)
    )
    return "Basic " + base64.b64encode(raw).decode()


async def test_the_right_password_passes_once_checked_then_from_the_cache(pki):
    auth, run = BasicAuth({"prometheus": pki["hash"].encode()}), Bcrypt()
    assert await auth.check(basic("prometheus", PASSWORD), run)
    assert run.calls == [pki["hash"].encode()]
    assert await auth.check(basic("prometheus", PASSWORD), run) and len(run.calls) == 1, "cached"
    assert await auth.check("basic " + basic("prometheus", PASSWORD)[6:], run), "the scheme is case-insensitive"


async def test_a_wrong_password_or_an_unknown_user_always_costs_one_bcrypt_check_of_the_same_cost(pki):
    auth, run = BasicAuth({"prometheus": pki["hash"].encode()}), Bcrypt()
    for _ in range(2):
        assert not await auth.check(basic("prometheus", "wrong"), run)
    assert run.calls == [pki["hash"].encode()] * 2, "failures are never cached"
    for user in ("nobody", "Prometheus", "prometheus "):
        assert not await auth.check(basic(user, PASSWORD), run)
    decoys = run.calls[2:]
    assert len(decoys) == 3 and all(h != pki["hash"].encode() for h in decoys)
    assert {h[:7] for h in decoys} == {pki["hash"].encode()[:7]}, "the decoy has the configured cost"
    # > 72 bytes: bcrypt 5 refuses to truncate; a failure, still at bcrypt's cost
    assert not await auth.check(basic("prometheus", PASSWORD + b"x" * 80), run) and len(run.calls) == 6


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer abc",
        "Basic",
        "Basic !!!!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b"\xff\xfe:\x00\xff").decode(),
        "Basic " + "A" * 10000,
    ],
)
async def test_a_malformed_authorization_header_fails_without_an_error(header, pki):
    assert not await BasicAuth({"prometheus": pki["hash"].encode()}).check(header, Bcrypt())


async def test_the_cache_is_bounded():
    users = {f"u{i}": bcrypt.hashpw(f"p{i}".encode(), bcrypt.gensalt(4)) for i in range(CACHE_SIZE + 20)}
    auth, run = BasicAuth(users), Bcrypt()
    for i in range(CACHE_SIZE + 20):
        assert await auth.check(basic(f"u{i}", f"p{i}"), run)
    assert len(auth._ok) == CACHE_SIZE
    assert await auth.check(basic(f"u{CACHE_SIZE + 19}", f"p{CACHE_SIZE + 19}"), run)
    assert len(run.calls) == CACHE_SIZE + 20, "the newest stays cached"


# -- kvwatch's app, served over TLS on loopback --------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(watcher: WebConfigWatcher):
    """kvwatch's real app (its target is a closed port) with ``watcher``, on loopback; yields the port."""
    settings = load_settings(target=[f"http://127.0.0.1:{free_port()}/metrics"], interval=1.0)
    runner = web.AppRunner(make_app(Monitor(settings), watcher), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=watcher.ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with watcher.running():
            yield port
    finally:
        await runner.cleanup()


def client_context(pki, client: str | None = None, max_version=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"].cert))
    if client:
        ctx.load_cert_chain(pki[client].cert, pki[client].key)
    if max_version:
        ctx.maximum_version = max_version
    return ctx


def peer_serial(port: int, ctx: ssl.SSLContext) -> int:
    """A new TLS connection's server certificate serial (verified against the test CA)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return int(tls.getpeercert()["serialNumber"], 16)


async def test_probes_are_open_and_everything_else_needs_the_password(pki, tmp_path):
    watcher = WebConfigWatcher(
        tls_config(pki, tmp_path, extra="http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
    )
    async with serving(watcher) as port:
        base = f"https://127.0.0.1:{port}"
        async with httpx.AsyncClient(verify=client_context(pki), trust_env=False, timeout=10) as c:
            for path in ("/healthz", "/readyz"):
                r = await c.get(base + path)
                assert r.status_code == 200 and r.text == "ok\n", path
            for path in ("/", "/metrics", "/api/v1/diagnosis", "/no-such-page", "/healthz/", "/%68ealthz/../metrics"):
                r = await c.get(base + path)
                assert r.status_code == 401, path
                assert r.headers["WWW-Authenticate"] == "Basic" and PASSWORD.decode() not in r.text
            wrong = await c.get(base + "/metrics", auth=("prometheus", "nope"))
            assert wrong.status_code == 401
            ok = await c.get(base + "/metrics", auth=("prometheus", PASSWORD.decode()))
            assert ok.status_code == 200 and "kvwatch_up" in ok.text
            assert (await c.get(base + "/no-such-page", auth=("prometheus", PASSWORD.decode()))).status_code == 404
            for r in (ok, wrong):
                assert r.headers["X-Content-Type-Options"] == "nosniff", "the configured headers on every response"


async def test_plain_http_to_the_tls_port_fails_and_kvwatch_keeps_serving(pki, tmp_path, caplog):
    watcher = WebConfigWatcher(tls_config(pki, tmp_path, users=False))
    async with serving(watcher) as port:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as plain:
            with pytest.raises(httpx.TransportError):
                await plain.get(f"http://127.0.0.1:{port}/metrics")
        # junk bytes, then a client that hangs up mid-handshake
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x16\x03\x01\x00\x05hello", b""):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(junk)
            await writer.drain()
            writer.close()
        async with httpx.AsyncClient(verify=client_context(pki), trust_env=False, timeout=10) as c:
            assert (await c.get(f"https://127.0.0.1:{port}/metrics")).status_code == 200, "no users: no auth"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_client_certificates_and_tls_versions_are_enforced(pki, tmp_path):
    (tmp_path / "ca.crt").write_bytes(pki["ca"].cert.read_bytes())
    path = tls_config(
        pki,
        tmp_path,
        users=False,
        extra="  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  min_version: TLS13\n",
    )
    async with serving(WebConfigWatcher(path)) as port:
        assert await asyncio.to_thread(peer_serial, port, client_context(pki, "client")) == 1
        for ctx in (
            client_context(pki),
            client_context(pki, "stranger"),
            client_context(pki, "client", max_version=ssl.TLSVersion.TLSv1_2),
        ):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                # TLS 1.3 reports a refused client certificate on the first read, not in the handshake
                await asyncio.to_thread(lambda c=ctx: _get(port, c))


def _get(port: int, ctx: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = tls.recv(100)
            if not data:
                raise ConnectionError("closed")
            return data


# -- reload ---------------------------------------------------------------------------------------------------


async def test_reload_swaps_certificate_and_users_and_a_bad_file_keeps_the_old_ones(pki, tmp_path, caplog):
    path = tls_config(pki, tmp_path)
    watcher = WebConfigWatcher(path)
    async with serving(watcher) as port:
        ctx = client_context(pki)
        assert await asyncio.to_thread(peer_serial, port, ctx) == 1
        # rotate: new certificate and key, a new password
        (tmp_path / "tls.crt").write_bytes(pki["server2"].cert.read_bytes())
        (tmp_path / "tls.key").write_bytes(pki["server2"].key.read_bytes())
        assert watcher.changed(), "the certificate's files are watched, not only the web config"
        new_hash = bcrypt.hashpw(b"rotated", bcrypt.gensalt(4)).decode()
        path.write_text(path.read_text().replace(pki["hash"], new_hash))
        assert await watcher.reload("test")
        assert not watcher.changed()
        assert await asyncio.to_thread(peer_serial, port, ctx) == 2, "a new connection gets the new certificate"
        async with httpx.AsyncClient(verify=ctx, trust_env=False, timeout=10) as c:
            url = f"https://127.0.0.1:{port}/metrics"
            assert (await c.get(url, auth=("prometheus", "rotated"))).status_code == 200
            assert (await c.get(url, auth=("prometheus", PASSWORD.decode()))).status_code == 401

            # a bad file, a half-written key, TLS turned off: one error line each, the old config stays
            good = path.read_text()
            caplog.clear()
            for bad in (
                "tls_server_config: {cert_file: tls.crt, key_file: tls.key, min_version: TLS99}\n",
                f"basic_auth_users: {{prometheus: {new_hash}}}\n",
            ):
                path.write_text(bad)
                assert not await watcher.reload("test")
            path.write_text(good)
            (tmp_path / "tls.key").write_bytes(pki["server"].key.read_bytes())  # does not match tls.crt
            assert not await watcher.reload("test")
            errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert [len(r.getMessage().splitlines()) for r in errors] == [1, 1, 1]
            assert "tls_server_config.min_version" in errors[0].getMessage()
            assert "turning TLS on or off needs a restart" in errors[1].getMessage()
            assert "tls_server_config.key_file" in errors[2].getMessage()
            assert watcher.failed is not None
            assert not await watcher.reload("retry") and len(caplog.records) == len(errors), "said once"
            assert not await watcher.reload("SIGHUP") and len(caplog.records) == len(errors) + 1, "SIGHUP says"
            assert await asyncio.to_thread(peer_serial, port, ctx) == 2
            assert (await c.get(url, auth=("prometheus", "rotated"))).status_code == 200


async def test_the_poll_reloads_a_changed_file(pki, tmp_path):
    path = tls_config(pki, tmp_path)
    watcher = WebConfigWatcher(path, poll_seconds=0.05)
    async with serving(watcher) as port:
        (tmp_path / "tls.crt").write_bytes(pki["server2"].cert.read_bytes())
        (tmp_path / "tls.key").write_bytes(pki["server2"].key.read_bytes())
        async with asyncio.timeout(60):  # an upper bound for a loaded machine; it takes a few polls
            while watcher.reloads == 0:
                await asyncio.sleep(0.05)
        assert await asyncio.to_thread(peer_serial, port, client_context(pki)) == 2


def test_the_docs_example_file_loads_as_documented(pki, tmp_path):
    """docs/configuration.md's web-config.yml, with certificates where it names them, is what it says it is."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    start = readme.index("```yaml\n# web-config.yml\n") + len("```yaml\n")
    text = readme[start : readme.index("```", start)]
    (tmp_path / "server.crt").write_bytes(pki["server"].cert.read_bytes())
    (tmp_path / "server.key").write_bytes(pki["server"].key.read_bytes())
    cfg = load(write(tmp_path, text))
    assert cfg.tls is not None and cfg.tls.min_version == ssl.TLSVersion.TLSv1_2
    assert list(cfg.users) == ["prometheus"] and dict(cfg.headers) == {
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "deny",
    }
    # and its figures are the code's
    assert f"At most {MAX_PENDING} checks wait" in readme and f"(at most\n  {CACHE_SIZE}," in readme
    assert f"it names every {POLL_SECONDS:g} s" in readme


async def test_the_cache_survives_a_reload_but_never_a_changed_hash_or_a_removed_user(pki):
    users = {"prometheus": pki["hash"].encode()}
    first, run = BasicAuth(users), Bcrypt()
    assert await first.check(basic("prometheus", PASSWORD), run) and len(run.calls) == 1
    same = BasicAuth(dict(users), previous=first)
    assert await same.check(basic("prometheus", PASSWORD), run) and len(run.calls) == 1, "no bcrypt after a reload"
    changed = BasicAuth({"prometheus": bcrypt.hashpw(b"new", bcrypt.gensalt(4))}, previous=same)
    assert not await changed.check(basic("prometheus", PASSWORD), run) and len(run.calls) == 2
    removed = BasicAuth({"other": pki["hash"].encode()}, previous=same)
    assert not await removed.check(basic("prometheus", PASSWORD), run) and len(run.calls) == 3


async def test_a_flood_of_wrong_passwords_is_bounded_and_a_cached_client_never_waits(pki, tmp_path, monkeypatch):
    """While bcrypt is busy, at most MAX_PENDING checks wait; the others get 429 at once, and a client whose
    password is cached is served meanwhile."""
    import threading

    from kvwatch import webconfig

    watcher = WebConfigWatcher(tls_config(pki, tmp_path))
    async with serving(watcher) as port:
        url = f"https://127.0.0.1:{port}/metrics"
        good = ("prometheus", PASSWORD.decode())
        async with httpx.AsyncClient(
            verify=client_context(pki), trust_env=False, timeout=60, limits=httpx.Limits(max_connections=None)
        ) as c:
            assert (await c.get(url, auth=good)).status_code == 200  # now cached
            release = threading.Event()
            real = webconfig._checkpw
            monkeypatch.setattr(webconfig, "_checkpw", lambda pw, h: release.wait(60) and real(pw, h))
            flood = [
                asyncio.create_task(c.get(url, auth=("prometheus", f"guess{i}")))
                for i in range(webconfig.MAX_PENDING + 8)
            ]
            async with asyncio.timeout(60):
                while watcher.pending < webconfig.MAX_PENDING or sum(t.done() for t in flood) < 8:
                    await asyncio.sleep(0.02)
            assert watcher.pending == webconfig.MAX_PENDING
            refused = [t.result() for t in flood if t.done()]
            assert [r.status_code for r in refused] == [429] * 8 and refused[0].headers["Retry-After"] == "1"
            assert (await c.get(url, auth=good)).status_code == 200, "cached: not behind the queue"
            release.set()
            answered = await asyncio.gather(*flood)
            assert sorted(r.status_code for r in answered) == [401] * webconfig.MAX_PENDING + [429] * 8
            assert watcher.pending == 0


async def test_the_poll_retries_a_file_that_names_a_certificate_not_written_yet(pki, tmp_path, caplog):
    """cert-manager or an operator may update the web config before the files it names exist: the poll retries
    until they do, and says so once."""
    path = tls_config(pki, tmp_path)
    watcher = WebConfigWatcher(path, poll_seconds=0.05)
    async with serving(watcher) as port:
        path.write_text(path.read_text().replace("tls.crt", "next.crt").replace("tls.key", "next.key"))
        async with asyncio.timeout(60):
            while watcher.failed is None:
                await asyncio.sleep(0.05)
        assert "next.crt" in watcher.failed
        (tmp_path / "next.crt").write_bytes(pki["server2"].cert.read_bytes())
        (tmp_path / "next.key").write_bytes(pki["server2"].key.read_bytes())
        async with asyncio.timeout(60):
            while watcher.reloads == 0:
                await asyncio.sleep(0.05)
        assert await asyncio.to_thread(peer_serial, port, client_context(pki)) == 2
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len({r.getMessage() for r in errors}) == len(errors), "each problem said once, not at every poll"
