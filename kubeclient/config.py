"""Where the API server is and how to authenticate: a kubeconfig file or the in-cluster account.

``--kubeconfig`` (Koordinator's flag, also ``$KUBECONFIG``) wins; without it the pod's service
account (``/var/run/secrets/kubernetes.io/serviceaccount`` and ``KUBERNETES_SERVICE_HOST``) is
used. Both failing is a :class:`~kubeclient.errors.ConfigError` naming both causes.

The result is a :class:`Connection`: the server's URL, the TLS context and the credentials.
A kubeconfig whose user has static credentials (``token``, ``tokenFile``, a client certificate,
a user name and password) is read here, as client-go's ``clientcmd`` reads one (the current
context's cluster and user; relative paths against the file's folder; ``*-data`` fields in
base64); one that needs a credential plugin (``exec``, ``auth-provider``), several files in
``$KUBECONFIG``, or fields read nowhere else here (``proxy-url``, ``tls-server-name``...) goes
through kubernetes-asyncio's loader, imported only then (it costs half a second and tens of
MiB; the binaries never import it otherwise). A token read from a file (in-cluster, or
``tokenFile``) is read again after a minute, as projected service-account tokens rotate.
"""

from __future__ import annotations

import base64
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from apis.kubernetes_keys import SERVICE_ACCOUNT_DIR
from kubeclient.errors import ConfigError

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path(SERVICE_ACCOUNT_DIR)
"""Where a pod's service account token and the cluster's CA are mounted."""
TOKEN_REREAD_S = 60.0
"""A token file is read again when the copy held is older than this (kubernetes-asyncio's and
client-go's in-cluster loaders refresh within a minute)."""

_USER_READ = {
    "token",
    "tokenFile",
    "client-certificate",
    "client-certificate-data",
    "client-key",
    "client-key-data",
    "username",
    "password",
}
_CLUSTER_READ = {
    "server",
    "certificate-authority",
    "certificate-authority-data",
    "insecure-skip-tls-verify",
    "extensions",
}


@dataclass
class Connection:
    """The API server and how to talk to it."""

    host: str
    """``https://HOST:PORT`` (no trailing slash)."""
    ssl: ssl.SSLContext | bool = True
    """The TLS context; ``False`` for plain HTTP or an unverified server."""
    token: str = ""
    """A bearer token, when fixed."""
    token_file: str = ""
    """A file holding the bearer token (read again after :data:`TOKEN_REREAD_S`)."""
    basic: str = ""
    """``Basic ...``: a user name and password."""
    refresh: Callable[[], Awaitable[str | None]] | None = None
    """A credential plugin's token source (kubernetes-asyncio's loader): the whole header
    value, asked before every request."""
    source: str = ""
    """Where it was read (for logs)."""
    _read_at: float = field(default=0.0, repr=False)

    def read_token(self) -> None:
        """Read :attr:`token_file` now. Raises ``OSError``."""
        self.token = Path(self.token_file).read_text(encoding="utf-8").strip()
        self._read_at = time.monotonic()

    async def authorization(self) -> str | None:
        """The ``Authorization`` header value, if any."""
        if self.refresh is not None:
            return await self.refresh()
        if self.token_file and time.monotonic() - self._read_at >= TOKEN_REREAD_S:
            try:
                self.read_token()
            except OSError as err:  # keep the last token: the file is being rotated
                self._read_at = time.monotonic()
                logger.warning("token file %s not read again: %s", self.token_file, err)
        if self.token:
            return f"Bearer {self.token}"
        return self.basic or None


def _loader() -> type[Any]:
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _named(items: Any, name: str, what: str) -> Mapping[str, Any]:
    if not isinstance(items, list):
        raise TypeError(f"{what}s: must be a list")
    for item in items:
        if isinstance(item, Mapping) and item.get("name") == name:
            body = item.get(what) or {}
            if not isinstance(body, Mapping):
                raise ValueError(f"{what} {name!r}: must be a map")
            return body
    raise ValueError(f"no {what} named {name!r}")


def _data(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError as err:
        raise ValueError(f"{what}: not base64: {err}") from err


def _file(base: Path, value: str) -> str:
    path = Path(value)
    return str(path if path.is_absolute() else base / path)


def _tls(base: Path, cluster: Mapping[str, Any], user: Mapping[str, Any]) -> ssl.SSLContext | bool:
    if cluster.get("insecure-skip-tls-verify") is True:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cluster.get("certificate-authority-data"):
        pem = _data(str(cluster["certificate-authority-data"]), "certificate-authority-data")
        ctx = ssl.create_default_context(cadata=pem.decode("ascii", "replace"))
    elif cluster.get("certificate-authority"):
        ctx = ssl.create_default_context(cafile=_file(base, str(cluster["certificate-authority"])))
    else:
        ctx = ssl.create_default_context()
    cert = user.get("client-certificate-data") or user.get("client-certificate")
    key = user.get("client-key-data") or user.get("client-key")
    if cert or key:
        if not (cert and key):
            raise ValueError("a client certificate needs its key (and the key its certificate)")
        if user.get("client-certificate-data") or user.get("client-key-data"):
            _load_chain_data(ctx, base, user)
        else:
            ctx.load_cert_chain(_file(base, str(cert)), _file(base, str(key)))
    return ctx


def _load_chain_data(ctx: ssl.SSLContext, base: Path, user: Mapping[str, Any]) -> None:
    """``ssl`` loads a client certificate from files only: the ``*-data`` fields go through a
    private temporary folder, removed at once."""
    parts = []
    for data_key, file_key in (
        ("client-certificate-data", "client-certificate"),
        ("client-key-data", "client-key"),
    ):
        if user.get(data_key):
            parts.append(_data(str(user[data_key]), data_key))
        else:
            parts.append(Path(_file(base, str(user[file_key]))).read_bytes())
    with tempfile.TemporaryDirectory(prefix="kubeconfig-") as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        for path, body in ((cert, parts[0]), (key, parts[1])):
            path.touch(mode=0o600)
            path.write_bytes(body)
        ctx.load_cert_chain(str(cert), str(key))


def _read_kubeconfig(path: str) -> Connection | None:
    """The connection of ``path``'s current context; ``None`` when it needs kubernetes-asyncio's
    loader (see the module docstring). Raises ``ValueError``, ``OSError``, ``yaml.YAMLError``."""
    text = Path(path).read_text(encoding="utf-8")
    doc = yaml.load(text, Loader=_loader())  # the C or Python *safe* loader
    if not isinstance(doc, Mapping):
        raise TypeError("not a kubeconfig (a map)")
    current = doc.get("current-context")
    if not current:
        raise ValueError("no current-context")
    context = _named(doc.get("contexts"), str(current), "context")
    cluster = _named(doc.get("clusters"), str(context.get("cluster") or ""), "cluster")
    user_name = context.get("user")
    user = _named(doc.get("users"), str(user_name), "user") if user_name else {}
    if set(user) - _USER_READ or set(cluster) - _CLUSTER_READ:
        return None
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ValueError(f"cluster server {server!r} is not an http(s) URL")
    base = Path(path).resolve().parent
    conn = Connection(server, source=f"kubeconfig {path}")
    if server.startswith("https://"):
        conn.ssl = _tls(base, cluster, user)
    else:
        conn.ssl = False
    if user.get("token"):
        conn.token = str(user["token"])
    elif user.get("tokenFile"):
        conn.token_file = _file(base, str(user["tokenFile"]))
        conn.read_token()
    elif user.get("username"):
        pair = f"{user['username']}:{user.get('password') or ''}".encode()
        conn.basic = "Basic " + base64.b64encode(pair).decode("ascii")
    return conn


async def _through_kubernetes_asyncio(path: str) -> Connection:
    """A kubeconfig that needs a credential plugin: kubernetes-asyncio's loader resolves it."""
    from kubernetes_asyncio import client as k8s_client
    from kubernetes_asyncio import config as k8s_config

    cfg = k8s_client.Configuration()
    await k8s_config.load_kube_config(
        config_file=path, client_configuration=cfg, persist_config=False
    )
    host = str(cfg.host).rstrip("/")
    ctx: ssl.SSLContext | bool = False
    if host.startswith("https://"):
        if cfg.verify_ssl:
            ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)

    async def refresh() -> str | None:
        value = await cfg.get_api_key_with_prefix("BearerToken")
        if value:
            return str(value)
        basic = cfg.get_basic_auth_token() if cfg.username else None
        return str(basic) if basic else None

    return Connection(host, ctx, refresh=refresh, source=f"kubeconfig {path}")


def _in_cluster() -> Connection:
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ValueError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
    token = SERVICE_ACCOUNT / "token"
    ca = SERVICE_ACCOUNT / "ca.crt"
    if not token.is_file():
        raise ValueError(f"no service account token at {token}")
    if not ca.is_file():
        raise ValueError(f"no cluster CA at {ca}")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    conn = Connection(
        f"https://{host}:{port}",
        ssl.create_default_context(cafile=str(ca)),
        token_file=str(token),
        source="in-cluster service account",
    )
    conn.read_token()
    return conn


async def load_configuration(kubeconfig: str | None = None) -> Connection:
    """The :class:`Connection` for ``kubeconfig`` (a path; None or empty: the ``KUBECONFIG``
    variable, else in-cluster). Raises :class:`ConfigError`."""
    path = kubeconfig or os.environ.get("KUBECONFIG", "")
    if path:
        try:
            conn = None if os.pathsep in path else _read_kubeconfig(path)
            if conn is None:
                conn = await _through_kubernetes_asyncio(path)
        except (ValueError, TypeError, AttributeError, OSError, yaml.YAMLError) as err:
            raise ConfigError(str(err), source=f"kubeconfig {path}") from err
        except Exception as err:  # kubernetes-asyncio's loader raises ConfigException...
            raise ConfigError(str(err), source=f"kubeconfig {path}") from err
        logger.info("Kubernetes API at %s (kubeconfig %s)", conn.host, path)
        return conn
    try:
        conn = _in_cluster()
    except (ValueError, OSError) as err:
        raise ConfigError(f"not given, and not in a cluster: {err}", source="--kubeconfig") from err
    logger.info("Kubernetes API at %s (in-cluster service account)", conn.host)
    return conn
