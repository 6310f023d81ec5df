"""Our kdamond on a fake DAMON sysfs interface (``tests/fakedamon.py``: the real layout, file
formats and the kernel's answers): claiming an empty array, busy when any kdamond is someone
else's, unsupported kernels, stop, and the clean-up of what a killed koordlet left."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from koordlet.errors import UnsupportedError
from koordlet.system.damon import (
    DamonAttrs,
    DamonBusyError,
    Kdamond,
    Region,
    admin_dir,
    clean_stale_kdamond,
    probe_damon,
    read_claim,
    read_settings,
    settings_of,
    system_ram_ranges,
    write_claim,
)
from tests.fakedamon import GOLDEN, FakeDamon

BOOT_ID = "6f1e4c1a-0000-4000-8000-000000000001"
RAM_END = 1 << 30
IOMEM = (
    "00000000-00000fff : Reserved\n"
    "00001000-0009fbff : System RAM\n"
    "000a0000-000fffff : Reserved\n"
    f"00100000-{RAM_END - 1:08x} : System RAM\n"
    "  01000000-01ffffff : Kernel code\n"
)
ATTRS = DamonAttrs(sample_us=10_000, aggr_us=100_000, apply_us=100_000, cold_age_s=2.0)
DEAD_PID = 2**22 + 17  # above the default pid_max: no such process


def write_proc(proc: Path, *, iomem: str = IOMEM) -> None:
    (proc / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text(BOOT_ID + "\n")
    (proc / "iomem").write_text(iomem)


def fake_process(proc: Path, pid: int, start: int) -> None:
    """``/proc/<pid>/stat`` of a live process whose start time is ``start`` ticks."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S", *(["0"] * 18), str(start), "0"]
    (proc / str(pid) / "stat").write_text(f"{pid} (koordlet) {' '.join(fields)}\n")


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    write_proc(root)
    return root


@pytest.fixture
def damon(tmp_path: Path) -> FakeDamon:
    return FakeDamon(str(tmp_path / "sys" / "kernel" / "mm" / "damon" / "admin"))


def kdamond(damon: FakeDamon, proc: Path, tmp_path: Path) -> Kdamond:
    claim = str(tmp_path / "state" / "damon" / "kdamond.json")
    return Kdamond(damon, claim, str(proc), ATTRS, sleep=lambda s: None)


def test_start_on_an_empty_array_runs_one_paddr_stat_scheme_over_system_ram(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    k = kdamond(damon, proc, tmp_path)
    k.start()

    assert k.running
    assert damon.read("kdamonds/0/state") == "on\n"
    assert k.pid == int(damon.read("kdamonds/0/pid"))
    ranges = [(0x1000, 0x9F000), (0x100000, RAM_END)]
    assert ranges[0][1] - ranges[0][0] < (1 << 20)  # too small: left out
    settings = read_settings(damon, 0)
    assert settings == settings_of(ATTRS, [ranges[1]])
    assert settings is not None
    assert settings["age_min"] == 20
    scheme = "kdamonds/0/contexts/0/schemes/0/access_pattern"
    assert damon.read(f"{scheme}/nr_accesses/max") == "0\n"
    claim = read_claim(k.claim_path)
    assert claim is not None
    assert (claim.boot_id, claim.index, claim.kdamond_pid) == (BOOT_ID, 0, k.pid)
    assert claim.owner_pid == os.getpid()


def test_the_fake_lays_a_kdamond_out_as_the_real_kernel_does(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    kdamond(damon, proc, tmp_path).start()
    golden = {
        line
        for line in (GOLDEN / "tree-6.18.txt").read_text().splitlines()
        if line
        and not line.startswith("#")
        and "/ops_filters/" not in line.replace("ops_filters/nr_filters", "")
    }
    ours = {
        rel
        for rel in damon.snapshot()
        if "/tried_regions/" not in rel.replace("tried_regions/total_bytes", "")
    }
    assert ours == golden


def test_a_running_kdamond_of_someone_else_makes_us_busy_and_stays_untouched(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    damon.add_foreign(running=True)
    before = damon.snapshot()
    k = kdamond(damon, proc, tmp_path)

    with pytest.raises(DamonBusyError, match=r"busy: kdamond 0 on: not ours"):
        k.start()

    assert damon.writes == []
    assert damon.snapshot() == before
    assert not os.path.exists(k.claim_path)


def test_a_stopped_kdamond_of_someone_else_is_not_wiped_either(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    damon.add_foreign(running=False)
    before = damon.snapshot()

    with pytest.raises(DamonBusyError, match=r"kdamond 0 off"):
        kdamond(damon, proc, tmp_path).start()

    assert damon.writes == []
    assert damon.snapshot() == before


def test_stop_turns_ours_off_empties_the_array_and_removes_the_claim(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    k = kdamond(damon, proc, tmp_path)
    k.start()
    k.stop()
    k.stop()  # idempotent

    assert damon.read("kdamonds/nr_kdamonds") == "0\n"
    assert damon.listdir("kdamonds") == ["nr_kdamonds"]
    assert not os.path.exists(k.claim_path)
    assert not k.running


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"avail": ("vaddr", "fvaddr")}, "no paddr operations"),
        ({"tried_regions": False}, "tried_regions (needs Linux 6.2+)"),
    ],
)
def test_a_kernel_without_what_we_need_is_unsupported_and_left_clean(
    tmp_path: Path, proc: Path, options: dict[str, object], reason: str
) -> None:
    damon = FakeDamon(str(tmp_path / "admin"), **options)  # type: ignore[arg-type]
    k = kdamond(damon, proc, tmp_path)

    with pytest.raises(UnsupportedError, match=re.escape(reason)):
        k.start()

    assert damon.read("kdamonds/nr_kdamonds") == "0\n"
    assert not os.path.exists(k.claim_path)


def test_a_kernel_before_apply_intervals_applies_at_every_aggregation(
    tmp_path: Path, proc: Path
) -> None:
    damon = FakeDamon(str(tmp_path / "admin"), apply_interval=False)
    k = kdamond(damon, proc, tmp_path)
    k.start()

    assert k.running
    assert not damon.exists("kdamonds/0/contexts/0/schemes/0/apply_interval_us")


def test_cold_regions_are_those_with_no_access_for_the_cold_age(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    k = kdamond(damon, proc, tmp_path)
    k.start()
    damon.regions = [
        Region(0x100000, 0x2100000, 0, 25),  # cold: idle for 25 aggregations
        Region(0x2100000, 0x2200000, 3, 40),  # accessed
        Region(0x2200000, 0x4200000, 0, 19),  # idle, not yet for the cold age (20)
        Region(0x4200000, 0x8200000, 0, 20),  # cold
    ]

    got = k.cold_regions()

    assert [(r.start, r.end) for r in got] == [(0x100000, 0x2100000), (0x4200000, 0x8200000)]
    assert damon.writes[-1] == ("kdamonds/0/state", "update_schemes_tried_regions")


def test_a_kdamond_someone_stopped_under_us_is_reported_and_not_restarted_blindly(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    k = kdamond(damon, proc, tmp_path)
    k.start()
    damon.stop_all()

    with pytest.raises(Exception, match="stopped"):
        k.cold_regions()
    assert not k.running


# Clean-up after a killed koordlet ---------------------------------------------------------------


def killed(k: Kdamond) -> None:
    """What SIGKILL leaves: the kdamond runs on, the claim names a dead koordlet."""
    claim = read_claim(k.claim_path)
    assert claim is not None
    write_claim(k.claim_path, dataclasses.replace(claim, owner_pid=DEAD_PID))


def test_the_next_start_removes_the_kdamond_a_killed_koordlet_left_and_runs_its_own(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    old = kdamond(damon, proc, tmp_path)
    old.start()
    killed(old)

    new = kdamond(damon, proc, tmp_path)
    new.start()

    released = damon.writes.index(("kdamonds/0/state", "off"))
    assert damon.writes[released + 1] == ("kdamonds/nr_kdamonds", "0")
    assert new.running
    assert new.pid != old.pid
    claim = read_claim(new.claim_path)
    assert claim is not None
    assert claim.kdamond_pid == new.pid


def test_clean_up_at_start_removes_a_left_kdamond_even_with_the_gate_off(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    old = kdamond(damon, proc, tmp_path)
    old.start()
    killed(old)

    assert kdamond(damon, proc, tmp_path).clean_stale()

    assert damon.read("kdamonds/nr_kdamonds") == "0\n"
    assert not os.path.exists(old.claim_path)


def test_a_start_cut_short_after_claiming_leaves_a_folder_that_is_still_cleaned(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    old = kdamond(damon, proc, tmp_path)
    old.start()
    killed(old)
    damon.stop_all()
    damon.write("kdamonds/nr_kdamonds", "1")  # as if killed right after claiming

    assert kdamond(damon, proc, tmp_path).clean_stale()
    assert damon.read("kdamonds/nr_kdamonds") == "0\n"


def test_a_left_claim_whose_folder_someone_else_took_over_is_dropped_not_acted_on(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    old = kdamond(damon, proc, tmp_path)
    old.start()
    killed(old)
    damon.stop_all()
    damon.add_foreign(running=True)  # the array rebuilt and run by another tool
    before = damon.snapshot()

    with pytest.raises(DamonBusyError):
        kdamond(damon, proc, tmp_path).start()

    assert damon.snapshot() == before
    assert damon.writes == []
    assert not os.path.exists(old.claim_path)


def test_a_stopped_folder_with_other_settings_is_not_ours_any_more(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    old = kdamond(damon, proc, tmp_path)
    old.start()
    killed(old)
    damon.stop_all()
    damon.write("kdamonds/0/contexts/0/monitoring_attrs/intervals/sample_us", "777")
    damon.writes.clear()

    assert not kdamond(damon, proc, tmp_path).clean_stale()
    assert damon.writes == []
    assert damon.read("kdamonds/nr_kdamonds") == "1\n"


def test_the_kdamond_of_a_live_koordlet_is_busy_not_stale(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    old = kdamond(damon, proc, tmp_path)
    old.start()
    claim = read_claim(old.claim_path)
    assert claim is not None
    write_claim(old.claim_path, dataclasses.replace(claim, owner_pid=4321, owner_start=99))
    fake_process(proc, 4321, 99)
    damon.writes.clear()

    with pytest.raises(DamonBusyError, match="koordlet pid 4321, running"):
        kdamond(damon, proc, tmp_path).start()
    assert damon.writes == []


def test_a_claim_from_another_boot_is_dropped_without_touching_damon(
    damon: FakeDamon, proc: Path, tmp_path: Path
) -> None:
    old = kdamond(damon, proc, tmp_path)
    old.start()
    killed(old)
    (proc / "sys" / "kernel" / "random" / "boot_id").write_text("another-boot\n")
    damon.writes.clear()

    assert not kdamond(damon, proc, tmp_path).clean_stale()
    assert damon.writes == []
    assert not os.path.exists(old.claim_path)


def test_a_malformed_claim_file_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "kdamond.json"
    path.write_text("{not json")

    assert read_claim(str(path)) is None
    assert not path.exists()


def test_without_a_claim_file_start_up_clean_up_reads_nothing(tmp_path: Path) -> None:
    # No DAMON folder at all under this sysfs root: reading it would fail.
    assert not clean_stale_kdamond(str(tmp_path / "sys"), str(tmp_path), str(tmp_path / "st"))


# Host facts ---------------------------------------------------------------------------------------


def test_system_ram_ranges_come_from_the_top_level_of_a_real_iomem(tmp_path: Path) -> None:
    text = (GOLDEN / "iomem-6.18").read_text()
    ranges = []
    for line in text.splitlines():
        if not line.startswith(" ") and line.endswith(": System RAM"):
            lo, hi = line.split(" : ")[0].split("-")
            if int(hi, 16) + 1 - int(lo, 16) >= 1 << 20:
                ranges.append((int(lo, 16), int(hi, 16) + 1))

    (tmp_path / "iomem").write_text(text)

    assert ranges  # the golden has System RAM above 1 MiB
    assert system_ram_ranges(str(tmp_path)) == ranges


def test_an_iomem_of_zeros_is_unsupported_not_an_empty_machine(tmp_path: Path) -> None:
    (tmp_path / "iomem").write_text("00000000-00000000 : System RAM\n")

    with pytest.raises(UnsupportedError, match="no System RAM"):
        system_ram_ranges(str(tmp_path))


def test_probing_names_what_is_missing(tmp_path: Path, proc: Path) -> None:
    sys_root = tmp_path / "sys"
    ok, reason, _ = probe_damon(str(sys_root), str(proc))
    assert not ok
    assert "CONFIG_DAMON_SYSFS" in reason

    FakeDamon(admin_dir(str(sys_root)))
    ok, reason, _ = probe_damon(str(sys_root), str(proc))
    assert not ok
    assert "kpagecgroup" in reason
    assert "CONFIG_PROC_PAGE_MONITOR" in reason

    (proc / "kpagecgroup").write_bytes(b"")
    ok, reason, _ = probe_damon(str(sys_root), str(proc))
    assert ok
    assert "present" in reason
