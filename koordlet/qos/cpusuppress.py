"""CPU suppress: give best-effort (BE) pods only the CPU that latency-sensitive work leaves.

Koordinator's ``cpusuppress`` strategy (feature gate ``BECPUSuppress``), re-done from its
documented semantics (``docs/qos-cpu.md`` has the formulas and the differences):

* **How much**: ``suppress = capacity x cpuSuppressThresholdPercent% - LS pods - LS host apps -
  system`` in milli-cores, where *LS pods* are the pods that are neither Koordinator ``BE`` nor
  Kubernetes ``BestEffort``, *LS host apps* the host applications that are not ``BE`` under the
  besteffort QoS cgroup, and ``system = max(node - all pods - all host apps, 0, reserved)``;
  with ``cpuSuppressMinPercent`` it never goes under ``capacity x min%``.
* **Policy** ``cpuset`` (the default): ``ceil(suppress)`` CPUs, at least 2, growing by at most
  10 % of the node's CPUs a round, picked by :mod:`koordlet.qos.cpupicker` (LSE pods' CPUs
  excluded); written to the besteffort QoS cgroup, every BE pod and container and BE host
  application below it, first ``old | new`` from the top down, then ``new`` from the bottom up,
  so that the kernel never sees a child wider than its parent.
* **Policy** ``cfsQuota``: ``quota = suppress x period`` (at least 2000 µs) on the besteffort QoS
  cgroup; a change smaller than 1 % of the node's CPUs is skipped (dead band, except towards the
  floor), a rise is limited to 10 % of the node's CPUs a round once a quota is set.
* **Restore**: when ``resourceUsedThresholdWithBE.enable`` is false the BE cpusets go back to
  every CPU that LSE pods do not own and the quota to unlimited; switching policy restores what
  the other policy set.
* **Stale inputs**: when the node's CPU usage is older than twice the collection interval (or
  the CPU topology is unknown) the round holds the state last applied and counts it.

A strategy never reads a file: the current cpuset and quota are those it applied last; before
its first write it assumes the kubelet's defaults (every CPU, no quota), which makes the first
round write ``old | new`` = every CPU top-down before narrowing, always a valid order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from apis.extension import KubeQOS, QoSClass
from apis.slo import DEFAULT_RESOURCE_USED_THRESHOLD_WITH_BE
from koordlet.errors import CgroupGoneError, HostError, UnsupportedError
from koordlet.metriccache import series
from koordlet.qos.cpupicker import (
    BE_MAX_INCREASE_RATIO,
    Processor,
    be_cpuset_count,
    pick_be_cpus,
    processors_from_node_info,
)
from koordlet.qos.manager import StrategyContext, StrategyReport
from koordlet.statesinformer.model import HostAppInfo, PodInfo, WorkloadSnapshot
from koordlet.system.knobs import parse_cpulist
from koordlet.system.topology import format_cpulist

logger = logging.getLogger(__name__)

NAME = "cpusuppress"
FEATURE_GATE = "BECPUSuppress"
NODE_INFO_KEY = "node_info"
"""The metric cache info key of the nodeinfo collector (CPU topology)."""

CFS_PERIOD_US = 100_000
"""Koordinator's ``DefaultCPUCFSPeriod``: quotas are computed against a 100 ms period."""
BE_MIN_QUOTA_US = 2000
"""Koordinator's ``beMinQuota``: the cfsQuota policy never sets a smaller quota."""
QUOTA_DEAD_BAND_RATIO = 0.01
"""Koordinator's ``suppressBypassQuotaDeltaRatio``: quota changes under 1 % of the node skip."""
POLICY_CPUSET = "cpuset"
POLICY_CFS_QUOTA = "cfsQuota"
RESOURCE_STATUS_ANNOTATION = "scheduling.koordinator.sh/resource-status"
"""Where the scheduler records a pod's exclusive cpuset (``{"cpuset": "0-3"}``)."""


# Settings ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SuppressSettings:
    """The ``resourceUsedThresholdWithBE`` fields this strategy reads, defaults merged."""

    enable: bool = False
    """``enable``: off means restore BE (Koordinator's default is off)."""
    threshold_percent: int = 65
    """``cpuSuppressThresholdPercent``: the node CPU share LS + system + BE may use."""
    min_percent: int | None = None
    """``cpuSuppressMinPercent``: BE never gets less than this share of the node; None: no floor."""
    policy: str = POLICY_CPUSET
    """``cpuSuppressPolicy``: ``cpuset`` or ``cfsQuota``."""


def suppress_settings(section: Mapping[str, Any] | None) -> SuppressSettings:
    """The settings of a NodeSLO's ``resourceUsedThresholdWithBE`` over Koordinator's defaults."""
    merged: dict[str, Any] = dict(DEFAULT_RESOURCE_USED_THRESHOLD_WITH_BE)
    if section:
        merged.update({k: v for k, v in section.items() if v is not None})
    min_percent = merged.get("cpuSuppressMinPercent")
    return SuppressSettings(
        enable=bool(merged.get("enable", False)),
        threshold_percent=int(merged.get("cpuSuppressThresholdPercent", 65)),
        min_percent=None if min_percent is None else int(min_percent),
        policy=str(merged.get("cpuSuppressPolicy") or POLICY_CPUSET),
    )


# Arithmetic -------------------------------------------------------------------------------------


def is_be_pod(pod: PodInfo) -> bool:
    """Koordinator ``BE`` or Kubernetes ``BestEffort`` (upstream's ``NonBEPodFilter``, negated)."""
    return pod.qos is QoSClass.BE or pod.kube_qos is KubeQOS.BESTEFFORT


def is_be_host_app(app: HostAppInfo, be_dir: str) -> bool:
    """A ``BE`` host application whose cgroup sits under the besteffort QoS cgroup; any other
    host application counts as LS (upstream's ``NonBEHostAppFilter``, negated)."""
    return app.qos is QoSClass.BE and app.cgroup_dir.startswith(be_dir.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class Usage:
    """Where the node's CPU goes, in cores."""

    ls_pods: float
    """Pods that are not BE, plus pods the inventory does not know."""
    ls_host_apps: float
    """Host applications that are not BE under the besteffort cgroup."""
    system: float
    """``max(node - all pods - all host apps, 0, reserved)``."""
    be: float
    """BE pods and BE host applications (for the record only)."""


def split_usage(
    node_used: float,
    pod_used: Mapping[str, float],
    be_pods: Iterable[str],
    host_app_used: Mapping[str, float],
    be_host_apps: Iterable[str],
    reserved: float = 0.0,
) -> Usage:
    """Split ``node_used`` into LS pods, LS host apps, system and BE (upstream's
    ``CalculateFilterPodsUsed`` with the non-BE filters). ``pod_used`` is by UID (pods missing
    from the inventory count as LS), ``host_app_used`` by name."""
    be_pod_set = set(be_pods)
    be_app_set = set(be_host_apps)
    all_pods = sum(pod_used.values())
    be_pod_sum = sum(v for uid, v in pod_used.items() if uid in be_pod_set)
    all_apps = sum(host_app_used.values())
    be_app_sum = sum(v for name, v in host_app_used.items() if name in be_app_set)
    system = max(node_used - all_pods - all_apps, 0.0, reserved)
    return Usage(all_pods - be_pod_sum, all_apps - be_app_sum, system, be_pod_sum + be_app_sum)


def be_suppress_milli(
    capacity_milli: int, threshold_percent: int, usage: Usage, min_percent: int | None = None
) -> int:
    """Milli-cores BE may use: ``capacity x threshold% - LS pods - LS host apps - system``,
    floored at ``capacity x min%`` when a minimum is set. Each usage term is truncated to whole
    milli-cores first and the capacity share uses integer division, as upstream; the result may
    be negative (the callers floor it)."""
    milli = capacity_milli * threshold_percent // 100
    milli -= int(usage.ls_pods * 1000) + int(usage.ls_host_apps * 1000) + int(usage.system * 1000)
    if min_percent is not None:
        milli = max(milli, capacity_milli * min_percent // 100)
    return milli


def cfs_quota_target(suppress_milli: int, current: int | None, capacity_cores: int) -> int | None:
    """The BE quota (µs a 100 ms period) to write, or None to leave it (dead band).

    ``max(suppress x period, 2000)``; skipped when it differs from ``current`` by less than
    1 % of the node's CPUs unless it is the floor; raised by at most 10 % of the node's CPUs a
    round when a quota is set (``current`` None: unlimited, no step limit).
    """
    target = max(suppress_milli * CFS_PERIOD_US // 1000, BE_MIN_QUOTA_US)
    cur = -1 if current is None else current
    dead_band = capacity_cores * CFS_PERIOD_US * QUOTA_DEAD_BAND_RATIO
    if abs(target - cur) < dead_band and target != BE_MIN_QUOTA_US:
        return None
    max_step = capacity_cores * CFS_PERIOD_US * BE_MAX_INCREASE_RATIO
    if target - cur > max_step and current is not None:
        target = cur + int(max_step)
    return target


def cpus_of_annotation(annotations: Mapping[str, str]) -> frozenset[int]:
    """CPUs of a pod's ``scheduling.koordinator.sh/resource-status`` cpuset; empty when none or
    malformed."""
    raw = annotations.get(RESOURCE_STATUS_ANNOTATION)
    if not raw:
        return frozenset()
    try:
        status = json.loads(raw)
        text = status.get("cpuset", "") if isinstance(status, dict) else ""
        return parse_cpulist(text) if isinstance(text, str) else frozenset()
    except ValueError:
        return frozenset()


def exclusive_cpus(pods: Iterable[PodInfo]) -> tuple[frozenset[int], frozenset[int]]:
    """``(LSR CPUs, LSE CPUs)`` from the pods' resource-status annotations."""
    lsr: set[int] = set()
    lse: set[int] = set()
    for pod in pods:
        if pod.qos is QoSClass.LSR:
            lsr |= cpus_of_annotation(pod.annotations)
        elif pod.qos is QoSClass.LSE:
            lse |= cpus_of_annotation(pod.annotations)
    return frozenset(lsr), frozenset(lse)


def be_cgroup_dirs(snapshot: WorkloadSnapshot, be_dir: str) -> list[str]:
    """The besteffort QoS cgroup and every BE pod, container and BE host-app cgroup below it,
    parents before children."""
    prefix = be_dir.rstrip("/") + "/"
    dirs = {be_dir}
    for pod in snapshot.pods.values():
        if not pod.cgroup_dir.startswith(prefix):
            continue
        dirs.add(pod.cgroup_dir)
        dirs.update(c.cgroup_dir for c in pod.containers)
    for app in snapshot.host_apps:
        if app.present and is_be_host_app(app, be_dir):
            dirs.add(app.cgroup_dir)
    return sorted(dirs, key=lambda d: (d.count("/"), d))


# The strategy -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _State:
    cpuset: frozenset[int] | None = None
    """BE cpuset last applied; None: never written (the kubelet's: every CPU)."""
    quota: int | None = None
    """BE quota last applied; None: unlimited (never written, or restored)."""
    quota_restored: bool = False
    """The quota is known to be unlimited (upstream's ``policyRecovered``)."""
    suppressed_cores: dict[str, float] = field(default_factory=dict)
    """``koordlet_be_suppress_cpu_cores`` by policy."""
    ls_used: float | None = None
    """``koordlet_be_suppress_ls_used_cpu_cores``."""
    stale_rounds: int = 0
    """Rounds that held the state because an input was stale."""
    last: dict[str, Any] = field(default_factory=dict)
    """Inputs, decision and result of the last round, for ``/debug/qos``."""


def _qos_setting(config: Any, name: str, default: float) -> float:
    qos = getattr(config, "qos", None)
    value = getattr(qos, name, None) if qos is not None else None
    return float(value) if isinstance(value, int | float) and value > 0 else default


class CPUSuppress:
    """The ``cpusuppress`` strategy; see the module docstring."""

    name = NAME

    def __init__(self, ctx: StrategyContext) -> None:
        self._ctx = ctx
        self.interval = _qos_setting(ctx.config, "cpu_suppress_interval", 1.0)
        """Seconds between rounds: Koordinator's ``--cpu-suppress-interval-seconds`` (1)."""
        self._node_name = str(getattr(ctx.config, "node_name", ""))
        self._state = _State()

    # Introspection ---------------------------------------------------------------------------

    @property
    def stale_rounds(self) -> int:
        """Rounds that held the last applied state because an input was stale."""
        return self._state.stale_rounds

    def debug_state(self) -> dict[str, Any]:
        """The last round's inputs, decision and result (``/debug/qos``)."""
        return dict(self._state.last)

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        """Prometheus collector protocol: fresh samples per scrape."""
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        cores = GaugeMetricFamily(
            "koordlet_be_suppress_cpu_cores",
            "Number of cores suppress by koordlet",
            labels=["node", "type"],
        )
        for policy, value in sorted(self._state.suppressed_cores.items()):
            cores.add_metric([self._node_name, policy], value)
        yield cores
        ls = GaugeMetricFamily(
            "koordlet_be_suppress_ls_used_cpu_cores",
            "Number of cpu cores used by LS. We consider non-BE pods and podMeta-missing pods "
            "as LS.",
            labels=["node"],
        )
        if self._state.ls_used is not None:
            ls.add_metric([self._node_name], self._state.ls_used)
        yield ls

    # The round -------------------------------------------------------------------------------

    async def reconcile(self) -> None:
        ctx = self._ctx
        settings = suppress_settings(ctx.node_slo().resource_used_threshold_with_be)
        snapshot = ctx.workloads()
        be_dir = ctx.host().layout.qos_dir(KubeQOS.BESTEFFORT)
        processors = processors_from_node_info(ctx.cache.get_info(NODE_INFO_KEY))
        last: dict[str, Any] = {"at": ctx.now(), "settings": dataclasses.asdict(settings)}
        self._state.last = last
        inputs: dict[str, Any] = {"settings": last["settings"]}

        if not settings.enable:
            last["decision"] = "restore: resourceUsedThresholdWithBE.enable is false"
            await self._restore_quota(be_dir, "BE suppress disabled")
            if processors:
                await self._restore_cpuset(snapshot, be_dir, processors, "BE suppress disabled")
            ctx.report(NAME, StrategyReport(inputs, last["decision"]))
            return
        if not processors:
            self._hold(inputs, last, "CPU topology (node_info) not collected yet")
            return

        node = ctx.read_last(series.NODE_CPU_USAGE, series.NODE)
        inputs["node_cpu"] = node.as_dict()
        if not node.fresh or node.value is None:
            self._hold(inputs, last, f"node CPU usage {node.why_stale}")
            return
        node_used = node.value
        pod_used: dict[str, float] = {}
        for uid in snapshot.pods:
            v = ctx.fresh_last(series.POD_CPU_USAGE, series.pod_entity(uid))
            if v is not None:
                pod_used[uid] = v
        app_used: dict[str, float] = {}
        for app in snapshot.host_apps:
            v = ctx.fresh_last(series.HOST_APP_CPU_USAGE, series.host_app_entity(app.name))
            if v is not None:
                app_used[app.name] = v
        usage = split_usage(
            node_used,
            pod_used,
            (uid for uid, p in snapshot.pods.items() if is_be_pod(p)),
            app_used,
            (a.name for a in snapshot.host_apps if is_be_host_app(a, be_dir)),
        )
        capacity = len(processors)
        milli = be_suppress_milli(
            capacity * 1000, settings.threshold_percent, usage, settings.min_percent
        )
        self._state.ls_used = usage.ls_pods
        reason = (
            f"node {node_used:.2f} cores: LS pods {usage.ls_pods:.2f} + LS host apps "
            f"{usage.ls_host_apps:.2f} + system {usage.system:.2f} against "
            f"{settings.threshold_percent}% of {capacity}: BE {milli / 1000:.2f} cores"
        )
        inputs.update(
            node_used=node_used,
            ls_pods=usage.ls_pods,
            ls_host_apps=usage.ls_host_apps,
            system=usage.system,
            be=usage.be,
            capacity=capacity,
            suppress_milli=milli,
        )
        last["inputs"] = inputs

        if settings.policy == POLICY_CFS_QUOTA:
            await self._apply_quota(milli, capacity, be_dir, reason, last)
            await self._restore_cpuset(snapshot, be_dir, processors, "policy is cfsQuota")
        else:
            await self._apply_cpuset(milli, snapshot, be_dir, processors, reason, last)
            await self._restore_quota(be_dir, "policy is cpuset")
        ctx.report(NAME, StrategyReport(inputs, last["decision"], reason))

    def _hold(self, inputs: dict[str, Any], last: dict[str, Any], why: str) -> None:
        self._state.stale_rounds += 1
        last["decision"] = f"hold: {why}"
        last["inputs"] = inputs
        self._ctx.stale(NAME, why)
        self._ctx.report(NAME, StrategyReport(inputs, last["decision"], stale=True))

    # cfsQuota -------------------------------------------------------------------------------

    async def _apply_quota(
        self, milli: int, capacity: int, be_dir: str, reason: str, last: dict[str, Any]
    ) -> None:
        target = cfs_quota_target(milli, self._state.quota, capacity)
        if target is None:
            last["decision"] = f"cfsQuota: keep {self._state.quota} (change under the dead band)"
            return
        last["decision"] = f"cfsQuota: {target} us"
        if not await self._write_all([("cpu_cfs_quota", be_dir, target)], reason):
            return
        self._state.quota = target
        self._state.quota_restored = False
        self._state.suppressed_cores[POLICY_CFS_QUOTA] = target / CFS_PERIOD_US
        logger.info("%s: BE cfs quota %d us (%s)", NAME, target, reason)

    async def _restore_quota(self, be_dir: str, why: str) -> None:
        if self._state.quota_restored:
            return
        if not await self._write_all([("cpu_cfs_quota", be_dir, None)], f"restore: {why}"):
            return
        self._state.quota = None
        self._state.quota_restored = True

    # cpuset ---------------------------------------------------------------------------------

    def _allowed(self, snapshot: WorkloadSnapshot, processors: Sequence[Processor]) -> list[int]:
        _, lse = exclusive_cpus(snapshot.pods.values())
        return [p.cpu_id for p in processors if p.cpu_id not in lse]

    async def _apply_cpuset(
        self,
        milli: int,
        snapshot: WorkloadSnapshot,
        be_dir: str,
        processors: Sequence[Processor],
        reason: str,
        last: dict[str, Any],
    ) -> None:
        lsr, lse = exclusive_cpus(snapshot.pods.values())
        old = self._state.cpuset
        if old is None:
            old = frozenset(self._allowed(snapshot, processors))
        count = be_cpuset_count(milli, len(old), len(processors))
        cpus = frozenset(pick_be_cpus(count, processors, lsr_cpus=lsr, excluded=lse))
        if not cpus:
            last["decision"] = f"cpuset: {count} CPUs wanted, too few available; unchanged"
            logger.warning("%s: %d CPUs wanted for BE but too few are available", NAME, count)
            return
        last["decision"] = f"cpuset: {format_cpulist(cpus)} ({len(cpus)} CPUs)"
        dirs = be_cgroup_dirs(snapshot, be_dir)
        loose = old | cpus
        writes: list[tuple[str, str, object]] = []
        if loose != cpus:
            writes.extend(("cpuset_cpus", d, loose) for d in dirs)
        writes.extend(("cpuset_cpus", d, cpus) for d in reversed(dirs))
        if not await self._write_all(writes, f"{reason} -> cpuset {format_cpulist(cpus)}"):
            return
        self._state.cpuset = cpus
        self._state.suppressed_cores[POLICY_CPUSET] = float(len(cpus))

    async def _restore_cpuset(
        self, snapshot: WorkloadSnapshot, be_dir: str, processors: Sequence[Processor], why: str
    ) -> None:
        allowed = frozenset(self._allowed(snapshot, processors))
        if not allowed:
            return
        dirs = be_cgroup_dirs(snapshot, be_dir)
        # Parents first: every cgroup grows.
        if await self._write_all([("cpuset_cpus", d, allowed) for d in dirs], f"restore: {why}"):
            self._state.cpuset = allowed

    # Writing --------------------------------------------------------------------------------

    async def _write_all(self, writes: Sequence[tuple[str, str, object]], reason: str) -> bool:
        """Submit the writes in order to the single writer (it runs them in that order) and
        wait for all; True when they were real (not a dry run), so the state may advance.

        A vanished cgroup is a normal race; unsupported knobs and other failures are logged in
        one line, and the first failure that is neither is raised after the rest is done."""
        executor = self._ctx.executor
        futures: list[tuple[str, str, Future[Any]]] = [
            (knob, d, executor.submit(knob, d, value, strategy=NAME, reason=reason))
            for knob, d, value in writes
        ]
        results = await asyncio.gather(
            *(asyncio.wrap_future(f) for _, _, f in futures), return_exceptions=True
        )
        gone = 0
        failed: list[str] = []
        first: BaseException | None = None
        for (knob, d, _), res in zip(futures, results, strict=True):
            if isinstance(res, CgroupGoneError):
                gone += 1
            elif isinstance(res, BaseException):
                failed.append(f"{knob} {d}: {res}")
                if first is None and not isinstance(res, UnsupportedError):
                    first = res
        changed = sum(1 for r in results if getattr(r, "changed", False))
        logger.debug(
            "%s: %d writes, %d changed, %d cgroups gone, %d failed",
            NAME,
            len(writes),
            changed,
            gone,
            len(failed),
        )
        if failed:
            logger.warning("%s: %d writes failed: %s", NAME, len(failed), "; ".join(failed[:5]))
        if first is not None:
            raise HostError(f"{NAME}: {failed[0]}") from first
        return not self._ctx.dry_run(NAME)


def new_cpu_suppress(ctx: StrategyContext) -> CPUSuppress:
    """Table factory."""
    return CPUSuppress(ctx)
