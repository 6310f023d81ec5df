"""Resource names, label and annotation keys and priority bands koord-manager reads and writes.

Every value is Koordinator's contract (``apis/extension`` and ``apis/configuration`` upstream):
a Node written by our manager reads the same to the Go scheduler and koordlet.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from apis.extension import NODE_DOMAIN_PREFIX
from apis.groups import CONFIG_GROUP
from apis.netqos import ANNOTATION_NODE_NETWORK_BANDWIDTH
from apis.quantity import Format, format_quantity

# Extended resources on Node.status (capacity and allocatable) -------------------------------
BATCH_CPU = "kubernetes.io/batch-cpu"
"""Batch CPU in milli-cores, as an integer count (``"12k"`` is 12 cores)."""
BATCH_MEMORY = "kubernetes.io/batch-memory"
"""Batch memory in bytes."""
MID_CPU = "kubernetes.io/mid-cpu"
"""Mid-tier CPU in milli-cores, as an integer count."""
MID_MEMORY = "kubernetes.io/mid-memory"
"""Mid-tier memory in bytes."""
EXTENDED_RESOURCES = (BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY)
"""The four resources the node resource controller owns, in the order explain prints them."""
EXTENDED_RESOURCE_FORMATS: Mapping[str, Format] = MappingProxyType(
    {
        BATCH_CPU: Format.DECIMAL_SI,
        BATCH_MEMORY: Format.BINARY_SI,
        MID_CPU: Format.DECIMAL_SI,
        MID_MEMORY: Format.BINARY_SI,
    }
)
"""How each is written: upstream's batch and mid plugins build ``resource.NewQuantity(milli,
DecimalSI)`` for the CPUs and ``NewQuantity(bytes, BinarySI)`` for the memories
(``pkg/slo-controller/noderesource/plugins/batchresource``, ``midresource``), so the Node carries
``String()`` of those (``"12k"``, ``"1500"``, ``"16Gi"``), which :func:`format_extended` gives."""

# Node metadata the calculation reads ----------------------------------------------------------
ANNOTATION_NODE_RESERVATION = NODE_DOMAIN_PREFIX + "reservation"
"""JSON ``{"resources": {"cpu": ..., "memory": ...}, "reservedCPUs": "0-1"}``: resources kept
back for the system beside the kubelet's reservation."""
ANNOTATION_NODE_COLOCATION_STRATEGY = NODE_DOMAIN_PREFIX + "colocation-strategy"
"""A ColocationStrategy (JSON) merged over the ConfigMap's for this node; bad JSON is ignored."""
LABEL_CPU_RECLAIM_RATIO = NODE_DOMAIN_PREFIX + "cpu-reclaim-ratio"
"""Float ratio (``"0.7"``) overriding ``cpuReclaimThresholdPercent`` (times 100) for the node."""
LABEL_MEMORY_RECLAIM_RATIO = NODE_DOMAIN_PREFIX + "memory-reclaim-ratio"
"""Float ratio that overrides ``memoryReclaimThresholdPercent`` (times 100) for the node."""

# CPU normalization and resource amplification -------------------------------------------------
ANNOTATION_CPU_NORMALIZATION_RATIO = NODE_DOMAIN_PREFIX + "cpu-normalization-ratio"
"""The node's CPU normalization ratio, two decimals (``"1.20"``); batch-cpu is amplified by it."""
LABEL_CPU_NORMALIZATION_ENABLED = NODE_DOMAIN_PREFIX + "cpu-normalization-enabled"
"""``true``/``false``: overrides the strategy's ``enable`` for the node."""
ANNOTATION_CPU_BASIC_INFO = NODE_DOMAIN_PREFIX + "cpu-basic-info"
"""JSON ``{"cpuModel", "hyperThreadEnabled", "turboEnabled", ...}`` the koordlet reports (upstream
on the NodeResourceTopology object)."""
ANNOTATION_NODE_RESOURCE_AMPLIFICATION_RATIO = NODE_DOMAIN_PREFIX + "resource-amplification-ratio"
"""JSON map resource name → ratio (≥ 1) by which the scheduler amplifies allocatable."""

# NodeSLO inputs on the Node ------------------------------------------------------------------
ANNOTATION_NODE_BANDWIDTH = ANNOTATION_NODE_NETWORK_BANDWIDTH
"""``node.koordinator.sh/network-bandwidth`` (declared in :mod:`apis.netqos`, which the koordlet
reads it through): the node's total network bandwidth, a quantity in bits per second (``"10G"``)
set by an administrator or a third party; it takes precedence over ``system-config``'s
``totalNetworkBandwidth`` in the node's NodeSLO (``extension.AnnotationNodeBandwidth``,
``GetNodeTotalBandwidth``; ``nodeslo/resource_strategy.go``'s ``getSystemConfigSpec``)."""

# The ConfigMap -------------------------------------------------------------------------------
SLO_CONFIG_NAMESPACE = "koordinator-system"
"""Default namespace of the slo-controller-config ConfigMap (``--config-namespace``)."""
SLO_CONFIG_NAME = "slo-controller-config"
"""Default name of the ConfigMap (``--slo-config-name``)."""

# ClusterColocationProfile annotations (apis/extension/cluster_colocation_profile.go) ----------
ANNOTATION_SKIP_UPDATE_RESOURCES = CONFIG_GROUP + "/skip-update-resources"
"""On a profile (any value): the pods it matches keep their ``cpu`` and ``memory``; no matched
profile's batch or mid translation runs (``ShouldSkipUpdateResource``)."""
ANNOTATION_SKIP_NEXT_PROFILE = CONFIG_GROUP + "/skip-next-profile"
"""On a profile (any value): once it has applied, the profiles after it do not
(``ShouldSkipNextProfile``)."""


def format_extended(name: str, value: int) -> str:
    """``value`` of extended resource ``name`` as Kubernetes prints it (its ``String()`` in the
    format of :data:`EXTENDED_RESOURCE_FORMATS`)."""
    return format_quantity(value, EXTENDED_RESOURCE_FORMATS[name])
