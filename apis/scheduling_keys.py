"""Label, annotation and resource keys koord-scheduler reads and writes.

Every value is Koordinator's contract (``apis/extension``, ``apis/scheduling``, ``apis/quota``
upstream) or the scheduler-plugins one it builds on (``scheduling.sigs.k8s.io``): a pod annotated
by our scheduler reads the same to the Go koordlet and descheduler.
"""

from __future__ import annotations

from apis.extension import NODE_DOMAIN_PREFIX, SCHEDULING_DOMAIN_PREFIX

QUOTA_DOMAIN_PREFIX = "quota.scheduling.koordinator.sh/"
GANG_DOMAIN_PREFIX = "gang.scheduling.koordinator.sh/"
KUBELET_DOMAIN_PREFIX = "kubelet.koordinator.sh/"

# Pod annotations the scheduler reads or writes ------------------------------------------------
ANNOTATION_RESOURCE_SPEC = SCHEDULING_DOMAIN_PREFIX + "resource-spec"
"""Pod annotation: ``{"requiredCPUBindPolicy", "preferredCPUBindPolicy",
"preferredCPUExclusivePolicy"}``."""
ANNOTATION_DEVICE_ALLOCATED = SCHEDULING_DOMAIN_PREFIX + "device-allocated"
"""Pod annotation the scheduler writes: ``{"gpu": [{"minor": 0, "resources": {...}}]}``."""
LABEL_GPU_ISOLATION_PROVIDER = "koordinator.sh/gpu-isolation-provider"
"""Pod label: who isolates a shared GPU inside the container (upstream
``LabelGPUIsolationProvider``)."""
GPU_ISOLATION_PROVIDER_HAMI_CORE = "HAMi-core"
"""``LabelGPUIsolationProvider`` value: HAMi's in-container library (upstream
``GPUIsolationProviderHAMICore``)."""
ANNOTATION_RESERVATION_ALLOCATED = SCHEDULING_DOMAIN_PREFIX + "reservation-allocated"
"""Pod annotation the scheduler writes: ``{"name": ..., "uid": ...}`` of the consumed
Reservation."""
ANNOTATION_RESERVATION_AFFINITY = SCHEDULING_DOMAIN_PREFIX + "reservation-affinity"
"""Pod annotation: which reservations the pod may (and must) use."""
ANNOTATION_RESERVE_POD = SCHEDULING_DOMAIN_PREFIX + "reserve-pod"
"""Reserve pod annotation, ``"true"`` (upstream ``AnnotationReservePod``)."""
ANNOTATION_RESERVATION_NAME = SCHEDULING_DOMAIN_PREFIX + "reservation-name"
"""Reserve pod annotation: the Reservation's name."""
ANNOTATION_RESERVATION_NODE = SCHEDULING_DOMAIN_PREFIX + "reservation-node"
"""Reserve pod annotation: the node ``spec.template.spec.nodeName`` asks for."""
ANNOTATION_RESTRICTED_OPTIONS = SCHEDULING_DOMAIN_PREFIX + "reservation-restricted-options"
"""Reservation annotation: ``{"resources": [...]}`` the Restricted policy applies to."""
ANNOTATION_CUSTOM_USAGE_THRESHOLDS = SCHEDULING_DOMAIN_PREFIX + "usage-thresholds"
"""Node annotation overriding LoadAware's thresholds for that node
(``extension.AnnotationCustomUsageThresholds``)."""
ANNOTATION_CUSTOM_ESTIMATED_SCALING_FACTORS = (
    SCHEDULING_DOMAIN_PREFIX + "load-estimated-scaling-factors"
)
"""Pod annotation overriding LoadAware's estimator factors
(``extension.AnnotationCustomEstimatedScalingFactors``)."""

# Gangs (Coscheduling) -------------------------------------------------------------------------
LABEL_POD_GROUP = "pod-group.scheduling.sigs.k8s.io"
"""Pod label naming its PodGroup (scheduler-plugins' ``PodGroupLabel``)."""
ANNOTATION_GANG_NAME = GANG_DOMAIN_PREFIX + "name"
"""Pod annotation naming its gang (without a PodGroup object)."""
ANNOTATION_GANG_MIN = GANG_DOMAIN_PREFIX + "min-available"
"""Pod annotation: the gang's minimum member count."""
ANNOTATION_GANG_WAIT = GANG_DOMAIN_PREFIX + "waiting-time"
"""Pod annotation: how long the gang waits for its members (a Go duration)."""
ANNOTATION_GANG_MODE = GANG_DOMAIN_PREFIX + "mode"
"""Pod annotation: ``Strict`` or ``NonStrict``."""
ANNOTATION_GANG_TIMEOUT = GANG_DOMAIN_PREFIX + "timeout"
"""Pod annotation ``"true"``: the gang timed out."""

# Elastic quotas ---------------------------------------------------------------------------------
LABEL_QUOTA_NAME = QUOTA_DOMAIN_PREFIX + "name"
"""Pod label naming its ElasticQuota."""
LABEL_PREEMPTIBLE = QUOTA_DOMAIN_PREFIX + "preemptible"
"""Pod label; ``"false"`` makes the pod non-preemptible: it must fit within its quota's min."""
LABEL_QUOTA_PARENT = QUOTA_DOMAIN_PREFIX + "parent"
"""ElasticQuota label naming its parent quota."""
LABEL_QUOTA_IS_PARENT = QUOTA_DOMAIN_PREFIX + "is-parent"
"""ElasticQuota label ``"true"``: the quota has children."""
LABEL_QUOTA_TREE_ID = QUOTA_DOMAIN_PREFIX + "tree-id"
"""ElasticQuota (and ElasticQuotaProfile) label: the quota tree it belongs to."""
LABEL_QUOTA_IS_ROOT = QUOTA_DOMAIN_PREFIX + "is-root"
"""ElasticQuota label ``"true"``: the root of a profile's tree."""
LABEL_QUOTA_PROFILE = QUOTA_DOMAIN_PREFIX + "profile"
"""ElasticQuota label naming the ElasticQuotaProfile that made it."""
LABEL_QUOTA_ALLOW_LENT = QUOTA_DOMAIN_PREFIX + "allow-lent-resource"
"""ElasticQuota label; ``"false"`` keeps its unused min from being lent."""
ANNOTATION_QUOTA_SHARED_WEIGHT = QUOTA_DOMAIN_PREFIX + "shared-weight"
"""ElasticQuota annotation: the weight of its share of the parent's spare resources."""
ANNOTATION_QUOTA_NAMESPACES = QUOTA_DOMAIN_PREFIX + "namespaces"
"""ElasticQuota annotation: a JSON list of namespaces whose pods use it."""
ANNOTATION_QUOTA_TOTAL_RESOURCE = QUOTA_DOMAIN_PREFIX + "total-resource"
"""ElasticQuota annotation the profile controller writes: the tree's total resources."""

# Node and NodeResourceTopology keys ---------------------------------------------------------------
LABEL_NODE_CPU_BIND_POLICY = NODE_DOMAIN_PREFIX + "cpu-bind-policy"
"""Node label: the CPU bind policy every LSR/LSE pod on the node gets."""
LABEL_NUMA_TOPOLOGY_POLICY = NODE_DOMAIN_PREFIX + "numa-topology-policy"
"""Node label: the NUMA topology policy (``SingleNUMANode``, ``Restricted``...)."""
LABEL_NUMA_ALLOCATE_STRATEGY = NODE_DOMAIN_PREFIX + "numa-allocate-strategy"
"""Node label: ``MostAllocated`` or ``LeastAllocated`` NUMA node choice."""
ANNOTATION_NODE_RAW_ALLOCATABLE = NODE_DOMAIN_PREFIX + "raw-allocatable"
"""Node annotation: the allocatable before Koordinator's amplification
(``extension.AnnotationNodeRawAllocatable``)."""
ANNOTATION_POD_CPU_ALLOCS = NODE_DOMAIN_PREFIX + "pod-cpu-allocs"
"""NodeResourceTopology annotation: CPUs the kubelet's static policy pinned, per pod."""
ANNOTATION_KUBELET_CPU_MANAGER_POLICY = KUBELET_DOMAIN_PREFIX + "cpu-manager-policy"
"""NodeResourceTopology annotation: the kubelet's CPU manager policy, options and
``reservedCPUs``."""

# Device resources ---------------------------------------------------------------------------------
RESOURCE_GPU = "koordinator.sh/gpu"
"""Shared GPU, in percent of one card (upstream ``ResourceGPU``)."""
RESOURCE_GPU_CORE = "koordinator.sh/gpu-core"
"""GPU compute, in percent of one card."""
RESOURCE_GPU_MEMORY = "koordinator.sh/gpu-memory"
"""GPU memory, in bytes."""
RESOURCE_GPU_MEMORY_RATIO = "koordinator.sh/gpu-memory-ratio"
"""GPU memory, in percent of one card."""
RESOURCE_NVIDIA_GPU = "nvidia.com/gpu"
"""Whole NVIDIA GPUs (the device plugin's resource)."""
DEVICE_RESOURCES = (
    RESOURCE_GPU,
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
    RESOURCE_NVIDIA_GPU,
)
"""Every device resource the DeviceShare plugin accounts (NodeResourcesFit leaves them to it)."""
