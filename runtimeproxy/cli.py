"""``koord-runtime-proxy``: the command line (Koordinator's flag names where it has them).

::

    koord-runtime-proxy \\
        --koord-runtimeproxy-endpoint=/var/run/koord-runtimeproxy/runtimeproxy.sock \\
        --remote-runtime-service-endpoint=/var/run/containerd/containerd.sock

and point the kubelet at it: ``--container-runtime-endpoint=unix:///var/run/koord-runtimeproxy/
runtimeproxy.sock`` (docs/runtimehooks.md). SIGTERM or SIGINT stops it; calls in flight get two
seconds. Exit codes: 0 stopped, 1 failed, 2 bad flags.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from apis.duration import parse_duration
from runtimeproxy import __version__
from runtimeproxy.errors import ConfigError, ProxyError
from runtimeproxy.server import ProxyConfig, RuntimeProxy

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger("runtimeproxy")

BACKEND_CONTAINERD = "Containerd"
"""Koordinator's ``--backend-runtime-mode`` for CRI runtimes (containerd, CRI-O)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message, source="command line")


def _path(flag: str, text: str) -> str:
    text = text.strip().removeprefix("unix://")
    if not os.path.isabs(text):
        raise ConfigError(f"must be an absolute socket path, got {text!r}", source=flag)
    return text


def _seconds(flag: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        try:
            value = parse_duration(text)
        except ValueError as err:
            raise ConfigError(str(err), source=flag) from err
    if value <= 0:
        raise ConfigError(f"must be positive, got {text!r}", source=flag)
    return value


def build_parser() -> argparse.ArgumentParser:
    d = ProxyConfig()
    p = _Parser(
        prog="koord-runtime-proxy",
        description="koord-runtime-proxy: the CRI proxy that calls the koordlet's runtime hooks "
        "(Koordinator's flag names where it has them).",
    )
    p.add_argument(
        "--version", action="version", version=f"koord-runtime-proxy (koordinator-py) {__version__}"
    )
    p.add_argument(
        "--koord-runtimeproxy-endpoint",
        default=d.listen,
        metavar="SOCKET",
        help=f"the proxy's socket, for the kubelet (default {d.listen})",
    )
    p.add_argument(
        "--remote-runtime-service-endpoint",
        default=d.runtime_endpoint,
        metavar="SOCKET",
        help=f"the runtime's CRI socket (default {d.runtime_endpoint})",
    )
    p.add_argument(
        "--remote-image-service-endpoint",
        default=d.image_endpoint,
        metavar="SOCKET",
        help=f"the runtime's image service socket (default {d.image_endpoint})",
    )
    p.add_argument(
        "--backend-runtime-mode",
        default=BACKEND_CONTAINERD,
        help="Containerd (any CRI runtime: containerd, CRI-O); Docker is not supported",
    )
    p.add_argument(
        "--runtime-hook-server-endpoint",
        default="",
        metavar="SOCKET",
        help="the koordlet's hook socket for every stage (default: read "
        "--runtime-hooks-config-dir); ours",
    )
    p.add_argument(
        "--runtime-hooks-config-dir",
        default=d.hook_config_dir,
        metavar="DIR",
        help=f"where hook servers register (default {d.hook_config_dir})",
    )
    p.add_argument(
        "--runtime-hook-timeout",
        default="2s",
        metavar="DURATION",
        help="time a hook call may take before the CRI call goes on unchanged (default 2s); ours",
    )
    p.add_argument(
        "--metrics-addr",
        default="",
        metavar="HOST:PORT",
        help="serve koord_runtime_proxy_* metrics here (default: off); ours",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p  # fmt: skip


def load_config(argv: Sequence[str]) -> tuple[ProxyConfig, argparse.Namespace]:
    """The proxy's configuration from its flags; ConfigError naming the flag."""
    args = build_parser().parse_args(list(argv))
    if args.backend_runtime_mode != BACKEND_CONTAINERD:
        raise ConfigError(
            f"{args.backend_runtime_mode!r} is not supported; only {BACKEND_CONTAINERD} "
            "(a CRI runtime) is",
            source="--backend-runtime-mode",
        )
    cfg = ProxyConfig(
        listen=_path("--koord-runtimeproxy-endpoint", args.koord_runtimeproxy_endpoint),
        runtime_endpoint=_path(
            "--remote-runtime-service-endpoint", args.remote_runtime_service_endpoint
        ),
        image_endpoint=_path("--remote-image-service-endpoint", args.remote_image_service_endpoint),
        hook_endpoint=(
            _path("--runtime-hook-server-endpoint", args.runtime_hook_server_endpoint)
            if args.runtime_hook_server_endpoint
            else ""
        ),
        hook_config_dir=args.runtime_hooks_config_dir,
        hook_timeout=_seconds("--runtime-hook-timeout", args.runtime_hook_timeout),
    )
    return cfg, args


async def serve(cfg: ProxyConfig, registry: CollectorRegistry | None, stop: asyncio.Event) -> None:
    """Run the proxy until ``stop`` is set."""
    proxy = RuntimeProxy(cfg, registry)
    await proxy.start()
    try:
        await stop.wait()
    finally:
        await proxy.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """The console script."""
    try:
        cfg, args = load_config(sys.argv[1:] if argv is None else argv)
    except ConfigError as err:
        print(f"koord-runtime-proxy: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    registry = None
    if args.metrics_addr:  # prometheus-client (4 MiB with what it imports) only when serving
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry()
        host, _, port = args.metrics_addr.rpartition(":")
        start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, registry, stop)

    try:
        asyncio.run(run())
    except (ProxyError, OSError) as err:
        logger.error("koord-runtime-proxy failed: %s", err)  # noqa: TRY400 (no trace needed)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
