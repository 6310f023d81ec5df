"""The NodeSLO-file host-application source: Koordinator's cgroup paths, presence, reloads."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from apis.slo import CgroupBaseType
from koordlet.errors import ConfigError
from koordlet.statesinformer.hostapps import NodeSLOFileSource
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from tests.fakehost import FakeHost

# Koordinator's bases, spelled out per driver (GetPodQoSRelativePath upstream).
BASE_DIRS = {
    CgroupDriver.CGROUPFS: {
        CgroupBaseType.ROOT: "",
        CgroupBaseType.KUBEPODS: "kubepods",
        CgroupBaseType.KUBEPODS_BURSTABLE: "kubepods/burstable",
        CgroupBaseType.KUBEPODS_BESTEFFORT: "kubepods/besteffort",
    },
    CgroupDriver.SYSTEMD: {
        CgroupBaseType.ROOT: "",
        CgroupBaseType.KUBEPODS: "kubepods.slice",
        CgroupBaseType.KUBEPODS_BURSTABLE: "kubepods.slice/kubepods-burstable.slice",
        CgroupBaseType.KUBEPODS_BESTEFFORT: "kubepods.slice/kubepods-besteffort.slice",
    },
}


def write_nodeslo(path: Path, apps: list[dict[str, Any]]) -> None:
    doc = {
        "apiVersion": "slo.koordinator.sh/v1alpha1",
        "kind": "NodeSLO",
        "metadata": {"name": "node-1"},
        "spec": {"hostApplications": apps},
    }
    path.write_text(yaml.safe_dump(doc))


def a_minute_later() -> float:
    """A clock for tests that edit the file and read it at once: every edit has settled."""
    return time.time() + 60


@pytest.fixture
def slo_file(tmp_path: Path) -> Path:
    return tmp_path / "nodeslo.yaml"


@pytest.mark.parametrize(
    ("qos", "expected"),
    [
        ("LSE", "host-latency-sensitive/app"),
        ("LSR", "host-latency-sensitive/app"),
        ("LS", "host-latency-sensitive/app"),
        ("BE", "host-best-effort/app"),
        ("SYSTEM", "app"),
        (None, "app"),
    ],
)
def test_an_application_without_cgroup_path_gets_koordinators_default_dir_for_its_qos(
    fake_host: FakeHost, slo_file: Path, qos: str | None, expected: str
) -> None:
    app: dict[str, Any] = {"name": "app"}
    if qos is not None:
        app["qos"] = qos
    write_nodeslo(slo_file, [app])

    (info,) = NodeSLOFileSource(str(slo_file), fake_host.host).list_host_apps()

    assert info.name == "app"
    assert info.cgroup_dir == expected
    assert info.qos == (qos or "")


@pytest.mark.parametrize("base", list(CgroupBaseType))
def test_each_cgroup_base_resolves_to_the_folder_the_cgroup_driver_names(
    fake_host: FakeHost, slo_file: Path, base: CgroupBaseType
) -> None:
    write_nodeslo(
        slo_file,
        [
            {
                "name": "nginx",
                "qos": "LS",
                "priority": "koord-prod",
                "cgroupPath": {"base": base.value, "parentDir": "host-ls", "relativePath": "ng"},
            }
        ],
    )

    (info,) = NodeSLOFileSource(str(slo_file), fake_host.host).list_host_apps()

    prefix = BASE_DIRS[fake_host.layout.driver][base]
    assert info.cgroup_dir == "/".join(p for p in (prefix, "host-ls", "ng") if p)
    assert info.priority_class == "koord-prod"


def test_an_empty_base_means_the_cgroup_root(fake_host: FakeHost, slo_file: Path) -> None:
    write_nodeslo(slo_file, [{"name": "a", "cgroupPath": {"parentDir": "p/q"}}])

    (info,) = NodeSLOFileSource(str(slo_file), fake_host.host).list_host_apps()

    assert info.cgroup_dir == "p/q"


def test_an_application_is_present_only_once_its_cgroup_exists(
    fake_host: FakeHost, slo_file: Path
) -> None:
    write_nodeslo(slo_file, [{"name": "db", "qos": "LS"}, {"name": "batch", "qos": "BE"}])
    source = NodeSLOFileSource(str(slo_file), fake_host.host)
    fake_host.add_host_app_cgroup("host-latency-sensitive/db")

    present = {a.name: a.present for a in source.list_host_apps()}
    assert present == {"db": True, "batch": False}

    fake_host.add_host_app_cgroup("host-best-effort/batch")
    fake_host.remove_cgroup("host-latency-sensitive/db")

    present = {a.name: a.present for a in source.list_host_apps()}
    assert present == {"db": False, "batch": True}


def test_on_v1_a_cgroup_made_in_one_walked_controller_only_counts_as_present(
    host_root: Path, slo_file: Path
) -> None:
    fake_host = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS)
    write_nodeslo(slo_file, [{"name": "agent", "qos": "LS"}])
    os.makedirs(fake_host.layout.abs_dir("memory", "host-latency-sensitive/agent"))

    (info,) = NodeSLOFileSource(str(slo_file), fake_host.host).list_host_apps()

    assert info.present


def test_an_edited_file_is_reloaded_when_its_modification_time_changes(
    fake_host: FakeHost, slo_file: Path
) -> None:
    write_nodeslo(slo_file, [{"name": "a", "qos": "LS"}])
    source = NodeSLOFileSource(str(slo_file), fake_host.host, clock=a_minute_later)
    assert [a.name for a in source.list_host_apps()] == ["a"]

    write_nodeslo(slo_file, [{"name": "a", "qos": "LS"}, {"name": "b", "qos": "BE"}])
    st = slo_file.stat()
    os.utime(slo_file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))

    assert [a.name for a in source.list_host_apps()] == ["a", "b"]
    assert [a.name for a in source.in_force.host_applications] == ["a", "b"]


def test_a_bad_reload_keeps_the_last_good_version_and_reports_file_and_field_once(
    fake_host: FakeHost, slo_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_nodeslo(slo_file, [{"name": "a", "qos": "LS"}])
    errors: list[ConfigError] = []
    source = NodeSLOFileSource(
        str(slo_file), fake_host.host, on_error=errors.append, clock=a_minute_later
    )
    good = source.list_host_apps()

    write_nodeslo(slo_file, [{"name": "a", "qos": "GOLD"}])
    with caplog.at_level(logging.ERROR, logger="koordlet.statesinformer.hostapps"):
        assert source.list_host_apps() == good
        assert source.list_host_apps() == good

    assert len(errors) == 1
    assert errors[0].source == str(slo_file)
    assert errors[0].field == "spec.hostApplications[0].qos"
    (record,) = caplog.records
    assert str(slo_file) in record.getMessage()
    assert "spec.hostApplications[0].qos" in record.getMessage()

    write_nodeslo(slo_file, [{"name": "a", "qos": "BE"}])
    os.utime(slo_file, ns=(0, slo_file.stat().st_mtime_ns + 1_000_000))
    (info,) = source.list_host_apps()
    assert info.cgroup_dir == "host-best-effort/a"


def test_a_file_still_being_written_is_read_only_once_it_has_settled(
    fake_host: FakeHost, slo_file: Path
) -> None:
    write_nodeslo(slo_file, [{"name": "a", "qos": "LS"}])
    now = [time.time() + 60]
    source = NodeSLOFileSource(
        str(slo_file), fake_host.host, settle_seconds=0.5, clock=lambda: now[0]
    )
    good = source.list_host_apps()

    # An editor truncated the file and has not written yet: empty is a valid (empty) spec, but
    # it was written a moment ago, so it is not read.
    slo_file.write_text("")
    written = slo_file.stat().st_mtime_ns / 1e9
    now[0] = written + 0.1
    assert source.list_host_apps() == good
    source.request_reload()  # a SIGHUP in the same moment waits as well
    assert source.list_host_apps() == good

    write_nodeslo(slo_file, [{"name": "a", "qos": "LS"}, {"name": "b", "qos": "BE"}])
    written = slo_file.stat().st_mtime_ns / 1e9
    now[0] = written + 0.2
    assert source.list_host_apps() == good
    now[0] = written + 0.6
    assert [a.name for a in source.list_host_apps()] == ["a", "b"]


def test_a_deleted_file_keeps_the_last_good_version(fake_host: FakeHost, slo_file: Path) -> None:
    write_nodeslo(slo_file, [{"name": "a", "qos": "LS"}])
    errors: list[ConfigError] = []
    source = NodeSLOFileSource(
        str(slo_file), fake_host.host, on_error=errors.append, clock=a_minute_later
    )
    good = source.list_host_apps()

    slo_file.unlink()

    assert source.list_host_apps() == good
    assert source.list_host_apps() == good
    assert len(errors) == 1
    assert str(slo_file) in str(errors[0])


def test_a_requested_reload_rereads_a_file_that_looks_unchanged(
    fake_host: FakeHost, slo_file: Path
) -> None:
    write_nodeslo(slo_file, [{"name": "aa", "qos": "LS"}])
    source = NodeSLOFileSource(str(slo_file), fake_host.host, clock=a_minute_later)
    source.list_host_apps()
    st = slo_file.stat()
    write_nodeslo(slo_file, [{"name": "bb", "qos": "LS"}])  # same size, same inode
    os.utime(slo_file, ns=(st.st_atime_ns, st.st_mtime_ns))

    assert [a.name for a in source.list_host_apps()] == ["aa"]
    source.request_reload()
    assert [a.name for a in source.list_host_apps()] == ["bb"]


def test_a_bad_file_at_start_is_a_config_error_naming_file_and_field(
    fake_host: FakeHost, slo_file: Path
) -> None:
    write_nodeslo(slo_file, [{"name": "a", "cgroupPath": {"base": "Nowhere", "parentDir": "x"}}])
    source = NodeSLOFileSource(str(slo_file), fake_host.host)

    with pytest.raises(ConfigError) as info:
        source.load()

    assert info.value.source == str(slo_file)
    assert info.value.field == "spec.hostApplications[0].cgroupPath.base"
    assert source.in_force.host_applications == ()


def test_the_host_can_be_replaced_when_the_driver_is_detected_late(
    host_root: Path, slo_file: Path
) -> None:
    cgroupfs = FakeHost(host_root / "a", CgroupVersion.V1, CgroupDriver.CGROUPFS)
    systemd = FakeHost(host_root / "b", CgroupVersion.V1, CgroupDriver.SYSTEMD)
    write_nodeslo(
        slo_file,
        [{"name": "x", "cgroupPath": {"base": "KubepodsBesteffort", "relativePath": "x"}}],
    )
    source = NodeSLOFileSource(str(slo_file), cgroupfs.host)
    assert source.list_host_apps()[0].cgroup_dir == "kubepods/besteffort/x"

    source.host = systemd.host

    assert source.list_host_apps()[0].cgroup_dir == "kubepods.slice/kubepods-besteffort.slice/x"
