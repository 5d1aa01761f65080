"""``--web-config-file`` with the real programs: ``kvwatch run`` as a process serving HTTPS with basic auth, a real
Prometheus scraping it, a certificate rotated the way Kubernetes updates a mounted Secret, SIGHUP.

The CA and the certificates are made at test time with the openssl command line (tests/helpers/certs.py); the
upstream is a fake vLLM replaying a real vLLM 0.32 capture (tests/helpers/fake_vllm.py).
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
from pathlib import Path

import bcrypt
import httpx
import pytest

from tests.helpers.certs import Ca
from tests.helpers.fake_vllm import FakeVllm
from tests.helpers.ports import free_port
from tests.helpers.prometheus import Kvwatch, Prometheus
from tests.helpers.recordings import FIXTURES, recording

pytestmark = pytest.mark.slow

PASSWORD = "scrape-password-3141"


def bcrypt_hash(password: str, cost: int = 10) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


def web_config(path: Path, cert: str, key: str, password: str, extra: str = "") -> Path:
    path.write_text(
        textwrap.dedent(f"""\
        tls_server_config:
          cert_file: {cert}
          key_file: {key}
        basic_auth_users:
          prometheus: {bcrypt_hash(password)}
        """)
        + extra
    )
    return path


def peer_serial(port: int, ca: Path) -> int:
    """The serial of the certificate a new TLS connection is served (verified against ``ca``)."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return int(tls.getpeercert()["serialNumber"], 16)


def test_prometheus_scrapes_kvwatch_over_https_with_basic_auth(tmp_path):
    ca = Ca(tmp_path / "ca")
    leaf = ca.issue(tmp_path / "tls")
    web = web_config(tmp_path / "web.yml", str(leaf.cert), str(leaf.key), PASSWORD)
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD)
    args = ["run", "--interval", "1", "--web-config-file", str(web)]
    with (
        FakeVllm().replay(recording(FIXTURES / "kv_cache")) as vllm,
        Kvwatch([*args, "--target", vllm.url], tmp_path / "kvwatch", ca_file=ca.cert) as kv,
    ):
        with pytest.raises(httpx.TransportError):  # plain HTTP to the TLS port
            httpx.get(f"http://127.0.0.1:{kv.port}/metrics", timeout=10, trust_env=False)

        def job(name: str, scheme: str = "https", **extra):
            return {
                "job_name": name,
                "scheme": scheme,
                "static_configs": [{"targets": [f"127.0.0.1:{kv.port}"]}],
                **({"tls_config": {"ca_file": str(ca.cert)}} if scheme == "https" else {}),
                **extra,
            }

        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
            "scrape_configs": [
                job("kvwatch", basic_auth={"username": "prometheus", "password_file": str(password_file)}),
                job("wrong-password", basic_auth={"username": "prometheus", "password": "not-it"}),
                job("no-credentials"),
                job("plain-http", scheme="http", basic_auth={"username": "prometheus", "password": PASSWORD}),
            ],
        }
        with Prometheus(config, tmp_path / "prometheus") as prom:

            def scraped():
                targets = {t["labels"]["job"]: t for t in prom.targets()}
                done = len(targets) == 4 and all(t["health"] != "unknown" for t in targets.values())
                return targets if done and targets["kvwatch"]["health"] == "up" else None

            targets = prom.wait_for(scraped, timeout=120, what="every job scraped, kvwatch's up")
            # a later scrape may time out on a starved machine: up was 1 at the health check, wait for it again
            prom.wait_for(lambda: prom.value('up{job="kvwatch"}') == 1, timeout=30, what='up{job="kvwatch"} 1')
            for name in ("wrong-password", "no-credentials"):
                assert targets[name]["health"] == "down"
                assert "401" in targets[name]["lastError"], targets[name]["lastError"]
                assert prom.value(f'up{{job="{name}"}}') == 0
            assert targets["plain-http"]["health"] == "down" and targets["plain-http"]["lastError"]
            assert prom.value('up{job="plain-http"}') == 0
            # and what came through TLS is kvwatch's diagnosis of the replayed vLLM
            prom.wait_for(lambda: prom.value('kvwatch_up{job="kvwatch"}') == 1, timeout=60, what="kvwatch_up 1")
        log = kv.log_path.read_text()
    assert PASSWORD not in log and "not-it" not in log
    assert "Traceback" not in log and " ERROR " not in log, log


def _k8s_secret_dir(root: Path, version: int, leaf) -> None:
    """Lay out (or update) ``root`` the way the kubelet writes a mounted Secret: the files are symlinks into
    ``..data``, itself a symlink to a timestamped directory swapped atomically on update."""
    data = root / f"..v{version}"
    data.mkdir(parents=True)
    (data / "tls.crt").write_bytes(leaf.cert.read_bytes())
    (data / "tls.key").write_bytes(leaf.key.read_bytes())
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (root / name).is_symlink():
            (root / name).symlink_to(f"..data/{name}")


def test_a_rotated_certificate_is_served_without_a_restart_and_sighup_reloads(tmp_path):
    ca = Ca(tmp_path / "ca")
    secret = tmp_path / "secret"
    _k8s_secret_dir(secret, 1, ca.issue(tmp_path / "v1", serial=1))
    web = web_config(tmp_path / "web.yml", "secret/tls.crt", "secret/tls.key", PASSWORD)  # relative to web.yml
    args = ["run", "--interval", "1", "--target", f"http://127.0.0.1:{free_port()}/metrics"]
    with Kvwatch(args, tmp_path / "kvwatch", env={"KVWATCH_WEB_CONFIG_FILE": str(web)}, ca_file=ca.cert) as kv:
        pid = kv.pid
        assert peer_serial(kv.port, ca.cert) == 1

        def log_has(text: str) -> bool:
            return text in kv.log_path.read_text()

        # 1. the Secret is updated: the poll sees the swapped files, new connections get the new certificate
        _k8s_secret_dir(secret, 2, ca.issue(tmp_path / "v2", serial=2))
        kv.wait_until(lambda: peer_serial(kv.port, ca.cert) == 2, timeout=60, what="the rotated certificate")
        assert kv.pid == pid and log_has("reloaded (file changed)")

        # 2. SIGHUP reloads at once, and does not end kvwatch (its default action would)
        os.kill(pid, signal.SIGHUP)
        kv.wait_until(lambda: log_has("reloaded (SIGHUP)"), timeout=60, what="the SIGHUP reload")

        # 3. a bad file: one error line, kvwatch keeps serving the previous configuration
        good = web.read_text()
        web.write_text(good + "rate_limit: {interval: 1s, burst: 1}\n")
        kv.wait_until(lambda: log_has("web config not reloaded"), timeout=60, what="the refused reload")
        auth = ("prometheus", PASSWORD)
        assert kv._http.get(kv.url + "/metrics", auth=auth).status_code == 200
        assert peer_serial(kv.port, ca.cert) == 2

        # 4. a new password, picked up without a restart
        web_config(web, "secret/tls.crt", "secret/tls.key", "new-password")
        kv.wait_until(
            lambda: kv._http.get(kv.url + "/metrics", auth=("prometheus", "new-password")).status_code == 200,
            timeout=60,
            what="the new password",
        )
        assert kv._http.get(kv.url + "/metrics", auth=auth).status_code == 401
        assert kv.pid == pid and kv.running()
        log = kv.log_path.read_text()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert errors and all("rate_limit: not supported by kvwatch" in line for line in errors), errors
    assert "Traceback" not in log


@pytest.mark.parametrize(
    "case, says",
    [
        ("missing", ["is not a readable file"]),
        ("unknown field", ["tls_server_config.cert_fle: unknown field"]),
        ("key of another certificate", ["tls_server_config.key_file: ", "does not match cert_file"]),
    ],
)
def test_a_bad_web_config_exits_2_with_one_line(case, says, tmp_path):
    ca = Ca(tmp_path / "ca")
    a, b = ca.issue(tmp_path / "a"), ca.issue(tmp_path / "b")
    web = tmp_path / "web.yml"
    if case == "unknown field":
        web.write_text(f"tls_server_config:\n  cert_fle: {a.cert}\n  key_file: {a.key}\n")
    elif case == "key of another certificate":
        web_config(web, str(a.cert), str(b.key), PASSWORD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVWATCH_")}
    env["KVWATCH_WEB_CONFIG_FILE"] = str(web)
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "kvwatch", "run", "--listen", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvwatch run: error: invalid setting --web-config-file (env KVWATCH_WEB_CONFIG_FILE): ")
    assert str(web) in lines[0] and all(s in lines[0] for s in says), lines[0]
    with pytest.raises(OSError):  # nothing was left listening
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
