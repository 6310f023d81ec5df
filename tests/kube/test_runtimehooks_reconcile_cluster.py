"""The runtime hooks' reconciler in cluster mode: a BE pod with batch resources that the kubelet
started before the koordlet (no hook ever saw it) gets its cgroups from the reconciler, within
one interval of the koordlet's start.

The koordlet runs in-process against the fake API server (the pod, with ``kubernetes.io/
batch-cpu`` and ``batch-memory`` in its spec and no ``extended-resource-spec`` annotation, comes
from there) and on this machine's real cgroup v1 hierarchy, under a unique ``kpytest-<hex>``
prefix made by the real-cgroup tests' ``tree`` fixture (which removes it even on failure). The
values are read back from the kernel's files.
"""

from __future__ import annotations

import secrets
import time
import uuid
from pathlib import Path
from typing import Any

from apis.extension import KubeQOS
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY
from koordlet.config import (
    CgroupConfig,
    KoordletConfig,
    KubeConfig,
    RuntimeHooksConfig,
    ServerConfig,
)
from koordlet.daemon import EXIT_OK, Daemon
from koordlet.features import FeatureGates
from koordlet.system.paths import HostPaths
from tests.daemon import free_port
from tests.integration import test_collectors_realcgroup as realcgroup
from tests.integration.test_collectors_realcgroup import Tree, tree  # noqa: F401 (fixture)
from tests.kube.conftest import eventually
from tests.kubefake import FakeApiServer

pytestmark = realcgroup.pytestmark

NODE_NAME = "node-rh"
INTERVAL_S = 1.0
"""The reconcile interval here (Koordinator's default: 10 s)."""
GI = 1 << 30


def be_pod(uid: str, cid: str) -> dict[str, Any]:
    batch = {
        "requests": {BATCH_CPU: "1000", BATCH_MEMORY: "1Gi"},
        "limits": {BATCH_CPU: "2000", BATCH_MEMORY: "1Gi"},
    }
    return {
        "metadata": {
            "name": "batch-job",
            "namespace": "jobs",
            "uid": uid,
            "labels": {"koordinator.sh/qosClass": "BE"},
        },
        "spec": {"nodeName": NODE_NAME, "containers": [{"name": "main", "resources": batch}]},
        "status": {
            "phase": "Running",
            "qosClass": "BestEffort",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}],
        },
    }


async def test_a_be_pod_started_before_the_koordlet_gets_its_batch_cgroups_from_the_reconciler(
    kube_api: FakeApiServer,
    kubeconfig: Path,
    tree: Tree,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    layout = tree.host.layout
    uid, cid = str(uuid.uuid4()), secrets.token_hex(32)
    pod_rel = layout.pod_dir(KubeQOS.BESTEFFORT, uid)
    ctr_rel = layout.container_dir(pod_rel, "containerd", cid)
    for rel in (
        layout.kube_root,
        layout.qos_dir(KubeQOS.BURSTABLE),
        layout.qos_dir(KubeQOS.BESTEFFORT),
        pod_rel,
        ctr_rel,
    ):
        tree.mkdir(rel)
    for rel in (layout.qos_dir(KubeQOS.BESTEFFORT), pod_rel, ctr_rel):  # as the kubelet sets them
        tree_write(tree, "cpu", rel, "cpu.shares", "2")
    kube_api.put("nodes", {"metadata": {"name": NODE_NAME, "uid": "node-uid-rh"}})
    kube_api.put("pods", be_pod(uid, cid))

    cfg = KoordletConfig(
        node_name=NODE_NAME,
        paths=HostPaths(),
        cgroup=CgroupConfig(version="v1", driver="cgroupfs", kube_path=f"{layout.kube_root}/"),
        server=ServerConfig(addr=f"127.0.0.1:{free_port()}"),
        standalone=False,
        state_dir=str(tmp_path / "state"),
        kube=KubeConfig(kubeconfig=str(kubeconfig), sync_timeout=10.0, request_timeout=2.0),
        runtime_hooks=RuntimeHooksConfig(addr="", nri=False, reconcile_interval=INTERVAL_S),
        # the besteffort cgroup's quota is CPU suppress's: off, so nothing but the hooks writes
        feature_gates=FeatureGates({"BECPUSuppress": False}),
    )
    daemon = Daemon(cfg)
    try:
        assert await daemon.start() == EXIT_OK
        started = time.monotonic()

        def cgroups() -> tuple[str, ...]:
            return tuple(
                tree_read(tree, controller, rel, name)
                for rel in (pod_rel, ctr_rel)
                for controller, name in (
                    ("cpu", "cpu.shares"),
                    ("cpu", "cpu.cfs_quota_us"),
                    ("memory", "memory.limit_in_bytes"),
                )
            )

        want = ("1024", "200000", str(GI)) * 2
        # the first round runs when the stage starts: one interval, with room for a loaded box
        await eventually(lambda: cgroups() == want, within=3 * INTERVAL_S)
        took = time.monotonic() - started
        hooks = daemon.runtime_hooks
        assert hooks is not None
        assert hooks.reconciler is not None
        last = hooks.reconciler.describe()["last_round"]
        assert last["pods"] >= 1
        assert last["errors"] == []
        print(f"converged {took:.2f}s after start (interval {INTERVAL_S}s)")
    finally:
        await daemon.stop()


def tree_write(made: Tree, controller: str, rel: str, name: str, value: str) -> None:
    with open(made.host.layout.file(controller, rel, name), "w") as f:
        f.write(value)


def tree_read(made: Tree, controller: str, rel: str, name: str) -> str:
    with open(made.host.layout.file(controller, rel, name)) as f:
        return f.read().strip()
