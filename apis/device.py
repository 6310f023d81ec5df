"""Device (``scheduling.koordinator.sh/v1alpha1``): the typed model the koordlet writes and the
scheduler reads, and the keys that go with it.

One Device per node, named after it and owned by the Node (cluster scoped). The fields follow the
CRD (``packaging/kubernetes/crds/scheduling.koordinator.sh_devices.yaml``, upstream
``apis/scheduling/v1alpha1/device_types.go``); the labels and resource names are upstream's
``apis/extension/device_share.go``. A GPU entry, as upstream's koordlet writes it
(``pkg/koordlet/statesinformer/impl/states_device_linux.go``, ``buildGPUDevice``):

- ``type: gpu``, ``id``: the NVML UUID, ``minor``: the ``/dev/nvidia<minor>`` number,
  ``health``;
- ``resources``: ``koordinator.sh/gpu-core: 100``, ``koordinator.sh/gpu-memory``: the card's
  memory in bytes (``BinarySI``: ``80Gi``), ``koordinator.sh/gpu-memory-ratio: 100``;
- ``topology``: ``socketID``, ``nodeID`` (NUMA node), ``pcieID`` (the PCIe root complex,
  ``pci0000:3a``), ``busID`` (``0000:3b:00.0``); absent when the PCI device's place is unknown;
- ``conditions``: one ``Healthy`` condition, ``False`` with the reason (``Xid79``) on an
  unhealthy GPU.

The object's labels carry the GPU vendor, model and driver version; koord-manager copies model and
driver onto the Node (upstream's ``GPUDeviceResource`` noderesource plugin). :func:`parse_device`
reads an object back and raises :class:`~apis.slo.SchemaError` naming the field; docs/devices.md
describes the whole path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Any

from apis.extension import NODE_DOMAIN_PREFIX
from apis.groups import SCHEDULING_API_VERSION
from apis.quantity import format_bytes, int_value
from apis.records import frozen
from apis.scheduling_keys import (
    RESOURCE_GPU_CORE,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MEMORY_RATIO,
)
from apis.slo import SchemaError

KIND = "Device"
API_VERSION = SCHEDULING_API_VERSION

LABEL_GPU_VENDOR = NODE_DOMAIN_PREFIX + "gpu-vendor"
"""Device label: the GPUs' vendor (upstream ``LabelGPUVendor``)."""
LABEL_GPU_MODEL = NODE_DOMAIN_PREFIX + "gpu-model"
"""Device and Node label: the GPU model, spaces as dashes (``A100-SXM4-80GB``)
(``LabelGPUModel``)."""
LABEL_GPU_DRIVER_VERSION = NODE_DOMAIN_PREFIX + "gpu-driver-version"
"""Device and Node label: the NVIDIA driver version (``535.104.05``) (``LabelGPUDriverVersion``)."""
GPU_VENDOR_NVIDIA = "nvidia"
"""``GPUVendorNVIDIA``."""
DEVICE_TYPE_GPU = "gpu"
"""``DeviceType`` of a GPU (``schedulingv1alpha1.GPU``)."""
CONDITION_HEALTHY = "Healthy"
"""The per-device condition type (``DeviceConditionHealthy``)."""
REASON_HEALTHY = "DeviceHealthy"
"""The reason of a ``Healthy=True`` condition, as upstream writes it."""
GPU_CORE_PER_CARD = 100
"""``koordinator.sh/gpu-core`` and ``gpu-memory-ratio`` of one whole GPU."""

_LABEL_VALUE_MAX = 63


def label_value(text: str) -> str:
    """``text`` as a valid Kubernetes label value: characters other than ``[A-Za-z0-9._-]``
    become ``-``, at most 63 characters, beginning and ending with a letter or digit; empty when
    nothing is left (the label is then not written)."""
    chars = [c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in text]
    value = "".join(chars)[:_LABEL_VALUE_MAX]
    start, end = 0, len(value)
    while start < end and not value[start].isalnum():
        start += 1
    while end > start and not value[end - 1].isalnum():
        end -= 1
    return value[start:end]


def gpu_model_label(name: str) -> str:
    """The ``gpu-model`` label of an NVML device name: without the ``NVIDIA `` prefix that
    drivers from 470 on add, spaces as dashes (``NVIDIA A100 SXM4 80GB`` → ``A100-SXM4-80GB``,
    ``Tesla T4`` → ``Tesla-T4``), as upstream's ``getGPUDriverAndModel``; then made a valid label
    value."""
    return label_value(name.removeprefix("NVIDIA ").replace(" ", "-"))


@frozen
class DeviceTopology:
    """``topology``: where the device sits."""

    socket_id: int
    """``socketID``: the CPU socket of its NUMA node; -1 when unknown (upstream always -1)."""
    node_id: int
    """``nodeID``: its NUMA node (0 when sysfs says -1, as upstream)."""
    pcie_id: str
    """``pcieID``: the PCIe root complex it hangs off (``pci0000:3a``)."""
    bus_id: str = ""
    """``busID``: its PCI address, ``domain:bus:device.function`` in lower case."""


@frozen
class DeviceCondition:
    """One ``metav1.Condition``."""

    type: str
    """``type`` (``Healthy``)."""
    status: str
    """``True``, ``False`` or ``Unknown``."""
    reason: str
    """CamelCase ``reason`` (``DeviceHealthy``, ``Xid79``)."""
    message: str
    """Human-readable ``message``."""
    last_transition_time: str
    """RFC 3339 ``lastTransitionTime`` (``2024-05-01T10:00:00Z``)."""


@frozen
class DeviceInfo:
    """One ``spec.devices[]`` entry."""

    type: str
    """``type``: ``gpu``, ``rdma``, ``fpga``..."""
    uuid: str
    """``id``: the device's UUID (NVML's ``GPU-...``)."""
    minor: int | None
    """``minor``: ``/dev/nvidia<minor>``; None when absent."""
    health: bool
    """``health``: whether the scheduler may place pods on it."""
    resources: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    """``resources`` by name, as integers (gpu-core in percent, gpu-memory in bytes)."""
    topology: DeviceTopology | None = None
    """``topology``; None when unknown."""
    conditions: tuple[DeviceCondition, ...] = ()
    """``conditions``."""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``labels`` of this device."""


@frozen
class Device:
    """A Device object."""

    name: str
    """``metadata.name``: the node's name."""
    devices: tuple[DeviceInfo, ...] = ()
    """``spec.devices``."""
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """``metadata.labels`` (vendor, model, driver version)."""
    node_uid: str = ""
    """The owning Node's UID (``metadata.ownerReferences``); empty: no owner reference."""


# Writing ---------------------------------------------------------------------------------------


def _resource_text(name: str, value: int) -> str:
    # gpu-memory is a BinarySI quantity upstream (resource.NewQuantity(total, BinarySI)); the
    # percentages are DecimalSI integers, whose text is the number itself.
    return format_bytes(value) if name == RESOURCE_GPU_MEMORY else str(value)


def device_info_json(info: DeviceInfo) -> dict[str, Any]:
    """One ``spec.devices[]`` entry as the API server stores it (empty fields left out)."""
    out: dict[str, Any] = {"type": info.type, "id": info.uuid, "health": info.health}
    if info.minor is not None:
        out["minor"] = info.minor
    if info.labels:
        out["labels"] = dict(info.labels)
    if info.resources:
        out["resources"] = {k: _resource_text(k, v) for k, v in sorted(info.resources.items())}
    if info.topology is not None:
        t = info.topology
        out["topology"] = {"socketID": t.socket_id, "nodeID": t.node_id, "pcieID": t.pcie_id}
        if t.bus_id:
            out["topology"]["busID"] = t.bus_id
    if info.conditions:
        out["conditions"] = [
            {
                "type": c.type,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastTransitionTime": c.last_transition_time,
            }
            for c in info.conditions
        ]
    return out


def device_json(device: Device) -> dict[str, Any]:
    """The whole object: metadata (name, labels, the Node as controlling owner) and spec."""
    meta: dict[str, Any] = {"name": device.name}
    if device.labels:
        meta["labels"] = dict(device.labels)
    if device.node_uid:
        meta["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "name": device.name,
                "uid": device.node_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "spec": {"devices": [device_info_json(d) for d in device.devices]},
    }


def gpu_resources(memory_total: int) -> Mapping[str, int]:
    """The resources of one whole GPU with ``memory_total`` bytes."""
    return MappingProxyType(
        {
            RESOURCE_GPU_CORE: GPU_CORE_PER_CARD,
            RESOURCE_GPU_MEMORY: memory_total,
            RESOURCE_GPU_MEMORY_RATIO: GPU_CORE_PER_CARD,
        }
    )


# Reading ---------------------------------------------------------------------------------------


def _map(raw: Any, source: str, where: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SchemaError(f"must be an object, got {raw!r}", source=source, field=where)
    return raw


def _int(raw: Any, source: str, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise SchemaError(f"must be an integer, got {raw!r}", source=source, field=where)
    return raw


def _str(raw: Any, source: str, where: str) -> str:
    if not isinstance(raw, str):
        raise SchemaError(f"must be a string, got {raw!r}", source=source, field=where)
    return raw


def _str_map(raw: Any, source: str, where: str) -> Mapping[str, str]:
    items = _map(raw, source, where)
    return MappingProxyType({k: _str(v, source, f"{where}.{k}") for k, v in items.items()})


def _parse_info(raw: Any, source: str, where: str) -> DeviceInfo:
    item = _map(raw, source, where)
    if "health" not in item:
        raise SchemaError("required", source=source, field=f"{where}.health")
    health = item["health"]
    if not isinstance(health, bool):
        raise SchemaError(
            f"must be true or false, got {health!r}", source=source, field=f"{where}.health"
        )
    resources: dict[str, int] = {}
    for name, value in _map(item.get("resources"), source, f"{where}.resources").items():
        try:
            resources[name] = int_value(value)
        except ValueError as err:
            raise SchemaError(str(err), source=source, field=f"{where}.resources.{name}") from err
    topology = None
    if item.get("topology") is not None:
        t = _map(item["topology"], source, f"{where}.topology")
        topology = DeviceTopology(
            socket_id=_int(t.get("socketID"), source, f"{where}.topology.socketID"),
            node_id=_int(t.get("nodeID"), source, f"{where}.topology.nodeID"),
            pcie_id=_str(t.get("pcieID"), source, f"{where}.topology.pcieID"),
            bus_id=_str(t.get("busID", ""), source, f"{where}.topology.busID"),
        )
    conditions = []
    for i, raw_c in enumerate(item.get("conditions") or ()):
        at = f"{where}.conditions[{i}]"
        c = _map(raw_c, source, at)
        conditions.append(
            DeviceCondition(
                type=_str(c.get("type"), source, f"{at}.type"),
                status=_str(c.get("status"), source, f"{at}.status"),
                reason=_str(c.get("reason"), source, f"{at}.reason"),
                message=_str(c.get("message", ""), source, f"{at}.message"),
                last_transition_time=_str(
                    c.get("lastTransitionTime"), source, f"{at}.lastTransitionTime"
                ),
            )
        )
    minor = item.get("minor")
    return DeviceInfo(
        type=_str(item.get("type", ""), source, f"{where}.type"),
        uuid=_str(item.get("id", ""), source, f"{where}.id"),
        minor=None if minor is None else _int(minor, source, f"{where}.minor"),
        health=health,
        resources=MappingProxyType(resources),
        topology=topology,
        conditions=tuple(conditions),
        labels=_str_map(item.get("labels"), source, f"{where}.labels"),
    )


def parse_device(obj: Mapping[str, Any], source: str = "") -> Device:
    """A Device object read back; :class:`SchemaError` naming ``source`` and the field for a
    value of the wrong type (``spec.devices[1].resources.koordinator.sh/gpu-memory``)."""
    meta = _map(obj.get("metadata"), source, "metadata")
    name = _str(meta.get("name", ""), source, "metadata.name")
    source = source or f"device {name}"
    spec = _map(obj.get("spec"), source, "spec")
    raw_devices = spec.get("devices") or []
    if not isinstance(raw_devices, Sequence) or isinstance(raw_devices, str):
        raise SchemaError(f"must be a list, got {raw_devices!r}", source=source, field="spec")
    owners = meta.get("ownerReferences") or []
    node_uid = next(
        (
            str(o.get("uid", ""))
            for o in owners
            if isinstance(o, Mapping) and o.get("kind") == "Node"
        ),
        "",
    )
    return Device(
        name=name,
        devices=tuple(
            _parse_info(d, source, f"spec.devices[{i}]") for i, d in enumerate(raw_devices)
        ),
        labels=_str_map(meta.get("labels"), source, "metadata.labels"),
        node_uid=node_uid,
    )
