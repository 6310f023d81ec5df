"""Credentials of a :class:`~kubeclient.config.ClusterConfig`: the TLS context and the bearer
token.

- :func:`tls_context`: trusts the configured CAs (the file, the inline data, else the system's),
  checks the host name (or ``tls-server-name``) unless ``insecure-skip-tls-verify``, presents
  the client certificate when there is one, and offers ``http/1.1`` by ALPN. Inline certificate
  and key data are loaded through a private temporary file that is removed at once (the ``ssl``
  module loads a chain from files only).
- :class:`BearerToken`: the ``Authorization`` header; a token file is re-read when a minute has
  passed since the last read and its modification time or size changed, as client-go's
  ``cachingTokenSource`` re-reads a rotated projected token; an ``exec`` plugin is run for its
  token, again once the token's ``expirationTimestamp`` has passed (client-go's
  ``exec.Authenticator``). The plugin runs synchronously (30 s at most), as client-go's does in
  its round tripper: at start and at each expiry.

A file that cannot be read is a :class:`~kubeclient.errors.ConfigError` naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import time
from collections.abc import Callable

from apis.timestamp import TimestampError, parse_time
from kubeclient.config import ClusterConfig, ExecPlugin
from kubeclient.errors import ConfigError

TOKEN_REREAD_SECONDS = 60.0
"""How often a token file is checked for a new token (client-go: one minute)."""
EXEC_TIMEOUT_SECONDS = 30.0
"""How long an exec credential plugin may take."""


def tls_context(cfg: ClusterConfig) -> ssl.SSLContext:
    """The client TLS context for ``cfg`` (an ``https`` server)."""
    try:
        if cfg.ca_file or cfg.ca_data:
            ctx = ssl.create_default_context(cafile=cfg.ca_file or None, cadata=cfg.ca_data or None)
        else:
            ctx = ssl.create_default_context()
    except (OSError, ssl.SSLError) as err:
        what = cfg.ca_file or "certificate-authority-data"
        raise ConfigError(f"cannot load the CA: {err}", source=cfg.source, field=what) from err
    if cfg.insecure_skip_tls_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.client_cert_file or cfg.client_cert_data:
        _load_client_cert(ctx, cfg)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _load_client_cert(ctx: ssl.SSLContext, cfg: ClusterConfig) -> None:
    made: list[str] = []
    try:
        cert = cfg.client_cert_file or _private_file(cfg.client_cert_data, made)
        key = cfg.client_key_file or _private_file(cfg.client_key_data, made)
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        what = cfg.client_cert_file or "client-certificate-data"
        raise ConfigError(
            f"cannot load the client certificate and key: {err}", source=cfg.source, field=what
        ) from err
    finally:
        for path in made:
            os.unlink(path)


def _private_file(data: bytes, made: list[str]) -> str:
    # here: tempfile brings shutil, bz2 and lzma (0.3 MiB), and only client certificate data
    # given inline needs a file
    import tempfile

    fd, path = tempfile.mkstemp(prefix="kubeclient-", suffix=".pem")
    made.append(path)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


class BearerToken:
    """The ``Authorization`` header of ``cfg`` (none without a token)."""

    def __init__(self, cfg: ClusterConfig, *, clock: Callable[[], float] = time.monotonic):
        self._inline = cfg.token
        self._file = cfg.token_file
        self._exec = cfg.exec_plugin
        self._expires: float | None = None
        """Wall-clock time the exec plugin's token expires (None: never said)."""
        self._clock = clock
        self._token = ""
        self._stamp: tuple[int, int] | None = None
        self._checked = float("-inf")
        self._exec_lock = asyncio.Lock()
        if self._file:
            self._reread()

    @property
    def token(self) -> str:
        if self._exec is not None:
            if self._exec_due():  # the client's refresh() ran it already, off the event loop
                self._token, self._expires = run_exec_plugin(self._exec)
            return self._token
        if self._file and self._clock() - self._checked >= TOKEN_REREAD_SECONDS:
            # keep the last token when the file cannot be read: a 401 will say if it is stale
            with contextlib.suppress(ConfigError):
                self._reread()
        return self._token or self._inline

    def _exec_due(self) -> bool:
        return not self._token or (self._expires is not None and time.time() >= self._expires)

    async def refresh(self) -> None:
        """Run the exec plugin in a thread when its token is missing or expired, once however
        many requests wait, so that the event loop never waits on the plugin (up to
        ``EXEC_TIMEOUT_SECONDS``). :class:`~kubeclient.client.KubeClient` awaits it before each
        request; nothing to do without a plugin."""
        if self._exec is None or not self._exec_due():
            return
        async with self._exec_lock:
            if self._exec_due():
                self._token, self._expires = await asyncio.to_thread(run_exec_plugin, self._exec)

    def _reread(self) -> None:
        self._checked = self._clock()
        try:
            st = os.stat(self._file)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            with open(self._file, encoding="utf-8") as f:
                self._token = f.read().strip()
            self._stamp = stamp
        except OSError as err:
            raise ConfigError(
                f"cannot read the token: {err.strerror or err}",
                source="tokenFile",
                field=self._file,
            ) from err

    def headers(self) -> dict[str, str]:
        token = self.token
        return {"Authorization": f"Bearer {token}"} if token else {}


def run_exec_plugin(plugin: ExecPlugin) -> tuple[str, float | None]:
    """Run ``plugin`` and read its ``ExecCredential``: (the token, when it expires as a wall
    clock time, or None). Raises :class:`ConfigError` naming the kubeconfig field."""
    info = {
        "apiVersion": plugin.api_version,
        "kind": "ExecCredential",
        "spec": {"interactive": False},
    }
    env = {**os.environ, **dict(plugin.env), "KUBERNETES_EXEC_INFO": json.dumps(info)}

    def fail(message: str) -> ConfigError:
        hint = f" ({plugin.install_hint})" if plugin.install_hint else ""
        return ConfigError(f"{plugin.command}: {message}{hint}", field=plugin.where)

    try:
        done = subprocess.run(
            [plugin.command, *plugin.args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=EXEC_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise fail(f"cannot run it: {err}") from err
    if done.returncode != 0:
        raise fail(f"exited {done.returncode}: {done.stderr.strip()[-500:]}")
    try:
        cred = json.loads(done.stdout)
    except ValueError as err:
        raise fail(f"printed no ExecCredential JSON: {err}") from err
    if not isinstance(cred, dict) or cred.get("kind") != "ExecCredential":
        raise fail("printed no ExecCredential")
    if cred.get("apiVersion") != plugin.api_version:
        raise fail(f"answered {cred.get('apiVersion')!r}, not {plugin.api_version}")
    status = cred.get("status") or {}
    token = status.get("token")
    if not isinstance(token, str) or not token:
        if status.get("clientCertificateData"):
            raise fail("client certificates from a plugin are not supported, only tokens")
        raise fail("its ExecCredential has no status.token")
    expires = None
    stamp = status.get("expirationTimestamp")
    if stamp:
        try:
            expires = parse_time(stamp, source=plugin.command, field="status.expirationTimestamp")
        except TimestampError as err:
            raise fail(f"status.expirationTimestamp {stamp!r}: {err}") from err
    return token, expires
