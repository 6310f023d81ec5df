"""The evictor: the only way a QoS strategy evicts a workload.

::

    evictor = Evictor(CgroupKillEvictor(host), registry=registry, audit=audit_log)
    outcomes = await evictor.evict(
        [Victim.of_pod(pod, "node memory 82% >= 70%, releasing 1.2 GiB")],
        strategy="memoryevict",
        reason=REASON_MEMORY,
    )

Koordinator's ``Evictor`` (``qosmanager/plugins/util``) evicts a pod through the Eviction API and
remembers it for two minutes; the strategies kill containers through the runtime instead when
``--only-evict-by-api`` is off. Here one :class:`Evictor` holds the policy that every backend
shares, and a :class:`EvictionBackend` does the act:

- **eligibility**: only a ``BE`` workload is a victim, unless a pod opts in with the label
  ``koordinator.sh/eviction-enabled: "true"`` (Koordinator's ``LabelPodEvictEnabled``, read as
  ``PodEvictEnabled`` reads it: exactly ``"true"``). Anything else is refused, whatever a
  strategy asks;
- **dedupe**: a workload evicted (or decided in a dry run) within ``dedupe_window`` seconds
  (Koordinator's expire cache: 120 s) is not evicted again; it is reported ``duplicate`` and the
  strategies count it as a pending release, as upstream counts an ``IsPodEvicted`` pod;
- **cap** (ours, off by default as upstream has none): with ``max_per_round`` > 0, at most that
  many evictions per :meth:`Evictor.evict` call; the rest are reported ``capped`` and wait for
  the next round;
- **dry run** (global, or per call): the decision is made, logged and audited (``decision``
  entries with ``dry_run`` true), nothing is killed;
- every outcome with its reason is audited and logged in one summary line; a done eviction
  counts in ``koordlet_pod_eviction{node, reason}`` (upstream's family: a Go counter without a
  ``_total`` suffix, served here under the same name, see :class:`EvictionMetrics`).

Backends: :class:`CgroupKillEvictor` empties the workload's cgroup
(``koordlet.executor.kill``), for cgroup-discovered pods and host applications in standalone
mode. The Kubernetes Eviction API backend (the Kubernetes issue) implements the same
:class:`EvictionBackend` protocol: ``async evict(victim, *, reason, message)``, raising
:class:`EvictionFailed` when the API refuses.

Errors::

    KoordletError
    └── EvictionFailed   the backend could not evict one victim (the others still run)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from apis.extension import ANNOTATION_EVICTION_POLICY as ANNOTATION_EVICTION_POLICY
from apis.extension import ANNOTATION_EVICTION_PRIORITY as ANNOTATION_EVICTION_PRIORITY
from apis.extension import LABEL_EVICTION_ENABLED as LABEL_EVICTION_ENABLED
from apis.extension import LABEL_POD_PRIORITY as LABEL_POD_PRIORITY
from apis.extension import QoSClass
from apis.records import frozen
from koordlet.errors import InvalidValueError, KoordletError
from koordlet.executor.kill import DEFAULT_DEADLINE, KillResult, kill_cgroup

if TYPE_CHECKING:
    from koordlet.prom import CollectorRegistry, Metric
    from koordlet.statesinformer.model import HostAppInfo, PodInfo
    from koordlet.system.host import Host

logger = logging.getLogger(__name__)


def eviction_priority(pod: PodInfo) -> int:
    """``koordinator.sh/eviction-priority`` as an int32; 0 when absent or invalid."""
    try:
        value = int(pod.annotations.get(ANNOTATION_EVICTION_PRIORITY, "0"))
    except ValueError:
        return 0
    return value if -(2**31) <= value < 2**31 else 0


def label_priority(pod: PodInfo, default: int) -> int:
    """``koordinator.sh/priority`` as an integer; ``default`` when absent or invalid."""
    try:
        return int(pod.labels[LABEL_POD_PRIORITY])
    except (KeyError, ValueError):
        return default


REASON_MEMORY = "EvictPodByNodeMemoryUsage"
"""Reason of memory eviction (Koordinator's ``resourceexecutor.EvictPodByNodeMemoryUsage``)."""
REASON_MEMORY_DISTRESS = "EvictPodByNodeMemoryDistress"
"""Reason of memory eviction by the distress trigger (ours: memory PSI or reclaim rate while
usage is below the threshold)."""
REASON_BE_CPU_SATISFACTION = "EvictPodByBECPUSatisfaction"
"""Reason of CPU eviction by BE satisfaction."""
EVICT_REASON_PREFIX = "trigger by koordlet feature "
"""Upstream's prefix of a task's reason (``trigger by koordlet feature BEMemoryEvict``)."""

DEFAULT_DEDUPE_WINDOW = 120.0
"""Seconds a workload is not evicted again (Koordinator's evictor cache expiry, 2 min)."""
DEFAULT_MAX_PER_ROUND = 0
"""Evictions per :meth:`Evictor.evict` call at most; 0: no cap, as Koordinator (see
docs/qos-eviction.md)."""

Status = Literal["evicted", "dry_run", "duplicate", "capped", "refused", "failed", "gone"]


class EvictionFailed(KoordletError):
    """A backend could not evict a victim; ``victim`` is its key."""

    def __init__(self, victim: str, message: str) -> None:
        self.victim = victim
        super().__init__(f"{victim}: {message}")


@frozen
class Victim:
    """One workload a strategy wants evicted, with its own reason."""

    key: str
    """``pod/<uid>`` or ``hostapp/<name>``: the dedupe key."""
    name: str
    """``namespace/name`` of a pod, the name of a host application."""
    qos: QoSClass
    """Koordinator QoS class."""
    cgroup_dir: str
    """Its cgroup, relative to a controller root."""
    message: str = ""
    """Why this one (``used 812 MiB, priority 5000``)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Pod labels (opt-in); empty for host applications."""
    pod: PodInfo | None = None
    """The pod, for backends that need it (the Eviction API: namespace, name, UID)."""
    release: float = 0.0
    """What evicting it frees in the strategy's unit (bytes, milli-cores), for the record."""

    @classmethod
    def of_pod(cls, pod: PodInfo, message: str = "", *, release: float = 0.0) -> Victim:
        name = f"{pod.namespace}/{pod.name}" if pod.namespace else pod.name
        return cls(
            f"pod/{pod.uid}", name, pod.qos, pod.cgroup_dir, message, pod.labels, pod, release
        )

    @classmethod
    def of_host_app(cls, app: HostAppInfo, message: str = "", *, release: float = 0.0) -> Victim:
        return cls(
            f"hostapp/{app.name}", app.name, app.qos, app.cgroup_dir, message, {}, None, release
        )

    @property
    def opted_in(self) -> bool:
        """Whether the workload carries ``koordinator.sh/eviction-enabled: "true"``."""
        return self.labels.get(LABEL_EVICTION_ENABLED) == "true"


@frozen
class Outcome:
    """What happened to one victim."""

    victim: Victim
    status: Status
    """``evicted``; ``dry_run`` (decided, nothing done); ``duplicate`` (evicted within the dedupe
    window: a pending release); ``capped`` (over the round's cap); ``refused`` (not BE and not
    opted in); ``failed`` (the backend raised); ``gone`` (the workload had already ended)."""
    detail: str = ""
    """The backend's account (``cgroup.kill``, ``sigkill: 3 processes``) or the error."""

    @property
    def counts_as_released(self) -> bool:
        """True when the strategy may count the victim's release (done, decided or pending)."""
        return self.status in ("evicted", "dry_run", "duplicate", "gone")


EvictionListener = Callable[[str, str, Sequence[Outcome], bool], None]
"""``listener(strategy, reason, outcomes, dry_run)``: told of every eviction call's outcomes."""


class EvictionBackend(Protocol):
    """Performs one eviction; the :class:`Evictor` has decided it may."""

    name: str
    """``cgroup-kill``, ``eviction-api``..."""

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        """Evict now; returns a short account for the log and audit. Raises
        :class:`EvictionFailed` when it could not; a workload already gone is not a failure
        (return ``"gone"``)."""
        ...


class AuditSink(Protocol):
    """The part of ``koordlet.executor.audit.AuditLog`` the evictor uses."""

    def record(
        self,
        kind: Literal["write", "evict", "decision"],
        *,
        strategy: str = "",
        reason: str = "",
        path: str = "",
        knob: str = "",
        old: str = "",
        new: str = "",
        dry_run: bool = False,
        detail: Mapping[str, Any] | None = None,
    ) -> object: ...


class CgroupKillEvictor:
    """Standalone backend: kills every process of the victim's cgroup (see
    ``koordlet.executor.kill``), in a worker thread.

    :param host: a call returning the current host (paths and cgroup layout).
    :param deadline: seconds to keep killing before reporting the cgroup not empty.
    """

    name = "cgroup-kill"

    def __init__(
        self,
        host: Callable[[], Host],
        *,
        deadline: float = DEFAULT_DEADLINE,
        kill: Callable[..., KillResult] = kill_cgroup,
    ) -> None:
        self._host = host
        self._deadline = deadline
        self._kill = kill

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        layout = self._host().layout
        try:
            result = await asyncio.to_thread(
                self._kill, layout, victim.cgroup_dir, deadline=self._deadline
            )
        except (InvalidValueError, KoordletError) as err:
            raise EvictionFailed(victim.key, str(err)) from err
        if result.gone:
            return "gone"
        if not result.emptied:
            raise EvictionFailed(
                victim.key,
                f"{result.method}: {len(result.remaining)} processes left after "
                f"{result.rounds} rounds ({', '.join(map(str, result.remaining[:8]))})",
            )
        if result.method == "cgroup.kill":
            return "cgroup.kill"
        return f"{result.method}: {result.signalled} processes in {result.rounds} rounds"


class EvictionMetrics:
    """``koordlet_pod_eviction{node, reason}``: evictions done by the koordlet.

    Upstream's family is a Go counter named ``koordlet_pod_eviction`` (no ``_total``);
    prometheus-client would append ``_total`` to a counter, so this collector serves the exact
    upstream name as an untyped family whose value only grows. Dry-run decisions are not
    counted here (nothing was evicted); they are in ``koordlet_pod_eviction_dry_run``.
    """

    def __init__(self, node_name: str = "") -> None:
        self.node_name = node_name
        self.evicted: dict[str, int] = {}
        self.dry_run: dict[str, int] = {}
        self.not_evicted: dict[tuple[str, str], int] = {}
        """``(reason, status)`` → evictions that did not happen: ``failed`` (the backend could
        not: processes left, the Eviction API refused) or ``refused`` (the victim is not
        evictable: its QoS and no opt-in). ``koordlet_pod_eviction_failures_total``."""

    def collect(self) -> Iterator[Metric]:
        from koordlet.prom import CounterMetricFamily, UnknownMetricFamily

        failures = CounterMetricFamily(
            "koordlet_pod_eviction_failures",
            "Evictions decided that did not happen: status failed (the backend could not) or "
            "refused (the victim may not be evicted).",
            labels=("node", "reason", "status"),
        )
        for (reason, status), count in sorted(self.not_evicted.items()):
            failures.add_metric((self.node_name, reason, status), float(count))
        yield failures

        for name, doc, values in (
            ("koordlet_pod_eviction", "Number of eviction launched by koordlet", self.evicted),
            (
                "koordlet_pod_eviction_dry_run",
                "Evictions decided but not performed (dry run)",
                self.dry_run,
            ),
        ):
            family = UnknownMetricFamily(name, doc, labels=("node", "reason"))
            for reason, count in sorted(values.items()):
                family.add_metric((self.node_name, reason), float(count))
            yield family


class Evictor:
    """The policy shared by every eviction: eligibility, dedupe, cap, dry run, audit, metrics.

    :param backend: performs the evictions.
    :param max_per_round: evictions per :meth:`evict` call at most; 0 (the default): no cap,
        as upstream.
    :param dedupe_window: seconds during which a workload is not evicted again.
    :param dry_run: decide, log and audit, evict nothing (the global ``--dry-run``).
    :param audit: where outcomes are recorded (the daemon's audit log); None: logs only.
    :param registry: where :class:`EvictionMetrics` is registered; None: not exported.
    :param node_name: the ``node`` label.
    :param clock: monotonic seconds, for the dedupe window.
    """

    def __init__(
        self,
        backend: EvictionBackend,
        *,
        max_per_round: int = DEFAULT_MAX_PER_ROUND,
        dedupe_window: float = DEFAULT_DEDUPE_WINDOW,
        dry_run: bool = False,
        audit: AuditSink | None = None,
        registry: CollectorRegistry | None = None,
        node_name: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_per_round < 0:
            raise InvalidValueError(f"max_per_round must not be negative, got {max_per_round}")
        if dedupe_window < 0:
            raise InvalidValueError(f"dedupe_window must not be negative, got {dedupe_window}")
        self.backend = backend
        self.max_per_round = max_per_round
        self.dedupe_window = dedupe_window
        self.dry_run = dry_run
        self.audit = audit
        self.metrics = EvictionMetrics(node_name)
        if registry is not None:
            registry.register(self.metrics)
        self._clock = clock
        self._recent: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._listeners: list[EvictionListener] = []
        self.last: list[dict[str, Any]] = []
        """The last call's outcomes, plain data for ``/debug/qos``."""

    # Queries -------------------------------------------------------------------------------

    @staticmethod
    def eligible(victim: Victim) -> bool:
        """BE, or opted in with ``koordinator.sh/eviction-enabled: "true"``."""
        return victim.qos is QoSClass.BE or victim.opted_in

    def recently_evicted(self, key: str) -> bool:
        """Whether ``key`` (``pod/<uid>``) was evicted or decided within the dedupe window."""
        at = self._recent.get(key)
        return at is not None and self._clock() - at < self.dedupe_window

    def recent_keys(self) -> frozenset[str]:
        """Keys within the dedupe window (for a strategy's victim selection)."""
        self._expire()
        return frozenset(self._recent)

    def add_listener(self, listener: EvictionListener) -> None:
        """Call ``listener(strategy, reason, outcomes, dry_run)`` on the event loop after every
        :meth:`evict` call that had outcomes (the BE eviction Node condition listens); a
        listener that raises is logged, never fails the eviction."""
        self._listeners.append(listener)

    # Evicting ------------------------------------------------------------------------------

    async def evict(
        self,
        victims: Sequence[Victim],
        *,
        strategy: str,
        reason: str,
        dry_run: bool = False,
    ) -> list[Outcome]:
        """Evict ``victims`` in order, within the policy; one :class:`Outcome` each.

        ``reason`` is the metric label and audit reason (``EvictPodByNodeMemoryUsage``); each
        victim's ``message`` says why that one. ``dry_run`` adds to the global dry run.
        Never raises for one victim's failure: it is reported ``failed``.
        """
        dry = dry_run or self.dry_run
        async with self._lock:  # two strategies never interleave their rounds' budgets
            self._expire()
            outcomes: list[Outcome] = []
            acted = 0
            for victim in victims:
                outcome = await self._one(victim, strategy, reason, dry, acted)
                if outcome.status in ("evicted", "dry_run", "failed", "gone"):
                    acted += 1
                outcomes.append(outcome)
            self._summarize(outcomes, strategy, reason, dry)
        if outcomes:
            for listener in tuple(self._listeners):
                try:
                    listener(strategy, reason, outcomes, dry)
                except Exception:  # a listener's bug must not undo or hide an eviction
                    logger.exception("eviction listener %r failed", listener)
        return outcomes

    async def _one(
        self, victim: Victim, strategy: str, reason: str, dry: bool, acted: int
    ) -> Outcome:
        if not self.eligible(victim):
            return self._record(
                Outcome(victim, "refused", f"QoS {victim.qos or 'none'} and not opted in"),
                strategy,
                reason,
                dry,
            )
        if self.recently_evicted(victim.key):
            return Outcome(victim, "duplicate", "evicted within the dedupe window")
        if self.max_per_round and acted >= self.max_per_round:
            return Outcome(victim, "capped", f"over the cap of {self.max_per_round} a round")
        if dry:
            self._recent[victim.key] = self._clock()
            self.metrics.dry_run[reason] = self.metrics.dry_run.get(reason, 0) + 1
            return self._record(Outcome(victim, "dry_run", "dry run"), strategy, reason, dry)
        try:
            detail = await self.backend.evict(victim, reason=reason, message=victim.message)
        except EvictionFailed as err:
            return self._record(Outcome(victim, "failed", str(err)), strategy, reason, dry)
        self._recent[victim.key] = self._clock()
        if detail == "gone":
            return self._record(Outcome(victim, "gone", "already ended"), strategy, reason, dry)
        self.metrics.evicted[reason] = self.metrics.evicted.get(reason, 0) + 1
        return self._record(Outcome(victim, "evicted", detail), strategy, reason, dry)

    def _record(self, outcome: Outcome, strategy: str, reason: str, dry: bool) -> Outcome:
        if outcome.status in ("failed", "refused"):
            key = (reason, outcome.status)
            self.metrics.not_evicted[key] = self.metrics.not_evicted.get(key, 0) + 1
        if self.audit is not None:
            v = outcome.victim
            self.audit.record(
                "decision" if outcome.status in ("dry_run", "refused") else "evict",
                strategy=strategy,
                reason=f"{reason}: {v.message}" if v.message else reason,
                path=v.cgroup_dir,
                old=v.name,
                new=outcome.status,
                dry_run=dry,
                detail={
                    "victim": v.key,
                    "qos": str(v.qos),
                    "status": outcome.status,
                    "backend": self.backend.name,
                    "detail": outcome.detail,
                    "release": v.release,
                },
            )
        return outcome

    def _summarize(self, outcomes: list[Outcome], strategy: str, reason: str, dry: bool) -> None:
        self.last = [
            {"victim": o.victim.key, "name": o.victim.name, "status": o.status, "detail": o.detail}
            for o in outcomes
        ]
        if not outcomes:
            return
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        failed = [o for o in outcomes if o.status in ("failed", "refused")]
        log = logger.warning if failed else logger.info
        log(
            "%s%s: %s %s (%s)%s",
            strategy,
            " [dry run]" if dry else "",
            reason,
            ", ".join(f"{n} {s}" for s, n in counts.items()),
            ", ".join(f"{o.victim.name}={o.status}" for o in outcomes[:10]),
            "; " + "; ".join(o.detail for o in failed[:3]) if failed else "",
        )

    def _expire(self) -> None:
        now = self._clock()
        for key in [k for k, at in self._recent.items() if now - at >= self.dedupe_window]:
            del self._recent[key]

    def describe(self) -> dict[str, Any]:
        """Plain data for ``/debug/qos``."""
        return {
            "backend": self.backend.name,
            "dry_run": self.dry_run,
            "max_per_round": self.max_per_round,
            "dedupe_window": self.dedupe_window,
            "recent": sorted(self.recent_keys()),
            "evicted": dict(self.metrics.evicted),
            "last": list(self.last),
        }


def keys_of(outcomes: Iterable[Outcome], *statuses: Status) -> list[str]:
    """Victim keys of the outcomes with one of ``statuses``."""
    return [o.victim.key for o in outcomes if o.status in statuses]
