"""System usage (node - pods - host applications) and host-application usage."""

from __future__ import annotations

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.collectors.hostapplication import INFO_KEY, HostApplicationCollector
from koordlet.collectors.runner import TickState
from koordlet.collectors.sysresource import SystemResourceCollector
from koordlet.metriccache import MetricCache
from koordlet.metriccache import series as s
from koordlet.metriccache.series import Sample, SeriesKey
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import HostAppInfo, PodInfo, WorkloadSnapshot
from tests.fakehost import FakeHost

P1, P2 = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-9999-000000000000"
MiB = 1 << 20
SYSTEM_CPU = (s.SYSTEM_CPU_USAGE, s.SYSTEM)
SYSTEM_MEMORY = (s.SYSTEM_MEMORY_USAGE, s.SYSTEM)


def pod(uid: str) -> PodInfo:
    return PodInfo(
        uid=uid,
        name=f"pod{uid}",
        namespace="",
        qos=QoSClass.LS,
        kube_qos=KubeQOS.BURSTABLE,
        cgroup_dir=f"kubepods/burstable/pod{uid}",
    )


SNAPSHOT = WorkloadSnapshot(
    pods={P1: pod(P1), P2: pod(P2)},
    host_apps=(
        HostAppInfo("nginx", QoSClass.LS, "host-latency-sensitive/nginx"),
        HostAppInfo("absent", QoSClass.BE, "host-be/absent", present=False),
    ),
    generation=1,
)


def sample(metric: str, entity: str, value: float) -> Sample:
    return Sample(SeriesKey(metric, entity), value)


def system(tick: TickState) -> dict[tuple[str, str], float]:
    result = SystemResourceCollector().collect(tick)
    return {(x.key.metric, x.key.entity): x.value for x in result.samples}


def test_system_usage_is_node_minus_pods_minus_host_apps() -> None:
    tick = TickState(100.0, SNAPSHOT)
    tick.publish(
        [
            sample(s.NODE_CPU_USAGE, s.NODE, 4.0),
            sample(s.NODE_MEMORY_USAGE, s.NODE, 8000 * MiB),
            sample(s.POD_CPU_USAGE, s.pod_entity(P1), 1.0),
            sample(s.POD_CPU_USAGE, s.pod_entity(P2), 0.5),
            sample(s.POD_MEMORY_USAGE, s.pod_entity(P1), 3000 * MiB),
            sample(s.POD_MEMORY_USAGE, s.pod_entity(P2), 1000 * MiB),
            # containers are inside their pods: they must not be subtracted again
            sample(s.CONTAINER_CPU_USAGE, s.container_entity(P1, "c"), 1.0),
        ]
    )
    tick.publish(
        [
            sample(s.HOST_APP_CPU_USAGE, s.host_app_entity("nginx"), 0.25),
            sample(s.HOST_APP_MEMORY_USAGE, s.host_app_entity("nginx"), 500 * MiB),
            # a declared-but-absent app has no cgroup: a stale value of it must not count
            sample(s.HOST_APP_CPU_USAGE, s.host_app_entity("absent"), 1.0),
        ]
    )

    got = system(tick)

    assert got[SYSTEM_CPU] == pytest.approx(2.25)
    assert got[SYSTEM_MEMORY] == 3500 * MiB


def test_system_usage_is_clamped_at_zero() -> None:
    tick = TickState(100.0, SNAPSHOT)
    tick.publish(
        [
            sample(s.NODE_CPU_USAGE, s.NODE, 1.0),
            sample(s.NODE_MEMORY_USAGE, s.NODE, 100 * MiB),
            sample(s.POD_CPU_USAGE, s.pod_entity(P1), 1.2),
            sample(s.POD_MEMORY_USAGE, s.pod_entity(P1), 150 * MiB),
        ]
    )

    assert system(tick) == {SYSTEM_CPU: 0.0, SYSTEM_MEMORY: 0.0}


def test_without_a_node_value_nothing_is_made_up_for_that_resource() -> None:
    tick = TickState(100.0, SNAPSHOT)
    tick.publish([sample(s.NODE_MEMORY_USAGE, s.NODE, 100 * MiB)])  # node CPU still seeding

    assert system(tick) == {SYSTEM_MEMORY: 100 * MiB}


def test_values_missing_this_tick_come_from_the_cache_only_while_fresh() -> None:
    cache = MetricCache(clock=lambda: 100.0)
    cache.append(99.0, [sample(s.POD_CPU_USAGE, s.pod_entity(P1), 1.0)])
    cache.append(95.0, [sample(s.POD_CPU_USAGE, s.pod_entity(P2), 0.5)])
    tick = TickState(100.0, SNAPSHOT, store=cache, max_age=2.0)
    tick.publish([sample(s.NODE_CPU_USAGE, s.NODE, 3.0)])

    assert system(tick)[SYSTEM_CPU] == pytest.approx(2.0)  # P2's value is 5 s old: not used


def test_host_app_usage_is_reported_and_absent_apps_are_listed(fake_host: FakeHost) -> None:
    rel = fake_host.add_host_app_cgroup("host-latency-sensitive/nginx")
    snap = WorkloadSnapshot(
        pods=KubepodsSource(fake_host.host).list_pods(), host_apps=SNAPSHOT.host_apps
    )
    collector = HostApplicationCollector(fake_host.host)
    fake_host.set_cpu_usage(rel, 2_000_000_000)
    fake_host.set_memory(rel, anon=40 * MiB, file=60 * MiB, unevictable=2 * MiB, usage=110 * MiB)
    first = collector.collect(TickState(100.0, snap))
    fake_host.set_cpu_usage(rel, 2_500_000_000)

    second = collector.collect(TickState(101.0, snap))

    entity = s.host_app_entity("nginx")
    got = {(x.key.metric, x.key.entity): x.value for x in second.samples}
    assert got == {
        (s.HOST_APP_CPU_USAGE, entity): pytest.approx(0.5),
        (s.HOST_APP_MEMORY_USAGE, entity): 42 * MiB,
        (s.HOST_APP_MEMORY_WITH_PAGE_CACHE, entity): 110 * MiB,
    }
    assert (s.HOST_APP_CPU_USAGE, entity) not in {
        (x.key.metric, x.key.entity) for x in first.samples
    }
    assert second.info[INFO_KEY] == {"present": ["nginx"], "absent": ["absent"]}


def test_host_app_whose_cgroup_vanished_is_listed_absent_without_samples(
    fake_host: FakeHost,
) -> None:
    rel = fake_host.add_host_app_cgroup("host-latency-sensitive/nginx")
    fake_host.remove_cgroup(rel)

    result = HostApplicationCollector(fake_host.host).collect(TickState(100.0, SNAPSHOT))

    assert result.samples == []
    assert result.info[INFO_KEY] == {"present": [], "absent": ["absent", "nginx"]}
