"""The kubepods walker and the inventory that merges sources, on a fake host tree."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from apis.extension import KubeQOS, QoSClass
from koordlet.errors import UnsupportedError
from koordlet.statesinformer.inventory import WorkloadInventory
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.statesinformer.model import HostAppInfo, PodInfo
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.inotify import Changes, DirWatcher
from tests.fakehost import FakeHost, container_id
from tests.inotifywatches import kernel_watches

UID_G = "0f6d1c2e-1111-4a4a-8b8b-000000000001"
UID_B = "0f6d1c2e-2222-4a4a-8b8b-000000000002"
UID_BE = "0f6d1c2e-3333-4a4a-8b8b-000000000003"
CID_1 = container_id("c1")
CID_2 = container_id("c2")


def pod_dir(driver: CgroupDriver, qos: KubeQOS, uid: str) -> str:
    """The kubelet's pod folder, written out (not computed by the code under test)."""
    if driver is CgroupDriver.CGROUPFS:
        mid = {KubeQOS.GUARANTEED: "", KubeQOS.BURSTABLE: "burstable/"}.get(qos, "besteffort/")
        return f"kubepods/{mid}pod{uid}"
    under = uid.replace("-", "_")
    if qos is KubeQOS.GUARANTEED:
        return f"kubepods.slice/kubepods-pod{under}.slice"
    token = "burstable" if qos is KubeQOS.BURSTABLE else "besteffort"
    return f"kubepods.slice/kubepods-{token}.slice/kubepods-{token}-pod{under}.slice"


def test_pods_are_found_in_every_qos_level_with_uid_qos_and_cgroup_dir(fake_host: FakeHost) -> None:
    fake_host.add_pod(UID_G, KubeQOS.GUARANTEED, [("containerd", CID_1)])
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE)
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT)
    driver = fake_host.layout.driver

    pods = KubepodsSource(fake_host.host).list_pods()

    assert set(pods) == {UID_G, UID_B, UID_BE}
    expected = {
        UID_G: (KubeQOS.GUARANTEED, QoSClass.LSR),
        UID_B: (KubeQOS.BURSTABLE, QoSClass.LS),
        UID_BE: (KubeQOS.BESTEFFORT, QoSClass.BE),
    }
    for uid, (kube_qos, qos) in expected.items():
        pod = pods[uid]
        assert (pod.kube_qos, pod.qos) == (kube_qos, qos)
        assert pod.cgroup_dir == pod_dir(driver, kube_qos, uid)
        assert pod.name == f"pod{uid}"
        assert pod.namespace == ""
        assert pod.source == "kubepods"


def test_containers_are_listed_with_runtime_and_cgroup_dir(fake_host: FakeHost) -> None:
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1), ("cri-o", CID_2)])
    systemd = fake_host.layout.driver is CgroupDriver.SYSTEMD
    base = pod_dir(fake_host.layout.driver, KubeQOS.BURSTABLE, UID_B)

    pod = KubepodsSource(fake_host.host).list_pods()[UID_B]

    got = {c.id: (c.runtime, c.cgroup_dir, c.name) for c in pod.containers}
    assert got == {
        CID_1: (
            "containerd" if systemd else "unknown",
            f"{base}/cri-containerd-{CID_1}.scope" if systemd else f"{base}/{CID_1}",
            CID_1[:12],
        ),
        CID_2: (
            "cri-o",
            f"{base}/crio-{CID_2}.scope" if systemd else f"{base}/crio-{CID_2}",
            CID_2[:12],
        ),
    }


def test_folders_that_are_not_pods_or_containers_are_ignored(fake_host: FakeHost) -> None:
    pod_rel, _ = fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT)
    fake_host.add_host_app_cgroup(f"{fake_host.layout.kube_root}/not-a-pod")
    fake_host.add_host_app_cgroup(f"{pod_rel}/not-a-container")

    pods = KubepodsSource(fake_host.host).list_pods()

    assert list(pods) == [UID_BE]
    assert pods[UID_BE].containers == ()


def test_a_missing_kubepods_root_means_no_pods(fake_host: FakeHost) -> None:
    fake_host.remove_cgroup(fake_host.layout.kube_root)

    assert KubepodsSource(fake_host.host).list_pods() == {}


def test_on_v1_a_pod_made_under_one_walked_controller_only_is_found(host_root: Path) -> None:
    fake_host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    rel = f"kubepods/besteffort/pod{UID_BE}/{CID_1}"
    os.makedirs(fake_host.layout.abs_dir("memory", rel))

    pods = KubepodsSource(fake_host.host).list_pods()

    assert [c.id for c in pods[UID_BE].containers] == [CID_1]


def test_between_full_walks_new_and_removed_pods_show_at_the_next_call(
    fake_host: FakeHost,
) -> None:
    source = KubepodsSource(fake_host.host)
    fake_host.add_pod(UID_G, KubeQOS.GUARANTEED, [("containerd", CID_1)])
    first = source.list_pods()

    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT, [("containerd", CID_2)])
    fake_host.remove_cgroup(pod_dir(fake_host.layout.driver, KubeQOS.GUARANTEED, UID_G))
    second = source.list_pods()

    assert set(first) == {UID_G}
    assert set(second) == {UID_BE}
    assert [c.id for c in second[UID_BE].containers] == [CID_2]


def test_listing_a_known_pod_keeps_its_object_and_a_new_container_shows_within_rescan_ticks(
    fake_host: FakeHost,
) -> None:
    source = KubepodsSource(
        fake_host.host, full_walk_ticks=1000, container_rescan_ticks=4, watch=False
    )
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1)])
    known = source.list_pods()[UID_B]
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1), ("containerd", CID_2)])

    seen = [source.list_pods()[UID_B] for _ in range(4)]

    unchanged = [p for p in seen if p is known]
    assert unchanged, "between rescans the pod is not described again"
    assert [c.id for c in seen[-1].containers] == sorted([CID_1, CID_2])


@pytest.mark.parametrize("watch", [False, True])
def test_on_v1_a_pod_under_other_controllers_only_stays_until_the_next_full_walk(
    host_root: Path, watch: bool
) -> None:
    fake_host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    rel = f"kubepods/besteffort/pod{UID_BE}"
    os.makedirs(fake_host.layout.abs_dir("memory", rel))
    source = KubepodsSource(
        fake_host.host, full_walk_ticks=3, watched_full_walk_ticks=3, watch=watch
    )

    found = [UID_BE in source.list_pods(), UID_BE in source.list_pods()]
    os.rmdir(fake_host.layout.abs_dir("memory", rel))
    after = [UID_BE in source.list_pods(), UID_BE in source.list_pods()]

    assert found == [True, True]
    assert after == [True, False]  # the third call is incremental, the fourth a full walk


# Watching with inotify --------------------------------------------------------------------------


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every folder the walker lists, in order."""
    listed: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: str) -> object:
        listed.append(path)
        return real_scandir(path)

    monkeypatch.setattr("koordlet.statesinformer.kubepods.os.scandir", counting_scandir)
    return listed


def test_watching_a_call_without_events_lists_nothing_and_keeps_every_object(
    fake_host: FakeHost, listings: list[str]
) -> None:
    fake_host.add_pod(UID_G, KubeQOS.GUARANTEED, [("containerd", CID_1)])
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_2)])
    source = KubepodsSource(fake_host.host)
    first = source.list_pods()
    assert listings, "the first call walks"
    listings.clear()

    later = [source.list_pods() for _ in range(40)]  # beyond the listing mode's full walk

    assert listings == []
    assert all(p[uid] is first[uid] for p in later for uid in first)
    source.close()


def test_watching_a_new_container_shows_at_the_next_call_and_only_its_pod_is_listed(
    fake_host: FakeHost, listings: list[str]
) -> None:
    fake_host.add_pod(UID_G, KubeQOS.GUARANTEED, [("containerd", CID_1)])
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1)])
    source = KubepodsSource(fake_host.host)
    first = source.list_pods()
    listings.clear()

    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1), ("containerd", CID_2)])
    second = source.list_pods()

    assert [c.id for c in second[UID_B].containers] == sorted([CID_1, CID_2])
    assert second[UID_G] is first[UID_G]
    pod_folders = [p for p in listings if UID_G in p.replace("_", "-")]
    assert pod_folders == [], "the pod without events was not listed"
    source.close()


def test_watching_pods_and_folders_made_after_the_start_show_at_the_next_call(
    host_root: Path,
) -> None:
    fake_host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    root = fake_host.layout.paths.cgroup_root
    controllers = [c for c in os.listdir(root) if not os.path.islink(os.path.join(root, c))]

    def mkdir_everywhere(rel: str) -> None:
        for controller in controllers:
            os.mkdir(os.path.join(root, controller, rel))

    for controller in controllers:  # no kubepods folder yet: the kubelet has not started
        shutil.rmtree(os.path.join(root, controller, "kubepods"), ignore_errors=True)
    source = KubepodsSource(fake_host.host)
    assert source.list_pods() == {}

    mkdir_everywhere("kubepods")
    fake_host.add_pod(UID_G, KubeQOS.GUARANTEED)
    assert set(source.list_pods()) == {UID_G}
    mkdir_everywhere("kubepods/besteffort")  # a QoS folder made after the full walk
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT)
    assert set(source.list_pods()) == {UID_G, UID_BE}
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT, [("containerd", CID_1)])
    assert [c.id for c in source.list_pods()[UID_BE].containers] == [CID_1]
    fake_host.remove_cgroup(pod_dir(CgroupDriver.CGROUPFS, KubeQOS.BESTEFFORT, UID_BE))
    assert set(source.list_pods()) == {UID_G}
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT, [("containerd", CID_2)])  # made again
    assert [c.id for c in source.list_pods()[UID_BE].containers] == [CID_2]
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT, [("containerd", CID_2), ("containerd", CID_1)])
    assert [c.id for c in source.list_pods()[UID_BE].containers] == sorted([CID_1, CID_2])
    source.close()


def test_watching_pods_removed_at_once_leave_no_watch_behind_and_one_made_again_is_followed(
    fake_host: FakeHost,
) -> None:
    uids = [f"0f6d1c2e-4444-4a4a-8b8b-{i:012d}" for i in range(30)]
    for uid in uids:
        fake_host.add_pod(uid, KubeQOS.BURSTABLE, [("containerd", CID_1)])
    source = KubepodsSource(fake_host.host)
    source.list_pods()
    watched_before = set(source._wd_of)

    for uid in uids[1:]:  # a drain: every pod but one goes between two calls
        fake_host.remove_cgroup(pod_dir(fake_host.layout.driver, KubeQOS.BURSTABLE, uid))
    assert set(source.list_pods()) == {uids[0]}
    gone = {p for p in watched_before if any(u in p.replace("_", "-") for u in uids[1:])}
    assert gone, "the pods' folders were watched"
    assert set(source._wd_of) == watched_before - gone
    assert set(source._paths_of_wd) == set(source._wd_of.values()) == set(source._pod_of_wd)

    fake_host.add_pod(uids[5], KubeQOS.BURSTABLE, [("containerd", CID_2)])  # made again
    assert [c.id for c in source.list_pods()[uids[5]].containers] == [CID_2]
    fake_host.add_pod(uids[5], KubeQOS.BURSTABLE, [("containerd", CID_2), ("containerd", CID_1)])
    assert [c.id for c in source.list_pods()[uids[5]].containers] == sorted([CID_1, CID_2])
    assert all(source._wd_of[p] in source._paths_of_wd for p in source._wd_of)
    source.close()


def held_watches(source: KubepodsSource) -> set[int]:
    """The watch descriptors the kernel holds on the walker's inotify instance."""
    assert source._watcher is not None
    return kernel_watches(source._watcher.fd)


def test_watching_a_pod_folder_renamed_away_and_made_again_leaves_one_watch_on_it(
    fake_host: FakeHost,
) -> None:
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1)])
    source = KubepodsSource(fake_host.host)
    source.list_pods()
    assert held_watches(source) == set(source._paths_of_wd)
    rel = pod_dir(fake_host.layout.driver, KubeQOS.BURSTABLE, UID_B)
    folders = {
        os.path.realpath(fake_host.layout.abs_dir(c or "cpu", rel)) for c in fake_host._templates
    }
    for folder in folders:  # the kernel keeps its watch on a folder moved away
        os.rename(folder, folder + ".old")
    fake_host.remove_cgroup(rel)  # only the fake's book: the folders are gone from their names
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_2)])

    assert [c.id for c in source.list_pods()[UID_B].containers] == [CID_2]
    assert held_watches(source) == set(source._paths_of_wd), "no watch left on a moved folder"
    source.close()
    for folder in folders:
        shutil.rmtree(folder + ".old")


def test_without_inotify_the_walker_says_why_once_and_lists_instead(
    fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_instance() -> None:
        raise UnsupportedError(
            "inotify", "no inotify instance left (fs.inotify.max_user_instances)"
        )

    monkeypatch.setattr("koordlet.statesinformer.kubepods.DirWatcher", no_instance)
    source = KubepodsSource(fake_host.host, container_rescan_ticks=2, full_walk_ticks=3)
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1)])

    with caplog.at_level(logging.WARNING, logger="koordlet.statesinformer.kubepods"):
        source.list_pods()
        fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1), ("containerd", CID_2)])
        seen = [source.list_pods()[UID_B] for _ in range(4)]

    assert [c.id for c in seen[-1].containers] == sorted([CID_1, CID_2])
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "max_user_instances" in warnings[0]


def test_running_out_of_watches_half_way_still_walks_everything(
    fake_host: FakeHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_host.add_pod(UID_G, KubeQOS.GUARANTEED, [("containerd", CID_1)])
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_2)])
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT)
    real_add = DirWatcher.add
    added: list[str] = []

    def few_watches(self: DirWatcher, path: str) -> int | None:
        if len(added) >= 3:
            raise UnsupportedError("inotify", f"no inotify watch left for {path}")
        added.append(path)
        return real_add(self, path)

    monkeypatch.setattr(DirWatcher, "add", few_watches)
    source = KubepodsSource(fake_host.host, container_rescan_ticks=1)

    with caplog.at_level(logging.WARNING, logger="koordlet.statesinformer.kubepods"):
        pods = source.list_pods()
        fake_host.add_pod(UID_G, KubeQOS.GUARANTEED, [("containerd", CID_1), ("containerd", CID_2)])
        again = source.list_pods()

    assert set(pods) == {UID_G, UID_B, UID_BE}
    assert [c.id for c in again[UID_G].containers] == sorted([CID_1, CID_2])  # listed, not watched
    assert any("no inotify watch left" in r.getMessage() for r in caplog.records)


def test_lost_events_make_the_next_call_a_full_walk(
    host_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1)])
    source = KubepodsSource(fake_host.host)
    assert set(source.list_pods()) == {UID_B}
    # A pod made under the memory controller only: the first controller has no event for it,
    # so only a full walk finds it.
    os.makedirs(fake_host.layout.abs_dir("memory", f"kubepods/besteffort/pod{UID_BE}"))
    monkeypatch.setattr(DirWatcher, "changes", lambda self: Changes(overflow=True))

    assert set(source.list_pods()) == {UID_B, UID_BE}
    source.close()


def test_on_v1_controllers_mounted_together_are_walked_once(
    host_root: Path, listings: list[str]
) -> None:
    # systemd mounts cpu and cpuacct as one hierarchy, "cpu,cpuacct", with both names as
    # symbolic links to it; walking both would list every folder twice.
    fake_host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    cpu = fake_host.layout.abs_dir("cpu", "")
    cpuacct = fake_host.layout.abs_dir("cpuacct", "")
    both = os.path.join(os.path.dirname(cpu), "cpu,cpuacct")
    os.rename(cpu, both)
    shutil.rmtree(cpuacct)
    os.symlink("cpu,cpuacct", cpu)
    os.symlink("cpu,cpuacct", cpuacct)
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1)])
    listings.clear()  # the set-up's own listings (shutil.rmtree's)

    pods = KubepodsSource(fake_host.host).list_pods()

    listed = [os.path.realpath(p) for p in listings]

    assert [c.id for c in pods[UID_B].containers] == [CID_1]
    assert len(listed) == len(set(listed)), "a folder was listed twice"
    assert any(p.startswith(both) for p in listed)
    assert any(p.startswith(fake_host.layout.abs_dir("memory", "")) for p in listed)


class FakePodSource:
    """A pod source whose answer (or failure) a test sets."""

    def __init__(self, name: str, pods: Mapping[str, PodInfo] | None = None) -> None:
        self.name = name
        self.pods: Mapping[str, PodInfo] = pods or {}
        self.error: Exception | None = None

    def list_pods(self) -> Mapping[str, PodInfo]:
        if self.error is not None:
            raise self.error
        return self.pods


class FakeAppSource:
    def __init__(self, apps: tuple[HostAppInfo, ...] = ()) -> None:
        self.name = "apps"
        self.apps = apps
        self.error: Exception | None = None

    def list_host_apps(self) -> tuple[HostAppInfo, ...]:
        if self.error is not None:
            raise self.error
        return self.apps


def pod(uid: str, source: str, qos: QoSClass = QoSClass.LS) -> PodInfo:
    return PodInfo(
        uid=uid,
        name=f"pod{uid}",
        namespace="",
        qos=qos,
        kube_qos=KubeQOS.BURSTABLE,
        cgroup_dir=f"kubepods/burstable/pod{uid}",
        source=source,
    )


def test_a_refresh_reports_added_removed_and_updated_pods(fake_host: FakeHost) -> None:
    inventory = WorkloadInventory([KubepodsSource(fake_host.host, container_rescan_ticks=1)])
    fake_host.add_pod(UID_G, KubeQOS.GUARANTEED)
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE)

    first = inventory.refresh()
    assert (first.added, first.removed, first.updated) == ((UID_G, UID_B), (), ())

    fake_host.remove_cgroup(pod_dir(fake_host.layout.driver, KubeQOS.GUARANTEED, UID_G))
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE, [("containerd", CID_1)])
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT)

    second = inventory.refresh()
    assert (second.added, second.removed, second.updated) == ((UID_BE,), (UID_G,), (UID_B,))
    assert set(inventory.snapshot().pods) == {UID_B, UID_BE}


def test_the_snapshot_and_its_generation_change_only_when_the_content_does(
    fake_host: FakeHost,
) -> None:
    inventory = WorkloadInventory([KubepodsSource(fake_host.host)])
    fake_host.add_pod(UID_B, KubeQOS.BURSTABLE)
    inventory.refresh()
    snap = inventory.snapshot()

    unchanged = inventory.refresh()

    assert not unchanged.changed
    assert inventory.snapshot() is snap
    fake_host.add_pod(UID_BE, KubeQOS.BESTEFFORT)
    inventory.refresh()
    assert inventory.snapshot().generation == snap.generation + 1


def test_a_failing_source_keeps_its_last_answer_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = FakePodSource("walker", {"u1": pod("u1", "walker")})
    inventory = WorkloadInventory([source])
    inventory.refresh()
    source.error = OSError("EIO")

    with caplog.at_level(logging.ERROR, logger="koordlet.statesinformer.inventory"):
        assert not inventory.refresh().changed
        assert not inventory.refresh().changed

    assert list(inventory.snapshot().pods) == ["u1"]
    assert len(caplog.records) == 1
    source.error = None
    source.pods = {}
    assert inventory.refresh().removed == ("u1",)


def test_the_first_source_wins_a_uid_both_report() -> None:
    first = FakePodSource("first", {"u1": pod("u1", "first", QoSClass.LSR)})
    second = FakePodSource("second", {"u1": pod("u1", "second"), "u2": pod("u2", "second")})

    inventory = WorkloadInventory([first, second])
    snap = inventory.refresh().snapshot

    assert snap.pods["u1"].source == "first"
    assert snap.pods["u1"].qos is QoSClass.LSR
    assert snap.pods["u2"].source == "second"


def test_host_apps_are_merged_and_kept_while_their_source_fails() -> None:
    app = HostAppInfo(name="nginx", qos=QoSClass.LS, cgroup_dir="host-latency-sensitive/nginx")
    apps = FakeAppSource((app,))
    inventory = WorkloadInventory([FakePodSource("walker")], [apps])

    change = inventory.refresh()
    assert change.host_apps_changed
    assert change.snapshot.host_apps == (app,)

    apps.error = RuntimeError("boom")
    assert not inventory.refresh().changed
    assert inventory.snapshot().host_apps == (app,)

    apps.error = None
    apps.apps = ()
    change = inventory.refresh()
    assert change.host_apps_changed
    assert change.snapshot.host_apps == ()
