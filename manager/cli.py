"""The ``koord-manager`` entry point.

``koord-manager run [--kubeconfig PATH] ...`` runs the controllers against the API server
(under leader election on the ``koordinator-manager`` Lease unless disabled).

``koord-manager explain --node FILE --node-metric FILE --pods FILE --config FILE [--json]``
prints the batch and mid resources the node resource controller would write for one node, with
every term of the formula. Files are YAML or JSON (JSON when the name ends in ``.json``): a
Node, its NodeMetric, a v1 PodList and the slo-controller-config ConfigMap. Bad input exits 2
with a message naming the file and the field.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from apis.configuration import parse_slo_controller_config
from apis.gobool import parse_go_bool
from apis.slo import SchemaError, read_document
from kubeclient.client import KubeClient
from kubeclient.errors import KubeError
from manager.errors import InputError
from manager.explain import to_json, to_text
from manager.noderesource.calculator import calculate, decide_update
from manager.noderesource.inputs import (
    parse_node,
    parse_node_metric,
    parse_pod_list,
    parse_time,
)
from manager.runner import ManagerSettings, run_controllers

EXIT_BAD_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="koord-manager",
        description="Koordinator's manager: node resources from NodeMetrics and the SLO config.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser(
        "explain",
        help="show the batch and mid resources of one node and how they were computed",
        description="Compute kubernetes.io/batch-cpu, batch-memory, mid-cpu and mid-memory for "
        "one node exactly as the node resource controller does, and show every term.",
    )
    ex.add_argument("--node", required=True, metavar="FILE", help="the Node (YAML or JSON)")
    ex.add_argument("--node-metric", required=True, metavar="FILE", help="the node's NodeMetric")
    ex.add_argument("--pods", required=True, metavar="FILE", help="a v1 PodList of the node")
    ex.add_argument(
        "--config", required=True, metavar="FILE", help="the slo-controller-config ConfigMap"
    )
    ex.add_argument(
        "--json", action="store_true", help="end with one JSON object: resources and terms"
    )
    ex.add_argument(
        "--now",
        metavar="TIME",
        help="RFC 3339 time to judge the NodeMetric's age against (default: the current time)",
    )
    ex.add_argument(
        "--last-update",
        metavar="TIME",
        help="RFC 3339 time of the controller's last write of this Node (default: unknown)",
    )
    run = sub.add_parser("run", help="run the controllers against the API server")
    run.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG or in-cluster)")
    run.add_argument("--config-namespace", default="koordinator-system")
    run.add_argument("--slo-config-name", default="slo-controller-config")
    run.add_argument(
        "--enable-leader-election",
        type=_go_bool,
        default=True,
        metavar="BOOL",
        help="run controllers only while holding the koordinator-manager Lease (default true)",
    )
    run.add_argument("--leader-election-namespace", default="koordinator-system")
    run.add_argument(
        "--sync-period",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="recompute every node at least this often (default 60)",
    )
    return parser


def _go_bool(text: str) -> bool:
    try:
        return parse_go_bool(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


async def _run(settings: ManagerSettings) -> int:
    client = await KubeClient.connect(settings.kubeconfig)
    main_task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        if main_task is not None:
            loop.add_signal_handler(sig, main_task.cancel)
    try:
        await run_controllers(client, settings)
    except asyncio.CancelledError:
        return 0
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return 1  # pragma: no cover - run_controllers never returns


def _explain(args: argparse.Namespace) -> int:
    now = datetime.now(UTC) if args.now is None else parse_time(args.now, "--now", "")
    last = None if args.last_update is None else parse_time(args.last_update, "--last-update", "")
    node = parse_node(read_document(args.node), args.node)
    metric = parse_node_metric(read_document(args.node_metric), args.node_metric)
    pods = parse_pod_list(read_document(args.pods), args.pods)
    cfg_doc = read_document(args.config)
    if cfg_doc is None:
        cfg_doc = {}
    config = parse_slo_controller_config(cfg_doc, args.config, strict=True)
    result = calculate(config, node, metric, pods, now)
    update = decide_update(result, node.extended, last, now)
    out = sys.stdout
    for line in to_text(result, update):
        out.write(line + "\n")
    if args.json:
        out.write(json.dumps(to_json(result, update), sort_keys=False) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["run"]:  # every controller, under leader election (manager/runtime.py)
        from manager.runtime import main as run_main

        return run_main(words[1:])
    if words[:1] == ["webhook"]:  # the colocation-profile admission webhooks
        from manager.webhook import main as webhook_main

        return webhook_main(words[1:])
    args = _parser().parse_args(argv)
    try:
        if args.command == "explain":
            return _explain(args)
        if args.command == "run":
            logging.basicConfig(
                level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
            )
            settings = ManagerSettings(
                kubeconfig=args.kubeconfig,
                config_namespace=args.config_namespace,
                slo_config_name=args.slo_config_name,
                enable_leader_election=args.enable_leader_election,
                leader_election_namespace=args.leader_election_namespace,
                resync_seconds=args.sync_period,
            )
            return asyncio.run(_run(settings))
    except KubeError as err:
        sys.stderr.write(f"koord-manager: error: {err}\n")
        return 1
    except (SchemaError, InputError) as err:
        sys.stderr.write(f"koord-manager: error: {err}\n")
        return EXIT_BAD_INPUT
    return EXIT_BAD_INPUT  # pragma: no cover - argparse requires a known command


if __name__ == "__main__":
    sys.exit(main())
