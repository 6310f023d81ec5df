"""The evictor's policy (eligibility, dedupe, cap, dry run, audit, metric) and its cgroup-kill
backend on the fake tree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from apis.extension import KubeQOS, QoSClass
from koordlet.errors import InvalidValueError
from koordlet.executor.audit import AuditLog
from koordlet.qos.evictor import (
    LABEL_EVICTION_ENABLED,
    REASON_MEMORY,
    CgroupKillEvictor,
    EvictionFailed,
    Evictor,
    Victim,
)
from koordlet.statesinformer.model import HostAppInfo, PodInfo
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost


def pod(n: int, qos: QoSClass = QoSClass.BE, **kw: Any) -> PodInfo:
    uid = f"00000000-0000-4000-8000-{n:012d}"
    kube = KubeQOS.BESTEFFORT if qos is QoSClass.BE else KubeQOS.BURSTABLE
    return PodInfo(uid, f"p{n}", "ns", qos, kube, f"kubepods/besteffort/pod{uid}", **kw)


class RecordingBackend:
    name = "recording"

    def __init__(self, fail: set[str] | None = None) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.fail = fail or set()

    async def evict(self, victim: Victim, *, reason: str, message: str) -> str:
        self.calls.append((victim.key, reason, message))
        if victim.key in self.fail:
            raise EvictionFailed(victim.key, "the API said no")
        return "ok"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_only_be_pods_and_pods_that_opt_in_are_evicted() -> None:
    backend = RecordingBackend()
    evictor = Evictor(backend)
    victims = [
        Victim.of_pod(pod(1, QoSClass.BE)),
        Victim.of_pod(pod(2, QoSClass.LS)),
        Victim.of_pod(pod(3, QoSClass.LS, labels={LABEL_EVICTION_ENABLED: "true"})),
        Victim.of_pod(pod(4, QoSClass.LSR, labels={LABEL_EVICTION_ENABLED: "True"})),
        Victim.of_host_app(HostAppInfo("batch", QoSClass.BE, "host-best-effort/batch")),
        Victim.of_host_app(HostAppInfo("db", QoSClass.LS, "host-latency-sensitive/db")),
    ]
    out = await evictor.evict(victims, strategy="memoryevict", reason=REASON_MEMORY)
    assert [o.status for o in out] == [
        "evicted",
        "refused",
        "evicted",
        "refused",
        "evicted",
        "refused",
    ]
    assert [c[0] for c in backend.calls] == [victims[0].key, victims[2].key, victims[4].key]


async def test_a_pod_is_not_evicted_twice_within_the_dedupe_window() -> None:
    clock = Clock()
    backend = RecordingBackend()
    evictor = Evictor(backend, dedupe_window=120, clock=clock)
    v = Victim.of_pod(pod(1))
    first = await evictor.evict([v], strategy="s", reason="r")
    clock.now += 119
    second = await evictor.evict([v], strategy="s", reason="r")
    clock.now += 2
    third = await evictor.evict([v], strategy="s", reason="r")
    assert [first[0].status, second[0].status, third[0].status] == [
        "evicted",
        "duplicate",
        "evicted",
    ]
    assert second[0].counts_as_released
    assert len(backend.calls) == 2


async def test_evictions_beyond_the_cap_wait_for_the_next_round() -> None:
    backend = RecordingBackend()
    evictor = Evictor(backend, max_per_round=2)
    victims = [Victim.of_pod(pod(n)) for n in range(4)]
    out = await evictor.evict(victims, strategy="s", reason="r")
    assert [o.status for o in out] == ["evicted", "evicted", "capped", "capped"]
    again = await evictor.evict(victims, strategy="s", reason="r")
    assert [o.status for o in again] == ["duplicate", "duplicate", "evicted", "evicted"]


async def test_refused_and_duplicate_victims_do_not_use_up_the_cap() -> None:
    backend = RecordingBackend()
    evictor = Evictor(backend, max_per_round=1)
    await evictor.evict([Victim.of_pod(pod(0))], strategy="s", reason="r")
    victims = [Victim.of_pod(pod(0)), Victim.of_pod(pod(1, QoSClass.LS)), Victim.of_pod(pod(2))]
    out = await evictor.evict(victims, strategy="s", reason="r")
    assert [o.status for o in out] == ["duplicate", "refused", "evicted"]


async def test_a_failed_eviction_is_reported_and_the_next_victim_still_runs() -> None:
    victims = [Victim.of_pod(pod(1)), Victim.of_pod(pod(2))]
    backend = RecordingBackend(fail={victims[0].key})
    evictor = Evictor(backend)
    out = await evictor.evict(victims, strategy="s", reason="r")
    assert [o.status for o in out] == ["failed", "evicted"]
    assert "the API said no" in out[0].detail
    assert not evictor.recently_evicted(victims[0].key)


async def test_dry_run_decides_and_audits_but_evicts_nothing() -> None:
    backend = RecordingBackend()
    audit = AuditLog(None)
    registry = CollectorRegistry()
    evictor = Evictor(backend, dry_run=True, audit=audit, registry=registry)
    v = Victim.of_pod(pod(1), "used 1 GiB")
    out = await evictor.evict([v], strategy="memoryevict", reason=REASON_MEMORY)
    assert out[0].status == "dry_run"
    assert backend.calls == []
    [entry] = audit.recent()
    assert (entry.kind, entry.dry_run, entry.strategy) == ("decision", True, "memoryevict")
    assert entry.path == v.cgroup_dir
    assert entry.reason == f"{REASON_MEMORY}: used 1 GiB"
    text = generate_latest(registry).decode()
    assert f'koordlet_pod_eviction_dry_run{{node="",reason="{REASON_MEMORY}"}} 1.0' in text
    assert "koordlet_pod_eviction{" not in text


async def test_a_per_call_dry_run_leaves_the_global_setting_alone() -> None:
    backend = RecordingBackend()
    evictor = Evictor(backend)
    out = await evictor.evict([Victim.of_pod(pod(1))], strategy="s", reason="r", dry_run=True)
    assert out[0].status == "dry_run"
    out = await evictor.evict([Victim.of_pod(pod(2))], strategy="s", reason="r")
    assert out[0].status == "evicted"


async def test_done_evictions_count_in_koordlet_pod_eviction_by_reason() -> None:
    registry = CollectorRegistry()
    audit = AuditLog(None)
    evictor = Evictor(RecordingBackend(), registry=registry, node_name="n1", audit=audit)
    await evictor.evict(
        [Victim.of_pod(pod(1)), Victim.of_pod(pod(2))], strategy="s", reason=REASON_MEMORY
    )
    await evictor.evict([Victim.of_pod(pod(3))], strategy="s", reason="EvictPodByBECPUSatisfaction")
    text = generate_latest(registry).decode()
    assert f'koordlet_pod_eviction{{node="n1",reason="{REASON_MEMORY}"}} 2.0' in text
    assert 'koordlet_pod_eviction{node="n1",reason="EvictPodByBECPUSatisfaction"} 1.0' in text
    assert [e.kind for e in audit.recent()] == ["evict"] * 3
    assert {e.new for e in audit.recent()} == {"evicted"}


async def test_listeners_hear_each_call_and_a_raising_one_breaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    evictor = Evictor(RecordingBackend())
    heard: list[tuple[str, str, list[str], bool]] = []

    def broken(*_: Any) -> None:
        raise RuntimeError("listener bug")

    evictor.add_listener(broken)
    evictor.add_listener(lambda s, r, o, d: heard.append((s, r, [x.status for x in o], d)))
    out = await evictor.evict([Victim.of_pod(pod(1))], strategy="memoryevict", reason=REASON_MEMORY)
    await evictor.evict([], strategy="memoryevict", reason=REASON_MEMORY)  # no outcome: not told
    await evictor.evict([Victim.of_pod(pod(2))], strategy="cpuevict", reason="r", dry_run=True)
    assert [o.status for o in out] == ["evicted"]
    assert heard == [
        ("memoryevict", REASON_MEMORY, ["evicted"], False),
        ("cpuevict", "r", ["dry_run"], True),
    ]
    assert "listener bug" in caplog.text


def test_a_negative_cap_is_refused() -> None:
    with pytest.raises(InvalidValueError):
        Evictor(RecordingBackend(), max_per_round=-1)


async def test_no_cap_by_default_as_upstream() -> None:
    # Koordinator evicts every victim a round picks; the cap is ours and off unless set
    backend = RecordingBackend()
    evictor = Evictor(backend)
    assert evictor.max_per_round == 0
    victims = [Victim.of_pod(pod(n)) for n in range(8)]
    out = await evictor.evict(victims, strategy="s", reason="r")
    assert [o.status for o in out] == ["evicted"] * 8


@pytest.mark.parametrize("driver", list(CgroupDriver))
async def test_the_cgroup_kill_backend_writes_cgroup_kill_on_v2(
    host_root: Path, driver: CgroupDriver
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, driver)
    p = pod(7)
    rel, _ = fake.add_pod(p.uid, KubeQOS.BESTEFFORT, [("containerd", "c" * 64)])
    fake.write("cpu", rel, "cgroup.kill", "0")
    fake.write("cpu", rel, "cgroup.events", "populated 0\nfrozen 0")
    victim = Victim.of_pod(PodInfo(p.uid, "p7", "ns", QoSClass.BE, KubeQOS.BESTEFFORT, rel))
    evictor = Evictor(CgroupKillEvictor(lambda: fake.host))
    [out] = await evictor.evict([victim], strategy="s", reason="r")
    assert (out.status, out.detail) == ("evicted", "cgroup.kill")
    assert fake.read("cpu", rel, "cgroup.kill").strip() == "1"


async def test_the_cgroup_kill_backend_reports_a_vanished_cgroup_as_gone(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    p = pod(8)
    rel = fake.layout.pod_dir(KubeQOS.BESTEFFORT, p.uid)
    victim = Victim.of_pod(PodInfo(p.uid, "p8", "ns", QoSClass.BE, KubeQOS.BESTEFFORT, rel))
    [out] = await Evictor(CgroupKillEvictor(lambda: fake.host)).evict(
        [victim], strategy="s", reason="r"
    )
    assert out.status == "gone"


async def test_the_cgroup_kill_backend_refuses_the_besteffort_folder_itself(
    host_root: Path,
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    app = HostAppInfo("bad", QoSClass.BE, fake.layout.qos_dir(KubeQOS.BESTEFFORT))
    [out] = await Evictor(CgroupKillEvictor(lambda: fake.host)).evict(
        [Victim.of_host_app(app)], strategy="s", reason="r"
    )
    assert out.status == "failed"
    assert "refusing" in out.detail


async def test_failed_and_refused_evictions_count_in_koordlet_pod_eviction_failures() -> None:
    registry = CollectorRegistry()
    evictor = Evictor(
        RecordingBackend(fail={f"pod/{pod(1).uid}"}), registry=registry, node_name="n1"
    )
    ls = pod(3, QoSClass.LS)  # not BE and not opted in: refused
    await evictor.evict(
        [Victim.of_pod(pod(1)), Victim.of_pod(pod(2)), Victim.of_pod(ls)],
        strategy="s",
        reason=REASON_MEMORY,
    )
    failures = {
        status: registry.get_sample_value(
            "koordlet_pod_eviction_failures_total",
            {"node": "n1", "reason": REASON_MEMORY, "status": status},
        )
        for status in ("failed", "refused")
    }
    assert failures == {"failed": 1.0, "refused": 1.0}
    text = generate_latest(registry).decode()
    assert f'koordlet_pod_eviction{{node="n1",reason="{REASON_MEMORY}"}} 1.0' in text
