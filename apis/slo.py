"""NodeSLO (``slo.koordinator.sh/v1alpha1``) as far as the koordlet core needs it today.

Raw JSON stays a ``TypedDict`` at the edge; :func:`parse_node_slo` turns it into frozen
dataclasses and says exactly what is wrong (``spec.hostApplications[1].qos: unknown QoS 'XX'``).

Modelled: ``spec.hostApplications`` (Koordinator's ``HostApplicationSpec``). Kept here as
read-only mappings: ``resourceUsedThresholdWithBE``, ``resourceQOSStrategy``,
``cpuBurstStrategy``, ``systemStrategy`` and ``extensions``; their top-level field names are
checked against the CRD. :func:`apis.slo_strategies.strategies_of` turns the four strategy
sections into typed dataclasses merged over Koordinator's defaults, checking every value, and
:mod:`apis.slo_inforce` is what the koordlet holds: each section parsed once, over the defaults,
with the last good value kept per section.

Errors are :class:`SchemaError` (``apis`` imports no binary); the koordlet re-raises them as its
``ConfigError``.
"""

from __future__ import annotations

import functools
import json
import logging
import posixpath
from collections.abc import Hashable, Mapping, Sequence
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, TypeVar

if TYPE_CHECKING:
    import yaml

from apis.errors import FieldError
from apis.extension import QoSClass
from apis.priority import PriorityClass
from apis.records import frozen

logger = logging.getLogger(__name__)

API_VERSION = "slo.koordinator.sh/v1alpha1"
KIND = "NodeSLO"


class SchemaError(FieldError, ValueError):
    """A document that does not fit its schema; the message names the source and the field."""


class CgroupBaseType(StrEnum):
    """Where a host application's cgroup path starts (``CgroupBaseType`` upstream)."""

    ROOT = "CgroupRoot"
    """The root of each hierarchy (the default when ``base`` is empty)."""
    KUBEPODS = "Kubepods"
    """The kubepods cgroup (where Guaranteed pods live)."""
    KUBEPODS_BURSTABLE = "KubepodsBurstable"
    """The kubepods burstable QoS cgroup."""
    KUBEPODS_BESTEFFORT = "KubepodsBesteffort"
    """The kubepods besteffort QoS cgroup."""


DEFAULT_HOST_LS_CGROUP_DIR = "host-latency-sensitive"
"""Parent dir (under the cgroup root) of an LSE/LSR/LS host application without ``cgroupPath``."""
DEFAULT_HOST_BE_CGROUP_DIR = "host-best-effort"
"""Parent dir (under the cgroup root) of a BE host application without ``cgroupPath``."""


# Raw JSON at the edge ------------------------------------------------------------------------
class CgroupPathJSON(TypedDict, total=False):
    base: str
    parentDir: str
    relativePath: str


class HostApplicationJSON(TypedDict, total=False):
    name: str
    priority: str
    qos: str
    cgroupPath: CgroupPathJSON
    strategy: dict[str, Any]


class NodeSLOSpecJSON(TypedDict, total=False):
    resourceUsedThresholdWithBE: dict[str, Any]
    resourceQOSStrategy: dict[str, Any]
    cpuBurstStrategy: dict[str, Any]
    systemStrategy: dict[str, Any]
    extensions: dict[str, Any]
    hostApplications: list[HostApplicationJSON]


class NodeSLOJSON(TypedDict):
    apiVersion: NotRequired[str]
    kind: NotRequired[str]
    metadata: NotRequired[dict[str, Any]]
    spec: NotRequired[NodeSLOSpecJSON]
    status: NotRequired[dict[str, Any]]


# Field names per the CRD (slo.koordinator.sh_nodeslos.yaml) ------------------------------------
_OBJECT_KEYS = frozenset(NodeSLOJSON.__annotations__)
_HOST_APP_KEYS = frozenset(HostApplicationJSON.__annotations__)
_CGROUP_PATH_KEYS = frozenset(CgroupPathJSON.__annotations__)
_RAW_SECTIONS: Mapping[str, frozenset[str] | None] = {
    "resourceUsedThresholdWithBE": frozenset(
        [
            "allocatableEvictPriorityThreshold",
            "cpuAllocatableEvictLowerPercent",
            "cpuAllocatableEvictThresholdPercent",
            "cpuEvictBESatisfactionLowerPercent",
            "cpuEvictBESatisfactionUpperPercent",
            "cpuEvictBEUsageThresholdPercent",
            "cpuEvictLowerPercent",
            "cpuEvictPolicy",
            "cpuEvictThresholdPercent",
            "cpuEvictTimeWindowSeconds",
            "cpuSuppressMinPercent",
            "cpuSuppressPolicy",
            "cpuSuppressThresholdPercent",
            "enable",
            "evictEnabledPriorityThreshold",
            "memoryAllocatableEvictLowerPercent",
            "memoryAllocatableEvictThresholdPercent",
            "memoryEvictLowerPercent",
            "memoryEvictThresholdPercent",
        ]
    ),
    "resourceQOSStrategy": frozenset(
        ["policies", "lsrClass", "lsClass", "beClass", "systemClass", "cgroupRoot"]
    ),
    "cpuBurstStrategy": frozenset(
        [
            "policy",
            "cpuBurstPercent",
            "cfsQuotaBurstPercent",
            "cfsQuotaBurstPeriodSeconds",
            "sharePoolThresholdPercent",
        ]
    ),
    "systemStrategy": frozenset(
        [
            "minFreeKbytesFactor",
            "watermarkScaleFactor",
            "memcgReapBackGround",
            "pageCacheLimitEnabled",
            "schedGroupIdentityEnabled",
            "schedIdleSaverWmark",
            "schedFeatures",
            "totalNetworkBandwidth",
        ]
    ),
    "extensions": None,  # free-form (x-kubernetes-preserve-unknown-fields)
}
"""Spec sections kept raw: section → the field names the CRD allows (None: any)."""
_SPEC_KEYS = frozenset({*_RAW_SECTIONS, "hostApplications"})


def freeze(value: Any) -> Any:
    """A read-only deep copy of decoded JSON: mappings become ``MappingProxyType``, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain ``dict``/``list`` JSON from what :func:`freeze` made."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [thaw(v) for v in value]
    return value


# Parsed forms --------------------------------------------------------------------------------
@frozen
class HostCgroupPath:
    """Where a host application's cgroup is, below a base that the cgroup layout resolves."""

    base: CgroupBaseType
    """Which hierarchy point it starts from; the directory differs between cgroup drivers."""
    parent_dir: str
    """Relative, normalised parent under the base (``parentDir``); may be empty."""
    relative_path: str
    """Relative, normalised path under the parent (``relativePath``); may be empty."""

    def under(self, base_dir: str) -> str:
        """The cgroup directory, relative to a controller root, given the base's directory."""
        return posixpath.join(base_dir, self.parent_dir, self.relative_path).strip("/")


@frozen
class HostApplication:
    """A non-containerized application on the node (``HostApplicationSpec``)."""

    name: str
    """Unique among the node's host applications; the metric entity is ``hostapp/<name>``."""
    qos: QoSClass
    """Koordinator QoS class; empty (``NONE``) when not given."""
    priority: PriorityClass
    """Koordinator priority class; empty (``NONE``) when not given."""
    cgroup_path: HostCgroupPath
    """``cgroupPath`` as given; without it Koordinator's default: ``host-latency-sensitive/<name>``
    for LSE/LSR/LS, ``host-best-effort/<name>`` for BE, ``<name>`` otherwise, under the root."""
    strategy: Mapping[str, Any]
    """``strategy`` (an empty object in Koordinator today), read-only."""


@frozen
class NodeSLOSpec:
    """A NodeSLO's spec as written (the manager renders it, the persisted copy keeps it). Raw
    sections are read-only mappings, None when the NodeSLO omits them; what the koordlet works
    with is :class:`apis.slo_inforce.NodeSLOInForce`, each section parsed over the defaults."""

    host_applications: tuple[HostApplication, ...] = ()
    """``spec.hostApplications``, in order."""
    resource_used_threshold_with_be: Mapping[str, Any] | None = None
    """``spec.resourceUsedThresholdWithBE`` (BE suppression and eviction thresholds)."""
    resource_qos_strategy: Mapping[str, Any] | None = None
    """``spec.resourceQOSStrategy`` (per-QoS CPU, memory, resctrl, blkio and network QoS)."""
    cpu_burst_strategy: Mapping[str, Any] | None = None
    """``spec.cpuBurstStrategy``."""
    system_strategy: Mapping[str, Any] | None = None
    """``spec.systemStrategy`` (node-wide kernel settings)."""
    extensions: Mapping[str, Any] | None = None
    """``spec.extensions`` (third-party, free-form)."""

    def to_json(self) -> NodeSLOSpecJSON:
        """The spec as plain JSON (host applications with their effective cgroup paths)."""
        out: dict[str, Any] = {
            key: thaw(getattr(self, attr))
            for key, attr in _RAW_ATTRS.items()
            if getattr(self, attr) is not None
        }
        if self.host_applications:
            out["hostApplications"] = [_host_app_json(app) for app in self.host_applications]
        return out  # type: ignore[return-value]


_RAW_ATTRS = {
    "resourceUsedThresholdWithBE": "resource_used_threshold_with_be",
    "resourceQOSStrategy": "resource_qos_strategy",
    "cpuBurstStrategy": "cpu_burst_strategy",
    "systemStrategy": "system_strategy",
    "extensions": "extensions",
}


def _host_app_json(app: HostApplication) -> HostApplicationJSON:
    path = app.cgroup_path
    return {
        "name": app.name,
        "qos": app.qos.value,
        "priority": app.priority.value,
        "cgroupPath": {
            "base": path.base.value,
            "parentDir": path.parent_dir,
            "relativePath": path.relative_path,
        },
        "strategy": thaw(app.strategy),
    }


# Parsing -------------------------------------------------------------------------------------
@frozen
class ParseContext:
    """Where a document comes from and whether unknown fields are errors (local files, strict)
    or are logged and ignored (objects from an API server that may run a newer CRD): the one
    context of the apis parsers (NodeSLO, its strategies, the slo-controller-config)."""

    source: str = ""
    strict: bool = True

    def fail(self, field: str, message: str) -> SchemaError:
        return SchemaError(message, source=self.source, field=field)

    def mapping(self, value: object, field: str) -> Mapping[str, Any]:
        """``value`` as an object (null → empty); an error for anything else."""
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail(field, f"must be an object, got {kind_of(value)}")
        return value

    def check_keys(
        self,
        obj: Mapping[str, Any],
        known: frozenset[str] | Sequence[str],
        field: str,
        *,
        list_known: bool = True,
    ) -> None:
        """Unknown keys of ``obj``: an error naming the first when strict (with the known names
        when ``list_known``), else one warning line listing them."""
        unknown = sorted(str(k) for k in obj if k not in known)
        if not unknown:
            return
        where = f"{field}." if field else ""
        if self.strict:
            message = "unknown field"
            if list_known:
                message += f" (known: {', '.join(sorted(known))})"
            raise self.fail(f"{where}{unknown[0]}", message)
        logger.warning("%s: ignoring unknown fields %s", self.source, [where + k for k in unknown])

    def string(self, obj: Mapping[str, Any], key: str, field: str) -> str:
        value = obj.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self.fail(f"{field}.{key}", f"must be a string, got {kind_of(value)}")
        return value


_E = TypeVar("_E", bound=StrEnum)


def kind_of(value: object) -> str:
    """What a decoded JSON or YAML value is, for an error message: ``null``, ``a boolean``,
    ``a number``, ``a string``, ``a list``, ``an object`` (else the Python type's name)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, Sequence):
        return "a list"
    return type(value).__name__


def _enum_value(ctx: ParseContext, enum: type[_E], raw: str, field: str, what: str) -> _E:
    try:
        return enum(raw)
    except ValueError:
        known = ", ".join(m.value for m in enum if m.value)
        raise ctx.fail(field, f"unknown {what} {raw!r} (want one of {known})") from None


def _relative(ctx: ParseContext, raw: str, field: str) -> str:
    path = posixpath.normpath(raw).lstrip("/") if raw else ""
    if path in (".", ""):
        return ""
    if ".." in path.split("/") or "\0" in path:
        raise ctx.fail(field, f"must stay below its base, got {raw!r}")
    return path


def _parse_cgroup_path(ctx: ParseContext, raw: object, field: str) -> HostCgroupPath:
    obj = ctx.mapping(raw, field)
    ctx.check_keys(obj, _CGROUP_PATH_KEYS, field)
    base_raw = ctx.string(obj, "base", field)
    base = (
        _enum_value(ctx, CgroupBaseType, base_raw, f"{field}.base", "cgroup base")
        if base_raw
        else CgroupBaseType.ROOT
    )
    parent = _relative(ctx, ctx.string(obj, "parentDir", field), f"{field}.parentDir")
    relative = _relative(ctx, ctx.string(obj, "relativePath", field), f"{field}.relativePath")
    if not parent and not relative:
        raise ctx.fail(field, "parentDir or relativePath must name a cgroup below the base")
    return HostCgroupPath(base, parent, relative)


def _default_cgroup_path(name: str, qos: QoSClass) -> HostCgroupPath:
    if qos in (QoSClass.LSE, QoSClass.LSR, QoSClass.LS):
        parent = DEFAULT_HOST_LS_CGROUP_DIR
    elif qos is QoSClass.BE:
        parent = DEFAULT_HOST_BE_CGROUP_DIR
    else:
        parent = ""
    return HostCgroupPath(CgroupBaseType.ROOT, parent, name)


def _parse_host_app(ctx: ParseContext, raw: object, field: str) -> HostApplication:
    obj = ctx.mapping(raw, field)
    ctx.check_keys(obj, _HOST_APP_KEYS, field)
    name = ctx.string(obj, "name", field)
    if not name:
        raise ctx.fail(f"{field}.name", "is required")
    if "/" in name or name in (".", "..") or "\0" in name:
        raise ctx.fail(f"{field}.name", f"must be a single path segment, got {name!r}")
    qos = _enum_value(ctx, QoSClass, ctx.string(obj, "qos", field), f"{field}.qos", "QoS")
    priority = _enum_value(
        ctx, PriorityClass, ctx.string(obj, "priority", field), f"{field}.priority", "priority"
    )
    cgroup_raw = obj.get("cgroupPath")
    path = (
        _default_cgroup_path(name, qos)
        if cgroup_raw is None
        else _parse_cgroup_path(ctx, cgroup_raw, f"{field}.cgroupPath")
    )
    strategy = freeze(ctx.mapping(obj.get("strategy"), f"{field}.strategy"))
    return HostApplication(name, qos, priority, path, strategy)


def _parse_spec(ctx: ParseContext, spec: Mapping[str, Any], prefix: str) -> NodeSLOSpec:
    ctx.check_keys(spec, _SPEC_KEYS, prefix.rstrip("."))
    raw: dict[str, Mapping[str, Any] | None] = {}
    for key, known in _RAW_SECTIONS.items():
        if spec.get(key) is None:
            raw[_RAW_ATTRS[key]] = None
            continue
        section = ctx.mapping(spec[key], prefix + key)
        if known is not None:
            ctx.check_keys(section, known, prefix + key)
        raw[_RAW_ATTRS[key]] = freeze(section)
    apps_raw = spec.get("hostApplications")
    if apps_raw is None:
        apps_raw = []
    if not isinstance(apps_raw, list):
        raise ctx.fail(f"{prefix}hostApplications", f"must be a list, got {kind_of(apps_raw)}")
    apps: list[HostApplication] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(apps_raw):
        field = f"{prefix}hostApplications[{i}]"
        app = _parse_host_app(ctx, item, field)
        if app.name in seen:
            raise ctx.fail(
                f"{field}.name", f"duplicate name {app.name!r} (also at [{seen[app.name]}])"
            )
        seen[app.name] = i
        apps.append(app)
    return NodeSLOSpec(host_applications=tuple(apps), **raw)


def spec_of(obj: object, source: str, *, strict: bool = True) -> tuple[Mapping[str, Any], str]:
    """The raw ``spec`` of a NodeSLO given as a whole object (``apiVersion``/``kind``/``spec``)
    or as just its spec, and the field-path prefix of its sections (``spec.`` or empty). Checks
    the object's own fields and the spec's section names (``strict``: unknown names are errors),
    not what the sections hold. Raises :class:`SchemaError`."""
    ctx = ParseContext(source, strict)
    top = ctx.mapping(obj, "")
    if not any(key in top for key in _OBJECT_KEYS):
        spec, prefix = top, ""
    else:
        ctx.check_keys(top, _OBJECT_KEYS, "")
        for key, want in (("apiVersion", API_VERSION), ("kind", KIND)):
            if key in top and top[key] != want:
                raise ctx.fail(key, f"must be {want!r}, got {top[key]!r}")
        spec, prefix = ctx.mapping(top.get("spec"), "spec"), "spec."
    ctx.check_keys(spec, _SPEC_KEYS, prefix.rstrip("."))
    return spec, prefix


def parse_node_slo(obj: Mapping[str, Any], source: str, *, strict: bool = True) -> NodeSLOSpec:
    """The spec of a NodeSLO given as a whole object (``apiVersion``/``kind``/``spec``) or as just
    its spec. ``strict`` (for local files) rejects unknown field names, which are typos there;
    without it (objects from the API server, possibly from a newer CRD) they are logged and
    ignored. Raises :class:`SchemaError` naming ``source`` and the field path."""
    spec, prefix = spec_of(obj, source, strict=strict)
    return parse_spec(spec, source, prefix=prefix, strict=strict)


def parse_spec(
    spec: Mapping[str, Any], source: str, *, prefix: str = "spec.", strict: bool = True
) -> NodeSLOSpec:
    """:func:`parse_node_slo` of a raw spec whose sections sit at ``prefix``."""
    return _parse_spec(ParseContext(source, strict), spec, prefix)


# Files ---------------------------------------------------------------------------------------
@functools.cache
def _unique_key_loader() -> type[yaml.SafeLoader]:
    """A YAML loader for which a repeated mapping key is an error, not a silent overwrite.

    PyYAML is imported here, at the first file read, not with this module: a koordlet whose
    NodeSLO comes from the API server or a JSON file never pays its 1 MiB (docs/benchmarks.md).
    """
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(
            self, node: yaml.MappingNode, deep: bool = False
        ) -> dict[Hashable, Any]:
            seen: set[Hashable] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    mark = key_node.start_mark
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def read_document(path: str) -> Any:
    """The YAML or JSON content of ``path`` (JSON when it ends in ``.json``). Duplicate keys
    are errors. Raises :class:`SchemaError` naming the file (and line) when it cannot be read or
    parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as err:
        raise SchemaError(f"cannot read: {err}", source=path) from err
    if path.endswith(".json"):
        try:
            return json.loads(text, object_pairs_hook=unique_json_object)
        except ValueError as err:
            raise SchemaError(f"invalid JSON: {err}", source=path) from err
    loader = _unique_key_loader()
    import yaml  # loaded by _unique_key_loader

    try:
        return yaml.load(text, Loader=loader)  # a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or str(err)
        raise SchemaError(f"invalid YAML: {where}{problem}", source=path) from err


def unique_json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` refusing a key given twice (``ValueError``), as
    the API server's strict decoding does."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out
