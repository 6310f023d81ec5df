"""The ``slo-controller-config`` ConfigMap parsed and validated into the model of
:mod:`apis.configuration` (upstream's ``pkg/util/sloconfig``).

The colocation, CPU normalization and resource amplification keys become typed strategies; the
other keys are checked as :mod:`apis.configuration` lists them and kept raw, read-only, for the
NodeSLO controller to merge.

Defaults are Koordinator's (``pkg/util/sloconfig``). Errors are :class:`~apis.slo.SchemaError`
naming the key and the field (``colocation-config: nodeConfigs[0].cpuReclaimThresholdPercent:
must be >= 0, got -1``). ``strict`` rejects unknown field names (typos in a local file); without
it they are logged and ignored, as the Go manager's JSON decoder does.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from types import MappingProxyType
from typing import Any, TypeVar

from apis.configuration import (
    COLOCATION_CONFIG_KEY,
    CONFIG_KEYS,
    CPU_BURST_CONFIG_KEY,
    CPU_NORMALIZATION_CONFIG_KEY,
    MODEL_RATIO_FIELDS,
    RESOURCE_AMPLIFICATION_CONFIG_KEY,
    RESOURCE_QOS_CONFIG_KEY,
    RESOURCE_THRESHOLD_CONFIG_KEY,
    SYSTEM_CONFIG_KEY,
    CalculatePolicy,
    ColocationConfig,
    ColocationStrategy,
    CPUNormalizationConfig,
    CPUNormalizationStrategy,
    LabelSelector,
    ModelRatio,
    NodeColocationConfig,
    NodeScoped,
    ResourceAmplificationConfig,
    ResourceAmplificationStrategy,
    SelectorRequirement,
    SLOControllerConfig,
)
from apis.slo import (
    ParseContext,
    SchemaError,
    freeze,
    kind_of,
    parse_node_slo,
    unique_json_object,
)
from apis.slo_qos import parse_resource_qos_strategy
from apis.slo_strategies import (
    parse_cpu_burst_strategy,
    parse_resource_threshold_strategy,
    parse_system_strategy,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

_STRATEGY_KEYS = (
    RESOURCE_THRESHOLD_CONFIG_KEY,
    RESOURCE_QOS_CONFIG_KEY,
    CPU_BURST_CONFIG_KEY,
    SYSTEM_CONFIG_KEY,
)

_GO_DURATION = re.compile(r"^([0-9]+(\.[0-9]*)?(ns|us|µs|ms|s|m|h))+$")
_Check = Callable[[Any], str | None]


def _at_least(low: float) -> _Check:
    return lambda v: None if v >= low else f"must be >= {low:g}, got {v}"


def _between(low: float, high: float) -> _Check:
    return lambda v: None if low <= v <= high else f"must be in [{low:g}, {high:g}], got {v}"


def _positive_at_most_one(v: Any) -> str | None:
    return None if 0 < v <= 1 else f"must be in (0, 1], got {v}"


# JSON name → (attribute, kind, check). Kinds: bool, int, float, str, policy, durations, object.
_COLOCATION_FIELDS: Mapping[str, tuple[str, str, _Check | None]] = {
    "enable": ("enable", "bool", None),
    "metricAggregateDurationSeconds": ("metric_aggregate_duration_seconds", "int", _at_least(1)),
    "metricReportIntervalSeconds": ("metric_report_interval_seconds", "int", _at_least(1)),
    "metricAggregatePolicy": ("metric_aggregate_durations", "durations", None),
    "metricMemoryCollectPolicy": ("metric_memory_collect_policy", "str", None),
    "cpuReclaimThresholdPercent": ("cpu_reclaim_threshold_percent", "int", _at_least(0)),
    "cpuCalculatePolicy": ("cpu_calculate_policy", "policy", None),
    "memoryReclaimThresholdPercent": ("memory_reclaim_threshold_percent", "int", _at_least(0)),
    "memoryCalculatePolicy": ("memory_calculate_policy", "policy", None),
    "degradeTimeMinutes": ("degrade_time_minutes", "int", _at_least(1)),
    "updateTimeThresholdSeconds": ("update_time_threshold_seconds", "int", _at_least(1)),
    "resourceDiffThreshold": ("resource_diff_threshold", "float", _positive_at_most_one),
    "midReclaimMode": ("mid_reclaim_mode", "str", None),
    "midCPUThresholdPercent": ("mid_cpu_threshold_percent", "int", _between(0, 100)),
    "midMemoryThresholdPercent": ("mid_memory_threshold_percent", "int", _between(0, 100)),
    "midUnallocatedPercent": ("mid_unallocated_percent", "int", _between(0, 100)),
    "midStaticCPUReservedPercent": ("mid_static_cpu_reserved_percent", "int", _between(0, 100)),
    "midStaticMemoryReservedPercent": (
        "mid_static_memory_reserved_percent",
        "int",
        _between(0, 100),
    ),
    "batchCPUThresholdPercent": ("batch_cpu_threshold_percent", "int", _at_least(0)),
    "batchMemoryThresholdPercent": ("batch_memory_threshold_percent", "int", _at_least(0)),
    "extensions": ("extensions", "object", None),
}
_MEMORY_COLLECT_POLICIES = frozenset(
    {"usageWithoutPageCache", "usageWithHotPageCache", "usageWithPageCache"}
)
_POLICY_NAMES = ", ".join(sorted(_MEMORY_COLLECT_POLICIES))
_PROFILE_KEYS = frozenset({"name", "nodeSelector"})


# Parsing -------------------------------------------------------------------------------------
def _typed(ctx: ParseContext, value: object, kind: str, path: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise ctx.fail(path, f"must be a boolean, got {kind_of(value)}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ctx.fail(path, f"must be an integer, got {value!r}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ctx.fail(path, f"must be a number, got {kind_of(value)}")
        return float(value)
    if kind in ("str", "policy"):
        if not isinstance(value, str):
            raise ctx.fail(path, f"must be a string, got {kind_of(value)}")
        if kind == "policy":
            try:
                return CalculatePolicy(value)
            except ValueError:
                known = ", ".join(p.value for p in CalculatePolicy)
                raise ctx.fail(path, f"unknown policy {value!r} (want one of {known})") from None
        return value
    if kind == "durations":
        policy = ctx.mapping(value, path)
        ctx.check_keys(policy, ("durations",), path, list_known=False)
        raw = policy.get("durations") or []
        if not isinstance(raw, list):
            raise ctx.fail(f"{path}.durations", f"must be a list, got {kind_of(raw)}")
        for i, d in enumerate(raw):
            if not isinstance(d, str) or not _GO_DURATION.match(d):
                raise ctx.fail(f"{path}.durations[{i}]", f"must be a duration like '5m', got {d!r}")
        return tuple(raw)
    return freeze(ctx.mapping(value, path))  # object


def _colocation_overrides(
    ctx: ParseContext, obj: Mapping[str, Any], prefix: str, extra_keys: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Attribute → value for each ColocationStrategy field ``obj`` sets (null means unset)."""
    known = frozenset(_COLOCATION_FIELDS) | extra_keys
    ctx.check_keys(obj, known, prefix.rstrip("."), list_known=False)
    out: dict[str, Any] = {}
    for name, (attr, kind, check) in _COLOCATION_FIELDS.items():
        if obj.get(name) is None:
            continue
        value = _typed(ctx, obj[name], kind, prefix + name)
        problem = check(value) if check else None
        if problem:
            raise ctx.fail(prefix + name, problem)
        if name == "metricMemoryCollectPolicy" and value not in _MEMORY_COLLECT_POLICIES:
            raise ctx.fail(
                prefix + name,
                f"unknown policy {value!r} (want one of {_POLICY_NAMES})",
            )
        out[attr] = value
    return out


def parse_colocation_overrides(obj: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The ColocationStrategy fields a JSON object sets (for the node annotation), validated.
    Raises :class:`SchemaError`."""
    ctx = ParseContext(source, strict=False)
    return _colocation_overrides(ctx, ctx.mapping(obj, ""), "")


def _selector(
    ctx: ParseContext, raw: object, path: str, *, need_match_labels: bool
) -> LabelSelector:
    if raw is None:
        raise ctx.fail(path, "is required")
    obj = ctx.mapping(raw, path)
    ctx.check_keys(obj, ("matchLabels", "matchExpressions"), path, list_known=False)
    labels_raw = obj.get("matchLabels")
    if labels_raw is None and need_match_labels:
        raise ctx.fail(
            f"{path}.matchLabels", "is required (Koordinator rejects a node config without it)"
        )
    labels = ctx.mapping(labels_raw, f"{path}.matchLabels")
    for k, v in labels.items():
        if not isinstance(v, str):
            raise ctx.fail(f"{path}.matchLabels.{k}", f"must be a string, got {kind_of(v)}")
    exprs_raw = obj.get("matchExpressions") or []
    if not isinstance(exprs_raw, list):
        raise ctx.fail(f"{path}.matchExpressions", f"must be a list, got {kind_of(exprs_raw)}")
    exprs = []
    for i, item in enumerate(exprs_raw):
        p = f"{path}.matchExpressions[{i}]"
        e = ctx.mapping(item, p)
        ctx.check_keys(e, ("key", "operator", "values"), p, list_known=False)
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if not isinstance(key, str) or not key:
            raise ctx.fail(f"{p}.key", "must be a non-empty string")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ctx.fail(
                f"{p}.operator", f"must be In, NotIn, Exists or DoesNotExist, got {op!r}"
            )
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ctx.fail(f"{p}.values", "must be a list of strings")
        if op in ("In", "NotIn") and not values:
            raise ctx.fail(f"{p}.values", f"must not be empty for {op}")
        if op in ("Exists", "DoesNotExist") and values:
            raise ctx.fail(f"{p}.values", f"must be empty for {op}")
        exprs.append(SelectorRequirement(key, op, tuple(values)))
    return LabelSelector(MappingProxyType(dict(labels)), tuple(exprs))


def _profile(
    ctx: ParseContext, obj: Mapping[str, Any], path: str, *, need_match_labels: bool
) -> tuple[str, LabelSelector]:
    name = obj.get("name", "")
    if not isinstance(name, str):
        raise ctx.fail(f"{path}.name", f"must be a string, got {kind_of(name)}")
    sel = _selector(
        ctx, obj.get("nodeSelector"), f"{path}.nodeSelector", need_match_labels=need_match_labels
    )
    return name, sel


def _list(ctx: ParseContext, value: object, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ctx.fail(path, f"must be a list, got {kind_of(value)}")
    return value


def _parse_colocation(ctx: ParseContext, doc: Mapping[str, Any]) -> ColocationConfig:
    cluster = replace(
        ColocationStrategy(), **_colocation_overrides(ctx, doc, "", frozenset({"nodeConfigs"}))
    )
    nodes = []
    for i, item in enumerate(_list(ctx, doc.get("nodeConfigs"), "nodeConfigs")):
        path = f"nodeConfigs[{i}]"
        obj = ctx.mapping(item, path)
        name, sel = _profile(ctx, obj, path, need_match_labels=True)
        overrides = _colocation_overrides(ctx, obj, path + ".", _PROFILE_KEYS)
        if not overrides:
            raise ctx.fail(
                path, "sets no strategy field (Koordinator rejects an empty node config)"
            )
        nodes.append(NodeColocationConfig(name, sel, MappingProxyType(overrides)))
    return ColocationConfig(cluster, tuple(nodes))


def _ratio(ctx: ParseContext, value: object, path: str) -> float:
    """A ratio as upstream declares it (``*float64``, no range): the range is checked on the
    ratio a node ends up with (``manager.cpunormalization``), not here, so one model's odd
    ratio does not refuse the whole key."""
    ratio = float(_typed(ctx, value, "float", path))
    if not math.isfinite(ratio):
        raise ctx.fail(path, f"must be a finite number, got {ratio}")
    return ratio


def _cpu_normalization_strategy(
    ctx: ParseContext, obj: Mapping[str, Any], prefix: str, extra: frozenset[str]
) -> CPUNormalizationStrategy:
    known = frozenset({"enable", "defaultRatio", "ratioModel"}) | extra
    ctx.check_keys(obj, known, prefix.rstrip("."), list_known=False)
    enable = (
        None if obj.get("enable") is None else _typed(ctx, obj["enable"], "bool", prefix + "enable")
    )
    default = None
    if obj.get("defaultRatio") is not None:
        default = _ratio(ctx, obj["defaultRatio"], prefix + "defaultRatio")
    models: dict[str, ModelRatio] = {}
    model_obj = ctx.mapping(obj.get("ratioModel"), prefix + "ratioModel")
    for model, raw in model_obj.items():
        path = f"{prefix}ratioModel[{model!r}]"
        ratios = ctx.mapping(raw, path)
        ctx.check_keys(ratios, frozenset(MODEL_RATIO_FIELDS), path, list_known=False)
        values = {
            attr: _ratio(ctx, ratios[name], f"{path}.{name}")
            for name, attr in MODEL_RATIO_FIELDS.items()
            if ratios.get(name) is not None
        }
        models[str(model)] = ModelRatio(**values)
    return CPUNormalizationStrategy(enable, default, MappingProxyType(models))


def _amplification_strategy(
    ctx: ParseContext, obj: Mapping[str, Any], prefix: str, extra: frozenset[str]
) -> ResourceAmplificationStrategy:
    known = frozenset({"enable", "resourceAmplificationRatio"}) | extra
    ctx.check_keys(obj, known, prefix.rstrip("."), list_known=False)
    enable = (
        None if obj.get("enable") is None else _typed(ctx, obj["enable"], "bool", prefix + "enable")
    )
    ratios: dict[str, float] = {}
    for res, raw in ctx.mapping(
        obj.get("resourceAmplificationRatio"), prefix + "resourceAmplificationRatio"
    ).items():
        path = f"{prefix}resourceAmplificationRatio.{res}"
        # Upstream validates only the final ratios of a node (``resourceamplification``'s
        # ``validateResourceAmplificationRatios``): cpu 0.8 under a normalization of 1.5 is 1.2.
        ratios[str(res)] = _ratio(ctx, raw, path)
    return ResourceAmplificationStrategy(enable, MappingProxyType(ratios))


def _parse_scoped(
    ctx: ParseContext,
    doc: Mapping[str, Any],
    parse: Callable[[ParseContext, Mapping[str, Any], str, frozenset[str]], T],
) -> tuple[T, tuple[NodeScoped[T], ...]]:
    cluster = parse(ctx, doc, "", frozenset({"nodeConfigs"}))
    nodes = []
    for i, item in enumerate(_list(ctx, doc.get("nodeConfigs"), "nodeConfigs")):
        path = f"nodeConfigs[{i}]"
        obj = ctx.mapping(item, path)
        name, sel = _profile(ctx, obj, path, need_match_labels=False)
        nodes.append(NodeScoped(name, sel, parse(ctx, obj, path + ".", _PROFILE_KEYS)))
    return cluster, tuple(nodes)


_STRATEGY_PARSERS: Mapping[str, Callable[..., Any]] = {
    RESOURCE_THRESHOLD_CONFIG_KEY: parse_resource_threshold_strategy,
    RESOURCE_QOS_CONFIG_KEY: parse_resource_qos_strategy,
    CPU_BURST_CONFIG_KEY: parse_cpu_burst_strategy,
    SYSTEM_CONFIG_KEY: parse_system_strategy,
}
"""Each ``clusterStrategy``/``nodeStrategies`` key → the NodeSLO section parser checking it."""


def _check_strategy_key(ctx: ParseContext, key: str, doc: Mapping[str, Any]) -> None:
    parse = _STRATEGY_PARSERS[key]
    ctx.check_keys(doc, ("clusterStrategy", "nodeStrategies"), "", list_known=False)
    if doc.get("clusterStrategy") is not None:
        parse(
            ctx.mapping(doc["clusterStrategy"], "clusterStrategy"),
            path="clusterStrategy",
            source=ctx.source,
            strict=ctx.strict,
        )
    for i, item in enumerate(_list(ctx, doc.get("nodeStrategies"), "nodeStrategies")):
        path = f"nodeStrategies[{i}]"
        obj = ctx.mapping(item, path)
        _profile(ctx, obj, path, need_match_labels=False)
        fields_only = {k: v for k, v in obj.items() if k not in _PROFILE_KEYS}
        parse(fields_only, path=path, source=ctx.source, strict=ctx.strict)


def _check_host_applications(ctx: ParseContext, doc: Mapping[str, Any]) -> None:
    ctx.check_keys(doc, ("applications", "nodeConfigs"), "", list_known=False)

    def apps(raw: object, path: str) -> None:
        try:
            parse_node_slo(
                {"hostApplications": _list(ctx, raw, path)}, ctx.source, strict=ctx.strict
            )
        except SchemaError as err:
            where = err.field.replace("hostApplications", path, 1)
            raise ctx.fail(where, err.message) from err

    apps(doc.get("applications"), "applications")
    for i, item in enumerate(_list(ctx, doc.get("nodeConfigs"), "nodeConfigs")):
        path = f"nodeConfigs[{i}]"
        obj = ctx.mapping(item, path)
        ctx.check_keys(obj, ("name", "nodeSelector", "applications"), path, list_known=False)
        _profile(ctx, obj, path, need_match_labels=False)
        apps(obj.get("applications"), f"{path}.applications")


def _decode(ctx: ParseContext, text: object) -> Mapping[str, Any]:
    if not isinstance(text, str):
        raise ctx.fail("", f"must be a JSON string, got {kind_of(text)}")
    try:
        doc = json.loads(text, object_pairs_hook=unique_json_object)
    except ValueError as err:
        raise ctx.fail("", f"invalid JSON: {err}") from err
    return ctx.mapping(doc, "")


def parse_slo_controller_config(
    obj: Mapping[str, Any], source: str, *, strict: bool = True
) -> SLOControllerConfig:
    """The ConfigMap given as a whole object (``kind: ConfigMap`` with ``data``) or as its
    ``data`` map. Raises :class:`SchemaError` whose source is ``<source>: <key>``."""
    top = ParseContext(source, strict).mapping(obj, "")
    data: Mapping[str, Any] = top
    if "data" in top or top.get("kind") == "ConfigMap":
        if top.get("kind", "ConfigMap") != "ConfigMap":
            raise SchemaError(
                f"must be a ConfigMap, got kind {top.get('kind')!r}", source=source, field="kind"
            )
        data = ParseContext(source, strict).mapping(top.get("data"), "data")
    unknown = sorted(k for k in data if k not in CONFIG_KEYS)
    if unknown:
        logger.warning("%s: ignoring data keys %s", source, unknown)
    parsed: dict[str, Any] = {}
    raw: dict[str, Mapping[str, Any]] = {}
    for key in CONFIG_KEYS:
        if key not in data:
            continue
        ctx = ParseContext(f"{source}: {key}" if source else key, strict)
        doc = _decode(ctx, data[key])
        if key == COLOCATION_CONFIG_KEY:
            parsed["colocation"] = _parse_colocation(ctx, doc)
        elif key == CPU_NORMALIZATION_CONFIG_KEY:
            parsed["cpu_normalization"] = CPUNormalizationConfig(
                *_parse_scoped(ctx, doc, _cpu_normalization_strategy)
            )
        elif key == RESOURCE_AMPLIFICATION_CONFIG_KEY:
            parsed["resource_amplification"] = ResourceAmplificationConfig(
                *_parse_scoped(ctx, doc, _amplification_strategy)
            )
        else:
            if key in _STRATEGY_KEYS:
                _check_strategy_key(ctx, key, doc)
            else:
                _check_host_applications(ctx, doc)
            raw[key] = freeze(doc)
    return SLOControllerConfig(raw=MappingProxyType(raw), **parsed)


def colocation_fields() -> tuple[str, ...]:
    """The JSON names of every ColocationStrategy field, in declaration order."""
    return tuple(_COLOCATION_FIELDS)


assert {a for a, _, _ in _COLOCATION_FIELDS.values()} == {
    f.name for f in fields(ColocationStrategy)
}
