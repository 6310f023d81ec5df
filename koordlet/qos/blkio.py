"""Block I/O QoS (Koordinator's ``BlkIOReconcile``, gate ``BlkIOReconcile``): per-device limits,
weights and latency targets from NodeSLO ``resourceQOSStrategy.<class>.blkioQOS`` and from the
pod annotation ``koordinator.sh/blkioQOS`` (docs/qos-blkio.md has the full rules).

Each round, when the NodeSLO has a ``resourceQOSStrategy`` (upstream skips the round without
one), three kinds of cgroup are reconciled, as upstream's ``blkio_reconcile.go``:

- **BE** (``beClass.blkioQOS``): the besteffort QoS cgroup gets the blocks' read/write bytes
  and IOs per second and their ``ioWeightPercent`` (and, on cgroup v2, a latency target). On
  cgroup v1 blk-throttle is flat (``block/blk-throttle.c``: on the legacy hierarchy a group's
  limits bind only the tasks directly in it), so there the limits also go to every BE pod's and
  container's cgroup: each is held to the class's limits on its own;
- **the root cgroup** (``cgroupRoot.blkioQOS``): blk-iocost's QoS (``readLatency``,
  ``writeLatency`` and their percentiles; upstream's 3000 µs at 95 % when unset) and cost model
  (the user model when ``enableUserModel``, else the kernel's ``auto``);
- **pods** carrying ``koordinator.sh/blkioQOS`` (and a QoS class): their own cgroup, as BE.

The blocks of a disabled ``blkioQOS`` count as none, and every file is written as the whole set
of devices it should hold (``koordlet.system.devcodec``): a device no block names any more is
reset, as upstream's "remover" resets every device it finds in the files. ``lsClass``,
``lsrClass`` and ``systemClass`` blocks are reported as not applied (upstream: "not
supported").

A block names a device (``/dev/vdb``, ``vdb1``, ``/dev/mapper/vg0-data``, ``/dev/vg0/data``), a
volume group, or (in the annotation only) a pod volume; each resolves, through the
``nodestorage`` collector's ``node_storage`` info, to the whole disks under it (a partition's
disk, an LVM volume's physical disks). A name that does not resolve, or a device that vanished,
is dropped with the reason in the round's report; the others apply. When the storage info is
stale the round holds.

A weight (``ioWeightPercent``, a percent of the scheduler's default weight) goes where the
device's scheduler takes one: ``blkio.bfq.weight_device``/``io.bfq.weight`` for BFQ (default
100), else blk-iocost's ``io.weight`` (Anolis v1: ``blkio.cost.weight``; default 100), else CFQ's
``blkio.weight_device`` (default 500); a device with none of them is reported. Every write goes
through the executor: validated by the knob table, audited, dry-run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from apis.extension import KubeQOS, QoSClass
from apis.records import frozen
from apis.slo import SchemaError
from apis.slo_inforce import RESOURCE_QOS_STRATEGY
from apis.slo_qos import (
    ANNOTATION_POD_BLKIO_QOS,
    BlkIOQOSConfig,
    BlockConfig,
    BlockType,
    IOConfig,
    parse_pod_blkio_qos,
)
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.collectors.nodestorage import INFO_KEY as STORAGE_INFO
from koordlet.errors import CgroupGoneError, HostError, InvalidValueError, UnsupportedError
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.knobs import (
    BLKIO_BFQ_WEIGHT,
    BLKIO_CFQ_WEIGHT,
    BLKIO_COST_MODEL,
    BLKIO_COST_QOS,
    BLKIO_COST_WEIGHT,
    BLKIO_IO_LATENCY,
    BLKIO_READ_BPS,
    BLKIO_READ_IOPS,
    BLKIO_WRITE_BPS,
    BLKIO_WRITE_IOPS,
    Knob,
)

logger = logging.getLogger(__name__)

NAME = "blkio"
"""Table name."""
FEATURE_GATE = "BlkIOReconcile"
"""Koordinator's feature gate."""
DEFAULT_LATENCY_US = 3000
DEFAULT_LATENCY_PERCENT = 95
"""Upstream's ``DefaultIOLatency`` (µs) and ``DefaultLatencyPercent`` for the root's iocost QoS."""
CLASS_KNOBS: tuple[Knob[Any], ...] = (
    BLKIO_READ_BPS,
    BLKIO_WRITE_BPS,
    BLKIO_READ_IOPS,
    BLKIO_WRITE_IOPS,
    BLKIO_BFQ_WEIGHT,
    BLKIO_COST_WEIGHT,
    BLKIO_CFQ_WEIGHT,
    BLKIO_IO_LATENCY,
)
"""What a BE or pod cgroup gets, in write order."""
THROTTLE_KNOBS = CLASS_KNOBS[:4]
"""The blk-throttle limits, the only knobs repeated on v1's leaves."""
ROOT_KNOBS: tuple[Knob[Any], ...] = (BLKIO_COST_QOS, BLKIO_COST_MODEL)
"""What the root cgroup gets."""
WEIGHT_DEFAULT: Mapping[str, tuple[int, int]] = {
    BLKIO_BFQ_WEIGHT.name: (100, 1),
    BLKIO_COST_WEIGHT.name: (100, 1),
    BLKIO_CFQ_WEIGHT.name: (500, 10),
}
"""Each weight knob's default weight and smallest one: ``ioWeightPercent`` is a percent of the
default (BFQ and blk-iocost 100, CFQ 500), never below the smallest."""
MAX_REPORTED = 1024
"""Distinct problems logged once each before the memory of them starts over."""
UNSUPPORTED_CLASSES = {
    "lsrClass": "lsr_class",
    "lsClass": "ls_class",
    "systemClass": "system_class",
}
"""Classes whose ``blkioQOS`` upstream does not apply (JSON name → attribute)."""


class BlockError(ValueError):
    """A block that cannot be resolved to disks on this node (the message says why)."""


@frozen
class Disk:
    """A whole device a block resolved to."""

    name: str
    dev: str
    scheduler: str


@frozen
class Target:
    """One cgroup to reconcile and the blocks it gets."""

    what: str
    """``beClass``, ``cgroupRoot`` or ``pod/<namespace>/<name>``."""
    rel_dir: str
    blocks: tuple[BlockConfig, ...]
    pod_uid: str = ""
    root: bool = False
    leaves: tuple[str, ...] = ()
    """Cgroups below ``rel_dir`` that get its throttle limits too: blk-throttle is flat on
    cgroup v1 (only tasks directly in a group are limited by it), so on v1 the limits go to every
    pod and container cgroup of the target as well."""


@dataclass(slots=True)
class Plan:
    """Every knob's device map for one target, and what was dropped or noted."""

    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _disks(info: Mapping[str, Any], names: Sequence[str], what: str) -> list[Disk]:
    devices = info.get("devices", {})
    out = []
    for name in names:
        entry = devices.get(name)
        if entry is None:
            raise BlockError(f"{what}: disk {name} vanished from /sys/class/block")
        out.append(Disk(name, entry["dev"], entry.get("scheduler", "")))
    if not out:
        raise BlockError(f"{what}: no disk under it")
    return out


def resolve_block(info: Mapping[str, Any], block: BlockConfig, pod_uid: str = "") -> list[Disk]:
    """The whole disks ``block`` names; :class:`BlockError` saying why when none."""
    devices: Mapping[str, Any] = info.get("devices", {})
    name = block.name
    if block.type is BlockType.DEVICE:
        short = name.removeprefix("/dev/")
        if short.startswith("mapper/"):
            dm = short.removeprefix("mapper/")
            found = [n for n, e in devices.items() if e.get("dm_name") == dm]
        elif "/" in short:
            vg, _, lv = short.partition("/")
            found = [n for n, e in devices.items() if e.get("lvm") == f"{vg}/{lv}"]
        else:
            found = [short] if short in devices else []
        if not found:
            raise BlockError(f"device {name} not found in /sys/class/block")
        return _disks(info, devices[found[0]]["disks"], f"device {name}")
    if block.type is BlockType.VOLUME_GROUP:
        disks = info.get("volume_groups", {}).get(name)
        if disks is None:
            raise BlockError(f"volume group {name}: no LVM volume of it on this node")
        return _disks(info, disks, f"volume group {name}")
    if block.type is BlockType.POD_VOLUME:
        if not pod_uid:
            raise BlockError(f"podvolume {name}: only a pod's {ANNOTATION_POD_BLKIO_QOS} names one")
        volumes = info.get("pod_volumes", {}).get(pod_uid, {})
        entry = volumes.get(name)
        if entry is None:
            raise BlockError(
                f"podvolume {name}: no volumes/*/{name} directory for pod {pod_uid} (a PVC's "
                "directory is named after its PersistentVolume)"
            )
        if "error" in entry:
            raise BlockError(f"podvolume {name}: {entry['error']}")
        return _disks(info, entry["disks"], f"podvolume {name}")
    raise BlockError(f"block {name}: no type (device, volumegroup or podvolume)")


def _weight_knob(disk: Disk, supported: Mapping[str, bool]) -> Knob[Any] | None:
    if disk.scheduler == "bfq" and supported.get(BLKIO_BFQ_WEIGHT.name, True):
        return BLKIO_BFQ_WEIGHT
    if supported.get(BLKIO_COST_WEIGHT.name, True):
        return BLKIO_COST_WEIGHT
    if disk.scheduler == "cfq" and supported.get(BLKIO_CFQ_WEIGHT.name, True):
        return BLKIO_CFQ_WEIGHT
    return None


def class_plan(
    target: Target, info: Mapping[str, Any], supported: Mapping[str, bool], version: CgroupVersion
) -> Plan:
    """The device maps of a BE or pod cgroup (see the module docstring)."""
    plan = Plan({k.name: {} for k in CLASS_KNOBS})
    values = plan.values
    for block in target.blocks:
        try:
            disks = resolve_block(info, block, target.pod_uid)
        except BlockError as err:
            plan.dropped[block.name] = str(err)
            continue
        cfg = block.io_cfg
        for disk in disks:
            for knob, value in (
                (BLKIO_READ_BPS, cfg.read_bps),
                (BLKIO_WRITE_BPS, cfg.write_bps),
                (BLKIO_READ_IOPS, cfg.read_iops),
                (BLKIO_WRITE_IOPS, cfg.write_iops),
            ):
                values[knob.name].pop(disk.dev, None)
                if value:  # 0 or unset: no limit
                    values[knob.name][disk.dev] = value
            if cfg.io_weight_percent is not None and cfg.io_weight_percent != 100:
                weight = _weight_knob(disk, supported)
                if weight is None:
                    plan.notes.append(
                        f"ioWeightPercent of {block.name} not applied on {disk.name}: its "
                        f"scheduler {disk.scheduler or 'none'} takes no weight and blk-iocost "
                        "is unavailable"
                    )
                else:
                    base, floor = WEIGHT_DEFAULT[weight.name]
                    values[weight.name][disk.dev] = max(floor, base * cfg.io_weight_percent // 100)
            latencies = [v for v in (cfg.read_latency, cfg.write_latency) if v]
            if latencies:
                if version is CgroupVersion.V2:
                    values[BLKIO_IO_LATENCY.name][disk.dev] = min(latencies)
                else:
                    plan.notes.append(
                        f"latency of {block.name} not applied: cgroup v1 has no io.latency"
                    )
    return plan


def root_plan(target: Target, info: Mapping[str, Any]) -> Plan:
    """blk-iocost's QoS and model of the root cgroup (upstream's ``getDiskConfigUpdater``)."""
    plan = Plan({k.name: {} for k in ROOT_KNOBS})
    for block in target.blocks:
        try:
            disks = resolve_block(info, block)
        except BlockError as err:
            plan.dropped[block.name] = str(err)
            continue
        cfg = block.io_cfg
        qos = {
            "enable": "1",
            "ctrl": "user",
            "rpct": str(cfg.read_latency_percent or DEFAULT_LATENCY_PERCENT),
            "rlat": str(cfg.read_latency or DEFAULT_LATENCY_US),
            "wpct": str(cfg.write_latency_percent or DEFAULT_LATENCY_PERCENT),
            "wlat": str(cfg.write_latency or DEFAULT_LATENCY_US),
        }
        for disk in disks:
            plan.values[BLKIO_COST_QOS.name][disk.dev] = qos
            if cfg.enable_user_model:
                plan.values[BLKIO_COST_MODEL.name][disk.dev] = _user_model(cfg)
    return plan


def _user_model(cfg: IOConfig) -> dict[str, str]:
    model = {
        "rbps": cfg.model_read_bps,
        "rseqiops": cfg.model_read_seq_iops,
        "rrandiops": cfg.model_read_rand_iops,
        "wbps": cfg.model_write_bps,
        "wseqiops": cfg.model_write_seq_iops,
        "wrandiops": cfg.model_write_rand_iops,
    }
    return {"ctrl": "user", **{k: str(v) for k, v in model.items() if v is not None}}


def _blocks(qos: BlkIOQOSConfig) -> tuple[BlockConfig, ...]:
    return qos.blocks if qos.enable else ()


def targets(
    strategy: ResourceQOSStrategy, ctx: StrategyContext, notes: dict[str, str]
) -> list[Target]:
    """BE, the root and every annotated pod; annotations that do not parse go to ``notes``."""
    layout = ctx.host().layout
    flat = layout.version is CgroupVersion.V1
    pods = list(ctx.workloads().pods.values())
    be_leaves = [
        rel
        for pod in pods
        if flat
        and pod.kube_qos is KubeQOS.BESTEFFORT
        and ANNOTATION_POD_BLKIO_QOS not in pod.annotations
        for rel in (pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers))
    ]
    be_blocks = _blocks(strategy.be_class.blkio_qos)
    out = [
        Target("beClass", layout.qos_dir(KubeQOS.BESTEFFORT), be_blocks, leaves=tuple(be_leaves)),
        Target("cgroupRoot", "", _blocks(strategy.cgroup_root.blkio_qos), root=True),
    ]
    for json_name, attr in UNSUPPORTED_CLASSES.items():
        if _blocks(getattr(strategy, attr).blkio_qos):
            notes[json_name] = "blkioQOS not applied: Koordinator applies class blkio to BE only"
    for pod in pods:
        text = pod.annotations.get(ANNOTATION_POD_BLKIO_QOS)
        if text is None:
            continue
        what = f"pod/{pod.namespace}/{pod.name}"
        if pod.qos is QoSClass.NONE:
            notes[what] = "has no QoS class: its blkioQOS is ignored, as upstream ignores it"
            continue
        try:
            blocks = parse_pod_blkio_qos(text, source=f"{what} {ANNOTATION_POD_BLKIO_QOS}")
        except SchemaError as err:
            notes[what] = str(err)
            continue
        leaves = tuple(c.cgroup_dir for c in pod.containers) if flat else ()
        out.append(Target(what, pod.cgroup_dir, blocks, pod_uid=pod.uid, leaves=leaves))
    return out


class BlkIOReconcile:
    """See the module docstring."""

    def __init__(self, ctx: StrategyContext, *, interval: float) -> None:
        self.name = NAME
        self.interval = interval
        self._ctx = ctx
        self._reported: set[str] = set()
        self._limited: set[str] = set()
        """v1 leaves this process gave throttle limits: without limits to give, only these are
        written (to clear them), not every BE container each round."""

    def _supported(self) -> dict[str, bool]:
        caps = self._ctx.capabilities
        if caps is None:
            return {}
        knobs = (*CLASS_KNOBS, *ROOT_KNOBS)
        return {k.name: caps.supported(k.name) for k in knobs if k.name in caps}

    async def reconcile(self) -> None:
        ctx = self._ctx
        node_slo = ctx.node_slo()
        if RESOURCE_QOS_STRATEGY not in node_slo.present:
            ctx.report(NAME, StrategyReport({}, "nothing to do: no resourceQOSStrategy"))
            return
        info = ctx.cache.get_info(STORAGE_INFO)
        max_age = 3 * max(ctx.config.collect.node_storage_info_interval, ctx.collect_interval)
        age = None if not isinstance(info, Mapping) else ctx.now() - info.get("collected_at", 0)
        if not isinstance(info, Mapping) or age is None or age > max_age:
            why = "no node storage info yet" if age is None else f"node storage info {age:.1f}s old"
            ctx.stale(NAME, why)
            ctx.report(NAME, StrategyReport({"storage": why}, "hold: stale inputs", stale=True))
            return
        notes: dict[str, str] = {}
        supported = self._supported()
        version = ctx.host().layout.version
        detail: dict[str, Any] = {}
        jobs: list[tuple[str, str, Knob[Any], dict[str, Any]]] = []
        plans = targets(node_slo.resource_qos_strategy, ctx, notes)
        for target in plans:
            plan = (
                root_plan(target, info)
                if target.root
                else class_plan(target, info, supported, version)
            )
            detail[target.what] = {
                "cgroup": target.rel_dir or "/",
                **({"leaves": len(target.leaves)} if target.leaves else {}),
                "blocks": [b.name for b in target.blocks],
                "devices": {k: dict(v) for k, v in plan.values.items() if v},
                **({"dropped": plan.dropped} if plan.dropped else {}),
                **({"notes": plan.notes} if plan.notes else {}),
            }
            for key, why in plan.dropped.items():
                self._once(f"{target.what}/{key}/{why}", f"{target.what}: {why}")
            for knob_name, devices in plan.values.items():
                knob = next(k for k in (*CLASS_KNOBS, *ROOT_KNOBS) if k.name == knob_name)
                if not supported.get(knob_name, True) and not devices:
                    continue  # nothing to set or clean on a file this host lacks
                jobs.append((target.what, target.rel_dir, knob, devices))
                if knob in THROTTLE_KNOBS:
                    leaves = [leaf for leaf in target.leaves if devices or leaf in self._limited]
                    jobs += [(target.what, leaf, knob, devices) for leaf in leaves]
        results = await self._write(jobs)
        limited = {rel for _, rel, knob, devices in jobs if knob in THROTTLE_KNOBS and devices}
        cleared = {rel for _, rel, knob, _ in jobs if knob in THROTTLE_KNOBS} - limited
        current = {leaf for t in plans for leaf in t.leaves}
        self._limited = ((self._limited | limited) - cleared) & current
        changed = sum(1 for r in results.values() if r == "changed")
        failed = {k: r for k, r in results.items() if r not in ("changed", "unchanged")}
        inputs = {
            "beClass": len(_blocks(node_slo.resource_qos_strategy.be_class.blkio_qos)),
            "cgroupRoot": len(_blocks(node_slo.resource_qos_strategy.cgroup_root.blkio_qos)),
            "pods": sum(1 for t in detail if t.startswith("pod/")),
        }
        ctx.report(
            NAME,
            StrategyReport(
                inputs,
                f"reconcile {len(jobs)} device maps",
                ("dry run: " if ctx.dry_run(NAME) else "")
                + f"{changed} changed, {len(failed)} failed",
                detail={"targets": detail, "notes": notes, "failed": failed},
            ),
        )

    async def _write(
        self, jobs: list[tuple[str, str, Knob[Any], dict[str, Any]]]
    ) -> dict[str, str]:
        ctx = self._ctx
        futures = []
        for what, rel, knob, devices in jobs:
            reason = f"{what} {knob.name} {devices or 'none'}"
            futures.append(ctx.executor.submit(knob, rel, devices, strategy=NAME, reason=reason))
        waits = (asyncio.wrap_future(f) for f in futures)
        done = await asyncio.gather(*waits, return_exceptions=True)
        out: dict[str, str] = {}
        for (what, rel, knob, _devices), result in zip(jobs, done, strict=True):
            key = f"{what}:{rel or '/'}:{knob.name}"
            if isinstance(result, CgroupGoneError):
                logger.debug("%s: cgroup gone: %s", key, result)
                out[key] = "cgroup gone"
            elif isinstance(result, (UnsupportedError, InvalidValueError, HostError)):
                self._once(key, f"{key}: {result}")
                out[key] = str(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                out[key] = "changed" if result.changed else "unchanged"
        return out

    def _once(self, key: str, message: str) -> None:
        if key not in self._reported:
            if len(self._reported) >= MAX_REPORTED:
                self._reported.clear()
            self._reported.add(key)
            logger.warning("blkio: %s", message)


def build(ctx: StrategyContext, interval: float) -> BlkIOReconcile:
    """Table factory."""
    return BlkIOReconcile(ctx, interval=interval)
