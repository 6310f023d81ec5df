"""``koord-manager explain`` output: every term of a node's batch and mid calculation.

:func:`to_json` gives the machine-readable object (``resources`` plus ``terms``);
:func:`to_text` the lines a person reads. Both render one
:class:`~manager.noderesource.calculator.NodeResourceResult`.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from apis.configuration import ColocationStrategy
from apis.manager_keys import BATCH_CPU, BATCH_MEMORY, EXTENDED_RESOURCES, MID_CPU, MID_MEMORY
from apis.sloconfig import colocation_fields
from manager.noderesource.batch import BatchTerms, MetricTerm, PodTerm
from manager.noderesource.calculator import NodeResourceResult, UpdateDecision
from manager.noderesource.inputs import Resources
from manager.noderesource.mid import MidTerms


def _strategy_json(strategy: ColocationStrategy) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, f in zip(colocation_fields(), fields(ColocationStrategy), strict=True):
        value = getattr(strategy, f.name)
        if name == "metricAggregatePolicy":
            value = {"durations": list(value)}
        elif name == "extensions":
            value = dict(value)
        out[name] = value
    return out


def _res(r: Resources | None) -> dict[str, int] | None:
    return None if r is None else r.json()


def _pod_json(t: PodTerm) -> dict[str, Any]:
    return {
        "pod": t.pod,
        "priorityClass": t.priority_class,
        "qos": t.qos,
        "counted": t.counted,
        "reason": t.reason,
        "request": t.request.json(),
        "usage": _res(t.usage),
        "asUsed": t.as_used.json(),
        "asMaxUsedRequest": t.as_max_used_request.json(),
    }


def _metric_json(t: MetricTerm) -> dict[str, Any]:
    return {
        "name": t.name,
        "priorityClass": t.priority_class,
        "usage": t.usage.json(),
        "counted": t.counted,
    }


def _batch_side(b: BatchTerms, attr: str) -> dict[str, Any]:
    def g(r: Resources) -> int:
        return int(getattr(r, attr))

    policy = b.cpu_policy if attr == "cpu" else b.memory_policy
    cap = b.cpu_cap if attr == "cpu" else b.memory_cap
    return {
        "policy": policy.value,
        "capacity": g(b.capacity),
        "safetyMargin": g(b.safety_margin),
        "kubeletReserved": g(b.kubelet_reserved),
        "annotationReserved": g(b.annotation_reserved),
        "nodeReserved": g(b.node_reserved),
        "systemUsage": g(b.system_usage),
        "hostAppHPUsage": g(b.host_app_used),
        "systemUsed": g(b.system_used),
        "systemUsedOrNodeReserved": g(b.system_used_or_reserved),
        "hpRequest": g(b.hp.request),
        "hpUsed": g(b.hp.used),
        "hpMaxUsedRequest": g(b.hp.max_used_request),
        "danglingHPUsed": g(b.hp.dangling_used),
        "byUsage": g(b.by_usage),
        "byRequest": g(b.by_request),
        "byMaxUsageRequest": g(b.by_max_usage_request),
        "thresholdCap": cap,
        "value": g(b.result),
    }


def _mid_side(m: MidTerms, attr: str) -> dict[str, Any]:
    def g(r: Resources) -> int:
        return int(getattr(r, attr))

    return {
        "capacity": g(m.capacity),
        "threshold": g(m.threshold),
        "prodReclaimable": g(m.prod_reclaimable),
        "nodeUnused": g(m.node_unused),
        "systemUsed": g(m.system_used),
        "nodeReserved": g(m.node_reserved),
        "prodRequests": g(m.prod_requests),
        "unallocated": g(m.unallocated),
        "reclaimablePart": g(m.reclaimable_part),
        "unallocatedPart": g(m.unallocated_part),
        "staticReserved": g(m.static_reserved),
        "value": g(m.result),
    }


def to_json(result: NodeResourceResult, update: UpdateDecision | None = None) -> dict[str, Any]:
    """The ``--json`` object: ``resources`` (0 where the resource is removed) and ``terms``."""
    ns = result.strategy
    terms: dict[str, Any] = {
        "node": result.node,
        "reset": bool(result.reset_reason),
        "resetReason": result.reset_reason,
        "colocationEnabled": ns.enabled,
        "nodeConfig": ns.node_config if ns.matched else None,
        "strategy": _strategy_json(ns.strategy),
        "strategyNotes": list(ns.notes),
        "metricAgeSeconds": result.metric_age_seconds,
        "cpuNormalization": {
            "ratio": result.normalization.ratio,
            "annotation": result.normalization.annotation,
            "reason": result.normalization.reason,
        },
    }
    b = result.batch
    if b is not None:
        cpu = _batch_side(b, "cpu")
        cpu["beforeNormalization"] = cpu["value"]
        cpu["value"] = result.values[BATCH_CPU]
        terms["batch"] = {
            "cpu": cpu,
            "memory": _batch_side(b, "memory"),
            "pods": [_pod_json(t) for t in b.hp.pods],
            "danglingPodMetrics": [_metric_json(t) for t in b.hp.dangling],
            "hostApplications": [_metric_json(t) for t in b.host_apps],
            "notes": list(b.notes),
        }
    m = result.mid
    if m is not None:
        terms["mid"] = {
            "mode": m.mode,
            "prodReclaimableReported": m.prod_reclaimable_reported,
            "nodeUsageValid": m.node_usage_valid,
            "cpu": _mid_side(m, "cpu"),
            "memory": _mid_side(m, "memory"),
            "prodPods": list(m.prod_pods),
        }
    if update is not None:
        terms["update"] = {"needed": update.needed, "reasons": list(update.reasons)}
    resources = {name: int(result.values.get(name) or 0) for name in EXTENDED_RESOURCES}
    return {"resources": resources, "terms": terms}


def _cpu(v: int) -> str:
    return f"{v}m"


def _mem(v: int) -> str:
    if v and abs(v) >= 1 << 20:
        return f"{v} ({v / (1 << 30):.2f}Gi)"
    return str(v)


def _batch_lines(b: BatchTerms, final_cpu: int, norm_ratio: float | None) -> list[str]:
    lines = []
    for attr, name, fmt in (("cpu", BATCH_CPU, _cpu), ("memory", BATCH_MEMORY, _mem)):
        side = _batch_side(b, attr)
        policy = side["policy"]
        if policy == "request":
            formula = (
                f"capacity {fmt(side['capacity'])} - safetyMargin {fmt(side['safetyMargin'])}"
                f" - nodeReserved {fmt(side['nodeReserved'])}"
                f" - HP.request {fmt(side['hpRequest'])} = {fmt(side['byRequest'])}"
            )
        else:
            hp_name, hp_key, by = (
                ("HP.maxUsedRequest", "hpMaxUsedRequest", "byMaxUsageRequest")
                if policy == "maxUsageRequest"
                else ("HP.used", "hpUsed", "byUsage")
            )
            formula = (
                f"capacity {fmt(side['capacity'])} - safetyMargin {fmt(side['safetyMargin'])}"
                f" - max(systemUsed {fmt(side['systemUsed'])},"
                f" nodeReserved {fmt(side['nodeReserved'])})"
                f" - {hp_name} {fmt(side[hp_key])} = {fmt(side[by])}"
            )
        lines.append(f"{name} (policy {policy}): {formula} (floored at 0)")
        lines.append(
            f"    safetyMargin = capacity x (100 - reclaimThresholdPercent)%;"
            f" nodeReserved = max(kubelet {fmt(side['kubeletReserved'])},"
            f" annotation {fmt(side['annotationReserved'])});"
            f" systemUsed = systemUsage {fmt(side['systemUsage'])}"
            f" + host apps {fmt(side['hostAppHPUsage'])}"
        )
        if side["danglingHPUsed"]:
            lines.append(
                f"    HP sums include {fmt(side['danglingHPUsed'])} of dangling pod metrics"
            )
        if side["thresholdCap"] is not None:
            lines.append(f"    capped at batch threshold {fmt(side['thresholdCap'])}")
        if attr == "cpu" and final_cpu != side["value"]:
            lines.append(f"    x cpu normalization ratio {norm_ratio} -> {final_cpu}")
        final = final_cpu if attr == "cpu" else side["value"]
        lines.append(f"    = {final}")
    lines.extend(f"note: {n}" for n in b.notes)
    lines.append("pods:")
    for t in b.hp.pods:
        usage = (
            "no metric" if t.usage is None else f"usage {_cpu(t.usage.cpu)}/{_mem(t.usage.memory)}"
        )
        lines.append(
            f"  {t.pod} [{t.priority_class or '-'} {t.qos}] request"
            f" {_cpu(t.request.cpu)}/{_mem(t.request.memory)}, {usage}: {t.reason}"
            + (
                f" -> used {_cpu(t.as_used.cpu)}/{_mem(t.as_used.memory)},"
                f" maxUsedRequest {_cpu(t.as_max_used_request.cpu)}"
                f"/{_mem(t.as_max_used_request.memory)}"
                if t.counted
                else ""
            )
        )
    for d in b.hp.dangling:
        state = "counted" if d.counted else "not counted (low priority)"
        lines.append(
            f"  {d.name} [metric only, {d.priority_class or '-'}] usage"
            f" {_cpu(d.usage.cpu)}/{_mem(d.usage.memory)}: not in the pod list, {state}"
        )
    for a in b.host_apps:
        state = "counted in systemUsed" if a.counted else "not counted"
        lines.append(
            f"  host app {a.name} [{a.priority_class or '-'}] usage"
            f" {_cpu(a.usage.cpu)}/{_mem(a.usage.memory)}: {state}"
        )
    return lines


def _mid_lines(m: MidTerms) -> list[str]:
    lines = []
    for attr, name, fmt in (("cpu", MID_CPU, _cpu), ("memory", MID_MEMORY, _mem)):
        s = _mid_side(m, attr)
        if m.mode == "static":
            lines.append(
                f"{name} (static): min(staticReserved {fmt(s['staticReserved'])},"
                f" threshold {fmt(s['threshold'])}) = {s['value']}"
            )
            continue
        lines.append(
            f"{name}: max(min(prodReclaimable {fmt(s['prodReclaimable'])},"
            f" threshold {fmt(s['threshold'])}, nodeUnused {fmt(s['nodeUnused'])}), 0)"
            f" {fmt(s['reclaimablePart'])} + unallocated {fmt(s['unallocated'])}"
            f" x midUnallocatedPercent = {fmt(s['unallocatedPart'])} -> {s['value']}"
        )
        lines.append(
            f"    unallocated = capacity {fmt(s['capacity'])} - max(systemUsed"
            f" {fmt(s['systemUsed'])}, nodeReserved {fmt(s['nodeReserved'])})"
            f" - prod requests {fmt(s['prodRequests'])}"
        )
    if not m.prod_reclaimable_reported and m.mode != "static":
        lines.append("note: the NodeMetric has no prodReclaimableMetric: taken as 0")
    if not m.node_usage_valid and m.mode != "static":
        lines.append("note: the NodeMetric lacks node usage: nodeUnused taken as 0")
    return lines


def to_text(result: NodeResourceResult, update: UpdateDecision | None = None) -> list[str]:
    """Human-readable lines."""
    ns = result.strategy
    where = f"nodeConfigs entry {ns.node_config!r}" if ns.matched else "cluster strategy"
    lines = [f"node {result.node}: {where}"]
    lines.extend(f"  {n}" for n in ns.notes)
    s = ns.strategy
    lines.append(
        f"  cpuReclaimThresholdPercent {s.cpu_reclaim_threshold_percent},"
        f" memoryReclaimThresholdPercent {s.memory_reclaim_threshold_percent},"
        f" cpuCalculatePolicy {s.cpu_calculate_policy.value},"
        f" memoryCalculatePolicy {s.memory_calculate_policy.value},"
        f" degradeTimeMinutes {s.degrade_time_minutes}"
    )
    if result.metric_age_seconds is not None:
        lines.append(f"  NodeMetric age {result.metric_age_seconds:.0f}s")
    lines.append(
        f"  cpu normalization: {result.normalization.annotation or 'none'}"
        f" ({result.normalization.reason})"
    )
    if result.reset_reason:
        lines.append(f"RESET: {result.reset_reason}; batch and mid resources are removed")
    if result.batch is not None:
        lines.extend(
            _batch_lines(
                result.batch, int(result.values[BATCH_CPU] or 0), result.normalization.ratio
            )
        )
    if result.mid is not None:
        lines.extend(_mid_lines(result.mid))
    if update is not None:
        verdict = "write the Node" if update.needed else "no write"
        lines.append(f"update: {verdict}" + "".join(f"; {r}" for r in update.reasons))
    lines.append("result:")
    for name in EXTENDED_RESOURCES:
        value = result.values.get(name)
        lines.append(f"  {name}: {'(removed)' if value is None else value}")
    return lines
