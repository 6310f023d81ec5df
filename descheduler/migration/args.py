"""``MigrationControllerArgs`` (``descheduler/v1alpha2``): read, defaulted and validated.

Defaults are upstream's ``SetDefaults_MigrationControllerArgs`` (``pkg/descheduler/apis/config/
v1alpha2/defaults.go``): ``maxConcurrentReconciles`` 1, ``maxMigratingPerNode`` 2,
``defaultJobMode`` ``ReservationFirst``, ``defaultJobTTL`` 5m, ``schedulerNames``
``[koord-scheduler]``, ``evictionPolicy`` ``Eviction``, ``evictQPS`` 10, ``evictBurst`` 1,
``objectLimiters`` ``{workload: {duration: 5m}}``, ``arbitrationArgs`` ``{enabled: true,
interval: 500ms}``. Validation follows ``ValidateMigrationControllerArgs``: a known job mode and
eviction policy, no negative ``maxMigratingPer*``/``maxMigratingGlobally``, ``evictBurst`` >= 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from apis.podmigrationjob import MODE_RESERVATION_FIRST, MODES
from apis.records import frozen
from descheduler.readers import Fields
from descheduler.selectors import Selector

NAME = "MigrationController"
POLICY_EVICTION = "Eviction"
"""``migrationevictor.NativeEvictorName``: the policy/v1 Eviction API (honours PDBs)."""
POLICY_DELETE = "Delete"
"""A plain DELETE of the pod (no PDB check)."""
POLICIES = (POLICY_EVICTION, POLICY_DELETE)
LIMIT_WORKLOAD = "workload"
"""``MigrationLimitObjectWorkload``."""
LIMIT_NAMESPACE = "namespace"
"""v1.6's namespace-level object limiter."""
DEFAULT_SCHEDULER = "koord-scheduler"


@frozen
class ObjectLimiter:
    """``MigrationObjectLimiter``: at most ``max_migrating`` evictions of one object in
    ``duration_s``."""

    duration_s: float
    """``duration``: the window (0: no limit)."""
    max_migrating: int | str | None = None
    """``maxMigrating`` (an int or ``"10%"``); ``None``: ``maxMigratingPerWorkload``'s rule."""


@frozen
class MigrationControllerArgs:
    """Everything the MigrationController, its arbitrator and its evictor filter read."""

    dry_run: bool = False
    """``dryRun``: decide everything, create no Reservation and evict nothing."""
    max_concurrent_reconciles: int = 1
    """``maxConcurrentReconciles``."""
    evict_failed_bare_pods: bool = False
    """``evictFailedBarePods``: a pod without owners may move when it has Failed."""
    evict_all_bare_pods: bool = False
    """``evictAllBarePods``: any pod without owners may move."""
    evict_local_storage_pods: bool = False
    """``evictLocalStoragePods``: pods with emptyDir or hostPath volumes may move."""
    evict_system_critical_pods: bool = False
    """``evictSystemCriticalPods``: pods at system-critical priority may move."""
    ignore_pvc_pods: bool = False
    """``ignorePvcPods``: pods with a PersistentVolumeClaim never move."""
    priority_threshold_value: int | None = None
    """``priorityThreshold.value``: only pods below it move."""
    priority_threshold_name: str = ""
    """``priorityThreshold.name``: a PriorityClass whose value is the threshold."""
    label_selector: Selector | None = None
    """``labelSelector``: only matching pods move."""
    namespaces_include: tuple[str, ...] = ()
    """``namespaces.include``."""
    namespaces_exclude: tuple[str, ...] = ()
    """``namespaces.exclude``."""
    node_fit: bool = False
    """``nodeFit``: a pod moves only if it fits some other node."""
    node_selector: Selector | None = None
    """``nodeSelector`` (``labels.Parse`` form): the nodes ``nodeFit`` considers."""
    max_migrating_per_node: int = 2
    """``maxMigratingPerNode`` (0: no limit)."""
    max_migrating_per_namespace: int = 0
    """``maxMigratingPerNamespace`` (0: no limit)."""
    max_migrating_globally: int = 0
    """``maxMigratingGlobally`` (0: no limit)."""
    max_migrating_per_workload: int | str | None = None
    """``maxMigratingPerWorkload`` (int or percentage; ``None``: by replicas)."""
    max_unavailable_per_workload: int | str | None = None
    """``maxUnavailablePerWorkload`` (int or percentage; ``None``: by replicas)."""
    skip_check_expected_replicas: bool = False
    """``skipCheckExpectedReplicas``."""
    object_limiters: Mapping[str, ObjectLimiter] = field(
        default_factory=lambda: {LIMIT_WORKLOAD: ObjectLimiter(300.0)}
    )
    """``objectLimiters`` by object type (``workload``, ``namespace``)."""
    default_job_mode: str = MODE_RESERVATION_FIRST
    """``defaultJobMode``."""
    default_job_ttl_s: float = 300.0
    """``defaultJobTTL``."""
    scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER,)
    """``schedulerNames``: in ReservationFirst mode only pods of these schedulers move."""
    evict_qps: float = 10.0
    """``evictQPS``: evictions per second (0 or less: unlimited)."""
    evict_burst: int = 1
    """``evictBurst``."""
    eviction_policy: str = POLICY_EVICTION
    """``evictionPolicy``: ``Eviction`` (default, the Eviction API) or ``Delete``."""
    default_delete_options: Mapping[str, Any] | None = None
    """``defaultDeleteOptions``: ``metav1.DeleteOptions`` for jobs that carry none."""
    arbitration_enabled: bool = True
    """``arbitrationArgs.enabled``."""
    arbitration_interval_s: float = 0.5
    """``arbitrationArgs.interval``."""


_KEYS = (
    "dryRun",
    "maxConcurrentReconciles",
    "evictFailedBarePods",
    "evictAllBarePods",
    "evictLocalStoragePods",
    "evictSystemCriticalPods",
    "ignorePvcPods",
    "priorityThreshold",
    "labelSelector",
    "namespaces",
    "nodeFit",
    "nodeSelector",
    "maxMigratingPerNode",
    "maxMigratingPerNamespace",
    "maxMigratingGlobally",
    "maxMigratingPerWorkload",
    "maxUnavailablePerWorkload",
    "skipCheckExpectedReplicas",
    "objectLimiters",
    "defaultJobMode",
    "defaultJobTTL",
    "schedulerNames",
    "evictQPS",
    "evictBurst",
    "evictionPolicy",
    "defaultDeleteOptions",
    "arbitrationArgs",
)


def _qps(f: Fields, qps: Any) -> float:
    """``evictQPS``: a ``Float64OrString`` (``10``, ``"0.5"``), 10 when absent."""
    if qps is None:
        return 10.0
    if isinstance(qps, bool) or not isinstance(qps, int | float):
        raise f.error("evictQPS", f"must be a number, got {qps!r}")
    return float(qps)


def parse_args(
    raw: Mapping[str, Any] | None, source: str, path: str = "args"
) -> MigrationControllerArgs:
    """Read, default and validate. Raises :class:`~descheduler.errors.ConfigError`."""
    f = Fields(raw, source, path)
    f.warn_unknown(_KEYS)
    pt = f.sub("priorityThreshold")
    pt.warn_unknown(("value", "name"))
    ns = f.sub("namespaces")
    ns.warn_unknown(("include", "exclude"))
    limiters: dict[str, ObjectLimiter] = {}
    lf = f.sub("objectLimiters")
    for kind in lf.raw:
        if kind not in (LIMIT_WORKLOAD, LIMIT_NAMESPACE):
            raise lf.error(
                str(kind), f"unknown object type (known: {LIMIT_WORKLOAD}, {LIMIT_NAMESPACE})"
            )
        one = lf.sub(str(kind))
        one.warn_unknown(("duration", "maxMigrating"))
        limiters[str(kind)] = ObjectLimiter(
            one.duration("duration", 0.0) or 0.0, one.int_or_percent("maxMigrating")
        )
    if not limiters:
        limiters = {LIMIT_WORKLOAD: ObjectLimiter(300.0)}
    arb = f.sub("arbitrationArgs")
    arb.warn_unknown(("enabled", "interval"))
    qps: Any = f.raw.get("evictQPS")
    if isinstance(qps, str):
        try:
            qps = float(qps)
        except ValueError as err:
            raise f.error("evictQPS", f"must be a number, got {qps!r}") from err
    delete_options = f.raw.get("defaultDeleteOptions")
    if delete_options is not None and not isinstance(delete_options, Mapping):
        raise f.error("defaultDeleteOptions", "must be a DeleteOptions object")
    for key in ("maxMigratingPerNode", "maxMigratingPerNamespace", "maxMigratingGlobally"):
        value = f.integer(key, None)
        if value is not None and value < 0:
            raise f.error(key, f"{key} should be greater or equal 0")
    burst = f.integer("evictBurst", 1) or 0
    if burst < 1:
        raise f.error("evictBurst", "must be at least 1")
    names = f.strings("schedulerNames") or (DEFAULT_SCHEDULER,)
    return MigrationControllerArgs(
        dry_run=f.boolean("dryRun", False),
        max_concurrent_reconciles=f.integer("maxConcurrentReconciles", 1, minimum=1) or 1,
        evict_failed_bare_pods=f.boolean("evictFailedBarePods", False),
        evict_all_bare_pods=f.boolean("evictAllBarePods", False),
        evict_local_storage_pods=f.boolean("evictLocalStoragePods", False),
        evict_system_critical_pods=f.boolean("evictSystemCriticalPods", False),
        ignore_pvc_pods=f.boolean("ignorePvcPods", False),
        priority_threshold_value=pt.integer("value", None),
        priority_threshold_name=pt.string("name"),
        label_selector=f.label_selector("labelSelector"),
        namespaces_include=ns.strings("include"),
        namespaces_exclude=ns.strings("exclude"),
        node_fit=f.boolean("nodeFit", False),
        node_selector=f.selector_string("nodeSelector"),
        max_migrating_per_node=f.integer("maxMigratingPerNode", 2) or 0,
        max_migrating_per_namespace=f.integer("maxMigratingPerNamespace", 0) or 0,
        max_migrating_globally=f.integer("maxMigratingGlobally", 0) or 0,
        max_migrating_per_workload=f.int_or_percent("maxMigratingPerWorkload"),
        max_unavailable_per_workload=f.int_or_percent("maxUnavailablePerWorkload"),
        skip_check_expected_replicas=f.boolean("skipCheckExpectedReplicas", False),
        object_limiters=limiters,
        default_job_mode=f.string("defaultJobMode", MODE_RESERVATION_FIRST, choices=MODES)
        or MODE_RESERVATION_FIRST,
        default_job_ttl_s=f.duration("defaultJobTTL", 300.0) or 0.0,
        scheduler_names=names,
        evict_qps=_qps(f, qps),
        evict_burst=burst,
        eviction_policy=f.string("evictionPolicy", POLICY_EVICTION, choices=POLICIES)
        or POLICY_EVICTION,
        default_delete_options=None if delete_options is None else dict(delete_options),
        # upstream defaults Enabled to true only when arbitrationArgs is absent altogether
        arbitration_enabled=arb.boolean("enabled", not f.has("arbitrationArgs")),
        arbitration_interval_s=arb.duration("interval", 0.5) or 0.5,
    )
