"""The Device object: the node's GPUs for koord-scheduler's DeviceShare plugin, written only when
they change.

Koordinator's koordlet keeps one ``scheduling.koordinator.sh/v1alpha1`` Device per node (named
after it, owned by the Node; upstream ``pkg/koordlet/statesinformer/impl/states_device_linux.go``,
``reportDevice``). :func:`build_device` derives the desired GPU entries and labels from the
``gpu_devices`` info the GPU collector stores in the metric cache (``koordlet.collectors.gpu``);
:mod:`apis.device` is the model and says what each field holds. The ``Healthy`` condition of a
GPU keeps its ``lastTransitionTime`` while its status stays the same, and takes the time of the
report when it changes, as upstream's ``updateDevice`` does.

:class:`DeviceReporter` compares what it owns (its labels by key, the owner reference, the
``gpu`` entries of ``spec.devices``) with the last object it wrote or read, and writes only on a
difference: a create when the object does not exist, else a PUT of the current object with those
parts replaced (compare-and-swap on ``resourceVersion``; a 409 is retried at the next round).
Entries of other types (RDMA, written by someone else) and others' labels are kept. It re-reads
the object every ``resync`` seconds so that an edit by someone else is repaired. Nothing is
written before the collector has listed the GPUs (no NVML, no GPU: no Device).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from apis.device import (
    CONDITION_HEALTHY,
    DEVICE_TYPE_GPU,
    GPU_VENDOR_NVIDIA,
    LABEL_GPU_DRIVER_VERSION,
    LABEL_GPU_MODEL,
    LABEL_GPU_VENDOR,
    REASON_HEALTHY,
    Device,
    DeviceCondition,
    DeviceInfo,
    DeviceTopology,
    device_json,
    gpu_model_label,
    gpu_resources,
    label_value,
    parse_device,
)
from apis.slo import SchemaError
from apis.timestamp import format_time
from koordlet.collectors.gpu import INFO_KEY, GPUDevices, GPUState
from koordlet.metriccache import MetricCache
from kubeclient.errors import ApiError, Conflict, NotFound
from kubeclient.resources import DEVICES

if TYPE_CHECKING:  # the Kubernetes client is imported in cluster mode only
    from kubeclient.client import KubeClient, Obj

logger = logging.getLogger(__name__)

OWNED_LABELS = (LABEL_GPU_VENDOR, LABEL_GPU_MODEL, LABEL_GPU_DRIVER_VERSION)
"""The Device labels the koordlet owns: set, replaced or removed by it alone."""


def device_labels(devices: GPUDevices) -> dict[str, str]:
    """Vendor always; the model when every GPU is the same model (upstream leaves it out for a
    mix); the driver version. Values that are not valid label values are made so
    (:func:`apis.device.label_value`) or left out."""
    labels = {LABEL_GPU_VENDOR: GPU_VENDOR_NVIDIA}
    models = {gpu_model_label(g.model) for g in devices.gpus}
    if len(models) == 1 and "" not in models:
        labels[LABEL_GPU_MODEL] = models.pop()
    driver = label_value(devices.driver_version)
    if driver:
        labels[LABEL_GPU_DRIVER_VERSION] = driver
    return labels


def _condition(gpu: GPUState, previous: DeviceInfo | None, now: str) -> DeviceCondition:
    status = "True" if gpu.healthy else "False"
    conditions = previous.conditions if previous is not None else ()
    before = next((c for c in conditions if c.type == CONDITION_HEALTHY), None)
    since = before.last_transition_time if before is not None and before.status == status else now
    if gpu.healthy:
        reason, message = REASON_HEALTHY, "device is healthy"
    else:
        reason, message = gpu.reason or "Unknown", gpu.message or "device is unhealthy"
    return DeviceCondition(CONDITION_HEALTHY, status, reason, message, since)


def build_device(node: Obj, devices: GPUDevices, previous: Device | None, now: float) -> Device:
    """The desired Device for ``node``: one ``gpu`` entry per GPU by minor, and the labels.
    ``previous`` (what the server holds) keeps each condition's transition time."""
    meta = node.get("metadata") or {}
    before = {d.uuid: d for d in previous.devices} if previous is not None else {}
    at = format_time(now)
    entries = []
    for gpu in sorted(devices.gpus, key=lambda g: g.minor):
        place = gpu.place
        topology = None
        if place is not None and place.pcie_root and gpu.bus_id:
            topology = DeviceTopology(place.socket_id, place.numa_node, place.pcie_root, gpu.bus_id)
        entries.append(
            DeviceInfo(
                type=DEVICE_TYPE_GPU,
                uuid=gpu.uuid,
                minor=gpu.minor,
                health=gpu.healthy,
                resources=gpu_resources(gpu.memory_total),
                topology=topology,
                conditions=(_condition(gpu, before.get(gpu.uuid), at),),
            )
        )
    return Device(
        name=str(meta.get("name", "")),
        devices=tuple(entries),
        labels=device_labels(devices),
        node_uid=str(meta.get("uid", "")),
    )


def _gpu_entries(obj: Mapping[str, Any]) -> list[Any]:
    devices = (obj.get("spec") or {}).get("devices") or []
    return [d for d in devices if isinstance(d, Mapping) and d.get("type") == DEVICE_TYPE_GPU]


def owned_view(obj: Mapping[str, Any]) -> Obj:
    """What the koordlet owns in a Device object: what decides whether a write is needed."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return {
        "labels": {k: labels.get(k) for k in OWNED_LABELS},
        "ownerReferences": meta.get("ownerReferences") or [],
        "gpus": _gpu_entries(obj),
    }


def merged(current: Obj, desired: Obj) -> Obj:
    """``current`` with the owned parts replaced: the other labels, annotations and device
    entries of other types kept; the entries sorted by type, then minor, as upstream."""
    out = copy.deepcopy(current)
    meta = out.setdefault("metadata", {})
    want = desired["metadata"]
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k not in OWNED_LABELS}
    meta["labels"] = {**labels, **(want.get("labels") or {})}
    meta["ownerReferences"] = want.get("ownerReferences") or []
    others = [
        d
        for d in (out.get("spec") or {}).get("devices") or []
        if not (isinstance(d, Mapping) and d.get("type") == DEVICE_TYPE_GPU)
    ]
    entries = others + desired["spec"]["devices"]
    entries.sort(key=_order)
    out.setdefault("spec", {})["devices"] = entries
    return out


def _order(entry: Any) -> tuple[str, int]:
    if not isinstance(entry, Mapping):
        return ("", 0)
    minor = entry.get("minor")
    return (str(entry.get("type", "")), minor if isinstance(minor, int) else 0)


@dataclass
class DeviceStats:
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    """Rounds that found nothing to write."""
    waiting: int = 0
    """Rounds without the Node or the GPU inventory yet."""
    failed: int = 0


class DeviceReporter:
    """Keeps the node's Device equal to :func:`build_device`'s, writing on change.

    :param node: the Node object (its name and UID), or None while unknown.
    :param interval: seconds between comparisons (cheap: no request unless something changed).
    :param resync: seconds after which the object is read again to catch edits by others.
    :param clock: monotonic seconds for the resync; ``wall``: epoch seconds for the conditions.
    """

    def __init__(
        self,
        client: KubeClient,
        cache: MetricCache,
        node: Callable[[], Obj | None],
        *,
        interval: float = 10.0,
        resync: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._cache = cache
        self._node = node
        self.interval = interval
        self.resync = resync
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self._server: Device | None = None
        """What the server holds, as last read or written (for transition times)."""
        self._known: Obj | None = None
        """The owned view last written or read; None: read before deciding."""
        self._known_at = 0.0
        self.stats = DeviceStats()

    def _desired(self, previous: Device | None) -> Obj | None:
        node = self._node()
        devices = self._cache.get_info(INFO_KEY)
        if node is None or not isinstance(devices, GPUDevices):
            return None
        return device_json(build_device(node, devices, previous, self._wall()))

    async def sync_once(self) -> bool:
        """One comparison; whether a write was made. Never raises an API error (logged)."""
        desired = self._desired(self._server)
        if desired is None:
            self.stats.waiting += 1
            return False
        name = desired["metadata"]["name"]
        now = self._clock()
        if self._known == owned_view(desired) and now - self._known_at < self.resync:
            self.stats.unchanged += 1
            return False
        try:
            try:
                current = await self._client.get(DEVICES, name)
            except NotFound:
                await self._client.create(DEVICES, desired)
                self.stats.created += 1
                logger.info("Device %s created with %d GPUs", name, len(_gpu_entries(desired)))
                self._remember(desired, now)
                return True
            self._server = _parsed(current)
            desired = self._desired(self._server) or desired
            if owned_view(current) == owned_view(desired):
                self.stats.unchanged += 1
                self._remember(desired, now)
                return False
            await self._client.replace(DEVICES, merged(current, desired))
        except Conflict:
            self._known = None
            logger.info("Device %s changed meanwhile; retried next round", name)
            return False
        except ApiError as err:
            self._known = None
            self.stats.failed += 1
            logger.warning("Device %s not written: %s", name, err)
            return False
        self.stats.updated += 1
        logger.info("Device %s updated: %s", name, _health_summary(desired))
        self._remember(desired, now)
        return True

    def _remember(self, desired: Obj, now: float) -> None:
        self._known = owned_view(desired)
        self._known_at = now
        self._server = _parsed(desired)

    async def run(self) -> NoReturn:
        """Compare every ``interval`` seconds until cancelled."""
        while True:
            try:
                await self.sync_once()
            except Exception:
                logger.exception("Device report failed")
            await self._sleep(self.interval)


def _parsed(obj: Mapping[str, Any]) -> Device | None:
    """The object as the model, or None when it does not fit (then no transition time is kept:
    the next write repairs it)."""
    try:
        return parse_device(obj)
    except SchemaError as err:
        logger.warning("Device object unreadable, rewritten: %s", err)
        return None


def _health_summary(desired: Obj) -> str:
    gpus = _gpu_entries(desired)
    bad = [f"{g.get('minor')} ({g['conditions'][0]['reason']})" for g in gpus if not g["health"]]
    return f"{len(gpus)} GPUs, unhealthy: {', '.join(bad) or 'none'}"
