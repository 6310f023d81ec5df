"""What the koordlet does to a started container itself (``PostStartContainer``): its threads into
its class's resctrl group (a fake resctrl mount: this machine has none) and its core scheduling
cookie (a fake kernel: this one lacks ``CONFIG_SCHED_CORE``); and both reported unsupported
with the reason where the host cannot."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from apis.extension import LABEL_CORE_SCHED_GROUP_ID, LABEL_POD_QOS, KubeQOS, QoSClass
from koordlet.executor import CgroupWriter
from koordlet.executor.audit import AuditLog
from koordlet.runtimehooks.effects import build_effects
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import ContainerRequest, HookPoint, PodMeta
from koordlet.runtimehooks.reconciler import HookReconciler
from koordlet.runtimehooks.table import HOOKS, HookContext
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from tests.fakehost import FakeHost, container_id
from tests.runtimehooks.test_coresched import FakeKernel
from tests.strategyrig import in_force
from tests.unit.test_qos_resctrl import install_resctrl

QOS = {
    "policies": {"cpuPolicy": "coreSched"},
    "lsClass": {"cpuQOS": {"enable": True}, "resctrlQOS": {"enable": True}},
    "beClass": {"cpuQOS": {"enable": True}, "resctrlQOS": {"enable": True}},
}


@dataclass
class Rig:
    fake: FakeHost
    dispatcher: HookDispatcher
    kernel: FakeKernel
    writer: CgroupWriter


def _pids(fake: FakeHost, rel: str, pids: list[int]) -> None:
    text = "".join(f"{p}\n" for p in pids)
    fake.write("cpu", rel, "cgroup.procs", text)
    fake.write("cpu", rel, "cgroup.threads" if fake.version is CgroupVersion.V2 else "tasks", text)


async def _rig(fake: FakeHost, *, resctrl: bool = True, core_sched: str = "") -> AsyncIterator[Rig]:
    if resctrl:
        install_resctrl(fake)
    kernel = FakeKernel()
    writer = CgroupWriter(fake.host)
    writer.start()
    audit = AuditLog(None)
    effects = build_effects(
        lambda: fake.host, writer, audit, resctrl=True, core_sched=True, dry_run=False,
        probe_core_sched=lambda: core_sched, make_ops=lambda: kernel,
    )  # fmt: skip
    slo = in_force(resourceQOSStrategy=QOS)
    dispatcher = HookDispatcher(
        HOOKS, HookContext(node_slo=lambda: slo, host=lambda: fake.host),
        enabled=lambda gate: gate in ("CoreSched", "Resctrl"),
        metrics=HookMetrics(CollectorRegistry()), writer=writer, audit=audit, effects=effects,
    )  # fmt: skip
    try:
        yield Rig(fake, dispatcher, kernel, writer)
    finally:
        writer.stop()


@pytest.fixture
async def rig(fake_host: FakeHost) -> AsyncIterator[Rig]:
    async for r in _rig(fake_host):
        yield r


def _parent(fake: FakeHost, pod_rel: str) -> str:
    """The cgroup parent the kubelet hands the runtime: a path (cgroupfs), a slice (systemd)."""
    return pod_rel.rsplit("/", 1)[-1] if pod_rel.endswith(".slice") else "/" + pod_rel


async def test_a_started_container_goes_into_its_group_and_gets_its_groups_cookie(
    rig: Rig,
) -> None:
    fake = rig.fake
    uid_a, uid_b = "0000000a-0000-4000-8000-000000000000", "0000000b-0000-4000-8000-000000000000"
    reqs = []
    for uid, pids in ((uid_a, [100, 101]), (uid_b, [200])):
        cid = container_id(uid)
        pod_rel, (crel,) = fake.add_pod(uid, KubeQOS.BURSTABLE, [("containerd", cid)])
        _pids(fake, crel, pids)
        rig.kernel.spawn(*pids)
        reqs.append(ContainerRequest(
            HookPoint.POST_START_CONTAINER, PodMeta(uid[:8], "default", uid), "main",
            container_id=cid, pod_labels={LABEL_POD_QOS: "LS", LABEL_CORE_SCHED_GROUP_ID: "web"},
            pod_cgroup_parent=_parent(fake, pod_rel),
        ))  # fmt: skip
    tasks = Path(fake.paths.sys("fs", "resctrl")) / "LS" / "tasks"
    # a plain file stands in for the kernel's tasks file: each placement's writes start at its
    # beginning, so look after each one
    for req, pids in zip(reqs, ([100, 101], [200]), strict=True):
        outcome = await rig.dispatcher.container(req, mode="proxy")
        assert outcome.applied == ("CoreSched", "Resctrl")
        assert set(pids) <= {int(t) for t in tasks.read_text().split()}
    cookie = rig.kernel.cookie
    assert cookie[100] == cookie[101] == cookie[200] != 0


async def test_the_reconciler_gives_running_containers_their_cookie(rig: Rig) -> None:
    fake = rig.fake
    uid = "0000000c-0000-4000-8000-000000000000"
    cid = container_id(uid)
    pod_rel, (crel,) = fake.add_pod(uid, KubeQOS.BESTEFFORT, [("containerd", cid)])
    _pids(fake, crel, [300, 301])
    rig.kernel.spawn(300, 301)
    pod = PodInfo(
        uid,
        "be",
        "default",
        QoSClass.BE,
        KubeQOS.BESTEFFORT,
        pod_rel,
        (ContainerInfo(cid, "main", "containerd", crel),),
        labels={LABEL_POD_QOS: "BE"},
    )
    reconciler = HookReconciler(
        rig.dispatcher, workloads=lambda: WorkloadSnapshot(pods={uid: pod}),
        host=lambda: fake.host, executor=rig.writer,
    )  # fmt: skip
    await reconciler.reconcile()
    assert rig.kernel.cookie[300] == rig.kernel.cookie[301] != 0
    effects = rig.dispatcher.effects
    assert effects is not None
    assert effects.describe()["cookie_groups"] == {
        "": {"cookie": rig.kernel.cookie[300], "threads": 2}
    }
    # resctrl placement is the resctrl strategy's job in rounds: the reconciler leaves it
    assert (Path(fake.paths.sys("fs", "resctrl")) / "BE" / "tasks").read_text() == ""


async def test_a_host_without_resctrl_or_core_scheduling_reports_both_and_changes_nothing(
    fake_host: FakeHost,
) -> None:
    why = "kernel without core scheduling (CONFIG_SCHED_CORE, Linux >= 5.14): EINVAL"
    async for r in _rig(fake_host, resctrl=False, core_sched=why):
        effects = r.dispatcher.effects
        assert effects is not None
        assert effects.unsupported == {
            "resctrl": f"resctrl is not mounted at {fake_host.paths.sys('fs', 'resctrl')}",
            "coresched": why,
        }
        uid = "0000000d-0000-4000-8000-000000000000"
        cid = container_id(uid)
        pod_rel, (crel,) = fake_host.add_pod(uid, KubeQOS.BURSTABLE, [("containerd", cid)])
        _pids(fake_host, crel, [400])
        r.kernel.spawn(400)
        req = ContainerRequest(
            HookPoint.POST_START_CONTAINER, PodMeta("d", "default", uid), "main",
            container_id=cid, pod_labels={LABEL_POD_QOS: "LS"},
            pod_cgroup_parent=_parent(fake_host, pod_rel),
        )  # fmt: skip
        await r.dispatcher.container(req, mode="nri")
        assert r.kernel.calls == []
