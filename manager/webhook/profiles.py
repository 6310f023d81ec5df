"""ClusterColocationProfiles and what they do to a pod on creation (the mutating webhook).

Upstream: ``pkg/webhook/pod/mutating/cluster_colocation_profile.go`` and
``apis/extension/cluster_colocation_profile.go``. The rules, in the order they run:

1. **Matching.** A profile matches when its ``namespaceSelector`` matches the labels of the pod's
   namespace and its ``selector`` the pod's labels (absent or empty: everything).
2. **Order.** The matching profiles are taken by ``spec.priority`` (a number, highest first; 0
   when absent: the CRD of this release has no such field) and then by name, **descending**: of
   two profiles setting the same field, the one whose name sorts first is applied last and wins.
3. **Each in turn**: a profile with ``probability`` (an integer percent or ``"N%"``) is skipped
   unless ``rand.Intn(100) <= N`` (never at 0, always at 100); otherwise it merges in ``labels``
   and ``annotations``; copies the value of each label (annotation) key of
   ``labelKeysMapping`` (``annotationKeysMapping``) to the key it maps to (``""`` when absent);
   appends ``labelSuffixes`` to the labels present; sets ``schedulerName``; the
   ``koordinator.sh/qosClass`` label from ``qosClass``; ``priorityClassName`` with
   ``spec.priority`` and ``spec.preemptionPolicy`` from that PriorityClass (a missing one fails
   the pod); the ``koordinator.sh/priority`` label from ``koordinatorPriority``; and applies
   ``patch`` as a strategic merge patch. A profile annotated
   ``config.koordinator.sh/skip-next-profile`` ends the walk after it applies.
4. **Batch and mid resources**, unless a profile seen in the walk is annotated
   ``config.koordinator.sh/skip-update-resources``: the pod's priority class
   (``GetPodPriorityClassWithDefault``: the ``koordinator.sh/priority-class`` label, the band of
   ``spec.priority``, else ``koord-batch`` for a BE pod) picks the names: batch moves ``cpu`` to
   ``kubernetes.io/batch-cpu`` (milli-cores, ``NewQuantity(MilliValue(), DecimalSI)``: 1 core is
   ``"1k"``) and ``memory`` to ``kubernetes.io/batch-memory`` (the same quantity), in the requests
   and limits of every init and app container and in ``overhead``; mid does the same to
   ``mid-cpu`` and ``mid-memory``. A translated resource with a limit and no request gets the
   limit as its request; one with a request and no limit keeps no limit.

Where ours differs, on purpose: a profile whose selector does not parse is left out (logged);
upstream treats a selector it cannot parse, or a namespace it cannot read, as matching.
"""

from __future__ import annotations

import copy
import logging
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Any

from apis.configuration import LabelSelector, SelectorRequirement
from apis.errors import FieldError
from apis.extension import LABEL_POD_PRIORITY, LABEL_POD_QOS, QoSClass
from apis.manager_keys import (
    ANNOTATION_SKIP_NEXT_PROFILE,
    ANNOTATION_SKIP_UPDATE_RESOURCES,
    BATCH_CPU,
    BATCH_MEMORY,
    MID_CPU,
    MID_MEMORY,
)
from apis.priority import PRIORITY_BATCH, PRIORITY_MID, pod_priority_class_with_default
from apis.quantity import Format, GoIdentity, format_quantity, go_identity, go_identity_of_int
from apis.quantity import milli_value as quantity_milli_value
from apis.records import frozen
from kubeclient.writes import apply_merge_patch
from manager.errors import ManagerError
from manager.webhook.extendedspec import Path
from manager.webhook.podjson import marshal_quantities

logger = logging.getLogger(__name__)


TRANSLATED: Mapping[str, Mapping[str, str]] = {
    PRIORITY_BATCH: {"cpu": BATCH_CPU, "memory": BATCH_MEMORY},
    PRIORITY_MID: {"cpu": MID_CPU, "memory": MID_MEMORY},
}
"""Priority class → native resource → the colocation resource it becomes (upstream
``extension.ResourceNameMap``)."""

_QOS_NAMES = frozenset(q.value for q in QoSClass if q.value)
_PERCENT = re.compile(r"(-?[0-9]+)%")


class ProfileError(ManagerError, FieldError, ValueError):
    """A ClusterColocationProfile that cannot be used: ``source`` names the profile
    (``clustercolocationprofile NAME``), ``field`` the path inside it (``spec.qosClass``)."""


@frozen
class PriorityClassRef:
    """What a profile takes from a PriorityClass."""

    value: int
    """``value``: becomes ``spec.priority``."""
    preemption_policy: str | None
    """``preemptionPolicy``: becomes ``spec.preemptionPolicy`` (None: the field removed)."""


@frozen
class Profile:
    """One ClusterColocationProfile, parsed."""

    name: str
    """``metadata.name``."""
    namespace_selector: LabelSelector | None = None
    """``spec.namespaceSelector`` (None or empty: every namespace)."""
    selector: LabelSelector | None = None
    """``spec.selector`` (None or empty: every pod)."""
    qos_class: str = ""
    """``spec.qosClass``: ``LSE``, ``LSR``, ``LS``, ``BE`` or ``SYSTEM``."""
    priority_class_name: str = ""
    """``spec.priorityClassName``: a PriorityClass whose value becomes ``spec.priority``."""
    koordinator_priority: int | None = None
    """``spec.koordinatorPriority``: the ``koordinator.sh/priority`` label."""
    scheduler_name: str = ""
    """``spec.schedulerName``."""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``spec.labels``, merged into the pod's."""
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``spec.annotations``, merged into the pod's."""
    label_keys_mapping: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``spec.labelKeysMapping``: old key → new key, the value copied."""
    annotation_keys_mapping: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``spec.annotationKeysMapping``: old key → new key, the value copied."""
    label_suffixes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``spec.labelSuffixes``: key → suffix appended to that label's value when present."""
    patch: Mapping[str, Any] | None = None
    """``spec.patch``: a strategic merge patch of the pod."""
    probability: int | str | None = None
    """``spec.probability`` as given (IntOrString); checked when the profile matches."""
    priority: int = 0
    """``spec.priority``: profiles with more apply first."""
    skip_update_resources: bool = False
    """Annotated ``config.koordinator.sh/skip-update-resources``."""
    skip_next_profile: bool = False
    """Annotated ``config.koordinator.sh/skip-next-profile``."""

    @property
    def source(self) -> str:
        return f"clustercolocationprofile {self.name}"

    def matches(self, pod_labels: Mapping[str, str], ns_labels: Mapping[str, str] | None) -> bool:
        """Whether the profile applies (``ns_labels`` None: the namespace was not looked up,
        which is only allowed when the namespace selector is empty)."""
        if not self.selects_pod(pod_labels):
            return False
        if self.needs_namespace:
            assert self.namespace_selector is not None
            return ns_labels is not None and self.namespace_selector.matches(ns_labels)
        return True

    def selects_pod(self, pod_labels: Mapping[str, str]) -> bool:
        """Whether ``selector`` matches (the namespace aside)."""
        return _empty(self.selector) or (
            self.selector is not None and self.selector.matches(pod_labels)
        )

    @property
    def needs_namespace(self) -> bool:
        """Whether matching needs the labels of the pod's namespace."""
        return not _empty(self.namespace_selector)

    def percent(self) -> int:
        """``intstr.GetScaledValueFromIntOrPercent(probability, 100, false)``: 100 when unset.
        Raises :class:`ProfileError` for a string that is not ``N%``."""
        if self.probability is None:
            return 100
        if isinstance(self.probability, int):
            return self.probability
        m = _PERCENT.fullmatch(self.probability)
        if m is None:
            raise ProfileError(
                f'{self.probability!r} is not an integer nor a percentage ("50%")',
                source=self.source,
                field="spec.probability",
            )
        return int(m.group(1))


def _empty(sel: LabelSelector | None) -> bool:
    return sel is None or (not sel.match_labels and not sel.match_expressions)


def _selector(raw: object, source: str, where: str) -> LabelSelector | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ProfileError("must be an object", source=source, field=where)
    labels = raw.get("matchLabels") or {}
    exprs = []
    for i, e in enumerate(raw.get("matchExpressions") or ()):
        op = e.get("operator") if isinstance(e, Mapping) else None
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ProfileError(
                f"unknown {op!r}", source=source, field=f"{where}.matchExpressions[{i}].operator"
            )
        exprs.append(SelectorRequirement(str(e.get("key")), op, tuple(e.get("values") or ())))
    return LabelSelector(
        MappingProxyType({str(k): str(v) for k, v in labels.items()}), tuple(exprs)
    )


def _str_map(raw: object, source: str, where: str) -> Mapping[str, str]:
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()):
        raise ProfileError("must be a map of strings", source=source, field=where)
    return MappingProxyType(dict(raw))


def _int(raw: object, source: str, where: str) -> int | None:
    if raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
        raise ProfileError("must be an integer", source=source, field=where)
    return raw


def parse_profile(obj: Mapping[str, Any]) -> Profile:
    """A ClusterColocationProfile object; raises :class:`ProfileError`."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    annotations = meta.get("annotations") or {}
    spec = obj.get("spec") or {}
    source = f"clustercolocationprofile {name}"
    qos = spec.get("qosClass") or ""
    if qos and qos not in _QOS_NAMES:
        raise ProfileError(f"unknown QoS class {qos!r}", source=source, field="spec.qosClass")
    patch = spec.get("patch")
    if patch is not None and not isinstance(patch, Mapping):
        raise ProfileError("must be an object", source=source, field="spec.patch")
    probability = spec.get("probability")
    if probability is not None and (
        isinstance(probability, bool) or not isinstance(probability, int | str)
    ):
        raise ProfileError(
            "must be an integer or a string", source=source, field="spec.probability"
        )
    return Profile(
        name=name,
        namespace_selector=_selector(
            spec.get("namespaceSelector"), source, "spec.namespaceSelector"
        ),
        selector=_selector(spec.get("selector"), source, "spec.selector"),
        qos_class=str(qos),
        priority_class_name=str(spec.get("priorityClassName") or ""),
        koordinator_priority=_int(
            spec.get("koordinatorPriority"), source, "spec.koordinatorPriority"
        ),
        scheduler_name=str(spec.get("schedulerName") or ""),
        labels=_str_map(spec.get("labels"), source, "spec.labels"),
        annotations=_str_map(spec.get("annotations"), source, "spec.annotations"),
        label_keys_mapping=_str_map(spec.get("labelKeysMapping"), source, "spec.labelKeysMapping"),
        annotation_keys_mapping=_str_map(
            spec.get("annotationKeysMapping"), source, "spec.annotationKeysMapping"
        ),
        label_suffixes=_str_map(spec.get("labelSuffixes"), source, "spec.labelSuffixes"),
        patch=patch,
        probability=probability,
        priority=_int(spec.get("priority"), source, "spec.priority") or 0,
        skip_update_resources=ANNOTATION_SKIP_UPDATE_RESOURCES in annotations,
        skip_next_profile=ANNOTATION_SKIP_NEXT_PROFILE in annotations,
    )


def parse_profiles(objs: Sequence[Mapping[str, Any]]) -> list[Profile]:
    """Every usable profile in the order they apply; a bad one is logged and left out."""
    out = []
    for obj in objs:
        try:
            out.append(parse_profile(obj))
        except ProfileError as err:
            logger.warning("ignoring %s", err)
    return sorted(out, key=lambda p: (p.priority, p.name), reverse=True)


# The walk ---------------------------------------------------------------------------------------
@frozen
class Plan:
    """What the profiles will do to one pod, decided before any is applied."""

    apply: tuple[Profile, ...]
    """The profiles to apply, in order (matched, not skipped by probability or by
    ``skip-next-profile``)."""
    translate: bool
    """Whether the batch/mid translation runs after them."""


def plan(
    profiles: Sequence[Profile],
    pod_labels: Mapping[str, str],
    ns_labels: Mapping[str, str] | None,
    roll: Callable[[], int] = lambda: random.randrange(100),
) -> Plan | None:
    """The walk over ``profiles`` (in the order they apply); None when none matches.
    ``roll`` is ``rand.Intn(100)``, drawn once for each matched profile with a probability
    strictly between 0 and 100. Raises :class:`ProfileError` for a bad probability."""
    matched = [p for p in profiles if p.matches(pod_labels, ns_labels)]
    if not matched:
        return None
    apply: list[Profile] = []
    skip_resources = False
    for profile in matched:
        skip_resources = skip_resources or profile.skip_update_resources
        percent = profile.percent()
        if percent == 0 or (percent != 100 and roll() > percent):
            logger.debug("profile %s skipped by its probability (%d%%)", profile.name, percent)
            continue
        apply.append(profile)
        if profile.skip_next_profile:
            break
    return Plan(tuple(apply), translate=not skip_resources)


def apply_profile(pod: dict[str, Any], profile: Profile, pc: PriorityClassRef | None) -> None:
    """Apply one profile to ``pod`` in place (``pc``: its PriorityClass, looked up by the
    caller; required when the profile names one)."""
    meta = pod.setdefault("metadata", {})
    spec = pod.setdefault("spec", {})
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    labels.update(profile.labels)
    annotations.update(profile.annotations)
    for old, new in profile.label_keys_mapping.items():
        labels[new] = labels.get(old, "")
    for old, new in profile.annotation_keys_mapping.items():
        annotations[new] = annotations.get(old, "")
    for key, suffix in profile.label_suffixes.items():
        if key in labels:
            labels[key] += suffix
    if profile.scheduler_name:
        spec["schedulerName"] = profile.scheduler_name
    if profile.qos_class:
        labels[LABEL_POD_QOS] = profile.qos_class
    if profile.priority_class_name:
        if pc is None:
            raise ProfileError(
                f"PriorityClass {profile.priority_class_name!r} not found",
                source=profile.source,
                field="spec.priorityClassName",
            )
        spec["priorityClassName"] = profile.priority_class_name
        spec["priority"] = pc.value
        if pc.preemption_policy is None:
            spec.pop("preemptionPolicy", None)
        else:
            spec["preemptionPolicy"] = pc.preemption_policy
    if profile.koordinator_priority is not None:
        labels[LABEL_POD_PRIORITY] = str(profile.koordinator_priority)
    if labels or "labels" in meta:
        meta["labels"] = labels
    if annotations or "annotations" in meta:
        meta["annotations"] = annotations
    if profile.patch:
        # upstream merges the patch into json.Marshal(pod): quantities as Go writes them
        patched = apply_merge_patch(marshal_quantities(pod), profile.patch, merge_named_lists=True)
        pod.clear()
        pod.update(patched)


# Batch and mid resources -------------------------------------------------------------------------
def _kube_best_effort(spec: Mapping[str, Any]) -> bool:
    """``qos.GetPodQOS`` is BestEffort: no container asks for or limits cpu or memory."""
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or ():
            res = c.get("resources") or {}
            for side in ("requests", "limits"):
                for name in ("cpu", "memory"):
                    value = (res.get(side) or {}).get(name)
                    try:
                        if value is not None and quantity_milli_value(value) > 0:
                            return False
                    except ValueError:
                        continue
    return True


def priority_class(pod: Mapping[str, Any]) -> str:
    """``GetPodPriorityClassWithDefault`` of a pod being created."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    spec = pod.get("spec") or {}
    qos = labels.get(LABEL_POD_QOS, "")
    if qos not in _QOS_NAMES:
        qos = QoSClass.BE.value if _kube_best_effort(spec) else QoSClass.LS.value
    return pod_priority_class_with_default(labels, spec.get("priority"), qos)


def _translate(
    resources: dict[str, Any],
    names: Mapping[str, str],
    where: tuple[str, int, str] | None,
    made: dict[Path, GoIdentity],
) -> None:
    for native, extended in names.items():
        if native not in resources:
            continue
        value = resources.pop(native)
        if native == "cpu":
            milli = quantity_milli_value(value)
            resources[extended] = format_quantity(milli, Format.DECIMAL_SI)
            identity = go_identity_of_int(milli, Format.DECIMAL_SI)
        else:  # the same Quantity: its text and its representation
            resources[extended] = value
            identity = go_identity(value)
        if where is not None:
            made[(*where, extended)] = identity


def translate_resources(pod: dict[str, Any]) -> dict[Path, GoIdentity]:
    """Move cpu and memory to the batch or mid resources of the pod's priority class, in place;
    the Go representation of every quantity it made, by where it sits (for
    :mod:`manager.webhook.extendedspec`)."""
    made: dict[Path, GoIdentity] = {}
    names = TRANSLATED.get(priority_class(pod))
    spec = pod.get("spec")
    if names is None or not isinstance(spec, dict):
        return made
    for group in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(group) or ()):
            res = container.get("resources")
            if not isinstance(res, dict):
                continue
            for side in ("requests", "limits"):
                if isinstance(res.get(side), dict):
                    res[side] = dict(res[side])
                    _translate(res[side], names, (group, i, side), made)
            limits = res.get("limits") or {}
            for extended in names.values():
                requests = res.get("requests") or {}
                if extended in limits and extended not in requests:
                    res["requests"] = {**requests, extended: limits[extended]}
                    made[(group, i, "requests", extended)] = made.get(
                        (group, i, "limits", extended)
                    ) or go_identity(limits[extended])
    if isinstance(spec.get("overhead"), dict):
        spec["overhead"] = dict(spec["overhead"])
        _translate(spec["overhead"], names, None, made)
    return made


@frozen
class Mutation:
    """A pod after the profiles."""

    pod: dict[str, Any]
    """The mutated copy."""
    applied: list[str]
    """The names of the profiles applied, in order."""
    made: dict[Path, GoIdentity]
    """What :func:`translate_resources` made."""


def mutate(
    pod: Mapping[str, Any],
    walk: Plan | None,
    priority_classes: Mapping[str, PriorityClassRef],
) -> Mutation:
    """The pod after ``walk`` (:func:`plan`): every profile in turn, then the translation.
    ``priority_classes``: the PriorityClasses the applied profiles name, by name (a missing
    one is a :class:`ProfileError`)."""
    out = copy.deepcopy(dict(pod))
    if walk is None:
        return Mutation(out, [], {})
    for profile in walk.apply:
        apply_profile(out, profile, priority_classes.get(profile.priority_class_name))
    made = translate_resources(out) if walk.translate else {}
    return Mutation(out, [p.name for p in walk.apply], made)
