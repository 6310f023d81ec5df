"""Certificates and keys of a test cluster, made with the openssl command: one CA, the API
server's serving certificate (its addresses and the ``kubernetes`` Service's names), and the
service-account signing key pair. Nothing here is for production use."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"openssl {args[0]}: {out.stderr.strip()}")


@dataclass(frozen=True)
class PKI:
    dir: Path

    @property
    def ca_crt(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca.key"

    @property
    def apiserver_crt(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.dir / "sa.pub"


def make(directory: Path, *, ips: list[str], dns: list[str]) -> PKI:
    """A CA and the API server's certificate for ``ips`` and ``dns`` names, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    p = PKI(directory)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "3",
        "-subj", "/CN=koordtest-ca", "-out", "ca.crt", cwd=directory,
    )  # fmt: skip
    _openssl(
        "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "apiserver.key",
        cwd=directory,
    )  # fmt: skip
    _openssl(
        "req", "-new", "-key", "apiserver.key", "-subj", "/CN=kube-apiserver",
        "-out", "apiserver.csr", cwd=directory,
    )  # fmt: skip
    san = ",".join([f"IP:{ip}" for ip in ips] + [f"DNS:{name}" for name in dns])
    (directory / "ext.cnf").write_text(
        f"subjectAltName={san}\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-days", "3", "-sha256", "-extfile", "ext.cnf",
        "-out", "apiserver.crt", cwd=directory,
    )  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return p
