"""Serving certificates of the webhook: the self-managed fallback.

With cert-manager (the documented path, ``packaging/kubernetes/manager/webhook-certmanager.yaml``)
the Secret is mounted and the caBundle injected by cert-manager; nothing here runs. Without it,
:func:`ensure_certificates` makes a self-signed CA and a serving certificate for the Service's DNS
names in a directory (reused while valid for more than ``renew_before_days``), and
:func:`inject_ca_bundle` writes the CA into the ``clientConfig.caBundle`` of the webhook
configurations, as upstream's self-managed webhook controller does.

Keys are ECDSA P-256 made with the ``openssl`` command (3.x): the ``cryptography`` package is not
part of this project's environment. Files are written ``0600`` and replaced atomically.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kubeclient.client import KubeClient
from kubeclient.errors import ApiError, NotFound
from kubeclient.resources import Resource

logger = logging.getLogger(__name__)

MUTATING_CONFIGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
VALIDATING_CONFIGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)


class CertificateError(RuntimeError):
    """The certificates could not be made (no ``openssl``, or it failed)."""


@dataclass(frozen=True, slots=True)
class CertPaths:
    """Where the PEM files are."""

    ca_cert: Path
    """The CA certificate (the caBundle)."""
    cert: Path
    """The serving certificate (``tls.crt``)."""
    key: Path
    """Its private key (``tls.key``)."""


def dns_names(service: str, namespace: str) -> list[str]:
    """The names the API server may use to reach the Service."""
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _openssl(*args: str, cwd: Path) -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise CertificateError("openssl not found: install it or use cert-manager")
    proc = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {proc.stderr.strip()[:500]}")
    return proc.stdout


def not_after(cert: Path) -> datetime:
    """The expiry of a PEM certificate."""
    out = _openssl("x509", "-in", str(cert), "-noout", "-enddate", cwd=cert.parent)
    text = out.strip().split("=", 1)[1]
    return datetime.strptime(text, "%b %d %H:%M:%S %Y %Z").replace(tzinfo=UTC)


def ensure_certificates(
    directory: Path,
    *,
    service: str,
    namespace: str,
    extra_hosts: tuple[str, ...] = (),
    days: int = 365,
    renew_before_days: int = 30,
) -> CertPaths:
    """The CA and serving certificate in ``directory`` (``ca.crt``, ``tls.crt``, ``tls.key``),
    made afresh when missing or expiring within ``renew_before_days``. ``extra_hosts``: more
    DNS names or IP addresses for the certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = CertPaths(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    if all(p.exists() for p in (paths.ca_cert, paths.cert, paths.key)):
        try:
            if not_after(paths.cert) - datetime.now(UTC) > timedelta(days=renew_before_days):
                return paths
        except (CertificateError, ValueError, IndexError):
            logger.warning("unreadable certificate in %s: making new ones", directory)
    hosts = [*dns_names(service, namespace), *extra_hosts]
    san = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in hosts)
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        work = Path(tmp)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        _openssl(
            "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", str(days),
            "-subj", f"/CN={service}-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=work,
        )  # fmt: skip
        _openssl(
            "req", *ec, "-keyout", "tls.key", "-out", "tls.csr",
            "-subj", f"/CN={service}.{namespace}.svc",
            cwd=work,
        )  # fmt: skip
        (work / "ext.cnf").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
            encoding="ascii",
        )
        _openssl(
            "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "tls.crt", "-days", str(days), "-extfile", "ext.cnf",
            cwd=work,
        )  # fmt: skip
        for name, dest in (
            ("ca.crt", paths.ca_cert),
            ("tls.crt", paths.cert),
            ("tls.key", paths.key),
        ):
            os.chmod(work / name, 0o600)
            os.replace(work / name, dest)
    logger.info("made a self-signed CA and a serving certificate for %s in %s", hosts, directory)
    return paths


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def inject_ca_bundle(
    client: KubeClient, ca_pem: bytes, *, mutating: str, validating: str
) -> int:
    """Write ``ca_pem`` into every webhook of the two configurations (when it differs);
    the number of configurations written. A missing configuration is logged and skipped."""
    bundle = base64.b64encode(ca_pem).decode("ascii")
    written = 0
    for res, name in ((MUTATING_CONFIGS, mutating), (VALIDATING_CONFIGS, validating)):
        try:
            cfg = await client.get(res, name)
        except NotFound:
            logger.warning("%s %s not found: caBundle not injected", res.kind, name)
            continue
        hooks = cfg.get("webhooks") or []
        if all((h.get("clientConfig") or {}).get("caBundle") == bundle for h in hooks):
            continue
        for hook in hooks:
            hook.setdefault("clientConfig", {})["caBundle"] = bundle
        try:
            await client.replace(res, cfg)
        except ApiError as err:
            logger.warning("%s %s: caBundle not injected: %s", res.kind, name, err)
            continue
        written += 1
    return written
