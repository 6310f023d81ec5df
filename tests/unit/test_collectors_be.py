"""The best-effort collector on a fake host of every layout: real limit, request, usage."""

from __future__ import annotations

import dataclasses
import os

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.collectors.beresource import BEResourceCollector, cfs_cores
from koordlet.collectors.framework import CollectResult
from koordlet.collectors.runner import TickState
from koordlet.errors import ParseError
from koordlet.metriccache import series as s
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import WorkloadSnapshot
from koordlet.system.cgroups import CgroupVersion
from tests.fakehost import FakeHost, container_id

BE_UID = "1e2d3c4b-5a69-4788-9a0b-c1d2e3f40516"
LS_UID = "7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d"
LIMIT = (s.BE_CPU_REAL_LIMIT, s.BE)
REQUEST = (s.BE_CPU_REQUEST, s.BE)
USAGE = (s.BE_CPU_USAGE, s.BE)


def be_dir(fake: FakeHost) -> str:
    return fake.layout.qos_dir(KubeQOS.BESTEFFORT)


def set_cpuset(fake: FakeHost, rel: str, cpus: str) -> None:
    v2 = fake.version is CgroupVersion.V2
    fake.write("cpuset", rel, "cpuset.cpus.effective" if v2 else "cpuset.cpus", cpus)


def set_quota(fake: FakeHost, rel: str, quota_us: int | None, period_us: int = 100_000) -> None:
    if fake.version is CgroupVersion.V2:
        fake.write("cpu", rel, "cpu.max", f"{'max' if quota_us is None else quota_us} {period_us}")
    else:
        fake.write("cpu", rel, "cpu.cfs_quota_us", -1 if quota_us is None else quota_us)
        fake.write("cpu", rel, "cpu.cfs_period_us", period_us)


def collect(
    collector: BEResourceCollector, now: float, snap: WorkloadSnapshot
) -> tuple[dict[tuple[str, str], float], CollectResult]:
    result = collector.collect(TickState(now, snap))
    return {(x.key.metric, x.key.entity): x.value for x in result.samples}, result


def snapshot(fake: FakeHost, requests: dict[str, int | None] | None = None) -> WorkloadSnapshot:
    pods = dict(KubepodsSource(fake.host).list_pods())
    for uid, milli in (requests or {}).items():
        pods[uid] = dataclasses.replace(pods[uid], cpu_request_milli=milli)
    return WorkloadSnapshot(pods=pods, generation=1)


@pytest.fixture
def be_pod(fake_host: FakeHost) -> tuple[str, list[str]]:
    return fake_host.add_pod(BE_UID, KubeQOS.BESTEFFORT, [("containerd", container_id("be"))])


def test_real_limit_is_the_cpuset_size_when_no_quota_applies(
    fake_host: FakeHost, be_pod: tuple[str, list[str]]
) -> None:
    set_cpuset(fake_host, be_dir(fake_host), "0-1")
    set_quota(fake_host, be_dir(fake_host), None)

    got, result = collect(BEResourceCollector(fake_host.host), 100.0, snapshot(fake_host))

    assert got[LIMIT] == 2.0
    assert result.unsupported == {}


def test_real_limit_is_the_quota_when_it_is_below_the_cpuset(
    fake_host: FakeHost, be_pod: tuple[str, list[str]]
) -> None:
    set_cpuset(fake_host, be_dir(fake_host), "0-3")
    set_quota(fake_host, be_dir(fake_host), 150_000, 100_000)

    got, _ = collect(BEResourceCollector(fake_host.host), 100.0, snapshot(fake_host))

    assert got[LIMIT] == 1.5


def test_real_limit_takes_the_smallest_be_container_cpuset(
    fake_host: FakeHost, be_pod: tuple[str, list[str]]
) -> None:
    _, (container,) = be_pod
    set_cpuset(fake_host, be_dir(fake_host), "0-3")
    set_cpuset(fake_host, container, "3")
    set_quota(fake_host, be_dir(fake_host), 300_000, 100_000)

    got, _ = collect(BEResourceCollector(fake_host.host), 100.0, snapshot(fake_host))

    assert got[LIMIT] == 1.0


def test_request_sums_be_pods_and_counts_unknown_requests_as_zero(
    fake_host: FakeHost, be_pod: tuple[str, list[str]]
) -> None:
    other_be = "2f3e4d5c-6b7a-4899-8a1b-2c3d4e5f6a7b"
    fake_host.add_pod(other_be, KubeQOS.BESTEFFORT, [("containerd", container_id("be2"))])
    fake_host.add_pod(LS_UID, KubeQOS.BURSTABLE, [("containerd", container_id("ls"))])
    snap = snapshot(fake_host, {BE_UID: 1500, other_be: None, LS_UID: 4000})
    assert snap.pods[LS_UID].qos is QoSClass.LS

    got, _ = collect(BEResourceCollector(fake_host.host), 100.0, snap)

    assert got[REQUEST] == 1.5


def test_usage_is_the_be_cgroup_counter_delta_and_first_reading_seeds(
    fake_host: FakeHost, be_pod: tuple[str, list[str]]
) -> None:
    collector = BEResourceCollector(fake_host.host)
    snap = snapshot(fake_host)
    fake_host.set_cpu_usage(be_dir(fake_host), 10_000_000_000)
    first, _ = collect(collector, 100.0, snap)
    fake_host.set_cpu_usage(be_dir(fake_host), 13_000_000_000)

    second, _ = collect(collector, 102.0, snap)

    assert USAGE not in first
    assert second[USAGE] == pytest.approx(1.5)


def test_missing_be_cgroup_reports_only_the_request_and_says_why(fake_host: FakeHost) -> None:
    fake_host.remove_cgroup(be_dir(fake_host))

    got, result = collect(BEResourceCollector(fake_host.host), 100.0, WorkloadSnapshot())

    assert got == {REQUEST: 0.0}
    assert be_dir(fake_host) in result.unsupported["be_cgroup"]


def test_without_a_cpuset_file_the_limit_is_the_online_cpus_and_it_is_reported(
    fake_host: FakeHost,
) -> None:
    v2 = fake_host.version is CgroupVersion.V2
    os.unlink(
        fake_host.path(
            "cpuset", be_dir(fake_host), "cpuset.cpus.effective" if v2 else "cpuset.cpus"
        )
    )
    set_quota(fake_host, be_dir(fake_host), None)

    got, result = collect(BEResourceCollector(fake_host.host), 100.0, WorkloadSnapshot())

    assert got[LIMIT] == fake_host.ncpus
    assert "be_cpuset" in result.unsupported


@pytest.mark.parametrize(
    ("quota", "period", "cores"),
    [(None, 100_000, None), (50_000, 100_000, 0.5), (250_000, 100_000, 2.5)],
)
def test_cfs_quota_reads_as_cores_or_unlimited(
    quota: int | None, period: int, cores: float | None
) -> None:
    assert cfs_cores(quota, period, "cpu.max") == cores


def test_a_cfs_period_that_is_not_positive_raises_a_parse_error() -> None:
    with pytest.raises(ParseError, match=r"cpu\.cfs_quota_us: CFS period 0"):
        cfs_cores(1000, 0, "cpu.cfs_quota_us")


@pytest.mark.parametrize("quota", ["lots", "100000"])
def test_a_malformed_cfs_quota_fails_the_step_naming_the_file(
    fake_host: FakeHost, quota: str
) -> None:
    rel = be_dir(fake_host)
    if fake_host.version is CgroupVersion.V2:
        fake_host.write("cpu", rel, "cpu.max", quota)  # one field: not '<quota|max> <period>'
    elif quota == "lots":
        fake_host.write("cpu", rel, "cpu.cfs_quota_us", quota)
    else:
        set_quota(fake_host, rel, 1000, period_us=0)
    collector = BEResourceCollector(fake_host.host)

    with pytest.raises(ParseError, match=r"cpu\.(max|cfs_quota_us)"):
        collector.collect(TickState(1.0, snapshot(fake_host)))


def test_request_sums_batch_cpu_when_the_source_knows_extended_requests(
    fake_host: FakeHost, be_pod: tuple[str, list[str]]
) -> None:
    # upstream sums the BE pods' kubernetes.io/batch-cpu requests (milli-cores as an integer)
    pods = dict(snapshot(fake_host).pods)
    pods[BE_UID] = dataclasses.replace(
        pods[BE_UID], cpu_request_milli=0, extended_requests={"kubernetes.io/batch-cpu": 2500}
    )
    got, _ = collect(BEResourceCollector(fake_host.host), 100.0, WorkloadSnapshot(pods=pods))
    assert got[REQUEST] == 2.5


def test_the_be_cgroups_own_throttling_is_a_ratio_of_periods(
    fake_host: FakeHost, be_pod: tuple[str, list[str]]
) -> None:
    collector = BEResourceCollector(fake_host.host)
    snap = snapshot(fake_host)
    throttled = (s.BE_CPU_THROTTLED_RATIO, s.BE)
    fake_host.set_throttle(be_dir(fake_host), periods=100, throttled=10)
    first, _ = collect(collector, 100.0, snap)
    fake_host.set_throttle(be_dir(fake_host), periods=150, throttled=30)
    second, _ = collect(collector, 101.0, snap)
    fake_host.set_throttle(be_dir(fake_host), periods=150, throttled=30)
    idle, _ = collect(collector, 102.0, snap)

    assert throttled not in first  # the first reading seeds
    assert second[throttled] == pytest.approx(20 / 50)
    assert idle[throttled] == 0.0  # no period elapsed
