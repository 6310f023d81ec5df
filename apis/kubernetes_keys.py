"""Names Kubernetes itself defines that our components use: core resource names, well-known
labels and taints, the service-account mount, the scheduler's defaults (``k8s.io/api/core/v1``
``well_known_labels.go`` and ``well_known_taints.go``; ``pkg/scheduler/util``)."""

from __future__ import annotations

RESOURCE_CPU = "cpu"
"""``corev1.ResourceCPU``: cores (quantities), milli-cores once read."""
RESOURCE_MEMORY = "memory"
"""``corev1.ResourceMemory``: bytes."""
RESOURCE_PODS = "pods"
"""``corev1.ResourcePods``: a count."""
LABEL_HOSTNAME = "kubernetes.io/hostname"
"""``corev1.LabelHostname``: the node's hostname label; PodTopologySpread counts per node for
constraints on this key."""
LABEL_OS = "kubernetes.io/os"
"""``corev1.LabelOSStable``: the node's operating system."""
ANNOTATION_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
"""``corev1.LastAppliedConfigAnnotation``: a copy of the whole manifest that ``kubectl apply``
leaves on an object."""
ANNOTATION_CONFIG_SEEN = "kubernetes.io/config.seen"
"""The kubelet's ``ConfigFirstSeenAnnotationKey``: when it first saw a pod."""
LABEL_TOPOLOGY_ZONE = "topology.kubernetes.io/zone"
"""``corev1.LabelTopologyZone``: the node's zone."""
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where the kubelet mounts a pod's service account: ``token``, ``ca.crt``, ``namespace``
(``rest.InClusterConfig``)."""
SERVICE_ACCOUNT_TOKEN_PATH = SERVICE_ACCOUNT_DIR + "/token"
"""Where the kubelet mounts a pod's service-account token (``rest.InClusterConfig``)."""
LABEL_OS = "kubernetes.io/os"
"""``corev1.LabelOSStable``: the node's operating system."""
LABEL_ARCH = "kubernetes.io/arch"
"""``corev1.LabelArchStable``: the node's architecture."""

# Taints and tolerations ---------------------------------------------------------------------
TAINT_NODE_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
"""``corev1.TaintNodeUnschedulable``: the taint the node lifecycle controller puts on cordoned
nodes; a pod tolerating it (effect NoSchedule) may go to an unschedulable node."""
TAINT_EFFECT_NO_SCHEDULE = "NoSchedule"
TAINT_EFFECT_PREFER_NO_SCHEDULE = "PreferNoSchedule"
TAINT_EFFECT_NO_EXECUTE = "NoExecute"
TAINT_EFFECTS = (TAINT_EFFECT_NO_SCHEDULE, TAINT_EFFECT_PREFER_NO_SCHEDULE, TAINT_EFFECT_NO_EXECUTE)
"""``corev1.TaintEffect`` values."""
TOLERATION_OP_EXISTS = "Exists"
TOLERATION_OP_EQUAL = "Equal"
"""``corev1.TolerationOperator`` values."""

# Scheduling ------------------------------------------------------------------------------------
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
