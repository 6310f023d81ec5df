"""The originals journal: the first value of each file wins, one boot only, atomic rewrites; and
the writers record before they write (fake v2 tree, sysctls and resctrl in a fake root)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from apis.extension import KubeQOS
from koordlet.executor.originals import (
    COMPACT_AFTER,
    FILE_NAME,
    Original,
    OriginalsJournal,
    read_boot_id,
)
from koordlet.executor.resctrl import ResctrlWriter
from koordlet.executor.sysctl import MIN_FREE_KBYTES, SystemFileWriter
from koordlet.executor.writer import CgroupWriter
from koordlet.system.cgroups import CgroupDriver, CgroupVersion
from koordlet.system.knobs import CPU_CFS_QUOTA, CPU_SHARES
from tests.fakehost import FakeHost

BOOT = "8a1e5c0e-1111-4c3b-9b7d-000000000001"


def journal(tmp_path: Path, boot: str = BOOT) -> OriginalsJournal:
    return OriginalsJournal(str(tmp_path / "state"), boot_id=boot, clock=lambda: 1000.0).load()


def entry(path: str, text: str, knob: str = "cpu_cfs_quota") -> Original:
    return Original("cgroup", path, knob, text, "kubepods/besteffort")


def test_the_first_value_wins_also_after_a_restart(tmp_path: Path) -> None:
    first = journal(tmp_path)
    assert first.record(entry("/cg/be/cpu.cfs_quota_us", "-1"))
    assert not first.record(entry("/cg/be/cpu.cfs_quota_us", "2000"))  # our own value: ignored

    again = journal(tmp_path)  # the koordlet restarted: the file now holds 2000
    assert not again.record(entry("/cg/be/cpu.cfs_quota_us", "2000"))
    assert [e.text for e in again.entries()] == ["-1"]
    assert again.entries()[0].at == 1000.0


def test_a_journal_of_another_boot_is_discarded(tmp_path: Path) -> None:
    journal(tmp_path, boot="old-boot").record(entry("/cg/be/cpu.cfs_quota_us", "-1"))

    now = journal(tmp_path, boot=BOOT)

    assert now.entries() == []
    assert now.discarded_stale == 1
    header = json.loads((tmp_path / "state" / FILE_NAME).read_text().splitlines()[0])
    assert header == {"version": 1, "bootId": BOOT}


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.record(entry("/cg/a", "1"))
    with open(j.path, "a") as f:
        f.write('{"kind": "cgroup", "path": "/cg/b", "kn')  # the process died mid-append

    assert [e.path for e in journal(tmp_path).entries()] == ["/cg/a"]


def test_forget_rewrites_the_file_without_the_entries(tmp_path: Path) -> None:
    j = journal(tmp_path)
    for name in ("a", "b", "c"):
        j.record(entry(f"/cg/{name}", "1"))

    assert j.forget([("/cg/b", "cpu_cfs_quota"), ("/cg/x", "cpu_cfs_quota")]) == 1

    assert [e.path for e in journal(tmp_path).entries()] == ["/cg/a", "/cg/c"]
    assert not Path(j.path + ".tmp").exists()


def test_removed_pods_are_forgotten_lazily(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.record(Original("cgroup", "/cg/kp/be/cpu.cfs_quota_us", "cpu_cfs_quota", "-1", "kp/be"))
    for i in range(COMPACT_AFTER):
        j.record(
            Original("cgroup", f"/cg/kp/be/pod{i}/cpu.shares", "cpu_shares", "2", f"kp/be/pod{i}")
        )

    assert j.forget_cgroups(["kp/be/pod0"]) == 1
    assert len(journal(tmp_path)) == COMPACT_AFTER + 1  # not rewritten yet: the file has it
    assert j.forget_cgroups([f"kp/be/pod{i}" for i in range(1, COMPACT_AFTER)]) == COMPACT_AFTER - 1

    assert [e.rel_dir for e in journal(tmp_path).entries()] == ["kp/be"]


def test_the_boot_id_comes_from_the_proc_root(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel/random").mkdir(parents=True)
    (tmp_path / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
    assert read_boot_id(str(tmp_path)) == BOOT
    assert read_boot_id(str(tmp_path / "nowhere")) == ""


@pytest.mark.parametrize("version", list(CgroupVersion))
def test_the_cgroup_writer_records_the_text_found_before_its_first_change(
    host_root: Path, tmp_path: Path, version: CgroupVersion
) -> None:
    fake = FakeHost(host_root, version, CgroupDriver.CGROUPFS)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT).strip("/")
    j = journal(tmp_path)
    writer = CgroupWriter(fake.host, record_original=j.record)

    writer.write(CPU_CFS_QUOTA, be, 2000)
    writer.write(CPU_CFS_QUOTA, be, 4000)
    writer.write(CPU_SHARES, be, 2)  # already 2: nothing changed, nothing recorded

    (recorded,) = journal(tmp_path).entries()
    assert recorded.knob == "cpu_cfs_quota"
    assert recorded.rel_dir == be
    assert recorded.text == ("-1" if version is CgroupVersion.V1 else "max 100000")


def test_a_dry_run_records_nothing(host_root: Path, tmp_path: Path) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    be = fake.layout.qos_dir(KubeQOS.BESTEFFORT)
    j = journal(tmp_path)
    CgroupWriter(fake.host, record_original=j.record, dry_run_all=True).write(
        CPU_CFS_QUOTA, be, 2000
    )
    assert j.entries() == []


def test_sysctls_and_resctrl_groups_are_recorded_before_they_change(
    host_root: Path, tmp_path: Path
) -> None:
    fake = FakeHost(host_root, CgroupVersion.V2, CgroupDriver.SYSTEMD)
    vm = Path(fake.paths.proc_root) / "sys/vm"
    vm.mkdir(parents=True, exist_ok=True)
    (vm / "min_free_kbytes").write_text("67584\n")
    resctrl = Path(fake.paths.sys_root) / "fs/resctrl"
    resctrl.mkdir(parents=True, exist_ok=True)
    j = journal(tmp_path)

    SystemFileWriter(fake.paths, record_original=j.record).write(MIN_FREE_KBYTES, 90000)
    ResctrlWriter(fake.paths, record_original=j.record).ensure_group("BE")

    kinds = {(e.kind, e.knob): e.text for e in journal(tmp_path).entries()}
    assert kinds == {("sysctl", "vm.min_free_kbytes"): "67584", ("resctrl_group", "resctrl"): ""}


def test_a_torn_tail_is_cut_at_load_and_the_next_entry_starts_a_line(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.record(entry("/cg/a", "1"))
    with open(j.path, "a") as f:
        f.write('{"kind": "cgroup", "path": "/cg/b", "kn')  # the process died mid-append

    again = journal(tmp_path)
    again.record(entry("/cg/c", "3"))

    lines = Path(again.path).read_text().splitlines()
    assert [json.loads(line)["path"] for line in lines[1:]] == ["/cg/a", "/cg/c"]
    assert again.stats()["repaired_tails"] == 1


def test_an_entry_an_older_koordlet_glued_to_a_torn_line_is_recovered(tmp_path: Path) -> None:
    j = journal(tmp_path)
    j.record(entry("/cg/a", "1"))
    glued = entry("/cg/c", "3")
    with open(j.path, "a") as f:
        f.write('{"kind":"cgroup","path":"/cg/b","kn')  # torn by ENOSPC, then appended to
        f.write(json.dumps(asdict(glued)) + "\n")

    again = journal(tmp_path)

    assert [e.path for e in again.entries()] == ["/cg/a", "/cg/c"]
    lines = Path(again.path).read_text().splitlines()  # rewritten one entry a line
    assert len(lines) == 3
    assert again.stats()["unreadable_lines"] == 0


def test_an_unreadable_journal_is_not_written_over_and_is_read_again_before_writing(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    j = journal(tmp_path)
    j.record(entry("/cg/a", "1"))
    os.replace(state / FILE_NAME, state / "saved")
    (state / FILE_NAME).mkdir()  # reading it fails (EISDIR)

    later = journal(tmp_path)
    later.record(entry("/cg/a", "2"))  # held: the file was not read
    later.record(entry("/cg/b", "5"))
    assert later.pending == 2
    assert later.errors >= 1

    (state / FILE_NAME).rmdir()
    os.replace(state / "saved", state / FILE_NAME)
    assert later.retry()

    assert {e.path: e.text for e in journal(tmp_path).entries()} == {"/cg/a": "1", "/cg/b": "5"}
