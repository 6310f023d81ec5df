"""The real koordlet process on this machine's cgroup v1 hierarchy, with a pod made by hand.

A BestEffort pod with one container running a real busy loop is created under a unique prefix
(``kpytest-<hex>/kubepods/``) in the cpu, cpuacct, cpuset and memory controllers, with the
``tree`` fixture of the collectors' real-cgroup test (which always kills its processes and removes
its cgroups). The koordlet, pointed at that prefix with ``--cgroup-kube-path``, must list the pod,
measure about one core, and forget pod and series once the tree is deleted under it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tests.daemon import one_value
from tests.daemon.test_daemon_process import Proc, koordlet
from tests.integration import test_collectors_realcgroup as realcgroup
from tests.integration.test_collectors_realcgroup import BUSY, Tree, tree  # noqa: F401 (fixture)

pytestmark = realcgroup.pytestmark


def _entities(proc: Proc) -> set[str]:
    return set(proc.json("/debug/metrics")["entities"])


def test_a_hand_made_besteffort_pod_is_found_measured_and_forgotten(
    tree: Tree,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    kube_root = tree.host.layout.kube_root
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    pod_rel = f"{kube_root}/besteffort/pod{uid}"
    ctr_rel = f"{pod_rel}/{cid}"
    for rel in (kube_root, f"{kube_root}/burstable", f"{kube_root}/besteffort", pod_rel, ctr_rel):
        tree.mkdir(rel)
    args = [
        "--standalone",
        "--nodeslo-file",
        "",
        "--cgroup-kube-path",
        f"{kube_root}/",
        "--collect-res-used-interval-seconds",
        "1",
    ]

    with koordlet([sys.executable, "-m", "koordlet"], args, tmp_path) as k:
        busy = subprocess.Popen([sys.executable, "-c", BUSY], text=True)
        tree.procs.append(busy)
        tree.attach(ctr_rel, busy.pid)

        def pod_listed() -> dict[str, Any] | None:
            pods = k.json("/debug/workloads")["pods"]
            return next((p for p in pods if p["uid"] == uid), None)

        pod = k.until("pod listed", pod_listed, timeout=10)
        assert (pod["qos"], pod["kube_qos"]) == ("BE", "BestEffort")
        assert pod["cgroup_dir"] == pod_rel
        assert [c["cgroup_dir"] for c in pod["containers"]] == [ctr_rel]

        seen: list[float] = []
        deadline = time.monotonic() + 15
        while not (seen and 0.6 <= seen[-1] <= 1.4) and time.monotonic() < deadline:
            time.sleep(0.5)
            value = one_value(k.samples(), "koordlet_pod_used_cpu_cores", pod_uid=uid)
            if value is not None:
                seen.append(round(value, 2))
        assert seen, "no CPU usage exported for the pod"
        assert 0.6 <= seen[-1] <= 1.4, f"the pod's CPU usage was never about one core: {seen}"
        assert f"pod/{uid}" in _entities(k)

        tree.cleanup()  # kills the busy loop, then removes the tree under the running koordlet

        def forgotten() -> bool:
            if any(p["uid"] == uid for p in k.json("/debug/workloads")["pods"]):
                return False
            mine = (f"pod/{uid}", f"container/{uid}/")
            return not any(e.startswith(mine) for e in _entities(k))

        k.until("pod and its series gone", forgotten, timeout=10)
        assert k.stop(signal.SIGTERM) == 0
