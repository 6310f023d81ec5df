"""The ``TerwayQoS`` hook on a temporary root: the reconciler keeps terway-qos's
``global_bps_config`` and ``pod.json`` (real bytes, checked against values computed here by
hand from upstream's formula), once per change, through the executor (atomic replace, audit, dry
run, the originals journal that ``koordlet reset`` reads); removes them when the policy leaves
terway-qos or the gate goes off; keeps the last good file on a bad NodeSLO; lists a pod with a
malformed annotation without limits and one Warning Event."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from apis.extension import LABEL_POD_QOS, KubeQOS, QoSClass
from apis.pod_overrides import ANNOTATION_POD_NETWORK_QOS, INVALID_ANNOTATION_REASON
from apis.slo_inforce import NodeSLOInForce
from apis.terway import parse_pod_config
from koordlet.executor import CgroupWriter
from koordlet.executor.audit import AuditLog
from koordlet.executor.originals import Original, OriginalsJournal
from koordlet.executor.restore import apply, plan
from koordlet.executor.sysctl import SystemFileWriter
from koordlet.runtimehooks import reconciler as reconciler_mod
from koordlet.runtimehooks.framework import HookDispatcher
from koordlet.runtimehooks.metrics import HookMetrics
from koordlet.runtimehooks.model import PodMeta
from koordlet.runtimehooks.reconciler import HookReconciler, remove_disabled_files
from koordlet.runtimehooks.table import HOOKS, HookContext
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost
from tests.strategyrig import in_force

BOOT = "0b0e5c1a-0000-4d2d-9e9e-00000000b007"
GLOBAL, PODS = "global_bps_config", "pod.json"

TERWAY = {
    "policies": {"netQOSPolicy": "terway-qos"},
    # LS (terway-qos's L1): requests and limits as quantities (bit/s) and percents of the total
    "lsClass": {"networkQOS": {"enable": True, "ingressRequest": 10, "ingressLimit": "500M",
                               "egressRequest": "100M", "egressLimit": 80}},
    # BE (L2)
    "beClass": {"networkQOS": {"enable": True, "ingressRequest": 0, "ingressLimit": 20,
                               "egressRequest": "50M", "egressLimit": "200M"}},
}  # fmt: skip
TOTAL = {"totalNetworkBandwidth": "1000M"}

# Upstream's parseNetQoS / parseQoS / parseQuantity, BitsToBytes (hooks/terwayqos/terwayqos.go),
# by hand, with ours for percents (of the total, then bytes; upstream leaves them in bits):
# total 1000M bit/s = 125_000_000 byte/s.
#   LS egress request 100M -> 12_500_000;  LS egress limit 80 % -> 800M bit -> 100_000_000
#   LS ingress request 10 % -> 100M bit -> 12_500_000;  LS ingress limit 500M -> 62_500_000
#   BE egress request 50M -> 6_250_000;  BE egress limit 200M -> 25_000_000
#   BE ingress request 0;  BE ingress limit 20 % -> 200M bit -> 25_000_000
# in the order of types.go's Node (tx before rx, min before max), "name value\n" (MarshalText):
WANT_GLOBAL = (
    "hw_tx_bps_max 125000000\n"
    "hw_rx_bps_max 125000000\n"
    "offline_l1_tx_bps_min 12500000\n"
    "offline_l1_tx_bps_max 100000000\n"
    "offline_l1_rx_bps_min 12500000\n"
    "offline_l1_rx_bps_max 62500000\n"
    "offline_l2_tx_bps_min 6250000\n"
    "offline_l2_tx_bps_max 25000000\n"
    "offline_l2_rx_bps_min 0\n"
    "offline_l2_rx_bps_max 25000000\n"
)
UID = {
    "web": "11111111-0000-4000-8000-000000000001",
    "batch": "22222222-0000-4000-8000-000000000002",
    "agent": "33333333-0000-4000-8000-000000000003",
    "plain": "44444444-0000-4000-8000-000000000004",
    "bad": "55555555-0000-4000-8000-000000000005",
}


def pod(name: str, qos: QoSClass, kube_qos: KubeQOS, rel: str, net: str | None = None) -> PodInfo:
    return PodInfo(
        UID[name], name, "default", qos, kube_qos, rel,
        labels={LABEL_POD_QOS: qos.value} if qos is not QoSClass.NONE else {},
        annotations={ANNOTATION_POD_NETWORK_QOS: net} if net is not None else {},
    )  # fmt: skip


PODS_IN = [
    # 10M / 20M bit/s -> 1_250_000 / 2_500_000 byte/s (getPodQoS); LS label -> prio 1
    pod("web", QoSClass.LS, KubeQOS.BURSTABLE,
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11111111_0000_4000_8000_"
        "000000000001.slice", '{"ingressLimit": "10M", "egressLimit": "20M"}'),
    pod("batch", QoSClass.BE, KubeQOS.BESTEFFORT,
        "/kubepods/besteffort/pod22222222-0000-4000-8000-000000000002"),  # BE -> 2
    pod("agent", QoSClass.SYSTEM, KubeQOS.BURSTABLE, "kubepods/burstable/pod3"),  # SYSTEM -> 0
    pod("plain", QoSClass.NONE, KubeQOS.GUARANTEED, "kubepods/pod4"),  # no label: Guaranteed 1
]  # fmt: skip
# Go's json.Marshal of map[string]*Pod: keys sorted, struct fields in types.go's order
WANT_PODS = (
    '{"11111111-0000-4000-8000-000000000001":{"podName":"web","podNamespace":"default",'
    '"podUID":"11111111-0000-4000-8000-000000000001","prio":1,"cgroupDir":'
    '"/sys/fs/cgroup/net_cls/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1111'
    '1111_0000_4000_8000_000000000001.slice","qosConfig":{"ingressBandwidth":1250000,'
    '"egressBandwidth":2500000}},'
    '"22222222-0000-4000-8000-000000000002":{"podName":"batch","podNamespace":"default",'
    '"podUID":"22222222-0000-4000-8000-000000000002","prio":2,"cgroupDir":'
    '"/sys/fs/cgroup/net_cls/kubepods/besteffort/pod22222222-0000-4000-8000-000000000002",'
    '"qosConfig":{"ingressBandwidth":0,"egressBandwidth":0}},'
    '"33333333-0000-4000-8000-000000000003":{"podName":"agent","podNamespace":"default",'
    '"podUID":"33333333-0000-4000-8000-000000000003","prio":0,"cgroupDir":'
    '"/sys/fs/cgroup/net_cls/kubepods/burstable/pod3","qosConfig":{"ingressBandwidth":0,'
    '"egressBandwidth":0}},'
    '"44444444-0000-4000-8000-000000000004":{"podName":"plain","podNamespace":"default",'
    '"podUID":"44444444-0000-4000-8000-000000000004","prio":1,"cgroupDir":'
    '"/sys/fs/cgroup/net_cls/kubepods/pod4","qosConfig":{"ingressBandwidth":0,'
    '"egressBandwidth":0}}}'
)


@dataclass
class Events:
    seen: list[tuple[str, str, str]] = field(default_factory=list)

    def warn(self, pod: PodMeta, reason: str, message: str) -> None:
        self.seen.append((pod.name, reason, message))


@dataclass
class Rig:
    folder: Path
    slo: list[NodeSLOInForce]
    pods: dict[str, PodInfo]
    audit: AuditLog
    journal: OriginalsJournal
    events: Events
    registry: CollectorRegistry
    now: list[float]
    reconciler: HookReconciler
    writer: CgroupWriter
    fake: FakeHost

    def set_slo(self, qos: dict[str, Any], system: dict[str, Any] | None = None) -> None:
        doc = in_force(resourceQOSStrategy=qos, systemStrategy=system or TOTAL)
        self.slo[0] = NodeSLOInForce(**{**_fields(doc), "generation": self.slo[0].generation + 1})

    def read(self, name: str) -> str:
        return (self.folder / name).read_text()

    def writes(self) -> list[tuple[str, str, bool]]:
        return [
            (Path(e.path).name, e.kind, e.dry_run)
            for e in reversed(self.audit.recent(500))
            if e.strategy == "runtimehooks/TerwayQoS" and e.knob.startswith("TerwayQoS:")
        ]


def _fields(slo: NodeSLOInForce) -> dict[str, Any]:
    return {f: getattr(slo, f) for f in NodeSLOInForce.__dataclass_fields__}


@pytest.fixture
def fake(host_root: Path) -> FakeHost:
    return FakeHost(host_root, CgroupVersion.V1, CgroupDriver.SYSTEMD)


async def _rig(fake: FakeHost, *, dry_run: bool = False) -> AsyncIterator[Rig]:
    folder = fake.root / "var/lib/terway/qos"
    journal = OriginalsJournal(str(fake.root / "state"), boot_id=BOOT).load()
    slo = [NodeSLOInForce()]  # the defaults, nothing read yet
    pods = {p.name: p for p in PODS_IN}
    audit = AuditLog(None)
    writer = CgroupWriter(fake.host, on_change=audit.on_write, dry_run_all=dry_run,
                          record_original=journal.record)  # fmt: skip
    writer.start()
    events = Events()
    registry = CollectorRegistry()
    ctx = HookContext(node_slo=lambda: slo[0], host=lambda: fake.host, terway_qos_dir=str(folder))
    dispatcher = HookDispatcher(
        HOOKS, ctx, enabled=lambda gate: gate == "TerwayQoS", metrics=HookMetrics(registry),
        writer=writer, audit=audit, events=events,
    )  # fmt: skip
    now = [1000.0]
    reconciler = HookReconciler(
        dispatcher,
        workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in pods.values()}),
        host=lambda: fake.host,
        executor=writer,
        clock=lambda: now[0],
    )
    try:
        yield Rig(folder, slo, pods, audit, journal, events, registry, now, reconciler, writer,
                  fake)  # fmt: skip
    finally:
        writer.stop()


@pytest.fixture
async def rig(fake: FakeHost) -> AsyncIterator[Rig]:
    async for r in _rig(fake):
        yield r


async def test_the_files_hold_upstreams_values_in_terway_qos_formats(rig: Rig) -> None:
    await rig.reconciler.reconcile()
    assert not rig.folder.exists()  # the defaults: nothing read yet, nothing touched
    rig.set_slo(TERWAY)
    report = await rig.reconciler.reconcile()
    assert rig.read(GLOBAL) == WANT_GLOBAL
    assert rig.read(PODS) == WANT_PODS
    assert report.files_changed == 2
    assert report.errors == []
    assert rig.writes() == [(GLOBAL, "write", False), (PODS, "write", False)]
    assert sorted(os.listdir(rig.folder)) == [GLOBAL, PODS]  # no temporary file left
    state = rig.reconciler.describe()["node_files"]["TerwayQoS"]
    assert state["files"] == {GLOBAL: "written", PODS: "written"}
    assert state["global_bps_config"]["offline_l2_tx_bps_max"] == 25_000_000


async def test_files_are_written_once_per_change_and_replaced_whole(rig: Rig) -> None:
    rig.set_slo(TERWAY)
    await rig.reconciler.reconcile()
    inode = (rig.folder / PODS).stat().st_ino
    again = await rig.reconciler.reconcile()
    assert again.files_changed == 0
    assert len(rig.writes()) == 2
    # a new pod: pod.json only, replaced by a rename (a new inode), never rewritten in place
    rig.pods["bad"] = pod("bad", QoSClass.BE, KubeQOS.BESTEFFORT, "kubepods/besteffort/pod5")
    report = await rig.reconciler.reconcile()
    assert report.files_changed == 1
    assert rig.writes()[-1] == (PODS, "write", False)
    assert (rig.folder / PODS).stat().st_ino != inode
    assert UID["bad"] in rig.read(PODS)
    # changed behind the koordlet's back: put right at the resync, not every round
    (rig.folder / GLOBAL).write_text("hw_tx_bps_max 1\n")
    await rig.reconciler.reconcile()
    assert rig.read(GLOBAL) == "hw_tx_bps_max 1\n"
    rig.now[0] += reconciler_mod.RESYNC
    await rig.reconciler.reconcile()
    assert rig.read(GLOBAL) == WANT_GLOBAL


async def test_the_files_are_removed_when_the_policy_leaves_terway_qos(rig: Rig) -> None:
    rig.set_slo(TERWAY)
    await rig.reconciler.reconcile()
    rig.set_slo({**TERWAY, "policies": {"netQOSPolicy": "tc"}})
    report = await rig.reconciler.reconcile()
    assert report.files_changed == 2
    assert os.listdir(rig.folder) == []  # the folder stays: terway-qos watches it
    assert rig.writes()[-2:] == [(GLOBAL, "write", False), (PODS, "write", False)]
    assert [e.new for e in rig.audit.recent(2)] == ["(absent)", "(absent)"]
    state = rig.reconciler.describe()["node_files"]["TerwayQoS"]
    assert state["files"] == {GLOBAL: "removed", PODS: "removed"}
    assert (await rig.reconciler.reconcile()).files_changed == 0


async def test_a_dry_run_writes_nothing_and_audits_what_it_would(fake: FakeHost) -> None:
    async for r in _rig(fake, dry_run=True):
        r.set_slo(TERWAY)
        await r.reconciler.reconcile()
        await r.reconciler.reconcile()
        assert not r.folder.exists()
        assert r.writes() == [(GLOBAL, "decision", True), (PODS, "decision", True)]
        assert len(r.journal) == 0
        state = r.reconciler.describe()["node_files"]["TerwayQoS"]
        assert state["files"] == {GLOBAL: "dry run: would write", PODS: "dry run: would write"}


async def test_a_bad_nodeslo_value_keeps_the_last_good_file(rig: Rig) -> None:
    rig.set_slo({**TERWAY, "beClass": {"networkQOS": {"enable": True, "egressLimit": "2G"}}})
    report = await rig.reconciler.reconcile()
    assert not rig.folder.exists()  # nothing good yet: nothing written
    assert "spec.resourceQOSStrategy.beClass.networkQOS.egressLimit" in report.errors[0]
    rig.set_slo(TERWAY)
    await rig.reconciler.reconcile()
    rig.set_slo({**TERWAY, "lsClass": {"networkQOS": {"enable": True, "egressLimit": 150}}})
    rig.pods.pop("plain")
    report = await rig.reconciler.reconcile()
    [error] = report.errors
    assert "lsClass.networkQOS.egressLimit: percent 150 outside 0..100" in error
    assert "keep their last good content" in error
    assert rig.read(GLOBAL) == WANT_GLOBAL
    assert UID["plain"] not in rig.read(PODS)  # pod.json still follows the pods
    state = rig.reconciler.describe()["node_files"]["TerwayQoS"]
    assert "egressLimit" in state["error"]
    # a total the quantities do not fit in (a total that does not parse is rejected where the
    # NodeSLO is read; in this rig the default, 0, then stands in)
    rig.set_slo(TERWAY, {"totalNetworkBandwidth": "fast"})
    report = await rig.reconciler.reconcile()
    assert "above the node's total 0 bit/s" in report.errors[0]
    assert rig.read(GLOBAL) == WANT_GLOBAL


async def test_a_rejected_section_before_any_good_one_leaves_an_earlier_runs_files(
    rig: Rig,
) -> None:
    """At a start with resourceQOSStrategy rejected, the defaults (policy tc) stand in: the
    files an earlier run wrote for terway-qos are not removed on their word."""
    rig.folder.mkdir(parents=True)
    (rig.folder / GLOBAL).write_text(WANT_GLOBAL)
    rig.set_slo({**TERWAY, "policies": {"netQOSPolicy": "tc", "cpuPolicy": "nonsense"}})
    assert rig.slo[0].rejected
    report = await rig.reconciler.reconcile()
    assert "resourceQOSStrategy" in report.errors[0]
    assert rig.read(GLOBAL) == WANT_GLOBAL
    rig.set_slo({**TERWAY, "policies": {"netQOSPolicy": "tc"}})
    await rig.reconciler.reconcile()
    assert os.listdir(rig.folder) == []


async def test_a_malformed_annotation_lists_the_pod_without_limits_and_warns_once(
    rig: Rig,
) -> None:
    rig.pods["bad"] = pod("bad", QoSClass.BE, KubeQOS.BESTEFFORT, "kubepods/besteffort/pod5",
                          '{"egressLimit": "fast"}')  # fmt: skip
    rig.set_slo(TERWAY)
    await rig.reconciler.reconcile()
    rig.now[0] += reconciler_mod.RESYNC
    await rig.reconciler.reconcile()
    listed = parse_pod_config(rig.read(PODS))
    bad = listed[UID["bad"]]
    assert (bad.prio, bad.ingress_bandwidth, bad.egress_bandwidth) == (2, 0, 0)
    assert listed[UID["web"]].egress_bandwidth == 2_500_000  # the others unaffected
    [(name, reason, message)] = rig.events.seen
    assert (name, reason) == ("bad", INVALID_ANNOTATION_REASON)
    assert "egressLimit 'fast'" in message
    labels = {"hook": "TerwayQoS", "stage": "node", "reason": INVALID_ANNOTATION_REASON}
    assert rig.registry.get_sample_value("koordlet_runtime_hook_bad_input_total", labels) == 1


async def test_koordlet_reset_removes_the_files_also_after_a_reboot(rig: Rig) -> None:
    rig.set_slo(TERWAY)
    await rig.reconciler.reconcile()
    # a reboot: the cgroup values of the journal are gone, the files on disk are not
    journal = OriginalsJournal(rig.journal.path.rsplit("/", 1)[0], boot_id="another-boot").load()
    assert {(e.kind, e.knob) for e in journal.entries()} == {
        ("owned_file", "TerwayQoS:global_bps_config"),
        ("owned_file", "TerwayQoS:pod.json"),
    }
    audit = AuditLog(None)
    writer = CgroupWriter(rig.fake.host, on_change=audit.on_write)
    steps = plan(rig.fake.host, journal.entries())
    outcomes = apply(steps, host=rig.fake.host, writer=writer,
                     sysfiles=SystemFileWriter(rig.fake.paths), journal=journal)  # fmt: skip
    removed = [o for o in outcomes if o.step.kind == "owned_file"]
    assert [o.result is not None and o.result.changed for o in removed] == [True, True]
    assert os.listdir(rig.folder) == []
    assert {e.strategy for e in audit.recent(10, kind="write")} == {"reset"}
    assert len(journal) == 0


@pytest.fixture
def left_files(fake: FakeHost) -> tuple[Path, OriginalsJournal]:
    folder = fake.root / "var/lib/terway/qos"
    folder.mkdir(parents=True)
    journal = OriginalsJournal(str(fake.root / "state"), boot_id=BOOT).load()
    for name in (GLOBAL, PODS):
        (folder / name).write_text("an earlier run's\n")
        journal.record(Original("owned_file", str(folder / name), f"TerwayQoS:{name}", ""))
    (folder / "per_cgroup_bps_limit").write_text("someone else's\n")
    return folder, journal


async def test_a_gate_switched_off_removes_what_the_hook_wrote_and_nothing_else(
    fake: FakeHost, left_files: tuple[Path, OriginalsJournal]
) -> None:
    folder, journal = left_files
    audit = AuditLog(None)
    writer = CgroupWriter(fake.host, on_change=audit.on_write)
    writer.start()
    try:
        kept = await remove_disabled_files(HOOKS, lambda gate: True, journal.entries(), writer)
        assert kept == []
        assert len(os.listdir(folder)) == 3
        removed = await remove_disabled_files(HOOKS, lambda gate: False, journal.entries(), writer)
        assert sorted(Path(p).name for p in removed) == [GLOBAL, PODS]
        assert os.listdir(folder) == ["per_cgroup_bps_limit"]
        assert {e.strategy for e in audit.recent(10, kind="write")} == {"runtimehooks/TerwayQoS"}
    finally:
        writer.stop()
