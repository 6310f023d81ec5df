"""CPU suppress: give best-effort (BE) pods only the CPU that latency-sensitive work leaves.

Koordinator's ``cpusuppress`` strategy (feature gate ``BECPUSuppress``), re-done from its
documented semantics (``docs/qos-cpu.md`` has the formulas and the differences):

* **How much**: ``suppress = capacity x cpuSuppressThresholdPercent% - LS pods - LS host apps -
  system`` in milli-cores, where *LS pods* are the pods that are neither Koordinator ``BE`` nor
  Kubernetes ``BestEffort``, *LS host apps* the host applications that are not ``BE`` under the
  besteffort QoS cgroup, and ``system = max(node - all pods - all host apps, 0, reserved)``;
  with ``cpuSuppressMinPercent`` it never goes under ``capacity x min%``.
* **Policy** ``cpuset`` (the default): ``ceil(suppress)`` CPUs, at least 2, growing by at most
  10 % of the node's CPUs a round, picked by :mod:`koordlet.qos.cpupicker`; never the CPUs of
  LSE pods, the CPUs the Node's ``node.koordinator.sh/reservation`` reserves, nor the exclusive
  SYSTEM QoS CPUs of ``node.koordinator.sh/system-qos-resource`` (the CPUs the topology report
  publishes, ``koordlet.statesinformer.nodetopo``); written to the besteffort QoS cgroup, every
  BE pod and container and BE host application below it, as one leveled executor batch (a child
  is never wider than its parent at any moment). When the 2-CPU floor covers every usable CPU
  (a 2-CPU node) the policy can change nothing, and ``/debug/qos`` says so.
* **Policy** ``cfsQuota``: ``quota = suppress x period`` (at least 2000 µs) on the besteffort QoS
  cgroup; a change smaller than 1 % of the node's CPUs is skipped (dead band, except towards the
  floor), a rise is limited to 10 % of the node's CPUs a round once a quota is set.
* **Restore**: when ``resourceUsedThresholdWithBE.enable`` is false the BE cpusets go back to
  every CPU that LSE pods, the reservation and exclusive SYSTEM QoS do not own, and the quota to
  unlimited; switching policy restores what the other policy set.
* **Logs**: each write at debug; at info a change of direction of the BE quota or cpuset (it
  starts falling, or rising again), a restore that changed a file, and a skipped round's reason
  only when it changes.
* **Stale inputs**: when the node's CPU usage is older than twice the collection interval (or
  the CPU topology is unknown) the round holds the state last applied and counts it.
* **Refused writes**: each write's failure is its own. A write the kernel refuses is logged once
  per change (then counted, and logged again with the count when it goes through:
  :class:`~koordlet.qos.shared.WriteFailures`), the rest of the round goes on (the quota, the
  cpuset of every other cgroup, the restores), the round's report in ``/debug/qos`` carries its
  decision and the refusals, and the round ends with a
  :class:`~koordlet.errors.WritesRefusedError` so that the step counts as failed.
* **Ordered so the kernel accepts it**: cgroup v1 refuses (``EINVAL``) a quota on the
  besteffort cgroup below the quota of one of its descendants (``tg_cfs_schedulable_down`` in
  ``kernel/sched/core.c`` compares quota per period down the tree; v2 takes the minimum
  instead). Before the cfsQuota policy lowers the besteffort quota, the BE pod and container
  cgroups whose own quota is above the new one have it removed (``-1``, which the kernel never
  refuses), in the same leveled batch and before the parent is written: what upstream's
  ``BatchResource`` hook sets for BE pods while the policy is cfsQuota (``rule.go``), and a BE
  cgroup is bounded by its parent anyway. This is the switch from cpuset to cfsQuota with BE
  pods that have CPU limits. The cpuset batches are leveled likewise (a parent widened before
  its children, a child narrowed before its parent).

The settings are ``resourceUsedThresholdWithBE`` of the NodeSLO in force (``ctx.node_slo()``:
typed, over Koordinator's defaults, its last good value when the NodeSLO's was rejected). The
node's reservation (the larger of the kubelet's ``capacity - allocatable`` and the
``node.koordinator.sh/reservation`` annotation) is the floor of the system usage when the
context gives the Node object, else 0. A strategy never opens a file: the besteffort cgroup's
current cpuset and quota are read through the executor
(``CgroupWriter.read`` on the writer thread) every round, as upstream reads them, and the cpuset
policy's writes go to the executor as one leveled batch (``submit_batch``: parents first while
growing, children first while shrinking).

The node's reservation, the usage split, BE's allowance and quota, the CPUs BE may get and the BE
cgroups are computed in :mod:`koordlet.qos.cpusuppressrules`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from apis.cpulist import format_cpulist
from apis.extension import KubeQOS
from apis.slo_strategies import CPUSuppressPolicy, ResourceThresholdStrategy
from koordlet.errors import (
    CgroupGoneError,
    HostError,
    InvalidValueError,
    UnsupportedError,
    WritesRefusedError,
)
from koordlet.executor.batch import BatchResult, BatchWrite
from koordlet.executor.writer import WriteResult
from koordlet.metriccache import series
from koordlet.prom import GaugeMetricFamily, Metric
from koordlet.qos.cpupicker import (
    BE_MIN_CPUSET_CPUS,
    Processor,
    be_cpuset_count,
    pick_be_cpus,
)
from koordlet.qos.cpusuppressrules import (
    CFS_PERIOD_US,
    BECpus,
    be_cgroup_dirs,
    be_cpus,
    be_suppress_milli,
    cfs_quota_target,
    is_be_host_app,
    is_be_pod,
    node_reserved_milli,
    split_usage,
)
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.shared import WriteFailures, write_key
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from koordlet.system.knobs import CPU_CFS_PERIOD, CPU_CFS_QUOTA, CPUSET_CPUS, Knob

logger = logging.getLogger(__name__)

NAME = "cpusuppress"
FEATURE_GATE = "BECPUSuppress"
NODE_INFO_KEY = "node_info"
"""The metric cache info key of the nodeinfo collector (CPU topology)."""

POLICY_CPUSET = "cpuset"
POLICY_CFS_QUOTA = "cfsQuota"


# The strategy -----------------------------------------------------------------------------------

_T = TypeVar("_T")
_V = TypeVar("_V")
NodeGetter = Callable[[], Mapping[str, Any] | None]
"""Returns the Node object (``metadata.annotations``, ``status.capacity``/``allocatable``) when
the koordlet runs against a cluster, None in standalone mode."""


@dataclass(slots=True)
class _State:
    applied_cpuset: tuple[frozenset[int], frozenset[str]] | None = None
    """The BE cpuset and the cgroups the last real cpuset batch wrote it to; a round that finds
    the same set on the besteffort cgroup and the same cgroups writes nothing."""
    restored_cpuset: tuple[frozenset[int], frozenset[str]] | None = None
    """The same for the last restore (every CPU that LSE pods do not own)."""
    quota_restored: bool = False
    """The quota was set unlimited since the cfsQuota policy last wrote it (upstream's
    ``policyRecovered``); False at start, so the first round restores a quota left behind."""
    suppressed_cores: dict[str, float] = field(default_factory=dict)
    """``koordlet_be_suppress_cpu_cores`` by policy."""
    ls_used: float | None = None
    """``koordlet_be_suppress_ls_used_cpu_cores``."""
    stale_rounds: int = 0
    """Rounds that held the state because an input was stale."""
    direction: dict[str, str] = field(default_factory=dict)
    """By policy, ``down`` or ``up``: which way BE last moved (a change of direction is logged
    at info, each step at debug)."""
    last_note: str = ""
    """The last reason logged at info for a round that changed nothing (logged again only when
    it changes)."""
    last: dict[str, Any] = field(default_factory=dict)
    """Inputs, decision and result of the last round, for ``/debug/qos``."""
    cpus: BECpus | None = None
    """The last round's CPUs and what they were computed from
    (:func:`~koordlet.qos.cpusuppressrules.be_cpus`)."""
    be_dirs: tuple[WorkloadSnapshot, str, frozenset[str]] | None = None
    """The BE cgroups of a snapshot (:func:`~koordlet.qos.cpusuppressrules.be_cgroup_dirs`):
    the inventory hands out the same snapshot object until a workload changes, so a round
    without a change does not walk the pods again (0.45 ms a round less at 200 pods)."""


def _settings_dict(s: ResourceThresholdStrategy) -> dict[str, Any]:
    return {
        "enable": s.enable,
        "cpuSuppressThresholdPercent": s.cpu_suppress_threshold_percent,
        "cpuSuppressMinPercent": s.cpu_suppress_min_percent,
        "cpuSuppressPolicy": str(s.cpu_suppress_policy),
    }


class CPUSuppress:
    """The ``cpusuppress`` strategy; see the module docstring.

    :param node: the Node object's getter; by default the context's ``node`` when it has one
        (cluster mode), else no reservation is known and the system floor is 0.
    """

    name = NAME

    def __init__(
        self, ctx: StrategyContext, interval: float = 1.0, *, node: NodeGetter | None = None
    ) -> None:
        self._ctx = ctx
        self.interval = interval
        """Seconds between rounds: Koordinator's ``--cpu-suppress-interval-seconds`` (1)."""
        self._node_name = ctx.config.node_name
        self._node: NodeGetter | None = node if node is not None else ctx.node
        self._state = _State()
        self._failures = WriteFailures(NAME, logger, clock=ctx.now)
        self._refused: list[str] = []
        """This round's refused writes (``<knob> <cgroup>: <error>``)."""

    # Introspection ---------------------------------------------------------------------------

    @property
    def stale_rounds(self) -> int:
        """Rounds that held the last applied state because an input was stale."""
        return self._state.stale_rounds

    def debug_state(self) -> dict[str, Any]:
        """The last round's inputs, decision and result (``/debug/qos``)."""
        return dict(self._state.last)

    @property
    def refused(self) -> dict[str, dict[str, Any]]:
        """The writes the kernel refuses now, with their error and count."""
        return self._failures.describe()

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

    def _node_object(self) -> Mapping[str, Any] | None:
        getter = self._node
        if getter is None:
            return None
        try:
            return getter()
        except Exception:  # a broken getter must not stop suppression; no reservation then
            logger.exception("%s: reading the Node object failed; no reservation known", NAME)
            return None

    async def reconcile(self) -> None:
        self._refused = []
        await self._round()
        if self._refused:
            raise WritesRefusedError(NAME, self._refused)

    def _report(self, inputs: Mapping[str, Any], decision: str, result: str) -> None:
        """The round's report, with the writes refused this round and those failing still."""
        detail: dict[str, Any] = {}
        if self._refused:
            result = _joined([result, f"{len(self._refused)} writes refused"])
            detail["refused_this_round"] = list(self._refused)
        if len(self._failures):
            detail["refused"] = self._failures.describe()
        self._ctx.report(NAME, StrategyReport(inputs, decision, result, detail=detail))

    async def _round(self) -> None:
        ctx = self._ctx
        settings = ctx.node_slo().resource_used_threshold_with_be
        snapshot = ctx.workloads()
        be_dir = ctx.host().layout.qos_dir(KubeQOS.BESTEFFORT)
        node_obj = self._node_object()
        cpus = be_cpus(self._state.cpus, snapshot, ctx.cache.get_info(NODE_INFO_KEY), node_obj)
        self._state.cpus = cpus
        processors, lsr, excluded = cpus.processors, cpus.lsr, cpus.excluded
        last: dict[str, Any] = {"at": ctx.now(), "settings": _settings_dict(settings)}
        self._state.last = last
        inputs: dict[str, Any] = {"settings": last["settings"], "excluded_cpus": dict(cpus.detail)}

        if not settings.enable:
            last["decision"] = "restore: resourceUsedThresholdWithBE.enable is false"
            results = [await self._restore_quota(be_dir, "BE suppress disabled")]
            if processors:
                results.append(
                    await self._restore_cpuset(
                        snapshot, be_dir, processors, excluded, "BE suppress disabled"
                    )
                )
            self._report(inputs, last["decision"], _joined(results))
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
        reserved = node_reserved_milli(node_obj) / 1000
        usage = split_usage(
            node_used,
            pod_used,
            (uid for uid, p in snapshot.pods.items() if is_be_pod(p)),
            app_used,
            (a.name for a in snapshot.host_apps if is_be_host_app(a, be_dir)),
            reserved,
        )
        capacity = len(processors)
        threshold = settings.cpu_suppress_threshold_percent
        milli = be_suppress_milli(
            capacity * 1000, threshold, usage, settings.cpu_suppress_min_percent
        )
        self._state.ls_used = usage.ls_pods
        reason = (
            f"node {node_used:.2f} cores: LS pods {usage.ls_pods:.2f} + LS host apps "
            f"{usage.ls_host_apps:.2f} + system {usage.system:.2f} against "
            f"{threshold}% of {capacity}: BE {milli / 1000:.2f} cores"
        )
        inputs.update(
            node_used=node_used,
            ls_pods=usage.ls_pods,
            ls_host_apps=usage.ls_host_apps,
            system=usage.system,
            reserved=reserved,
            be=usage.be,
            capacity=capacity,
            suppress_milli=milli,
        )
        last["inputs"] = inputs

        if settings.cpu_suppress_policy is CPUSuppressPolicy.CFS_QUOTA:
            await self._apply_quota(milli, capacity, be_dir, reason, last)
            restored = await self._restore_cpuset(
                snapshot, be_dir, processors, excluded, "policy is cfsQuota"
            )
        else:
            await self._apply_cpuset(
                milli, snapshot, be_dir, processors, lsr, excluded, reason, last
            )
            restored = await self._restore_quota(be_dir, "policy is cpuset")
        result = _joined([last.get("result", ""), restored])
        self._report(inputs, last["decision"], result or reason)

    def _hold(self, inputs: dict[str, Any], last: dict[str, Any], why: str) -> None:
        self._state.stale_rounds += 1
        last["decision"] = f"hold: {why}"
        last["inputs"] = inputs
        self._ctx.stale(NAME, why)
        self._ctx.report(NAME, StrategyReport(inputs, last["decision"], stale=True))

    def _note(self, text: str) -> None:
        """Log at info why a round changed nothing, once per distinct reason."""
        if text != self._state.last_note:
            self._state.last_note = text
            logger.info("%s: %s", NAME, text)

    def _moved(self, policy: str, old: float, new: float, text: str) -> None:
        """One step of BE's allowance: debug; info when it turns (first step, or the other way
        than the last one)."""
        if new == old:
            return
        direction = "down" if new < old else "up"
        turned = self._state.direction.get(policy) != direction
        self._state.direction[policy] = direction
        log = logger.info if turned else logger.debug
        verb = "suppressing" if direction == "down" else "releasing"
        log("%s: %s BE, %s: %s", NAME, verb, policy, text)

    # Reading ---------------------------------------------------------------------------------

    async def _read(self, knob: Knob[_V], rel_dir: str, default: _T) -> _V | _T:
        """The knob's current value, read from its file on the writer thread (in order with the
        queued writes); ``default`` when the cgroup is gone, the knob unsupported (logged) or
        the file unreadable now (recorded as this round's failure: the round goes on)."""
        executor = self._ctx.executor
        key = f"read {write_key(knob.name, rel_dir)}"
        try:
            value: _V = await asyncio.wrap_future(
                executor.call(lambda: executor.read(knob, rel_dir))
            )
        except CgroupGoneError:
            logger.debug("%s: %s gone while reading %s", NAME, rel_dir, knob.name)
        except UnsupportedError as err:
            logger.debug("%s: %s unreadable: %s", NAME, knob.name, err)
        except HostError as err:
            self._failures.failed(key, str(err))
            self._refused.append(f"{key}: {err}")
        else:
            self._failures.succeeded(key)
            return value
        return default

    # cfsQuota -------------------------------------------------------------------------------

    async def _apply_quota(
        self, milli: int, capacity: int, be_dir: str, reason: str, last: dict[str, Any]
    ) -> None:
        current = await self._read(CPU_CFS_QUOTA, be_dir, None)
        last["current_quota"] = current
        target = cfs_quota_target(milli, current, capacity)
        if target is None:
            last["decision"] = f"cfsQuota: keep {_quota_text(current)} (change under the dead band)"
            return
        last["decision"] = f"cfsQuota: {target} us"
        lowering = current is None or target < current
        above = await self._children_above(be_dir, target) if lowering else []
        if above:
            # children first: v1 refuses a parent quota below a child's (module docstring)
            why = f"{reason}: own quota above the BE quota {target} us removed first"
            writes: list[BatchWrite[Any]] = [
                BatchWrite(CPU_CFS_QUOTA, d, None, strategy=NAME, reason=why) for d in above
            ]
            writes.append(BatchWrite(CPU_CFS_QUOTA, be_dir, target, strategy=NAME, reason=reason))
            result = await self._submit_batch(writes)
            last["children_unlimited"] = above
            applied = be_dir.strip("/") not in {w.rel_dir.strip("/") for w, _ in result.errors}
            last["result"] = (
                f"{result.changed} writes ({len(above)} BE cgroups unlimited first)"
                if applied
                else "refused"
            )
        else:
            written = await self._write_one(CPU_CFS_QUOTA, be_dir, target, reason)
            applied = written is not None
            if written is None:
                last["result"] = "refused" if self._refused else "cgroup gone or unsupported"
            else:
                last["result"] = "1 write" if written.changed else "unchanged"
        if not applied or self._ctx.dry_run(NAME):
            return
        self._state.quota_restored = False
        self._state.suppressed_cores[POLICY_CFS_QUOTA] = target / CFS_PERIOD_US
        old = capacity * CFS_PERIOD_US if current is None else current
        self._moved(
            POLICY_CFS_QUOTA,
            old,
            target,
            f"BE cfs quota {_quota_text(current)} -> {target} us ({reason})",
        )

    async def _restore_quota(self, be_dir: str, why: str) -> str:
        if self._state.quota_restored:
            return ""
        written = await self._write_one(CPU_CFS_QUOTA, be_dir, None, f"restore: {why}")
        if written is None or self._ctx.dry_run(NAME):
            return ""
        self._state.quota_restored = True
        self._state.suppressed_cores.pop(POLICY_CFS_QUOTA, None)
        self._state.direction.pop(POLICY_CFS_QUOTA, None)
        if not written.changed:
            return ""
        try:
            before = _quota_text(CPU_CFS_QUOTA.decode(written.old, self._ctx.host().layout.version))
        except ValueError:
            before = written.old
        logger.info("%s: BE cfs quota restored %s -> unlimited (%s)", NAME, before, why)
        return "quota restored to unlimited"

    # cpuset ---------------------------------------------------------------------------------

    async def _apply_cpuset(
        self,
        milli: int,
        snapshot: WorkloadSnapshot,
        be_dir: str,
        processors: Sequence[Processor],
        lsr: frozenset[int],
        excluded: frozenset[int],
        reason: str,
        last: dict[str, Any],
    ) -> None:
        allowed = frozenset(p.cpu_id for p in processors if p.cpu_id not in excluded)
        current: frozenset[int] = await self._read(CPUSET_CPUS, be_dir, allowed)
        old = frozenset(current)
        last["current_cpuset"] = format_cpulist(old)
        count = be_cpuset_count(milli, len(old), len(processors))
        cpus = frozenset(pick_be_cpus(count, processors, lsr_cpus=lsr, excluded=excluded))
        if not cpus:
            why = f"{count} CPUs wanted for BE but only {len(allowed)} usable"
            last["decision"] = f"cpuset: unchanged, {why}"
            self._note(why)
            return
        last["decision"] = f"cpuset: {format_cpulist(cpus)} ({len(cpus)} CPUs)"
        if count == BE_MIN_CPUSET_CPUS and len(allowed) <= BE_MIN_CPUSET_CPUS:
            why = (
                f"the {BE_MIN_CPUSET_CPUS}-CPU floor of the cpuset policy (beMinCPUSetCores) "
                f"covers all {len(allowed)} usable CPUs, so BE keeps them whatever LS uses; "
                "the cfsQuota policy limits BE on such a node"
            )
            last["decision"] += f"; BE wanted {milli / 1000:.2f} cores, but {why}"
            last["floor"] = {
                "cpus": BE_MIN_CPUSET_CPUS,
                "usable": len(allowed),
                "wanted_milli": milli,
            }
            self._note(why)
        else:
            self._state.last_note = ""
        dirs = self._be_dirs(snapshot, be_dir)
        self._state.restored_cpuset = None
        if old == cpus and self._state.applied_cpuset == (cpus, dirs):
            return  # in place, and no BE cgroup appeared since: nothing to write
        done = await self._batch(dirs, cpus, f"{reason} -> cpuset {format_cpulist(cpus)}", last)
        self._state.applied_cpuset = (cpus, dirs) if done else None
        if done:
            self._state.suppressed_cores[POLICY_CPUSET] = float(len(cpus))
            self._moved(
                POLICY_CPUSET,
                len(old),
                len(cpus),
                f"BE cpuset {format_cpulist(old)} -> {format_cpulist(cpus)} ({reason})",
            )

    async def _restore_cpuset(
        self,
        snapshot: WorkloadSnapshot,
        be_dir: str,
        processors: Sequence[Processor],
        excluded: frozenset[int],
        why: str,
    ) -> str:
        allowed = frozenset(p.cpu_id for p in processors if p.cpu_id not in excluded)
        if not allowed:
            return ""
        dirs = self._be_dirs(snapshot, be_dir)
        self._state.applied_cpuset = None
        if self._state.restored_cpuset == (allowed, dirs):
            return ""
        result: dict[str, Any] = {}
        done = await self._batch(dirs, allowed, f"restore: {why}", result)
        self._state.restored_cpuset = (allowed, dirs) if done else None
        if not done:
            return ""
        self._state.suppressed_cores.pop(POLICY_CPUSET, None)
        self._state.direction.pop(POLICY_CPUSET, None)
        if not result.get("changed"):
            return ""
        logger.info(
            "%s: BE cpusets restored to %s in %d cgroups (%s)",
            NAME,
            format_cpulist(allowed),
            result["changed"],
            why,
        )
        return f"cpusets restored to {format_cpulist(allowed)}"

    def _be_dirs(self, snapshot: WorkloadSnapshot, be_dir: str) -> frozenset[str]:
        known = self._state.be_dirs
        if known is not None and known[0] is snapshot and known[1] == be_dir:
            return known[2]
        dirs = frozenset(be_cgroup_dirs(snapshot, be_dir))
        self._state.be_dirs = (snapshot, be_dir, dirs)
        return dirs

    async def _batch(
        self, dirs: Iterable[str], cpus: frozenset[int], reason: str, last: dict[str, Any]
    ) -> bool:
        """Write ``cpus`` to every cgroup of ``dirs`` as one leveled batch (the executor orders
        it: parents first where a set grows, children first where it shrinks). True when it was
        real and nothing failed; a cgroup removed meanwhile is a normal race, not a failure.
        Raises :class:`HostError` naming the first failure after the rest was written."""
        writes = [
            BatchWrite(CPUSET_CPUS, d, cpus, strategy=NAME, reason=reason)
            for d in sorted(dirs, key=lambda d: (d.count("/"), d))
        ]
        result = await self._submit_batch(writes)
        last["changed"] = result.changed
        last["result"] = (
            f"{len(writes)} cgroups: {result.changed} changed, {len(result.gone)} gone, "
            f"{len(result.errors)} refused"
        )
        logger.debug("%s: cpuset batch %s", NAME, last["result"])
        return not result.errors and not self._ctx.dry_run(NAME)

    async def _submit_batch(self, writes: list[BatchWrite[Any]]) -> BatchResult:
        """One leveled batch; each refused write recorded as its own (the rest went on)."""
        result: BatchResult = await asyncio.wrap_future(self._ctx.executor.submit_batch(writes))
        refused = {write_key(w.knob_name, w.rel_dir): err for w, err in result.errors}
        gone = set(result.gone)
        live = [
            write_key(w.knob_name, w.rel_dir)
            for w in writes
            if not any(w.rel_dir.strip("/") == g or w.rel_dir.strip("/").startswith(g + "/")
                       for g in gone)
        ]  # fmt: skip
        self._failures.settle(live, refused)
        self._refused.extend(f"{k}: {e}" for k, e in refused.items())
        return result

    async def _children_above(self, be_dir: str, target: int) -> list[str]:
        """The BE cgroups below ``be_dir`` whose own CFS quota, per period, exceeds ``target``
        per the besteffort period: on cgroup v1 they block the lower quota (module docstring),
        deepest first. Read in one job on the writer thread; a cgroup gone meanwhile is left
        out. Empty on v2, which takes the minimum instead of refusing."""
        ctx = self._ctx
        if ctx.host().layout.version is not CgroupVersion.V1:
            return []
        below = [d for d in be_cgroup_dirs(ctx.workloads(), be_dir) if d != be_dir]
        if not below:
            return []
        executor = ctx.executor

        def read_all() -> list[str]:
            try:
                be_period = executor.read(CPU_CFS_PERIOD, be_dir)
            except (HostError, InvalidValueError):
                be_period = CFS_PERIOD_US
            out = []
            for d in below:
                try:
                    quota = executor.read(CPU_CFS_QUOTA, d)
                    if quota is None:
                        continue
                    period = executor.read(CPU_CFS_PERIOD, d)
                except (HostError, InvalidValueError):
                    continue  # gone, or unreadable: the batch will say
                if quota * be_period > target * period:
                    out.append(d)
            return sorted(out, key=lambda d: (-d.count("/"), d))

        return await asyncio.wrap_future(executor.call(read_all))

    # Writing --------------------------------------------------------------------------------

    async def _write_one(
        self, knob: Knob[_V], rel_dir: str, value: _V, reason: str
    ) -> WriteResult | None:
        """One write through the single writer (logged at debug); its result, or None when the
        cgroup vanished, the knob is unsupported (logged) or the kernel refused the write
        (recorded in this round's refusals, logged once per change)."""
        executor = self._ctx.executor
        try:
            result: WriteResult = await asyncio.wrap_future(
                executor.submit(knob, rel_dir, value, strategy=NAME, reason=reason)
            )
        except CgroupGoneError:
            logger.debug("%s: %s gone", NAME, rel_dir)
            return None
        except UnsupportedError as err:
            logger.warning("%s: %s not written: %s", NAME, knob.name, err)
            return None
        except (HostError, InvalidValueError) as err:
            key = write_key(knob.name, rel_dir)
            self._failures.failed(key, str(err))
            self._refused.append(f"{key}: {err}")
            return None
        self._failures.succeeded(write_key(knob.name, rel_dir))
        logger.debug(
            "%s: %s %s: %s -> %s (%s)",
            NAME,
            knob.name,
            rel_dir,
            result.old or "?",
            result.new,
            "changed" if result.changed else "unchanged",
        )
        return result


def _quota_text(quota: int | None) -> str:
    """A CFS quota as a person reads it: ``unlimited`` for none."""
    return "unlimited" if quota is None else f"{quota} us"


def _joined(parts: Iterable[str]) -> str:
    return "; ".join(p for p in parts if p)


def build(ctx: StrategyContext, interval: float) -> CPUSuppress:
    """Table factory."""
    return CPUSuppress(ctx, interval)
