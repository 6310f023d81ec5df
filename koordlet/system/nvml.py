"""NVIDIA GPUs through NVML (``libnvidia-ml.so.1``), by nvidia-ml-py's ``pynvml``: synchronous,
for the GPU collector's worker thread.

:func:`open_nvml` initializes NVML and lists the GPUs once (UUID, minor number, name, memory,
PCI bus id) with the driver version, and registers every GPU for Xid critical-error events. The
:class:`NvmlSession` it returns reads each GPU's memory in use and utilization
(:meth:`NvmlSession.sample`) and drains the pending Xid events without waiting
(:meth:`NvmlSession.poll_xids`). pynvml loads the library by its soname with ``ctypes``; the
tests point that name at a fake library (``tests/nvmlfake``) so the real pynvml code runs.

Every ``NVMLError`` is translated here (the one boundary), its code kept:

- :class:`NvmlUnsupported` (an :class:`~koordlet.errors.UnsupportedError`): NVML cannot be used
  on this host at all: library not found, kernel driver not loaded, library and driver of
  different versions, no permission on ``/dev/nvidia*``, no GPU; the reason says which;
- :class:`NvmlError` (a :class:`~koordlet.errors.HostError`): one call failed (``GPU is lost``
  on one GPU); ``gone`` tells a GPU that fell off the bus from a transient failure.

Which Xids say a GPU is broken follows upstream (``states_device_linux.go``, ``checkHealth``) and
NVIDIA's device plugin: every critical Xid except the application errors 13, 31, 43, 45 and 68.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from apis.records import frozen
from koordlet.errors import HostError, UnsupportedError

logger = logging.getLogger(__name__)

LIBRARY = "libnvidia-ml.so.1"
"""The soname pynvml loads (``ctypes.CDLL``)."""

# NVML return codes (nvml.h); pynvml names them NVML_ERROR_*.
ERROR_UNINITIALIZED = 1
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_LIB_RM_VERSION_MISMATCH = 18
XID_CRITICAL_ERROR = 0x8
"""``nvmlEventTypeXidCriticalError``."""
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
"""Xids an application causes (illegal address, MMU fault, reset channel...): the GPU is fine."""

GONE_CODES = frozenset({ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED})
"""Codes after which a GPU is unusable until reset: unhealthy, not a transient failure."""

_HOST_REASONS = {
    ERROR_LIBRARY_NOT_FOUND: f"NVML library {LIBRARY} not found (no NVIDIA driver on this host, "
    "or its libraries are not mounted into the koordlet's container)",
    ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
    ERROR_LIB_RM_VERSION_MISMATCH: "NVML library and NVIDIA kernel driver versions differ "
    "(the driver was upgraded without a reboot or module reload)",
    ERROR_NO_PERMISSION: "no permission to open /dev/nvidiactl and /dev/nvidia*",
    ERROR_FUNCTION_NOT_FOUND: "the NVIDIA driver is too old for this NVML call",
    ERROR_UNINITIALIZED: "NVML is not initialized (the driver was unloaded or reloaded)",
}

T = TypeVar("T")


class NvmlError(HostError):
    """An NVML call failed; ``code`` is NVML's return code, ``function`` the call."""

    def __init__(self, function: str, code: int, text: str) -> None:
        self.function = function
        self.code = code
        super().__init__(f"{function}: {text} (NVML error {code})")

    @property
    def gone(self) -> bool:
        """The GPU fell off the bus or needs a reset."""
        return self.code in GONE_CODES


class NvmlUnsupported(UnsupportedError):
    """NVML cannot be used on this host; ``code`` is NVML's return code (0: no GPU found)."""

    def __init__(self, reason: str, code: int = 0) -> None:
        self.code = code
        super().__init__("nvml", reason)


@frozen
class GPUInfo:
    """One GPU, as listed once when NVML is opened."""

    index: int
    """NVML's index (enumeration order; not the minor number)."""
    uuid: str
    """``GPU-8-4-4-4-12`` hex, NVML's UUID."""
    minor: int
    """The ``/dev/nvidia<minor>`` number."""
    name: str
    """NVML's product name (``NVIDIA A100-SXM4-80GB``)."""
    memory_total: int
    """Bytes of device memory."""
    bus_id: str
    """PCI address as NVML's legacy form (``0000:3B:00.0``)."""


@frozen
class GPUSample:
    """What one GPU reports now."""

    memory_used: int
    """Bytes of device memory in use."""
    memory_total: int
    """Bytes of device memory."""
    core_used_percent: float | None
    """Percent of the last sample period in which a kernel ran (``utilization.gpu``); None when
    the GPU has no such counter."""


@frozen
class XidEvent:
    """A critical Xid error one GPU reported."""

    uuid: str
    """The GPU's UUID; empty when NVML could not say which GPU (then every GPU is suspect)."""
    xid: int
    """The Xid number (``79``: fallen off the bus)."""

    @property
    def critical(self) -> bool:
        """Whether it says the GPU is broken (not an application's fault)."""
        return self.xid not in APPLICATION_XIDS


def _pynvml() -> ModuleType:
    # Imported on first use: only hosts with the Accelerators gate on load it.
    return importlib.import_module("pynvml")


class NvmlSession:
    """NVML opened, with its GPUs; call :meth:`close` when done (idempotent)."""

    def __init__(self, nvml: ModuleType) -> None:
        self._nvml = nvml
        self._handles: dict[int, Any] = {}
        self._events: Any = None
        self._open = True
        self.gpus: tuple[GPUInfo, ...] = ()
        """The GPUs in NVML's order."""
        self.driver_version = ""
        """``nvmlSystemGetDriverVersion`` (``535.104.05``)."""
        self.events_unsupported: dict[str, str] = {}
        """UUID → why Xid events cannot be watched on that GPU (too old, not permitted)."""
        self.skipped: dict[int, str] = {}
        """NVML index → why that GPU could not be described and was left out."""

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` with pynvml's ``NVMLError`` translated to :class:`NvmlError`."""
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            raise NvmlError(getattr(fn, "__name__", "nvml"), err.value, str(err)) from err

    def _list(self) -> None:
        n = self._nvml
        self.driver_version = str(self.call(n.nvmlSystemGetDriverVersion))
        count = int(self.call(n.nvmlDeviceGetCount))
        if count == 0:
            raise NvmlUnsupported("NVML found no NVIDIA GPU")
        gpus = []
        for index in range(count):
            try:
                gpu, handle = self._describe(index)
            except NvmlError as err:
                if err.code in _HOST_REASONS:
                    raise
                # One GPU that cannot be described (lost at boot) is left out; the others work.
                self.skipped[index] = str(err)
                logger.warning("GPU %d left out: %s", index, err)
                continue
            gpus.append(gpu)
            self._handles[index] = handle
        if not gpus:
            raise NvmlUnsupported(f"no GPU could be described: {self.skipped}")
        self.gpus = tuple(gpus)

    def _describe(self, index: int) -> tuple[GPUInfo, Any]:
        n = self._nvml
        handle = self.call(n.nvmlDeviceGetHandleByIndex, index)
        bus_id = self.call(n.nvmlDeviceGetPciInfo, handle).busIdLegacy
        gpu = GPUInfo(
            index=index,
            uuid=str(self.call(n.nvmlDeviceGetUUID, handle)),
            minor=int(self.call(n.nvmlDeviceGetMinorNumber, handle)),
            name=str(self.call(n.nvmlDeviceGetName, handle)),
            memory_total=int(self.call(n.nvmlDeviceGetMemoryInfo, handle).total),
            bus_id=bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id),
        )
        return gpu, handle

    def _watch_xids(self) -> None:
        n = self._nvml
        try:
            self._events = self.call(n.nvmlEventSetCreate)
        except NvmlError as err:
            for gpu in self.gpus:
                self.events_unsupported[gpu.uuid] = f"no NVML event set: {err}"
            return
        for gpu in self.gpus:
            handle = self._handles[gpu.index]
            try:
                self.call(n.nvmlDeviceRegisterEvents, handle, XID_CRITICAL_ERROR, self._events)
            except NvmlError as err:
                why = "too old for Xid events" if err.code == ERROR_NOT_SUPPORTED else str(err)
                self.events_unsupported[gpu.uuid] = why

    def sample(self, gpu: GPUInfo) -> GPUSample:
        """Memory and utilization of ``gpu`` now; :class:`NvmlError` when NVML fails. A GPU
        that has no utilization counter (``Not Supported``: MIG mode, some vGPUs) reports
        ``core_used_percent`` None."""
        handle = self._handles[gpu.index]
        memory = self.call(self._nvml.nvmlDeviceGetMemoryInfo, handle)
        try:
            core: float | None = float(
                self.call(self._nvml.nvmlDeviceGetUtilizationRates, handle).gpu
            )
        except NvmlError as err:
            if err.code != ERROR_NOT_SUPPORTED:
                raise
            core = None
        return GPUSample(
            memory_used=int(memory.used), memory_total=int(memory.total), core_used_percent=core
        )

    def poll_xids(self, limit: int = 256) -> list[XidEvent]:
        """The Xid events that arrived since the last call, without waiting (at most
        ``limit``, so a GPU spewing events cannot hold the tick)."""
        if self._events is None:
            return []
        n = self._nvml
        events: list[XidEvent] = []
        for _ in range(limit):
            try:
                data = self.call(n.nvmlEventSetWait, self._events, 0)
            except NvmlError as err:
                if err.code != ERROR_TIMEOUT:
                    logger.warning("reading NVML events failed: %s", err)
                break
            if data.eventType != XID_CRITICAL_ERROR:
                continue
            try:
                uuid = str(self.call(n.nvmlDeviceGetUUID, data.device))
            except NvmlError:
                uuid = ""
            events.append(XidEvent(uuid, int(data.eventData)))
        return events

    def close(self) -> None:
        """Free the event set and shut NVML down (the library stays loaded, as pynvml does)."""
        if not self._open:
            return
        self._open = False
        n = self._nvml
        if self._events is not None:
            try:
                self.call(n.nvmlEventSetFree, self._events)
            except NvmlError as err:
                logger.debug("freeing the NVML event set: %s", err)
            self._events = None
        try:
            self.call(n.nvmlShutdown)
        except NvmlError as err:
            logger.warning("NVML shutdown failed: %s", err)


def open_nvml() -> NvmlSession:
    """Initialize NVML and list its GPUs; :class:`NvmlUnsupported` with the reason when this
    host cannot use NVML, :class:`NvmlError` when listing a GPU failed."""
    try:
        nvml = _pynvml()
    except ImportError as err:  # a broken install: the pinned dependency is missing
        raise NvmlUnsupported(f"the nvidia-ml-py package is not installed ({err})") from err
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        reason = _HOST_REASONS.get(err.value, f"NVML initialization failed: {err}")
        raise NvmlUnsupported(reason, err.value) from err
    session = NvmlSession(nvml)
    try:
        session._list()
        session._watch_xids()
    except NvmlError as err:
        session.close()
        if err.code in _HOST_REASONS:
            raise NvmlUnsupported(f"{_HOST_REASONS[err.code]} ({err.function})", err.code) from err
        raise
    except BaseException:
        session.close()
        raise
    return session


def host_reason(err: NvmlError) -> str | None:
    """Why NVML as a whole stopped working on this host, when ``err`` says so (the driver was
    unloaded, its version changed under the library); None for a failure of one GPU or call."""
    return _HOST_REASONS.get(err.code) if err.code != ERROR_FUNCTION_NOT_FOUND else None
