"""The ``koord-manager`` entry point: one table of subcommands, each with its own parser.

``koord-manager run [--kubeconfig PATH] [--controllers NAMES] ...`` runs the controllers against
the API server, under leader election on the ``koordinator-manager`` Lease unless disabled
(:mod:`manager.runtime`).

``koord-manager explain --node FILE --node-metric FILE --pods FILE --config FILE [--json]``
prints the batch and mid resources the node resource controller would write for one node, with
every term of the formula (with ``--json`` one JSON document instead, nothing else). Files are
YAML or JSON (JSON when the name ends in ``.json``): a
Node, its NodeMetric, a v1 PodList and the slo-controller-config ConfigMap. Bad input exits 2
with a message naming the file and the field.

``koord-manager webhook [--webhook-cert-writer secret|fs|none] ...`` serves the pod admission
webhooks (:mod:`manager.webhook`).

``koord-manager --help`` lists :data:`COMMANDS`; ``koord-manager COMMAND --help`` its options.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from apis.records import frozen
from apis.slo import SchemaError, read_document
from apis.sloconfig import parse_slo_controller_config
from apis.timestamp import TimestampError, parse_time_datetime
from kubeclient.flags import SuggestingParser
from manager.errors import InputError
from manager.explain import to_json, to_text
from manager.noderesource.calculator import calculate, decide_update
from manager.noderesource.inputs import (
    parse_node,
    parse_node_metric,
    parse_pod_list,
    topology_annotations,
)

EXIT_BAD_INPUT = 2


@frozen
class Command:
    """One subcommand of ``koord-manager``."""

    help: str
    """Its line in ``koord-manager --help``."""
    main: Callable[[Sequence[str]], int]
    """Runs it on the words after its name; returns the exit status."""


def _run_main(argv: Sequence[str]) -> int:
    from manager.runtime import main  # the controllers and the Kubernetes client, when running

    return main(argv)


def _webhook_main(argv: Sequence[str]) -> int:
    from manager.webhook import main  # aiohttp's TLS server, when serving

    return main(argv)


def _explain_parser() -> argparse.ArgumentParser:
    ex = SuggestingParser(
        prog="koord-manager explain",
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
        "--node-resource-topology",
        metavar="FILE",
        help="the node's NodeResourceTopology: its cpu-basic-info annotation picks the CPU "
        "normalization ratio, as the controller reads it (default: the Node's annotation)",
    )
    ex.add_argument(
        "--json",
        action="store_true",
        help="one JSON object (resources and terms) instead of the text",
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
    return ex


def _explain_main(argv: Sequence[str]) -> int:
    args = _explain_parser().parse_args(argv)
    try:
        return _explain(args)
    except (SchemaError, InputError) as err:
        sys.stderr.write(f"koord-manager: error: {err}\n")
        return EXIT_BAD_INPUT


def _flag_time(text: str, flag: str) -> datetime:
    try:
        return parse_time_datetime(text)
    except TimestampError as err:
        raise InputError(flag, "", err.message) from err


def _explain(args: argparse.Namespace) -> int:
    now = datetime.now(UTC) if args.now is None else _flag_time(args.now, "--now")
    last = None if args.last_update is None else _flag_time(args.last_update, "--last-update")
    node = parse_node(read_document(args.node), args.node)
    metric = parse_node_metric(read_document(args.node_metric), args.node_metric)
    pods = parse_pod_list(read_document(args.pods), args.pods)
    cfg_doc = read_document(args.config)
    if cfg_doc is None:
        cfg_doc = {}
    config = parse_slo_controller_config(cfg_doc, args.config, strict=True)
    topology: Mapping[str, str] = {}
    if args.node_resource_topology:
        topology = topology_annotations(
            read_document(args.node_resource_topology), args.node_resource_topology
        )
    result = calculate(config, node, metric, pods, now, topology_annotations=topology)
    update = decide_update(result, node.extended, last, now)
    out = sys.stdout
    if args.json:  # one JSON document and nothing else, for a pipe to jq
        out.write(json.dumps(to_json(result, update), sort_keys=False) + "\n")
        return 0
    for line in to_text(result, update):
        out.write(line + "\n")
    return 0


COMMANDS: Mapping[str, Command] = {
    "run": Command("run the controllers against the API server, under leader election", _run_main),
    "explain": Command(
        "show the batch and mid resources of one node and how they were computed", _explain_main
    ),
    "webhook": Command("serve the colocation-profile admission webhooks over TLS", _webhook_main),
}
"""Every subcommand, by the name it is called with."""


def _parser() -> argparse.ArgumentParser:
    """The top level: lists :data:`COMMANDS` (each parses its own options)."""
    parser = SuggestingParser(
        prog="koord-manager",
        description="Koordinator's manager: node resources, NodeSLOs and NodeMetrics from the "
        "SLO config, and the colocation-profile webhooks.",
        epilog="'koord-manager COMMAND --help' lists a command's options.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in COMMANDS:
        return COMMANDS[words[0]].main(words[1:])
    _parser().parse_args(words)  # --help, or a usage error naming the commands (exit 2)
    return EXIT_BAD_INPUT  # pragma: no cover - argparse exits without a known command


if __name__ == "__main__":
    sys.exit(main())
