"""API groups and versions of the Koordinator objects (``groupversion_info.go`` upstream)."""

from __future__ import annotations

SLO_GROUP = "slo.koordinator.sh"
"""NodeSLO, NodeMetric."""
SCHEDULING_GROUP = "scheduling.koordinator.sh"
"""Reservation, Device, PodMigrationJob."""
QUOTA_GROUP = "quota.koordinator.sh"
"""ElasticQuotaProfile."""
CONFIG_GROUP = "config.koordinator.sh"
"""ClusterColocationProfile."""
SIGS_SCHEDULING_GROUP = "scheduling.sigs.k8s.io"
"""ElasticQuota, PodGroup (scheduler-plugins)."""
TOPOLOGY_GROUP = "topology.node.k8s.io"
"""NodeResourceTopology."""
V1ALPHA1 = "v1alpha1"
"""The version every one of them is served at."""

SLO_API_VERSION = f"{SLO_GROUP}/{V1ALPHA1}"
SCHEDULING_API_VERSION = f"{SCHEDULING_GROUP}/{V1ALPHA1}"
