"""Check the GPU path on a machine with a real NVIDIA GPU (run by scripts/gpu_check.sh).

Opens the real NVML through the koordlet's own code (``koordlet.system.nvml``), runs the GPU
collector twice, builds the Device object the reporter would write for this node and the
``koordlet_gpu_*`` samples the exporter would serve, prints them, and checks that they are sane:
UUIDs in NVML's format, memory above zero, ``/dev/nvidia<minor>`` present for every minor, the
Device valid against the CRD, one sample of each family per GPU. Exit 0 when every check holds,
1 when one fails, 2 when there is no usable NVML here (with the reason).
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import sys
import time

from prometheus_client import CollectorRegistry, generate_latest

from apis.crdschema import validate
from apis.device import device_json
from koordlet.collectors.gpu import INFO_KEY, GPUCollector, GPUDevices
from koordlet.collectors.runner import TickState
from koordlet.collectors.table import COLLECTORS
from koordlet.metriccache.store import MetricCache
from koordlet.reporter.device import build_device
from koordlet.server.exporter import KoordletExporter
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.nvml import NvmlError, NvmlUnsupported, open_nvml
from koordlet.system.paths import HostPaths

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
NVIDIA_MAJOR = 195
"""The character-device major number of /dev/nvidia<minor> (the NVIDIA driver's)."""

failures: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  [{'ok' if ok else 'FAIL'}] {what}")
    if not ok:
        failures.append(what)


def section(title: str) -> None:
    print(f"\n== {title}")


def main() -> int:
    section("NVML, opened by koordlet.system.nvml (pynvml)")
    try:
        session = open_nvml()
    except NvmlUnsupported as err:
        print(f"  NVML unusable on this host: {err.reason}")
        return 2
    try:
        print(f"  driver {session.driver_version}, {len(session.gpus)} GPUs")
        for gpu in session.gpus:
            print(f"  {gpu}")
            try:
                print(f"    now: {session.sample(gpu)}")
            except NvmlError as err:
                print(f"    [warn] not sampled: {err}")
        print(f"  Xid events pending: {session.poll_xids()}")
        if session.events_unsupported:
            print(f"  Xid events unsupported: {session.events_unsupported}")
        if session.skipped:
            print(f"  left out: {session.skipped}")
    finally:
        session.close()

    section("the GPU collector, two steps a second apart")
    collector = GPUCollector(HostPaths(), 1.0)
    cache = MetricCache()
    try:
        result = None
        for _ in range(2):
            now = time.time()
            result = collector.collect(TickState(now, WorkloadSnapshot()))
            cache.append(now, result.samples)
            time.sleep(1.0)
    finally:
        collector.close()
    assert result is not None
    print(f"  unsupported: {dict(result.unsupported) or 'nothing'}")
    devices = result.info.get(INFO_KEY)
    check(isinstance(devices, GPUDevices), "the collector listed the GPUs")
    if not isinstance(devices, GPUDevices):
        return 1

    section("checks")
    for state in devices.gpus:
        name = f"GPU {state.minor} ({state.uuid})"
        check(bool(UUID.match(state.uuid)), f"{name}: UUID in NVML's GPU-8-4-4-4-12 format")
        check(state.memory_total > 0, f"{name}: memory {state.memory_total} bytes > 0")
        dev = f"/dev/nvidia{state.minor}"
        try:
            st = os.stat(dev)
            is_nvidia = stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == NVIDIA_MAJOR
            check(
                is_nvidia and os.minor(st.st_rdev) == state.minor,
                f"{name}: {dev} is char device {NVIDIA_MAJOR}:{state.minor}",
            )
        except OSError as err:
            check(False, f"{name}: {dev}: {err.strerror}")
        if os.path.exists(f"/sys/bus/pci/devices/{state.bus_id}"):
            ok = state.place is not None and state.place.pcie_root.startswith("pci")
            check(ok, f"{name}: topology {state.place} from sysfs")
        if not state.healthy:
            print(f"  [warn] {name} unhealthy: {state.reason}: {state.message}")
    minors = sorted(g.minor for g in devices.gpus)
    check(len(set(minors)) == len(minors), f"minors {minors} are distinct")

    section("the Device object the reporter would write")
    node = {"metadata": {"name": socket.gethostname(), "uid": "gpu-check"}}
    obj = device_json(build_device(node, devices, None, time.time()))
    print(json.dumps(obj, indent=2))
    check(validate(obj) == [], f"valid against the Device CRD {validate(obj) or ''}")
    check(len(obj["spec"]["devices"]) == len(devices.gpus), "one entry per GPU")

    section("koordlet_gpu_* samples the exporter would serve")
    exporter = KoordletExporter(
        cache, WorkloadSnapshot, node_name=socket.gethostname(), collect_interval=1.0
    )
    registry = CollectorRegistry()
    registry.register(exporter)
    text = generate_latest(registry).decode()
    lines = [line for line in text.splitlines() if line.startswith("koordlet_gpu_")]
    print("\n".join(lines))
    row = next(r for r in COLLECTORS if r.name == "gpu")
    for family in row.families:
        count = sum(line.startswith(family + "{") for line in lines)
        expected = len(devices.gpus)
        if family == "koordlet_gpu_core_used_percent":
            expected -= sum(k.startswith("utilization/") for k in result.unsupported)
        check(count == expected, f"{family}: {count} samples, {expected} expected")

    section("result")
    print(f"  {len(failures)} check(s) failed: {failures}" if failures else "  all checks hold")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
