"""Label, annotation and value keys koord-descheduler reads and writes.

Every value is Koordinator's contract (``pkg/descheduler`` and ``apis/extension`` upstream) or the
Kubernetes one it builds on (``sigs.k8s.io/descheduler``, ``k8s.io/api``): a PodMigrationJob or a
Reservation we create reads the same to the Go descheduler and scheduler.
"""

from __future__ import annotations

from apis.extension import DOMAIN_PREFIX, NODE_DOMAIN_PREFIX, SCHEDULING_DOMAIN_PREFIX

DESCHEDULER_DOMAIN_PREFIX = "descheduler.koordinator.sh/"

# Pod annotations the evictor filter reads -----------------------------------------------------
ANNOTATION_EVICT = "descheduler.alpha.kubernetes.io/evict"
"""Pod annotation (any value): evictable whatever the filter's checks say
(``evictions.EvictPodAnnotationKey``)."""
ANNOTATION_EVICTION_COST = SCHEDULING_DOMAIN_PREFIX + "eviction-cost"
"""Pod annotation: an int32, lower evicted first; ``MaxInt32`` never
(``AnnotationEvictionCost``)."""
ANNOTATION_POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
"""Pod annotation: the ReplicaSet controller's deletion cost, an int32
(``core.PodDeletionCost``)."""
ANNOTATION_MIRROR_POD = "kubernetes.io/config.mirror"
"""Pod annotation the kubelet sets on a mirror pod (``kubetypes.ConfigMirrorAnnotationKey``)."""
ANNOTATION_CONFIG_SOURCE = "kubernetes.io/config.source"
"""Pod annotation: where the kubelet got the pod; anything but ``api`` is a static pod
(``kubetypes.ConfigSourceAnnotationKey``)."""
CONFIG_SOURCE_API = "api"
"""``kubetypes.ApiserverSource``."""
SYSTEM_CRITICAL_PRIORITY = 2 * 1_000_000_000
"""``scheduling.SystemCriticalPriority``: pods at or above it are system-critical."""

# PodMigrationJob annotations and labels ----------------------------------------------------------
ANNOTATION_PASSED_ARBITRATION = DESCHEDULER_DOMAIN_PREFIX + "passed-arbitration"
"""PodMigrationJob annotation ``"true"``: the arbitrator let the job run
(``arbitrator.AnnotationPassedArbitration``)."""
ANNOTATION_POD_ARBITRATING = DESCHEDULER_DOMAIN_PREFIX + "pod-arbitrating"
"""Marks a pod under arbitration in memory (``AnnotationPodArbitrating``); never written."""
ANNOTATION_EVICT_REASON = DOMAIN_PREFIX + "evict-reason"
"""PodMigrationJob annotation: why the pod is moved (``evictor.AnnotationEvictReason``)."""
ANNOTATION_EVICT_TRIGGER = DOMAIN_PREFIX + "evict-trigger"
"""PodMigrationJob annotation: the plugin that asked (``evictor.AnnotationEvictTrigger``)."""
LABEL_EVICT_POLICY = DOMAIN_PREFIX + "evict-policy"
"""Pod or PodMigrationJob label choosing the eviction policy (``Eviction``, ``Delete``) for it
(``evictor.LabelEvictPolicy``)."""

# Reservations created for a migration ---------------------------------------------------------
LABEL_CREATED_BY = "app.kubernetes.io/created-by"
"""Reservation label naming its creator (``reservation.LabelCreatedBy``)."""
CREATOR = "koord-descheduler"
"""``reservation.DefaultCreator``: the value of :data:`LABEL_CREATED_BY`."""
LABEL_RESERVATION_ORDER = SCHEDULING_DOMAIN_PREFIX + "reservation-order"
"""Reservation label: Unix milliseconds, earlier reservations preferred
(``extension.LabelReservationOrder``)."""

# Nodes ----------------------------------------------------------------------------------------
ANNOTATION_NODE_RAW_ALLOCATABLE = NODE_DOMAIN_PREFIX + "raw-allocatable"
"""Node annotation: the allocatable before CPU normalization or amplification, a JSON
ResourceList; usage percentages are taken against it when present
(``extension.AnnotationNodeRawAllocatable``)."""

# Workload kinds the controller finder knows ------------------------------------------------------
KIND_REPLICA_SET = "ReplicaSet"
KIND_DEPLOYMENT = "Deployment"
KIND_STATEFUL_SET = "StatefulSet"
KIND_REPLICATION_CONTROLLER = "ReplicationController"
KIND_DAEMON_SET = "DaemonSet"
KIND_JOB = "Job"
"""``batch/v1`` Job: the arbitrator groups PodMigrationJobs of one Job (``arbitrator.JobKind``)."""
