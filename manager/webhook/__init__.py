"""The pod admission webhooks: ClusterColocationProfiles (mutating) and co-location rules
(validating), served over TLS.

Modules: :mod:`~manager.webhook.profiles` (profile parsing, mutation, JSON patch),
:mod:`~manager.webhook.validation` (the rules), :mod:`~manager.webhook.certs` (self-managed
certificates and caBundle injection), :mod:`~manager.webhook.server` (the aiohttp app).

Errors::

    ProfileError        a profile that cannot be used (a manager.errors.ManagerError and an
                        apis.errors.FieldError: source the profile, field its path)
    LookupError_        a namespace or PriorityClass the API server would not give
    CertificateError    the self-managed certificates could not be made
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from kubeclient.flags import SuggestingParser


def _parser() -> argparse.ArgumentParser:
    p = SuggestingParser(
        prog="koord-manager webhook",
        description="Serve the pod mutating and validating webhooks over TLS.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG or in-cluster)")
    p.add_argument("--webhook-host", default="0.0.0.0", help="address to listen on")
    p.add_argument("--webhook-port", type=int, default=9876, help="port (default 9876)")
    p.add_argument(
        "--webhook-cert-dir",
        default="/tmp/k8s-webhook-server/serving-certs",
        help="directory of tls.crt and tls.key (cert-manager mounts them here)",
    )
    p.add_argument(
        "--self-signed",
        action="store_true",
        help="make a CA and serving certificate in --webhook-cert-dir when missing or expiring, "
        "and inject the CA into the webhook configurations (no cert-manager)",
    )
    p.add_argument("--webhook-service-name", default="koordinator-webhook-service")
    p.add_argument("--webhook-service-namespace", default="koordinator-system")
    p.add_argument(
        "--mutating-webhook-configuration", default="koordinator-mutating-webhook-configuration"
    )
    p.add_argument(
        "--validating-webhook-configuration", default="koordinator-validating-webhook-configuration"
    )
    return p


async def _serve(args: argparse.Namespace) -> int:
    from kubeclient.client import KubeClient
    from kubeclient.signals import StopSignals
    from manager.webhook.certs import ensure_certificates, inject_ca_bundle
    from manager.webhook.server import KubeLookups, make_app, start

    cert_dir = Path(args.webhook_cert_dir)
    client = await KubeClient.connect(args.kubeconfig)
    try:
        if args.self_signed:
            paths = await asyncio.to_thread(
                ensure_certificates,
                cert_dir,
                service=args.webhook_service_name,
                namespace=args.webhook_service_namespace,
            )
            await inject_ca_bundle(
                client,
                paths.ca_cert.read_bytes(),
                mutating=args.mutating_webhook_configuration,
                validating=args.validating_webhook_configuration,
            )
        lookups = KubeLookups(client)
        informer = asyncio.create_task(lookups.informer.run(), name="profiles-informer")
        runner, port = await start(
            make_app(lookups),
            host=args.webhook_host,
            port=args.webhook_port,
            cert=cert_dir / "tls.crt",
            key=cert_dir / "tls.key",
        )
        logging.getLogger(__name__).info("webhook serving on port %d", port)
        try:
            with StopSignals() as signals:  # SIGTERM or SIGINT; a second one exits at once
                await signals.stop.wait()
        finally:
            await runner.cleanup()
            informer.cancel()
            await asyncio.gather(informer, return_exceptions=True)
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return 0


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
    except (KubeError, CertificateError, OSError) as err:
        sys.stderr.write(f"koord-manager webhook: error: {err}\n")
        return 1
