"""Capability probing on fake cgroup v1 and v2 trees with the kernel's real file names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from koordlet.daemon.host import CapabilityWatch
from koordlet.system import nativeread
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.knobs import KNOBS
from koordlet.system.paths import HostPaths
from koordlet.system.perf import CYCLES, INSTRUCTIONS, probe_events
from koordlet.system.probe import Capabilities, probe_capabilities

GOLDEN = Path(__file__).parent.parent / "golden"
SOURCES = {
    "block_devices",
    "tc_classifier",
    "netqos_terway",
    "proc_stat",
    "meminfo",
    "numa_meminfo",
    "cpu_topology",
    "psi_node",
    "cpuacct_usage",
    "cpu_stat_usage",
    "memory_stat",
    "inotify_cgroup",
    "native_column_reads",
    "memory_numa_stat",
    "cpu_stat_throttling",
    "idle_page_stats",
    "damon_cold_pages",
    "psi_cgroup",
    "resctrl",
    "perf_event",
    "perf_cpi",
    "psi_trigger",
    "memcg_threshold",
    "vmstat_reclaim",
    "oom_score_adj",
}
V2_THROTTLED_STAT = (GOLDEN / "v2" / "cpu.stat.root").read_text() + (
    "nr_periods 10\nnr_throttled 2\nthrottled_usec 3000\n"
)

V1_FILES: Mapping[str, Mapping[str, str]] = {
    "cpu": {
        "cpu.shares": "1024\n",
        "cpu.cfs_quota_us": "-1\n",
        "cpu.cfs_period_us": "100000\n",
        "cpu.cfs_burst_us": "0\n",
        "cpu.idle": "0\n",
        "cpu.stat": (GOLDEN / "v1" / "cpu.stat").read_text(),
    },
    "cpuacct": {
        "cpuacct.usage": (GOLDEN / "v1" / "cpuacct.usage").read_text(),
        "cpu.pressure": (GOLDEN / "v2" / "cpu.pressure").read_text(),
    },
    "cpuset": {"cpuset.cpus": "0-3\n", "cpuset.mems": "0\n"},
    "memory": {
        "memory.limit_in_bytes": "9223372036854771712\n",
        "memory.stat": (GOLDEN / "v1" / "memory.stat").read_text(),
        "memory.numa_stat": (GOLDEN / "v1" / "memory.numa_stat").read_text(),
    },
}
V2_ROOT_FILES: Mapping[str, str] = {
    "cgroup.controllers": "cpuset cpu io memory pids\n",
    "cgroup.subtree_control": "cpuset cpu io memory pids\n",
    "cpu.stat": (GOLDEN / "v2" / "cpu.stat.root").read_text(),
    "cpu.pressure": (GOLDEN / "v2" / "cpu.pressure").read_text(),
    "memory.stat": (GOLDEN / "v1" / "memory.stat").read_text(),
}
V2_CHILD_FILES: Mapping[str, str] = {
    "cgroup.controllers": "cpuset cpu io memory pids\n",
    "cpu.max": "max 100000\n",
    "cpu.max.burst": "0\n",
    "cpu.weight": "100\n",
    "cpu.idle": "0\n",
    "cpu.stat": V2_THROTTLED_STAT,
    "cpu.pressure": (GOLDEN / "v2" / "cpu.pressure").read_text(),
    "cpuset.cpus": "\n",
    "cpuset.mems": "\n",
    "memory.max": "max\n",
    "memory.min": "0\n",
    "memory.low": "0\n",
    "memory.high": "max\n",
    "memory.oom.group": "0\n",
    "memory.stat": (GOLDEN / "v1" / "memory.stat").read_text(),
    "memory.numa_stat": (GOLDEN / "v1" / "memory.numa_stat").read_text(),
}


def put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def host_tree(tmp_path: Path) -> HostPaths:
    """procfs and sysfs with the golden files of a real (non-Anolis, no RDT) machine."""
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    for name in ("stat", "meminfo", "cpuinfo"):
        put(proc / name, (GOLDEN / "proc" / name).read_text())
    for res in ("cpu", "memory", "io"):
        put(proc / "pressure" / res, (GOLDEN / "proc" / f"pressure_{res}").read_text())
    put(proc / "sys" / "kernel" / "perf_event_paranoid", "2\n")
    put(sys / "devices/system/node/node0/meminfo", (GOLDEN / "sys" / "node0_meminfo").read_text())
    put(sys / "devices/system/cpu/cpu0/topology/core_id", "0\n")
    return HostPaths(cgroup_root=str(tmp_path / "cgroup"), proc_root=str(proc), sys_root=str(sys))


def v1_host(tmp_path: Path, *, extra: Mapping[str, Mapping[str, str]] | None = None) -> Host:
    paths = host_tree(tmp_path)
    for ctrl, files in V1_FILES.items():
        for name, text in {**files, **(extra or {}).get(ctrl, {})}.items():
            for rel in ("", "kubepods"):
                put(Path(paths.cgroup_root) / ctrl / rel / name, text)
    layout = detect_layout(paths, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS)
    return Host(paths, layout)


def v2_host(tmp_path: Path, *, child: str | None = "kubepods") -> Host:
    paths = host_tree(tmp_path)
    root = Path(paths.cgroup_root)
    for name, text in V2_ROOT_FILES.items():
        put(root / name, text)
    if child is not None:
        for name, text in V2_CHILD_FILES.items():
            put(root / child / name, text)
    layout = detect_layout(paths, version=CgroupVersion.V2, driver=CgroupDriver.CGROUPFS)
    return Host(paths, layout)


def assert_honest(caps: Capabilities) -> None:
    """Every supported capability names a path that exists (but the one a syscall probes)."""
    for cap in caps.values():
        if cap.supported and cap.name != "tc_classifier":
            assert os.path.exists(cap.path), cap
        else:
            assert cap.reason, cap


# cgroup v1 -------------------------------------------------------------------------------------


def test_every_knob_and_source_is_probed_and_reported(tmp_path: Path) -> None:
    caps = probe_capabilities(v1_host(tmp_path))
    assert set(caps) == set(KNOBS) | SOURCES
    assert set(caps.as_dict()) == set(caps)
    assert caps.as_dict()["cpu_shares"]["supported"] is True
    assert_honest(caps)


def test_mainline_v1_knobs_are_supported_at_their_files(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    caps = probe_capabilities(host)
    for name in ("cpu_shares", "cpu_cfs_quota", "cpu_burst", "cpu_idle", "memory_limit"):
        assert caps.supported(name), caps[name]
    assert caps["cpuset_cpus"].path.startswith(os.path.join(host.paths.cgroup_root, "cpuset"))
    assert caps["cpu_cfs_quota"].path.endswith("cpu.cfs_quota_us")


def test_anolis_only_knobs_are_unsupported_on_a_mainline_kernel(tmp_path: Path) -> None:
    caps = probe_capabilities(v1_host(tmp_path))
    assert not caps.supported("cpu_bvt_warp_ns")
    assert "cpu.bvt_warp_ns absent (Anolis kernels only" in caps["cpu_bvt_warp_ns"].reason
    assert not caps.supported("memory_wmark_ratio")
    assert caps["memory_wmark_ratio"].path.endswith("memory.wmark_ratio")


def test_v1_memory_protection_is_unsupported_without_anolis(tmp_path: Path) -> None:
    caps = probe_capabilities(v1_host(tmp_path))
    assert "cgroup v1 has no memory.min on this kernel" in caps["memory_min"].reason
    assert not caps.supported("memory_oom_group")


def test_anolis_files_make_their_knobs_supported(tmp_path: Path) -> None:
    extra = {
        "cpu": {"cpu.bvt_warp_ns": "0\n"},
        "memory": {"memory.min": "0\n", "memory.wmark_ratio": "0\n", "memory.idle_page_stats": ""},
    }
    caps = probe_capabilities(v1_host(tmp_path, extra=extra))
    for name in ("cpu_bvt_warp_ns", "memory_min", "memory_wmark_ratio", "idle_page_stats"):
        assert caps.supported(name), caps[name]
    assert caps.supported("memory_idle_page_stats")


def test_v1_knobs_are_found_in_the_kubepods_cgroup_first(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    caps = probe_capabilities(host)
    assert caps["cpu_shares"].path == host.layout.file("cpu", host.layout.kube_root, "cpu.shares")


def test_a_missing_v1_controller_is_reported_as_not_mounted(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    shutil.rmtree(Path(host.paths.cgroup_root) / "cpuset")
    caps = probe_capabilities(host)
    assert not caps.supported("cpuset_cpus")
    assert "controller cpuset not mounted" in caps["cpuset_cpus"].reason


def test_v1_reads_cpu_usage_from_cpuacct_not_cpu_stat(tmp_path: Path) -> None:
    caps = probe_capabilities(v1_host(tmp_path))
    assert caps.supported("cpuacct_usage")
    assert not caps.supported("cpu_stat_usage")
    assert caps.supported("cpu_stat_throttling")


def test_native_column_reads_are_reported_as_the_loader_finds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, why = nativeread.load()
    v1 = probe_capabilities(v1_host(tmp_path / "v1"))["native_column_reads"]
    assert (v1.supported, v1.reason) == (reader is not None, why)
    assert v1.path == (reader.path if reader is not None else "")
    v2 = probe_capabilities(v2_host(tmp_path / "v2"))["native_column_reads"]
    assert not v2.supported
    assert v2.reason == (
        "cgroup v2: the library reads the v1 layouts; columns are read in Python"
        if reader is not None
        else why
    )
    monkeypatch.setenv(nativeread.ENV, "off")
    off = probe_capabilities(v1_host(tmp_path / "off"))["native_column_reads"]
    assert (off.supported, off.reason) == (False, f"off: {nativeread.ENV}=off")


def test_host_sources_of_a_machine_without_rdt_or_perf_cgroup(tmp_path: Path) -> None:
    caps = probe_capabilities(v1_host(tmp_path))
    for name in ("proc_stat", "meminfo", "numa_meminfo", "cpu_topology", "psi_node"):
        assert caps.supported(name), caps[name]
    assert "no RDT" in caps["resctrl"].reason
    assert "perf_event not mounted" in caps["perf_event"].reason
    assert [c.name for c in caps.unsupported()] == sorted(c.name for c in caps.unsupported())


def test_a_cpu_with_rdt_but_no_resctrl_mount_is_told_to_mount_it(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    put(Path(host.paths.proc("cpuinfo")), "processor\t: 0\nflags\t\t: fpu cat_l3 rdt_a\n")
    caps = probe_capabilities(host)
    assert "resctrl not mounted at" in caps["resctrl"].reason
    put(Path(host.paths.sys("fs", "resctrl", "schemata")), "L3:0=fff\n")
    assert probe_capabilities(host).supported("resctrl")


def test_terway_qos_is_seen_by_the_bpf_maps_it_pins(tmp_path: Path) -> None:
    """netQOSPolicy terway-qos: the files are the TerwayQoS hook's, the enforcement Terway's
    terway-qos daemon's, which pins its maps in /sys/fs/bpf/terway (its pkg/bpf/manager.go)."""
    host = v1_host(tmp_path)
    caps = probe_capabilities(host)
    assert not caps.supported("netqos_terway")
    assert "nothing does" in caps["netqos_terway"].reason
    put(Path(host.paths.sys("fs", "bpf", "terway", "qos_global")), "")
    caps = probe_capabilities(host)
    assert caps.supported("netqos_terway")
    assert caps["netqos_terway"].path == host.paths.sys("fs", "bpf", "terway")


def test_missing_psi_files_make_node_psi_unsupported(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    os.unlink(host.paths.proc("pressure", "io"))
    caps = probe_capabilities(host)
    assert not caps.supported("psi_node")
    assert caps["psi_node"].path.endswith("io")


def test_a_file_that_cannot_be_read_is_not_supported(tmp_path: Path) -> None:
    host = v1_host(tmp_path)
    for rel in ("", "kubepods"):
        path = Path(host.layout.file("cpu", rel, "cpu.idle"))
        path.unlink()
        path.mkdir()  # an entry that exists but cannot be read as a file
    caps = probe_capabilities(host)
    assert not caps.supported("cpu_idle")
    assert "cannot read" in caps["cpu_idle"].reason


def test_an_unknown_name_is_a_key_error_not_a_false_claim(tmp_path: Path) -> None:
    caps = probe_capabilities(v1_host(tmp_path))
    with pytest.raises(KeyError):
        caps.supported("cpu_turbo")


# cgroup v2 -------------------------------------------------------------------------------------


def test_v2_cpu_knobs_are_probed_in_kubepods_because_the_root_lacks_them(tmp_path: Path) -> None:
    host = v2_host(tmp_path)
    caps = probe_capabilities(host)
    for name in ("cpu_shares", "cpu_cfs_quota", "cpu_cfs_period", "memory_limit", "memory_min"):
        assert caps.supported(name), caps[name]
    assert caps["cpu_cfs_quota"].path == os.path.join(host.paths.cgroup_root, "kubepods", "cpu.max")
    assert caps.supported("memory_oom_group")
    assert_honest(caps)


def test_v2_probes_any_child_with_the_controller_when_kubepods_is_missing(tmp_path: Path) -> None:
    host = v2_host(tmp_path, child="system.slice")
    caps = probe_capabilities(host)
    assert caps.supported("cpu_cfs_quota")
    assert "system.slice" in caps["cpu_cfs_quota"].path


def test_v2_with_only_the_root_reports_the_missing_files(tmp_path: Path) -> None:
    host = v2_host(tmp_path, child=None)
    caps = probe_capabilities(host)
    assert not caps.supported("cpu_cfs_quota")
    assert caps["cpu_cfs_quota"].path == os.path.join(host.paths.cgroup_root, "cpu.max")
    assert "file cpu.max absent" in caps["cpu_cfs_quota"].reason
    assert not caps.supported("cpu_stat_throttling")  # root cpu.stat has no nr_throttled
    assert caps.supported("cpu_stat_usage")


def test_v2_has_no_cpuacct_and_implicit_perf_event(tmp_path: Path) -> None:
    caps = probe_capabilities(v2_host(tmp_path))
    assert not caps.supported("cpuacct_usage")
    assert "no cpuacct" in caps["cpuacct_usage"].reason
    assert caps.supported("perf_event")
    assert caps.supported("psi_cgroup")


def test_a_controller_not_enabled_on_v2_is_reported(tmp_path: Path) -> None:
    host = v2_host(tmp_path)
    put(Path(host.paths.cgroup_root) / "cgroup.controllers", "cpu io pids\n")
    caps = probe_capabilities(host)
    assert not caps.supported("memory_limit")
    assert "controller memory not enabled" in caps["memory_limit"].reason
    assert caps.supported("cpu_shares")


def test_a_sample_cgroup_is_probed_before_the_kubepods_root(tmp_path: Path) -> None:
    host = v2_host(tmp_path)
    pod = Path(host.paths.cgroup_root) / "kubepods" / "besteffort"
    put(pod / "cpu.max", "max 100000\n")
    caps = probe_capabilities(host, sample_rel="kubepods/besteffort")
    assert caps["cpu_cfs_quota"].path == str(pod / "cpu.max")


def test_cpi_without_the_perf_event_controller_names_both_the_mount_and_the_pmus_answer(
    tmp_path: Path,
) -> None:
    caps = probe_capabilities(v1_host(tmp_path))

    cpi = caps["perf_cpi"]
    assert not cpi.supported
    assert "perf_event not mounted" in cpi.reason
    assert cpi.reason.endswith(f"; hardware events: {probe_events((CYCLES, INSTRUCTIONS)).reason}")


def test_the_daemon_and_its_probe_load_pyroute2_only_when_network_qos_opens_a_socket() -> None:
    """pyroute2 holds about 11 MiB resident (docs/benchmarks.md, resident memory): a daemon on a
    node without network QoS never imports it, though its probe checks the tc classifier."""
    code = (
        "import sys, koordlet.daemon, koordlet.system.tc as tc\n"
        "tc.probe_classifier()\n"
        "assert 'pyroute2' not in sys.modules, 'pyroute2 imported at start'\n"
        "with tc.rtnl() as ipr: tc.link_name(ipr, 1)\n"
        "assert 'pyroute2' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_damon_cold_pages_names_the_missing_damon_sysfs_on_a_host_without_it(
    tmp_path: Path,
) -> None:
    cap = probe_capabilities(v1_host(tmp_path))["damon_cold_pages"]

    assert not cap.supported
    assert "CONFIG_DAMON_SYSFS" in cap.reason
    assert cap.path.endswith("kernel/mm/damon/admin")


def test_a_capability_lost_while_running_is_named_and_exported_until_it_returns(
    tmp_path: Path,
) -> None:
    host = v1_host(tmp_path)
    at_start = probe_capabilities(host)
    published: list[Mapping[str, bool]] = []
    watch = CapabilityWatch(
        lambda: host,
        at_start,
        watches_lost=lambda: {"memoryevict/node": "/proc/pressure/memory cannot be watched"},
        publish=published.append,
    )
    files = [Path(host.layout.file("cpu", rel, "cpu.shares")) for rel in ("", "kubepods")]
    assert at_start.supported("cpu_shares")
    saved = files[0].read_text()
    for f in files:  # the knob's files gone from under the koordlet
        f.unlink()

    lost = watch.recheck()

    assert lost["cpu_shares"]
    assert lost["events/memoryevict/node"] == "/proc/pressure/memory cannot be watched"
    assert published[-1]["cpu_shares"] is False
    (family,) = watch.collect()
    assert family.name == "koordlet_capability_lost"
    samples = {s.labels["name"]: s.value for s in family.samples}
    assert set(samples) == set(lost)  # cpu_weight too: on v1 it is written as cpu.shares
    assert {"cpu_shares", "events/memoryevict/node"} <= set(samples)
    assert set(samples.values()) == {1.0}
    for f in files:
        f.write_text(saved)
    assert "cpu_shares" not in watch.recheck()
