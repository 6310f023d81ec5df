"""The koordlet in cluster mode, in-process, against the fake API server: pods and NodeSLO from
the API server, protection going on while the API server is unreachable, and the NodeMetric
report valid against the CRD once it is back."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from pathlib import Path
from typing import Any

import aiohttp

from apis.crdschema import validate
from apis.extension import KubeQOS
from koordlet.config import (
    CgroupConfig,
    CollectConfig,
    KoordletConfig,
    KubeConfig,
    QoSConfig,
    ServerConfig,
)
from koordlet.daemon import EXIT_OK, Daemon
from koordlet.metriccache.series import NODE, NODE_CPU_USAGE
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.daemon import free_port
from tests.fakehost import FakeHost, container_id
from tests.kube.conftest import eventually
from tests.kube.test_kubelet_source import FakeKubelet, _serve
from tests.kubefake import FakeApiServer, Fault

NODE_NAME = "node-1"
UID = "7d1c8f00-1111-4e4e-9a9a-000000000042"
CID = container_id("batch")


def node() -> dict[str, Any]:
    return {
        "metadata": {"name": NODE_NAME, "uid": "node-uid-1"},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi"}, "capacity": {"cpu": "4"}},
    }


def pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "batch-1",
            "namespace": "jobs",
            "uid": UID,
            "labels": {"koordinator.sh/qosClass": "BE"},
        },
        "spec": {"nodeName": NODE_NAME, "containers": [{"name": "main"}]},
        "status": {
            "phase": "Running",
            "qosClass": "BestEffort",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}],
        },
    }


def nodeslo(threshold: int) -> dict[str, Any]:
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": NODE_NAME},
        "spec": {
            "resourceUsedThresholdWithBE": {
                "enable": True,
                "cpuSuppressThresholdPercent": threshold,
                "cpuSuppressPolicy": "cfsQuota",
            }
        },
    }


def nodemetric() -> dict[str, Any]:
    return {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeMetric",
        "metadata": {"name": NODE_NAME},
        "spec": {"metricCollectPolicy": {"aggregateDurationSeconds": 60}},
    }


def config(fake: FakeHost, kubeconfig: Path) -> KoordletConfig:
    return KoordletConfig(
        node_name=NODE_NAME,
        paths=fake.paths,
        cgroup=CgroupConfig(version="v1", driver="cgroupfs"),
        collect=CollectConfig(res_used_interval=0.2),
        qos=QoSConfig(cpu_suppress_interval=SUPPRESS_INTERVAL_S),
        server=ServerConfig(addr=f"127.0.0.1:{free_port()}"),
        standalone=False,
        state_dir=str(fake.root / "state"),
        kube=KubeConfig(kubeconfig=str(kubeconfig), sync_timeout=10.0, request_timeout=2.0),
    )


def threshold_of(daemon: Daemon) -> int | None:
    states = daemon.kube_states
    if states is None:
        return None
    return states.node_slo.resource_used_threshold_with_be.cpu_suppress_threshold_percent


OUTAGE_S = 3.0
"""How long the API server is unreachable. Every informer's watch and relists fail through
several backoff steps (0.5, 1, 2 s), and with the suppress loop ten times faster than
Koordinator's default the outage spans as many of its rounds as 30 s would. Nothing in the
Kubernetes source, the reporter or the QoS loops times the API server's absence (the informers'
backoff only grows, to its 30 s cap), so the minute this test once waited added only waiting."""
SUPPRESS_INTERVAL_S = 0.1
"""Seconds between CPU suppress rounds here (Koordinator's default: 1 s)."""


def suppress_rounds(daemon: Daemon) -> int:
    tasks = {t["name"]: t for s in daemon._supervisors for t in s.describe()}
    return int(tasks["qos/cpusuppress"]["runs"])


async def daemon_readyz(daemon: Daemon) -> int:
    server = daemon.cfg.server
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{server.host}:{server.port}/readyz") as resp,
    ):
        return resp.status


def last_node_cpu_ts(daemon: Daemon) -> float:
    cache = daemon.cache
    assert cache is not None
    sample = cache.last_sample(NODE_CPU_USAGE, NODE)
    return sample[0] if sample is not None else 0.0


async def test_cluster_mode_follows_the_api_server_and_keeps_protecting_while_it_is_gone(
    kube_api: FakeApiServer, kubeconfig: Path, host_root: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    pod_rel, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", CID)])
    kube_api.put("nodes", node())
    kube_api.put("pods", pod())
    kube_api.put("nodeslos", nodeslo(60))
    kube_api.put("nodemetrics", nodemetric())
    daemon = Daemon(config(fake, kubeconfig))
    try:
        assert await daemon.start() == EXIT_OK
        inventory = daemon.inventory
        assert inventory is not None

        # Pods and the NodeSLO come from the API server.
        (got,) = inventory.snapshot().pods.values()
        assert (got.name, got.namespace, got.cgroup_dir) == ("batch-1", "jobs", pod_rel)
        assert threshold_of(daemon) == 60
        changed = nodeslo(45)
        kube_api.put("nodeslos", changed)
        await eventually(lambda: threshold_of(daemon) == 45)

        # The API server goes away: collection and the QoS loops go on.
        kube_api.faults.append(Fault(drop=True, times=10**6))
        kube_api.drop_watches()
        gone_at = time.time()
        rounds_before = suppress_rounds(daemon)
        await asyncio.sleep(OUTAGE_S)
        assert last_node_cpu_ts(daemon) > gone_at + OUTAGE_S - 1.0
        # at least half the rounds the outage has room for (a loaded machine may skip ticks)
        assert suppress_rounds(daemon) >= rounds_before + OUTAGE_S / SUPPRESS_INTERVAL_S / 2
        assert threshold_of(daemon) == 45  # the last good NodeSLO stays in force
        assert (await daemon_readyz(daemon)) == 200

        # It comes back: the informers resume and see a change made meanwhile.
        kube_api.faults.clear()
        back = copy.deepcopy(nodeslo(55))
        kube_api.put("nodeslos", back)
        await eventually(lambda: threshold_of(daemon) == 55, within=30.0)

        # The NodeMetric report (due every 60 s) is written through the status subresource.
        reporter = daemon.reporter
        assert reporter is not None
        await reporter.report_once()
        written = kube_api.get("nodemetrics", NODE_NAME)
        assert written is not None
        assert written["status"]["nodeMetric"]["nodeUsage"]["resources"]["memory"]
        assert validate(written) == []
        assert kube_api.writes("PUT", "/status")
    finally:
        await daemon.stop()


async def test_with_the_kubelet_as_pod_source_the_daemon_takes_its_pods_from_slash_pods(
    kube_api: FakeApiServer, kubeconfig: Path, host_root: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    pod_rel, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", CID)])
    kube_api.put("nodes", node())
    kube_api.put("nodeslos", nodeslo(60))
    kube_api.put("nodemetrics", nodemetric())  # no pod in the API server: only the kubelet has it
    async for kubelet in _serve(FakeKubelet(pods=[pod()], token=None)):
        base = config(fake, kubeconfig)
        cfg = dataclasses.replace(
            base,
            kube=dataclasses.replace(
                base.kube,
                pods_source="kubelet",
                kubelet_address="127.0.0.1",
                kubelet_insecure_tls=True,
                kubelet_read_only_port=kubelet.port,
            ),
        )
        daemon = Daemon(cfg)
        try:
            assert await daemon.start() == EXIT_OK
            inventory = daemon.inventory
            assert inventory is not None
            (got,) = inventory.snapshot().pods.values()
            assert (got.name, got.source, got.cgroup_dir) == ("batch-1", "kubelet", pod_rel)
            assert kubelet.authorizations  # it was asked
        finally:
            await daemon.stop()
