"""``spec.resourceQOSStrategy`` of a NodeSLO as typed, frozen dataclasses, and the field codecs
that :mod:`apis.slo_strategies` shares.

Every dataclass field carries its upstream JSON name and a codec (:func:`wire`); one generic
:func:`merge_object` reads camelCase JSON *over* a base value field by field, the way the Go
koordlet unmarshals a NodeSLO section onto a deep copy of its defaults: a field that is absent or
null keeps the base value, a nested object merges recursively, a list replaces. :func:`dump_object`
writes the camelCase JSON back (fields that are unset, ``None``, are left out).

Defaults are Koordinator's (``pkg/util/sloconfig``: ``DefaultResourceQOSStrategy`` and the
``None*QOS`` "disabled" values). The dataclass defaults of :class:`CPUQOSConfig`,
:class:`MemoryQOSConfig`, :class:`ResctrlQOSConfig`, :class:`BlkIOQOSConfig` and
:class:`NetworkQOSConfig` are upstream's all-disabled ``None*QOS`` values; the per-class
recommended values are in :data:`DEFAULT_RESOURCE_QOS_STRATEGY`.

Errors are :class:`apis.slo.SchemaError` naming the full field path.
"""

# wire() returns dataclasses.field(...) with the JSON name and codec

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import field, fields, replace
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeVar

from apis.records import frozen
from apis.slo import ParseContext

logger = logging.getLogger(__name__)

QUANTITY_PATTERN = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A Kubernetes ``resource.Quantity`` in its string form (the CRD's pattern)."""


# Field codecs ----------------------------------------------------------------------------------


def describe(value: object) -> str:
    """``value`` for an error message: strings quoted, everything else by ``repr``."""
    return repr(value)


class Codec(Protocol):
    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> Any: ...

    def dump(self, value: Any) -> Any: ...


@frozen
class Int:
    """An integer in ``lo..hi`` (either bound may be open)."""

    lo: int | None = None
    hi: int | None = None

    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> int:
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (self.lo is None or value >= self.lo)
            and (self.hi is None or value <= self.hi)
        ):
            return value
        lo = "" if self.lo is None else str(self.lo)
        hi = "" if self.hi is None else str(self.hi)
        want = f" {lo}..{hi}" if lo or hi else ""
        raise ctx.fail(path, f"must be an integer{want}, got {describe(value)}")

    def dump(self, value: Any) -> Any:
        return value


@frozen
class Bool:
    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> bool:
        if isinstance(value, bool):
            return value
        raise ctx.fail(path, f"must be a boolean, got {describe(value)}")

    def dump(self, value: Any) -> Any:
        return value


@frozen
class Str:
    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> str:
        if isinstance(value, str):
            return value
        raise ctx.fail(path, f"must be a string, got {describe(value)}")

    def dump(self, value: Any) -> Any:
        return value


@frozen
class Enum:
    """One of a ``StrEnum``'s values."""

    enum: type[StrEnum]

    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> StrEnum:
        try:
            return self.enum(str(value) if isinstance(value, str) else "\0")
        except ValueError:
            known = ", ".join(m.value for m in self.enum)
            raise ctx.fail(path, f"must be one of {known}, got {describe(value)}") from None

    def dump(self, value: Any) -> Any:
        return str(value.value)


@frozen
class IntOrString:
    """``x-kubernetes-int-or-string``: an integer, or a string (a quantity when ``quantity``)."""

    quantity: bool = False

    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and (not self.quantity or QUANTITY_PATTERN.match(value)):
            return value
        want = "a quantity such as '100M'" if self.quantity else "a string"
        raise ctx.fail(path, f"must be an integer or {want}, got {describe(value)}")

    def dump(self, value: Any) -> Any:
        return value


@frozen
class BoolMap:
    """An object of boolean values (``schedFeatures``)."""

    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> Mapping[str, bool]:
        if not isinstance(value, Mapping):
            raise ctx.fail(path, f"must be an object, got {describe(value)}")
        merged = dict(base or {})
        for key, item in value.items():
            if item is not None:
                merged[str(key)] = Bool().parse(item, None, ctx, f"{path}.{key}")
        return MappingProxyType(dict(sorted(merged.items())))

    def dump(self, value: Any) -> Any:
        return dict(value)


@frozen
class Nested:
    """An object merged field by field into the base value. ``crd_defaults`` are what the API
    server fills in from the CRD's ``default:`` when the object is present."""

    cls: type[Any]
    crd_defaults: Mapping[str, Any] = field(default_factory=dict)

    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> Any:
        if isinstance(value, Mapping) and self.crd_defaults:
            value = {**self.crd_defaults, **{k: v for k, v in value.items() if v is not None}}
        return merge_object(self.cls, base if base is not None else self.cls(), value, ctx, path)

    def dump(self, value: Any) -> Any:
        return dump_object(value)


@frozen
class ListOf:
    """A list of objects; a list given replaces the base list (as Go's unmarshal does)."""

    cls: type[Any]

    def parse(self, value: object, base: Any, ctx: ParseContext, path: str) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise ctx.fail(path, f"must be a list, got {describe(value)}")
        return tuple(
            merge_object(self.cls, self.cls(), item, ctx, f"{path}[{i}]")
            for i, item in enumerate(value)
        )

    def dump(self, value: Any) -> Any:
        return [dump_object(item) for item in value]


def wire(json_name: str, codec: Codec, default: Any = None) -> Any:
    """A dataclass field read from and written to ``json_name`` with ``codec``."""
    meta = {"json": json_name, "codec": codec}
    if isinstance(default, list | dict) or (
        default is not None and hasattr(default, "__dataclass_fields__")
    ):
        value = default
        return field(default_factory=lambda: value, metadata=meta)
    return field(default=default, metadata=meta)


_T = TypeVar("_T")


def merge_object(cls: type[_T], base: _T, raw: object, ctx: ParseContext, path: str) -> _T:
    """``raw`` (camelCase JSON) merged over ``base`` field by field; see the module docstring.
    Ordering rules in ``cls._ORDER`` (``(lower, upper)`` attribute pairs) are checked on the
    result where both are set."""
    if raw is None:
        return base
    if not isinstance(raw, Mapping):
        raise ctx.fail(path, f"must be an object, got {describe(raw)}")
    known = {f.metadata["json"]: f for f in fields(cls) if "json" in f.metadata}  # type: ignore[arg-type]
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown and ctx.strict:
        raise ctx.fail(f"{path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(known))})")
    if unknown:
        logger.warning("%s: ignoring unknown fields %s", ctx.source or "NodeSLO", unknown)
    changes: dict[str, Any] = {}
    for key, f in known.items():
        value = raw.get(key)
        if value is not None:
            codec: Codec = f.metadata["codec"]
            changes[f.name] = codec.parse(value, getattr(base, f.name), ctx, f"{path}.{key}")
    merged = replace(base, **changes)  # type: ignore[type-var]
    for lower, upper in getattr(cls, "_ORDER", ()):
        lo, hi = getattr(merged, lower), getattr(merged, upper)
        if lo is not None and hi is not None and lo >= hi:
            lo_json, hi_json = _json_name(cls, lower), _json_name(cls, upper)
            raise ctx.fail(
                f"{path}.{lo_json}", f"must be less than {hi_json} ({hi}), got {describe(lo)}"
            )
    return merged


def _json_name(cls: type[Any], attr: str) -> str:
    return str(next(f.metadata["json"] for f in fields(cls) if f.name == attr))


def dump_object(obj: Any) -> dict[str, Any]:
    """camelCase JSON of a dataclass built with :func:`wire`; ``None`` fields are left out."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is not None and "json" in f.metadata:
            out[f.metadata["json"]] = f.metadata["codec"].dump(value)
    return out


class SectionParser(Protocol[_T]):
    """The signature of the ``parse_*`` functions."""

    def __call__(
        self,
        raw: object,
        *,
        base: _T | None = None,
        path: str = ...,
        source: str = "",
        strict: bool = True,
    ) -> _T: ...


def parser(cls: type[_T], default: _T, section: str) -> SectionParser[_T]:
    """A ``parse_*`` function for ``cls``: JSON merged over ``default`` (or a given ``base``)."""

    def parse(
        raw: object,
        *,
        base: _T | None = None,
        path: str = f"spec.{section}",
        source: str = "",
        strict: bool = True,
    ) -> _T:
        return merge_object(
            cls, default if base is None else base, raw, ParseContext(source, strict), path
        )

    parse.__name__ = f"parse_{section}"
    parse.__doc__ = (
        f"``{section}`` JSON merged field by field over Koordinator's defaults (or ``base``). "
        "Raises :class:`apis.slo.SchemaError` naming the field path."
    )
    return parse


# Enums -----------------------------------------------------------------------------------------
class CPUQOSPolicy(StrEnum):
    """``policies.cpuPolicy``."""

    GROUP_IDENTITY = "groupIdentity"
    CORE_SCHED = "coreSched"


class NetQOSPolicy(StrEnum):
    """``policies.netQOSPolicy``."""

    TC = "tc"
    TERWAY_QOS = "terway-qos"


class BlockType(StrEnum):
    """``blkioQOS.blocks[].type``."""

    DEVICE = "device"
    VOLUME_GROUP = "volumegroup"
    POD_VOLUME = "podvolume"


# The model -------------------------------------------------------------------------------------
@frozen
class CPUQOSConfig:
    """``cpuQOS`` (``CPUQOSCfg``); the defaults are upstream's ``NoneCPUQOS``."""

    enable: bool = wire("enable", Bool(), False)
    """Whether CPU QoS is on for the class (``enable``). Default false."""
    group_identity: int = wire("groupIdentity", Int(-1, 2), 0)
    """``cpu.bvt_warp_ns`` group identity, -1..2 (``groupIdentity``); with cpuPolicy
    groupIdentity. Default 0; recommended LSR/LS 2, BE -1."""
    sched_idle: int = wire("schedIdle", Int(0, 1), 0)
    """``cpu.idle`` (1 = SCHED_IDLE), 0..1 (``schedIdle``); with cpuPolicy coreSched. Default 0."""
    core_expeller: bool = wire("coreExpeller", Bool(), False)
    """Whether the class may expel idle pods at SMT level (``coreExpeller``); with coreSched.
    Default false; recommended LSR/LS true."""


@frozen
class MemoryQOSConfig:
    """``memoryQOS`` (``MemoryQOSCfg``); the defaults are upstream's ``NoneMemoryQOS``."""

    enable: bool = wire("enable", Bool(), False)
    """Whether memory QoS is on for the class (``enable``). Default false."""
    min_limit_percent: int = wire("minLimitPercent", Int(0, 100), 0)
    """``memory.min`` = request * this / 100, percent 0..100 (``minLimitPercent``). Default 0."""
    low_limit_percent: int = wire("lowLimitPercent", Int(0, 100), 0)
    """``memory.low`` = request * this / 100, percent 0..100 (``lowLimitPercent``). Default 0."""
    throttling_percent: int = wire("throttlingPercent", Int(0, 100), 0)
    """``memory.high`` factor between request and limit, percent 0..100
    (``throttlingPercent``). Default 0 (off)."""
    wmark_ratio: int = wire("wmarkRatio", Int(0, 100), 0)
    """``memory.wmark_ratio``, percent 0..100 (``wmarkRatio``). Default 0; recommended 95."""
    wmark_scale_permill: int = wire("wmarkScalePermill", Int(1, 1000), 50)
    """``memory.wmark_scale_factor``, permill 1..1000 (``wmarkScalePermill``). Default 50;
    recommended 20."""
    wmark_min_adj: int = wire("wmarkMinAdj", Int(-25, 50), 0)
    """``memory.wmark_min_adj``, -25..50 (``wmarkMinAdj``). Default 0; recommended LSR/LS -25,
    BE 50."""
    priority_enable: int = wire("priorityEnable", Int(0, 1), 0)
    """``memory.use_priority_oom``, 0..1 (``priorityEnable``). Default 0."""
    priority: int = wire("priority", Int(0, 12), 0)
    """``memory.priority``, 0..12 (``priority``). Default 0."""
    oom_kill_group: int = wire("oomKillGroup", Int(0, 1), 0)
    """``memory.oom.group``, 0..1 (``oomKillGroup``). Default 0."""
    page_cache_enable: bool | None = wire("pageCacheEnable", Bool())
    """``memory.pagecache_limit.enable`` (``pageCacheEnable``). Default unset."""
    page_cache_limit_percent: int | None = wire("pageCacheLimitPercent", Int(0, 100))
    """Page cache limit as a percent of the memory limit, 0..100 (``pageCacheLimitPercent``).
    Default unset."""
    page_cache_limit_size: int | None = wire("pageCacheLimitSize", Int(0))
    """Page cache limit in bytes; wins over the percent (``pageCacheLimitSize``). Default unset."""
    page_cache_reclaim_sync: bool | None = wire("pageCacheReclaimSync", Bool())
    """``memory.pagecache_limit.sync``: synchronous reclaim (``pageCacheReclaimSync``).
    Default unset (asynchronous)."""


@frozen
class ResctrlQOSConfig:
    """``resctrlQOS`` (``ResctrlQOSCfg``); the defaults are upstream's ``NoneResctrlQOS``."""

    _ORDER: ClassVar[tuple[tuple[str, str], ...]] = (
        ("cat_range_start_percent", "cat_range_end_percent"),
    )
    enable: bool = wire("enable", Bool(), False)
    """Whether resctrl QoS is on for the class (``enable``). Default false."""
    cat_range_start_percent: int = wire("catRangeStartPercent", Int(0, 100), 0)
    """Start of the LLC ways the class may use, percent 0..100, below the end
    (``catRangeStartPercent``). Default 0."""
    cat_range_end_percent: int = wire("catRangeEndPercent", Int(0, 100), 100)
    """End of the LLC ways, percent 0..100 (``catRangeEndPercent``). Default 100; BE 30."""
    mba_percent: int = wire("mbaPercent", Int(0, 100), 100)
    """Memory bandwidth allocation, percent 0..100 (``mbaPercent``). Default 100."""


@frozen
class IOConfig:
    """``blkioQOS.blocks[].ioCfg`` (``IOCfg``); every field unset by default."""

    read_iops: int | None = wire("readIOPS", Int(0))
    """Read IOPS limit; 0 disables (``readIOPS``)."""
    write_iops: int | None = wire("writeIOPS", Int(0))
    """Write IOPS limit; 0 disables (``writeIOPS``)."""
    read_bps: int | None = wire("readBPS", Int(0))
    """Read bytes/s limit; 0 disables (``readBPS``)."""
    write_bps: int | None = wire("writeBPS", Int(0))
    """Write bytes/s limit; 0 disables (``writeBPS``)."""
    io_weight_percent: int | None = wire("ioWeightPercent", Int(1, 100))
    """Weight of the group, 1..100 (``ioWeightPercent``); the kernel default is 100."""
    read_latency: int | None = wire("readLatency", Int())
    """blk-iocost read latency threshold, µs (``readLatency``); cgroup root only."""
    write_latency: int | None = wire("writeLatency", Int())
    """blk-iocost write latency threshold, µs (``writeLatency``); cgroup root only."""
    read_latency_percent: int | None = wire("readLatencyPercent", Int(0, 100))
    """blk-iocost read latency percentile, 0..100 (``readLatencyPercent``)."""
    write_latency_percent: int | None = wire("writeLatencyPercent", Int(0, 100))
    """blk-iocost write latency percentile, 0..100 (``writeLatencyPercent``)."""
    enable_user_model: bool | None = wire("enableUserModel", Bool())
    """Whether the blk-iocost cost model is given below (``enableUserModel``); default false."""
    model_read_bps: int | None = wire("modelReadBPS", Int(1))
    """User model read bytes/s, ≥ 1 (``modelReadBPS``)."""
    model_write_bps: int | None = wire("modelWriteBPS", Int(1))
    """User model write bytes/s, ≥ 1 (``modelWriteBPS``)."""
    model_read_seq_iops: int | None = wire("modelReadSeqIOPS", Int(1))
    """User model sequential read IOPS, ≥ 1 (``modelReadSeqIOPS``)."""
    model_write_seq_iops: int | None = wire("modelWriteSeqIOPS", Int(1))
    """User model sequential write IOPS, ≥ 1 (``modelWriteSeqIOPS``)."""
    model_read_rand_iops: int | None = wire("modelReadRandIOPS", Int(1))
    """User model random read IOPS, ≥ 1 (``modelReadRandIOPS``)."""
    model_write_rand_iops: int | None = wire("modelWriteRandIOPS", Int(1))
    """User model random write IOPS, ≥ 1 (``modelWriteRandIOPS``)."""


@frozen
class BlockConfig:
    """One ``blkioQOS.blocks[]`` entry (``BlockCfg``)."""

    name: str = wire("name", Str(), "")
    """Device, volume group or pod volume name (``name``)."""
    type: BlockType | None = wire("type", Enum(BlockType))
    """What ``name`` is (``type``): device (cgroup root only), volumegroup or podvolume."""
    io_cfg: IOConfig = wire("ioCfg", Nested(IOConfig), IOConfig())
    """Limits and weights (``ioCfg``)."""


@frozen
class BlkIOQOSConfig:
    """``blkioQOS`` (``BlkIOQOSCfg``); default off with no blocks (``NoneBlkIOQOS``)."""

    enable: bool = wire("enable", Bool(), False)
    """Whether blkio QoS is on (``enable``). Default false."""
    blocks: tuple[BlockConfig, ...] = wire("blocks", ListOf(BlockConfig), ())
    """Per-block settings (``blocks``); a list given replaces the default. Default empty."""


_NET_CRD_DEFAULTS = {
    "ingressRequest": 0,
    "ingressLimit": 100,
    "egressRequest": 0,
    "egressLimit": 100,
}


@frozen
class NetworkQOSConfig:
    """``networkQOS`` (``NetworkQOSCfg``); the defaults are upstream's ``NoneNetworkQOS`` (all 0).
    When the object is present, the CRD's own defaults (requests 0, limits 100) fill the fields it
    omits, as the API server does."""

    enable: bool = wire("enable", Bool(), False)
    """Whether network QoS is on (``enable``). Default false."""
    ingress_request: int | str = wire("ingressRequest", IntOrString(), 0)
    """Guaranteed ingress bandwidth: percent of the total (int 0..100) or a rate such as '50M'
    (``ingressRequest``). Default 0."""
    ingress_limit: int | str = wire("ingressLimit", IntOrString(), 0)
    """Ingress bandwidth ceiling, percent or rate (``ingressLimit``). Default 0 (CRD: 100)."""
    egress_request: int | str = wire("egressRequest", IntOrString(), 0)
    """Guaranteed egress bandwidth, percent or rate (``egressRequest``). Default 0."""
    egress_limit: int | str = wire("egressLimit", IntOrString(), 0)
    """Egress bandwidth ceiling, percent or rate (``egressLimit``). Default 0 (CRD: 100)."""


@frozen
class ResourceQOS:
    """One class's QoS (``ResourceQOS``); each part defaults to upstream's disabled value."""

    cpu_qos: CPUQOSConfig = wire("cpuQOS", Nested(CPUQOSConfig), CPUQOSConfig())
    """``cpuQOS``."""
    memory_qos: MemoryQOSConfig = wire("memoryQOS", Nested(MemoryQOSConfig), MemoryQOSConfig())
    """``memoryQOS``."""
    blkio_qos: BlkIOQOSConfig = wire("blkioQOS", Nested(BlkIOQOSConfig), BlkIOQOSConfig())
    """``blkioQOS``."""
    resctrl_qos: ResctrlQOSConfig = wire("resctrlQOS", Nested(ResctrlQOSConfig), ResctrlQOSConfig())
    """``resctrlQOS``."""
    network_qos: NetworkQOSConfig = wire(
        "networkQOS", Nested(NetworkQOSConfig, _NET_CRD_DEFAULTS), NetworkQOSConfig()
    )
    """``networkQOS``."""


@frozen
class ResourceQOSPolicies:
    """``policies`` (``ResourceQOSPolicies``)."""

    cpu_policy: CPUQOSPolicy = wire("cpuPolicy", Enum(CPUQOSPolicy), CPUQOSPolicy.GROUP_IDENTITY)
    """How CPU QoS is enforced (``cpuPolicy``): groupIdentity (default) or coreSched."""
    net_qos_policy: NetQOSPolicy = wire("netQOSPolicy", Enum(NetQOSPolicy), NetQOSPolicy.TC)
    """How network QoS is enforced (``netQOSPolicy``): tc (default) or terway-qos."""


_LS_CPU = CPUQOSConfig(group_identity=2, sched_idle=0, core_expeller=True)
_LS_MEMORY = MemoryQOSConfig(wmark_ratio=95, wmark_scale_permill=20, wmark_min_adj=-25)

DEFAULT_LSR_QOS = ResourceQOS(cpu_qos=_LS_CPU, memory_qos=_LS_MEMORY)
"""Koordinator's recommended (but disabled) LSR values: group identity 2, core expeller, async
reclaim 95/20, wmarkMinAdj -25, the full LLC and memory bandwidth."""
DEFAULT_LS_QOS = ResourceQOS(cpu_qos=_LS_CPU, memory_qos=_LS_MEMORY)
"""Koordinator's recommended (but disabled) LS values: as LSR."""
DEFAULT_BE_QOS = ResourceQOS(
    cpu_qos=CPUQOSConfig(group_identity=-1),
    memory_qos=MemoryQOSConfig(wmark_ratio=95, wmark_scale_permill=20, wmark_min_adj=50),
    resctrl_qos=ResctrlQOSConfig(cat_range_end_percent=30),
)
"""Koordinator's recommended (but disabled) BE values: group identity -1, LLC 0..30 %,
async reclaim 95/20, wmarkMinAdj 50."""
DEFAULT_SYSTEM_QOS = ResourceQOS()
"""Koordinator's SYSTEM values: all the disabled values."""
DEFAULT_CGROUP_ROOT_QOS = ResourceQOS()
"""Koordinator's cgroup root values (upstream sets only blkio there; the rest is the disabled
value here, which means the same)."""


@frozen
class ResourceQOSStrategy:
    """``spec.resourceQOSStrategy``; defaults are Koordinator's ``DefaultResourceQOSStrategy``."""

    policies: ResourceQOSPolicies = wire(
        "policies", Nested(ResourceQOSPolicies), ResourceQOSPolicies()
    )
    """``policies``."""
    lsr_class: ResourceQOS = wire("lsrClass", Nested(ResourceQOS), DEFAULT_LSR_QOS)
    """LSR pods (``lsrClass``)."""
    ls_class: ResourceQOS = wire("lsClass", Nested(ResourceQOS), DEFAULT_LS_QOS)
    """LS pods (``lsClass``)."""
    be_class: ResourceQOS = wire("beClass", Nested(ResourceQOS), DEFAULT_BE_QOS)
    """BE pods (``beClass``)."""
    system_class: ResourceQOS = wire("systemClass", Nested(ResourceQOS), DEFAULT_SYSTEM_QOS)
    """SYSTEM pods (``systemClass``)."""
    cgroup_root: ResourceQOS = wire("cgroupRoot", Nested(ResourceQOS), DEFAULT_CGROUP_ROOT_QOS)
    """The root cgroup (``cgroupRoot``; blkio only upstream)."""

    def with_disabled_parts_cleared(self) -> ResourceQOSStrategy:
        """What the koordlet works with: for LSR, LS and BE, a CPU, resctrl or memory QoS whose
        ``enable`` is false takes the disabled values (``mergeNoneResourceQOSIfDisabled``)."""

        def clear(qos: ResourceQOS) -> ResourceQOS:
            return replace(
                qos,
                cpu_qos=qos.cpu_qos if qos.cpu_qos.enable else CPUQOSConfig(),
                resctrl_qos=qos.resctrl_qos if qos.resctrl_qos.enable else ResctrlQOSConfig(),
                memory_qos=qos.memory_qos if qos.memory_qos.enable else MemoryQOSConfig(),
            )

        return replace(
            self,
            lsr_class=clear(self.lsr_class),
            ls_class=clear(self.ls_class),
            be_class=clear(self.be_class),
        )


DEFAULT_RESOURCE_QOS_STRATEGY = ResourceQOSStrategy()
"""Koordinator's ``DefaultResourceQOSStrategy``."""

parse_resource_qos_strategy = parser(
    ResourceQOSStrategy, DEFAULT_RESOURCE_QOS_STRATEGY, "resourceQOSStrategy"
)


ANNOTATION_POD_BLKIO_QOS = "koordinator.sh/blkioQOS"
"""Pod annotation: the pod's own ``blkioQOS`` as JSON, ``{"blocks": [...]}``, applied to the
pod's cgroup; the only place a ``podvolume`` block can name a volume (upstream's
``AnnotationPodBlkioQoS``, ``apis/slo/v1alpha1/pod.go``)."""


def parse_pod_blkio_qos(text: str, *, source: str = "") -> tuple[BlockConfig, ...]:
    """The blocks of a ``koordinator.sh/blkioQOS`` annotation; an empty annotation has none.

    Raises :class:`apis.slo.SchemaError` naming the field (``blkioQOS.blocks[0].type``) when the
    text is not JSON or not a ``BlkIOQOS``; unknown fields are logged and ignored, as for any
    object from the API server."""
    if not text.strip():
        return ()
    ctx = ParseContext(source or ANNOTATION_POD_BLKIO_QOS, strict=False)
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ctx.fail("blkioQOS", f"not JSON: {err}") from err
    if isinstance(raw, Mapping):
        raw = {k: v for k, v in raw.items() if k != "enable"}
    return merge_object(BlkIOQOSConfig, BlkIOQOSConfig(), raw, ctx, "blkioQOS").blocks
