"""Pod-level QoS overrides by annotation (Koordinator v1.5 to HEAD): the keys and a typed parser
for each value.

- ``koordinator.sh/cpuQOS``: ``{"enable": true, "groupIdentity": -1}`` (upstream ``CPUQOSCfg``,
  ``apis/slo/v1alpha1/pod.go`` ``GetPodCPUQoSConfigByAttr``; the ``groupidentity`` hook applies
  it to LS pods only);
- ``node.koordinator.sh/resctrl``: ``{"llc": {"schemata": {"range": [0, 30]}}, "mb":
  {"schemata": {"percent": 20}}}`` (``ResctrlConfig``, ``apis/extension/resctrl.go``; the
  ``resctrl`` hook puts the pod in a control group ``koordlet-<uid>`` of its own);
- ``koordinator.sh/networkQOS``: ``{"ingressLimit": "10M", "egressLimit": "20M"}``, bit/s
  quantities (``AnnotationNetworkQOS``, ``apis/extension/constants.go``; the ``terwayqos``
  hook's ``NetworkQoS``);
- ``koordinator.sh/oom-score-adj``: ``"-500"``, an int64 in -1000..1000 (``AnnotationOOMScoreAdj``,
  PR #3139, gate ``OOMScoreAdj``), and ``koordinator.sh/oom-score-adj-spec``:
  ``{"container-a": -500}``, per container, before the pod's value
  (``AnnotationOOMScoreAdjSpec``).

Each parser raises :class:`AnnotationError` (a ``ValueError``) naming the annotation and what is
wrong, for what upstream's Go code refuses: JSON that does not decode into the Go type (a string
where a number goes, ``1.5`` into an ``int64``), a group identity outside -1..2, an
``oom_score_adj`` outside -1000..1000, a quantity that does not parse. As Go's ``encoding/json``
does, keys match the field names case-insensitively and unknown keys are ignored. The koordlet
keeps a pod with a malformed value on its class defaults and says so once (docs/qos-overrides.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from apis.extension import ANNOTATION_POD_RESCTRL, DOMAIN_PREFIX
from apis.quantity import parse_quantity
from apis.records import frozen

ANNOTATION_POD_CPU_QOS = DOMAIN_PREFIX + "cpuQOS"
"""Pod annotation: the pod's CPU QoS (``AnnotationPodCPUQoS``)."""
ANNOTATION_POD_NETWORK_QOS = DOMAIN_PREFIX + "networkQOS"
"""Pod annotation: the pod's network bandwidth limits in bit/s (``AnnotationNetworkQOS``)."""
ANNOTATION_OOM_SCORE_ADJ = DOMAIN_PREFIX + "oom-score-adj"
"""Pod annotation: the ``oom_score_adj`` of the processes of the pod's containers
(``AnnotationOOMScoreAdj``); removing it does not put the runtime's value back (upstream)."""
ANNOTATION_OOM_SCORE_ADJ_SPEC = DOMAIN_PREFIX + "oom-score-adj-spec"
"""Pod annotation: ``oom_score_adj`` per container name, JSON (``AnnotationOOMScoreAdjSpec``);
a container not listed takes :data:`ANNOTATION_OOM_SCORE_ADJ`."""
RESCTRL_GROUP_PREFIX = "koordlet-"
"""The resctrl control group of a pod with :data:`ANNOTATION_POD_RESCTRL` is this plus its UID
(upstream's ``ClosdIdPrefix``)."""
OOM_SCORE_ADJ_MIN, OOM_SCORE_ADJ_MAX = -1000, 1000
"""The kernel's range of ``/proc/<pid>/oom_score_adj``."""
GROUP_IDENTITY_MIN, GROUP_IDENTITY_MAX = -1, 2
"""Anolis' group identity values (``cpu.bvt_warp_ns``)."""
INVALID_ANNOTATION_REASON = "InvalidPodAnnotation"
"""The reason of the koordlet's Warning Event on a pod whose override it cannot apply (ours:
upstream only logs); the QoS strategies and the runtime hooks record the same."""

__all__ = [
    "ANNOTATION_OOM_SCORE_ADJ",
    "ANNOTATION_OOM_SCORE_ADJ_SPEC",
    "ANNOTATION_POD_CPU_QOS",
    "ANNOTATION_POD_NETWORK_QOS",
    "ANNOTATION_POD_RESCTRL",
    "INVALID_ANNOTATION_REASON",
    "AnnotationError",
    "PodCPUQoS",
    "PodNetworkQoS",
    "PodResctrl",
    "ResctrlSchemata",
    "oom_score_adj_for",
    "parse_pod_cpu_qos",
    "parse_pod_network_qos",
    "parse_pod_resctrl",
]


class AnnotationError(ValueError):
    """A pod annotation's value that cannot be applied; the message names the annotation."""

    def __init__(self, annotation: str, why: str) -> None:
        self.annotation = annotation
        self.why = why
        super().__init__(f"annotation {annotation}: {why}")


# Go's encoding/json, as far as these types need it ----------------------------------------------


def _decode(annotation: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as err:
        raise AnnotationError(annotation, f"not JSON: {err}") from None


def _object(annotation: str, value: Any, where: str) -> dict[str, Any]:
    """A JSON object with its keys folded to lower case (Go matches field names so)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AnnotationError(annotation, f"{where}: want an object, got {json.dumps(value)}")
    return {str(k).lower(): v for k, v in value.items()}


def _int(annotation: str, value: Any, where: str) -> int | None:
    """A Go ``int``/``*int64`` field: null is unset; a number must be whole."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise AnnotationError(annotation, f"{where}: want an integer, got {json.dumps(value)}")
    return value


def _bool(annotation: str, value: Any, where: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise AnnotationError(annotation, f"{where}: want true or false, got {json.dumps(value)}")
    return value


# koordinator.sh/cpuQOS ----------------------------------------------------------------------------


@frozen
class PodCPUQoS:
    """``koordinator.sh/cpuQOS`` (upstream ``CPUQOSCfg``)."""

    enable: bool | None = None
    """Upstream's rule: absent or false gives the pod group identity 0."""
    group_identity: int | None = None
    """``groupIdentity``, -1..2."""
    sched_idle: int | None = None
    """``schedIdle``, 0 or 1 (``cpu.idle`` on mainline kernels)."""
    core_expeller: bool | None = None
    """``coreExpeller`` (core scheduling; read, not applied by the koordlet's reconcile)."""

    def identity(self, class_value: int) -> int:
        """The pod's group identity: the annotation's (else the class's) when enabled, else 0,
        as upstream's ``SetPodBvtValue`` decides for an LS pod."""
        if not self.enable:
            return 0
        return class_value if self.group_identity is None else self.group_identity

    def idle(self, class_idle: bool) -> bool:
        """Whether the pod should be ``cpu.idle`` on a mainline kernel: the best-effort identity
        (-1) or ``schedIdle: 1``; not when disabled; else the class's."""
        if not self.enable:
            return False
        if self.sched_idle is not None:
            return self.sched_idle == 1
        if self.group_identity is not None:
            return self.group_identity == GROUP_IDENTITY_MIN
        return class_idle


def parse_pod_cpu_qos(text: str) -> PodCPUQoS:
    """The value of ``koordinator.sh/cpuQOS``; :class:`AnnotationError` when malformed."""
    a = ANNOTATION_POD_CPU_QOS
    obj = _object(a, _decode(a, text), "the value")
    cfg = PodCPUQoS(
        enable=_bool(a, obj.get("enable"), "enable"),
        group_identity=_int(a, obj.get("groupidentity"), "groupIdentity"),
        sched_idle=_int(a, obj.get("schedidle"), "schedIdle"),
        core_expeller=_bool(a, obj.get("coreexpeller"), "coreExpeller"),
    )
    gi = cfg.group_identity
    if gi is not None and not GROUP_IDENTITY_MIN <= gi <= GROUP_IDENTITY_MAX:
        raise AnnotationError(a, f"bad group identity value: {gi} (allowed -1..2)")
    if cfg.sched_idle is not None and cfg.sched_idle not in (0, 1):
        raise AnnotationError(a, f"schedIdle must be 0 or 1, got {cfg.sched_idle}")
    return cfg


# node.koordinator.sh/resctrl ----------------------------------------------------------------------


@frozen
class ResctrlSchemata:
    """One resource's ``schemata`` (upstream ``SchemataConfig``)."""

    percent: int = 0
    """Memory bandwidth percent (``mb``); 0: unset."""
    range: tuple[int, int] | None = None
    """L3 ways, ``[start, end)`` percent of the cache (``llc``); None: unset."""


@frozen
class PodResctrl:
    """``node.koordinator.sh/resctrl`` (upstream ``ResctrlConfig``), as upstream's
    ``ParseSchemata`` reads it: ``llc`` ranges and ``mb`` percents, for every cache domain
    (``schemata``) and per cache id (``schemataPerCache``, which wins for its domain)."""

    llc: ResctrlSchemata = ResctrlSchemata()
    llc_per_cache: tuple[tuple[int, ResctrlSchemata], ...] = ()
    mb: ResctrlSchemata = ResctrlSchemata()
    mb_per_cache: tuple[tuple[int, ResctrlSchemata], ...] = ()

    @property
    def empty(self) -> bool:
        """Nothing to write: no range and no percent anywhere."""
        return (
            self.llc.range is None
            and not self.llc_per_cache
            and not self.mb.percent
            and not self.mb_per_cache
        )


def _schemata(a: str, value: Any, where: str, kind: str) -> ResctrlSchemata:
    obj = _object(a, value, where)
    percent = _int(a, obj.get("percent"), f"{where}.percent") or 0
    raw_range = obj.get("range")
    rng: tuple[int, int] | None = None
    if raw_range is not None:
        if not isinstance(raw_range, list):
            raise AnnotationError(a, f"{where}.range: want a list, got {json.dumps(raw_range)}")
        items = [_int(a, v, f"{where}.range[{i}]") for i, v in enumerate(raw_range)]
        if len(items) == 2 and None not in items:
            start, end = items[0], items[1]
            assert start is not None
            assert end is not None
            if not 0 <= start < end <= 100:
                raise AnnotationError(a, f"{where}.range {raw_range}: want 0 <= start < end <= 100")
            rng = (start, end)
        elif items:
            raise AnnotationError(a, f"{where}.range: want [start, end], got {raw_range}")
    if kind == "mb" and percent and not 0 < percent <= 100:
        raise AnnotationError(a, f"{where}.percent {percent}: want 1..100")
    return ResctrlSchemata(percent, rng)


def _per_cache(
    a: str, value: Any, where: str, kind: str
) -> tuple[tuple[int, ResctrlSchemata], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise AnnotationError(a, f"{where}: want a list, got {json.dumps(value)}")
    out = []
    for i, item in enumerate(value):
        obj = _object(a, item, f"{where}[{i}]")
        cache_id = _int(a, obj.get("cacheid"), f"{where}[{i}].cacheID") or 0
        out.append((cache_id, _schemata(a, item, f"{where}[{i}]", kind)))
    return tuple(out)


def parse_pod_resctrl(text: str) -> PodResctrl:
    """The value of ``node.koordinator.sh/resctrl``; :class:`AnnotationError` when malformed
    (upstream logs a bad range and writes what it could; here the whole value is refused)."""
    a = ANNOTATION_POD_RESCTRL
    obj = _object(a, _decode(a, text), "the value")
    llc = _object(a, obj.get("llc"), "llc")
    mb = _object(a, obj.get("mb"), "mb")
    return PodResctrl(
        llc=_schemata(a, llc.get("schemata"), "llc.schemata", "llc"),
        llc_per_cache=_per_cache(a, llc.get("schematapercache"), "llc.schemataPerCache", "llc"),
        mb=_schemata(a, mb.get("schemata"), "mb.schemata", "mb"),
        mb_per_cache=_per_cache(a, mb.get("schematapercache"), "mb.schemataPerCache", "mb"),
    )


# koordinator.sh/networkQOS ------------------------------------------------------------------------


@frozen
class PodNetworkQoS:
    """``koordinator.sh/networkQOS``, bit/s; 0: no limit (upstream's zero value)."""

    ingress_limit_bps: int = 0
    egress_limit_bps: int = 0


def _bps(a: str, value: Any, where: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, str):  # Go: a string field; a JSON number does not decode
        raise AnnotationError(a, f"{where}: want a quantity string, got {json.dumps(value)}")
    try:
        bps = parse_quantity(value).int_value
    except ValueError as err:
        raise AnnotationError(a, f"{where} {value!r}: {err}") from None
    if bps < 0:
        raise AnnotationError(a, f"{where} {value!r} is negative")
    return bps


def parse_pod_network_qos(text: str) -> PodNetworkQoS:
    """The value of ``koordinator.sh/networkQOS``; :class:`AnnotationError` when malformed."""
    a = ANNOTATION_POD_NETWORK_QOS
    obj = _object(a, _decode(a, text), "the value")
    return PodNetworkQoS(
        _bps(a, obj.get("ingresslimit"), "ingressLimit"),
        _bps(a, obj.get("egresslimit"), "egressLimit"),
    )


# koordinator.sh/oom-score-adj ---------------------------------------------------------------------


def _score(a: str, value: int, where: str) -> int:
    if not OOM_SCORE_ADJ_MIN <= value <= OOM_SCORE_ADJ_MAX:
        raise AnnotationError(a, f"{where} {value} is outside -1000..1000")
    return value


def oom_score_adj_spec(annotations: Mapping[str, str]) -> dict[str, int] | None:
    """``koordinator.sh/oom-score-adj-spec`` by container name; None when absent or empty."""
    a = ANNOTATION_OOM_SCORE_ADJ_SPEC
    text = annotations.get(a, "")
    if not text:
        return None
    obj = _decode(a, text)
    if not isinstance(obj, dict):
        raise AnnotationError(a, f"want an object of container: value, got {json.dumps(obj)}")
    out = {}
    for name, value in obj.items():
        score = _int(a, value, f"container {name!r}")
        if score is not None:
            out[str(name)] = _score(a, score, f"container {name!r}")
    return out


def oom_score_adj_default(annotations: Mapping[str, str]) -> int | None:
    """``koordinator.sh/oom-score-adj`` (Go's ``ParseInt``); None when absent or empty."""
    a = ANNOTATION_OOM_SCORE_ADJ
    text = annotations.get(a, "")
    if not text:
        return None
    body = text[1:] if text[:1] in "+-" else text
    if not body.isascii() or not body.isdigit():
        raise AnnotationError(a, f"{text!r} is not an integer")
    return _score(a, int(text), "the value")


def oom_score_adj_for(annotations: Mapping[str, str], container: str) -> int | None:
    """The ``oom_score_adj`` a container's processes should have (upstream's
    ``getOOMScoreAdjForContainer``): its entry in the spec, else the pod's value, else None (no
    intervention). :class:`AnnotationError` for the annotation that is malformed."""
    spec = oom_score_adj_spec(annotations)
    if spec is not None and container in spec:
        return spec[container]
    return oom_score_adj_default(annotations)
