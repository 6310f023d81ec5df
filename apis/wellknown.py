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
