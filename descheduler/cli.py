"""``koord-descheduler``: ``explain`` a round over a snapshot, or ``run`` against a cluster.

``koord-descheduler explain --snapshot cluster.yaml [--config FILE] [--now TIME] [--rounds N]
[--json]`` prints each node's class and usage against its thresholds, every candidate's fate and
the migrations one round would start (``explain.py``).

``koord-descheduler run [--config FILE] [--kubeconfig FILE] [--dry-run]
[--leader-elect[=BOOL]] [--metrics-addr HOST:PORT] [--log-level LEVEL]`` runs the descheduling
rounds and the MigrationController under the ``koordinator-system/koord-descheduler`` Lease
(``runtime.py``); ``--dry-run`` creates nothing and logs and counts what it would do. SIGTERM or
SIGINT stops it (0), a second one at once.

Exit codes: 0 done, 2 bad input (the message names the file and the field), 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from apis.timestamp import TimestampError, parse_time
from descheduler.cluster import load_cluster
from descheduler.config import DeschedulerConfig, default_config, load_config
from descheduler.errors import ConfigError, InputError
from descheduler.explain import explain
from kubeclient.flags import go_bool_flag

logger = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="koord-descheduler",
        description="koord-descheduler: explain a round over a snapshot, or run against a cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("explain", help="explain what one descheduling round would do")
    ex.add_argument("--snapshot", required=True, type=Path, help="a v1 List of cluster objects")
    ex.add_argument("--config", type=Path, help="a DeschedulerConfiguration")
    ex.add_argument("--now", help="evaluate at this RFC 3339 time (default: the wall clock)")
    ex.add_argument(
        "--rounds",
        type=int,
        help="take the snapshot as observed this many rounds in a row (default: enough for "
        "every anomalyCondition)",
    )
    ex.add_argument("--json", action="store_true", help="one JSON document instead of the text")
    run = sub.add_parser("run", help="deschedule a cluster under leader election")
    run.add_argument("--config", type=Path, help="a DeschedulerConfiguration")
    run.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG or in-cluster)")
    run.add_argument(
        "--dry-run", action="store_true", help="create nothing; log and count what it would do"
    )
    run.add_argument(
        "--leader-elect",
        type=go_bool_flag,
        nargs="?",
        const=True,
        metavar="BOOL",
        help="work only while holding the Lease (default: the config's leaderElect, true)",
    )
    run.add_argument("--metrics-addr", default="0.0.0.0:10251", help="/metrics and /healthz")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def _parse_now(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except TimestampError as err:
        raise ConfigError("--now", "", err.message) from err


def _check_rounds(rounds: int | None) -> None:
    if rounds is not None and rounds < 1:
        raise ConfigError("--rounds", "", f"must be at least 1, got {rounds}")


def _check_addr(addr: str) -> None:
    if not addr.rpartition(":")[2].isdigit():
        raise ConfigError("--metrics-addr", "", f"not HOST:PORT: {addr!r}")


def _config(path: Path | None) -> DeschedulerConfig:
    return load_config(path) if path is not None else default_config()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "explain":
            logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
            cfg = _config(args.config)
            cluster = load_cluster(args.snapshot)
            _check_rounds(args.rounds)
            for line in explain(
                cfg, cluster, now=_parse_now(args.now), rounds=args.rounds, json_line=args.json
            ):
                print(line)
            return 0
        logging.basicConfig(
            level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        cfg = _config(args.config)
        _check_addr(args.metrics_addr)
        import uvloop

        from descheduler.runtime import run_daemon  # the Kubernetes client, when running

        return uvloop.run(
            run_daemon(
                cfg,
                kubeconfig=args.kubeconfig,
                dry_run=args.dry_run or cfg.dry_run,
                leader_elect=args.leader_elect,
                metrics_addr=args.metrics_addr,
            )
        )
    except (ConfigError, InputError) as err:
        print(f"koord-descheduler: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
