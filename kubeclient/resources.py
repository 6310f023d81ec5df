"""Which API resources the binaries use, and the URL paths to them.

A :class:`Resource` names a collection by group, version and plural; objects stay plain decoded
JSON (``dict``), typed at the edge by the caller's ``TypedDict``. The table below is the whole
set the koordlet, koord-manager, koord-scheduler and koord-descheduler talk to.
"""

from __future__ import annotations

from urllib.parse import quote

from apis.groups import (
    CONFIG_GROUP,
    QUOTA_GROUP,
    SCHEDULING_GROUP,
    SIGS_SCHEDULING_GROUP,
    SLO_GROUP,
    TOPOLOGY_GROUP,
    V1ALPHA1,
)
from apis.records import frozen


@frozen
class Resource:
    """One API collection (``nodes``, ``slo.koordinator.sh/v1alpha1 nodemetrics``...)."""

    group: str
    """API group; empty for the core group."""
    version: str
    """``v1``, ``v1alpha1``..."""
    plural: str
    """URL name of the collection (``nodemetrics``)."""
    kind: str
    """``Kind`` of one object (``NodeMetric``)."""
    namespaced: bool
    """Whether objects live in a namespace."""

    @property
    def api_version(self) -> str:
        """``apiVersion`` of its objects: ``v1`` or ``<group>/<version>``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str = "") -> str:
        """URL path of the collection (``namespace`` None: across all namespaces), of one object
        when ``name`` is given, and of its subresource (``status``, ``eviction``) when ``sub``."""
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if sub:
                base += f"/{sub}"
        return base


NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)
EVENTS = Resource("", "v1", "events", "Event", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
NODE_METRICS = Resource(SLO_GROUP, V1ALPHA1, "nodemetrics", "NodeMetric", False)
NODE_SLOS = Resource(SLO_GROUP, V1ALPHA1, "nodeslos", "NodeSLO", False)
NODE_RESOURCE_TOPOLOGIES = Resource(
    TOPOLOGY_GROUP, V1ALPHA1, "noderesourcetopologies", "NodeResourceTopology", False
)
ELASTIC_QUOTAS = Resource(
    SIGS_SCHEDULING_GROUP, V1ALPHA1, "elasticquotas", "ElasticQuota", namespaced=True
)
POD_GROUPS = Resource(SIGS_SCHEDULING_GROUP, V1ALPHA1, "podgroups", "PodGroup", True)
RESERVATIONS = Resource(SCHEDULING_GROUP, V1ALPHA1, "reservations", "Reservation", namespaced=False)
DEVICES = Resource(SCHEDULING_GROUP, V1ALPHA1, "devices", "Device", False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
PERSISTENT_VOLUME_CLAIMS = Resource(
    "", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", namespaced=True
)
PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
POD_DISRUPTION_BUDGETS = Resource(
    "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True
)
ELASTIC_QUOTA_PROFILES = Resource(
    QUOTA_GROUP, V1ALPHA1, "elasticquotaprofiles", "ElasticQuotaProfile", True
)
PRIORITY_CLASSES = Resource(
    "scheduling.k8s.io", "v1", "priorityclasses", "PriorityClass", namespaced=False
)
EVENTS_V1 = Resource("events.k8s.io", "v1", "events", "Event", namespaced=True)
"""``events.k8s.io/v1`` Events (series aggregation), as kube-scheduler records them."""
POD_DISRUPTION_BUDGETS = Resource(
    "policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True
)
POD_MIGRATION_JOBS = Resource(
    SCHEDULING_GROUP, V1ALPHA1, "podmigrationjobs", "PodMigrationJob", namespaced=False
)
REPLICA_SETS = Resource("apps", "v1", "replicasets", "ReplicaSet", namespaced=True)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment", namespaced=True)
STATEFUL_SETS = Resource("apps", "v1", "statefulsets", "StatefulSet", namespaced=True)
REPLICATION_CONTROLLERS = Resource(
    "", "v1", "replicationcontrollers", "ReplicationController", namespaced=True
)
"""The workloads whose replicas bound a migration (the descheduler's controller finder)."""
SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)
CLUSTER_COLOCATION_PROFILES = Resource(
    CONFIG_GROUP, V1ALPHA1, "clustercolocationprofiles", "ClusterColocationProfile", False
)
MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
VALIDATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)
"""What koord-manager's webhook reads (profiles) and keeps (its certificate Secret, the caBundle
of its two configurations)."""
