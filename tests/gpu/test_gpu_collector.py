"""The GPU collector against the fake NVML and a fake sysfs: inventory, samples, health (Xid,
lost GPU, NVML gone and back), what is reported unsupported, the table row and the families."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from koordlet.collectors import gpu as g
from koordlet.collectors.framework import CollectorContext, CollectResult
from koordlet.collectors.runner import TickState
from koordlet.collectors.table import COLLECTORS, build_collectors
from koordlet.config import KoordletConfig
from koordlet.features import FeatureGates
from koordlet.metriccache import series as s
from koordlet.metriccache.store import MetricCache
from koordlet.server.exporter import KoordletExporter
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system import nvml as n
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.paths import HostPaths
from tests.fakehost import FakeHost
from tests.nvmlfake import FakeNvml, GiB, gpu

UUID0 = gpu(0)["uuid"]
UUID1 = gpu(1)["uuid"]
E0, E1 = s.gpu_entity(0, UUID0), s.gpu_entity(1, UUID1)


@pytest.fixture
def collector(nvml: FakeNvml, sysfs: HostPaths) -> Iterator[g.GPUCollector]:
    c = g.GPUCollector(sysfs, 1.0, reopen_interval=60.0)
    yield c
    c.close()


def step(c: g.GPUCollector, now: float = 100.0) -> CollectResult:
    return c.collect(TickState(now, WorkloadSnapshot()))


def values(result: CollectResult) -> dict[tuple[str, str], float]:
    return {(x.key.metric, x.key.entity): x.value for x in result.samples}


def inventory(result: CollectResult) -> g.GPUDevices:
    devices = result.info[g.INFO_KEY]
    assert isinstance(devices, g.GPUDevices)
    return devices


def health(result: CollectResult) -> dict[int, tuple[bool, str]]:
    return {x.minor: (x.healthy, x.reason) for x in inventory(result).gpus}


def test_the_inventory_has_each_gpu_with_its_topology(collector: g.GPUCollector) -> None:
    result = step(collector)
    devices = inventory(result)
    assert devices.driver_version == "535.104.05"
    first, second = devices.gpus
    assert (first.uuid, first.minor, first.model) == (UUID0, 0, "NVIDIA A100-SXM4-80GB")
    assert first.memory_total == 80 * GiB
    assert first.bus_id == "0000:3b:00.0"
    assert first.place is not None
    assert (first.place.numa_node, first.place.socket_id, first.place.pcie_root) == (
        0,
        0,
        "pci0000:3a",
    )
    assert second.place is not None
    assert (second.place.numa_node, second.place.pcie_root) == (1, "pci0000:85")
    assert [x.healthy for x in devices.gpus] == [True, True]
    assert result.unsupported == {}


def test_each_step_samples_memory_utilization_and_health(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    got = values(step(collector))
    assert got[(s.GPU_MEMORY_USAGE, E0)] == GiB
    assert got[(s.GPU_MEMORY_TOTAL, E1)] == 80 * GiB
    assert got[(s.GPU_CORE_USAGE, E0)] == 5
    assert got[(s.GPU_CORE_USAGE, E1)] == 15
    assert got[(s.GPU_HEALTHY, E0)] == got[(s.GPU_HEALTHY, E1)] == 1.0
    nvml.set(gpu(0, memory_used=30 * GiB, utilization_gpu=87), gpu(1))
    again = values(step(collector, 101.0))
    assert (again[(s.GPU_MEMORY_USAGE, E0)], again[(s.GPU_CORE_USAGE, E0)]) == (30 * GiB, 87)


def test_a_critical_xid_makes_its_gpu_unhealthy_for_good(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    step(collector)
    nvml.set(gpu(0), gpu(1, xid_events=[79]))
    result = step(collector, 101.0)
    assert health(result) == {0: (True, ""), 1: (False, "Xid79")}
    bad = inventory(result).gpus[1]
    assert bad.message == "Xid error detected on device, error code: 79"
    assert values(result)[(s.GPU_HEALTHY, E1)] == 0.0
    later = step(collector, 102.0)  # nothing new: still unhealthy (upstream: no recovery)
    assert health(later)[1] == (False, "Xid79")
    assert values(later)[(s.GPU_MEMORY_USAGE, E1)] == GiB  # still sampled


def test_an_application_xid_leaves_the_gpu_healthy(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    nvml.set(gpu(0, xid_events=[13, 31, 43, 45, 68]), gpu(1))
    assert health(step(collector)) == {0: (True, ""), 1: (True, "")}


def test_a_lost_gpu_is_unhealthy_until_it_answers_again(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    step(collector)
    nvml.set(gpu(0), gpu(1, errors={"nvmlDeviceGetMemoryInfo": n.ERROR_GPU_IS_LOST}))
    lost = step(collector, 101.0)
    assert health(lost)[1] == (False, g.REASON_LOST)
    assert (s.GPU_MEMORY_USAGE, E1) not in values(lost)
    assert values(lost)[(s.GPU_HEALTHY, E1)] == 0.0
    nvml.set(gpu(0), gpu(1, errors={"nvmlDeviceGetMemoryInfo": n.ERROR_RESET_REQUIRED}))
    assert health(step(collector, 102.0))[1] == (False, g.REASON_RESET)
    nvml.set(gpu(0), gpu(1))
    assert health(step(collector, 103.0))[1] == (True, "")


def test_a_transient_failure_skips_one_sample_and_is_logged_once(
    nvml: FakeNvml, collector: g.GPUCollector, caplog: pytest.LogCaptureFixture
) -> None:
    step(collector)
    nvml.set(gpu(0, errors={"nvmlDeviceGetMemoryInfo": 999}), gpu(1))
    for now in (101.0, 102.0, 103.0):
        result = step(collector, now)
        assert (s.GPU_MEMORY_USAGE, E0) not in values(result)
        assert health(result)[0] == (True, "")
    assert sum("not sampled" in r.getMessage() for r in caplog.records) == 1


def test_without_nvml_it_is_unsupported_with_the_reason_and_retried(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    nvml.set(gpu(0), nvmlInitWithFlags=n.ERROR_DRIVER_NOT_LOADED)
    result = step(collector, 100.0)
    assert result.unsupported == {"nvml": "the NVIDIA kernel driver is not loaded"}
    assert result.info == {}
    assert result.samples == []
    nvml.set(gpu(0))  # the driver is loaded now; found at the next attempt, not before
    assert step(collector, 159.0).unsupported == {"nvml": "the NVIDIA kernel driver is not loaded"}
    found = step(collector, 160.0)
    assert found.unsupported == {}
    assert health(found) == {0: (True, "")}


def test_when_nvml_stops_working_the_gpus_stay_listed_as_unhealthy(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    step(collector)
    nvml.set(gpu(0), gpu(1), nvmlDeviceGetMemoryInfo=n.ERROR_DRIVER_NOT_LOADED)
    result = step(collector, 101.0)
    assert health(result) == {
        0: (False, g.REASON_NVML_UNAVAILABLE),
        1: (False, g.REASON_NVML_UNAVAILABLE),
    }
    assert result.unsupported["nvml"].startswith("the NVIDIA kernel driver is not loaded")
    assert values(result)[(s.GPU_HEALTHY, E0)] == 0.0
    nvml.set(gpu(0), gpu(1))
    assert health(step(collector, 161.0)) == {0: (True, ""), 1: (True, "")}


def test_a_gpu_without_xid_events_is_unhealthy_as_upstream_marks_it(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    nvml.set(gpu(0), gpu(1, events_supported=False))
    result = step(collector)
    assert health(result)[1] == (False, g.REASON_NOT_WATCHED)
    assert result.unsupported == {f"xid_events/{UUID1}": "too old for Xid events"}


def test_a_gpu_sysfs_does_not_show_has_no_topology_and_says_why(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    nvml.set(gpu(0), gpu(1), gpu(2))
    result = step(collector)
    assert inventory(result).gpus[2].place is None
    assert "0000:af:00.0/numa_node" in result.unsupported[f"topology/{gpu(2)['uuid']}"]


def test_a_gpu_without_utilization_reports_memory_and_says_why(
    nvml: FakeNvml, collector: g.GPUCollector
) -> None:
    nvml.set(gpu(0, errors={"nvmlDeviceGetUtilizationRates": n.ERROR_NOT_SUPPORTED}))
    result = step(collector)
    assert (s.GPU_CORE_USAGE, E0) not in values(result)
    assert values(result)[(s.GPU_MEMORY_USAGE, E0)] == GiB
    assert result.unsupported == {f"utilization/{UUID0}": "NVML: utilization Not Supported"}


def test_the_row_is_gated_by_accelerators_and_its_families_are_exported(
    nvml: FakeNvml, host_root: Path
) -> None:
    host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS).host
    off = CollectorContext(host=host, config=KoordletConfig(node_name="n1"))
    assert g.NAME not in [c.name for c in build_collectors(off)]
    gates = FeatureGates({"Accelerators": True})
    on = CollectorContext(host=host, config=KoordletConfig(node_name="n1", feature_gates=gates))
    (built,) = [c for c in build_collectors(on) if c.name == g.NAME]
    assert isinstance(built, g.GPUCollector)
    try:
        result = built.collect(TickState(1000.0, WorkloadSnapshot()))
    finally:
        built.close()
    cache = MetricCache(clock=lambda: 1000.0)
    cache.append(1000.0, result.samples)
    exporter = KoordletExporter(
        cache, WorkloadSnapshot, node_name="n1", collect_interval=1.0, clock=lambda: 1000.0
    )
    row = next(r for r in COLLECTORS if r.name == g.NAME)
    got = {
        (f.name, tuple(x.labels.items()), x.value)
        for f in exporter.collect()
        if f.name in row.families
        for x in f.samples
    }
    labels0 = (("node", "n1"), ("gpu_minor", "0"), ("gpu_device_uuid", UUID0))
    assert ("koordlet_gpu_core_used_percent", labels0, 5.0) in got
    assert ("koordlet_gpu_memory_used_bytes", labels0, float(GiB)) in got
    assert ("koordlet_gpu_memory_total_bytes", labels0, float(80 * GiB)) in got
    assert ("koordlet_gpu_healthy", labels0, 1.0) in got
    assert len(got) == 8
