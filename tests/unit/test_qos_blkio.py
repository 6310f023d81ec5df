"""Block I/O QoS on fake trees of every layout: names resolved against a fake ``/sys/class/block``
in sysfs's own shape (``dev``, ``partition``, ``queue/scheduler``, ``dm/name``, ``dm/uuid``,
``slaves/``; ``Documentation/ABI/stable/sysfs-block``), the device maps upstream's
``blkio_reconcile.go`` writes (its ``getBlkIOUpdaterFromBlockCfg`` test table: a block's four
limits, 0 for unset, and a device the config no longer names is reset), written into the fake
blkio (v1) and io (v2) files, audited, dry-run, held on stale inputs.

The real throttling is in ``tests/integration/test_blkio_realcgroup.py``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from apis.extension import KubeQOS, QoSClass
from apis.slo_qos import ANNOTATION_POD_BLKIO_QOS, BlockConfig, BlockType, IOConfig
from koordlet.collectors.nodestorage import INFO_KEY, NodeStorageCollector
from koordlet.executor import CgroupWriter
from koordlet.executor.writer import WriteResult
from koordlet.metriccache.store import MetricCache
from koordlet.qos.blkio import BlkIOReconcile, BlockError, resolve_block
from koordlet.qos.framework import QoSBook, StrategyContext
from koordlet.statesinformer.model import ContainerInfo, PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.paths import HostPaths
from koordlet.system.probe import probe_capabilities
from tests.fakehost import FakeHost, container_id
from tests.strategyrig import config, in_force

UID = "00000001-0000-4000-8000-000000000000"


def block_device(
    sys_root: Path, name: str, dev: str, *, parent: str = "", scheduler: str = "", **extra: str
) -> None:
    """A device as sysfs shows it: the real directory under ``devices/``, a symlink in
    ``class/block``; a partition lives inside its disk's directory."""
    base = sys_root / "devices" / "virtual" / "block"
    real = base / parent / name if parent else base / name
    real.mkdir(parents=True, exist_ok=True)
    (real / "dev").write_text(dev + "\n")
    if parent:
        (real / "partition").write_text("1\n")
    if scheduler:
        (real / "queue").mkdir(exist_ok=True)
        (real / "queue" / "scheduler").write_text(scheduler + "\n")
    for rel, text in extra.items():
        path = real / rel.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.startswith("slaves__"):
            path.mkdir(exist_ok=True)
        else:
            path.write_text(text + "\n")
    link = sys_root / "class" / "block" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(real)


def node_disks(sys_root: Path) -> None:
    """vdb (bfq) with partition vdb1, vdc (mq-deadline) under the LVM volume vg0/data (dm-0),
    vdd (none)."""
    block_device(sys_root, "vdb", "253:16", scheduler="mq-deadline kyber [bfq] none")
    block_device(sys_root, "vdb1", "253:17", parent="vdb")
    block_device(sys_root, "vdc", "253:32", scheduler="[mq-deadline] kyber bfq none")
    block_device(sys_root, "vdd", "253:48", scheduler="[none] mq-deadline")
    block_device(
        sys_root, "dm-0", "252:0", dm__name="vg--0-data", dm__uuid="LVM-abc", slaves__vdc=""
    )


@pytest.fixture
def paths(tmp_path: Path) -> HostPaths:
    sys_root = tmp_path / "sys"
    node_disks(sys_root)
    return HostPaths(sys_root=str(sys_root), kubelet_root=str(tmp_path / "kubelet"))


def collect(paths: HostPaths, pods: list[PodInfo] | None = None, now: float = 100.0) -> Any:
    snapshot = WorkloadSnapshot(pods={p.uid: p for p in pods or []})
    tick = SimpleNamespace(now=now, workloads=snapshot)
    return NodeStorageCollector(paths).collect(tick).info[INFO_KEY]  # type: ignore[arg-type]


# Resolution -------------------------------------------------------------------------------------


def test_the_collector_maps_partitions_and_volumes_to_their_disks(paths: HostPaths) -> None:
    info = collect(paths)
    devices = info["devices"]
    assert devices["vdb"] == {"dev": "253:16", "disks": ["vdb"], "scheduler": "bfq"}
    assert devices["vdb1"]["disks"] == ["vdb"]
    assert devices["dm-0"]["disks"] == ["vdc"]
    assert devices["dm-0"]["lvm"] == "vg-0/data"  # LVM doubles a '-' inside a name
    assert info["volume_groups"] == {"vg-0": ["vdc"]}


@pytest.mark.parametrize(
    ("name", "kind", "disks"),
    [
        ("/dev/vdb", BlockType.DEVICE, ["253:16"]),
        ("vdb", BlockType.DEVICE, ["253:16"]),
        ("/dev/vdb1", BlockType.DEVICE, ["253:16"]),  # the kernel refuses partitions: the disk
        ("/dev/mapper/vg--0-data", BlockType.DEVICE, ["253:32"]),
        ("/dev/vg-0/data", BlockType.DEVICE, ["253:32"]),
        ("vg-0", BlockType.VOLUME_GROUP, ["253:32"]),
    ],
)
def test_block_names_resolve_to_whole_disks(
    paths: HostPaths, name: str, kind: BlockType, disks: list[str]
) -> None:
    resolved = resolve_block(collect(paths), BlockConfig(name, kind))
    assert [d.dev for d in resolved] == disks


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (BlockConfig("/dev/sdz", BlockType.DEVICE), "device /dev/sdz not found"),
        (BlockConfig("vg9", BlockType.VOLUME_GROUP), "volume group vg9: no LVM volume"),
        (BlockConfig("data", BlockType.POD_VOLUME), "only a pod's koordinator.sh/blkioQOS"),
        (BlockConfig("data", None), "no type"),
    ],
)
def test_unresolvable_blocks_say_why(paths: HostPaths, block: BlockConfig, message: str) -> None:
    with pytest.raises(BlockError, match=message):
        resolve_block(collect(paths), block)


def _pod(
    uid: str, rel: str, annotation: dict[str, Any] | None, qos: QoSClass = QoSClass.LS
) -> PodInfo:
    annotations = {} if annotation is None else {ANNOTATION_POD_BLKIO_QOS: json.dumps(annotation)}
    return PodInfo(uid, "p", "default", qos, KubeQOS.BURSTABLE, rel, annotations=annotations)


def test_a_pod_volume_resolves_through_its_filesystems_device(paths: HostPaths) -> None:
    mount = Path(paths.kubelet("pods", UID, "volumes", "kubernetes.io~csi", "data", "mount"))
    mount.mkdir(parents=True)
    (Path(paths.kubelet("pods", UID, "volumes", "kubernetes.io~empty-dir", "scratch"))).mkdir(
        parents=True
    )
    st = os.stat(mount)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    pod = _pod(UID, "kubepods/burstable/pod" + UID, {"blocks": []})
    info = collect(paths, [pod])
    volumes = info["pod_volumes"][UID]
    assert volumes["data"]["path"] == str(mount)
    assert "not a block device" in volumes["data"]["error"]  # the test's tmp filesystem
    with pytest.raises(BlockError, match="not a block device"):
        resolve_block(info, BlockConfig("data", BlockType.POD_VOLUME), UID)
    with pytest.raises(BlockError, match="no volumes/\\*/logs directory"):
        resolve_block(info, BlockConfig("logs", BlockType.POD_VOLUME), UID)
    # The same filesystem on a block device that sysfs lists: the volume resolves to its disk.
    block_device(Path(paths.sys_root), "vde", dev, scheduler="[none]")
    info = collect(paths, [pod])
    assert info["pod_volumes"][UID]["data"]["disks"] == ["vde"]
    assert [d.dev for d in resolve_block(info, BlockConfig("data", BlockType.POD_VOLUME), UID)] == [
        dev
    ]


# The strategy on fake cgroups -------------------------------------------------------------------


@pytest.fixture
def rig(fake_host: FakeHost, paths: HostPaths) -> Iterator[SimpleNamespace]:
    fake = fake_host
    box: dict[str, Any] = {"raw": {}, "pods": [], "dry": frozenset()}
    audit: list[WriteResult] = []
    cache = MetricCache()
    writer = CgroupWriter(fake.host, on_change=audit.append)
    writer.start()
    clock = [100.0]
    book = QoSBook(clock=lambda: clock[0])

    def refresh() -> None:
        cache.set_info(INFO_KEY, collect(paths, box["pods"], now=clock[0]))

    ctx = StrategyContext(
        host=lambda: fake.host,
        config=config(),
        cache=cache,
        executor=writer,
        capabilities=probe_capabilities(fake.host),
        workloads=lambda: WorkloadSnapshot(pods={p.uid: p for p in box["pods"]}),
        node_slo=lambda: in_force(resourceQOSStrategy=box["raw"]),
        book=book,
    )
    try:
        yield SimpleNamespace(
            fake=fake, box=box, audit=audit, ctx=ctx, clock=clock, refresh=refresh, writer=writer
        )
    finally:
        writer.stop()


def _be(blocks: list[dict[str, Any]], enable: bool = True) -> dict[str, Any]:
    return {"beClass": {"blkioQOS": {"enable": enable, "blocks": blocks}}}


def _file(fake: FakeHost, rel: str, v1: str, v2: str) -> str:
    name = v2 if fake.version is CgroupVersion.V2 else v1
    return fake.read("blkio", rel, name)  # the controller is ignored on v2


def _be_dir(fake: FakeHost) -> str:
    return fake.layout.qos_dir(KubeQOS.BESTEFFORT)


async def test_be_limits_are_written_per_disk_and_left_alone_when_in_place(
    rig: SimpleNamespace,
) -> None:
    rig.box["raw"] = _be(
        [
            {
                "name": "/dev/vdb1",
                "type": "device",
                "ioCfg": {"readBPS": 1 << 20, "writeIOPS": 300},
            },
            {"name": "vg-0", "type": "volumegroup", "ioCfg": {"readIOPS": 0, "writeBPS": 4096}},
        ]
    )
    rig.refresh()
    strategy = BlkIOReconcile(rig.ctx, interval=1.0)
    await strategy.reconcile()
    fake, be = rig.fake, _be_dir(rig.fake)
    if fake.version is CgroupVersion.V1:
        assert fake.read("blkio", be, "blkio.throttle.read_bps_device") == "253:16 1048576\n"
        assert fake.read("blkio", be, "blkio.throttle.write_iops_device") == "253:16 300\n"
        assert fake.read("blkio", be, "blkio.throttle.write_bps_device") == "253:32 4096\n"
        assert fake.read("blkio", be, "blkio.throttle.read_iops_device") == ""
    else:
        # One io.max line per write: the fake file keeps the last knob's lines.
        written = {r.knob: r.new for r in rig.audit if r.path.endswith(f"{be}/io.max")}
        assert written == {
            "blkio_read_bps": "253:16 rbps=1048576",
            "blkio_write_iops": "253:16 wiops=300",
            "blkio_write_bps": "253:32 wbps=4096",
        }
    report = rig.ctx.book.last_report("blkio")
    assert report is not None
    assert report.detail["targets"]["beClass"]["devices"]["blkio_read_bps"] == {"253:16": 1 << 20}
    if fake.version is CgroupVersion.V1:  # a second round finds the files as wanted
        before = len(rig.audit)
        rig.writer.resync()
        await strategy.reconcile()
        assert len(rig.audit) == before


async def test_a_device_no_longer_configured_is_reset(rig: SimpleNamespace) -> None:
    fake, be = rig.fake, _be_dir(rig.fake)
    rig.box["raw"] = _be([{"name": "vdb", "type": "device", "ioCfg": {"readBPS": 1000}}])
    rig.refresh()
    strategy = BlkIOReconcile(rig.ctx, interval=1.0)
    await strategy.reconcile()
    rig.box["raw"] = _be([{"name": "vdb", "type": "device", "ioCfg": {"readBPS": 1000}}], False)
    await strategy.reconcile()
    text = _file(fake, be, "blkio.throttle.read_bps_device", "io.max")
    assert text == ("253:16 0\n" if fake.version is CgroupVersion.V1 else "253:16 rbps=max\n")
    assert rig.audit[-1].old.startswith("253:16")


async def test_a_vanished_device_is_dropped_with_its_reason_and_the_rest_applies(
    rig: SimpleNamespace,
) -> None:
    rig.box["raw"] = _be(
        [
            {"name": "/dev/sdz", "type": "device", "ioCfg": {"readBPS": 1000}},
            {"name": "vdd", "type": "device", "ioCfg": {"readBPS": 2000}},
        ]
    )
    rig.refresh()
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    report = rig.ctx.book.last_report("blkio")
    assert report is not None
    be = report.detail["targets"]["beClass"]
    assert be["dropped"] == {"/dev/sdz": "device /dev/sdz not found in /sys/class/block"}
    assert be["devices"]["blkio_read_bps"] == {"253:48": 2000}


async def test_weights_go_to_bfq_where_the_scheduler_is_bfq(rig: SimpleNamespace) -> None:
    fake, be = rig.fake, _be_dir(rig.fake)
    bfq = "io.bfq.weight" if fake.version is CgroupVersion.V2 else "blkio.bfq.weight_device"
    for rel in (fake.layout.kube_root, be):  # a kernel with BFQ group scheduling
        fake.write("blkio", rel, bfq, "default 100\n")
    rig.box["raw"] = _be([{"name": "vdb", "type": "device", "ioCfg": {"ioWeightPercent": 50}}])
    rig.refresh()
    ctx = replace(rig.ctx, capabilities=probe_capabilities(fake.host))
    assert ctx.capabilities is not None
    assert ctx.capabilities.supported("blkio_bfq_weight")
    await BlkIOReconcile(ctx, interval=1.0).reconcile()
    assert fake.read("blkio", be, bfq) == "253:16 50\n"


async def test_a_weight_on_a_device_without_a_weighting_scheduler_is_reported(
    rig: SimpleNamespace,
) -> None:
    # vdd runs no BFQ and this fake kernel has no io.weight (blk-iocost) either.
    rig.box["raw"] = _be([{"name": "vdd", "type": "device", "ioCfg": {"ioWeightPercent": 50}}])
    rig.refresh()
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    report = rig.ctx.book.last_report("blkio")
    assert report is not None
    [note] = report.detail["targets"]["beClass"]["notes"]
    assert note.startswith("ioWeightPercent of vdd not applied on vdd: its scheduler none")
    assert rig.audit == []


async def test_stale_storage_info_holds_the_round(rig: SimpleNamespace) -> None:
    rig.box["raw"] = _be([{"name": "vdb", "type": "device", "ioCfg": {"readBPS": 1000}}])
    rig.refresh()
    rig.clock[0] += 60
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    report = rig.ctx.book.last_report("blkio")
    assert report is not None
    assert report.stale
    assert report.decision == "hold: stale inputs"
    assert rig.audit == []


async def test_in_dry_run_nothing_is_written_and_the_decision_is_audited(
    rig: SimpleNamespace,
) -> None:
    rig.writer.dry_run_strategies = frozenset({"blkio"})
    rig.box["raw"] = _be([{"name": "vdb", "type": "device", "ioCfg": {"readBPS": 1000}}])
    rig.refresh()
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    assert _file(rig.fake, _be_dir(rig.fake), "blkio.throttle.read_bps_device", "io.max") == ""
    assert [(r.knob, r.new, r.dry_run) for r in rig.audit] == [
        (
            "blkio_read_bps",
            "253:16 1000" if rig.fake.version is CgroupVersion.V1 else "253:16 rbps=1000",
            True,
        )
    ]


async def test_a_pods_annotation_limits_its_own_cgroup_and_bad_ones_are_reported(
    rig: SimpleNamespace,
) -> None:
    fake = rig.fake
    rel, [crel] = fake.add_pod(UID, KubeQOS.BURSTABLE, [("containerd", container_id(UID))])
    good = _pod(UID, rel, {"blocks": [{"name": "vdc", "type": "device", "ioCfg": {"readBPS": 7}}]})
    bad_uid = "00000002-0000-4000-8000-000000000000"
    bad = replace(
        _pod(bad_uid, rel, None), name="q", annotations={ANNOTATION_POD_BLKIO_QOS: '{"blocks": 3}'}
    )
    rig.box["pods"] = [good, bad]
    rig.refresh()
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    assert _file(fake, rel, "blkio.throttle.read_bps_device", "io.max").startswith("253:32 ")
    report = rig.ctx.book.last_report("blkio")
    assert report is not None
    assert "blkioQOS.blocks: must be a list" in report.detail["notes"]["pod/default/q"]
    assert crel  # the container's cgroup is below the pod's, limited with it


async def test_classes_other_than_be_are_reported_not_applied(rig: SimpleNamespace) -> None:
    rig.box["raw"] = {
        "lsClass": {"blkioQOS": {"enable": True, "blocks": [{"name": "vdb", "type": "device"}]}}
    }
    rig.refresh()
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    report = rig.ctx.book.last_report("blkio")
    assert report is not None
    assert "BE only" in report.detail["notes"]["lsClass"]


async def test_the_root_gets_iocost_qos_and_the_user_model_on_v2(rig: SimpleNamespace) -> None:
    fake = rig.fake
    if fake.version is CgroupVersion.V1:
        pytest.skip("blkio.cost.* exist on Anolis v1 kernels only; v1 reports them unsupported")
    fake.write("blkio", "", "io.cost.qos", "")
    fake.write("blkio", "", "io.cost.model", "")
    cfg = {"readLatency": 2000, "enableUserModel": True, "modelReadBPS": 100, "modelWriteBPS": 50}
    rig.box["raw"] = {
        "cgroupRoot": {
            "blkioQOS": {
                "enable": True,
                "blocks": [{"name": "vdb", "type": "device", "ioCfg": cfg}],
            }
        }
    }
    rig.refresh()
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    assert fake.read("blkio", "", "io.cost.qos") == (
        "253:16 enable=1 ctrl=user rpct=95 rlat=2000 wpct=95 wlat=3000\n"
    )
    assert fake.read("blkio", "", "io.cost.model") == "253:16 ctrl=user rbps=100 wbps=50\n"


def test_io_config_defaults_are_unset_as_upstreams() -> None:
    assert IOConfig().read_bps is None
    assert IOConfig().io_weight_percent is None


async def test_on_v1_the_be_limits_also_bind_each_be_container_as_blk_throttle_is_flat(
    rig: SimpleNamespace,
) -> None:
    fake = rig.fake
    rel, [crel] = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", container_id(UID))])
    container = ContainerInfo(container_id(UID), "main", "containerd", crel)
    rig.box["pods"] = [
        PodInfo(UID, "be", "default", QoSClass.BE, KubeQOS.BESTEFFORT, rel, (container,))
    ]
    rig.box["raw"] = _be([{"name": "vdb", "type": "device", "ioCfg": {"readBPS": 1000}}])
    rig.refresh()
    await BlkIOReconcile(rig.ctx, interval=1.0).reconcile()
    limited = {
        r.path.rsplit("/", 1)[0] for r in rig.audit if r.knob == "blkio_read_bps" and r.changed
    }
    dirs = {fake.layout.abs_dir("blkio", d) for d in (_be_dir(fake), rel, crel)}
    if fake.version is CgroupVersion.V1:
        assert limited == dirs
        assert fake.read("blkio", crel, "blkio.throttle.read_bps_device") == "253:16 1000\n"
    else:  # hierarchical: the QoS cgroup alone
        assert limited == {fake.layout.abs_dir("blkio", _be_dir(fake))}


async def test_on_v1_leaves_are_cleared_once_the_class_has_no_limits_and_then_left_alone(
    rig: SimpleNamespace,
) -> None:
    fake = rig.fake
    if fake.version is CgroupVersion.V2:
        pytest.skip("v2 throttling is hierarchical: no leaves")
    rel, [crel] = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("containerd", container_id(UID))])
    container = ContainerInfo(container_id(UID), "main", "containerd", crel)
    rig.box["pods"] = [
        PodInfo(UID, "be", "default", QoSClass.BE, KubeQOS.BESTEFFORT, rel, (container,))
    ]
    rig.box["raw"] = _be([{"name": "vdb", "type": "device", "ioCfg": {"readBPS": 1000}}])
    rig.refresh()
    strategy = BlkIOReconcile(rig.ctx, interval=1.0)
    await strategy.reconcile()
    rig.box["raw"] = _be([], enable=False)
    await strategy.reconcile()
    assert fake.read("blkio", crel, "blkio.throttle.read_bps_device") == "253:16 0\n"
    rig.writer.resync()
    before = len(rig.audit)
    await strategy.reconcile()
    report = rig.ctx.book.last_report("blkio")
    assert report is not None
    assert not any(crel in key for key in report.detail["failed"])
    assert len(rig.audit) == before
