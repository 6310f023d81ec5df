"""``koord-scheduler``: ``explain`` a placement, or serve the kube-scheduler ``extender``.

``koord-scheduler explain --pod FILE --snapshot FILE [--config FILE] [--now TIME] [--json]``
prints each plugin's filter verdict (with its reason) and score per node, the total, the node
the scheduler would pick and what reserve would write on the pod. With ``--json`` it prints one
JSON document and nothing else: ``{"nodes": {NODE: {"feasible", "reasons", "scores",
"score"}}}`` (0..100 scales).

``koord-scheduler extender [--snapshot FILE] --addr 127.0.0.1:PORT [--config FILE]
[--kubeconfig FILE] [--bind]`` serves the extender verbs (see ``extender.py``) over a snapshot
file, or, without ``--snapshot``, over informers of the API server.

``koord-scheduler run [--kubeconfig FILE] [--config FILE] [--scheduler-name NAME]
[--leader-elect[=BOOL]] [--leader-elect-lease-duration D] [--leader-elect-renew-deadline D]
[--leader-elect-retry-period D] [--leader-elect-resource-name NAME]
[--leader-elect-resource-namespace NS]`` schedules and binds the pods whose ``schedulerName`` is
``koord-scheduler`` (see ``standalone.py``), only while holding the
``koordinator-system/koord-scheduler`` Lease unless ``--leader-elect=false`` (see ``leader.py``;
SIGTERM or SIGINT stops it, a second one at once).
The election settings come from the ``--config`` file's ``leaderElection`` stanza, each flag
given on the command line overriding its field (as kube-scheduler does); durations are Go
durations (``15s``).

Exit codes: 0 done (an unschedulable pod included), 2 bad input (the message names the file and
the field), 1 anything else.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from apis.timestamp import TimestampError, parse_time
from kubeclient.flags import SuggestingParser, duration_flag, go_bool_flag
from scheduler_plugins.config import SchedulerConfig, load_config, parse_feature_gates
from scheduler_plugins.errors import InputError
from scheduler_plugins.evaluation import Evaluation
from scheduler_plugins.framework import Framework
from scheduler_plugins.leader import LeaderElection, from_config
from scheduler_plugins.loading import load_pod, load_snapshot
from scheduler_plugins.snapshot import PodInfo, Snapshot

logger = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
        prog="koord-scheduler",
        description="koord-scheduler: explain a placement, or serve the kube-scheduler extender.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="explain where a pod would go and why")
    ex.add_argument("--pod", required=True, type=Path, help="a v1 Pod (YAML or JSON)")
    ex.add_argument("--snapshot", required=True, type=Path, help="a v1 List of cluster objects")
    ex.add_argument("--config", type=Path, help="KubeSchedulerConfiguration-style plugin args")
    ex.add_argument(
        "--feature-gates", default="", help="A=true,B=false (ElasticQuotaGuaranteeUsage)"
    )
    ex.add_argument("--now", help="evaluate at this RFC 3339 time (default: the wall clock)")
    ex.add_argument("--json", action="store_true", help="one JSON document instead of the text")
    ext = sub.add_parser("extender", help="serve the kube-scheduler extender protocol")
    ext.add_argument(
        "--snapshot", type=Path, help="a v1 List of cluster objects (default: informers)"
    )
    ext.add_argument("--addr", default="127.0.0.1:10262", help="listen address HOST:PORT")
    ext.add_argument("--config", type=Path, help="KubeSchedulerConfiguration-style plugin args")
    ext.add_argument(
        "--feature-gates", default="", help="A=true,B=false (ElasticQuotaGuaranteeUsage)"
    )
    ext.add_argument("--bind", action="store_true", help="bind through the API server")
    ext.add_argument(
        "--kubeconfig", help="kubeconfig for informers and --bind (default: in-cluster)"
    )
    ext.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run = sub.add_parser("run", help="schedule pods with schedulerName koord-scheduler")
    run.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster)")
    run.add_argument("--config", type=Path, help="KubeSchedulerConfiguration-style plugin args")
    run.add_argument(
        "--feature-gates", default="", help="A=true,B=false (ElasticQuotaGuaranteeUsage)"
    )
    run.add_argument("--scheduler-name", default="koord-scheduler")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    le = run.add_argument_group("leader election (kube-scheduler's flags)")
    le.add_argument(
        "--leader-elect",
        type=go_bool_flag,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="schedule only while holding the Lease (default true)",
    )
    for flag, default in (
        ("lease-duration", "15s"),
        ("renew-deadline", "10s"),
        ("retry-period", "2s"),
    ):
        le.add_argument(
            f"--leader-elect-{flag}",
            type=duration_flag,
            metavar="DURATION",
            help=f"default {default}",
        )
    le.add_argument("--leader-elect-resource-lock", choices=["leases"], help="default leases")
    le.add_argument("--leader-elect-resource-name", help="default koord-scheduler")
    le.add_argument("--leader-elect-resource-namespace", help="default koordinator-system")
    return parser


def leader_election(args: argparse.Namespace) -> LeaderElection:
    """The ``run`` command's election settings: the config file's ``leaderElection`` stanza,
    then each ``--leader-elect*`` flag given on the command line. Raises :class:`InputError`."""
    base = LeaderElection()
    if args.config is not None:
        try:
            doc = yaml.safe_load(args.config.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise InputError(str(args.config), "", str(err)) from err
        if isinstance(doc, dict):
            base = from_config(doc, str(args.config))
    flags = {
        "leader_elect": args.leader_elect,
        "lease_duration": args.leader_elect_lease_duration,
        "renew_deadline": args.leader_elect_renew_deadline,
        "retry_period": args.leader_elect_retry_period,
        "resource_name": args.leader_elect_resource_name,
        "resource_namespace": args.leader_elect_resource_namespace,
    }
    election = dataclasses.replace(base, **{k: v for k, v in flags.items() if v is not None})
    if election.leader_elect:
        try:
            election.config()
        except ValueError as err:
            raise InputError("--leader-elect-*", "", str(err)) from err
    return election


def _parse_now(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except TimestampError as err:
        raise InputError("--now", "", err.message) from err


def _split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not port.isdigit():
        raise InputError("--addr", "", f"not HOST:PORT: {addr!r}")
    return host or "127.0.0.1", int(port)


def _describe_pod(pod: PodInfo) -> str:
    req = ", ".join(f"{k}={v}" for k, v in sorted(pod.requests.items())) or "none"
    return (
        f"pod {pod.key}: qos {pod.qos_class}, priority class {pod.priority_class}, "
        f"requests {req} (cpu in milli-cores)"
    )


def render(
    fw: Framework, pod: PodInfo, evaluation: Evaluation, reserved: dict[str, str] | None
) -> list[str]:
    """The human-readable explanation."""
    lines = [_describe_pod(pod)]
    width = max((len(p.name) for p in fw.plugins), default=10)
    for name, result in evaluation.nodes.items():
        verdict = "feasible" if result.feasible else "infeasible"
        total = f", score {result.score}" if result.feasible else ""
        lines.append(f"node {name}: {verdict}{total}")
        for plugin in fw.plugins:
            reason = result.rejected_by.get(plugin.name)
            text = f"FAIL  {reason}" if reason is not None else "pass"
            if plugin.name in result.scores:
                text += f"  score {result.scores[plugin.name]} (weight {fw.weights[plugin.name]})"
            lines.append(f"  {plugin.name:<{width}}  {text}")
        shown = set(result.rejected_by.values())
        lines.extend(f"  {'':<{width}}  FAIL  {r}" for r in result.reasons if r not in shown)
    best = evaluation.best()
    if best is None:
        lines.append("result: unschedulable")
    else:
        lines.append(f"result: {best}")
        for key, value in (reserved or {}).items():
            lines.append(f"  reserve writes {key}: {value}")
    return lines


def _config(path: Path | None, feature_gates: str) -> SchedulerConfig:
    """The ``--config`` file (or the defaults) with the ``--feature-gates``."""
    cfg = load_config(path) if path else SchedulerConfig()
    return dataclasses.replace(cfg, feature_gates=parse_feature_gates(feature_gates))


def explain(
    pod_path: Path,
    snapshot_path: Path,
    config_path: Path | None,
    now: float | None,
    as_json: bool,
    feature_gates: str = "",
) -> int:
    cfg = _config(config_path, feature_gates)
    fw = cfg.framework()
    snapshot: Snapshot = load_snapshot(snapshot_path)
    pod = load_pod(pod_path)
    snapshot.pending_pods.pop(pod.uid, None)
    cycle = fw.new_cycle(snapshot, now)
    evaluation = fw.evaluate(snapshot, pod, cycle=cycle, all_verdicts=True)
    best = evaluation.best()
    reserved = fw.reserve(cycle, pod, best) if best is not None else None
    if as_json:  # one JSON document and nothing else
        print(json.dumps(evaluation.as_json(), sort_keys=False, separators=(",", ":")))
        return 0
    for line in render(fw, pod, evaluation, reserved):
        print(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "explain":
            return explain(
                args.pod,
                args.snapshot,
                args.config,
                _parse_now(args.now),
                args.json,
                args.feature_gates,
            )
        logging.basicConfig(
            level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        import uvloop

        if args.command == "run":
            cfg = _config(args.config, args.feature_gates)
            election = leader_election(args)
            from scheduler_plugins.leader import run_elected  # the Kubernetes client, when running

            return uvloop.run(run_elected(cfg, args.kubeconfig, election, args.scheduler_name))
        from scheduler_plugins.extender import serve  # aiohttp only for the server

        cfg = _config(args.config, args.feature_gates)
        host, port = _split_addr(args.addr)
        return uvloop.run(
            serve(args.snapshot, cfg, host, port, bind=args.bind, kubeconfig=args.kubeconfig)
        )
    except InputError as err:
        print(f"koord-scheduler: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
