"""Certificates made at test time with the ``openssl`` command line (no key or certificate is committed).

    ca = Ca(tmp_path / "ca")                          # ca.cert, ca.key: a self-signed CA (EC P-256)
    leaf = ca.issue(tmp_path / "srv", serial=2)       # leaf.cert, leaf.key; SAN IP:127.0.0.1, serverAuth
    ca.issue(tmp_path / "k8s", dns=("kvwatch",))      # SAN IP:127.0.0.1 and DNS:kvwatch
    client = ca.issue(tmp_path / "cli", client=True)  # clientAuth
    serial_of(pem_bytes)                              # the serial number, as int

EC keys: generating one takes milliseconds, so every test can have its own.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Ca", "Leaf", "openssl", "run_openssl", "serial_of"]


def openssl() -> str:
    path = shutil.which("openssl")
    if not path:
        raise RuntimeError("the openssl command line is not installed (Debian: apt-get install openssl)")
    return path


def run_openssl(*args: str, cwd: Path) -> str:
    proc = subprocess.run([openssl(), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr}")
    return proc.stdout


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path
    serial: int


class Ca:
    def __init__(self, directory: Path | str, name: str = "kvwatch test CA"):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert, self.key = self.dir / "ca.crt", self.dir / "ca.key"
        run_openssl(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(self.key),
            "-out",
            str(self.cert),
            "-days",
            "2",
            "-subj",
            f"/CN={name}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            cwd=self.dir,
        )

    def issue(
        self,
        directory: Path | str,
        cn: str = "kvwatch",
        serial: int = 1,
        client: bool = False,
        ip: str = "127.0.0.1",
        dns: tuple[str, ...] = (),
    ) -> Leaf:
        """A key and a certificate signed by this CA, for ``ip`` and the names ``dns`` (server) or a client,
        with ``serial``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        key, csr, cert, ext = d / "tls.key", d / "tls.csr", d / "tls.crt", d / "ext.cnf"
        usage = "clientAuth" if client else "serverAuth"
        ext.write_text(
            f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            f"extendedKeyUsage={usage}\nsubjectAltName={','.join([f'IP:{ip}', *(f'DNS:{d}' for d in dns)])}\n"
        )
        run_openssl(
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(csr),
            "-subj",
            f"/CN={cn}",
            cwd=d,
        )
        run_openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(self.cert),
            "-CAkey",
            str(self.key),
            "-set_serial",
            str(serial),
            "-days",
            "2",
            "-extfile",
            str(ext),
            "-out",
            str(cert),
            cwd=d,
        )
        return Leaf(cert, key, serial)


def serial_of(pem: bytes | str, cwd: Path | str = ".") -> int:
    """The serial number of a PEM certificate (``openssl x509 -serial``)."""
    text = pem.decode() if isinstance(pem, bytes) else pem
    proc = subprocess.run(
        [openssl(), "x509", "-noout", "-serial"], input=text, capture_output=True, text=True, timeout=60, cwd=cwd
    )
    if proc.returncode != 0:
        raise RuntimeError(f"openssl x509 -serial failed: {proc.stderr}")
    return int(proc.stdout.strip().partition("=")[2], 16)
