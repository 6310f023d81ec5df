"""Preemption in the standalone scheduler: kube-scheduler's DefaultPreemption with Koordinator's
ElasticQuota rules (``pkg/scheduler/framework/plugins/defaultpreemption``,
``pkg/scheduler/framework/preemption``; Koordinator's ``pkg/scheduler/plugins/elasticquota/
preempt.go``).

When a pod fits nowhere:

1. **Eligible?** Not with ``preemptionPolicy: Never``; not while pods it already preempted on its
   nominated node are still terminating (it waits for them).
2. **Where might it help?** Nodes whose only failures evicting pods can cure
   (:meth:`Framework.unresolvable`: a selector, a taint, a missing topology label, an unbound
   claim, an expired NodeMetric cannot), and, by a cheap check before the dry run
   (:meth:`Framework.might_help`), where the lower-priority pods free enough resources, or, on a
   node too loaded for LoadAwareScheduling, are counted by their estimates (reported usage stays
   until the next report). A pod its ElasticQuota rejected (quota full) may preempt only
   lower-priority pods of its own quota, and the quota must have room once they are gone.
3. **Victims per node** (``SelectVictimsOnNode``): take every pod it may preempt off the node (lower
   priority; never a non-preemptible pod, ``quota.scheduling.koordinator.sh/preemptible:
   "false"``; from another quota only while that quota *borrows*, using more than its min); if the
   pod still does not fit, the node is no candidate. Then put them back one at a time, most
   important first (kube-scheduler's order: those whose PodDisruptionBudget would be violated
   first, then the others; Koordinator's: pods of quotas within their min before pods of
   borrowing quotas, so borrowed resources are taken back first), keeping each one the pod still
   fits without. Those left off are the victims.
4. **The best candidate** (``pickOneNodeForPreemption``): fewest PodDisruptionBudget violations;
   then fewest victims from quotas within their min; then the lowest highest victim priority; the
   lowest sum of priorities; the fewest victims; the latest start among the highest-priority
   victims; the first examined. At most ``max(10 %, 100)`` nodes are tried
   (``minCandidateNodesPercentage``, ``minCandidateNodesAbsolute``).
5. **Preempt** (:class:`Evictor`): each victim is evicted through the API (policy/v1 Eviction,
   so the API server enforces PodDisruptionBudgets: a refusal stops this preemption and the pod
   retries), gets a ``Preempted`` Event (``reporting.py``'s recorder, as kube-scheduler writes
   it), and the pod's ``status.nominatedNodeName`` is set. An informer that stops being current
   (the scheduler's gate) stops the preemption before the next eviction or the nomination. While
   nominated, the pod's node is held for it: lower-priority pods are filtered as if it were
   already there, and its next attempt tries that node first.

The dry run moves pods off and back onto the snapshot's nodes (touching them, so the plugins'
per-node indexes follow) and restores every node before returning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from apis.kubernetes_keys import PREEMPT_NEVER
from apis.scheduling_keys import LABEL_PREEMPTIBLE
from kubeclient.errors import KubeError, NotFound, TooManyRequests
from kubeclient.resources import PODS
from scheduler_plugins.framework import Cycle, Framework
from scheduler_plugins.plugins.elasticquota import ElasticQuota
from scheduler_plugins.plugins.quotatree import Quota, quota_of
from scheduler_plugins.reporting import EventRecorder
from scheduler_plugins.snapshot import NodeInfo, PodInfo, Snapshot

logger = logging.getLogger(__name__)

MIN_CANDIDATE_NODES_PERCENTAGE = 10
"""``DefaultPreemptionArgs.minCandidateNodesPercentage``."""
MIN_CANDIDATE_NODES_ABSOLUTE = 100
"""``DefaultPreemptionArgs.minCandidateNodesAbsolute``."""
MSG_NOT_HELPFUL = "Preemption is not helpful for scheduling."
MSG_NO_VICTIMS = "No preemption victims found for incoming pod."
MSG_POLICY_NEVER = "not eligible due to preemptionPolicy=Never."
MSG_TERMINATING = "not eligible due to a terminating pod on the nominated node."
_OFFSET = 2**31
"""kube-scheduler adds ``MaxInt32 + 1`` to each priority before summing them."""


@dataclass(slots=True)
class Candidate:
    """A node where evicting ``victims`` lets the pod fit."""

    node: str
    victims: list[PodInfo]
    pdb_violations: int
    guaranteed_victims: int
    """Victims whose quota is within its min (not borrowing)."""

    def rank(self) -> tuple[int, ...]:
        """Lower is better (``pickOneNodeForPreemption``)."""
        prios = [v.priority for v in self.victims]
        top = max(prios, default=0)
        starts = [v.scheduled_at or 0.0 for v in self.victims if v.priority == top]
        return (
            self.pdb_violations,
            self.guaranteed_victims,
            top,
            sum(p + _OFFSET for p in prios),
            len(self.victims),
            -int(min(starts, default=0.0) * 1000),
        )


@dataclass(slots=True)
class Outcome:
    """What preemption decided for one pod."""

    candidate: Candidate | None
    message: str
    """Why not, in kube-scheduler's words (the ``preemption: ...`` part of the Event)."""


def more_important_first(pod: PodInfo) -> tuple[int, float]:
    """``MoreImportantPod`` as a sort key: higher priority, then the earlier started."""
    return (-pod.priority, pod.scheduled_at or 0.0)


class _QuotaRules:
    """The ElasticQuota side of who may be preempted."""

    def __init__(self, quotas: Mapping[str, Quota] | None, own: str | None, full: bool) -> None:
        self.quotas = quotas or {}
        self.own = own
        self.full = full
        """The pod's quota rejected it: only its own quota's pods are victims."""

    def quota(self, pod: PodInfo) -> str | None:
        return quota_of(pod, self.quotas) if self.quotas else None

    def borrowing(self, name: str | None) -> bool:
        q = self.quotas.get(name or "")
        return q is not None and any(v > q.min.get(r, 0) for r, v in q.used.items())

    def allows(self, victim: PodInfo) -> bool:
        vq = self.quota(victim)
        if self.full:
            return vq is not None and vq == self.own
        return vq is None or vq == self.own or self.borrowing(vq)

    def room_after(self, pod: PodInfo, removed: Sequence[PodInfo]) -> bool:
        """With the pod's quota full: whether it fits once ``removed`` are gone."""
        if not self.full or self.own not in self.quotas:
            return True
        q = self.quotas[self.own or ""]
        for r, v in pod.requests.items():
            if r not in q.max and r not in q.min:
                continue
            freed = sum(p.requests.get(r, 0) for p in removed if self.quota(p) == self.own)
            if q.used.get(r, 0) - freed + v > q.runtime.get(r, 0):
                return False
        return True


class Preemption:
    """Finds the victims for a pod (the dry run); :class:`Evictor` carries it out."""

    def __init__(self, framework: Framework, snapshot: Snapshot) -> None:
        self.framework = framework
        self.snapshot = snapshot

    # -- eligibility ----------------------------------------------------------------------

    def not_eligible(self, pod: PodInfo, pending_victims: Sequence[str] = ()) -> str | None:
        """Why ``pod`` may not preempt now (``podEligibleToPreemptOthers``), or ``None``."""
        if pod.constraints.preemption_policy == PREEMPT_NEVER:
            return MSG_POLICY_NEVER
        nodes = self.snapshot.nodes
        for uid in pending_victims:
            if any(uid in n.pods for n in nodes.values()):
                return MSG_TERMINATING
        return None

    def _quota_rules(self, cycle: Cycle, pod: PodInfo, rejected_by: str | None) -> _QuotaRules:
        plugin = self.framework.plugin("ElasticQuota")
        if not isinstance(plugin, ElasticQuota):
            return _QuotaRules(None, None, False)
        found = plugin.quotas_for(cycle, pod)
        if found is None:
            return _QuotaRules(None, None, False)
        quotas, own = found
        return _QuotaRules(quotas, own, rejected_by == "ElasticQuota")

    # -- the dry run ----------------------------------------------------------------------

    def find(
        self,
        cycle: Cycle,
        pod: PodInfo,
        failures: Mapping[str, Sequence[tuple[str, str]]],
        pending_victims: Sequence[str] = (),
    ) -> Outcome:
        """The best candidate for ``pod`` given why each node failed, or why there is none."""
        why = self.not_eligible(pod, pending_victims)
        if why is not None:
            return Outcome(None, why)
        nodes = list(self.snapshot.nodes.values())
        pre = self.framework.pre_filter(cycle, pod)
        rejected_by = pre[0] if pre is not None else None
        if pre is not None and pre[0] != "ElasticQuota":
            # a gang short of members, an unbound claim: evicting pods does not help
            return Outcome(
                None,
                self._message(len(nodes), dict.fromkeys((n.name for n in nodes), MSG_NOT_HELPFUL)),
            )
        rules = self._quota_rules(cycle, pod, rejected_by)
        verdicts: dict[str, str] = {}
        potential = []
        for n in nodes:
            failed = failures.get(n.name, ())
            if any(self.framework.unresolvable(p, r) for p, r in failed):
                verdicts[n.name] = MSG_NOT_HELPFUL
            else:
                potential.append(n)
        want = max(len(nodes) * MIN_CANDIDATE_NODES_PERCENTAGE // 100, MIN_CANDIDATE_NODES_ABSOLUTE)
        budgets = list(self.snapshot.budgets.values())
        candidates: list[Candidate] = []
        for n in potential:
            if len(candidates) >= want:
                break
            found = self._victims_on(cycle, pod, n, rules, budgets, failures.get(n.name, ()))
            if isinstance(found, str):
                verdicts[n.name] = found
            else:
                candidates.append(found)
        if not candidates:
            return Outcome(None, self._message(len(nodes), verdicts))
        best = min(candidates, key=Candidate.rank)
        return Outcome(best, "")

    @staticmethod
    def _message(total: int, verdicts: Mapping[str, str]) -> str:
        counts: dict[str, int] = {}
        for reason in verdicts.values():
            counts[reason] = counts.get(reason, 0) + 1
        parts = ", ".join(f"{n} {r}" for r, n in sorted(counts.items()))
        return f"0/{total} nodes are available: {parts}."

    def _fits(self, cycle: Cycle, pod: PodInfo, node: NodeInfo) -> str | None:
        return self.framework.first_failure(cycle, pod, node)

    @contextmanager
    def _off(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, victims: list[PodInfo]
    ) -> Iterator[list[PodInfo]]:
        """Take ``victims`` off ``node`` for the dry run; the list yielded holds those still
        off, all put back on exit."""
        off: list[PodInfo] = []
        try:
            for v in victims:
                self._take(cycle, pod, node, v, touch=False)
                off.append(v)
            self.snapshot.touch(node.name)  # once for the lot: the plugins re-index the node
            yield off
        finally:
            for v in off:
                self._put(cycle, pod, node, v, touch=False)
            self.snapshot.touch(node.name)

    def _take(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, v: PodInfo, *, touch: bool = True
    ) -> None:
        node.remove_pod(v.uid)
        if touch:
            self.snapshot.touch(node.name)
        for plugin in self.framework.plugins:
            plugin.remove_pod(cycle, pod, v, node)

    def _put(
        self, cycle: Cycle, pod: PodInfo, node: NodeInfo, v: PodInfo, *, touch: bool = True
    ) -> None:
        node.add_pod(v)
        if touch:
            self.snapshot.touch(node.name)
        for plugin in self.framework.plugins:
            plugin.add_pod(cycle, pod, v, node)

    def _victims_on(
        self,
        cycle: Cycle,
        pod: PodInfo,
        node: NodeInfo,
        rules: _QuotaRules,
        budgets: Sequence[Any],
        failed: Sequence[tuple[str, str]] = (),
    ) -> Candidate | str:
        potential = [
            p
            for p in node.pods.values()
            if p.priority < pod.priority
            and p.labels.get(LABEL_PREEMPTIBLE) != "false"
            and not p.constraints.terminating
            and rules.allows(p)
        ]
        if not potential:
            return MSG_NO_VICTIMS
        if not self.framework.might_help(cycle, pod, node, potential):
            return failed[0][1] if failed else MSG_NO_VICTIMS
        with self._off(cycle, pod, node, potential) as off:
            reason = self._fits(cycle, pod, node)
            if reason is None and not rules.room_after(pod, off):
                reason = MSG_NO_VICTIMS
            if reason is not None:
                return reason
            allowed = [b.disruptions_allowed for b in budgets]
            violating: list[PodInfo] = []
            others: list[PodInfo] = []
            for p in sorted(potential, key=more_important_first):
                hit = False
                for i, b in enumerate(budgets):
                    if b.selects(p.namespace, p.labels) and p.name not in b.disrupted_pods:
                        allowed[i] -= 1
                        if allowed[i] < 0:
                            hit = True
                (violating if hit else others).append(p)
            victims: list[PodInfo] = []
            violations = 0
            for group, counts in ((violating, True), (others, False)):
                # pods of quotas within their min are kept first: borrowed ones go first
                group.sort(key=lambda p: rules.borrowing(rules.quota(p)))
                for p in group:
                    off.remove(p)
                    self._put(cycle, pod, node, p)
                    if self._fits(cycle, pod, node) is None and rules.room_after(pod, off):
                        continue
                    self._take(cycle, pod, node, p)
                    off.append(p)
                    victims.append(p)
                    violations += counts
        guaranteed = sum(
            1 for v in victims if rules.quota(v) is not None and not rules.borrowing(rules.quota(v))
        )
        return Candidate(node.name, victims, violations, guaranteed)


@dataclass(slots=True)
class Nominations:
    """Pods that preempted, the node held for each and the victims it waits for."""

    pods: dict[str, tuple[PodInfo, str]] = field(default_factory=dict)
    victims: dict[str, list[str]] = field(default_factory=dict)

    def add(self, pod: PodInfo, node: str, victims: Sequence[PodInfo]) -> None:
        self.pods[pod.uid] = (pod, node)
        self.victims[pod.uid] = [v.uid for v in victims]

    def drop(self, uid: str) -> None:
        self.pods.pop(uid, None)
        self.victims.pop(uid, None)

    def node_of(self, uid: str) -> str | None:
        found = self.pods.get(uid)
        return found[1] if found else None

    @contextmanager
    def held(self, snapshot: Snapshot, pod: PodInfo) -> Iterator[None]:
        """Put the nominated pods of at least ``pod``'s priority on their nodes for one
        cycle (``RunFilterPluginsWithNominatedPods``)."""
        placed: list[PodInfo] = []
        for uid, (_, node) in list(self.pods.items()):
            other = snapshot.pending_pods.get(uid)  # the informer's latest copy
            if other is None:  # bound or deleted meanwhile
                self.drop(uid)
                continue
            if uid == pod.uid or other.priority < pod.priority or node not in snapshot.nodes:
                continue
            snapshot.assume(other, node)
            placed.append(other)
        try:
            yield
        finally:
            for other in placed:  # pending again, unless deleted or bound meanwhile
                snapshot.forget(other)


class Evictor:
    """Carries out a preemption through the API server (``client`` ``None``: logs only)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.evicted = 0
        """Victims evicted so far."""

    async def preempt(
        self,
        pod: PodInfo,
        candidate: Candidate,
        *,
        events: EventRecorder | None = None,
        gate: Callable[[], list[str]] | None = None,
    ) -> str | None:
        """Evict the victims (each with a ``Preempted`` Event through ``events``), then
        nominate the node; ``None`` when done, else why not. ``gate`` is the scheduler's
        (:meth:`InformedSnapshot.not_ready`): while it names an informer that is not current,
        no further eviction and no nomination is made (the pod retries with its backoff)."""
        for v in candidate.victims:
            held = _held(gate)
            if held is not None:
                return held
            try:
                if self.client is not None:
                    await self.client.evict(v.namespace, v.name, uid=v.uid)
            except NotFound:
                continue  # gone already
            except TooManyRequests as err:
                return f"eviction of {v.key} refused: {err}"
            except KubeError as err:
                return f"eviction of {v.key} failed: {err}"
            self.evicted += 1
            logger.info("preempted %s on %s for %s", v.key, candidate.node, pod.key)
            if events is not None:
                events.preempted(v, pod, candidate.node)
        held = _held(gate)
        if held is not None:
            return held
        if self.client is not None:
            try:
                await self.client.patch(
                    PODS,
                    pod.name,
                    {"status": {"nominatedNodeName": candidate.node}},
                    pod.namespace,
                    sub="status",
                )
            except KubeError as err:
                logger.warning("nominatedNodeName of %s not written: %s", pod.key, err)
        return None


def _held(gate: Callable[[], list[str]] | None) -> str | None:
    """Why a preemption stops here (informers not current), or ``None``."""
    waiting = gate() if gate is not None else []
    return f"held: waiting for {', '.join(waiting)}" if waiting else None
