"""A fake NVML for the GPU tests: ``fake_nvml.c`` built with gcc into ``libnvidia-ml.so.1``.

pynvml loads ``libnvidia-ml.so.1`` by its soname (``ctypes.CDLL``). Two ways to make it find the
fake, both used by the tests, so the real pynvml code runs against it:

- in another process, ``LD_LIBRARY_PATH`` naming the fake's folder (:meth:`FakeNvml.env`): the
  way a container mounts the driver's library;
- in this process, :func:`preload`: the fake is loaded first by its path; the dynamic loader
  then answers pynvml's ``dlopen("libnvidia-ml.so.1")`` with the library already loaded under
  that soname. Process-wide and for good, so the test that needs *no* NVML runs in a child.

The config (``$FAKE_NVML_CONFIG``, JSON, re-read at every call) is::

    {"driver_version": "535.104.05",
     "errors": {"nvmlInitWithFlags": 9},              # NVML function -> return code
     "devices": [{"uuid": "GPU-...", "minor": 0, "name": "NVIDIA A100-SXM4-80GB",
                  "memory_total": 85899345920, "memory_used": 1073741824,
                  "utilization_gpu": 35, "bus_id": "0000:3B:00.0",
                  "events_supported": true,           # false: Xid registration Not Supported
                  "xid_events": [79],                 # each returned once, in order
                  "errors": {"nvmlDeviceGetMemoryInfo": 15}}]}
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY = "libnvidia-ml.so.1"
ENV = "FAKE_NVML_CONFIG"

GiB = 1 << 30
BUS_IDS = ("0000:3B:00.0", "0000:86:00.0", "0000:AF:00.0", "0000:D8:00.0")
"""PCI addresses of the fake GPUs by index, as NVML's legacy bus id."""


def build(into: Path) -> Path:
    """Compile the fake into ``into/libnvidia-ml.so.1``; RuntimeError without gcc."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc) to build the fake NVML library")
    into.mkdir(parents=True, exist_ok=True)
    out = into / LIBRARY
    subprocess.run(
        [
            *(cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror"),
            *(f"-Wl,-soname,{LIBRARY}", "-o", str(out), str(SOURCE), "-lpthread"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


_preloaded: ctypes.CDLL | None = None


def preload(library: Path) -> None:
    """Load the fake into this process under its soname (once; see the module docstring)."""
    global _preloaded
    if _preloaded is None:
        _preloaded = ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)


def gpu(index: int, **fields: Any) -> dict[str, Any]:
    """A device entry with plausible values: an A100 80GB at :data:`BUS_IDS` ``[index]``."""
    entry: dict[str, Any] = {
        "uuid": f"GPU-{index:08x}-1111-2222-3333-444444444444",
        "minor": index,
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_total": 80 * GiB,
        "memory_used": GiB,
        "utilization_gpu": 10 * index + 5,
        "bus_id": BUS_IDS[index],
    }
    entry.update(fields)
    return entry


@dataclass
class FakeNvml:
    """The fake library and its config file; :meth:`write` replaces the config."""

    library: Path
    config: Path
    driver_version: str = "535.104.05"
    devices: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def write(self) -> None:
        doc = {"driver_version": self.driver_version, "devices": self.devices}
        if self.errors:
            doc["errors"] = self.errors
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.config)

    def set(self, *devices: dict[str, Any], **errors: int) -> None:
        """Replace the devices and the global errors, and write."""
        self.devices = list(devices)
        self.errors = dict(errors)
        self.write()

    def env(self) -> dict[str, str]:
        """A child's environment that loads the fake by ``LD_LIBRARY_PATH``."""
        out = dict(os.environ)
        out[ENV] = str(self.config)
        out["LD_LIBRARY_PATH"] = str(self.library.parent)
        return out
