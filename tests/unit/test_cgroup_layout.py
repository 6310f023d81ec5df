"""The cgroup layout (detection and naming) and the fake host tree it is tested on."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apis.extension import KubeQOS
from koordlet.errors import ConfigError, InvalidValueError, UnsupportedError
from koordlet.statesinformer.kubepods import KubepodsSource
from koordlet.system.cgroups import (
    CGROUP2_SUPER_MAGIC,
    V1_CONTROLLERS,
    CgroupDriver,
    CgroupLayout,
    CgroupVersion,
    detect_driver,
    detect_layout,
    detect_version,
    fs_magic,
    kube_qos_of_dir,
    kube_root_for,
    parse_container_dir_name,
    parse_pod_dir_name,
)
from koordlet.system.host import Host
from koordlet.system.paths import HostPaths
from tests.conftest import LAYOUTS
from tests.fakehost import (
    GOLDEN,
    PAGE,
    CpuTimes,
    FakeHost,
    container_id,
    parse_flat,
    render_flat,
)

UID = "7712555c-ce62-454a-9e18-9ff0217b8941"
CID = container_id("c1")
RUNTIMES = ("containerd", "cri-o", "docker")


def make_layout(
    version: CgroupVersion, driver: CgroupDriver, kube_path: str = "kubepods/"
) -> CgroupLayout:
    paths = HostPaths("/cg", "/p", "/s")
    return detect_layout(paths, version=version, driver=driver, kube_path=kube_path)


@pytest.fixture(params=LAYOUTS, ids=[f"{v}-{d}" for v, d in LAYOUTS])
def layout(request: pytest.FixtureRequest) -> CgroupLayout:
    return make_layout(*request.param)


# Naming ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("driver", "qos", "expected"),
    [
        (CgroupDriver.CGROUPFS, KubeQOS.GUARANTEED, f"kubepods/pod{UID}"),
        (CgroupDriver.CGROUPFS, KubeQOS.BURSTABLE, f"kubepods/burstable/pod{UID}"),
        (CgroupDriver.CGROUPFS, KubeQOS.BESTEFFORT, f"kubepods/besteffort/pod{UID}"),
        (
            CgroupDriver.SYSTEMD,
            KubeQOS.GUARANTEED,
            "kubepods.slice/kubepods-pod7712555c_ce62_454a_9e18_9ff0217b8941.slice",
        ),
        (
            CgroupDriver.SYSTEMD,
            KubeQOS.BURSTABLE,
            "kubepods.slice/kubepods-burstable.slice/"
            "kubepods-burstable-pod7712555c_ce62_454a_9e18_9ff0217b8941.slice",
        ),
        (
            CgroupDriver.SYSTEMD,
            KubeQOS.BESTEFFORT,
            "kubepods.slice/kubepods-besteffort.slice/"
            "kubepods-besteffort-pod7712555c_ce62_454a_9e18_9ff0217b8941.slice",
        ),
    ],
)
def test_pod_folders_are_named_as_the_kubelet_names_them(
    driver: CgroupDriver, qos: KubeQOS, expected: str
) -> None:
    for version in CgroupVersion:
        assert make_layout(version, driver).pod_dir(qos, UID) == expected


@pytest.mark.parametrize(
    ("driver", "runtime", "name"),
    [
        (CgroupDriver.CGROUPFS, "containerd", CID),
        (CgroupDriver.CGROUPFS, "docker", CID),
        (CgroupDriver.CGROUPFS, "cri-o", f"crio-{CID}"),
        (CgroupDriver.SYSTEMD, "containerd", f"cri-containerd-{CID}.scope"),
        (CgroupDriver.SYSTEMD, "docker", f"docker-{CID}.scope"),
        (CgroupDriver.SYSTEMD, "cri-o", f"crio-{CID}.scope"),
    ],
)
def test_container_folders_are_named_as_each_runtime_names_them(
    driver: CgroupDriver, runtime: str, name: str
) -> None:
    layout = make_layout(CgroupVersion.V2, driver)
    assert layout.container_dir("kubepods/podX/", runtime, CID) == f"kubepods/podX/{name}"


@pytest.mark.parametrize("qos", list(KubeQOS))
def test_a_pod_folder_names_its_uid_back_and_sits_in_its_qos_folder(
    layout: CgroupLayout, qos: KubeQOS
) -> None:
    pod = layout.pod_dir(qos, UID)
    parent, _, name = pod.rpartition("/")
    assert parse_pod_dir_name(name) == UID
    assert parent == layout.qos_dir(qos)
    assert kube_qos_of_dir(parent.rpartition("/")[2]) == (
        None if qos is KubeQOS.GUARANTEED else qos
    )


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_container_folder_names_its_runtime_and_id_back(
    layout: CgroupLayout, runtime: str
) -> None:
    rel = layout.container_dir(layout.pod_dir(KubeQOS.BURSTABLE, UID), runtime, CID)
    parsed = parse_container_dir_name(rel.rpartition("/")[2])
    bare = layout.driver is CgroupDriver.CGROUPFS and runtime != "cri-o"
    assert parsed == ("unknown" if bare else runtime, CID)
    assert layout.container_dir(layout.pod_dir(KubeQOS.BURSTABLE, UID), *parsed) == rel


@given(uid=st.uuids(), qos=st.sampled_from(list(KubeQOS)), driver=st.sampled_from(CgroupDriver))
def test_any_uuid_survives_the_pod_naming_round_trip(
    uid: uuid.UUID, qos: KubeQOS, driver: CgroupDriver
) -> None:
    name = make_layout(CgroupVersion.V1, driver).pod_dir(qos, str(uid)).rpartition("/")[2]
    assert parse_pod_dir_name(name) == str(uid)


@given(cid=st.binary(min_size=32, max_size=32).map(bytes.hex), runtime=st.sampled_from(RUNTIMES))
def test_any_runtime_id_survives_the_systemd_container_naming_round_trip(
    cid: str, runtime: str
) -> None:
    name = make_layout(CgroupVersion.V2, CgroupDriver.SYSTEMD).container_dir("p", runtime, cid)
    assert parse_container_dir_name(name[2:]) == (runtime, cid)


def test_a_static_pod_hash_uid_is_a_pod_uid() -> None:
    assert parse_pod_dir_name("pod" + "ab" * 16) == "ab" * 16
    assert parse_pod_dir_name(f"kubepods-pod{'ab' * 16}.slice") == "ab" * 16


def test_crio_conmon_scopes_are_not_containers() -> None:
    assert parse_container_dir_name(f"crio-conmon-{CID}.scope") is None
    assert parse_container_dir_name(f"crio-conmon-{CID}") is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "pod",
        "podcast",
        "kubepods-burstable.slice",
        "kubepods-burstable-pod.slice",
        "kubepods-burstable-podxyz.slice",
        "system.slice",
        "cgroup.procs",
        "init.scope",
        "session-1.scope",
        "pod7712555c/x",
    ],
)
def test_folders_that_are_not_pods_are_not_parsed_as_pods(name: str) -> None:
    assert parse_pod_dir_name(name) is None


@pytest.mark.parametrize(
    "name",
    ["", "burstable", "init.scope", "docker-.scope", "crio-", CID[:63], CID.upper(), "x" * 64],
)
def test_folders_that_are_not_containers_are_not_parsed_as_containers(name: str) -> None:
    assert parse_container_dir_name(name) is None


def test_qos_folder_names_of_both_drivers_name_their_class() -> None:
    assert kube_qos_of_dir("burstable") is KubeQOS.BURSTABLE
    assert kube_qos_of_dir("besteffort") is KubeQOS.BESTEFFORT
    assert kube_qos_of_dir("kubepods-burstable.slice") is KubeQOS.BURSTABLE
    assert kube_qos_of_dir("kubepods-besteffort.slice") is KubeQOS.BESTEFFORT
    assert kube_qos_of_dir(f"pod{UID}") is None


def test_a_malformed_uid_or_container_id_or_runtime_is_refused(layout: CgroupLayout) -> None:
    with pytest.raises(InvalidValueError, match="pod uid"):
        layout.pod_dir(KubeQOS.BURSTABLE, "../etc")
    with pytest.raises(InvalidValueError, match="container id"):
        layout.container_dir("kubepods", "containerd", "a/b")
    with pytest.raises(UnsupportedError, match="pouch"):
        layout.container_dir("kubepods", "pouch", CID)


# Paths -----------------------------------------------------------------------------------------


def test_v1_paths_name_the_controller_and_v2_paths_do_not() -> None:
    v1, v2 = (
        make_layout(CgroupVersion.V1, CgroupDriver.CGROUPFS),
        make_layout(CgroupVersion.V2, CgroupDriver.CGROUPFS),
    )
    assert v1.file("cpuacct", "/kubepods/", "cpuacct.usage") == "/cg/cpuacct/kubepods/cpuacct.usage"
    assert v2.file("cpuacct", "/kubepods/", "cpu.stat") == "/cg/kubepods/cpu.stat"
    assert v1.abs_dir("memory", "") == "/cg/memory"
    assert v2.abs_dir("memory", "") == "/cg"


def test_an_unknown_controller_is_refused(layout: CgroupLayout) -> None:
    with pytest.raises(InvalidValueError, match="cpu,cpuacct"):
        layout.abs_dir("cpu,cpuacct", "kubepods")
    assert "perf_event" in V1_CONTROLLERS


@pytest.mark.parametrize(
    ("kube_path", "driver", "root"),
    [
        ("kubepods/", CgroupDriver.CGROUPFS, "kubepods"),
        ("kubepods/", CgroupDriver.SYSTEMD, "kubepods.slice"),
        ("/kubepods.slice/", CgroupDriver.SYSTEMD, "kubepods.slice"),
        ("kpytest-ab12/kubepods/", CgroupDriver.SYSTEMD, "kpytest-ab12/kubepods.slice"),
        ("kpytest-ab12/kubepods/", CgroupDriver.CGROUPFS, "kpytest-ab12/kubepods"),
    ],
)
def test_the_kube_path_flag_maps_to_the_drivers_kubepods_root(
    kube_path: str, driver: CgroupDriver, root: str
) -> None:
    assert kube_root_for(kube_path, driver) == root
    burstable = make_layout(CgroupVersion.V1, driver, kube_path).pod_dir(KubeQOS.BURSTABLE, UID)
    assert burstable.startswith(root + "/")


@pytest.mark.parametrize("kube_path", ["", "/", "mypods/", "kubepods/../x/kubepods"])
def test_a_kube_path_that_is_not_a_kubepods_folder_is_a_config_error(kube_path: str) -> None:
    with pytest.raises(ConfigError, match="cgroup-kube-path"):
        kube_root_for(kube_path, CgroupDriver.SYSTEMD)


# Detection on fake trees -----------------------------------------------------------------------


def test_the_version_and_driver_of_a_fake_tree_are_detected(fake_host: FakeHost) -> None:
    host = Host.detect(fake_host.paths)
    assert host.layout == fake_host.layout
    assert detect_version(fake_host.paths) is fake_host.version


@pytest.mark.parametrize(("version", "driver"), LAYOUTS)
def test_a_custom_kube_path_prefix_is_detected(
    host_root: Path, version: CgroupVersion, driver: CgroupDriver
) -> None:
    fake = FakeHost(host_root, version, driver, kube_path="kpytest-ab12/kubepods/")
    host = Host.detect(fake.paths, kube_path="kpytest-ab12/kubepods/")
    assert host.layout.driver is driver
    assert host.layout.kube_root.startswith("kpytest-ab12/kubepods")
    pod, _ = fake.add_pod(UID, KubeQOS.BESTEFFORT)
    assert os.path.isdir(host.layout.abs_dir("memory", pod))


def test_without_a_kubepods_folder_the_driver_defaults_to_cgroupfs_and_says_so(
    host_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    fake.remove_cgroup(fake.layout.kube_root)
    with caplog.at_level(logging.INFO, logger="koordlet.system.cgroups"):
        assert detect_driver(fake.paths, CgroupVersion.V2) is CgroupDriver.CGROUPFS
    assert "assuming the kubelet default cgroup driver cgroupfs" in caplog.text


@pytest.mark.parametrize("driver", list(CgroupDriver))
def test_with_both_kubepods_folders_the_one_holding_pods_wins(
    host_root: Path, driver: CgroupDriver, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, driver)
    fake.add_pod(UID, KubeQOS.GUARANTEED)
    other = CgroupDriver.CGROUPFS if driver is CgroupDriver.SYSTEMD else CgroupDriver.SYSTEMD
    os.makedirs(fake.layout.abs_dir("cpu", kube_root_for("kubepods/", other)))
    assert detect_driver(fake.paths, CgroupVersion.V1) is driver
    assert "whose folder holds more pods" in caplog.text


def test_a_root_without_cgroups_is_unsupported_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="neither a cgroup2 mount"):
        detect_version(HostPaths(cgroup_root=str(tmp_path)))
    with pytest.raises(UnsupportedError, match="does not exist"):
        detect_version(HostPaths(cgroup_root=str(tmp_path / "missing")))


def test_the_file_system_magic_of_an_ordinary_folder_is_not_cgroup2(tmp_path: Path) -> None:
    assert fs_magic(str(tmp_path)) not in (None, CGROUP2_SUPER_MAGIC)
    with pytest.raises(FileNotFoundError):
        fs_magic(str(tmp_path / "missing"))


def test_the_kubelet_free_walker_finds_what_the_fake_host_made(fake_host: FakeHost) -> None:
    made = {}
    for i, qos in enumerate(KubeQOS):
        uid = str(uuid.UUID(int=i + 1))
        runtime = RUNTIMES[i]
        pod, containers = fake_host.add_pod(uid, qos, [(runtime, container_id((i, 0)))])
        made[uid] = (qos, pod, containers)
    pods = KubepodsSource(fake_host.host).list_pods()
    found = {
        u: (p.kube_qos, p.cgroup_dir, [c.cgroup_dir for c in p.containers]) for u, p in pods.items()
    }
    assert found == made


# The real hierarchy ----------------------------------------------------------------------------

REAL = HostPaths()
needs_real_v1 = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.isdir(REAL.cgroup("cpu")),
    reason="needs root and this machine's cgroup v1 hierarchy",
)


@pytest.mark.realcgroup
@needs_real_v1
def test_this_machines_hybrid_hierarchy_is_v1() -> None:
    assert detect_version(REAL) is CgroupVersion.V1
    unified = REAL.cgroup("unified")
    if os.path.ismount(unified):
        assert detect_version(HostPaths(cgroup_root=unified)) is CgroupVersion.V2


@pytest.mark.realcgroup
@needs_real_v1
@pytest.mark.parametrize("driver", list(CgroupDriver))
def test_a_kubepods_tree_built_in_the_real_hierarchy_is_found(driver: CgroupDriver) -> None:
    prefix = f"kpytest-{uuid.uuid4().hex[:8]}"
    kube_path = f"{prefix}/kubepods/"
    layout = detect_layout(REAL, version=CgroupVersion.V1, driver=driver, kube_path=kube_path)
    pod = layout.pod_dir(KubeQOS.BURSTABLE, UID)
    parts = pod.split("/")
    made = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    try:
        for rel in made:
            os.mkdir(layout.abs_dir("cpu", rel))
        assert detect_driver(REAL, CgroupVersion.V1, kube_path) is driver
        assert os.path.isfile(layout.file("cpu", pod, "cpu.shares"))  # the kernel made it
    finally:
        for rel in reversed(made):
            if os.path.isdir(layout.abs_dir("cpu", rel)):
                os.rmdir(layout.abs_dir("cpu", rel))


# The fake host's formats -----------------------------------------------------------------------


def test_the_fake_procfs_renders_the_golden_samples_byte_for_byte(host_root: Path) -> None:
    golden_stat = (GOLDEN / "proc/stat").read_text().splitlines()
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.CGROUPFS, ncpus=2)
    per_cpu = [CpuTimes(*map(int, line.split()[1:])) for line in golden_stat[1:3]]
    fake.set_proc_stat(per_cpu=per_cpu)
    lines = Path(fake.paths.proc("stat")).read_text().splitlines()
    assert lines[1:] == golden_stat[1:]
    # The kernel sums before converting to ticks, so its aggregate may exceed the per-CPU sum
    # by rounding; the fake's aggregate is the exact sum, in the same format.
    sums = [sum(col) for col in zip(*per_cpu, strict=True)]
    assert lines[0] == "cpu  " + " ".join(map(str, sums))
    meminfo = (line.split(":") for line in (GOLDEN / "proc/meminfo").read_text().splitlines())
    fake.set_meminfo(**{k: int(v.split()[0]) for k, v in meminfo})
    assert Path(fake.paths.proc("meminfo")).read_text() == (GOLDEN / "proc/meminfo").read_text()
    node = (GOLDEN / "sys/node0_meminfo").read_text()
    fake.set_numa_meminfo(0, **{ln.split()[2][:-1]: int(ln.split()[3]) for ln in node.splitlines()})
    assert Path(fake.paths.sys("devices/system/node/node0/meminfo")).read_text() == node


@pytest.mark.parametrize(
    "sample",
    ["v1/memory.stat", "v1/cpu.stat", "v1/cpuacct.stat", "v2/memory.stat", "v2/cpu.stat"],
)
def test_flat_cgroup_files_render_back_to_their_golden_samples(sample: str) -> None:
    values = parse_flat((GOLDEN / sample).read_text())
    assert render_flat(values, values) == (GOLDEN / sample).read_text()


def test_the_fake_topology_numbers_threads_as_linux_does(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD, 8, 2, threads_per_core=2)
    topo = Path(fake.paths.sys("devices/system/cpu/cpu5/topology"))
    assert (topo / "thread_siblings_list").read_text() == "1,5\n"
    assert (topo / "physical_package_id").read_text() == "0\n"
    assert Path(fake.paths.sys("devices/system/node/node1/cpulist")).read_text() == "2-3,6-7\n"
    cpuinfo = Path(fake.paths.proc("cpuinfo")).read_text()
    assert cpuinfo.count("processor\t:") == 8
    assert "physical id\t: 1" in cpuinfo


def test_a_pod_exists_in_every_v1_controller(host_root: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V1, CgroupDriver.SYSTEMD)
    pod, [container] = fake.add_pod(UID, KubeQOS.BESTEFFORT, [("cri-o", CID)])
    for controller in ("cpu", "cpuacct", "cpuset", "memory", "blkio", "pids"):
        assert os.path.isdir(fake.layout.abs_dir(controller, container))
    assert fake.read("cpu", pod, "cpu.shares") == "2\n"
    assert fake.read("cpuset", container, "cpuset.cpus") == "0-3\n"
    assert os.path.isdir(fake.layout.abs_dir("cpu", f"{pod}/crio-conmon-{CID}.scope"))
    fake.remove_cgroup(pod)
    assert not any(os.path.exists(fake.layout.abs_dir(c, pod)) for c in V1_CONTROLLERS)


def test_cpu_usage_is_written_in_the_units_of_each_version(fake_host: FakeHost) -> None:
    pod, _ = fake_host.add_pod(UID, KubeQOS.GUARANTEED)
    fake_host.set_cpu_usage(pod, 3_000_000_000, system_ns=1_000_000_000)
    fake_host.set_throttle(pod, periods=50, throttled=5, throttled_ns=7_000_000)
    cpu_stat = parse_flat(fake_host.read("cpu", pod, "cpu.stat"))
    assert (cpu_stat["nr_periods"], cpu_stat["nr_throttled"]) == (50, 5)
    if fake_host.version is CgroupVersion.V1:
        assert fake_host.read("cpuacct", pod, "cpuacct.usage") == "3000000000\n"
        assert parse_flat(fake_host.read("cpuacct", pod, "cpuacct.stat")) == {
            "user": 200,
            "system": 100,
        }
        assert cpu_stat["throttled_time"] == 7_000_000
    else:
        assert (cpu_stat["usage_usec"], cpu_stat["system_usec"]) == (3_000_000, 1_000_000)
        assert cpu_stat["throttled_usec"] == 7_000


def test_memory_is_written_consistently_for_each_version(fake_host: FakeHost) -> None:
    pod, _ = fake_host.add_pod(UID, KubeQOS.BURSTABLE)
    mib = 1 << 20
    fake_host.set_memory(pod, anon=100 * mib, file=40 * mib, unevictable=2 * mib)
    stat = parse_flat(fake_host.read("memory", pod, "memory.stat"))
    prefix = "total_" if fake_host.version is CgroupVersion.V1 else ""
    lru = ("inactive_anon", "active_anon", "unevictable")
    assert sum(stat[prefix + k] for k in lru) == 102 * mib  # Koordinator's usage
    assert stat[prefix + "inactive_file"] + stat[prefix + "active_file"] == 40 * mib
    usage_file = "memory.usage_in_bytes" if prefix else "memory.current"
    assert fake_host.read("memory", pod, usage_file) == f"{142 * mib}\n"
    numa = fake_host.read("memory", pod, "memory.numa_stat").splitlines()
    file_line = next(line for line in numa if line.startswith("file"))
    pages = 40 * mib // PAGE
    assert file_line == (f"file={pages} N0={pages}" if prefix else f"file N0={40 * mib}")


def test_setting_an_unknown_key_is_an_error_not_a_silent_new_line(fake_host: FakeHost) -> None:
    with pytest.raises(KeyError, match="MemTotl"):
        fake_host.set_meminfo(MemTotl=1)
    with pytest.raises(KeyError, match="usr"):
        fake_host.advance_proc_stat(usr=1)


def test_node_counters_advance_and_spread_over_the_cpus(fake_host: FakeHost) -> None:
    before = fake_host.proc_stat
    fake_host.advance_proc_stat(user=400, idle=1001)
    assert fake_host.proc_stat.user == before.user + 400
    lines = Path(fake_host.paths.proc("stat")).read_text().splitlines()
    per_cpu = [CpuTimes(*map(int, ln.split()[1:])) for ln in lines[1 : 1 + fake_host.ncpus]]
    assert sum(t.idle for t in per_cpu) == before.idle + 1001
    fake_host.set_meminfo(MemAvailable=1024, Active_file=7)
    assert "Active(file):          7 kB" in Path(fake_host.paths.proc("meminfo")).read_text()


def test_host_app_cgroups_and_pressure_files_are_made(fake_host: FakeHost) -> None:
    rel = fake_host.add_host_app_cgroup("/host-latency-sensitive/nginx/")
    fake_host.set_pressure("cpu", 1200, 300, some_avg10=1.5)
    assert (
        "some avg10=1.50 avg60=0.00 avg300=0.00 total=1200"
        in Path(fake_host.paths.proc("pressure/cpu")).read_text()
    )
    if fake_host.version is CgroupVersion.V2:
        fake_host.set_pressure("memory", 5, rel=rel)
        assert fake_host.read("memory", rel, "memory.pressure").startswith("some avg10=0.00")
    else:
        with pytest.raises(ValueError, match="v1"):
            fake_host.set_pressure("memory", 5, rel=rel)
    assert os.path.isfile(fake_host.layout.file("cpu", rel, "cgroup.procs"))
