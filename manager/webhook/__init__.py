"""The pod admission webhooks: ClusterColocationProfiles and the extended-resource-spec
annotation (mutating), co-location rules (validating), served over TLS with certificates the
webhook keeps itself.

Modules: :mod:`~manager.webhook.profiles` (profile parsing and mutation),
:mod:`~manager.webhook.extendedspec` (the ``node.koordinator.sh/extended-resource-spec``
annotation), :mod:`~manager.webhook.podjson` (the pod as Go writes it, JSON patches),
:mod:`~manager.webhook.validation` (the rules), :mod:`~manager.webhook.certs` (the Secret, the
files and the caBundle), :mod:`~manager.webhook.server` (the aiohttp app).

``--webhook-cert-writer`` (upstream's ``WEBHOOK_CERT_WRITER``) says where the certificates come
from: ``secret`` (the default, as upstream: kept in the Secret ``--webhook-secret-name`` that
every replica shares, written to ``--webhook-cert-dir``, the caBundle patched), ``fs`` (kept in
``--webhook-cert-dir`` alone, one replica; ``--self-signed`` is its old name) or ``none``
(``tls.crt`` and ``tls.key`` given in ``--webhook-cert-dir``, cert-manager's, re-read when they
change; nothing written).

Errors::

    ProfileError        a profile that cannot be used (a manager.errors.ManagerError and an
                        apis.errors.FieldError: source the profile, field its path)
    SpecError           an extended-resource-spec annotation Go cannot decode (same bases)
    LookupError_        a namespace or PriorityClass the API server would not give
    CertificateError    the certificates could not be made or checked
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import ssl
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kubeclient.flags import SuggestingParser

if TYPE_CHECKING:
    from kubeclient.client import KubeClient
    from manager.webhook.certs import CertificateKeeper

logger = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "koordinator-system"
CERT_WRITERS = ("secret", "fs", "none")


def _parser() -> argparse.ArgumentParser:
    p = SuggestingParser(
        prog="koord-manager webhook",
        description="Serve the pod mutating and validating webhooks over TLS.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG or in-cluster)")
    p.add_argument("--webhook-host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--webhook-port", type=int, default=9876, help="port (default 9876)")
    p.add_argument(
        "--webhook-cert-writer",
        choices=CERT_WRITERS,
        default="secret",
        help="secret: keep the certificates in --webhook-secret-name, shared by every replica "
        "(default); fs: keep them in --webhook-cert-dir alone (one replica); none: use the "
        "tls.crt and tls.key found in --webhook-cert-dir (cert-manager)",
    )
    p.add_argument(
        "--self-signed",
        action="store_const",
        const="fs",
        dest="webhook_cert_writer",
        help="the same as --webhook-cert-writer=fs",
    )
    p.add_argument(
        "--webhook-cert-dir",
        default="/tmp/koordinator-webhook-certs",
        help="directory of the certificate files (default /tmp/koordinator-webhook-certs)",
    )
    p.add_argument(
        "--webhook-secret-name",
        default="koordinator-webhook-certs",
        help="the Secret of --webhook-cert-writer=secret, in the service's namespace",
    )
    p.add_argument("--webhook-service-name", default="koordinator-webhook-service")
    p.add_argument(
        "--webhook-service-namespace",
        default=os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE,
        help="namespace of the Service and the Secret (default $POD_NAMESPACE, else "
        "koordinator-system)",
    )
    p.add_argument(
        "--webhook-cert-host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="another DNS name or IP address for the serving certificate (repeatable), for an "
        "API server that calls a URL rather than the Service",
    )
    p.add_argument(
        "--webhook-cert-resync-seconds",
        type=float,
        default=60.0,
        help="how often the certificates and caBundle are checked (default 60)",
    )
    p.add_argument(
        "--mutating-webhook-configuration", default="koordinator-mutating-webhook-configuration"
    )
    p.add_argument(
        "--validating-webhook-configuration", default="koordinator-validating-webhook-configuration"
    )
    return p


async def _watch_files(cert: Path, key: Path, ctx: ssl.SSLContext, every: float) -> None:
    """``--webhook-cert-writer=none``: reload ``ctx`` when the files change (cert-manager
    renews them in the mounted Secret)."""
    seen = await asyncio.to_thread(lambda: (cert.read_bytes(), key.read_bytes()))
    while True:
        await asyncio.sleep(every)
        try:
            now = await asyncio.to_thread(lambda: (cert.read_bytes(), key.read_bytes()))
            if now != seen:
                ctx.load_cert_chain(str(cert), str(key))
                seen = now
                logger.info("serving certificate reloaded from %s", cert.parent)
        except (OSError, ssl.SSLError) as err:
            logger.warning("serving certificate in %s not reloaded: %s", cert.parent, err)


def _keeper(
    client: KubeClient, args: argparse.Namespace, ctx: list[ssl.SSLContext]
) -> CertificateKeeper:
    from manager.webhook.certs import (
        SERVER_CERT_TLS,
        SERVER_KEY_TLS,
        CertificateKeeper,
        KeeperSettings,
    )

    cert_dir = Path(args.webhook_cert_dir)

    def reload(_artifacts: object) -> None:
        if ctx:
            ctx[0].load_cert_chain(str(cert_dir / SERVER_CERT_TLS), str(cert_dir / SERVER_KEY_TLS))
            logger.info("serving certificate reloaded")

    settings = KeeperSettings(
        namespace=args.webhook_service_namespace,
        service=args.webhook_service_name,
        secret=args.webhook_secret_name,
        cert_dir=cert_dir,
        mutating=args.mutating_webhook_configuration,
        validating=args.validating_webhook_configuration,
        extra_hosts=tuple(args.webhook_cert_host),
        resync_seconds=args.webhook_cert_resync_seconds,
        store="secret" if args.webhook_cert_writer == "secret" else "dir",
    )
    return CertificateKeeper(client, settings, on_change=reload)


async def _serve(args: argparse.Namespace) -> int:
    from kubeclient.client import KubeClient
    from kubeclient.signals import StopSignals
    from manager.webhook.certs import SERVER_CERT_TLS, SERVER_KEY_TLS
    from manager.webhook.server import KubeLookups, make_app, server_ssl_context, start

    cert_dir = Path(args.webhook_cert_dir)
    cert, key = cert_dir / SERVER_CERT_TLS, cert_dir / SERVER_KEY_TLS
    client = await KubeClient.connect(args.kubeconfig)
    tasks: list[asyncio.Task[None]] = []
    try:
        with StopSignals() as signals:
            holder: list[ssl.SSLContext] = []
            keeper = None
            if args.webhook_cert_writer != "none":
                keeper = _keeper(client, args, holder)
                if await keeper.first_sync(signals.stop) is None:
                    return 0
            ctx = server_ssl_context(cert, key)
            holder.append(ctx)
            lookups = KubeLookups(client)
            runner, port = await start(
                make_app(lookups), host=args.webhook_host, port=args.webhook_port, ssl_context=ctx
            )
            logger.info(
                "webhook serving on port %d (certificates: %s)", port, args.webhook_cert_writer
            )
            try:
                tasks.append(asyncio.create_task(lookups.informer.run(), name="webhook-profiles"))
                certs = (
                    keeper.run()
                    if keeper is not None
                    else _watch_files(cert, key, ctx, args.webhook_cert_resync_seconds)
                )
                tasks.append(asyncio.create_task(certs, name="webhook-certificates"))
                stop = asyncio.create_task(signals.stop.wait(), name="webhook-stop")
                done, _ = await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
                stop.cancel()
                failed = [t for t in done if t is not stop]
                for task in failed:  # an eternal task that ended is a bug: say so and exit 1
                    logger.error("task %s ended: %r", task.get_name(), task.exception())
                return 1 if failed else 0
            finally:
                await runner.cleanup()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await client.close()


def main(argv: Sequence[str] | None = None) -> int:
    """``koord-manager webhook``: serve the webhooks until SIGTERM; returns the exit status."""
    from kubeclient.errors import KubeError
    from manager.webhook.certs import CertificateError

    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(_serve(args))
    except (KubeError, CertificateError, OSError, ssl.SSLError) as err:
        sys.stderr.write(f"koord-manager webhook: error: {err}\n")
        return 1
