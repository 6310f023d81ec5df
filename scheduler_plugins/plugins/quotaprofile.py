"""ElasticQuotaProfile: one quota tree per node pool.

Koordinator's ``quota.koordinator.sh/v1alpha1`` ElasticQuotaProfile, re-implemented for the
ElasticQuota plugin:

- ``spec.nodeSelector`` (a LabelSelector: ``matchLabels`` and ``matchExpressions`` with In,
  NotIn, Exists, DoesNotExist) picks the pool's nodes; an empty selector picks every node, an
  absent one none.
- ``spec.quotaName`` names the tree's root ElasticQuota (Koordinator's profile controller creates
  it when it does not exist; the ElasticQuota plugin stands one in, ``min`` = ``max`` = the
  pool's total, for snapshots taken without it); ``spec.quotaLabels`` are copied onto that root.
- ``spec.resourceRatio`` (a decimal string, default 1) scales the pool: the tree's total is the
  sum of the selected nodes' allocatable times the ratio, rounded down per resource (Koordinator
  writes it on the root as ``quota.scheduling.koordinator.sh/total-resource``).
- The tree id is the profile's ``quota.scheduling.koordinator.sh/tree-id`` label, else the root
  quota's, else one derived from the profile's namespace and name; quotas under the root belong
  to the tree (Koordinator's webhook stamps the id on them), and their pods may run only on the
  pool's nodes (the webhook adds the node affinity; the ElasticQuota filter enforces it here).

The snapshot keeps ElasticQuotaProfiles as raw objects keyed ``namespace/name`` in
``Snapshot.quota_profiles`` when it reads that kind; :func:`profiles_of` reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Any

from apis.records import frozen
from apis.scheduling_keys import LABEL_QUOTA_TREE_ID as LABEL_TREE_ID
from scheduler_plugins.errors import InputError
from scheduler_plugins.objectfields import ResourceList
from scheduler_plugins.selectors import raw_label_selector_matches
from scheduler_plugins.snapshot import NodeInfo, Snapshot

KIND = "ElasticQuotaProfile"
ERR_POOL = "node(s) didn't match Pod's node affinity/selector"
"""The reason a node outside the pod's quota tree's pool fails (Koordinator's webhook turns the
profile's nodeSelector into required node affinity, which kube-scheduler reports so)."""


@frozen
class QuotaProfile:
    """One ElasticQuotaProfile."""

    key: str
    """``namespace/name``."""
    namespace: str
    """``metadata.namespace`` (``default`` when unset)."""
    quota_name: str
    """``spec.quotaName``: the tree's root quota."""
    quota_labels: dict[str, str]
    """``spec.quotaLabels``."""
    ratio: Fraction
    """``spec.resourceRatio`` (1 when unset)."""
    selector: dict[str, Any] | None
    """``spec.nodeSelector``; ``None`` selects no node."""
    tree_id: str
    """The tree's id (see the module docstring)."""

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with ``labels`` is in the pool."""
        return self.selector is not None and raw_label_selector_matches(self.selector, labels)


def parse_ratio(raw: Any, source: str) -> Fraction:
    """``spec.resourceRatio`` as an exact fraction in [0, 1] (absent: 1)."""
    if raw is None or raw == "":
        return Fraction(1)
    try:
        ratio = Fraction(Decimal(str(raw)))
    except (InvalidOperation, ValueError) as err:
        raise InputError(source, "spec.resourceRatio", f"not a decimal: {raw!r}") from err
    if ratio < 0:
        raise InputError(source, "spec.resourceRatio", f"must not be negative, got {raw!r}")
    return ratio


def parse_profile(obj: Mapping[str, Any]) -> QuotaProfile:
    """One profile from its object. Raises :class:`InputError` naming the field."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    namespace = str(meta.get("namespace") or "default")
    source = f"{KIND} {namespace}/{name}"
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise InputError(source, "spec", "must be a map")
    quota_name = str(spec.get("quotaName") or "")
    if not quota_name:
        raise InputError(source, "spec.quotaName", "a profile needs its root quota's name")
    selector = spec.get("nodeSelector")
    if selector is not None and not isinstance(selector, Mapping):
        raise InputError(source, "spec.nodeSelector", "must be a label selector")
    labels = meta.get("labels") or {}
    return QuotaProfile(
        key=f"{namespace}/{name}",
        namespace=namespace,
        quota_name=quota_name,
        quota_labels={str(k): str(v) for k, v in (spec.get("quotaLabels") or {}).items()},
        ratio=parse_ratio(spec.get("resourceRatio"), source),
        selector=dict(selector) if selector is not None else None,
        tree_id=str(labels.get(LABEL_TREE_ID) or ""),
    )


def parse_profiles(objects: Iterable[Mapping[str, Any]]) -> list[QuotaProfile]:
    """Profiles of ``objects`` (other kinds skipped), in order."""
    return [parse_profile(o) for o in objects if o.get("kind", KIND) == KIND]


def profiles_of(snapshot: Snapshot) -> list[QuotaProfile]:
    """The snapshot's profiles (``Snapshot.quota_profiles``; none when it has no such field)."""
    raw: Mapping[str, Mapping[str, Any]] = getattr(snapshot, "quota_profiles", None) or {}
    return parse_profiles(raw.values())


def pool_nodes(profile: QuotaProfile, nodes: Iterable[NodeInfo]) -> set[str]:
    """Names of the nodes ``profile`` selects."""
    return {n.name for n in nodes if profile.selects(n.labels)}


def pool_total(profile: QuotaProfile, nodes: Iterable[NodeInfo]) -> ResourceList:
    """The tree's total: the selected nodes' allocatable summed, times the ratio, rounded down."""
    total: ResourceList = {}
    for n in nodes:
        if profile.selects(n.labels):
            for r, v in n.allocatable.items():
                total[r] = total.get(r, 0) + v
    ratio = profile.ratio
    return {r: v * ratio.numerator // ratio.denominator for r, v in total.items()}
