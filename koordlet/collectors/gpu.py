"""NVIDIA GPUs: inventory, health, memory and utilization (Koordinator's ``GPU`` device collector,
``pkg/koordlet/metricsadvisor/devices/gpu``, feature gate ``Accelerators``, every base tick).

The first step opens NVML (:mod:`koordlet.system.nvml`) and lists the GPUs once: UUID, minor
number, model, memory, PCI address and, from sysfs (:mod:`koordlet.system.pcidevice`), NUMA node,
socket and PCIe root complex. Each step then:

- drains NVML's pending Xid events: a critical Xid makes its GPU unhealthy (reason ``Xid<N>``)
  for the rest of the process's life, as upstream (``gpuHealCheck``: "no way to recover"); an
  event NVML cannot attribute makes every GPU unhealthy;
- samples each GPU's memory in use and utilization: series ``gpu_core_usage`` (percent),
  ``gpu_memory_usage`` and ``gpu_memory_total`` (bytes) and ``gpu_healthy`` (1/0) of entity
  ``node/gpu/<minor>/<uuid>``; a GPU NVML calls lost (``GPU is lost``, ``reset required``)
  turns unhealthy (``GPULost``, ``GPUResetRequired``) until it answers again;
- stores the inventory with each GPU's health as info ``gpu_devices`` (:class:`GPUDevices`), which
  the Device reporter (``koordlet.reporter.device``) publishes.

Unsupported, with the reason, in ``CollectResult.unsupported`` (``/debug/capabilities`` shows
``collector/gpu/<source>``), never faked and never a crash:

- ``nvml``: no NVML library, no driver, driver and library of different versions, no GPU
  (:class:`~koordlet.system.nvml.NvmlUnsupported`); retried every :data:`REOPEN_INTERVAL`
  seconds, so a driver installed later is found. When NVML stops working after it worked (the
  driver was unloaded), the GPUs it had listed stay in the inventory as unhealthy
  (``NVMLUnavailable``): the scheduler must stop placing pods on cards nobody watches;
- ``xid_events/<uuid>``: the GPU cannot report Xid errors; it is marked unhealthy
  (``DeviceHealthCheckNotSupported``), as upstream does;
- ``topology/<uuid>``: sysfs does not show the PCI device (the Device then has no topology);
- ``utilization/<uuid>``: the GPU has no utilization counter (MIG mode).

docs/devices.md describes the whole path, the fake NVML of the tests and the check on a real GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from apis.records import frozen
from koordlet.collectors.framework import CollectorContext, CollectResult, Tick
from koordlet.errors import HostError
from koordlet.metriccache.series import (
    GPU_CORE_USAGE,
    GPU_HEALTHY,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USAGE,
    Sample,
    SeriesKey,
    gpu_entity,
)
from koordlet.system.nvml import (
    ERROR_GPU_IS_LOST,
    GPUInfo,
    NvmlError,
    NvmlSession,
    NvmlUnsupported,
    host_reason,
    open_nvml,
)
from koordlet.system.paths import HostPaths
from koordlet.system.pcidevice import PCIPlace, normalize_bus_id, read_pci_place

logger = logging.getLogger(__name__)

NAME = "gpu"
FEATURE_GATE = "Accelerators"
"""Koordinator's feature gate for GPU support."""
INFO_KEY = "gpu_devices"
"""Metric cache info key of the inventory (:class:`GPUDevices`)."""
REOPEN_INTERVAL = 60.0
"""Seconds between attempts to open NVML while it is unavailable."""
SOURCE_NVML = "nvml"

REASON_NOT_WATCHED = "DeviceHealthCheckNotSupported"
REASON_LOST = "GPULost"
REASON_RESET = "GPUResetRequired"
REASON_NVML_UNAVAILABLE = "NVMLUnavailable"


@frozen
class GPUState:
    """One GPU in the inventory, with its health."""

    uuid: str
    """NVML's UUID (``GPU-...``): the Device entry's ``id``."""
    minor: int
    """``/dev/nvidia<minor>``."""
    model: str
    """NVML's product name (``NVIDIA A100-SXM4-80GB``)."""
    memory_total: int
    """Bytes of device memory."""
    bus_id: str
    """PCI address, sysfs form (``0000:3b:00.0``)."""
    place: PCIPlace | None
    """NUMA node, socket and PCIe root complex; None when sysfs does not show the device."""
    healthy: bool = True
    """Whether pods may be placed on it."""
    reason: str = ""
    """CamelCase reason it is unhealthy (``Xid79``); empty when healthy."""
    message: str = ""
    """What happened, for the condition's message; empty when healthy."""


@frozen
class GPUDevices:
    """Info ``gpu_devices``: the node's GPUs and driver."""

    driver_version: str
    """NVIDIA driver version (``535.104.05``)."""
    gpus: tuple[GPUState, ...]
    """By minor number."""


def _bus_id(gpu: GPUInfo) -> str:
    try:
        return normalize_bus_id(gpu.bus_id)
    except HostError:
        return gpu.bus_id.lower()


class GPUCollector:
    """See the module docstring.

    :param paths: the sysfs root for the PCI topology.
    :param interval: seconds between steps (the base tick, as upstream).
    :param opener: opens NVML (tests may pass their own; the default goes through pynvml).
    :param reopen_interval: seconds between attempts while NVML is unavailable.
    """

    def __init__(
        self,
        paths: HostPaths,
        interval: float,
        *,
        opener: Callable[[], NvmlSession] = open_nvml,
        reopen_interval: float = REOPEN_INTERVAL,
    ) -> None:
        self.name = NAME
        self.interval = interval
        self._paths = paths
        self._opener = opener
        self._reopen_interval = reopen_interval
        self._session: NvmlSession | None = None
        self._retry_at = 0.0
        self._why = ""
        self._gpus: dict[str, GPUState] = {}
        """UUID → state, from the last successful open."""
        self._topology_unsupported: dict[str, str] = {}
        self._sticky: dict[str, tuple[str, str]] = {}
        """UUID → (reason, message) of a critical Xid: unhealthy for the process's life."""
        self._failing: set[tuple[str, int]] = set()
        """(UUID, NVML code) of transient sample failures already logged."""
        self._driver = ""
        """The driver version of the last successful open."""

    # Opening -----------------------------------------------------------------------------------

    def _open(self, now: float) -> NvmlSession | None:
        if self._session is not None:
            return self._session
        if now < self._retry_at:
            return None
        try:
            session = self._opener()
        except (NvmlUnsupported, NvmlError) as err:
            reason = err.reason if isinstance(err, NvmlUnsupported) else str(err)
            self._unavailable(reason, now)
            return None
        self._session = session
        self._driver = session.driver_version
        self._why = ""
        self._topology_unsupported = {}
        gpus: dict[str, GPUState] = {}
        for gpu in sorted(session.gpus, key=lambda g: g.minor):
            bus_id = _bus_id(gpu)
            try:
                place: PCIPlace | None = read_pci_place(self._paths, bus_id)
            except HostError as err:
                place = None
                self._topology_unsupported[gpu.uuid] = str(err)
            gpus[gpu.uuid] = GPUState(
                gpu.uuid, gpu.minor, gpu.name, gpu.memory_total, bus_id, place
            )
            why_not = session.events_unsupported.get(gpu.uuid)
            if why_not is not None and gpu.uuid not in self._sticky:
                self._sticky[gpu.uuid] = (REASON_NOT_WATCHED, f"no health checking: {why_not}")
        self._gpus = gpus
        logger.info(
            "NVML opened: driver %s, %d GPUs (%s)",
            session.driver_version,
            len(gpus),
            ", ".join(f"{g.minor}:{g.model}" for g in gpus.values()),
        )
        return session

    def _unavailable(self, reason: str, now: float) -> None:
        """NVML cannot be used: retry later; GPUs listed before stay, unhealthy."""
        if self._session is not None:
            self._session.close()
            self._session = None
        self._why = reason
        self._retry_at = now + self._reopen_interval
        for uuid, state in self._gpus.items():
            if state.healthy:
                self._gpus[uuid] = replace(
                    state, healthy=False, reason=REASON_NVML_UNAVAILABLE, message=reason
                )

    # Health ------------------------------------------------------------------------------------

    def _drain_xids(self, session: NvmlSession) -> None:
        for event in session.poll_xids():
            if not event.critical:
                logger.debug("GPU %s: application Xid %d ignored", event.uuid, event.xid)
                continue
            targets = [event.uuid] if event.uuid in self._gpus else list(self._gpus)
            for uuid in targets:
                if uuid not in self._sticky or self._sticky[uuid][0] == REASON_NOT_WATCHED:
                    message = f"Xid error detected on device, error code: {event.xid}"
                    self._sticky[uuid] = (f"Xid{event.xid}", message)

    def _lost(self, uuid: str, err: NvmlError) -> None:
        reason = REASON_LOST if err.code == ERROR_GPU_IS_LOST else REASON_RESET
        state = self._gpus[uuid]
        if state.reason != reason:
            self._gpus[uuid] = replace(state, healthy=False, reason=reason, message=str(err))

    def _current(self, state: GPUState) -> GPUState:
        sticky = self._sticky.get(state.uuid)
        if sticky is not None and state.reason != sticky[0]:
            return replace(state, healthy=False, reason=sticky[0], message=sticky[1])
        return state

    # The step ----------------------------------------------------------------------------------

    def collect(self, tick: Tick) -> CollectResult:
        samples: list[Sample] = []
        unsupported: dict[str, str] = {}
        session = self._open(tick.now)
        if session is not None:
            try:
                self._drain_xids(session)
                self._sample(session, samples, unsupported)
            except NvmlError as err:
                why = host_reason(err)
                if why is None:
                    raise
                logger.warning("NVML stopped working (%s); GPUs marked unhealthy", err)
                self._unavailable(f"{why}: {err}", tick.now)
        if self._why:
            unsupported[SOURCE_NVML] = self._why
        for uuid, why in self._topology_unsupported.items():
            unsupported[f"topology/{uuid}"] = why
        if session is not None:
            for uuid, why in session.events_unsupported.items():
                unsupported[f"xid_events/{uuid}"] = why
        gpus = tuple(self._current(s) for s in self._gpus.values())
        for state in gpus:
            entity = gpu_entity(state.minor, state.uuid)
            samples.append(Sample(SeriesKey(GPU_HEALTHY, entity), 1.0 if state.healthy else 0.0))
        info = {INFO_KEY: GPUDevices(self._driver, gpus)} if gpus else {}
        return CollectResult(samples=samples, info=info, unsupported=unsupported)

    def _sample(self, session: NvmlSession, out: list[Sample], unsupported: dict[str, str]) -> None:
        for gpu in session.gpus:
            state = self._gpus.get(gpu.uuid)
            if state is None:
                continue
            try:
                sample = session.sample(gpu)
            except NvmlError as err:
                if host_reason(err) is not None:
                    raise
                if err.gone:
                    self._lost(gpu.uuid, err)
                elif (gpu.uuid, err.code) not in self._failing:
                    self._failing.add((gpu.uuid, err.code))
                    logger.warning("GPU %d (%s) not sampled: %s", gpu.minor, gpu.uuid, err)
                continue
            self._failing = {f for f in self._failing if f[0] != gpu.uuid}
            if state.reason in (REASON_LOST, REASON_RESET):  # answers again: it was reset
                self._gpus[gpu.uuid] = state = replace(state, healthy=True, reason="", message="")
            entity = gpu_entity(gpu.minor, gpu.uuid)
            out.append(Sample(SeriesKey(GPU_MEMORY_USAGE, entity), float(sample.memory_used)))
            out.append(Sample(SeriesKey(GPU_MEMORY_TOTAL, entity), float(sample.memory_total)))
            if sample.core_used_percent is None:
                unsupported[f"utilization/{gpu.uuid}"] = "NVML: utilization Not Supported"
            else:
                out.append(Sample(SeriesKey(GPU_CORE_USAGE, entity), sample.core_used_percent))

    def close(self) -> None:
        """Shut NVML down (the runner calls it after the last tick)."""
        if self._session is not None:
            self._session.close()
            self._session = None


def build(ctx: CollectorContext, interval: float) -> GPUCollector:
    """Factory for the collector table."""
    return GPUCollector(ctx.host.paths, interval)
