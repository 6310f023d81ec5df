"""resctrl: CPU flags, the mount and ``info/L3_MON``, L3 domains and monitoring values, on the
golden resctrl tree of a two-socket Xeon copied into a fake host."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from koordlet.errors import CgroupGoneError, ParseError, UnsupportedError
from koordlet.system.cgroupstats import read_file_bytes
from koordlet.system.paths import HostPaths
from koordlet.system.resctrl import (
    LLC_OCCUPANCY,
    MBM_LOCAL,
    MBM_TOTAL,
    MON_EVENTS,
    RESCTRL_GROUPS,
    mon_domains,
    monitoring_support,
    parse_cpu_flags,
    parse_mon_value,
    probe_resctrl,
    read_cpu_flags,
    resctrl_root,
)

GOLDEN = Path(__file__).parent.parent / "golden"
XEON = GOLDEN / "resctrl" / "cpuinfo.xeon-6148"
TREE = GOLDEN / "resctrl" / "fs"


def make_host(tmp_path: Path, *, cpuinfo: Path = XEON, mounted: bool = True) -> HostPaths:
    """A host with ``cpuinfo`` and, when ``mounted``, the golden resctrl mount."""
    paths = HostPaths(str(tmp_path / "cg"), str(tmp_path / "proc"), str(tmp_path / "sys"))
    Path(paths.proc_root).mkdir(parents=True)
    shutil.copy(cpuinfo, paths.proc("cpuinfo"))
    root = Path(resctrl_root(paths))
    if mounted:
        shutil.copytree(TREE, root)
    else:
        root.mkdir(parents=True)  # the bare mount point of an unmounted kernel
    return paths


def set_flags(paths: HostPaths, drop: set[str]) -> frozenset[str]:
    """Rewrite the host's flags line without ``drop``; returns the new flags."""
    text = Path(paths.proc("cpuinfo")).read_text()
    lines = []
    for line in text.splitlines():
        if line.startswith("flags"):
            key, _, flags = line.partition(":")
            line = key + ": " + " ".join(f for f in flags.split() if f not in drop)
        lines.append(line)
    Path(paths.proc("cpuinfo")).write_text("\n".join(lines) + "\n")
    return read_cpu_flags(paths)


def test_the_xeon_flags_carry_allocation_and_all_three_monitoring_events() -> None:
    flags = parse_cpu_flags(XEON.read_bytes(), str(XEON))

    assert {"rdt_a", "cat_l3", "mba", "cqm_llc", "cqm_occup_llc"} <= flags
    assert {"cqm_mbm_total", "cqm_mbm_local"} <= flags


def test_this_hosts_cpu_has_no_rdt_and_a_flagless_cpuinfo_has_no_flags() -> None:
    mainline = GOLDEN / "proc" / "cpuinfo"

    assert "cqm_llc" not in parse_cpu_flags(mainline.read_bytes(), str(mainline))
    assert parse_cpu_flags(b"processor\t: 0\nFeatures\t: fp asimd\n", "arm") == frozenset()
    with pytest.raises(ParseError, match="bad flags line"):
        parse_cpu_flags(b"flags fpu vme\n", "cpuinfo")


def test_a_mounted_rdt_host_can_read_every_event(tmp_path: Path) -> None:
    paths = make_host(tmp_path)

    support = monitoring_support(paths, read_cpu_flags(paths), read_file_bytes)

    assert support.events == MON_EVENTS
    assert support.missing == {}
    assert support.root == resctrl_root(paths)


def test_a_cpu_without_cmt_is_unsupported_naming_the_flag(tmp_path: Path) -> None:
    paths = make_host(tmp_path, cpuinfo=GOLDEN / "proc" / "cpuinfo")

    with pytest.raises(UnsupportedError, match="cpuinfo flags lack cqm_llc") as info:
        monitoring_support(paths, read_cpu_flags(paths), read_file_bytes)
    assert paths.proc("cpuinfo") in info.value.reason


def test_an_unmounted_resctrl_is_unsupported_with_the_mount_command(tmp_path: Path) -> None:
    paths = make_host(tmp_path, mounted=False)

    with pytest.raises(UnsupportedError, match=r"resctrl not mounted at .*mount -t resctrl"):
        monitoring_support(paths, read_cpu_flags(paths), read_file_bytes)


def test_a_mount_without_l3_monitoring_names_the_missing_file(tmp_path: Path) -> None:
    paths = make_host(tmp_path)
    shutil.rmtree(Path(resctrl_root(paths)) / "info" / "L3_MON")

    with pytest.raises(UnsupportedError, match="info/L3_MON/mon_features absent"):
        monitoring_support(paths, read_cpu_flags(paths), read_file_bytes)


def test_an_event_lacking_its_flag_or_its_mon_feature_is_missing_with_the_reason(
    tmp_path: Path,
) -> None:
    paths = make_host(tmp_path)
    flags = set_flags(paths, {"cqm_mbm_local"})
    features = Path(resctrl_root(paths)) / "info" / "L3_MON" / "mon_features"
    features.write_text("llc_occupancy\nmbm_local_bytes\n")

    support = monitoring_support(paths, flags, read_file_bytes)

    assert support.events == (LLC_OCCUPANCY,)
    assert support.missing[MBM_LOCAL].endswith("flags lack cqm_mbm_local")
    assert support.missing[MBM_TOTAL] == f"mbm_total_bytes not listed in {features}"


def test_no_readable_event_at_all_is_unsupported(tmp_path: Path) -> None:
    paths = make_host(tmp_path)
    flags = set_flags(paths, {"cqm_occup_llc", "cqm_mbm_total", "cqm_mbm_local"})

    with pytest.raises(UnsupportedError, match="no L3 monitoring event readable"):
        monitoring_support(paths, flags, read_file_bytes)


def test_each_qos_group_has_its_domains_by_cache_id(tmp_path: Path) -> None:
    paths = make_host(tmp_path)
    root = resctrl_root(paths)
    (Path(root) / "LS" / "mon_data" / "mon_MB_00").mkdir()  # another resource's domains

    for group in (*RESCTRL_GROUPS, ""):
        domains = mon_domains(root, group)
        assert [cache_id for cache_id, _ in domains] == [0, 1]
        assert domains[1][1] == str(Path(root, group, "mon_data", "mon_L3_01"))


def test_a_missing_group_is_gone_and_a_bad_domain_name_a_parse_error(tmp_path: Path) -> None:
    paths = make_host(tmp_path)
    root = resctrl_root(paths)
    with pytest.raises(CgroupGoneError):
        mon_domains(root, "NOPE")

    (Path(root) / "BE" / "mon_data" / "mon_L3_x1").mkdir()
    with pytest.raises(ParseError, match="mon_L3_x1"):
        mon_domains(root, "BE")


def test_monitoring_values_are_bytes_or_the_kernels_reason() -> None:
    assert parse_mon_value(b"3604480\n", "llc") == (3604480, "")
    value, why = parse_mon_value(b"Unavailable\n", "/r/LS/mon_data/mon_L3_00/llc_occupancy")
    assert value is None
    assert why.startswith("/r/LS/mon_data/mon_L3_00/llc_occupancy: Unavailable")
    assert (
        parse_mon_value(b"Error\n", "mbm")[1]
        == "mbm: Error (the kernel failed to read the counter)"
    )
    with pytest.raises(ParseError, match="mbm: not a number"):
        parse_mon_value(b"12 kB\n", "mbm")


def test_probing_names_the_mount_flags_and_monitoring_events(tmp_path: Path) -> None:
    mounted = make_host(tmp_path / "a")
    supported, reason, path = probe_resctrl(mounted)
    assert supported
    assert reason == (
        f"mounted at {resctrl_root(mounted)}; monitoring llc_occupancy, mbm_total_bytes, "
        "mbm_local_bytes"
    )
    assert path.endswith("fs/resctrl/schemata")

    unmounted = make_host(tmp_path / "b", mounted=False)
    supported, reason, _ = probe_resctrl(unmounted)
    assert not supported
    assert reason.startswith(f"resctrl not mounted at {resctrl_root(unmounted)}")
    assert "has rdt_a, cat_l3, mba, cqm_llc" in reason

    no_rdt = make_host(tmp_path / "c", cpuinfo=GOLDEN / "proc" / "cpuinfo", mounted=False)
    supported, reason, _ = probe_resctrl(no_rdt)
    assert not supported
    assert "lists no RDT" in reason


def test_a_mount_on_a_cpu_without_monitoring_is_supported_for_allocation_only(
    tmp_path: Path,
) -> None:
    paths = make_host(tmp_path)
    set_flags(paths, {"cqm_llc"})

    supported, reason, _ = probe_resctrl(paths)

    assert supported
    assert reason.endswith(
        "no monitoring: " + f"{paths.proc('cpuinfo')} flags lack cqm_llc (CPU without RDT/PQoS)"
    )
