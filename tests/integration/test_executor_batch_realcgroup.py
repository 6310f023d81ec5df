"""Leveled batches on this machine's real cgroup v1 hierarchy: the kernel accepts every step.

Each test builds its own nested ``kpytest-<random>`` tree, puts no task in it and removes it
(deepest first) in a ``finally``. The naive orders are tried first to show that the kernel does
refuse them, so the leveled batch is proven against a real refusal, not a permissive fake.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from apis.cpulist import format_cpulist, parse_cpulist
from koordlet.errors import HostError
from koordlet.executor import AuditLog, BatchWrite, CgroupWriter, WriteResult
from koordlet.system.cgroups import CgroupDriver, CgroupVersion, detect_layout
from koordlet.system.host import Host
from koordlet.system.knobs import CPU_CFS_QUOTA, CPUSET_CPUS, CPUSET_MEMS
from koordlet.system.paths import HostPaths

PATHS = HostPaths()

pytestmark = [
    pytest.mark.realcgroup,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create cgroups"),
    pytest.mark.skipif(
        not all(os.path.isfile(PATHS.cgroup(c, "tasks")) for c in ("cpu", "cpuset")),
        reason="needs the cgroup v1 cpu and cpuset hierarchies",
    ),
]


@pytest.fixture(scope="module")
def host() -> Host:
    layout = detect_layout(PATHS, version=CgroupVersion.V1, driver=CgroupDriver.CGROUPFS)
    return Host(PATHS, layout)


@pytest.fixture(scope="module")
def all_cpus(host: Host) -> frozenset[int]:
    with open(host.layout.file("cpuset", "", "cpuset.effective_cpus")) as f:
        cpus = parse_cpulist(f.read())
    if len(cpus) < 2:
        pytest.skip("needs at least 2 CPUs in the root cpuset")
    return cpus


@pytest.fixture(scope="module")
def all_mems(host: Host) -> frozenset[int]:
    with open(host.layout.file("cpuset", "", "cpuset.effective_mems")) as f:
        return parse_cpulist(f.read())


@pytest.fixture
def tree(host: Host) -> Iterator[list[str]]:
    """``top``, ``top/be``, ``top/be/pod1``, ``top/be/pod2`` in the cpu and cpuset hierarchies."""
    top = f"kpytest-{secrets.token_hex(6)}"
    rels = [top, f"{top}/be", f"{top}/be/pod1", f"{top}/be/pod2"]
    made: list[str] = []
    try:
        for controller in ("cpu", "cpuset"):
            for rel in rels:
                path = host.layout.abs_dir(controller, rel)
                os.mkdir(path)
                made.append(path)
        yield rels
    finally:
        for path in sorted(made, key=lambda p: -p.count("/")):
            if os.path.isdir(path):
                os.rmdir(path)


def read(host: Host, controller: str, rel: str, name: str) -> str:
    with open(host.layout.file(controller, rel, name)) as f:
        return f.read().strip()


def write_raw(host: Host, controller: str, rel: str, name: str, text: str) -> None:
    with open(host.layout.file(controller, rel, name), "w") as f:
        f.write(text)


def set_cpus(writer: CgroupWriter, rels: list[str], cpus: list[set[int]], mems: set[int]) -> None:
    batch = [BatchWrite(CPUSET_MEMS, r, mems) for r in rels]
    batch += [BatchWrite(CPUSET_CPUS, r, c) for r, c in zip(rels, cpus, strict=True)]
    result = writer.submit_batch(batch).result(timeout=30)
    assert result.ok, result.errors


def test_a_leveled_cpuset_shrink_and_grow_never_hit_ebusy_or_eacces(
    host: Host, tree: list[str], all_cpus: frozenset[int], all_mems: frozenset[int]
) -> None:
    first, second = sorted(all_cpus)[:2]
    both = {first, second}
    mems = set(all_mems)
    with CgroupWriter(host) as writer:
        # From empty new cgroups: a grow, parent first.
        set_cpus(writer, tree, [both, both, both, {first}], mems)
        assert [read(host, "cpuset", r, "cpuset.cpus") for r in tree] == [
            format_cpulist(both)] * 3 + [str(first)]  # fmt: skip

        # The kernel refuses the naive top-down shrink (a child still uses the CPU)...
        with pytest.raises(OSError) as refused:
            write_raw(host, "cpuset", tree[0], "cpuset.cpus", str(second))
        assert refused.value.errno is not None
        # ...and the leveled batch moves the whole tree to the other CPU.
        set_cpus(writer, tree, [{second}] * 4, mems)
        assert {read(host, "cpuset", r, "cpuset.cpus") for r in tree} == {str(second)}

        # The kernel refuses the naive bottom-up grow (beyond the parent)...
        with pytest.raises(OSError):
            write_raw(host, "cpuset", tree[2], "cpuset.cpus", format_cpulist(both))
        # ...and the leveled batch grows the whole tree back, asked leaves first.
        writer.resync()
        set_cpus(writer, list(reversed(tree)), [both] * 4, mems)
        assert {read(host, "cpuset", r, "cpuset.cpus") for r in tree} == {format_cpulist(both)}


def test_a_leveled_cfs_quota_shrink_and_grow_are_accepted(host: Host, tree: list[str]) -> None:
    for rel in tree:
        write_raw(host, "cpu", rel, "cpu.cfs_quota_us", "50000")
    with pytest.raises(OSError):  # a parent below its child's quota is refused
        write_raw(host, "cpu", tree[0], "cpu.cfs_quota_us", "20000")
    with CgroupWriter(host) as writer:
        shrink = [BatchWrite(CPU_CFS_QUOTA, r, 20000) for r in tree]
        assert writer.submit_batch(shrink).result(timeout=30).ok
        assert {read(host, "cpu", r, "cpu.cfs_quota_us") for r in tree} == {"20000"}
        grow = [BatchWrite(CPU_CFS_QUOTA, r, 80000) for r in reversed(tree)]
        assert writer.submit_batch(grow).result(timeout=30).ok
        assert {read(host, "cpu", r, "cpu.cfs_quota_us") for r in tree} == {"80000"}
        unlimit = [BatchWrite(CPU_CFS_QUOTA, r, None) for r in reversed(tree)]
        assert writer.submit_batch(unlimit).result(timeout=30).ok
        assert {read(host, "cpu", r, "cpu.cfs_quota_us") for r in tree} == {"-1"}


def test_a_pod_cgroup_deleted_in_the_middle_of_a_batch_does_not_fail_it(
    host: Host, tree: list[str], all_cpus: frozenset[int], all_mems: frozenset[int]
) -> None:
    first, second = sorted(all_cpus)[:2]
    mems = format_cpulist(all_mems)
    for rel in tree:
        write_raw(host, "cpuset", rel, "cpuset.mems", mems)
        write_raw(host, "cpuset", rel, "cpuset.cpus", str(first))
    pod1 = tree[2]
    audit = AuditLog(None)

    def delete_pod1_after_the_first_change(result: WriteResult) -> None:
        audit.on_write(result)
        if os.path.isdir(host.layout.abs_dir("cpuset", pod1)):
            os.rmdir(host.layout.abs_dir("cpuset", pod1))  # the kubelet removes the pod

    with CgroupWriter(host, on_change=delete_pod1_after_the_first_change) as writer:
        both = {first, second}
        result = writer.submit_batch(
            [BatchWrite(CPUSET_CPUS, r, both, "cpusuppress", "grow") for r in tree]
        ).result(timeout=30)
    assert result.ok, result.errors
    assert result.gone == (pod1,)
    assert not os.path.isdir(host.layout.abs_dir("cpuset", pod1))
    for rel in (tree[0], tree[1], tree[3]):
        assert read(host, "cpuset", rel, "cpuset.cpus") == format_cpulist(both)
    assert len(audit.recent()) == 3


def test_a_failed_write_is_reported_per_write_not_raised(
    host: Host, tree: list[str], all_cpus: frozenset[int], all_mems: frozenset[int]
) -> None:
    mems = format_cpulist(all_mems)
    for rel in tree:
        write_raw(host, "cpuset", rel, "cpuset.mems", mems)
        write_raw(host, "cpuset", rel, "cpuset.cpus", str(min(all_cpus)))
    beyond = max(all_cpus) + 1
    timed: list[tuple[str, str]] = []
    with CgroupWriter(host, observe=lambda kind, status, s: timed.append((kind, status))) as writer:
        result = writer.submit_batch(
            [BatchWrite(CPUSET_CPUS, tree[1], {beyond})]  # no such CPU: the kernel refuses
        ).result(timeout=30)
    assert not result.ok
    assert "cpuset.cpus" in result.errors[0][1]
    assert timed == [("cpuset.cpus", "failed")]
    assert read(host, "cpuset", tree[1], "cpuset.cpus") == str(min(all_cpus))
    with pytest.raises(HostError):
        CgroupWriter(host).write(CPUSET_CPUS, tree[1], {beyond})
