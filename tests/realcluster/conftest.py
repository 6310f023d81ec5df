"""The real-cluster tier: one real control plane and two real nodes for the whole run
(:mod:`envtest`: etcd, kube-apiserver, kube-controller-manager and kube-scheduler from
``../shared/k8s``; per node a containerd and a kubelet with its own cgroup root), node 0's
kubelet on koord-runtime-proxy, node 1's straight on containerd.

Every test here skips with one line naming what is missing where the binaries or the host tools
are absent (a fresh clone without ``../shared``); CI has them. See docs/realcluster.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envtest import assets
from envtest.cluster import Cluster
from envtest.koordinator import (
    HostProcs,
    Koordinator,
    proxy_front,
    qos_snapshot,
    wait,
)
from envtest.procs import Proc, tail
from envtest.workloads import FAST_COLOCATION, patch_slo_config

_WHY = assets.why_not()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    del config
    for item in items:
        if "tests/realcluster/" in item.nodeid:
            item.add_marker(pytest.mark.realcluster)
            if _WHY is not None:
                item.add_marker(pytest.mark.skip(reason=f"real cluster: {_WHY}"))


def small_node_config() -> str:
    """Node 2's kubelet reserves all but about 300 MiB of the machine's memory: on the same
    host as the others, its NodeMetric usage is theirs while its allocatable is tiny, so it is
    the hot node the descheduler moves pods off."""
    total_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return f"kubeReserved:\n  memory: {total_kib // 1024 - 400}Mi\n"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """Three Ready nodes on this machine: node 0's kubelet on koord-runtime-proxy, node 1's
    straight on containerd, node 2 small (:func:`small_node_config`); torn down at the end of
    the run, even on failure."""
    c = Cluster(nodes=3, fronts={0: proxy_front}, kubelet_config={2: small_node_config()})
    try:
        c.start()
        yield c
    finally:
        c.close()


@pytest.fixture(scope="session")
def koordinator(cluster: Cluster) -> Iterator[Koordinator]:
    """The CRDs, namespace, RBAC and PriorityClasses from packaging/kubernetes, applied with the
    real kubectl; the components start on demand (host processes) and stop with the run."""
    k = Koordinator(cluster)
    try:
        k.install_base()
        yield k
    finally:
        k.close()


KOORDLET_FLAGS = (
    # node 0: its hooks run at creation through the proxy; the reconciler slowed so it cannot
    # be what set a container's limits; memory eviction through the Eviction API only, and the
    # Node condition that keeps BE pods away meanwhile
    (
        "--runtime-hooks-reconcile-interval=1h",
        "--feature-gates=BEMemoryEvict=true,BEEvictionCondition=true",
        "--be-eviction-condition-cool-down=15s",
        "--only-evict-by-api=true",
    ),
    # node 1: no proxy; the reconciler applies the hooks every 3 s
    ("--runtime-hooks-reconcile-interval=3s",),
    # node 2: the small node
    ("--runtime-hooks-reconcile-interval=3s",),
)


def exit_code(p: Proc) -> int | None:
    return p.popen.poll() if p.popen is not None else None


@pytest.fixture(scope="session")
def hostprocs(cluster: Cluster, koordinator: Koordinator) -> HostProcs:
    """Koordinator as host processes (a bare-metal install): the manager (controllers and
    webhook), a koordlet per node (node 0's hook server behind koord-runtime-proxy) and
    koord-scheduler. They run until the install-as-pods tests take over the cluster."""
    if koordinator.taken_over:
        pytest.fail("the host-process components were stopped for the install as pods")
    if koordinator.hostprocs is None:
        patch_slo_config(cluster, {"colocation-config": FAST_COLOCATION})
        manager = koordinator.start_manager()
        for i in range(len(cluster.node_list)):
            name = cluster.node_name(i)
            wait(f"NodeMetric {name}", lambda name=name: cluster.get("nodemetric", name))
        baseline = {n.name: qos_snapshot(n) for n in cluster.node_list}
        koordinator.hostprocs = HostProcs(
            manager=manager,
            webhook=koordinator.start_webhook(),
            koordlets=[
                koordinator.start_koordlet(n, *KOORDLET_FLAGS[i])
                for i, n in enumerate(cluster.node_list)
            ],
            scheduler=koordinator.start_scheduler(),
            baseline=baseline,
        )
    return koordinator.hostprocs


@pytest.fixture(autouse=True)
def host_components_alive(request: pytest.FixtureRequest) -> None:
    """A test on the host-process components fails at once, naming the one that exited and
    showing its log, when one has (nothing restarts them): it would otherwise wait out every
    deadline for work that nobody does."""
    if "hostprocs" not in request.fixturenames:
        return
    k = request.getfixturevalue("koordinator")
    procs = k.hostprocs if isinstance(k, Koordinator) and not k.taken_over else None
    if procs is not None and (exited := procs.exited()):
        pytest.fail(
            "\n".join(f"{p.name} exited with {exit_code(p)}:\n{tail(p.log, 40)}" for p in exited)
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test here carries the last lines of every component's log."""
    report = yield
    if report.failed and call.when == "call":
        funcargs = getattr(item, "funcargs", {})
        c = funcargs.get("cluster")
        k = funcargs.get("koordinator")
        # ours first and longer (a report may be read cut short), then the cluster's
        shown: set[Path] = set()
        if isinstance(k, Koordinator):
            for p in k.procs:
                state = "running" if p.running() else f"exited with {exit_code(p)}"
                report.sections.append((f"log {p.name} ({state})", tail(p.log, 30)))
                shown.add(p.log)
        if isinstance(c, Cluster):
            for name, path in c.logs().items():
                if path not in shown:
                    report.sections.append((f"log {name}", tail(path, 12)))
        if isinstance(c, Cluster) and c.control is not None:
            report.sections.append(
                ("pods", c.kubectl("get", "pods", "-A", "-o", "wide", check=False))
            )
            events = c.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)
            report.sections.append(("events", "\n".join(events.splitlines()[-40:])))
    return report
