"""Where the API server is and how to authenticate: a kubeconfig file or the in-cluster account.

``--kubeconfig`` (Koordinator's flag, also ``$KUBECONFIG``, which may list several files joined
with ``:``) wins; without it the pod's service account (``/var/run/secrets/kubernetes.io/
serviceaccount`` and ``KUBERNETES_SERVICE_HOST``) is used. Both failing is a
:class:`~kubeclient.errors.ConfigError` naming both causes.

A kubeconfig is read as client-go reads one (``k8s.io/client-go/tools/clientcmd``): several
files merge, the first file to set a map key or a named cluster, user or context wins; relative
file paths resolve against the folder of the file that names them; the context is
``current-context``. What is supported, per section of the chosen context:

- ``cluster``: ``server`` (``https://`` or ``http://``), ``certificate-authority`` or
  ``certificate-authority-data``, ``insecure-skip-tls-verify``, ``tls-server-name``;
  ``disable-compression`` and ``extensions`` are accepted and have no effect (nothing asks for
  compression);
- ``user``: ``token`` or ``tokenFile`` (re-read when it changes, as a rotated projected token
  is), ``client-certificate``/``client-certificate-data`` with ``client-key``/
  ``client-key-data``, ``exec`` (a client.authentication.k8s.io credential plugin giving a
  token, :mod:`kubeclient.auth`); ``extensions`` accepted.

What is refused, with a :class:`ConfigError` naming the field (``users[name].user.as``):
``auth-provider`` plugins, ``username``/``password`` (basic auth, gone from the API server since
1.19), impersonation (``as``, ``as-groups``, ``as-uid``, ``as-user-extra``) and ``proxy-url``.

The YAML is parsed by a short-lived child Python (:mod:`kubeclient.yamlchild`), so that a
daemon that reads its kubeconfig once at start does not carry PyYAML for the rest of its life.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from apis.kubernetes_keys import SERVICE_ACCOUNT_TOKEN_PATH
from apis.records import frozen
from kubeclient.errors import ConfigError
from kubeclient.yamlchild import YamlError, load_yaml

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = os.path.dirname(SERVICE_ACCOUNT_TOKEN_PATH)
"""The service account's projected volume in a pod (token, ``ca.crt``, namespace)."""

CLUSTER_KEYS = frozenset(
    {
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "disable-compression",
        "extensions",
    }
)
USER_KEYS = frozenset(
    {
        "exec",
        "token",
        "tokenFile",
        "client-certificate",
        "client-certificate-data",
        "client-key",
        "client-key-data",
        "extensions",
    }
)
REFUSED = {
    "auth-provider": "auth-provider plugins are not supported; use a token, a tokenFile or a "
    "client certificate",
    "username": "basic authentication is not supported (the API server dropped it in 1.19)",
    "password": "basic authentication is not supported (the API server dropped it in 1.19)",
    "as": "impersonation is not supported",
    "as-groups": "impersonation is not supported",
    "as-uid": "impersonation is not supported",
    "as-user-extra": "impersonation is not supported",
    "proxy-url": "proxies are not supported: the client connects to the server directly",
}
"""Kubeconfig keys of a cluster or user that are refused, and why."""


@frozen
class ClusterConfig:
    """How to reach one API server and who to be there."""

    server: str
    """``https://host:port`` (or ``http://``), without a trailing ``/``."""
    source: str = ""
    """Where this came from (``kubeconfig /path``, ``in-cluster service account``), for logs
    and errors."""
    ca_file: str = ""
    """PEM file of the CAs to trust; with :attr:`ca_data` empty too, the system's."""
    ca_data: str = ""
    """PEM text of the CAs to trust (``certificate-authority-data``, decoded)."""
    insecure_skip_tls_verify: bool = False
    """Neither the certificate nor the host name is checked (``insecure-skip-tls-verify``)."""
    tls_server_name: str = ""
    """The name the server's certificate must carry, when not the host of :attr:`server`."""
    token: str = ""
    """A bearer token given inline."""
    token_file: str = ""
    """A file holding the bearer token, re-read when it changes."""
    client_cert_file: str = ""
    client_cert_data: bytes = b""
    """PEM of the client certificate (``client-certificate-data``, decoded)."""
    client_key_file: str = ""
    client_key_data: bytes = b""
    """PEM of the client key (``client-key-data``, decoded)."""
    exec_plugin: ExecPlugin | None = None
    """A credential plugin that prints the bearer token (``users[].user.exec``)."""

    @property
    def hostname(self) -> str:
        return urlsplit(self.server).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.server)
        return parts.port or (443 if parts.scheme == "https" else 80)

    @property
    def tls(self) -> bool:
        return urlsplit(self.server).scheme == "https"


EXEC_API_VERSIONS = (
    "client.authentication.k8s.io/v1",
    "client.authentication.k8s.io/v1beta1",
)
"""The ExecCredential versions a plugin may speak (client-go's, since 1.22 for v1)."""
EXEC_KEYS = frozenset(
    {"apiVersion", "command", "args", "env", "installHint", "provideClusterInfo",
     "interactiveMode"}
)  # fmt: skip


@frozen
class ExecPlugin:
    """``users[].user.exec``: a program printing an ``ExecCredential`` with a bearer token
    (client-go's ``exec`` credential plugins; docs/kubernetes.md, "The client layer")."""

    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    api_version: str = EXEC_API_VERSIONS[0]
    install_hint: str = ""
    where: str = ""
    """The kubeconfig field, for errors (``users[name].user.exec``)."""


class _Invalid(Exception):
    """A field of the kubeconfig that does not fit: (field, message)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def _named(doc: Mapping[str, Any], key: str, where: str) -> list[tuple[str, Mapping[str, Any]]]:
    raw = doc.get(key)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _Invalid(key, f"must be a list, not {type(raw).__name__}")
    out = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise _Invalid(f"{key}[{i}]", "must be a mapping with a name")
        body = entry.get(where)
        if body is None:
            body = {}
        if not isinstance(body, Mapping):
            raise _Invalid(f"{key}[{entry['name']}].{where}", "must be a mapping")
        out.append((entry["name"], body))
    return out


@dataclass
class _Merged:
    """The merge of one or more kubeconfig files (the first to set a key wins)."""

    current_context: str = ""
    clusters: dict[str, tuple[Mapping[str, Any], Path]] = field(default_factory=dict)
    users: dict[str, tuple[Mapping[str, Any], Path]] = field(default_factory=dict)
    contexts: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    def add(self, doc: Mapping[str, Any], folder: Path) -> None:
        if not self.current_context and isinstance(doc.get("current-context"), str):
            self.current_context = doc["current-context"]
        for key, where, into in (
            ("clusters", "cluster", self.clusters),
            ("users", "user", self.users),
        ):
            for name, body in _named(doc, key, where):
                into.setdefault(name, (body, folder))
        for name, body in _named(doc, "contexts", "context"):
            self.contexts.setdefault(name, body)


def _parse_yaml(text: str) -> Any:
    try:
        return load_yaml(text)
    except YamlError as err:
        raise _Invalid("", f"not YAML: {err}") from err


def _read_docs(path: str) -> list[tuple[Mapping[str, Any], Path]]:
    out = []
    for part in (p for p in path.split(os.pathsep) if p):
        try:
            text = Path(part).read_text(encoding="utf-8")
        except FileNotFoundError as err:
            if os.pathsep in path:  # client-go skips missing files of a list
                continue
            raise _Invalid("", "no such file") from err
        except OSError as err:
            raise _Invalid("", f"cannot read it: {err.strerror or err}") from err
        doc = _parse_yaml(text)
        if doc is None:
            doc = {}
        if not isinstance(doc, Mapping):
            raise _Invalid("", f"must be a mapping, not {type(doc).__name__}")
        out.append((doc, Path(part).resolve().parent))
    if not out:
        raise _Invalid("", "no such file")
    return out


def _string(section: Mapping[str, Any], key: str, where: str) -> str:
    value = section.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _Invalid(f"{where}.{key}", f"must be a string, not {type(value).__name__}")
    return value


def _file(section: Mapping[str, Any], key: str, where: str, folder: Path) -> str:
    value = _string(section, key, where)
    if not value:
        return ""
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else folder / path)


def _data(section: Mapping[str, Any], key: str, where: str) -> bytes:
    value = _string(section, key, where)
    if not value:
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as err:
        raise _Invalid(f"{where}.{key}", f"not base64: {err}") from err


def _exec_plugin(user: Mapping[str, Any], where: str, folder: Path) -> ExecPlugin | None:
    raw = user.get("exec")
    if raw is None:
        return None
    ewhere = f"{where}.exec"
    if not isinstance(raw, Mapping):
        raise _Invalid(ewhere, "must be a mapping")
    _check_keys(raw, EXEC_KEYS, ewhere)
    api_version = _string(raw, "apiVersion", ewhere)
    if api_version not in EXEC_API_VERSIONS:
        raise _Invalid(f"{ewhere}.apiVersion", f"must be one of {', '.join(EXEC_API_VERSIONS)}")
    command = _string(raw, "command", ewhere)
    if not command:
        raise _Invalid(f"{ewhere}.command", "is required")
    if os.sep in command and not os.path.isabs(command):  # client-go: relative to the file
        command = str(folder / command)
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise _Invalid(f"{ewhere}.args", "must be a list of strings")
    env = []
    for i, item in enumerate(raw.get("env") or []):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise _Invalid(f"{ewhere}.env[{i}]", "must be a mapping with a name and a value")
        env.append((item["name"], str(item.get("value", ""))))
    if raw.get("interactiveMode") == "Always":
        raise _Invalid(f"{ewhere}.interactiveMode", "Always: no terminal to ask on")
    return ExecPlugin(
        command, tuple(args), tuple(env), api_version, _string(raw, "installHint", ewhere), ewhere
    )


def _check_keys(section: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    for key in section:
        if key in REFUSED:
            raise _Invalid(f"{where}.{key}", REFUSED[key])
        if key not in allowed:
            raise _Invalid(f"{where}.{key}", "unknown field")


def parse_kubeconfig(path: str) -> ClusterConfig:
    """The :class:`ClusterConfig` of ``path``'s current context (``path``: one file, or several
    joined with ``:``). Raises :class:`ConfigError` naming the file and the field."""
    source = f"kubeconfig {path}"
    try:
        merged = _Merged()
        for doc, folder in _read_docs(path):
            merged.add(doc, folder)
        return _resolve(merged, source)
    except _Invalid as err:
        raise ConfigError(err.message, source=source, field=err.field) from err


def _resolve(merged: _Merged, source: str) -> ClusterConfig:
    name = merged.current_context
    if not name:
        raise _Invalid("current-context", "not set")
    context = merged.contexts.get(name)
    if context is None:
        raise _Invalid("current-context", f"no context named {name!r}")
    where = f"contexts[{name}].context"
    cluster_name = _string(context, "cluster", where)
    if cluster_name not in merged.clusters:
        raise _Invalid(f"{where}.cluster", f"no cluster named {cluster_name!r}")
    cluster, cfolder = merged.clusters[cluster_name]
    cwhere = f"clusters[{cluster_name}].cluster"
    _check_keys(cluster, CLUSTER_KEYS, cwhere)
    user_name = _string(context, "user", where)
    user: Mapping[str, Any] = {}
    ufolder = cfolder
    uwhere = f"users[{user_name}].user"
    if user_name:
        if user_name not in merged.users:
            raise _Invalid(f"{where}.user", f"no user named {user_name!r}")
        user, ufolder = merged.users[user_name]
        _check_keys(user, USER_KEYS, uwhere)
    server = _string(cluster, "server", cwhere).rstrip("/")
    parts = urlsplit(server)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise _Invalid(f"{cwhere}.server", f"{server!r} is not an http(s)://host[:port] URL")
    skip = cluster.get("insecure-skip-tls-verify", False)
    if not isinstance(skip, bool):
        raise _Invalid(f"{cwhere}.insecure-skip-tls-verify", "must be true or false")
    ca_data = _data(cluster, "certificate-authority-data", cwhere)
    cfg = ClusterConfig(
        server=server,
        source=source,
        ca_file=_file(cluster, "certificate-authority", cwhere, cfolder),
        ca_data=ca_data.decode("ascii", "replace"),
        insecure_skip_tls_verify=skip,
        tls_server_name=_string(cluster, "tls-server-name", cwhere),
        token=_string(user, "token", uwhere),
        token_file=_file(user, "tokenFile", uwhere, ufolder),
        client_cert_file=_file(user, "client-certificate", uwhere, ufolder),
        client_cert_data=_data(user, "client-certificate-data", uwhere),
        client_key_file=_file(user, "client-key", uwhere, ufolder),
        client_key_data=_data(user, "client-key-data", uwhere),
        exec_plugin=_exec_plugin(user, uwhere, ufolder),
    )
    has_cert = bool(cfg.client_cert_file or cfg.client_cert_data)
    has_key = bool(cfg.client_key_file or cfg.client_key_data)
    if has_cert != has_key:
        missing = "client-key" if has_cert else "client-certificate"
        raise _Invalid(f"{uwhere}.{missing}", "a client certificate needs both it and its key")
    return cfg


def in_cluster_config(
    environ: Mapping[str, str], sa_dir: str = SERVICE_ACCOUNT_DIR
) -> ClusterConfig:
    """The pod's service account, as client-go's ``rest.InClusterConfig``: the API server at
    ``$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the token file (re-read when it
    changes) and ``ca.crt`` of ``sa_dir``. Raises :class:`ConfigError` when not in a pod."""
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set",
            source="in-cluster service account",
        )
    token = os.path.join(sa_dir, "token")
    if not os.path.isfile(token):
        raise ConfigError("no such file", source="in-cluster service account", field=token)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    ca = os.path.join(sa_dir, "ca.crt")
    return ClusterConfig(
        server=f"https://{host}:{port}",
        source="in-cluster service account",
        ca_file=ca if os.path.isfile(ca) else "",
        token_file=token,
    )


def load_sync(
    kubeconfig: str | None = None, environ: Mapping[str, str] | None = None
) -> ClusterConfig:
    """:func:`load_configuration` without the event loop (file reads block)."""
    env = os.environ if environ is None else environ
    path = kubeconfig or env.get("KUBECONFIG", "")
    if path:
        cfg = parse_kubeconfig(path)
        logger.info("Kubernetes API at %s (kubeconfig %s)", cfg.server, path)
        return cfg
    try:
        cfg = in_cluster_config(env)
    except ConfigError as err:
        raise ConfigError(f"not given, and not in a cluster: {err}", source="--kubeconfig") from err
    logger.info("Kubernetes API at %s (in-cluster service account)", cfg.server)
    return cfg


async def load_configuration(kubeconfig: str | None = None) -> ClusterConfig:
    """The :class:`ClusterConfig` for ``kubeconfig`` (a path; None or empty: the ``KUBECONFIG``
    variable, else in-cluster). Raises :class:`ConfigError`."""
    return await asyncio.to_thread(load_sync, kubeconfig)
