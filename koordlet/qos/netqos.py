"""Network QoS by tc (Koordinator's ``tc`` plugin, gate ``TCNetworkQoS``): an HTB tree on the
node's interface with a class for SYSTEM, LS and BE, and each pod's ``net_cls.classid``
(docs/qos-network.md has the full rules).

Each round, with ``resourceQOSStrategy`` of the NodeSLO in force:

- ``policies.netQOSPolicy: terway-qos`` installs no tc tree (a tree the koordlet installed
  earlier is removed): the Terway CNI's ``terway-qos`` daemon enforces it, from the files the
  ``TerwayQoS`` runtime hook writes while its gate is on (``koordlet.runtimehooks.terwayqos``);
  the round's notes say which;
- with ``tc`` (the default) and ``networkQOS.enable`` on ``lsClass`` or ``beClass``, the tree of
  ``apis.netqos`` is kept on the interface of this network namespace's default route (upstream's
  ``GetLinkInfoByDefaultRoute``): root ``1:1`` at the node's total, LS and BE at their
  ``egressRequest`` (rate) and ``egressLimit`` (ceil), SYSTEM at the rest (``total - LS request
  - BE request``, ceil the total); a class whose ``networkQOS`` is off is guaranteed nothing and
  may borrow up to the total. Then every pod's cgroup and its containers' get the class id of
  their class in ``net_cls.classid`` (the ``tc`` runtime hook sets the same at creation);
- with neither class enabled, the koordlet's tree is removed (a tree without the koordlet's
  filter is never touched).

The total is the Node's ``node.koordinator.sh/network-bandwidth`` (cluster mode), else
``systemStrategy.totalNetworkBandwidth`` when not 0, else the link speed. Requests and limits
that do not make sense (a percent above 100, a quantity that does not parse, requests above the
total) reject the round: nothing is changed, the tree applied last stays, and the report names
the field. HTB shapes egress only: ``ingressRequest``/``ingressLimit`` are reported as not
enforced.

A classified pod with ``koordinator.sh/networkQOS`` (``{"egressLimit": "20M"}``, bit/s; upstream's
``AnnotationNetworkQOS``, which only Terway enforces there) gets an HTB class of its own under the
root (ours): guaranteed nothing, its ceil the smaller of its ``egressLimit`` and its QoS class's
ceil, its QoS class's priority, a minor from ``apis.netqos.POD_CLASS_MINORS`` stable for its UID;
its cgroups' ``net_cls.classid`` point there. Such a pod's egress is held to its own limit; what
it sends is no longer counted in its QoS class's ceil. Classes of pods that are gone are deleted.
``ingressLimit`` is noted as not enforced; a malformed value leaves the pod in its QoS class and
is reported once (``ctx.pod_warnings``).

Every change goes through the executor's writer thread (``koordlet.executor.tc``,
``NET_CLS_CLASSID`` through the cgroup writer): audited, dry-run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apis.netqos import (
    CLASS_MINOR,
    CLASS_PRIO,
    DEFAULT_CLASS,
    POD_CLASS_MINORS,
    QDISC_HANDLE,
    ROOT_CLASS_MINOR,
    NetQoSClass,
    bandwidth_bps,
    class_handle,
    class_id_of,
    net_qos_class,
    node_bandwidth_bps,
    pod_class_minors,
)
from apis.pod_overrides import ANNOTATION_POD_NETWORK_QOS, AnnotationError, parse_pod_network_qos
from apis.quantity import parse_quantity
from apis.records import frozen
from apis.slo_inforce import RESOURCE_QOS_STRATEGY, SYSTEM_STRATEGY
from apis.slo_qos import NetQOSPolicy, NetworkQOSConfig
from apis.slo_strategies import ResourceQOSStrategy
from koordlet.errors import CgroupGoneError, HostError, InvalidValueError, UnsupportedError
from koordlet.executor.sysctl import call_on_writer, executor_hooks
from koordlet.executor.tc import ClassPlan, TCWriter, TreePlan, TreeResult
from koordlet.qos.framework import StrategyContext, StrategyReport
from koordlet.qos.podwarnings import PodAnnotationWarnings
from koordlet.statesinformer.model import PodInfo
from koordlet.system.knobs import NET_CLS_CLASSID
from koordlet.system.tc import link_speed_bps

logger = logging.getLogger(__name__)

NAME = "netqos"
"""Table name."""
FEATURE_GATE = "TCNetworkQoS"
"""Koordinator's feature gate of the tc plugin."""
TERWAY_GATE = "TerwayQoS"
"""The gate of the runtime hook that writes terway-qos's files."""
TERWAY = (
    "netQOSPolicy terway-qos: no tc tree; the TerwayQoS runtime hook writes terway-qos's "
    "global_bps_config and pod.json, which the Terway CNI's terway-qos daemon enforces (eBPF)"
)
TERWAY_GATE_OFF = (
    "netQOSPolicy terway-qos: no tc tree; the Terway CNI's terway-qos daemon enforces it, from "
    "files the TerwayQoS runtime hook writes, but its feature gate TerwayQoS is off: nothing "
    "writes them"
)
FIELD = "spec.resourceQOSStrategy"


class NetQoSConfigError(ValueError):
    """The NodeSLO's network QoS cannot be applied; the message names the field."""


@frozen
class Bandwidth:
    """The node's total and where it came from."""

    bps: int
    source: str


def node_bandwidth(
    annotations: Mapping[str, str], total_network_bandwidth: int | str, link_bps: int | None
) -> Bandwidth:
    """The node's total egress bandwidth (see the module docstring); ``NetQoSConfigError`` when
    none is known or the annotation or the NodeSLO's value is malformed."""
    try:
        annotated = node_bandwidth_bps(annotations)
    except ValueError as err:
        raise NetQoSConfigError(str(err)) from err
    if annotated is not None:
        return Bandwidth(annotated, "node annotation")
    where = "spec.systemStrategy.totalNetworkBandwidth"
    try:
        configured = parse_quantity(total_network_bandwidth).int_value
    except ValueError as err:
        raise NetQoSConfigError(f"{where}: {err}") from err
    if configured < 0:
        raise NetQoSConfigError(f"{where}: {total_network_bandwidth!r} is negative")
    if configured > 0:
        return Bandwidth(configured, "systemStrategy.totalNetworkBandwidth")
    if link_bps:
        return Bandwidth(link_bps, "link speed")
    raise NetQoSConfigError(
        "the node's bandwidth is unknown: no node annotation, totalNetworkBandwidth is 0 and "
        "the interface reports no link speed"
    )


def tree_classes(qos: ResourceQOSStrategy, total: int) -> tuple[tuple[ClassPlan, ...], list[str]]:
    """The classes of the tree for ``total`` bit/s, and notes; ``NetQoSConfigError`` naming
    the field for a value that cannot be applied."""
    notes: list[str] = []
    rates: dict[NetQoSClass, tuple[int, int]] = {}
    for net_class, json_name, cfg in (
        (NetQoSClass.LS, "lsClass", qos.ls_class.network_qos),
        (NetQoSClass.BE, "beClass", qos.be_class.network_qos),
    ):
        if not cfg.enable:
            rates[net_class] = (0, total)
            continue
        where = f"{FIELD}.{json_name}.networkQOS"
        try:
            rate = bandwidth_bps(cfg.egress_request, total, field=f"{where}.egressRequest")
            ceil = bandwidth_bps(cfg.egress_limit, total, field=f"{where}.egressLimit")
            bandwidth_bps(cfg.ingress_request, total, field=f"{where}.ingressRequest")
            bandwidth_bps(cfg.ingress_limit, total, field=f"{where}.ingressLimit")
        except ValueError as err:
            raise NetQoSConfigError(str(err)) from err
        if ceil > total:
            notes.append(f"{where}.egressLimit {ceil} bit/s above the node's {total}: capped")
            ceil = total
        if ceil < rate:
            notes.append(f"{where}.egressLimit below egressRequest: the ceil is the request")
        if _ingress_set(cfg):
            notes.append(f"{where}.ingress*: not enforced, HTB shapes egress only")
        rates[net_class] = (rate, ceil)
    requested = rates[NetQoSClass.LS][0] + rates[NetQoSClass.BE][0]
    if requested > total:
        raise NetQoSConfigError(
            f"{FIELD}: egressRequest of lsClass ({rates[NetQoSClass.LS][0]}) and beClass "
            f"({rates[NetQoSClass.BE][0]}) exceed the node's bandwidth ({total} bit/s)"
        )
    rates[NetQoSClass.SYSTEM] = (total - requested, total)
    for json_name, attr in (("lsrClass", "lsr_class"), ("systemClass", "system_class")):
        if getattr(qos, attr).network_qos.enable:
            notes.append(
                f"{FIELD}.{json_name}.networkQOS not applied: LSR pods share the LS class and "
                "SYSTEM gets what LS and BE do not request (upstream's tc plugin)"
            )
    root = class_handle(ROOT_CLASS_MINOR)
    classes = [ClassPlan("root", root, QDISC_HANDLE, total, total, 0)]
    for net_class in (NetQoSClass.SYSTEM, NetQoSClass.LS, NetQoSClass.BE):
        rate, ceil = rates[net_class]
        handle = class_handle(CLASS_MINOR[net_class])
        classes.append(ClassPlan(net_class.value, handle, root, rate, ceil, CLASS_PRIO[net_class]))
    return tuple(classes), notes


@frozen
class PodLimit:
    """A pod's own egress limit (``koordinator.sh/networkQOS``)."""

    uid: str
    name: str
    """``namespace/name``."""
    net_class: NetQoSClass
    egress_bps: int
    ingress_bps: int = 0


def pod_classes(
    limits: list[PodLimit], classes: tuple[ClassPlan, ...]
) -> tuple[list[ClassPlan], dict[str, int], list[str]]:
    """The pods' own classes under the root, each pod's class id, and notes (see the module
    docstring)."""
    by_name = {c.name: c for c in classes}
    root = class_handle(ROOT_CLASS_MINOR)
    minors = pod_class_minors(p.uid for p in limits)
    plans: list[ClassPlan] = []
    ids: dict[str, int] = {}
    notes: list[str] = []
    for p in limits:
        parent = by_name[p.net_class.value]
        handle = class_handle(minors[p.uid])
        ceil = min(p.egress_bps, parent.ceil_bps)
        plans.append(ClassPlan(f"pod {p.name}", handle, root, 0, ceil, parent.prio))
        ids[p.uid] = handle
        if p.ingress_bps:
            notes.append(
                f"pod {p.name}: {ANNOTATION_POD_NETWORK_QOS} ingressLimit not enforced, HTB "
                "shapes egress only"
            )
    return plans, ids, notes


def pod_limits(
    pods: Iterable[PodInfo],
    warnings: PodAnnotationWarnings | None = None,
    *,
    note: Callable[[str], None] = lambda _message: None,
) -> list[PodLimit]:
    """The classified pods with a valid ``koordinator.sh/networkQOS`` egress limit, the pods that
    get an HTB class of their own; a malformed value is told to ``warnings`` (once a pod and
    value) and the pod stays in its QoS class; an ingress-only value is told to ``note``."""
    out = []
    for pod in pods:
        text = pod.annotations.get(ANNOTATION_POD_NETWORK_QOS)
        net_class = net_qos_class(pod.qos)
        if text is None or net_class is None:
            if warnings is not None:
                warnings.valid(pod, ANNOTATION_POD_NETWORK_QOS)
            continue
        try:
            value = parse_pod_network_qos(text)
        except AnnotationError as err:
            if warnings is not None:
                warnings.report(NAME, pod, err.annotation, err.why)
            continue
        if warnings is not None:
            warnings.valid(pod, ANNOTATION_POD_NETWORK_QOS)
        if value.egress_limit_bps or value.ingress_limit_bps:
            name = f"{pod.namespace}/{pod.name}"
            egress = value.egress_limit_bps
            if not egress:  # ingress only: nothing HTB can do, but say so
                note(f"pod {name}: {ANNOTATION_POD_NETWORK_QOS} ingressLimit only")
                continue
            out.append(PodLimit(pod.uid, name, net_class, egress, value.ingress_limit_bps))
    return out


def own_class_ids(pods: Iterable[PodInfo]) -> dict[str, int]:
    """The class id (``net_cls.classid``) of each pod's own class, by UID, as
    :func:`pod_classes` allots them: what the ``TCNetworkQoS`` runtime hook gives such a pod's
    cgroup at its creation."""
    minors = pod_class_minors(p.uid for p in pod_limits(pods))
    return {uid: class_handle(minor) for uid, minor in minors.items()}


def _ingress_set(cfg: NetworkQOSConfig) -> bool:
    return cfg.ingress_request not in (0, "0") or cfg.ingress_limit not in (100, 0, "0")


OFF_CHECKED = (
    "no koordlet tree on the interface since the last look; not looked for again until network"
    " QoS turns on"
)


@dataclass(slots=True)
class _Outcome:
    link: str = ""
    bandwidth: Bandwidth | None = None
    tree: TreeResult | None = None
    error: str = ""
    notes: list[str] = field(default_factory=list)
    pod_ids: dict[str, int] = field(default_factory=dict)


class NetQoS:
    """See the module docstring."""

    def __init__(self, ctx: StrategyContext, *, interval: float) -> None:
        self.name = NAME
        self.interval = interval
        self._ctx = ctx
        self._tc = TCWriter(**executor_hooks(ctx.executor))
        self._reported: str = ""
        self._off_checked = ""
        """With network QoS off: the interface on which a round found no koordlet tree (or
        removed it); later rounds skip the rtnetlink dumps (about 6 ms of CPU each) until the
        policy turns on again. Only the koordlet installs its tree, and a restarted koordlet
        checks again at its first round."""

    async def reconcile(self) -> None:
        ctx = self._ctx
        node_slo = ctx.node_slo()
        qos = node_slo.resource_qos_strategy
        policy = qos.policies.net_qos_policy
        enabled = qos.ls_class.network_qos.enable or qos.be_class.network_qos.enable
        active = RESOURCE_QOS_STRATEGY in node_slo.present and policy is NetQOSPolicy.TC and enabled
        node = ctx.node() if ctx.node is not None else None
        annotations = (node or {}).get("metadata", {}).get("annotations") or {}
        total = (
            node_slo.system_strategy.total_network_bandwidth
            if SYSTEM_STRATEGY in node_slo.present
            else "0"
        )
        paths = ctx.host().paths
        limits = self._pod_limits()

        def round_() -> _Outcome:
            speed = lambda n: link_speed_bps(paths, n)  # noqa: E731 (on the writer thread)
            return self._round(qos, active, annotations, total, speed, limits)

        if active:
            self._off_checked = ""
        if not active and self._off_checked:
            out = _Outcome(link=self._off_checked)
            out.notes.append(OFF_CHECKED)
        else:
            out = await call_on_writer(ctx.executor, round_)
            tree = out.tree
            if not active and not out.error and tree is not None and not tree.refused:
                self._off_checked = "" if tree.dry_run and tree.changes else out.link
        if policy is NetQOSPolicy.TERWAY_QOS:
            gates = ctx.config.feature_gates
            out.notes.insert(0, TERWAY if gates.enabled(TERWAY_GATE) else TERWAY_GATE_OFF)
        pods = {}
        if active and out.tree is not None and not out.tree.refused and not out.error:
            pods = await self._classify_pods(out.pod_ids)
        inputs = {
            "policy": policy.value,
            "lsClass": qos.ls_class.network_qos.enable,
            "beClass": qos.be_class.network_qos.enable,
            "interface": out.link,
            "bandwidth": None
            if out.bandwidth is None
            else {"bps": out.bandwidth.bps, "source": out.bandwidth.source},
            "pod_limits": {p.name: p.egress_bps for p in limits},
        }
        tree = out.tree
        if out.error or (tree is not None and tree.refused):
            why = out.error or (tree.refused if tree is not None else "")
            self._log_once(why)
            decision = "hold: " + why
        elif active:
            decision = "keep the HTB tree"
        else:
            decision = "network QoS off: no koordlet tree"
        result = ""
        if tree is not None:
            result = ("dry run: " if tree.dry_run else "") + f"{len(tree.changes)} tree changes"
        detail: dict[str, Any] = {"notes": out.notes, "pods": pods}
        if tree is not None:
            detail |= {"changes": tree.changes, "classes": tree.classes}
        ctx.report(NAME, StrategyReport(inputs, decision, result, detail=detail))

    def _round(
        self,
        qos: ResourceQOSStrategy,
        active: bool,
        annotations: Mapping[str, str],
        total: int | str,
        speed: Callable[[str], int | None],
        limits: list[PodLimit],
    ) -> _Outcome:
        """On the writer thread: find the interface, then ensure or remove the tree."""
        out = _Outcome()
        try:
            link = self._tc.default_link()
        except HostError as err:
            out.error = f"cannot list routes: {err}"
            return out
        if link is None:
            out.error = "no IPv4 default route in this network namespace: no interface to shape"
            return out
        out.link = link.name
        try:
            if not active:
                out.tree = self._tc.remove(link, strategy=NAME, reason="network QoS off")
                return out
            out.bandwidth = node_bandwidth(annotations, total, speed(link.name))
            classes, out.notes = tree_classes(qos, out.bandwidth.bps)
            own, out.pod_ids, notes = pod_classes(limits, classes)
            out.notes += notes
            plan = TreePlan(
                link, (*classes, *own), CLASS_MINOR[DEFAULT_CLASS], owned_minors=POD_CLASS_MINORS
            )
            reason = f"total {out.bandwidth.bps} bit/s from {out.bandwidth.source}"
            out.tree = self._tc.ensure(plan, strategy=NAME, reason=reason)
        except (NetQoSConfigError, UnsupportedError, HostError) as err:
            out.error = str(err)
        return out

    def _pod_limits(self) -> list[PodLimit]:
        """The pods that get a class of their own; a malformed value is reported once."""
        return pod_limits(
            self._ctx.workloads().pods.values(), self._ctx.pod_warnings, note=self._log_once
        )

    async def _classify_pods(self, own: Mapping[str, int]) -> dict[str, str]:
        """``net_cls.classid`` of every classified pod and its containers: its own class when it
        has one (``own``, by UID), else its QoS class's."""
        ctx = self._ctx
        caps = ctx.capabilities
        name = NET_CLS_CLASSID.name
        if caps is not None and name in caps and not caps.supported(name):
            return {"*": f"net_cls unsupported: {caps[name].reason}"}
        jobs = []
        for pod in ctx.workloads().pods.values():
            net_class = net_qos_class(pod.qos)
            if net_class is None:
                continue
            classid = own.get(pod.uid, class_id_of(net_class))
            for rel in (pod.cgroup_dir, *(c.cgroup_dir for c in pod.containers)):
                reason = f"pod {pod.namespace}/{pod.name} is {pod.qos.value}: {net_class.value}"
                if pod.uid in own:
                    reason = f"pod {pod.namespace}/{pod.name}: its {ANNOTATION_POD_NETWORK_QOS}"
                future = ctx.executor.submit(
                    NET_CLS_CLASSID, rel, classid, strategy=NAME, reason=reason
                )
                jobs.append((pod.uid, asyncio.wrap_future(future)))
        results = await asyncio.gather(*(f for _, f in jobs), return_exceptions=True)
        out: dict[str, str] = {}
        for (uid, _), result in zip(jobs, results, strict=True):
            if isinstance(result, CgroupGoneError):
                continue
            if isinstance(result, (UnsupportedError, InvalidValueError, HostError)):
                out[uid] = str(result)
                self._log_once(str(result))
            elif isinstance(result, BaseException):
                raise result
            else:
                out.setdefault(uid, "ok")
        return out

    def _log_once(self, message: str) -> None:
        if message != self._reported:
            self._reported = message
            logger.warning("netqos: %s", message)


def build(ctx: StrategyContext, interval: float) -> NetQoS:
    """Table factory."""
    return NetQoS(ctx, interval=interval)
