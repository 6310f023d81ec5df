"""Where a pod may go: the spec fields kube-scheduler's in-tree plugins read, parsed once as the
pod or node enters the snapshot.

Pod side (:class:`PodConstraints`): ``nodeSelector`` and ``affinity.nodeAffinity`` (NodeAffinity),
``tolerations`` (TaintToleration, NodeUnschedulable), ``affinity.podAffinity`` and
``podAntiAffinity`` (InterPodAffinity), ``topologySpreadConstraints`` (PodTopologySpread),
containers' ``hostPort`` (NodePorts), PersistentVolumeClaims of ``volumes`` (VolumeBinding),
container images (ImageLocality), ``preemptionPolicy``, ``status.nominatedNodeName`` and
``metadata.deletionTimestamp`` (preemption). Node side: ``spec.taints`` and
``status.images``.

Defaults are the API server's: a toleration's operator is ``Equal``; a host port's IP
``0.0.0.0`` and protocol ``TCP``; a spread constraint honours node affinity and ignores taints
(``nodeAffinityPolicy: Honor``, ``nodeTaintsPolicy: Ignore``); an affinity term without
``namespaces`` and ``namespaceSelector`` is about the pod's own namespace. ``matchLabelKeys`` (and
a pod affinity term's ``mismatchLabelKeys``) are folded into the selector with the pod's own
label values, as the API server does since Kubernetes 1.31.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import Any

from apis.kubernetes_keys import (
    PREEMPT_LOWER_PRIORITY,
    PREEMPT_NEVER,
    TAINT_EFFECTS,
    TOLERATION_OP_EQUAL,
    TOLERATION_OP_EXISTS,
)
from apis.records import frozen
from scheduler_plugins.errors import InputError
from scheduler_plugins.objectfields import as_list, as_object
from scheduler_plugins.selectors import (
    IN,
    NOT_IN,
    LabelSelector,
    NodeSelector,
    NodeSelectorTerm,
    Requirement,
    parse_label_selector,
    parse_node_selector,
    parse_node_selector_term,
)

DO_NOT_SCHEDULE = "DoNotSchedule"
SCHEDULE_ANYWAY = "ScheduleAnyway"
HONOR = "Honor"
IGNORE = "Ignore"


@frozen
class Taint:
    """One ``spec.taints[]`` entry of a node."""

    key: str
    value: str
    effect: str


@frozen
class Toleration:
    """One ``spec.tolerations[]`` entry of a pod."""

    key: str
    operator: str
    value: str
    effect: str

    def tolerates(self, taint: Taint) -> bool:
        """``v1.Toleration.ToleratesTaint``: an empty effect matches every effect, an empty key
        with ``Exists`` every key; ``Equal`` compares values."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == TOLERATION_OP_EXISTS:
            return True
        return self.value == taint.value


def tolerated(taint: Taint, tolerations: tuple[Toleration, ...]) -> bool:
    """Whether any of ``tolerations`` tolerates ``taint``."""
    return any(t.tolerates(taint) for t in tolerations)


def first_untolerated(
    taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...], effects: tuple[str, ...]
) -> Taint | None:
    """The first taint with one of ``effects`` that no toleration tolerates
    (``v1helper.FindMatchingUntoleratedTaint``)."""
    for taint in taints:
        if taint.effect in effects and not tolerated(taint, tolerations):
            return taint
    return None


@frozen
class AffinityTerm:
    """A ``PodAffinityTerm`` (``weight``: of a preferred one), namespaces resolved."""

    selector: LabelSelector
    namespaces: frozenset[str]
    namespace_selector: LabelSelector | None
    topology_key: str
    weight: int = 0

    def matches(
        self, namespace: str, labels: Mapping[str, str], ns_labels: Mapping[str, str]
    ) -> bool:
        """Whether a pod in ``namespace`` with ``labels`` is one the term is about
        (``framework.AffinityTerm.Matches``); ``ns_labels`` are that namespace's labels."""
        if namespace not in self.namespaces and (
            self.namespace_selector is None or not self.namespace_selector.matches(ns_labels)
        ):
            return False
        return self.selector.matches(labels)


@frozen
class SpreadConstraint:
    """One ``topologySpreadConstraints[]`` entry."""

    max_skew: int
    topology_key: str
    hard: bool
    """``whenUnsatisfiable: DoNotSchedule`` (filter) rather than ``ScheduleAnyway`` (score)."""
    selector: LabelSelector
    min_domains: int
    honor_affinity: bool
    """``nodeAffinityPolicy: Honor`` (default): count only nodes the pod's node affinity admits."""
    honor_taints: bool
    """``nodeTaintsPolicy: Honor``: count only nodes whose taints the pod tolerates."""


@frozen
class HostPort:
    """A container port bound on the node (``hostPort``)."""

    ip: str
    protocol: str
    port: int


@frozen
class PodConstraints:
    """What the in-tree plugins read of one pod."""

    node_selector: tuple[tuple[str, str], ...] = ()
    """``spec.nodeSelector`` pairs."""
    required: NodeSelector | None = None
    """``nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution``."""
    preferred: tuple[tuple[int, NodeSelectorTerm], ...] = ()
    """``nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution``: (weight, term)."""
    tolerations: tuple[Toleration, ...] = ()
    affinity: tuple[AffinityTerm, ...] = ()
    """Required pod affinity terms."""
    anti_affinity: tuple[AffinityTerm, ...] = ()
    """Required pod anti-affinity terms."""
    preferred_affinity: tuple[AffinityTerm, ...] = ()
    preferred_anti_affinity: tuple[AffinityTerm, ...] = ()
    spread: tuple[SpreadConstraint, ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    claims: tuple[str, ...] = ()
    """Names of the PersistentVolumeClaims its volumes use (``<pod>-<volume>`` for generic
    ephemeral volumes), in the pod's namespace."""
    images: tuple[str, ...] = ()
    """Container images (init containers first), normalized as ImageLocality does."""
    preemption_policy: str = PREEMPT_LOWER_PRIORITY
    nominated_node: str = ""
    """``status.nominatedNodeName``."""
    terminating: bool = False
    """``metadata.deletionTimestamp`` is set."""
    has_pod_affinity: bool = field(default=False)
    """Any pod affinity or anti-affinity term, required or preferred."""

    def matches_node(self, name: str, labels: Mapping[str, str]) -> bool:
        """``nodeSelector`` and required node affinity
        (``nodeaffinity.GetRequiredNodeAffinity``)."""
        for k, v in self.node_selector:
            if labels.get(k) != v:
                return False
        return self.required is None or self.required.matches(name, labels)


EMPTY = PodConstraints()
"""A pod that asks nothing of placement."""


def _int(raw: Any, source: str, where: str, default: int, minimum: int = 0) -> int:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise InputError(source, where, f"must be an integer >= {minimum}, got {raw!r}")
    return raw


def normalized_image(name: str) -> str:
    """An image reference with ``:latest`` when it has no tag (ImageLocality's
    ``normalizedImageName``)."""
    if name.rfind(":") <= name.rfind("/"):
        return name + ":latest"
    return name


def _label_keys(
    keys: Any, labels: Mapping[str, str], op: str, source: str, where: str
) -> tuple[Requirement, ...]:
    out = []
    for i, key in enumerate(as_list(keys, source, where)):
        if not isinstance(key, str):
            raise InputError(source, f"{where}[{i}]", "must be a label key")
        if key in labels:
            out.append(Requirement(key, op, frozenset((labels[key],))))
    return tuple(out)


def _affinity_term(
    raw: Any, namespace: str, labels: Mapping[str, str], source: str, where: str, weight: int = 0
) -> AffinityTerm:
    term = as_object(raw, source, where)
    key = str(term.get("topologyKey") or "")
    if not key:
        raise InputError(source, where + ".topologyKey", "must not be empty")
    selector = parse_label_selector(term.get("labelSelector"), source, where + ".labelSelector")
    selector = selector.with_requirements(
        _label_keys(term.get("matchLabelKeys"), labels, IN, source, where + ".matchLabelKeys")
        + _label_keys(
            term.get("mismatchLabelKeys"), labels, NOT_IN, source, where + ".mismatchLabelKeys"
        )
    )
    namespaces = frozenset(
        str(n) for n in as_list(term.get("namespaces"), source, where + ".namespaces")
    )
    ns_selector: LabelSelector | None = None
    if term.get("namespaceSelector") is not None:
        ns_selector = parse_label_selector(
            term.get("namespaceSelector"), source, where + ".namespaceSelector"
        )
    if not namespaces and ns_selector is None:
        namespaces = frozenset((namespace,))
    return AffinityTerm(selector, namespaces, ns_selector, key, weight)


def _pod_affinity(
    raw: Any, namespace: str, labels: Mapping[str, str], source: str, where: str
) -> tuple[tuple[AffinityTerm, ...], tuple[AffinityTerm, ...]]:
    sect = as_object(raw, source, where)
    rwhere = where + ".requiredDuringSchedulingIgnoredDuringExecution"
    required = tuple(
        _affinity_term(t, namespace, labels, source, f"{rwhere}[{i}]")
        for i, t in enumerate(
            as_list(sect.get("requiredDuringSchedulingIgnoredDuringExecution"), source, rwhere)
        )
    )
    pwhere = where + ".preferredDuringSchedulingIgnoredDuringExecution"
    preferred = []
    for i, p in enumerate(
        as_list(sect.get("preferredDuringSchedulingIgnoredDuringExecution"), source, pwhere)
    ):
        entry = as_object(p, source, f"{pwhere}[{i}]")
        weight = _int(entry.get("weight"), source, f"{pwhere}[{i}].weight", 0, 1)
        preferred.append(
            _affinity_term(
                entry.get("podAffinityTerm"),
                namespace,
                labels,
                source,
                f"{pwhere}[{i}].podAffinityTerm",
                weight,
            )
        )
    return required, tuple(preferred)


def _spread(
    raw: Any, labels: Mapping[str, str], source: str, where: str
) -> tuple[SpreadConstraint, ...]:
    out = []
    for i, c in enumerate(as_list(raw, source, where)):
        cwhere = f"{where}[{i}]"
        entry = as_object(c, source, cwhere)
        key = str(entry.get("topologyKey") or "")
        if not key:
            raise InputError(source, cwhere + ".topologyKey", "must not be empty")
        when = str(entry.get("whenUnsatisfiable") or "")
        if when not in (DO_NOT_SCHEDULE, SCHEDULE_ANYWAY):
            raise InputError(
                source,
                cwhere + ".whenUnsatisfiable",
                f"must be {DO_NOT_SCHEDULE} or {SCHEDULE_ANYWAY}, got {when!r}",
            )
        policies = {}
        for fname, default in (("nodeAffinityPolicy", HONOR), ("nodeTaintsPolicy", IGNORE)):
            value = str(entry.get(fname) or default)
            if value not in (HONOR, IGNORE):
                raise InputError(
                    source, f"{cwhere}.{fname}", f"must be Honor or Ignore, got {value!r}"
                )
            policies[fname] = value == HONOR
        selector = parse_label_selector(
            entry.get("labelSelector"), source, cwhere + ".labelSelector"
        )
        selector = selector.with_requirements(
            _label_keys(entry.get("matchLabelKeys"), labels, IN, source, cwhere + ".matchLabelKeys")
        )
        out.append(
            SpreadConstraint(
                max_skew=_int(entry.get("maxSkew"), source, cwhere + ".maxSkew", 1, 1),
                topology_key=key,
                hard=when == DO_NOT_SCHEDULE,
                selector=selector,
                min_domains=_int(entry.get("minDomains"), source, cwhere + ".minDomains", 1, 1),
                honor_affinity=policies["nodeAffinityPolicy"],
                honor_taints=policies["nodeTaintsPolicy"],
            )
        )
    return tuple(out)


def _tolerations(raw: Any, source: str, where: str) -> tuple[Toleration, ...]:
    out = []
    for i, t in enumerate(as_list(raw, source, where)):
        twhere = f"{where}[{i}]"
        entry = as_object(t, source, twhere)
        op = str(entry.get("operator") or TOLERATION_OP_EQUAL)
        if op not in (TOLERATION_OP_EQUAL, TOLERATION_OP_EXISTS):
            raise InputError(source, twhere + ".operator", f"must be Equal or Exists, got {op!r}")
        effect = str(entry.get("effect") or "")
        if effect and effect not in TAINT_EFFECTS:
            raise InputError(source, twhere + ".effect", f"unknown taint effect {effect!r}")
        value = str(entry.get("value") or "")
        if op == TOLERATION_OP_EXISTS and value:
            raise InputError(source, twhere + ".value", "must be empty with operator Exists")
        out.append(Toleration(str(entry.get("key") or ""), op, value, effect))
    return tuple(out)


def _host_ports(containers: list[Any], source: str, where: str) -> tuple[HostPort, ...]:
    out = []
    for i, c in enumerate(containers):
        cont = as_object(c, source, f"{where}[{i}]")
        for j, p in enumerate(as_list(cont.get("ports"), source, f"{where}[{i}].ports")):
            port = as_object(p, source, f"{where}[{i}].ports[{j}]")
            host_port = _int(port.get("hostPort"), source, f"{where}[{i}].ports[{j}].hostPort", 0)
            if host_port <= 0:
                continue
            out.append(
                HostPort(
                    str(port.get("hostIP") or "0.0.0.0"),
                    str(port.get("protocol") or "TCP"),
                    host_port,
                )
            )
    return tuple(out)


def parse_pod_constraints(
    obj: Mapping[str, Any],
    namespace: str,
    name: str,
    labels: Mapping[str, str],
    source: str,
    prefix: str,
) -> PodConstraints:
    """A pod's :class:`PodConstraints` (:data:`EMPTY` when it asks nothing). Raises
    :class:`InputError` naming the field."""
    meta = as_object(obj.get("metadata"), source, prefix + "metadata")
    spec = as_object(obj.get("spec"), source, prefix + "spec")
    status = as_object(obj.get("status"), source, prefix + "status")
    sp = prefix + "spec"
    node_selector = tuple(
        (str(k), str(v))
        for k, v in as_object(spec.get("nodeSelector"), source, sp + ".nodeSelector").items()
    )
    affinity = as_object(spec.get("affinity"), source, sp + ".affinity")
    node_aff = as_object(affinity.get("nodeAffinity"), source, sp + ".affinity.nodeAffinity")
    nwhere = sp + ".affinity.nodeAffinity"
    required = None
    if node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") is not None:
        required = parse_node_selector(
            node_aff["requiredDuringSchedulingIgnoredDuringExecution"],
            source,
            nwhere + ".requiredDuringSchedulingIgnoredDuringExecution",
        )
    preferred = []
    pwhere = nwhere + ".preferredDuringSchedulingIgnoredDuringExecution"
    for i, p in enumerate(
        as_list(node_aff.get("preferredDuringSchedulingIgnoredDuringExecution"), source, pwhere)
    ):
        entry = as_object(p, source, f"{pwhere}[{i}]")
        preferred.append(
            (
                _int(entry.get("weight"), source, f"{pwhere}[{i}].weight", 0, 1),
                parse_node_selector_term(
                    entry.get("preference"), source, f"{pwhere}[{i}].preference"
                ),
            )
        )
    aff_req, aff_pref = _pod_affinity(
        affinity.get("podAffinity"), namespace, labels, source, sp + ".affinity.podAffinity"
    )
    anti_req, anti_pref = _pod_affinity(
        affinity.get("podAntiAffinity"), namespace, labels, source, sp + ".affinity.podAntiAffinity"
    )
    containers = as_list(spec.get("containers"), source, sp + ".containers")
    init_containers = as_list(spec.get("initContainers"), source, sp + ".initContainers")
    ports = _host_ports(containers, source, sp + ".containers")
    # restartable init containers (sidecars) keep running: their ports stay bound
    sidecars = [
        c for c in init_containers if isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
    ]
    ports += _host_ports(sidecars, source, sp + ".initContainers")
    claims = []
    for i, v in enumerate(as_list(spec.get("volumes"), source, sp + ".volumes")):
        vol = as_object(v, source, f"{sp}.volumes[{i}]")
        pvc = vol.get("persistentVolumeClaim")
        if pvc is not None:
            claim = str(
                as_object(pvc, source, f"{sp}.volumes[{i}].persistentVolumeClaim").get("claimName")
                or ""
            )
            if not claim:
                raise InputError(
                    source,
                    f"{sp}.volumes[{i}].persistentVolumeClaim.claimName",
                    "must not be empty",
                )
            claims.append(claim)
        elif vol.get("ephemeral") is not None:
            claims.append(f"{name}-{vol.get('name') or ''}")
    images = tuple(
        normalized_image(str(c.get("image")))
        for c in [*init_containers, *containers]
        if isinstance(c, Mapping) and c.get("image")
    )
    policy = str(spec.get("preemptionPolicy") or PREEMPT_LOWER_PRIORITY)
    if policy not in (PREEMPT_LOWER_PRIORITY, PREEMPT_NEVER):
        raise InputError(
            source,
            sp + ".preemptionPolicy",
            f"must be PreemptLowerPriority or Never, got {policy!r}",
        )
    spread = _spread(
        spec.get("topologySpreadConstraints"), labels, source, sp + ".topologySpreadConstraints"
    )
    tolerations = _tolerations(spec.get("tolerations"), source, sp + ".tolerations")
    nominated = str(status.get("nominatedNodeName") or "")
    terminating = meta.get("deletionTimestamp") is not None
    has_pod_affinity = bool(aff_req or aff_pref or anti_req or anti_pref)
    if not (
        node_selector
        or required is not None
        or preferred
        or tolerations
        or has_pod_affinity
        or spread
        or ports
        or claims
        or images
        or policy != PREEMPT_LOWER_PRIORITY
        or nominated
        or terminating
    ):
        return EMPTY
    return PodConstraints(
        node_selector=node_selector,
        required=required,
        preferred=tuple(preferred),
        tolerations=tolerations,
        affinity=aff_req,
        anti_affinity=anti_req,
        preferred_affinity=aff_pref,
        preferred_anti_affinity=anti_pref,
        spread=spread,
        host_ports=ports,
        claims=tuple(claims),
        images=images,
        preemption_policy=policy,
        nominated_node=nominated,
        terminating=terminating,
        has_pod_affinity=has_pod_affinity,
    )


def parse_taints(raw: Any, source: str, where: str) -> tuple[Taint, ...]:
    """A node's ``spec.taints``."""
    out = []
    for i, t in enumerate(as_list(raw, source, where)):
        entry = as_object(t, source, f"{where}[{i}]")
        key = str(entry.get("key") or "")
        if not key:
            raise InputError(source, f"{where}[{i}].key", "must not be empty")
        effect = str(entry.get("effect") or "")
        if effect not in TAINT_EFFECTS:
            raise InputError(source, f"{where}[{i}].effect", f"unknown taint effect {effect!r}")
        out.append(Taint(key, str(entry.get("value") or ""), effect))
    return tuple(out)


def parse_images(raw: Any, source: str, where: str) -> dict[str, int]:
    """A node's ``status.images``: every name → the image's ``sizeBytes``."""
    out: dict[str, int] = {}
    for i, img in enumerate(as_list(raw, source, where)):
        entry = as_object(img, source, f"{where}[{i}]")
        size = _int(entry.get("sizeBytes"), source, f"{where}[{i}].sizeBytes", 0)
        for n in as_list(entry.get("names"), source, f"{where}[{i}].names"):
            out[str(n)] = size
    return out
