"""``--web-config-file``: TLS and basic auth on kvwatch's own port, from the Prometheus exporter-toolkit's file.

The file is the one node_exporter and every exporter built on prometheus/exporter-toolkit read
(docs/web-configuration.md there), read as strictly as the toolkit reads it (``yaml.UnmarshalStrict``): an
unknown field, a duplicate key or a value of the wrong type is an error that names the field, relative paths are
relative to the file's directory, and the certificate and key are loaded up front, so a file that cannot serve
stops kvwatch at start (exit 2, one line) instead of failing the first handshake.

- ``tls_server_config``: ``cert_file`` + ``key_file`` (both or neither), ``client_auth_type``, ``client_ca_file``,
  ``min_version`` / ``max_version`` (``TLS10`` .. ``TLS13``; default TLS12 .. TLS13),
  ``prefer_server_cipher_suites``. TLS is on when any of cert_file, key_file, client_ca_file or client_auth_type
  is set (the toolkit's rule).
- ``basic_auth_users``: user -> bcrypt hash. Checked with ``bcrypt.checkpw`` in one worker thread (bcrypt is
  slow on purpose and must not stall the scrape loops); an unknown user is checked against a decoy hash of the
  same cost, and the user name is compared with ``hmac.compare_digest``, so timing does not tell which users
  exist. Successful checks are cached (keyed by an HMAC of user, hash and password under a per-process key,
  never the password itself), as the toolkit caches them, so a scraping Prometheus costs one bcrypt check per
  password; beyond ``MAX_PENDING`` checks waiting, a request that needs one gets 429 at once.
- ``http_server_config.headers``: only the headers the toolkit allows, with its allowed values.

What the toolkit's format has and kvwatch cannot do the same way is refused with a line saying so, never
silently ignored: inline PEM (``cert``, ``key``, ``client_ca``), ``cipher_suites`` and ``curve_preferences``
(Go names), ``client_allowed_sans``, ``rate_limit``, and ``client_auth_type: RequireAnyClientCert`` (Python's
ssl verifies every certificate it requires). ``RequestClientCert`` admits every client, as it does in Go:
kvwatch just does not ask for the certificate, which nothing would read. ``http2`` is accepted; kvwatch
serves HTTP/1.1 (aiohttp).

The file (and the certificate, key and CA files it names) is re-read when it changes (polled every
``POLL_SECONDS``) and on SIGHUP: new connections get the new certificate through an SNI callback that hands
each handshake the newest context, so a rotated certificate needs no restart. A bad file at reload keeps the
previous configuration and logs one error line; the poll retries it (quietly) until it loads.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import re
import signal
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml
from aiohttp import web

from kvwatch.config import ConfigError

__all__ = [
    "MAX_PENDING",
    "POLL_SECONDS",
    "BasicAuth",
    "TlsConfig",
    "WebConfig",
    "WebConfigError",
    "WebConfigWatcher",
    "load",
]

log = logging.getLogger("kvwatch")

POLL_SECONDS = 3.0  # how often the files' stat is compared (Kubernetes takes ~1 min to update a Secret anyway)
SETTING = "--web-config-file (env KVWATCH_WEB_CONFIG_FILE)"
UNAUTHENTICATED = frozenset({"/healthz", "/readyz"})  # kubelet probes send no credentials
CACHE_SIZE = 100  # the toolkit's
# bcrypt checks waiting for the one worker: beyond this a request gets 429 at once, so a flood of wrong passwords
# holds a bounded queue (a few seconds of bcrypt) and a client whose password is cached never waits behind it.
MAX_PENDING = 32

TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# client_auth_type -> what Python's ssl can do with the same effect on who is let in.
CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,  # Go asks but neither requires nor verifies: every client gets in
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
REQUIRE_ANY = ("RequireAnyClientCert", "RequireClientCert")  # the second: the toolkit's old name
# The toolkit's extraHTTPHeaders: which headers may be set, and the allowed values where they are an enumeration.
HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
FIELDS = {
    "": {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"},
    "tls_server_config": {
        "cert_file",
        "key_file",
        "client_auth_type",
        "client_ca_file",
        "min_version",
        "max_version",
        "prefer_server_cipher_suites",
        "cert",
        "key",
        "client_ca",
        "cipher_suites",
        "curve_preferences",
        "client_allowed_sans",
    },
    "http_server_config": {"http2", "headers"},
}
UNSUPPORTED = {
    "tls_server_config.cert": "inline PEM is not supported by kvwatch: put it in a file and use cert_file",
    "tls_server_config.key": "inline PEM is not supported by kvwatch: put it in a file and use key_file",
    "tls_server_config.client_ca": "inline PEM is not supported by kvwatch: use client_ca_file",
    "tls_server_config.cipher_suites": "not supported by kvwatch (Go cipher names): remove it for OpenSSL's defaults",
    "tls_server_config.curve_preferences": "not supported by kvwatch: remove it for OpenSSL's defaults",
    "tls_server_config.client_allowed_sans": "not supported by kvwatch: use a client CA that issues only to them",
    "rate_limit": "not supported by kvwatch: remove it",
}
BCRYPT_HASH = re.compile(r"\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}")
# Checked when the user is unknown, so that an unknown user costs as much as a wrong password (the toolkit
# does the same): a hash of a random string, at the cost of the configured hashes.
DECOY_TAIL = b"hE/I0GA0PlW9hDq5Bm1xfOO5hTRXXPoqVbb1Ystyq6gaDQinNian2"


class WebConfigError(ConfigError):
    """``str()``: the one line kvwatch exits with; ``detail``: the same without the setting, for the log."""

    def __init__(self, path: Path, where: str, problem: str):
        self.detail = f"{path}: {where + ': ' if where else ''}{problem}"
        super().__init__(f"invalid setting {SETTING}: {self.detail}")


class _Busy(Exception):
    """Too many bcrypt checks pending."""


class _Problem(Exception):
    def __init__(self, where: str, problem: str):
        super().__init__(problem)
        self.where, self.problem = where, problem


# ---------------------------------------------------------------------------------------------- parsing


class _StrictLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys; Go's strict YAML refuses them, and so do we."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: PyYAML's own error says so
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _yaml(text: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise _Problem("", f"not valid YAML ({at}{e.problem or e.context})") from None
    except yaml.YAMLError as e:
        raise _Problem("", f"not valid YAML ({' '.join(str(e).split())})") from None


def _known(value: Any, name: str) -> dict:
    """``value`` (the section ``name``; "" for the top level) as a mapping of known, supported fields."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Problem(name, "must be a mapping" if name else "the top level must be a mapping")
    for key, v in value.items():
        where = f"{name}.{key}" if name else str(key)
        if key not in FIELDS[name]:
            raise _Problem(where, "unknown field (see the exporter-toolkit's docs/web-configuration.md)")
        if where in UNSUPPORTED and v not in (None, "", [], {}):
            raise _Problem(where, UNSUPPORTED[where])
    return value


def _section(doc: dict, name: str) -> dict:
    return _known(doc.get(name), name)


def _string(section: dict, key: str, where: str) -> str:
    value = section.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Problem(f"{where}.{key}", f"must be a string, not {type(value).__name__}")
    return value


def _boolean(section: dict, key: str, where: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise _Problem(f"{where}.{key}", "must be true or false")
    return value


def _version(section: dict, key: str, default: str) -> ssl.TLSVersion:
    name = _string(section, key, "tls_server_config") or default
    if name not in TLS_VERSIONS:
        raise _Problem(f"tls_server_config.{key}", f"unknown TLS version {name!r} (one of {', '.join(TLS_VERSIONS)})")
    return TLS_VERSIONS[name]


def _users(doc: dict) -> dict[str, bytes]:
    raw = doc.get("basic_auth_users")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _Problem("basic_auth_users", "must be a mapping of user name to bcrypt hash")
    users = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user:
            raise _Problem("basic_auth_users", f"user name {user!r} must be a non-empty string")
        where = f"basic_auth_users.{user}"
        match = BCRYPT_HASH.fullmatch(hashed) if isinstance(hashed, str) else None
        if match is None:  # the value is a secret: never repeat it
            raise _Problem(where, "not a bcrypt hash (make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)")
        if not 4 <= int(match[1]) <= 31:
            raise _Problem(where, f"bcrypt cost {int(match[1])} is outside 4..31")
        users[user] = hashed.encode()
    return users


def _headers(doc: dict) -> dict[str, str]:
    raw = _section(doc, "http_server_config").get("headers")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _Problem("http_server_config.headers", "must be a mapping of header name to value")
    headers = {}
    for name, value in raw.items():
        where = f"http_server_config.headers.{name}"
        if name not in HEADERS:
            raise _Problem(where, f"this header can not be configured (only {', '.join(HEADERS)})")
        if not isinstance(value, str):
            raise _Problem(where, "must be a string")
        if HEADERS[name] and value not in HEADERS[name]:
            raise _Problem(where, f"must be one of {', '.join(HEADERS[name])}, not {value!r}")
        if value:  # the toolkit's "unset if blank"
            headers[name] = value
    return headers


# ------------------------------------------------------------------------------------------------- TLS


def _no_password() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal for an encrypted key's passphrase.
    raise _Problem("tls_server_config.key_file", "the key is encrypted: kvwatch needs it unencrypted, as the toolkit")


def _why(e: Exception) -> str:
    """An OpenSSL error without Python's source location: ``[X509: KEY_VALUES_MISMATCH] key values mismatch``."""
    return re.sub(r" \(_ssl\.c:\d+\)$", "", str(e))


def _read(path: Path, where: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise _Problem(where, f"cannot read {str(path)!r}: {e.strerror or e}") from None


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str
    client_ca_file: Path | None
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion
    prefer_server_cipher_suites: bool

    def files(self) -> tuple[Path, ...]:
        return (self.cert_file, self.key_file) + ((self.client_ca_file,) if self.client_ca_file else ())

    def apply(self, ctx: ssl.SSLContext) -> None:
        """What a connection takes from the listener's context (OpenSSL copies it when the connection is made,
        before the SNI callback can swap contexts): versions, client-certificate mode, options."""
        ctx.minimum_version, ctx.maximum_version = self.min_version, self.max_version
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        if self.prefer_server_cipher_suites:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        else:
            ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE

    def context(self) -> ssl.SSLContext:
        """A fresh server context with the certificate, key and client CAs loaded; ``_Problem`` naming the field."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.apply(ctx)
        cert = _read(self.cert_file, "tls_server_config.cert_file")
        _read(self.key_file, "tls_server_config.key_file")
        try:  # parses every certificate of the chain: a bad cert_file is told apart from a bad key_file
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=cert.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as e:
            raise _Problem(
                "tls_server_config.cert_file", f"no PEM certificate in {str(self.cert_file)!r} ({_why(e)})"
            ) from None
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file, password=_no_password)
        except ssl.SSLError as e:
            what = "does not match cert_file" if e.reason == "KEY_VALUES_MISMATCH" else "is not a PEM private key"
            raise _Problem("tls_server_config.key_file", f"{str(self.key_file)!r} {what} ({_why(e)})") from None
        if self.client_ca_file is not None:
            _read(self.client_ca_file, "tls_server_config.client_ca_file")
            try:
                ctx.load_verify_locations(self.client_ca_file)
            except ssl.SSLError as e:
                raise _Problem("tls_server_config.client_ca_file", f"no PEM certificate in it ({_why(e)})") from None
        elif ctx.verify_mode != ssl.CERT_NONE:  # as Go: no client CAs given, verify against the system's
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
        return ctx


def _tls(doc: dict, directory: Path) -> TlsConfig | None:
    section = _section(doc, "tls_server_config")
    where = "tls_server_config"
    paths = {k: _string(section, k, where) for k in ("cert_file", "key_file", "client_ca_file")}
    auth = _string(section, "client_auth_type", where)
    versions = (_version(section, "min_version", "TLS12"), _version(section, "max_version", "TLS13"))
    prefer = _boolean(section, "prefer_server_cipher_suites", where, True)
    if not any(paths.values()) and not auth:
        return None  # the toolkit's rule: none of these set, no TLS
    for name, other in (("cert_file", "key_file"), ("key_file", "cert_file")):
        if not paths[name]:
            given = f" ({other} is set)" if paths[other] else ""
            raise _Problem(f"{where}.{name}", f"missing: TLS needs cert_file and key_file{given}")
    if auth in REQUIRE_ANY:
        raise _Problem(
            f"{where}.client_auth_type",
            f"{auth} (a certificate nobody verifies) cannot be enforced by Python's ssl: "
            "use RequireAndVerifyClientCert with client_ca_file",
        )
    if auth not in CLIENT_AUTH:
        choices = "NoClientCert, RequestClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
        raise _Problem(f"{where}.client_auth_type", f"unknown value {auth!r} (one of {choices})")
    if paths["client_ca_file"] and CLIENT_AUTH[auth] == ssl.CERT_NONE and auth != "RequestClientCert":
        raise _Problem(f"{where}.client_ca_file", "client CAs are configured without a client_auth_type that verifies")
    if versions[0] > versions[1]:
        raise _Problem(f"{where}.min_version", "is above max_version: no TLS version is left")
    ca = directory / paths["client_ca_file"] if paths["client_ca_file"] else None
    cert, key = directory / paths["cert_file"], directory / paths["key_file"]
    return TlsConfig(cert, key, auth or "NoClientCert", ca, versions[0], versions[1], prefer)


# --------------------------------------------------------------------------------------------- the file


@dataclass(frozen=True)
class WebConfig:
    path: Path
    tls: TlsConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    http2: bool = True
    context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)  # the loaded TLS context

    def files(self) -> tuple[Path, ...]:
        """Every file whose change means a reload: this one and those it names."""
        return (self.path,) + (self.tls.files() if self.tls else ())

    def summary(self) -> str:
        tls = f"TLS on ({self.tls.client_auth_type})" if self.tls else "TLS off"
        return f"{tls}, basic auth {'for ' + str(len(self.users)) + ' user(s)' if self.users else 'off'}"


def _parse(path: Path) -> WebConfig:
    raw = _read(path, "")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _Problem("", "not UTF-8 text") from None
    doc = _known(_yaml(text), "")
    http = _section(doc, "http_server_config")
    http2 = _boolean(http, "http2", "http_server_config", True)
    tls = _tls(doc, path.parent)
    return WebConfig(path, tls, _users(doc), _headers(doc), http2, tls.context() if tls else None)


def load(path: Path | str) -> WebConfig:
    """Parse ``path`` and load what it names; ``WebConfigError`` (one line, naming the field) if it cannot serve."""
    path = Path(path)
    try:
        return _parse(path)
    except _Problem as p:
        raise WebConfigError(path, p.where, p.problem) from None


def _stat(paths: tuple[Path, ...]) -> tuple:
    """What tells a changed file: Kubernetes swaps a Secret's files by symlink (new inode); editors rewrite."""
    out: list[tuple[int, int, int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append(None)
    return tuple(out)


# ------------------------------------------------------------------------------------------- basic auth


class BasicAuth:
    """The ``basic_auth_users`` check (see the module doc for why each step)."""

    def __init__(self, users: Mapping[str, bytes], previous: BasicAuth | None = None):
        self._users = [(hashlib.sha256(u.encode()).digest(), h) for u, h in users.items()]
        cost = max((int(h[4:6]) for _, h in self._users), default=10)
        self._decoy = b"$2b$%02d$" % cost + DECOY_TAIL
        # Kept across reloads: an entry names user, hash and password, so it only ever matches while the file
        # still gives that user that hash (a changed hash or a removed user never hits an old entry).
        self._key: bytes = previous._key if previous else os.urandom(32)
        self._ok: OrderedDict[bytes, None] = previous._ok if previous else OrderedDict()

    def __bool__(self) -> bool:
        return bool(self._users)

    def _hash_of(self, user: bytes) -> bytes | None:
        """The user's hash, after comparing the name with every user's (no early exit, constant-time compares
        of equal-length digests)."""
        digest = hashlib.sha256(user).digest()
        found = None
        for name, hashed in self._users:
            if hmac.compare_digest(digest, name):
                found = hashed
        return found

    async def check(self, authorization: str | None, run: Callable[..., Awaitable[bool]]) -> bool:
        """Whether the ``Authorization`` header holds a configured user and password. ``run(f, *args)`` runs
        bcrypt off the event loop."""
        credentials = _basic(authorization)
        if credentials is None:
            return False
        user, password = credentials
        hashed = self._hash_of(user)
        key = hmac.digest(self._key, b"\0".join((user, hashed or b"", password)), "sha256")
        if hashed is not None and key in self._ok:
            return True
        if len(password) > 72:  # bcrypt 5 refuses to truncate: a wrong password, at the same cost
            await run(_checkpw, b"", self._decoy)
            return False
        ok = await run(_checkpw, password, hashed or self._decoy) and hashed is not None
        if ok:
            self._ok[key] = None
            while len(self._ok) > CACHE_SIZE:
                self._ok.popitem(last=False)
        return ok


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a hash the regular expression let through but bcrypt refuses: no match
        return False


def _basic(header: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) of an ``Authorization: Basic`` header, or None for anything else."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, colon, password = decoded.partition(b":")
    return (user, password) if colon else None


# ------------------------------------------------------------------------------------------ the watcher


class WebConfigWatcher:
    """The web config kvwatch serves with, kept current: ``middleware`` (basic auth), ``add_headers`` (the
    response headers), ``ssl_context`` (the listener's, or None); ``async with running()`` while serving polls
    the files (``watch()``) and reloads on SIGHUP (``reload()``)."""

    def __init__(self, path: Path | str, poll_seconds: float = POLL_SECONDS):
        self.path = Path(path)
        self.poll_seconds = poll_seconds
        self.current = load(self.path)  # WebConfigError: kvwatch does not start
        self._signature = _stat(self.current.files())
        self.auth = BasicAuth(self.current.users)
        self._bcrypt = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvwatch-bcrypt")  # one at a time
        self._lock = asyncio.Lock()
        self.pending = 0  # bcrypt checks queued or running
        self.failed: str | None = None  # the last reload's problem, until one succeeds
        self.reloads = 0  # successful reloads (tests wait on it)
        self.ssl_context: ssl.SSLContext | None = None
        if self.current.context is not None:
            self.ssl_context = self.current.context
            self.ssl_context.sni_callback = self._sni

    def _sni(self, sslobj: ssl.SSLObject, server_name: str | None, ctx: ssl.SSLContext) -> None:
        # Called for every handshake (with or without SNI): the newest certificate, key and client CAs.
        if self.current.context is not None and self.current.context is not ctx:
            sslobj.context = self.current.context

    async def reload(self, why: str = "SIGHUP") -> bool:
        """Re-read the file; on any problem keep the current configuration and log one error line (once per
        problem: the poll retries a failed file, which may name files that do not exist yet, without repeating it;
        a SIGHUP always says)."""
        async with self._lock:
            self._signature = _stat(self.current.files())
            try:
                new = await asyncio.to_thread(load, self.path)
                if (new.tls is None) != (self.current.tls is None):
                    raise WebConfigError(self.path, "tls_server_config", "turning TLS on or off needs a restart")
            except WebConfigError as e:
                problem = e.detail
            except Exception as e:  # noqa: BLE001 - a reload must never take kvwatch down
                problem = repr(e)
            else:
                if new.tls is not None and self.ssl_context is not None:
                    new.tls.apply(self.ssl_context)
                self.current, self.auth = new, BasicAuth(new.users, previous=self.auth)
                self._signature, self.failed = _stat(new.files()), None
                self.reloads += 1
                log.info("web config %s reloaded (%s): %s", self.path, why, new.summary())
                return True
            if why == "SIGHUP" or problem != self.failed:
                log.error("web config not reloaded (%s), keeping the previous one: %s", why, problem)
            self.failed = problem
            return False

    def changed(self) -> bool:
        return _stat(self.current.files()) != self._signature

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            if self.changed():
                await self.reload("file changed")
            elif self.failed is not None:
                await self.reload("retry")

    async def _run(self, f: Callable[..., bool], *args: Any) -> bool:
        if self.pending >= MAX_PENDING:
            raise _Busy
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._bcrypt, f, *args)
        finally:
            self.pending -= 1

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        auth = self.auth
        if auth and _route_path(request) not in UNAUTHENTICATED:
            # Responses are returned, not raised: the outer middlewares (the Server header) still see them.
            try:
                ok = await auth.check(request.headers.get("Authorization"), self._run)
            except _Busy:
                return web.Response(status=429, text="Too Many Requests\n", headers={"Retry-After": "1"})
            if not ok:
                return web.Response(status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Basic"})
        return await handler(request)

    async def add_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        for name, value in self.current.headers.items():
            response.headers[name] = value

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """While serving: poll the files, reload on SIGHUP; then stop both and the bcrypt thread."""
        log.info("web config %s: %s", self.path, self.current.summary())
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task] = {asyncio.create_task(self.watch(), name="web config watch")}

        def on_sighup() -> None:
            task = asyncio.create_task(self.reload("SIGHUP"))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # no signals off the main thread
            loop.add_signal_handler(signal.SIGHUP, on_sighup)
        try:
            yield
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)
            pending = list(tasks)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            self._bcrypt.shutdown(wait=False, cancel_futures=True)


def _route_path(request: web.Request) -> str | None:
    """The path of the route that serves the request: only the probe routes themselves go unauthenticated,
    whatever spelling of the path reached them."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else None
