"""Resctrl reconcile (Koordinator's ``resctrl`` QoS plugin, gate ``RdtResctrl``): L3 cache ways
and memory bandwidth per QoS class, and which threads each class's group holds.

Koordinator keeps one resctrl control group per class, ``LSR`` (LSE and LSR pods), ``LS`` and
``BE``, under ``<sys>/fs/resctrl``. Each round, when the NodeSLO has a ``resourceQOSStrategy``
(read over the defaults; a class whose ``resctrlQOS`` is off takes the full cache and bandwidth):

1. the groups are made when missing;
2. **L3 CAT**: each group's ``L3`` line gets, on every cache domain, the ways from
   ``catRangeStartPercent`` to ``catRangeEndPercent`` of ``info/L3/cbm_mask``:
   ``ways = bit length of cbm``, ``start = ceil(ways * startPercent / 100)``,
   ``end = ceil(ways * endPercent / 100)``, ``mask = (1 << end) - (1 << start)``. A mask with
   fewer bits than ``info/L3/min_cbm_bits`` (a range too narrow for this cache) is refused and
   reported, never widened silently;
3. **MBA**: each group's ``MB`` line gets ``mbaPercent`` on every domain, rounded up to the
   granularity (``info/MB/bandwidth_gran``, 10 on Intel: upstream rounds up to a multiple of 10)
   and at least ``info/MB/min_bandwidth``; on AMD, where the value is a bandwidth in 1/8 GB/s,
   100 % is ``2048`` (unlimited) and ``p`` % is ``int(160 * p / 100)`` (upstream's 25 GB/s CCD
   ceiling at 80 %). An ``mbaPercent`` outside 1..100 leaves the line alone (reported);
4. **tasks**: for each class with ``resctrlQOS.enable``, the threads of its pods' containers
   (their cgroup's ``tasks``, ``cgroup.threads`` on v2) that are not yet in the group are written
   to its ``tasks``;
5. **pods of their own** (upstream v1.6's pod-level resctrl): a pod carrying
   ``node.koordinator.sh/resctrl`` (``{"llc": {"schemata": {"range": [0, 30]}}, "mb":
   {"schemata": {"percent": 20}}}``) gets a control group ``koordlet-<uid>`` with the ways of
   that range and that bandwidth on every domain (``schemataPerCache`` entries win for their
   cache id; a resource the annotation does not name keeps the group's default, the whole
   cache or bandwidth), and its threads, which its class's group then leaves alone. Groups
   ``koordlet-*`` of pods that are gone, or no longer carry the annotation, are removed. A
   malformed value keeps the pod in its class's group and is reported once
   (``ctx.pod_warnings``). This runs whenever the host has resctrl, with or without a
   ``resourceQOSStrategy``; the runtime hook side places a new container's threads at creation.

Capability comes from the CPU flags (``cat_l3``, ``mba`` in ``/proc/cpuinfo``) and the mount;
a host without them is reported unsupported with the missing flag or mount, once, and the round
does nothing. A CPU whose flags name neither feature cannot gain one before the next boot: from
then on a round only checks the pods' annotations when the workloads or the NodeSLO changed and
reports the reason, without a hop to the writer's thread (a mount can still come: a host that
lacks only the mount is looked at every round). Every file operation runs through
:class:`~koordlet.executor.resctrl.ResctrlWriter` on the executor's writer thread, audited and
dry-run like cgroup writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apis.extension import ANNOTATION_POD_RESCTRL as POD_RESCTRL_ANNOTATION
from apis.pod_overrides import RESCTRL_GROUP_PREFIX, AnnotationError, PodResctrl, parse_pod_resctrl
from apis.records import frozen
from apis.slo_inforce import RESOURCE_QOS_STRATEGY
from apis.slo_qos import ResctrlQOSConfig
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.errors import HostError, InvalidValueError, UnsupportedError
from koordlet.executor.resctrl import (
    GROUP_OF_CLASS,
    L3,
    MB,
    RESCTRL_GROUPS,
    AllocInfo,
    ResctrlWriter,
)
from koordlet.executor.sysctl import call_on_writer, executor_hooks
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import WriteFailures, pod_class
from koordlet.statesinformer.model import PodInfo, WorkloadSnapshot
from koordlet.system.cgroups import CgroupLayout

logger = logging.getLogger(__name__)

NAME = "resctrl"
"""Table name."""
FEATURE_GATE = "RdtResctrl"
"""Koordinator's feature gate."""
DEFAULT_INTERVAL = 1.0
"""Seconds between rounds (Koordinator's ``--reconcile-interval-seconds``, 1)."""
AMD_MAX_MB = 160
"""Upstream's AMD CCD bandwidth ceiling: 25 GB/s * 8 (units of 1/8 GB/s) * 0.8."""
AMD_UNLIMITED_MB = "2048"
"""What an AMD MB line holds for unlimited bandwidth."""


def cat_l3_mask(cbm: int, start_percent: int, end_percent: int, min_bits: int = 1) -> int:
    """The L3 mask of the ways in ``[start, end)`` percent of ``cbm``; ``ValueError`` when the
    cbm is not contiguous from bit 0, the range is empty or inverted, or the mask has fewer than
    ``min_bits`` bits."""
    if cbm <= 0 or cbm & (cbm + 1):
        raise ValueError(f"cbm_mask {cbm:x} is not a contiguous mask from bit 0")
    if start_percent < 0 or end_percent > 100 or end_percent <= start_percent:
        raise ValueError(
            f"cat range {start_percent}..{end_percent} % is not 0 <= start < end <= 100"
        )
    ways = cbm.bit_length()
    start = -(-ways * start_percent // 100)
    end = -(-ways * end_percent // 100)
    mask = (1 << end) - (1 << start)
    if mask.bit_count() < max(min_bits, 1):
        raise ValueError(
            f"cat range {start_percent}..{end_percent} % of {ways} ways is "
            f"{mask.bit_count()} ways, under min_cbm_bits {min_bits}"
        )
    return mask


def mba_value(percent: int, *, gran: int = 10, minimum: int = 10, amd: bool = False) -> str:
    """The MB value for ``mbaPercent``; ``ValueError`` outside 1..100."""
    if not 0 < percent <= 100:
        raise ValueError(f"mbaPercent {percent} is not in 1..100")
    if amd:
        return AMD_UNLIMITED_MB if percent == 100 else str(AMD_MAX_MB * percent // 100)
    gran = max(gran, 1)
    return str(max(-(-percent // gran) * gran, minimum))


@frozen
class GroupPlan:
    """What one control group should get."""

    group: str
    """``LSR``, ``LS`` or ``BE``."""
    config: ResctrlQOSConfig
    """The class's ``resctrlQOS`` (disabled values when off)."""
    cgroups: tuple[str, ...] = ()
    """Container cgroups whose threads belong in the group (empty when the class is off)."""


@frozen
class PodGroupPlan:
    """A pod's own control group (``node.koordinator.sh/resctrl``)."""

    group: str
    """``koordlet-<uid>``."""
    pod: str
    """``namespace/name``."""
    config: PodResctrl
    cgroups: tuple[str, ...]


def pod_groups(
    snapshot: WorkloadSnapshot, report_error: Callable[[PodInfo, str], None]
) -> dict[str, PodGroupPlan]:
    """The pods whose annotation parses, by UID; ``report_error(pod, why)`` for the others."""
    out: dict[str, PodGroupPlan] = {}
    for pod in snapshot.pods.values():
        text = pod.annotations.get(POD_RESCTRL_ANNOTATION)
        if text is None:
            continue
        try:
            cfg = parse_pod_resctrl(text)
        except AnnotationError as err:
            report_error(pod, err.why)
            continue
        cgroups = tuple(c.cgroup_dir for c in pod.containers) or (pod.cgroup_dir,)
        name = f"{pod.namespace}/{pod.name}"
        out[pod.uid] = PodGroupPlan(RESCTRL_GROUP_PREFIX + pod.uid, name, cfg, cgroups)
    return out


def group_plans(
    strategy: ResourceQOSStrategy,
    snapshot: WorkloadSnapshot,
    own: Mapping[str, PodGroupPlan] | None = None,
) -> tuple[list[GroupPlan], dict[str, str]]:
    """Per group: its config and the cgroups to place; plus pods left out and why (``own``:
    the pods in a group of their own)."""
    configs = {
        "LSR": strategy.lsr_class.resctrl_qos,
        "LS": strategy.ls_class.resctrl_qos,
        "BE": strategy.be_class.resctrl_qos,
    }
    members: dict[str, list[str]] = {g: [] for g in RESCTRL_GROUPS}
    skipped: dict[str, str] = {}
    for pod in snapshot.pods.values():
        group = GROUP_OF_CLASS.get(pod_class(pod))
        if group is None or not configs[group].enable:
            continue
        if own is not None and pod.uid in own:
            skipped[f"pod/{pod.name}"] = f"has {POD_RESCTRL_ANNOTATION}: its own group"
            continue
        members[group] += [c.cgroup_dir for c in pod.containers] or [pod.cgroup_dir]
    plans = [GroupPlan(g, configs[g], tuple(members[g])) for g in RESCTRL_GROUPS]
    return plans, skipped


@dataclass(slots=True)
class _Round:
    results: dict[str, Any] = field(default_factory=dict)
    pods: dict[str, Any] = field(default_factory=dict)
    unsupported: str = ""


class ResctrlReconcile:
    """See the module docstring."""

    def __init__(self, ctx: StrategyContext, *, interval: float = DEFAULT_INTERVAL) -> None:
        self.name = NAME
        self.interval = interval
        self._ctx = ctx
        self._writer = ResctrlWriter(ctx.host().paths, **executor_hooks(ctx.executor))
        self._reported: set[str] = set()
        self._failures = WriteFailures(NAME, logger, clock=ctx.now)
        self._never = ""
        """Why resctrl cannot work here, once the CPU flags name neither L3 CAT nor MBA (they do
        not change until the next boot): rounds then skip the writer's thread."""
        self._last_inputs: tuple[WorkloadSnapshot, object, dict[str, Any]] | None = None
        """The last round's snapshot, NodeSLO and report inputs: with :attr:`_never` set, a
        round on the same two does not pass over the pods again (its checks would repeat)."""

    async def reconcile(self) -> None:
        ctx = self._ctx
        node_slo = ctx.node_slo()
        snapshot = ctx.workloads()
        last = self._last_inputs
        if self._never and last is not None and last[0] is snapshot and last[1] is node_slo:
            # Nothing changed since the last round, whose report stands: no pass over the pods.
            ctx.report(NAME, StrategyReport(last[2], "unsupported", self._never))
            return
        own = pod_groups(snapshot, self._report_error)
        for pod in snapshot.pods.values():
            if pod.uid in own or POD_RESCTRL_ANNOTATION not in pod.annotations:
                ctx.pod_warnings.valid(pod, POD_RESCTRL_ANNOTATION)
        layout = ctx.host().layout
        with_strategy = RESOURCE_QOS_STRATEGY in node_slo.present
        plans: list[GroupPlan] = []
        skipped: dict[str, str] = {}
        inputs: dict[str, Any] = {}
        if with_strategy:
            plans, skipped = group_plans(node_slo.resource_qos_strategy, snapshot, own)
            inputs = {
                g.group: {
                    "enable": g.config.enable,
                    "catRange": [g.config.cat_range_start_percent, g.config.cat_range_end_percent],
                    "mbaPercent": g.config.mba_percent,
                    "cgroups": len(g.cgroups),
                }
                for g in plans
            }
        self._last_inputs = (snapshot, node_slo, inputs)
        if self._never:  # the CPU cannot: no hop to the writer's thread, nothing to look at
            ctx.report(NAME, StrategyReport(inputs, "unsupported", self._never))
            return
        done = await call_on_writer(ctx.executor, lambda: self._apply(plans, own, layout))
        if done.unsupported:
            if self._writer.cpu_lacks_rdt():
                self._never = done.unsupported
            ctx.report(NAME, StrategyReport(inputs, "unsupported", done.unsupported))
            return
        if not with_strategy:
            ctx.report(
                NAME,
                StrategyReport(
                    {"pods": len(own)},
                    "no resourceQOSStrategy: pod groups only",
                    "dry run" if ctx.dry_run(NAME) else "applied",
                    detail={"pods": done.pods},
                ),
            )
            return
        ctx.report(
            NAME,
            StrategyReport(
                inputs,
                "apply schemata and tasks",
                "dry run" if ctx.dry_run(NAME) else "applied",
                detail={"groups": done.results, "skipped": skipped, "pods": done.pods},
            ),
        )

    def _report_error(self, pod: PodInfo, why: str) -> None:
        self._ctx.pod_warnings.report(NAME, pod, POD_RESCTRL_ANNOTATION, why)

    def _apply(
        self, plans: list[GroupPlan], own: Mapping[str, PodGroupPlan], layout: CgroupLayout
    ) -> _Round:
        """On the writer thread: check support, then groups, schemata and tasks, then the
        pods' own groups."""
        out = _Round()
        info = self._writer.alloc_info(RESCTRL_GROUPS)
        if not info.usable:
            out.unsupported = f"L3 CAT: {info.l3_reason}; MBA: {info.mb_reason}"
            self._once("resctrl", out.unsupported)
            return out
        for plan in plans:
            out.results[plan.group] = self._apply_group(plan, info, layout)
        for pod_plan in own.values():
            out.pods[pod_plan.pod] = self._apply_pod(pod_plan, info, layout)
        self._remove_stale({p.group for p in own.values()}, out)
        return out

    def _apply_pod(self, plan: PodGroupPlan, info: AllocInfo, layout: CgroupLayout) -> Any:
        group, cfg = plan.group, plan.config
        reason = f"pod {plan.pod}: {POD_RESCTRL_ANNOTATION}"
        res: dict[str, Any] = {"group": group}
        try:
            self._writer.ensure_group(group, strategy=NAME, reason=reason)
        except HostError as err:
            return {"group": f"failed: {err}"}
        if cfg.llc.range is not None or cfg.llc_per_cache:
            res[L3] = self._pod_line(group, L3, info.l3_reason, lambda: self._pod_l3(cfg, info))
        if cfg.mb.percent or cfg.mb_per_cache:
            res[MB] = self._pod_line(group, MB, info.mb_reason, lambda: self._pod_mb(cfg, info))
        try:
            placed = self._writer.place_tasks(
                group, layout, plan.cgroups, strategy=NAME, reason=reason
            )
        except (UnsupportedError, HostError) as err:
            res["tasks"] = f"failed: {err}"
        else:
            res["tasks"] = {"added": placed.added, "exited": placed.gone}
        return res

    def _pod_line(
        self, group: str, resource: str, why_not: str, domains: Callable[[], dict[int, str]]
    ) -> str:
        if why_not:
            return f"unsupported: {why_not}"
        try:
            values = domains()
        except ValueError as err:  # a range this cache cannot give (under min_cbm_bits)
            self._once(f"{group}/{resource}/value", str(err))
            return f"not written: {err}"
        try:
            result = self._writer.write_schemata(
                group, resource, values, strategy=NAME, reason=f"{group} {resource}"
            )
        except (UnsupportedError, HostError, InvalidValueError) as err:
            return f"failed: {err}"
        return result.new + (" (changed)" if result.changed else "")

    @staticmethod
    def _pod_l3(cfg: PodResctrl, info: AllocInfo) -> dict[int, str]:
        """Every L3 domain: the ``schemata`` range, a ``schemataPerCache`` entry winning for its
        cache id; domains neither names keep the full mask."""

        def mask(rng: tuple[int, int]) -> str:
            return f"{cat_l3_mask(info.l3_cbm, rng[0], rng[1], info.l3_min_cbm_bits):x}"

        full = f"{info.l3_cbm:x}"
        base = mask(cfg.llc.range) if cfg.llc.range is not None else full
        out = dict.fromkeys(info.l3_domains, base)
        for cache_id, sch in cfg.llc_per_cache:
            if sch.range is not None and cache_id in out:
                out[cache_id] = mask(sch.range)
        return out

    @staticmethod
    def _pod_mb(cfg: PodResctrl, info: AllocInfo) -> dict[int, str]:
        """Every MB domain: the ``schemata`` percent, a ``schemataPerCache`` entry winning."""

        def value(percent: int) -> str:
            return mba_value(percent, gran=info.mb_gran, minimum=info.mb_min, amd=info.amd)

        base = value(cfg.mb.percent) if cfg.mb.percent else value(100)
        out = dict.fromkeys(info.mb_domains, base)
        for cache_id, sch in cfg.mb_per_cache:
            if sch.percent and cache_id in out:
                out[cache_id] = value(sch.percent)
        return out

    def _remove_stale(self, keep: set[str], out: _Round) -> None:
        """Remove ``koordlet-*`` groups no pod asks for any more."""
        try:
            existing = self._writer.groups(RESCTRL_GROUP_PREFIX)
        except HostError as err:
            out.pods["(stale groups)"] = f"cannot list: {err}"
            return
        for group in existing:
            if group in keep:
                continue
            try:
                self._writer.remove_group(
                    group, strategy=NAME, reason="its pod is gone or has no resctrl annotation"
                )
            except HostError as err:
                out.pods[group] = f"removal failed: {err}"
            else:
                out.pods[group] = "removed"

    def _apply_group(self, plan: GroupPlan, info: AllocInfo, layout: CgroupLayout) -> Any:
        group, cfg = plan.group, plan.config
        res: dict[str, Any] = {}
        try:
            self._writer.ensure_group(group, strategy=NAME, reason="class resctrl group")
        except HostError as err:
            self._once(f"{group}/group", str(err))
            return {"group": f"failed: {err}"}
        res[L3] = self._schemata(group, L3, info.l3_reason, lambda: self._l3(cfg, info), info)
        res[MB] = self._schemata(group, MB, info.mb_reason, lambda: self._mb(cfg, info), info)
        if plan.cgroups:
            try:
                placed = self._writer.place_tasks(
                    group, layout, plan.cgroups, strategy=NAME, reason=f"{group} class threads"
                )
            except (UnsupportedError, HostError) as err:
                res["tasks"] = f"failed: {err}"
            else:
                res["tasks"] = {
                    "added": placed.added,
                    "exited": placed.gone,
                    "cgroups_gone": placed.missing_cgroups,
                }
        return res

    def _schemata(
        self, group: str, resource: str, why_not: str, value: Any, info: AllocInfo
    ) -> str:
        if why_not:
            self._once(resource, why_not)
            return f"unsupported: {why_not}"
        domains = info.l3_domains if resource == L3 else info.mb_domains
        try:
            text = value()
        except ValueError as err:
            self._once(f"{group}/{resource}/value", str(err))
            return f"not written: {err}"
        reason = f"{group} {resource}={text}"
        try:
            result = self._writer.write_schemata(
                group, resource, dict.fromkeys(domains, text), strategy=NAME, reason=reason
            )
        except (UnsupportedError, HostError, InvalidValueError) as err:
            self._failures.failed(f"{group}/{resource}", str(err))  # once per change, counted
            return f"failed: {err}"
        self._failures.succeeded(f"{group}/{resource}")
        return result.new + (" (changed)" if result.changed else "")

    @staticmethod
    def _l3(cfg: ResctrlQOSConfig, info: AllocInfo) -> str:
        mask = cat_l3_mask(
            info.l3_cbm,
            cfg.cat_range_start_percent,
            cfg.cat_range_end_percent,
            info.l3_min_cbm_bits,
        )
        return f"{mask:x}"

    @staticmethod
    def _mb(cfg: ResctrlQOSConfig, info: AllocInfo) -> str:
        return mba_value(cfg.mba_percent, gran=info.mb_gran, minimum=info.mb_min, amd=info.amd)

    def _once(self, key: str, why: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            logger.info("resctrl reconcile: %s: %s", key, why)


def build(ctx: StrategyContext, interval: float) -> ResctrlReconcile:
    """Table factory."""
    return ResctrlReconcile(ctx, interval=interval)
