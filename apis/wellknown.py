"""Kubernetes' own well-known names that the scheduler reads: node labels, taints, resource and
field names (``k8s.io/api/core/v1`` ``well_known_labels.go``, ``well_known_taints.go``).

Koordinator's keys live in :mod:`apis.extension`; these are the Kubernetes side of the contract.
"""

from __future__ import annotations

LABEL_HOSTNAME = "kubernetes.io/hostname"
"""Node label: the node's host name (``v1.LabelHostname``); PodTopologySpread counts per node for
constraints on this key."""
LABEL_TOPOLOGY_ZONE = "topology.kubernetes.io/zone"
"""Node label: the zone (``v1.LabelTopologyZone``)."""

TAINT_NODE_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
"""Taint key the node lifecycle controller puts on cordoned nodes (``v1.TaintNodeUnschedulable``);
a pod tolerating it (effect NoSchedule) may go to an unschedulable node."""

TAINT_EFFECT_NO_SCHEDULE = "NoSchedule"
TAINT_EFFECT_PREFER_NO_SCHEDULE = "PreferNoSchedule"
TAINT_EFFECT_NO_EXECUTE = "NoExecute"
TAINT_EFFECTS = (TAINT_EFFECT_NO_SCHEDULE, TAINT_EFFECT_PREFER_NO_SCHEDULE, TAINT_EFFECT_NO_EXECUTE)

TOLERATION_OP_EXISTS = "Exists"
TOLERATION_OP_EQUAL = "Equal"

FIELD_METADATA_NAME = "metadata.name"
"""The only field ``nodeSelectorTerms[].matchFields`` may name."""

PREEMPT_NEVER = "Never"
"""``spec.preemptionPolicy`` of a pod that never preempts others."""
PREEMPT_LOWER_PRIORITY = "PreemptLowerPriority"
"""``spec.preemptionPolicy`` default."""

DEFAULT_MILLI_CPU_REQUEST = 100
"""``schedutil.DefaultMilliCPURequest``: the cpu a container without a cpu request counts as
when kube-scheduler scores (not when it filters)."""
DEFAULT_MEMORY_REQUEST = 200 * 1024 * 1024
"""``schedutil.DefaultMemoryRequest`` (200 MiB), as above for memory."""


# -- Koordinator keys the scheduler's LoadAware and ElasticQuota plugins read ------------------
# (named as main's apis.scheduling_keys / apis.manager_keys name them, to fold into those)

ANNOTATION_CUSTOM_USAGE_THRESHOLDS = "scheduling.koordinator.sh/usage-thresholds"
"""Node annotation overriding LoadAware's thresholds for that node
(``extension.AnnotationCustomUsageThresholds``)."""
ANNOTATION_CUSTOM_ESTIMATED_SCALING_FACTORS = (
    "scheduling.koordinator.sh/load-estimated-scaling-factors"
)
"""Pod annotation overriding LoadAware's estimator factors
(``extension.AnnotationCustomEstimatedScalingFactors``)."""
ANNOTATION_NODE_RAW_ALLOCATABLE = "node.koordinator.sh/raw-allocatable"
"""Node annotation: the allocatable before Koordinator's amplification
(``extension.AnnotationNodeRawAllocatable``)."""
BATCH_CPU = "kubernetes.io/batch-cpu"
BATCH_MEMORY = "kubernetes.io/batch-memory"
MID_CPU = "kubernetes.io/mid-cpu"
MID_MEMORY = "kubernetes.io/mid-memory"
"""Koordinator's batch and mid resources (``extension.BatchCPU``...)."""

LABEL_QUOTA_PARENT = "quota.scheduling.koordinator.sh/parent"
LABEL_QUOTA_IS_PARENT = "quota.scheduling.koordinator.sh/is-parent"
LABEL_QUOTA_TREE_ID = "quota.scheduling.koordinator.sh/tree-id"
LABEL_QUOTA_ALLOW_LENT = "quota.scheduling.koordinator.sh/allow-lent-resource"
ANNOTATION_QUOTA_SHARED_WEIGHT = "quota.scheduling.koordinator.sh/shared-weight"
ANNOTATION_QUOTA_NAMESPACES = "quota.scheduling.koordinator.sh/namespaces"
"""ElasticQuota tree labels and annotations (``extension.LabelQuotaParent``...)."""
