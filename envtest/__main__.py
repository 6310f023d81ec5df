"""``python -m envtest up [--nodes N]``: bring up a real cluster by hand (as the tests do), print
where it is, and keep it until SIGINT or SIGTERM, then take it all down."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from envtest.assets import why_not
from envtest.cluster import Cluster


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m envtest")
    p.add_argument("command", choices=["up"])
    p.add_argument("--nodes", type=int, default=1, help="kubelets to start (default 1)")
    args = p.parse_args(argv)
    why = why_not(node=args.nodes > 0)
    if why is not None:
        sys.stderr.write(f"envtest: cannot run here: {why}\n")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    cluster = Cluster(nodes=args.nodes)
    try:
        cluster.start()
        info = {
            "kubeconfig": str(cluster.kubeconfig()),
            "nodes": [n.name for n in cluster.node_list],
            "kubepods": [n.kubepods_dir for n in cluster.node_list],
            "root": str(cluster.root),
            "timings": cluster.timings,
        }
        print(json.dumps(info), flush=True)
        stop.wait()
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
