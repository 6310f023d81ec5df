"""Every cgroup knob the koordlet reads or writes, declared once, with its codecs.

A :class:`Knob` names a logical resource (Koordinator's resource names, snake-cased:
``cpu_shares``, ``cpu_cfs_quota``, ``memory_wmark_ratio``…), the controller and the file it lives
in on cgroup v1 and on cgroup v2, the codec that turns the logical value into the file's text on
each version, and the valid range (Koordinator's validators in
``pkg/koordlet/util/system/cgroup_resource.go``). Callers never branch on the cgroup version:
they hand a logical value and a version to :meth:`Knob.encode` and get the text to write.

Logical values:

* integers for counters and ratios (``cpu_shares`` is in v1 shares on both versions);
* ``None`` for "unlimited" (``cpu_cfs_quota``, ``memory_limit``, ``memory_min/low/high``);
  ``-1`` is accepted as an alias on input and normalized to ``None``;
* ``frozenset[int]`` for CPU and memory-node lists (a cpulist string is accepted on input);
* ``str`` for the read-only ``memory_idle_page_stats`` source;
* a read-only mapping ``"MAJ:MIN" → value`` for the *keyed* blkio/io knobs, whose file holds one
  line per block device: the value is the whole set of entries the file should hold
  (``koordlet.system.devcodec``).

The validators and file codecs live in ``koordlet.system.knobcodecs`` (the per-device ones in
``koordlet.system.devcodec``); this module holds the :class:`Knob` and the table.

Two conversions are lossy on purpose. v2 has no ``cpu.shares``: ``cpu_shares`` is written as
``cpu.weight`` with runc's and the kernel documentation's mapping of shares [2, 262144] onto
weights [1, 10000], ``weight = 1 + (shares - 2) * 9999 // 262142``, and read back as the smallest
shares that map to that weight, so ``encode(decode(text)) == text`` always holds while a shares
value read back from v2 is within 27 of the one written. (Koordinator's own read-back,
``ConvertCPUWeightToShares``, uses ``weight * 1024 / 100``, which does not invert the write; we
use the exact inverse.) ``cpu_weight`` is the mirror image on v1.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from apis.records import frozen
from koordlet.errors import InvalidValueError, ParseError, UnsupportedError
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.devcodec import (
    DeviceKeyCodec,
    DeviceLinesCodec,
    DeviceParams,
    DeviceParamsCodec,
    DeviceParamSet,
    DeviceRange,
    DeviceValues,
)
from koordlet.system.knobcodecs import (
    INT64_MAX,
    V1_UNLIMITED_MIN,
    AnyText,
    Codec,
    ConvertedCodec,
    CpuList,
    CpuListCodec,
    CpuMaxPeriodCodec,
    CpuMaxQuotaCodec,
    IntCodec,
    LimitCodec,
    Range,
    RangeOrUnlimited,
    RawTextCodec,
    Validator,
)

T = TypeVar("T")

CPU_SHARES_MIN = 2
CPU_SHARES_MAX = 262144
"""``MIN_SHARES`` and ``MAX_SHARES`` (1 << 18) of kernel/sched; the kernel clamps to them."""
CPU_WEIGHT_MIN = 1
CPU_WEIGHT_MAX = 10000
CFS_QUOTA_MIN_US = 1000
"""Koordinator's ``CFSQuotaMinValue``: the kernel refuses a quota under 1 ms."""
CFS_QUOTA_MAX_US = (1 << 44) - 1
"""kernel/sched ``max_cfs_runtime`` (``MAX_BW``) in µs: larger quotas are refused."""
CFS_PERIOD_MIN_US = 1000
CFS_PERIOD_MAX_US = 1_000_000
"""kernel/sched ``min_cfs_quota_period`` (1 ms) and ``max_cfs_quota_period`` (1 s)."""
CPU_BURST_MAX_US = 100 * 10 * 100_000
"""Koordinator's ``CPUBurstValidator`` bound (100 cores at 1000 % of one 100 ms period), µs."""


# Conversions ----------------------------------------------------------------------------------


def shares_to_weight(shares: int) -> int:
    """v1 ``cpu.shares`` → v2 ``cpu.weight`` as runc and the kubelet convert it (clamped)."""
    shares = min(max(shares, CPU_SHARES_MIN), CPU_SHARES_MAX)
    return 1 + ((shares - 2) * 9999) // 262142


def weight_to_shares(weight: int) -> int:
    """The smallest shares whose :func:`shares_to_weight` is ``weight`` (clamped to 1..10000)."""
    weight = min(max(weight, CPU_WEIGHT_MIN), CPU_WEIGHT_MAX)
    return 2 + -((-(weight - 1) * 262142) // 9999)  # ceiling division


# Knobs ----------------------------------------------------------------------------------------


@frozen
class Knob(Generic[T]):
    """One logical cgroup resource and how it is spelled on each cgroup version."""

    name: str
    """Logical name, the key in :data:`KNOBS` (``cpu_shares``)."""
    controller: str
    """The v1 controller whose hierarchy holds the file (``cpu``, ``cpuset``, ``memory``)."""
    v1_file: str | None
    """File name on cgroup v1; None when v1 has no such file."""
    v2_file: str | None
    """File name on cgroup v2; None when v2 has no such file."""
    codec: Codec[T]
    """Text ↔ logical value, per version."""
    valid: Validator[T]
    """Valid logical values; :meth:`validate` normalizes through it."""
    doc: str
    """What the knob does, in one line (shown in ``/debug``)."""
    anolis_only: bool = False
    """The file exists only on Alibaba Cloud Linux / Anolis kernels, on both versions."""
    v1_anolis_only: bool = False
    """On cgroup v1 the file exists only on Anolis kernels (mainline has it on v2 only)."""
    writable: bool = True
    """False for read-only sources (``memory.idle_page_stats``)."""
    requires: str = ""
    """What a mainline kernel needs to have the file (``Linux >= 5.14``); shown when absent."""
    keyed: bool = False
    """The file holds one line per block device and the value is the whole set of entries
    (:mod:`koordlet.system.devcodec`): the writer compares the decoded file with the value and
    writes the encoded lines one ``write(2)`` each, as the kernel parses one device per write."""

    def file_for(self, version: CgroupVersion) -> str | None:
        """The file name on ``version``, or None when that version has no such file."""
        return self.v2_file if version is CgroupVersion.V2 else self.v1_file

    def anolis_only_on(self, version: CgroupVersion) -> bool:
        """Whether only Anolis kernels have this knob on ``version``."""
        return self.anolis_only or (self.v1_anolis_only and version is CgroupVersion.V1)

    def needs_current(self, version: CgroupVersion) -> bool:
        """Whether :meth:`encode` on ``version`` needs the file's current text."""
        return self.codec.for_version(version).needs_current

    def validate(self, value: object) -> T:
        """The canonical form of ``value``; raises ``InvalidValueError`` naming knob and value."""
        try:
            return self.valid.normalize(value)
        except (TypeError, ValueError) as err:
            raise InvalidValueError(
                f"{self.name}: invalid value {value!r} (valid: {self.valid.describe()}): {err}"
            ) from err

    def decode(self, text: str, version: CgroupVersion, *, path: str = "") -> T:
        """The logical value of the file's ``text`` on ``version``.

        Raises ``ParseError`` naming the file (``path`` when given) when the text is not in the
        format the kernel writes, ``UnsupportedError`` when ``version`` has no such file.
        """
        filename = self._require_file(version)
        try:
            return self.codec.for_version(version).decode(text)
        except ValueError as err:
            raise ParseError(
                f"{path or filename}: cannot parse {text!r} as {self.name}: {err}"
            ) from err

    def encode(
        self,
        value: object,
        version: CgroupVersion,
        current_text: str | None = None,
        *,
        path: str = "",
    ) -> str:
        """The text to write for ``value`` on ``version``.

        ``current_text`` is the file's present content; knobs that share a file with another
        value (``cpu.max`` on v2 holds quota and period) keep the other half from it. Raises
        ``InvalidValueError`` for an out-of-range value or a missing ``current_text`` that the
        codec needs, ``UnsupportedError`` for a read-only knob or one this version lacks, and
        ``ParseError`` naming the file when ``current_text`` is malformed.
        """
        filename = self._require_file(version)
        if not self.writable:
            raise UnsupportedError(self.name, f"{filename} is read-only")
        canonical = self.validate(value)
        codec = self.codec.for_version(version)
        if codec.needs_current and current_text is None:
            raise InvalidValueError(
                f"{self.name}: {filename} also holds another value; encode needs its current text"
            )
        try:
            return codec.encode(canonical, current_text)
        except ValueError as err:
            raise ParseError(
                f"{path or filename}: cannot update {current_text!r} with {self.name}: {err}"
            ) from err

    def _require_file(self, version: CgroupVersion) -> str:
        filename = self.file_for(version)
        if filename is None:
            raise UnsupportedError(self.name, f"cgroup {version} has no file for it")
        return filename


integer = IntCodec()
v1_limit = LimitCodec("-1")
v2_limit = LimitCodec("max")
shares_in_weight = ConvertedCodec(
    shares_to_weight, weight_to_shares, Range(CPU_WEIGHT_MIN, CPU_WEIGHT_MAX)
)
weight_in_shares = ConvertedCodec(
    weight_to_shares, shares_to_weight, Range(CPU_SHARES_MIN, CPU_SHARES_MAX)
)
cpulist = CpuListCodec()
INT: Codec[int] = Codec(integer, integer)
LIMIT: Codec[int | None] = Codec(v1_limit, v2_limit)
CPULIST: Codec[frozenset[int]] = Codec(cpulist, cpulist)
BYTES = RangeOrUnlimited(0, V1_UNLIMITED_MIN - 1, saturate=True)
V1_ANOLIS = "cgroup v2, or an Anolis kernel on cgroup v1"

# The table: logical name, v1 controller, v1 file, v2 file, codec, valid values, doc, flags.
# Ranges are Koordinator's validators (pkg/koordlet/util/system/cgroup_resource.go).
# fmt: off
CPU_SHARES: Knob[int] = Knob(
    "cpu_shares", "cpu", "cpu.shares", "cpu.weight", Codec(integer, shares_in_weight),
    Range(CPU_SHARES_MIN, CPU_SHARES_MAX),
    "relative CPU weight in v1 shares; v2 keeps it as cpu.weight (see the module doc)")
CPU_WEIGHT: Knob[int] = Knob(
    "cpu_weight", "cpu", "cpu.shares", "cpu.weight", Codec(weight_in_shares, integer),
    Range(CPU_WEIGHT_MIN, CPU_WEIGHT_MAX),
    "relative CPU weight in v2 units; v1 keeps the smallest shares that map back to it")
CPU_CFS_QUOTA: Knob[int | None] = Knob(
    "cpu_cfs_quota", "cpu", "cpu.cfs_quota_us", "cpu.max", Codec(v1_limit, CpuMaxQuotaCodec()),
    RangeOrUnlimited(CFS_QUOTA_MIN_US, CFS_QUOTA_MAX_US),
    "CFS runtime per period in µs, None unlimited; on v2 the period in cpu.max is kept")
CPU_CFS_PERIOD: Knob[int] = Knob(
    "cpu_cfs_period", "cpu", "cpu.cfs_period_us", "cpu.max", Codec(integer, CpuMaxPeriodCodec()),
    Range(CFS_PERIOD_MIN_US, CFS_PERIOD_MAX_US),
    "CFS period in µs; on v2 the quota in cpu.max is kept")
CPU_BURST: Knob[int] = Knob(
    "cpu_burst", "cpu", "cpu.cfs_burst_us", "cpu.max.burst", INT, Range(0, CPU_BURST_MAX_US),
    "CFS burst in µs: unused quota a cgroup may save up and spend above its quota",
    requires="Linux >= 5.14 (CFS burst)")
CPU_IDLE: Knob[int] = Knob(
    "cpu_idle", "cpu", "cpu.idle", "cpu.idle", INT, Range(0, 1),
    "1 makes the cgroup SCHED_IDLE: it runs only when nothing else wants the CPU",
    requires="Linux >= 5.15 (SCHED_IDLE for cgroups)")
CPU_BVT_WARP_NS: Knob[int] = Knob(
    "cpu_bvt_warp_ns", "cpu", "cpu.bvt_warp_ns", "cpu.bvt_warp_ns", INT, Range(-1, 2),
    "Anolis group identity: 2 latency-sensitive, 0 normal, -1 best-effort", anolis_only=True)
CPUSET_CPUS: Knob[frozenset[int]] = Knob(
    "cpuset_cpus", "cpuset", "cpuset.cpus", "cpuset.cpus", CPULIST, CpuList(),
    "CPUs the cgroup may run on")
CPUSET_MEMS: Knob[frozenset[int]] = Knob(
    "cpuset_mems", "cpuset", "cpuset.mems", "cpuset.mems", CPULIST, CpuList(),
    "NUMA nodes the cgroup may allocate from")
MEMORY_LIMIT: Knob[int | None] = Knob(
    "memory_limit", "memory", "memory.limit_in_bytes", "memory.max", LIMIT, BYTES,
    "hard memory limit in bytes; None is unlimited")
MEMORY_MIN: Knob[int | None] = Knob(
    "memory_min", "memory", "memory.min", "memory.min", LIMIT, BYTES,
    "memory protected from reclaim, bytes", v1_anolis_only=True, requires=V1_ANOLIS)
MEMORY_LOW: Knob[int | None] = Knob(
    "memory_low", "memory", "memory.low", "memory.low", LIMIT, BYTES,
    "best-effort memory protection, bytes", v1_anolis_only=True, requires=V1_ANOLIS)
MEMORY_HIGH: Knob[int | None] = Knob(
    "memory_high", "memory", "memory.high", "memory.high", LIMIT, BYTES,
    "memory throttling threshold, bytes; None is unlimited",
    v1_anolis_only=True, requires=V1_ANOLIS)
MEMORY_WMARK_RATIO: Knob[int] = Knob(
    "memory_wmark_ratio", "memory", "memory.wmark_ratio", "memory.wmark_ratio", INT,
    Range(0, 100), "async reclaim high watermark, percent of the limit; 0 disables it",
    anolis_only=True)
MEMORY_WMARK_SCALE_FACTOR: Knob[int] = Knob(
    "memory_wmark_scale_factor", "memory", "memory.wmark_scale_factor",
    "memory.wmark_scale_factor", INT, Range(1, 1000),
    "gap between async reclaim high and low watermarks, in 1/10000 of the limit",
    anolis_only=True)
MEMORY_WMARK_MIN_ADJ: Knob[int] = Knob(
    "memory_wmark_min_adj", "memory", "memory.wmark_min_adj", "memory.wmark_min_adj", INT,
    Range(-25, 50), "global min watermark adjustment, percent: negative LS, positive BE",
    anolis_only=True)
MEMORY_PRIORITY: Knob[int] = Knob(
    "memory_priority", "memory", "memory.priority", "memory.priority", INT, Range(0, 12),
    "OOM priority; with memory_use_priority_oom lower priorities die first", anolis_only=True)
MEMORY_USE_PRIORITY_OOM: Knob[int] = Knob(
    "memory_use_priority_oom", "memory", "memory.use_priority_oom", "memory.use_priority_oom",
    INT, Range(0, 1), "1 makes the OOM killer honour memory.priority", anolis_only=True)
MEMORY_OOM_GROUP: Knob[int] = Knob(
    "memory_oom_group", "memory", "memory.oom.group", "memory.oom.group", INT, Range(0, 1),
    "1 makes the OOM killer kill the whole cgroup at once",
    v1_anolis_only=True, requires="cgroup v2 (Linux >= 4.19), or an Anolis kernel on cgroup v1")
MEMORY_IDLE_PAGE_STATS: Knob[str] = Knob(
    "memory_idle_page_stats", "memory", "memory.idle_page_stats", "memory.idle_page_stats",
    Codec(RawTextCodec(), RawTextCodec()), AnyText(),
    "Anolis kidled cold-page histogram, read by the cold-memory collector",
    anolis_only=True, writable=False)
# Block I/O: one line per device (koordlet.system.devcodec), all keyed. Throttle limits are the
# kernel's u64 bytes/s and u32 IOs/s (block/blk-throttle.c); a device without an entry is
# unlimited, so the logical value never holds 0. Weights are per scheduler: BFQ 1..1000 and
# blk-iocost 1..10000, both defaulting to 100; CFQ 10..1000, default 500 (removed in Linux 5.0).
THROTTLE_BPS = DeviceRange(1, INT64_MAX)
THROTTLE_IOPS = DeviceRange(1, (1 << 32) - 2)
IOCOST_QOS_KEYS = ("enable", "ctrl", "rpct", "rlat", "wpct", "wlat")
IOCOST_MODEL_KEYS = ("ctrl", "rbps", "rseqiops", "rrandiops", "wbps", "wseqiops", "wrandiops")
_V1_THROTTLE = DeviceLinesCodec("0")
_WEIGHTS = DeviceLinesCodec("default")
BLKIO_READ_BPS: Knob[DeviceValues] = Knob(
    "blkio_read_bps", "blkio", "blkio.throttle.read_bps_device", "io.max",
    Codec(_V1_THROTTLE, DeviceKeyCodec("rbps")), THROTTLE_BPS,
    "read bytes/s limit per device (blk-throttle); v2: the rbps of io.max", keyed=True,
    requires="CONFIG_BLK_DEV_THROTTLING")
BLKIO_WRITE_BPS: Knob[DeviceValues] = Knob(
    "blkio_write_bps", "blkio", "blkio.throttle.write_bps_device", "io.max",
    Codec(_V1_THROTTLE, DeviceKeyCodec("wbps")), THROTTLE_BPS,
    "write bytes/s limit per device (blk-throttle); v2: the wbps of io.max", keyed=True,
    requires="CONFIG_BLK_DEV_THROTTLING")
BLKIO_READ_IOPS: Knob[DeviceValues] = Knob(
    "blkio_read_iops", "blkio", "blkio.throttle.read_iops_device", "io.max",
    Codec(_V1_THROTTLE, DeviceKeyCodec("riops")), THROTTLE_IOPS,
    "read IOs/s limit per device (blk-throttle); v2: the riops of io.max", keyed=True,
    requires="CONFIG_BLK_DEV_THROTTLING")
BLKIO_WRITE_IOPS: Knob[DeviceValues] = Knob(
    "blkio_write_iops", "blkio", "blkio.throttle.write_iops_device", "io.max",
    Codec(_V1_THROTTLE, DeviceKeyCodec("wiops")), THROTTLE_IOPS,
    "write IOs/s limit per device (blk-throttle); v2: the wiops of io.max", keyed=True,
    requires="CONFIG_BLK_DEV_THROTTLING")
BLKIO_BFQ_WEIGHT: Knob[DeviceValues] = Knob(
    "blkio_bfq_weight", "blkio", "blkio.bfq.weight_device", "io.bfq.weight",
    Codec(_WEIGHTS, _WEIGHTS), DeviceRange(1, 1000),
    "BFQ proportional weight per device, default 100; only where the device's scheduler is bfq",
    keyed=True, requires="the BFQ I/O scheduler (CONFIG_IOSCHED_BFQ, BFQ_GROUP_IOSCHED)")
BLKIO_COST_WEIGHT: Knob[DeviceValues] = Knob(
    "blkio_cost_weight", "blkio", "blkio.cost.weight", "io.weight",
    Codec(_WEIGHTS, _WEIGHTS), DeviceRange(1, 10000),
    "blk-iocost proportional weight per device, default 100; effective once io.cost.qos enables "
    "the device", keyed=True, v1_anolis_only=True,
    requires="cgroup v2 with blk-iocost (CONFIG_BLK_CGROUP_IOCOST), or an Anolis kernel on v1")
BLKIO_CFQ_WEIGHT: Knob[DeviceValues] = Knob(
    "blkio_cfq_weight", "blkio", "blkio.weight_device", None,
    Codec(DeviceLinesCodec("0"), DeviceLinesCodec("0")), DeviceRange(10, 1000),
    "CFQ proportional weight per device, default 500", keyed=True,
    requires="the CFQ I/O scheduler (Linux < 5.0)")
BLKIO_IO_LATENCY: Knob[DeviceValues] = Knob(
    "blkio_io_latency", "blkio", None, "io.latency",
    Codec(DeviceKeyCodec("target"), DeviceKeyCodec("target")), DeviceRange(1, INT64_MAX),
    "blk-iolatency target per device, µs: siblings are throttled while it is missed",
    keyed=True, requires="cgroup v2 with blk-iolatency (CONFIG_BLK_CGROUP_IOLATENCY)")
BLKIO_COST_QOS: Knob[DeviceParams] = Knob(
    "blkio_cost_qos", "blkio", "blkio.cost.qos", "io.cost.qos",
    Codec(DeviceParamsCodec("enable", "0", IOCOST_QOS_KEYS),
          DeviceParamsCodec("enable", "0", IOCOST_QOS_KEYS)),
    DeviceParamSet(IOCOST_QOS_KEYS),
    "blk-iocost QoS per device (root cgroup): latency targets and percentiles", keyed=True,
    v1_anolis_only=True, requires="cgroup v2 with blk-iocost (CONFIG_BLK_CGROUP_IOCOST), "
    "or an Anolis kernel on v1; root cgroup only")
BLKIO_COST_MODEL: Knob[DeviceParams] = Knob(
    "blkio_cost_model", "blkio", "blkio.cost.model", "io.cost.model",
    Codec(DeviceParamsCodec("ctrl", "auto", IOCOST_MODEL_KEYS),
          DeviceParamsCodec("ctrl", "auto", IOCOST_MODEL_KEYS)),
    DeviceParamSet(IOCOST_MODEL_KEYS),
    "blk-iocost cost model per device (root cgroup): a user model, else the kernel's auto one",
    keyed=True, v1_anolis_only=True,
    requires="cgroup v2 with blk-iocost (CONFIG_BLK_CGROUP_IOCOST), or an Anolis kernel on v1; "
    "root cgroup only")
NET_CLS_CLASSID: Knob[int] = Knob(
    "net_cls_classid", "net_cls", "net_cls.classid", None, INT, Range(0, (1 << 32) - 1),
    "tc class id (major << 16 | minor) of the cgroup's sockets; 0 unclassified",
    requires="the cgroup v1 net_cls controller (CONFIG_CGROUP_NET_CLASSID) mounted")
KNOBS: Mapping[str, Knob[Any]] = MappingProxyType({k.name: k for k in (
    CPU_SHARES, CPU_WEIGHT, CPU_CFS_QUOTA, CPU_CFS_PERIOD, CPU_BURST, CPU_IDLE, CPU_BVT_WARP_NS,
    CPUSET_CPUS, CPUSET_MEMS, MEMORY_LIMIT, MEMORY_MIN, MEMORY_LOW, MEMORY_HIGH,
    MEMORY_WMARK_RATIO, MEMORY_WMARK_SCALE_FACTOR, MEMORY_WMARK_MIN_ADJ, MEMORY_PRIORITY,
    MEMORY_USE_PRIORITY_OOM, MEMORY_OOM_GROUP, MEMORY_IDLE_PAGE_STATS,
    BLKIO_READ_BPS, BLKIO_WRITE_BPS, BLKIO_READ_IOPS, BLKIO_WRITE_IOPS, BLKIO_BFQ_WEIGHT,
    BLKIO_COST_WEIGHT, BLKIO_CFQ_WEIGHT, BLKIO_IO_LATENCY, BLKIO_COST_QOS, BLKIO_COST_MODEL,
    NET_CLS_CLASSID,
)})
# fmt: on
"""Every knob by logical name."""


def knob(name: str) -> Knob[Any]:
    """The knob called ``name``; raises ``UnsupportedError`` for a name not in the table."""
    try:
        return KNOBS[name]
    except KeyError:
        raise UnsupportedError(name, "no such knob in koordlet.system.knobs.KNOBS") from None
