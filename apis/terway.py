"""Terway's ``terway-qos`` daemon: the two files Koordinator's ``TerwayQoS`` runtime hook writes for
it, their formats, and the formula that fills them from the NodeSLO and the pods.

Upstream: ``pkg/koordlet/runtimehooks/hooks/terwayqos/terwayqos.go`` (``parseNetQoS``, ``parseQoS``,
``parseQuantity``, ``getPodQoS``, ``getPodPrio``, ``BitsToBytes``) and ``types.go`` (``Node`` and
its ``MarshalText``, ``Pod``, ``QoSConfig``, ``prioMapping``). The reader is
AliyunContainerService/terway-qos, ``pkg/config`` (``rootFileConfig``, ``GetGlobalConfig`` with
its ``parseConfig``), which watches its folder with inotify.

In terway-qos's folder, ``/var/lib/terway/qos`` on the host (:data:`TERWAY_QOS_DIR`):

- ``global_bps_config``: text, one ``name value`` line per field of :class:`GlobalBpsConfig`, in
  its order, every value in **bytes** per second (bit/s divided by 8, rounded down);
- ``pod.json``: one JSON object keyed by pod UID; each value a :class:`TerwayPod` (Go's
  ``json.Marshal`` of ``map[string]*Pod``: keys sorted, no spaces, no trailing newline).

The formula (docs/runtimehooks.md, "TerwayQoS", has the table and where ours differs from
upstream): ``hw_{tx,rx}_bps_max`` is ``systemStrategy.totalNetworkBandwidth``; the LS class's
``networkQOS`` fills ``offline_l1_*`` and the BE class's ``offline_l2_*`` (tx: egress, rx:
ingress; min: the request, max: the limit), each a percent of the total or a quantity in bit/s
(:func:`apis.netqos.bandwidth_bps`, the network QoS strategy's parser); a class whose
``networkQOS`` is not enabled has zeros.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from types import MappingProxyType
from typing import Any

from apis.extension import LABEL_POD_QOS, KubeQOS, QoSClass
from apis.netqos import bandwidth_bps
from apis.pod_overrides import ANNOTATION_POD_NETWORK_QOS, parse_pod_network_qos
from apis.quantity import parse_quantity
from apis.records import frozen
from apis.slo import SchemaError
from apis.slo_qos import NetworkQOSConfig
from apis.slo_strategies import ResourceQOSStrategy

TERWAY_QOS_DIR = "/var/lib/terway/qos"
"""terway-qos's folder on the host (its ``rootFileConfig``); Koordinator's koordlet writes it at
``/host-var-lib/terway/qos``, the DaemonSet's mount of it (``rootPath``)."""
GLOBAL_BPS_CONFIG = "global_bps_config"
"""The node's bandwidths (upstream ``nodeConfig``)."""
POD_CONFIG = "pod.json"
"""The pods and their own limits (upstream ``podConfig``)."""
NET_CLS_ROOT = "/sys/fs/cgroup/net_cls"
"""Where terway-qos finds the pods' cgroups: ``cgroupDir`` is this joined with the pod's cgroup
folder, whatever the koordlet's own ``--cgroup-root-dir`` (upstream writes the same literal)."""
BPF_PIN_PARTS = ("fs", "bpf", "terway")
"""Below the sysfs root: where terway-qos pins its BPF maps (``pkg/bpf/manager.go``,
``pinPath``); present while terway-qos runs, or has run since the last boot."""

PRIO_L0, PRIO_L1, PRIO_L2 = 0, 1, 2
"""terway-qos's traffic levels: L0 online (SYSTEM), L1 (LSE, LSR, LS), L2 offline (BE)."""
PRIO_OF_QOS: Mapping[str, int] = MappingProxyType(
    {
        QoSClass.SYSTEM.value: PRIO_L0,
        QoSClass.LSE.value: PRIO_L1,
        QoSClass.LSR.value: PRIO_L1,
        QoSClass.LS.value: PRIO_L1,
        QoSClass.BE.value: PRIO_L2,
    }
)
"""``koordinator.sh/qosClass`` label value → level (upstream ``prioMapping``)."""
PRIO_OF_KUBE_QOS: Mapping[KubeQOS, int] = MappingProxyType(
    {KubeQOS.GUARANTEED: PRIO_L1, KubeQOS.BURSTABLE: PRIO_L1, KubeQOS.BESTEFFORT: PRIO_L2}
)
"""Kubernetes QoS class → level, for a pod without a known label (``getPodPrio``)."""

_FIELD = "spec.resourceQOSStrategy"
_TOTAL_FIELD = "spec.systemStrategy.totalNetworkBandwidth"


def bits_to_bytes(bits: int) -> int:
    """bit/s → byte/s, rounded down (upstream ``BitsToBytes``)."""
    return bits // 8


def pod_prio(labels: Mapping[str, str], kube_qos: KubeQOS | None) -> int:
    """A pod's level: its ``koordinator.sh/qosClass`` label's, else its Kubernetes QoS class's,
    else L0 (``getPodPrio``)."""
    prio = PRIO_OF_QOS.get(labels.get(LABEL_POD_QOS, ""))
    if prio is not None:
        return prio
    return PRIO_OF_KUBE_QOS.get(kube_qos, PRIO_L0) if kube_qos is not None else PRIO_L0


def net_cls_dir(cgroup_dir: str) -> str:
    """``cgroupDir`` of a pod whose cgroup folder (relative to a controller's root) is
    ``cgroup_dir``, cleaned as Go's ``filepath.Join`` cleans it."""
    return posixpath.normpath(posixpath.join(NET_CLS_ROOT, cgroup_dir.lstrip("/")))


# global_bps_config --------------------------------------------------------------------------------


@frozen
class GlobalBpsConfig:
    """``global_bps_config``: bytes per second; the attribute names are the file's (upstream
    ``Node``'s ``text`` tags), in the file's order."""

    hw_tx_bps_max: int = 0
    """The node's egress bandwidth: ``totalNetworkBandwidth``."""
    hw_rx_bps_max: int = 0
    """The node's ingress bandwidth: the same total."""
    offline_l1_tx_bps_min: int = 0
    """LS class ``networkQOS.egressRequest``."""
    offline_l1_tx_bps_max: int = 0
    """LS class ``networkQOS.egressLimit``."""
    offline_l1_rx_bps_min: int = 0
    """LS class ``networkQOS.ingressRequest``."""
    offline_l1_rx_bps_max: int = 0
    """LS class ``networkQOS.ingressLimit``."""
    offline_l2_tx_bps_min: int = 0
    """BE class ``networkQOS.egressRequest``."""
    offline_l2_tx_bps_max: int = 0
    """BE class ``networkQOS.egressLimit``."""
    offline_l2_rx_bps_min: int = 0
    """BE class ``networkQOS.ingressRequest``."""
    offline_l2_rx_bps_max: int = 0
    """BE class ``networkQOS.ingressLimit``."""

    def to_text(self) -> str:
        """The file's bytes, as ``Node.MarshalText`` writes them (``name value\\n`` each)."""
        return "".join(f"{f.name} {getattr(self, f.name)}\n" for f in fields(self))

    @classmethod
    def from_text(cls, text: str) -> GlobalBpsConfig:
        """The file as terway-qos reads it (``parseConfig``): each name's first ``name value``
        (or ``name=value``) match; 0 for a name the text lacks."""
        values = {}
        for f in fields(cls):
            match = re.search(rf"{f.name}(?:=?|\s+)(\d+)", text)
            values[f.name] = int(match[1]) if match else 0
        return cls(**values)

    def as_dict(self) -> dict[str, int]:
        """JSON-ready, in the file's order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def total_network_bandwidth_bps(value: int | str) -> int:
    """``systemStrategy.totalNetworkBandwidth`` in bit/s; :class:`~apis.slo.SchemaError` naming
    the field when it is not a quantity or is negative."""
    try:
        bps = parse_quantity(value).int_value
    except ValueError as err:
        raise SchemaError(f"{value!r} is not a quantity: {err}", field=_TOTAL_FIELD) from err
    if bps < 0:
        raise SchemaError(f"{value!r} is negative", field=_TOTAL_FIELD)
    return bps


def _class_bytes(cfg: NetworkQOSConfig, total: int, where: str) -> tuple[int, int, int, int]:
    """(egress request, egress limit, ingress request, ingress limit) in byte/s."""
    if not cfg.enable:
        return 0, 0, 0, 0
    out = []
    for name, value in (
        ("egressRequest", cfg.egress_request),
        ("egressLimit", cfg.egress_limit),
        ("ingressRequest", cfg.ingress_request),
        ("ingressLimit", cfg.ingress_limit),
    ):
        bits = bandwidth_bps(value, total, field=f"{where}.{name}")
        if bits > total:
            raise SchemaError(
                f"{value!r} ({bits} bit/s) is above the node's total {total} bit/s "
                "(systemStrategy.totalNetworkBandwidth)",
                field=f"{where}.{name}",
            )
        out.append(bits_to_bytes(bits))
    return out[0], out[1], out[2], out[3]


def global_bps_config(
    qos: ResourceQOSStrategy, total_network_bandwidth: int | str
) -> GlobalBpsConfig:
    """``global_bps_config`` for the NodeSLO's ``resourceQOSStrategy`` and
    ``systemStrategy.totalNetworkBandwidth`` (upstream ``parseNetQoS``); a value that cannot be
    applied raises :class:`~apis.slo.SchemaError` naming its field."""
    total = total_network_bandwidth_bps(total_network_bandwidth)
    l1 = _class_bytes(qos.ls_class.network_qos, total, f"{_FIELD}.lsClass.networkQOS")
    l2 = _class_bytes(qos.be_class.network_qos, total, f"{_FIELD}.beClass.networkQOS")
    hw = bits_to_bytes(total)
    return GlobalBpsConfig(hw, hw, *l1, *l2)


# pod.json -----------------------------------------------------------------------------------------


@frozen
class TerwayPod:
    """One value of ``pod.json`` (upstream ``Pod`` with its ``QoSConfig``)."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    prio: int
    """:func:`pod_prio`."""
    cgroup_dir: str
    """:func:`net_cls_dir` of the pod's cgroup."""
    ingress_bandwidth: int = 0
    """The pod's ``koordinator.sh/networkQOS`` ``ingressLimit`` in byte/s; 0: no limit."""
    egress_bandwidth: int = 0
    """Its ``egressLimit`` in byte/s; 0: no limit."""

    def to_wire(self) -> dict[str, Any]:
        """The JSON object, keys in the Go struct's order."""
        return {
            "podName": self.pod_name,
            "podNamespace": self.pod_namespace,
            "podUID": self.pod_uid,
            "prio": self.prio,
            "cgroupDir": self.cgroup_dir,
            "qosConfig": {
                "ingressBandwidth": self.ingress_bandwidth,
                "egressBandwidth": self.egress_bandwidth,
            },
        }

    @classmethod
    def from_wire(cls, obj: Any) -> TerwayPod:
        """The inverse of :meth:`to_wire`; ``ValueError`` naming what does not fit."""
        try:
            qos = obj["qosConfig"]
            pod = cls(
                str(obj["podName"]),
                str(obj["podNamespace"]),
                str(obj["podUID"]),
                _uint(obj["prio"]),
                str(obj["cgroupDir"]),
                _uint(qos["ingressBandwidth"]),
                _uint(qos["egressBandwidth"]),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a terway-qos pod: {err}: {json.dumps(obj)[:200]}") from err
        return pod


def _uint(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"want a non-negative integer, got {value!r}")
    return value


def pod_bandwidth(annotations: Mapping[str, str]) -> tuple[int, int]:
    """(ingress, egress) byte/s of the pod's ``koordinator.sh/networkQOS`` (upstream
    ``getPodQoS``); (0, 0) without it. :class:`~apis.pod_overrides.AnnotationError` when it is
    malformed."""
    text = annotations.get(ANNOTATION_POD_NETWORK_QOS, "")
    if not text:
        return 0, 0
    value = parse_pod_network_qos(text)
    return bits_to_bytes(value.ingress_limit_bps), bits_to_bytes(value.egress_limit_bps)


def pod_config_text(pods: Iterable[TerwayPod]) -> str:
    """``pod.json``'s bytes: Go's ``json.Marshal`` of the map by UID (keys sorted, compact, ``<``
    ``>`` ``&`` escaped as Go escapes them)."""
    by_uid = {p.pod_uid: p.to_wire() for p in pods}
    obj = {uid: by_uid[uid] for uid in sorted(by_uid)}
    return go_json(obj)


def parse_pod_config(text: str) -> dict[str, TerwayPod]:
    """``pod.json`` read back, by UID; ``ValueError`` when it is not the koordlet's format."""
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError(  # noqa: TRY004 (a malformed document, as json.loads's own errors)
            f"pod.json: want an object keyed by pod UID, got {type(obj).__name__}"
        )
    return {str(uid): TerwayPod.from_wire(value) for uid, value in obj.items()}


_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
               "\u2029": "\\u2029"}  # fmt: skip


def go_json(obj: Any) -> str:
    """``obj`` encoded as Go's ``encoding/json`` encodes it: no spaces, UTF-8 as is, and the
    HTML-safe escapes (these characters only occur inside strings)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return re.sub("[<>&\u2028\u2029]", lambda m: _GO_ESCAPES[m[0]], text)
