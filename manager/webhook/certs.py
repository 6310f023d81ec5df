"""Serving certificates of the webhook without cert-manager, as upstream koord-manager keeps them.

Upstream: ``pkg/webhook/util/controller/webhook_controller.go`` (the sync loop),
``writer/secret.go`` and ``writer/certwriter.go`` (the Secret and when a certificate is valid),
``generator/selfsigned.go`` (what is made), ``configuration/configuration.go`` (the caBundle).

One :meth:`CertificateKeeper.sync`:

1. **The Secret** (``koordinator-webhook-certs`` in the webhook's namespace) is read. Missing,
   it is created with a fresh CA and serving certificate; a replica that loses that race (409
   AlreadyExists) reads the winner's. Its keys are upstream's: ``ca-key.pem``, ``ca-cert.pem``,
   ``key.pem``/``tls.key``, ``cert.pem``/``tls.crt``, so either implementation reads the
   other's Secret.
2. **Validity**, upstream's ``validCert``: the key matches the certificate, which chains to the
   CA, names ``<service>.<namespace>.svc`` (and every ``extra_hosts``) and is still valid six
   months from now. Otherwise a new serving certificate replaces it (an update carrying the
   Secret's resourceVersion: of two replicas, one wins and the other, on its 409, reads the
   winner's at its next sync); the CA is kept while it is valid a year from now.
3. **The files**: the six keys are written to the certificate directory (mode 0600, each
   replaced atomically) when they differ from what is there; ``on_change`` then reloads the
   server's TLS context, so new handshakes use the new certificate.
4. **The caBundle** of every webhook of both configurations is set to the CA with one JSON
   patch each (a ``test`` of each webhook's name guards the index), when it differs.

:meth:`CertificateKeeper.run` syncs at start, every ``resync_seconds`` (upstream: a minute) and
at once when the Secret changes (a watch on it by name), retrying a failed sync with backoff.
Certificates are ECDSA P-256 made by the ``openssl`` command (3.x; the ``cryptography`` package
is not in this project's environment), the CA and the serving certificate for ten years as
upstream (``CN=webhook-cert-ca``; the serving certificate for ``localhost`` and the Service's
names). Upstream makes RSA-2048 keys; it reads ours, and makes its own CA on its next renewal.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

from apis.records import frozen
from kubeclient.backoff import Backoff
from kubeclient.client import KubeClient, PatchType
from kubeclient.errors import ApiError, Conflict, NotFound
from kubeclient.informer import Informer
from kubeclient.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    SECRETS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    Resource,
)

logger = logging.getLogger(__name__)

CA_KEY = "ca-key.pem"
CA_CERT = "ca-cert.pem"
SERVER_KEY = "key.pem"
SERVER_KEY_TLS = "tls.key"
SERVER_CERT = "cert.pem"
SERVER_CERT_TLS = "tls.crt"
"""The keys of the Secret and the files of the directory (upstream ``writer/certwriter.go``)."""

VALID_AHEAD = timedelta(days=182)
"""A serving certificate is renewed when it would not verify this far ahead (upstream
``time.Now().AddDate(0, 6, 0)``)."""
CA_VALID_AHEAD = timedelta(days=365)
"""The CA is reused while valid this far ahead (upstream ``AddDate(1, 0, 0)``)."""
CERT_DAYS = 3650
"""Lifetime of what is made (upstream: ten years)."""
CA_COMMON_NAME = "webhook-cert-ca"


class CertificateError(RuntimeError):
    """The certificates could not be made or checked (no ``openssl``, or it failed)."""


@frozen
class Artifacts:
    """A CA and a serving certificate, PEM."""

    ca_key: bytes
    ca_cert: bytes
    key: bytes
    cert: bytes

    def files(self) -> dict[str, bytes]:
        """The six keys of the Secret and of the directory."""
        return {
            CA_KEY: self.ca_key,
            CA_CERT: self.ca_cert,
            SERVER_KEY: self.key,
            SERVER_KEY_TLS: self.key,
            SERVER_CERT: self.cert,
            SERVER_CERT_TLS: self.cert,
        }

    @classmethod
    def from_secret(cls, secret: Mapping[str, Any]) -> Artifacts | None:
        """The artifacts of a Secret; None when a key is missing or not base64."""
        data = secret.get("data") or {}
        try:
            parts = [base64.b64decode(data[k], validate=True) for k in (CA_KEY, CA_CERT)]
            key = base64.b64decode(data.get(SERVER_KEY) or data[SERVER_KEY_TLS], validate=True)
            cert = base64.b64decode(data.get(SERVER_CERT) or data[SERVER_CERT_TLS], validate=True)
        except (KeyError, TypeError, ValueError):
            return None
        return cls(parts[0], parts[1], key, cert)

    def secret_data(self) -> dict[str, str]:
        return {k: base64.b64encode(v).decode("ascii") for k, v in self.files().items()}


# openssl ---------------------------------------------------------------------------------------
def _openssl(*args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("openssl")
    if exe is None:
        raise CertificateError(
            "openssl not found: install it (Debian: openssl) or use cert-manager"
        )
    proc = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {proc.stderr.strip()[:500]}")
    return proc


def service_dns_name(service: str, namespace: str) -> str:
    """The name the API server checks: ``<service>.<namespace>.svc`` (upstream
    ``ServiceToCommonName``)."""
    return f"{service}.{namespace}.svc"


def service_hosts(service: str, namespace: str) -> list[str]:
    """Every name of the Service, shortest first; the certificate carries them all."""
    return [
        service,
        f"{service}.{namespace}",
        service_dns_name(service, namespace),
        f"{service}.{namespace}.svc.cluster.local",
    ]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def generate(
    common_name: str,
    hosts: list[str],
    ca: tuple[bytes, bytes] | None = None,
    *,
    days: int = CERT_DAYS,
) -> Artifacts:
    """A serving certificate for ``hosts`` (and ``localhost``) signed by ``ca`` (key, cert PEM),
    or by a CA made here when ``ca`` is None."""
    names = ["localhost", *[h for h in hosts if h != "localhost"]]
    san = ",".join(f"IP:{h}" if _is_ip(h) else f"DNS:{h}" for h in names)
    with tempfile.TemporaryDirectory(prefix="koord-webhook-") as tmp:
        work = Path(tmp)
        if ca is None:
            _openssl(
                "req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.crt",
                "-days", str(days), "-subj", f"/CN={CA_COMMON_NAME}",
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign",
                cwd=work,
            )  # fmt: skip
        else:
            (work / "ca.key").write_bytes(ca[0])
            (work / "ca.crt").write_bytes(ca[1])
        _openssl(
            "req", *_EC, "-keyout", "tls.key", "-out", "tls.csr", "-subj", f"/CN={common_name}",
            cwd=work,
        )  # fmt: skip
        (work / "ext.cnf").write_text(
            f"subjectAltName={san}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
            encoding="ascii",
        )
        _openssl(
            "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", str(int.from_bytes(os.urandom(8), "big") >> 1),
            "-out", "tls.crt", "-days", str(days), "-extfile", "ext.cnf",
            cwd=work,
        )  # fmt: skip
        return Artifacts(
            (work / "ca.key").read_bytes(),
            (work / "ca.crt").read_bytes(),
            (work / "tls.key").read_bytes(),
            (work / "tls.crt").read_bytes(),
        )


def _pair_matches(cert: bytes, key: bytes, work: Path) -> bool:
    (work / "pair.crt").write_bytes(cert)
    (work / "pair.key").write_bytes(key)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(str(work / "pair.crt"), str(work / "pair.key"))
    except ssl.SSLError:
        return False
    return True


def _verifies(ca: bytes, cert: bytes, at: datetime, host: str | None, work: Path) -> bool:
    """``x509.Certificate.Verify`` against ``ca`` alone, at time ``at``, for ``host``."""
    (work / "root.pem").write_bytes(ca)
    (work / "leaf.pem").write_bytes(cert)
    args = ["verify", "-x509_strict", "-CAfile", "root.pem", "-attime", str(int(at.timestamp()))]
    if host is not None:
        args += ["-purpose", "sslserver", "-verify_hostname" if not _is_ip(host) else "-verify_ip"]
        args.append(host)
    proc = _openssl(*args, "leaf.pem", cwd=work, check=False)
    return proc.returncode == 0


def serving_valid(artifacts: Artifacts, hosts: list[str], now: datetime) -> bool:
    """Upstream's ``validCert``: the pair matches, and the certificate verifies against the CA
    for every one of ``hosts`` six months from ``now``."""
    with tempfile.TemporaryDirectory(prefix="koord-webhook-") as tmp:
        work = Path(tmp)
        if not _pair_matches(artifacts.cert, artifacts.key, work):
            return False
        at = now + VALID_AHEAD
        return all(_verifies(artifacts.ca_cert, artifacts.cert, at, h, work) for h in hosts)


def ca_valid(artifacts: Artifacts, now: datetime) -> bool:
    """Upstream's ``ValidCACert``: the CA's key matches it and it verifies as its own root a
    year from ``now``."""
    with tempfile.TemporaryDirectory(prefix="koord-webhook-") as tmp:
        work = Path(tmp)
        if not _pair_matches(artifacts.ca_cert, artifacts.ca_key, work):
            return False
        return _verifies(artifacts.ca_cert, artifacts.ca_cert, now + CA_VALID_AHEAD, None, work)


def renew(
    current: Artifacts | None,
    common_name: str,
    hosts: list[str],
    now: datetime,
    required: list[str] | None = None,
) -> Artifacts | None:
    """None while ``current`` is valid for ``required`` (default: ``hosts``); else a new serving
    certificate for ``hosts``, signed by the current CA when that one is still good (upstream
    ``SelfSignedCertGenerator.Generate``)."""
    if current is not None and serving_valid(current, required or hosts, now):
        return None
    keep_ca = current is not None and ca_valid(current, now)
    ca = (current.ca_key, current.ca_cert) if current is not None and keep_ca else None
    return generate(common_name, hosts, ca)


# The directory ---------------------------------------------------------------------------------
def write_dir(directory: Path, artifacts: Artifacts) -> bool:
    """The six files in ``directory`` (made 0700 if missing), each written 0600 and renamed into
    place; whether any changed."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    changed = False
    for name, data in artifacts.files().items():
        path = directory / name
        with contextlib.suppress(OSError):
            if path.read_bytes() == data:
                continue
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        changed = True
    return changed


def read_dir(directory: Path) -> Artifacts | None:
    """The artifacts written by :func:`write_dir` (None when a file is missing)."""
    try:
        return Artifacts(
            (directory / CA_KEY).read_bytes(),
            (directory / CA_CERT).read_bytes(),
            (directory / SERVER_KEY_TLS).read_bytes(),
            (directory / SERVER_CERT_TLS).read_bytes(),
        )
    except OSError:
        return None


# The caBundle ----------------------------------------------------------------------------------
async def ensure_ca_bundle(
    client: KubeClient, ca_pem: bytes, *, mutating: str, validating: str
) -> int:
    """Set ``ca_pem`` as the caBundle of every webhook of the two configurations where it
    differs; the number of configurations patched. Raises :class:`~kubeclient.errors.ApiError`
    (a configuration missing is a :class:`~kubeclient.errors.NotFound`: the sync is retried)."""
    bundle = base64.b64encode(ca_pem).decode("ascii")
    patched = 0
    configs: tuple[tuple[Resource, str], ...] = (
        (MUTATING_WEBHOOK_CONFIGURATIONS, mutating),
        (VALIDATING_WEBHOOK_CONFIGURATIONS, validating),
    )
    for res, name in configs:
        cfg = await client.get(res, name)
        ops: list[dict[str, Any]] = []
        for i, hook in enumerate(cfg.get("webhooks") or ()):
            if (hook.get("clientConfig") or {}).get("caBundle") == bundle:
                continue
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
            ops.append(
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
            )
        if ops:
            await client.patch(res, name, ops, patch_type=PatchType.JSON)
            logger.info("%s %s: caBundle set", res.kind, name)
            patched += 1
    return patched


# The keeper ------------------------------------------------------------------------------------
@frozen
class KeeperSettings:
    """Where the certificates live and what they are for."""

    namespace: str
    """The webhook's namespace: the Service's and the Secret's (``--webhook-service-namespace``,
    default ``$POD_NAMESPACE``, else ``koordinator-system``)."""
    service: str
    """The Service the API server calls (``--webhook-service-name``)."""
    secret: str
    """The Secret that holds them (``--webhook-secret-name``, upstream ``SECRET_NAME``,
    default ``koordinator-webhook-certs``)."""
    cert_dir: Path
    """Where the files are written for the server (``--webhook-cert-dir``)."""
    mutating: str
    """The MutatingWebhookConfiguration whose caBundle is kept."""
    validating: str
    """The ValidatingWebhookConfiguration whose caBundle is kept."""
    extra_hosts: tuple[str, ...] = ()
    """More DNS names or IP addresses for the serving certificate (``--webhook-cert-host``):
    the same on every replica, or they take turns renewing it."""
    resync_seconds: float = 60.0
    """How often a sync runs without an event (upstream's resync: a minute)."""
    store: str = "secret"
    """``secret``: the Secret holds them (upstream's ``secret`` cert writer); ``dir``: the
    directory alone does (upstream's ``fs`` writer: one replica, each would make its own CA)."""

    @property
    def hosts(self) -> list[str]:
        """The names a new certificate carries."""
        return [*service_hosts(self.service, self.namespace), *self.extra_hosts]

    @property
    def required_hosts(self) -> list[str]:
        """The names a certificate must carry to be kept: upstream's one (``<svc>.<ns>.svc``)
        and ``extra_hosts``, so a certificate upstream made is kept too."""
        return [self.common_name, *self.extra_hosts]

    @property
    def common_name(self) -> str:
        return service_dns_name(self.service, self.namespace)


class CertificateKeeper:
    """Keeps the serving certificate in the Secret, the files and the caBundle (the module
    docstring). ``on_change`` is called (on the loop) after the files changed."""

    def __init__(
        self,
        client: KubeClient,
        settings: KeeperSettings,
        *,
        on_change: Callable[[Artifacts], None] = lambda _a: None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        backoff: Backoff | None = None,
    ) -> None:
        self._client = client
        self.settings = settings
        self._on_change = on_change
        self._now = now
        self._backoff = backoff or Backoff(base=1.0, cap=30.0)
        self._wake = asyncio.Event()
        self.syncs = 0
        """Syncs completed (tests, logs)."""
        self.artifacts: Artifacts | None = None
        """What the last sync left in force."""

    # One sync -------------------------------------------------------------------------------
    async def _read(self) -> tuple[Artifacts | None, dict[str, Any] | None]:
        try:
            secret = await self._client.get(SECRETS, self.settings.secret, self.settings.namespace)
        except NotFound:
            return None, None
        return Artifacts.from_secret(secret), secret

    async def ensure_secret(self) -> Artifacts:
        """Steps 1 and 2: the valid artifacts in the Secret, made or renewed as needed."""
        s = self.settings
        current, secret = await self._read()
        if secret is None:
            made = await asyncio.to_thread(generate, s.common_name, s.hosts)
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": s.secret, "namespace": s.namespace},
                "data": made.secret_data(),
            }
            try:
                await self._client.create(SECRETS, body)
            except Conflict:  # another replica made it first: use its certificates
                current, secret = await self._read()
                if secret is None:
                    raise
            else:
                logger.info(
                    "made a CA and a serving certificate in secret %s/%s", s.namespace, s.secret
                )
                return made
        renewed = await asyncio.to_thread(
            renew, current, s.common_name, s.hosts, self._now(), s.required_hosts
        )
        if renewed is None:
            assert current is not None
            return current
        assert secret is not None
        updated = {**secret, "data": renewed.secret_data()}
        await self._client.replace(SECRETS, updated)  # resourceVersion: 409 if another won
        logger.info(
            "secret %s/%s: %s; made a new serving certificate%s",
            s.namespace,
            s.secret,
            "incomplete" if current is None else "not valid six months ahead",
            "" if current is not None and renewed.ca_cert == current.ca_cert else " and CA",
        )
        return renewed

    async def ensure_dir(self) -> Artifacts:
        """Steps 1 and 2 with the directory as the store (upstream's ``fs`` writer)."""
        s = self.settings
        current = await asyncio.to_thread(read_dir, s.cert_dir)
        renewed = await asyncio.to_thread(
            renew, current, s.common_name, s.hosts, self._now(), s.required_hosts
        )
        if renewed is None:
            assert current is not None
            return current
        logger.info("made a serving certificate in %s", s.cert_dir)
        return renewed

    async def sync(self) -> Artifacts:
        """One pass (the module docstring). Raises :class:`CertificateError`,
        :class:`~kubeclient.errors.ApiError` or ``OSError``."""
        if self.settings.store == "secret":
            artifacts = await self.ensure_secret()
        else:
            artifacts = await self.ensure_dir()
        changed = await asyncio.to_thread(write_dir, self.settings.cert_dir, artifacts)
        self.artifacts = artifacts
        if changed:
            logger.info("serving certificate written to %s", self.settings.cert_dir)
            self._on_change(artifacts)
        await ensure_ca_bundle(
            self._client,
            artifacts.ca_cert,
            mutating=self.settings.mutating,
            validating=self.settings.validating,
        )
        self.syncs += 1
        return artifacts

    async def first_sync(self, stop: asyncio.Event | None = None) -> Artifacts | None:
        """:meth:`sync` until it succeeds (with backoff); None if ``stop`` is set first."""
        while True:
            try:
                done = await self.sync()
            except (CertificateError, ApiError, OSError) as err:
                delay = self._backoff.next_delay()
                logger.warning("webhook certificates not ready (retry in %.1fs): %s", delay, err)
            else:
                self._backoff.reset()
                return done
            if stop is None:
                await asyncio.sleep(delay)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await stop.wait()
                    return None

    # The loop -------------------------------------------------------------------------------
    def _poke(self, *_objs: Any) -> None:
        self._wake.set()

    async def run(self) -> NoReturn:
        """Sync every ``resync_seconds`` and whenever the Secret changes, forever; a failed
        sync is logged and retried with backoff."""
        s = self.settings
        async with asyncio.TaskGroup() as tasks:
            if s.store == "secret":
                watch = Informer(
                    self._client,
                    SECRETS,
                    namespace=s.namespace,
                    field_selector=f"metadata.name={s.secret}",
                )
                watch.add_handler(on_add=self._poke, on_update=self._poke, on_delete=self._poke)
                tasks.create_task(watch.run(), name=f"webhook-secret-watch[{s.secret}]")
            delay = s.resync_seconds
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()
                self._wake.clear()
                try:
                    await self.sync()
                except (CertificateError, ApiError, OSError) as err:
                    delay = self._backoff.next_delay()
                    logger.warning(
                        "webhook certificates: sync failed (retry in %.1fs): %s", delay, err
                    )
                else:
                    self._backoff.reset()
                    delay = s.resync_seconds
        raise AssertionError("unreachable")  # pragma: no cover
