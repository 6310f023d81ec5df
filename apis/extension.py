"""Koordinator's QoS classes, Kubernetes QoS classes, and the label, annotation and resource keys.

Names and values are Koordinator's contract (``apis/extension`` upstream): a pod labelled for
the Go koordlet means the same to ours.
"""

from __future__ import annotations

from enum import StrEnum

DOMAIN_PREFIX = "koordinator.sh/"

LABEL_POD_QOS = DOMAIN_PREFIX + "qosClass"
"""Pod label carrying the Koordinator QoS class (``LSE``, ``LSR``, ``LS``, ``BE``, ``SYSTEM``)."""
LABEL_CORE_SCHED_GROUP_ID = DOMAIN_PREFIX + "core-sched-group-id"
"""Pod label: the core scheduling group; pods of one group share a cookie (upstream
``apis/slo/v1alpha1`` ``LabelCoreSchedGroupID``)."""
LABEL_CORE_SCHED_POLICY = DOMAIN_PREFIX + "core-sched-policy"
"""Pod label: ``exclusive`` (the pod's UID is its group) or ``none`` (the default cookie)
(``LabelCoreSchedPolicy``); anything else is the default policy."""
CORE_SCHED_POLICY_NONE = "none"
CORE_SCHED_POLICY_EXCLUSIVE = "exclusive"
LABEL_POD_PRIORITY_CLASS = DOMAIN_PREFIX + "priority-class"
"""Pod label carrying the Koordinator priority class (``koord-prod`` and friends)."""


class QoSClass(StrEnum):
    """Koordinator's QoS classes, highest first."""

    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"
    NONE = ""


class KubeQOS(StrEnum):
    """Kubernetes' own QoS classes (``status.qosClass``)."""

    GUARANTEED = "Guaranteed"
    BURSTABLE = "Burstable"
    BESTEFFORT = "BestEffort"


KUBE_QOS_TO_QOS: dict[KubeQOS, QoSClass] = {
    KubeQOS.GUARANTEED: QoSClass.LSR,
    KubeQOS.BURSTABLE: QoSClass.LS,
    KubeQOS.BESTEFFORT: QoSClass.BE,
}
"""The default Koordinator class of a pod that carries no ``koordinator.sh/qosClass`` label, as
the kubelet-free discovery uses it (Guaranteed→LSR, Burstable→LS, BestEffort→BE)."""

LABEL_POD_PRIORITY = DOMAIN_PREFIX + "priority"
"""Pod label carrying the sub-priority within the priority class (Koordinator's
``LabelPodPriority``)."""
LABEL_EVICTION_ENABLED = DOMAIN_PREFIX + "eviction-enabled"
"""Pod label ``"true"``: a non-BE pod agrees to be an eviction victim (``LabelPodEvictEnabled``)."""
ANNOTATION_EVICTION_POLICY = DOMAIN_PREFIX + "eviction-policy"
"""Pod annotation restricting which eviction features may evict it: a JSON list of feature
names (``AnnotationPodEvictPolicy``); absent: no restriction."""
ANNOTATION_EVICTION_PRIORITY = DOMAIN_PREFIX + "eviction-priority"
"""Pod annotation ordering victims before anything else, lower first (an int32; absent or
invalid: 0) (``AnnotationPodEvictionPriority``)."""
ANNOTATION_POD_CPU_BURST = DOMAIN_PREFIX + "cpuBurst"
"""Pod annotation: a JSON ``cpuBurstStrategy`` merged over the node's
(``AnnotationPodCPUBurst``)."""

SCHEDULING_DOMAIN_PREFIX = "scheduling.koordinator.sh/"
ANNOTATION_RESOURCE_STATUS = SCHEDULING_DOMAIN_PREFIX + "resource-status"
"""Pod annotation the scheduler writes: the CPUs (``cpuset``) and NUMA resources it allocated;
the koordlet applies the cpuset to LSR and LSE pods."""

NODE_DOMAIN_PREFIX = "node.koordinator.sh/"
ANNOTATION_POD_RESCTRL = NODE_DOMAIN_PREFIX + "resctrl"
"""Pod annotation: the pod's own resctrl (LLC and memory bandwidth) schema (JSON)."""
ANNOTATION_EXTENDED_RESOURCE_SPEC = NODE_DOMAIN_PREFIX + "extended-resource-spec"
"""Pod annotation koord-manager's webhook writes: the extended-resource requests and limits of
each container as JSON (``{"containers": {NAME: {"requests": {...}, "limits": {...}}}}``), for
the runtime hooks, which see CRI requests, not pod specs (``AnnotationExtendedResourceSpec``)."""
ANNOTATION_CPU_TOPOLOGY = NODE_DOMAIN_PREFIX + "cpu-topology"
"""NodeResourceTopology annotation: every CPU with its core, socket and NUMA node."""
ANNOTATION_CPU_SHARED_POOLS = NODE_DOMAIN_PREFIX + "cpu-shared-pools"
"""NodeResourceTopology annotation: the LS share pool per socket and NUMA node."""
ANNOTATION_NODE_SYSTEM_QOS_RESOURCE = NODE_DOMAIN_PREFIX + "system-qos-resource"
"""Node (and NodeResourceTopology) annotation: the CPUs of SYSTEM QoS pods and whether they are
exclusive, ``{"cpuset": "0-1", "cpusetExclusive": true}`` (``AnnotationNodeSystemQOSResource``)."""
ANNOTATION_NODE_BE_CPU_SHARED_POOLS = NODE_DOMAIN_PREFIX + "be-cpu-shared-pools"
"""NodeResourceTopology annotation: the BE share pool per socket and NUMA node."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
"""The standard label naming the component that manages an object (``koordlet``)."""
