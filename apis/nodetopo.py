"""The node-topology annotations the koordlet publishes on its NodeResourceTopology, and the Node
annotations they are derived from.

Upstream's koordlet (``statesinformer/impl/states_noderesourcetopology.go``, ``calcNodeTopo``)
writes, besides the CPU topology and the shared pools, three annotations on the node's
NodeResourceTopology that other components read:

- ``node.koordinator.sh/cpu-basic-info``: :class:`CPUBasicInfo`, the CPU model, hyper-threading,
  turbo and vendor (``apis/extension/cpu_normalization.go``). koord-manager's CPU normalization
  picks the node's ratio from it;
- ``node.koordinator.sh/reservation``: the CPUs the Node's own ``node.koordinator.sh/reservation``
  annotation reserves (:class:`NodeReservation`, ``apis/extension/node_reservation.go``), written
  back as ``{"reservedCPUs": "0-1"}`` once a CPU count has been turned into CPUs (``{}`` when none);
- ``node.koordinator.sh/system-qos-resource``: the Node's ``system-qos-resource`` annotation
  (:class:`SystemQOSResource`, ``apis/extension/system_qos.go``): the CPUs of SYSTEM pods and
  whether they are exclusive (default true).

Each value is written as Go's ``json.Marshal`` writes the upstream struct (:func:`go_marshal`):
compact, fields in declaration order, ``omitempty`` fields left out when empty, ``<``, ``>`` and
``&`` escaped. The parsers accept what upstream's ``json.Unmarshal`` accepts and raise
:class:`~apis.slo.SchemaError` (a ``FieldError`` and a ``ValueError``) otherwise, its ``source``
the annotation and its ``field`` the JSON field (``reservedCPUs``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from apis.cpulist import format_cpulist, parse_cpulist
from apis.extension import ANNOTATION_NODE_SYSTEM_QOS_RESOURCE
from apis.manager_keys import ANNOTATION_CPU_BASIC_INFO, ANNOTATION_NODE_RESERVATION
from apis.quantity import milli_value
from apis.records import frozen
from apis.slo import SchemaError

__all__ = [
    "ANNOTATION_CPU_BASIC_INFO",
    "ANNOTATION_NODE_RESERVATION",
    "ANNOTATION_NODE_SYSTEM_QOS_RESOURCE",
    "APPLY_POLICY_DEFAULT",
    "APPLY_POLICY_RESERVED_CPUS_ONLY",
    "CPUBasicInfo",
    "NodeReservation",
    "SystemQOSResource",
    "go_marshal",
    "parse_cpu_basic_info",
    "parse_node_reservation",
    "parse_system_qos_resource",
]

APPLY_POLICY_DEFAULT = "Default"
"""``NodeReservationApplyPolicyDefault``: the reservation lowers the schedulable resources and
reserves CPUs."""
APPLY_POLICY_RESERVED_CPUS_ONLY = "ReservedCPUsOnly"
"""``NodeReservationApplyPolicyReservedCPUsOnly``: only CPUs are reserved."""


def go_marshal(value: object) -> str:
    """``value`` as Go's ``json.Marshal`` writes it: no spaces, non-ASCII kept as UTF-8, and
    ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\\u003c``... (Go's HTML-safe default)."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text


def _object(raw: str, key: str) -> Mapping[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError as err:
        raise SchemaError(f"not JSON: {err}", source=key) from None
    if not isinstance(doc, Mapping):
        raise SchemaError(f"must be a JSON object, got {type(doc).__name__}", source=key)
    return doc


def _field(doc: Mapping[str, Any], name: str, kind: type, key: str) -> Any:
    value = doc.get(name)
    if value is None:
        return kind()
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise SchemaError(f"must be a {kind.__name__}, got {value!r}", source=key, field=name)
    return value


def _cpulist(doc: Mapping[str, Any], name: str, key: str) -> str:
    text: str = _field(doc, name, str, key)
    if text:
        try:
            parse_cpulist(text)
        except ValueError as err:
            raise SchemaError(str(err), source=key, field=name) from err
    return text


# cpu-basic-info ---------------------------------------------------------------------------------


@frozen
class CPUBasicInfo:
    """Upstream's ``CPUBasicInfo``: what CPU normalization keys its ratio on."""

    cpu_model: str = ""
    """``cpuModel``: the ``model name`` of ``/proc/cpuinfo`` (lscpu's ``Model name``)."""
    hyper_thread_enabled: bool = False
    """``hyperThreadEnabled``: some core runs more than one thread."""
    turbo_enabled: bool = False
    """``turboEnabled``: turbo/boost is on (false when the host does not say)."""
    cat_l3_cbm_mask: str = ""
    """``catL3CbmMask``: the L3 CAT capacity bit mask (resctrl ``info/L3/cbm_mask``); empty
    without resctrl."""
    vendor_id: str = ""
    """``vendorID``: the ``vendor_id`` of ``/proc/cpuinfo`` (``GenuineIntel``, ``AuthenticAMD``)."""

    def to_json(self) -> str:
        """The annotation value, as Go marshals the struct (``omitempty`` on every field)."""
        doc: dict[str, Any] = {}
        if self.cpu_model:
            doc["cpuModel"] = self.cpu_model
        if self.hyper_thread_enabled:
            doc["hyperThreadEnabled"] = True
        if self.turbo_enabled:
            doc["turboEnabled"] = True
        if self.cat_l3_cbm_mask:
            doc["catL3CbmMask"] = self.cat_l3_cbm_mask
        if self.vendor_id:
            doc["vendorID"] = self.vendor_id
        return go_marshal(doc)

    @property
    def key(self) -> str:
        """Upstream's ``Key()``: ``<model>_<ht>_<turbo>`` (Go prints booleans lower-case)."""
        ht = str(self.hyper_thread_enabled).lower()
        return f"{self.cpu_model}_{ht}_{str(self.turbo_enabled).lower()}"


def parse_cpu_basic_info(raw: str) -> CPUBasicInfo:
    """The annotation's JSON; absent fields are their zero values, unknown ones are ignored (as
    ``json.Unmarshal``). Raises :class:`~apis.slo.SchemaError` (a ``ValueError``)."""
    key = ANNOTATION_CPU_BASIC_INFO
    doc = _object(raw, key)
    return CPUBasicInfo(
        cpu_model=_field(doc, "cpuModel", str, key),
        hyper_thread_enabled=_field(doc, "hyperThreadEnabled", bool, key),
        turbo_enabled=_field(doc, "turboEnabled", bool, key),
        cat_l3_cbm_mask=_field(doc, "catL3CbmMask", str, key),
        vendor_id=_field(doc, "vendorID", str, key),
    )


# reservation ------------------------------------------------------------------------------------


@frozen
class NodeReservation:
    """Upstream's ``NodeReservation`` (the Node's ``node.koordinator.sh/reservation``)."""

    reserved_cpus: str = ""
    """``reservedCPUs``: a cpulist (``"0-1"``); wins over ``resources.cpu``."""
    cpu_milli: int = 0
    """``resources.cpu`` in milli-cores; 0 when absent."""
    apply_policy: str = ""
    """``applyPolicy``: ``""``/``Default`` or ``ReservedCPUsOnly``; another value reserves no
    CPUs (upstream ignores it)."""

    def reserved_cpus_and_count(self) -> tuple[frozenset[int], int]:
        """Upstream's ``GetReservedCPUs``: ``(the reservedCPUs, 0)`` when given, else ``((),
        ceil(resources.cpu))`` for the caller to pick that many CPUs by topology; ``((), 0)``
        under an apply policy that reserves no CPUs."""
        if self.apply_policy not in ("", APPLY_POLICY_DEFAULT, APPLY_POLICY_RESERVED_CPUS_ONLY):
            return frozenset(), 0
        if self.reserved_cpus:
            return frozenset(parse_cpulist(self.reserved_cpus)), 0
        if self.cpu_milli > 0:
            return frozenset(), math.ceil(self.cpu_milli / 1000)
        return frozenset(), 0


def parse_node_reservation(raw: str | None) -> NodeReservation:
    """The Node annotation's JSON (absent or empty: no reservation). Raises
    :class:`~apis.slo.SchemaError` (a ``ValueError``, naming the annotation and the field) on a
    value ``json.Unmarshal`` refuses or a ``reservedCPUs`` that is no cpulist."""
    if not raw:
        return NodeReservation()
    key = ANNOTATION_NODE_RESERVATION
    doc = _object(raw, key)
    resources = doc.get("resources")
    if resources is None:
        resources = {}
    if not isinstance(resources, Mapping):
        raise SchemaError(f"must be an object, got {resources!r}", source=key, field="resources")
    cpu = resources.get("cpu")
    milli = 0
    if cpu is not None:
        bad = isinstance(cpu, bool) or not isinstance(cpu, str | int | float)
        try:
            milli = 0 if bad else milli_value(cpu)
        except ValueError:
            bad = True
        if bad:
            raise SchemaError(f"must be a quantity, got {cpu!r}", source=key, field="resources.cpu")
    cpus = _cpulist(doc, "reservedCPUs", key)
    return NodeReservation(cpus, milli, _field(doc, "applyPolicy", str, key))


def reservation_json(cpus: frozenset[int]) -> str:
    """What the koordlet writes on the NodeResourceTopology: ``{"reservedCPUs": "0-1"}``, ``{}``
    without reserved CPUs."""
    return go_marshal({"reservedCPUs": format_cpulist(cpus)} if cpus else {})


# system-qos-resource ----------------------------------------------------------------------------


@frozen
class SystemQOSResource:
    """Upstream's ``SystemQOSResource`` (the Node's ``node.koordinator.sh/system-qos-resource``)."""

    cpuset: str = ""
    """``cpuset``: the CPUs of SYSTEM QoS pods (a cpulist)."""
    cpuset_exclusive: bool | None = None
    """``cpusetExclusive``; None (absent) means true (``IsCPUSetExclusive``)."""

    @property
    def exclusive_cpus(self) -> frozenset[int]:
        """The CPUs no LS, LSR or BE pod may use: the cpuset when exclusive, else none
        (``getSystemQOSExclusiveCPU``)."""
        if not self.cpuset or self.cpuset_exclusive is False:
            return frozenset()
        return frozenset(parse_cpulist(self.cpuset))

    def to_json(self) -> str:
        """As Go marshals the struct: ``cpuset`` omitted when empty, ``cpusetExclusive`` when
        absent."""
        doc: dict[str, Any] = {}
        if self.cpuset:
            doc["cpuset"] = self.cpuset
        if self.cpuset_exclusive is not None:
            doc["cpusetExclusive"] = self.cpuset_exclusive
        return go_marshal(doc)


def parse_system_qos_resource(raw: str | None) -> SystemQOSResource:
    """The annotation's JSON (absent: none). Raises :class:`~apis.slo.SchemaError` (a
    ``ValueError``, naming the annotation and the field) on a value ``json.Unmarshal`` refuses or
    a cpuset that is no cpulist."""
    if not raw:
        return SystemQOSResource()
    key = ANNOTATION_NODE_SYSTEM_QOS_RESOURCE
    doc = _object(raw, key)
    cpuset = _cpulist(doc, "cpuset", key)
    exclusive = doc.get("cpusetExclusive")
    if exclusive is not None and not isinstance(exclusive, bool):
        raise SchemaError(f"must be a bool, got {exclusive!r}", source=key, field="cpusetExclusive")
    return SystemQOSResource(cpuset, exclusive)
